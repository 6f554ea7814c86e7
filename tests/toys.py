"""Small techniques of each contract shape, used to test the harness without real workloads.

Each is registered only inside the tests that ask for the ``toys`` fixture."""

from __future__ import annotations

import time

import torch

from gpubench.contract import CheckResult, Param, Technique, Workload


def _close(ref: torch.Tensor, out: torch.Tensor) -> CheckResult:
    err = float((out.double() - ref.double()).norm() / ref.double().norm())
    return CheckResult(err <= 1e-6, err, 1e-6, "rel_l2")


# -- kernel: a pure function; `mode` injects the failures the runner must survive -------------
KERNEL = Technique(
    "toy_kernel",
    summary="cumulative sum, two ways",
    shape="kernel",
    params=[
        Param("n", int, 256, min=1),
        Param(
            "mode",
            str,
            "ok",
            choices=[
                "ok",
                "baseline_raises",
                "optimized_raises",
                "optimized_wrong",
                "build_raises",
                "oom",
                "hang",
                "interrupt",
                "peer_raises",
                "metrics_raises",
            ],
        ),
    ],
)


@KERNEL.build
def _build_kernel(params, device, seed):
    if params["mode"] == "build_raises":
        raise ValueError("cannot build this workload")
    g = torch.Generator().manual_seed(seed)
    return Workload(params, device, seed, {"x": torch.randn(params["n"], generator=g, dtype=torch.float64)})


@KERNEL.variant("baseline", role="baseline")
def _kernel_baseline(w):
    if w.params["mode"] == "baseline_raises":
        raise RuntimeError("baseline cannot run")
    out = torch.empty_like(w.x)
    acc = 0.0
    for i, v in enumerate(w.x.tolist()):
        acc += v
        out[i] = acc
    return out


@KERNEL.variant("optimized", role="optimized")
def _kernel_optimized(w):
    mode = w.params["mode"]
    if mode == "optimized_raises":
        raise RuntimeError("kernel launch failed")
    if mode == "oom":
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
    if mode == "hang":
        while True:
            time.sleep(0.01)
    if mode == "interrupt":
        raise KeyboardInterrupt
    out = torch.cumsum(w.x, 0)
    return out + 1e-3 if mode == "optimized_wrong" else out


@KERNEL.variant("peer", role="peer")
def _kernel_peer(w):
    if w.params["mode"] == "peer_raises":
        raise NotImplementedError("no kernel for this shape")
    return torch.cumsum(w.x, 0)


@KERNEL.variant("elsewhere", role="peer", unavailable=lambda device: "needs hardware this machine lacks")
def _kernel_elsewhere(w):
    raise AssertionError("an unavailable variant must never be called")


KERNEL.check(_close)


@KERNEL.metrics
def _kernel_metrics(w, measured):
    if w.params["mode"] == "metrics_raises":
        raise ZeroDivisionError("bad metric")
    return {"flops": float(w.params["n"]), "bytes_moved": 16.0 * w.params["n"]}


# -- training step: mutates weights; reset restores them before every call ---------------------
TRAIN = Technique(
    "toy_train_step",
    summary="one SGD step of a linear model",
    shape="training_step",
    params=[Param("dim", int, 16, min=1)],
)


@TRAIN.build
def _build_train(params, device, seed):
    g = torch.Generator().manual_seed(seed)
    d = params["dim"]
    w0 = torch.randn(d, d, generator=g, dtype=torch.float64)
    inputs = {
        "w0": w0,
        "weight": w0.clone().requires_grad_(True),
        "x": torch.randn(32, d, generator=g, dtype=torch.float64),
        "y": torch.randn(32, d, generator=g, dtype=torch.float64),
        "calls": [0],
    }

    def reset():
        with torch.no_grad():
            inputs["weight"].copy_(w0)
        inputs["weight"].grad = None

    return Workload(params, device, seed, inputs, reset=reset)


def _sgd(w, loss):
    loss.backward()
    with torch.no_grad():
        w.weight -= 0.1 * w.weight.grad
    w.calls[0] += 1
    return loss.detach(), w.weight.detach().clone()


@TRAIN.variant("baseline", role="baseline")
def _train_baseline(w):
    return _sgd(w, ((w.x @ w.weight - w.y) ** 2).mean())


@TRAIN.variant("optimized", role="optimized")
def _train_optimized(w):
    return _sgd(w, torch.nn.functional.mse_loss(torch.addmm(-w.y, w.x, w.weight), torch.zeros_like(w.y)))


@TRAIN.check
def _train_check(ref, out):
    return _close(torch.cat([ref[0].reshape(1), ref[1].flatten()]), torch.cat([out[0].reshape(1), out[1].flatten()]))


# -- serving run: the output carries per-request latencies; metrics read them ------------------
SERVE = Technique(
    "toy_serving",
    summary="a queue served one or four at a time",
    shape="serving_run",
    params=[Param("requests", int, 8, min=1)],
)


@SERVE.build
def _build_serve(params, device, seed):
    g = torch.Generator().manual_seed(seed)
    return Workload(
        params, device, seed, {"work": (torch.rand(params["requests"], generator=g) * 1e-4 + 1e-5).tolist()}
    )


def _serve(w, slots):
    t0, latencies, results = time.perf_counter(), [], []
    for i in range(0, len(w.work), slots):
        for cost in w.work[i : i + slots]:
            results.append(round(cost * 1e6))
        time.sleep(max(w.work[i : i + slots]))
        latencies += [time.perf_counter() - t0] * len(w.work[i : i + slots])
    return {"results": results, "latencies_s": latencies}


SERVE.variant("baseline", role="baseline")(lambda w: _serve(w, 1))
SERVE.variant("optimized", role="optimized")(lambda w: _serve(w, 4))


@SERVE.check
def _serve_check(ref, out):
    bad = sum(a != b for a, b in zip(ref["results"], out["results"]))
    return CheckResult(bad == 0 and len(ref["results"]) == len(out["results"]), float(bad), None, "mismatched_results")


@SERVE.metrics
def _serve_metrics(w, measured):
    lat = sorted(measured.output["latencies_s"])
    return {"requests_per_s": len(lat) / measured.median_s, "p50_latency_s": lat[len(lat) // 2]}


# -- generation run: greedy token ids compared exactly --------------------------------------
GEN = Technique(
    "toy_generation",
    summary="greedy decoding of a tiny bigram model",
    shape="generation_run",
    params=[Param("tokens", int, 12, min=1), Param("vocab", int, 50, min=2)],
)


@GEN.build
def _build_gen(params, device, seed):
    g = torch.Generator().manual_seed(seed)
    return Workload(params, device, seed, {"logits": torch.randn(params["vocab"], params["vocab"], generator=g)})


@GEN.variant("baseline", role="baseline")
def _gen_baseline(w):
    tok, out = 0, []
    for _ in range(w.params["tokens"]):
        tok = int(torch.argmax(w.logits[tok]))
        out.append(tok)
    return out


@GEN.variant("optimized", role="optimized")
def _gen_optimized(w):
    table = torch.argmax(w.logits, dim=1).tolist()  # every next token at once, then walk
    tok, out = 0, []
    for _ in range(w.params["tokens"]):
        tok = table[tok]
        out.append(tok)
    return out


@GEN.check
def _gen_check(ref, out):
    bad = sum(a != b for a, b in zip(ref, out)) + abs(len(ref) - len(out))
    return CheckResult(bad == 0, float(bad), None, "mismatched_tokens")


# -- side data: each variant records which of its calls this is --------------------------------
RECORDED = Technique("toy_recorded", summary="counts its own calls", shape="kernel", params=[])


@RECORDED.build
def _build_recorded(params, device, seed):
    return Workload(
        params, device, seed, {"x": torch.randn(8, generator=torch.Generator().manual_seed(seed)), "calls": {}}
    )


def _counted(w, rec, name):
    w.calls[name] = w.calls.get(name, 0) + 1
    rec.record(call=w.calls[name])
    return w.x.clone()


RECORDED.variant("counted_a", role="baseline")(lambda w, rec: _counted(w, rec, "a"))
RECORDED.variant("counted_b", role="optimized")(lambda w, rec: _counted(w, rec, "b"))
RECORDED.check(_close)


@RECORDED.metrics
def _recorded_metrics(w, measured):
    return {"timed_calls": [r["call"] for r in measured.records], "median_call": measured.median_of("call")}


ALL = [KERNEL, TRAIN, SERVE, GEN, RECORDED]
