"""moe_grouping: a gpt-oss MoE layer, forward and backward, with the eager per-expert loop
against sort-and-group.

One call is one step of the layer: the forward pass on ``tokens`` seeded random hidden states,
then the backward pass of a seeded random output gradient into the input, the router and every
expert weight (``torch.autograd.grad``, so nothing accumulates between calls and the workload
needs no reset). Its output is the layer's output and those seven gradients.

Variants: ``baseline`` (one-hot mask, a loop over the experts hit, ``torch.where`` each),
``optimized`` (stable argsort by expert, one host read of the counts, contiguous slices), and
the peer ``grouped_mm`` (the same sort, then torch's grouped GEMM with the offsets left on the
device). The ground truth is float64: every expert on every token, weighted by the routing
matrix (zero off each token's top-k), at the routing the layer chose in its own dtype.

Each call times its forward and backward parts itself (CUDA events on a GPU, ``perf_counter``
on a CPU) into the workload; ``metrics`` reports their medians over the harness's timed calls.
Host synchronizations per step are counted by construction (every host read the code makes
is noted; on a CPU that is the count) and, on CUDA, measured on the first call with
``torch.cuda.set_sync_debug_mode("warn")``.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch

from gpubench import stats
from gpubench.timing import count_cuda_syncs
from gpubench.baselines.moe_grouping import moe_forward as per_expert_loop
from gpubench.contract import CheckResult, Measured, Param, Technique, Workload
from gpubench.models.moe import MoEConfig, MoEWeights, SyncLog, expert_mlp, init_weights, route
from gpubench.optimizations.moe_grouping import (grouped_gemm_path, grouped_mm_function, moe_forward as sort_and_group,
                                                 moe_forward_grouped_mm)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Largest relative L2 error allowed, over the output and every gradient, against the float64
# reference, by dtype. float32: measured errors stay below 5e-7. bfloat16 (8-bit mantissa, a dozen
# rounded intermediates on the way to each gradient): 5e-3 to 1e-2 at realistic sizes; the worst,
# 2.4e-2 over 90 seeded cases, is the router-bias gradient of a tiny case (7 tokens, 4 experts),
# a sum of softmax-backward differences that loses most of its digits to cancellation. A wrong
# expert, slot, weight or bias gives errors of order 0.1 to 1.
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 5e-2}
OUTPUT_KEYS = ("out", "grad_x") + tuple(f"grad_{name}" for name in MoEWeights.names())
GEMM_PATHS = {
    "baseline": "per-expert matmul + bias in a Python loop over the experts hit",
    "optimized": "per-expert addmm on contiguous slices of the sorted rows",
}

TECHNIQUE = Technique(
    name="moe_grouping",
    shape="training_step",
    summary="A gpt-oss MoE layer, forward + backward: an eager loop over the experts (one host "
            "sync each) against sorting the routed rows by expert once and working on contiguous slices.",
    anchor="Unsloth: gpt-oss training +15%, forward +23%, backward +13%",
    gpu_specific=(
        "The win the pair is built to show is host-device synchronization: on a GPU the eager loop's "
        "torch.where per expert makes the host wait until the device has drained its queue before it "
        "can launch the next expert, so the GPU idles at every expert; sort-and-group waits once per "
        "layer, the grouped GEMM never. On a CPU there is no device to wait for and a 'sync' costs "
        "nothing: the CPU ratio comes from per-op overhead and mostly from the backward, where the "
        "eager loop (indexing each expert's weights, as Hugging Face does) makes autograd build and sum "
        "a full-size weight gradient per expert hit, while sort-and-group assembles each gradient once. "
        "Those costs weigh differently against a GPU's bandwidth and launch latency, so the CPU ratio "
        "says little about a GPU's. On a CPU torch's grouped_mm is itself a loop of matmuls over the groups."
    ),
    headline="syncs_per_step",
    params=[
        Param("experts", int, 8, "experts in the layer (gpt-oss-20b: 32, gpt-oss-120b: 128)", min=1),
        Param("top_k", int, 2, "experts per token (gpt-oss: 4)", min=1),
        Param("hidden", int, 64, "model width (gpt-oss: 2880)", min=1),
        Param("expert_dim", int, 64, "expert intermediate width (gpt-oss: 2880)", min=1),
        Param("tokens", int, 256, "tokens in the step (batch x sequence)", min=1),
        Param("dtype", str, "float32", "dtype of the activations and weights", choices=list(DTYPES)),
    ],
)


@TECHNIQUE.validate
def validate(params: dict[str, Any]) -> list[str]:
    if params["top_k"] > params["experts"]:
        return [f"top_k ({params['top_k']}) must not exceed experts ({params['experts']})"]
    return []


def config_of(params: dict[str, Any]) -> MoEConfig:
    return MoEConfig(experts=params["experts"], top_k=params["top_k"], hidden=params["hidden"],
                     expert_dim=params["expert_dim"])


@TECHNIQUE.build
def build(params: dict[str, Any], device: torch.device, seed: int) -> Workload:
    workload = Workload(params=dict(params), device=torch.device(device), seed=seed)
    config = config_of(params)
    dtype = DTYPES[params["dtype"]]
    gen = workload.generator()
    weights = init_weights(config, gen, dtype, workload.device).map(lambda t: t.requires_grad_(True))
    # Hidden states and the output gradient: standard normal, drawn on the CPU, then moved.
    x, grad_out = (torch.randn(params["tokens"], config.hidden, generator=gen).to(device=workload.device, dtype=dtype)
                   for _ in range(2))
    workload.inputs.update(config=config, x=x.requires_grad_(True), weights=weights, grad_out=grad_out,
                           phases={}, syncs={})
    return workload


# -- one step -----------------------------------------------------------------------------------

def step(w: Workload, name: str, forward: Callable[..., torch.Tensor]) -> dict[str, torch.Tensor]:
    """Forward and backward of one variant; records its forward and backward times in
    ``w.phases[name]`` and, on its first call, its host syncs in ``w.syncs[name]``."""
    leaves = (w.x, *w.weights)
    first = name not in w.syncs
    log = SyncLog() if first else None
    cuda = w.device.type == "cuda"
    measure = first and cuda
    if cuda:
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        marks[0].record()
    t0 = time.perf_counter()
    with count_cuda_syncs(measure) as fwd_measured:
        out = forward(w.x, w.weights, w.config, log)
    if cuda:
        marks[1].record()
    t1 = time.perf_counter()
    forward_notes = len(log) if log is not None else 0
    with count_cuda_syncs(measure) as bwd_measured:
        grads = torch.autograd.grad(out, leaves, w.grad_out)
    if cuda:
        marks[2].record()
        marks[2].synchronize()
        fwd_s, bwd_s = (marks[i].elapsed_time(marks[i + 1]) * 1e-3 for i in (0, 1))
    else:
        fwd_s, bwd_s = t1 - t0, time.perf_counter() - t1
    w.phases.setdefault(name, []).append((fwd_s, bwd_s))
    if first:
        w.syncs[name] = {"forward": forward_notes, "backward": len(log) - forward_notes, "events": list(log.events),
                         "measured_forward": fwd_measured["n"], "measured_backward": bwd_measured["n"]}
    return dict(zip(OUTPUT_KEYS, (out.detach(), *grads)))


@TECHNIQUE.variant("baseline", role="baseline")
def run_baseline(w: Workload) -> dict[str, torch.Tensor]:
    """Eager loop over the experts hit: one-hot mask, torch.where per expert, gather, MLP, index_add_."""
    return step(w, "baseline", per_expert_loop)


@TECHNIQUE.variant("optimized", role="optimized")
def run_optimized(w: Workload) -> dict[str, torch.Tensor]:
    """Stable argsort by expert, counts read once, addmm per contiguous slice, one index_add_."""
    return step(w, "optimized", sort_and_group)


def _grouped_mm_unavailable(device: torch.device) -> str | None:
    if grouped_mm_function() is None:
        return f"torch {torch.__version__} has no grouped_mm (torch.nn.functional.grouped_mm / torch._grouped_mm)"
    return None


@TECHNIQUE.variant("grouped_mm", unavailable=_grouped_mm_unavailable)
def run_grouped_mm(w: Workload) -> dict[str, torch.Tensor]:
    """Sort-and-group with torch's grouped GEMM per projection; offsets stay on the device."""
    return step(w, "grouped_mm", moe_forward_grouped_mm)


# -- correctness ------------------------------------------------------------------------------

@TECHNIQUE.reference
def reference(w: Workload) -> dict[str, torch.Tensor]:
    """float64, dense: every expert on every token, weighted by the (tokens, experts) routing
    matrix, at the experts the layer's router picks in its own dtype. One expert at a time,
    forward and backward, so memory stays at one expert's activations."""
    config = w.config
    with torch.no_grad():
        _, experts = route(w.x, w.weights.router_weight, w.weights.router_bias, config.top_k)
    with torch.enable_grad():
        x, rw, rb, gate_up, gate_up_bias, down, down_bias = leaves = [
            t.detach().to(torch.float64).requires_grad_(True) for t in (w.x, *w.weights)]
        logits = x @ rw.T + rb
        routing = torch.zeros_like(logits).scatter(1, experts, logits.gather(1, experts).softmax(dim=-1))
        routing_leaf = routing.detach().requires_grad_(True)
        grad_out = w.grad_out.to(torch.float64)
        out = torch.zeros_like(x, requires_grad=False)
        for e in range(config.experts):
            y = routing_leaf[:, e:e + 1] * expert_mlp(x, gate_up[e], gate_up_bias[e], down[e], down_bias[e],
                                                      config.alpha, config.limit)
            y.backward(grad_out)
            out += y.detach()
        routing.backward(routing_leaf.grad)
    return dict(zip(OUTPUT_KEYS, (out, *(t.grad for t in leaves))))


def rel_l2(output: torch.Tensor, reference_output: torch.Tensor) -> float:
    ref = reference_output.to(torch.float64)
    diff = torch.linalg.vector_norm(output.to(torch.float64) - ref).item()
    scale = torch.linalg.vector_norm(ref).item()
    return diff / scale if scale > 0 else diff


@TECHNIQUE.check
def check(reference_output: dict[str, torch.Tensor], output: dict[str, torch.Tensor]) -> CheckResult:
    """The worst relative L2 (Frobenius) error over the output and the seven gradients, in float64,
    with a tolerance set by the output's dtype; the detail names the worst tensor."""
    metric = f"max_rel_l2 (output + {len(reference_output) - 1} grads)"
    dtype = output["out"].dtype if isinstance(output, dict) and "out" in output else None
    tolerance = TOLERANCE.get(dtype, 5e-2)
    errors: dict[str, float] = {}
    for key, ref in reference_output.items():
        got = output.get(key) if isinstance(output, dict) else None
        if got is None:
            return CheckResult(False, None, tolerance, metric, f"{key} missing from the output")
        if got.shape != ref.shape:
            return CheckResult(False, None, tolerance, metric,
                               f"{key}: shape {tuple(got.shape)} != reference {tuple(ref.shape)}")
        nan, inf = int(got.isnan().sum()), int(got.isinf().sum())
        if nan or inf:
            return CheckResult(False, float("nan"), tolerance, metric,
                               f"{key} has {nan} NaN and {inf} Inf values of {got.numel()}")
        errors[key] = rel_l2(got, ref)
    worst = max(errors, key=errors.get)
    error = errors[worst]
    failing = [f"{k} {v:.3g}" for k, v in errors.items() if v > tolerance]
    passed = not failing
    detail = (f"worst: {worst} {error:.3g}" if passed
              else f"relative L2 error above {tolerance:g} for {dtype}: {', '.join(failing)}")
    return CheckResult(passed, error, tolerance, metric, detail)


# -- metrics ----------------------------------------------------------------------------------

def expert_rows(w: Workload) -> list[int]:
    """Routed rows (token, slot pairs) per expert, at the workload's current weights."""
    with torch.no_grad():
        _, experts = route(w.x, w.weights.router_weight, w.weights.router_bias, w.config.top_k)
        return torch.bincount(experts.flatten().cpu(), minlength=w.config.experts).tolist()


def gemm_path(name: str, w: Workload, measured_syncs: int | None) -> str:
    if name in GEMM_PATHS:
        return GEMM_PATHS[name]
    path = grouped_gemm_path(w.device, w.x.dtype)
    if w.device.type == "cuda" and measured_syncs is not None:
        path += f" ({measured_syncs} host syncs measured per step)"
    return path


@TECHNIQUE.metrics
def metrics(w: Workload, measured: Measured) -> dict[str, Any]:
    tokens = w.x.shape[0]
    forward_flops, backward_flops = w.config.expert_gemm_flops(tokens)
    out: dict[str, Any] = {"flops": forward_flops + backward_flops, "tokens_per_s": tokens / measured.median_s}
    # The timed calls are this variant's last calls (the checked call and warm-up come first).
    phases = w.phases.get(measured.variant, [])[-len(measured.samples_s):]
    if phases:
        fwd_s, bwd_s = stats.median([p[0] for p in phases]), stats.median([p[1] for p in phases])
        out.update(forward_s=fwd_s, backward_s=bwd_s)
        if fwd_s > 0:
            out["forward_tflops"] = forward_flops / fwd_s / 1e12
        if bwd_s > 0:
            out["backward_tflops"] = backward_flops / bwd_s / 1e12
    syncs = w.syncs.get(measured.variant)
    measured_total = None
    if syncs is not None:
        constructed = syncs["forward"] + syncs["backward"]
        if syncs["measured_forward"] is not None and syncs["measured_backward"] is not None:
            measured_total = syncs["measured_forward"] + syncs["measured_backward"]
            out.update(syncs_per_step=measured_total, syncs_forward=syncs["measured_forward"],
                       syncs_backward=syncs["measured_backward"], syncs_method="torch.cuda sync debug mode",
                       syncs_by_construction=constructed)
        else:
            out.update(syncs_per_step=constructed, syncs_forward=syncs["forward"], syncs_backward=syncs["backward"],
                       syncs_method="by construction (host reads in the code)")
    rows = expert_rows(w)
    out.update(experts_hit=sum(n > 0 for n in rows), max_expert_rows=max(rows),
               gemm_path=gemm_path(measured.variant, w, measured_total))
    return out


# -- report figures ---------------------------------------------------------------------------

VARIANTS = ("baseline", "optimized", "grouped_mm")
SHORT = {"experts": "E", "top_k": "top-", "hidden": "h", "expert_dim": "d", "dtype": ""}  # legend labels


def _points(cases: list[dict[str, Any]], read: Callable[[dict[str, Any], dict[str, Any]], Any]
            ) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(variant, label of the params that vary besides tokens) -> [(tokens, value)], value =
    read(variant record, baseline record) where it is a number."""
    varying = sorted((k for k in {k for c in cases for k in c.get("params", {})}
                      if k != "tokens" and len({repr(c.get("params", {}).get(k)) for c in cases}) > 1),
                     key=lambda k: (list(SHORT).index(k) if k in SHORT else len(SHORT), k))
    out: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for case in cases:
        params, variants = case.get("params") or {}, case.get("variants") or {}
        if "tokens" not in params:
            continue
        label = " ".join(f"{SHORT.get(k, k + '=')}{params.get(k)}" for k in varying)
        base = variants.get("baseline") or {}
        for name in VARIANTS:
            value = read(variants.get(name) or {}, base)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out.setdefault((name, label), []).append((params["tokens"], float(value)))
    for points in out.values():
        points.sort()
    return out


def _metric(record: dict[str, Any], key: str) -> Any:
    return (record.get("metrics") or {}).get(key)


def _phase_speedup(key: str) -> Callable[[dict[str, Any], dict[str, Any]], float | None]:
    def read(record: dict[str, Any], base: dict[str, Any]) -> float | None:
        mine, theirs = _metric(record, key), _metric(base, key)
        if record is base or not isinstance(mine, (int, float)) or not isinstance(theirs, (int, float)) or mine <= 0:
            return None
        return theirs / mine
    return read


def _line_panels(panels: list[tuple[str, dict[tuple[str, str], list[tuple[int, float]]]]], ylabel: str,
                 unity: bool) -> Any:
    """One panel per (title, series), value against tokens, a line per variant and label; one
    legend for all panels, below them."""
    from matplotlib.figure import Figure

    from gpubench.reports.figures import COLORS, SERIES, WIDTH_IN

    colors = {**COLORS, "grouped_mm": SERIES[1]}
    names = sorted({key for _, series in panels for key in series})
    ncol = 1 if len(names) < 3 else 2
    legend_in = 0.2 * -(-len(names) // ncol) + 0.1
    fig = Figure(figsize=(WIDTH_IN, 2.6 + legend_in))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    handles: dict[str, Any] = {}
    for ax, (title, series) in zip(axes, panels):
        for (name, label), points in sorted(series.items()):
            xs, ys = zip(*points)
            (line,) = ax.plot(xs, ys, marker="o", color=colors.get(name, SERIES[2]),
                              linestyle="--" if name == "baseline" else "-",
                              label=name if not label else f"{name} ({label})")
            handles.setdefault(line.get_label(), line)
        if unity:
            ax.axhline(1.0, color="black", lw=0.8, ls=":")
        xs = sorted({x for points in series.values() for x, _ in points})
        if xs and xs[-1] / max(xs[0], 1) > 8:
            ax.set_xscale("log", base=2)
        ax.set_title(title)
        ax.set_xlabel("tokens")
        ax.set_ylabel(ylabel)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=ncol, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, legend_in / (2.6 + legend_in), 1, 1))
    return fig


@TECHNIQUE.figures
def figures(cases: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """Forward and backward speedup over the baseline against tokens (from each variant's own
    phase timings), and host syncs per step against tokens, per variant. Figures without data
    are left out."""
    out = []
    forward = _points(cases, _phase_speedup("forward_s"))
    backward = _points(cases, _phase_speedup("backward_s"))
    if forward or backward:
        out.append(("Forward and backward speedup over the per-expert loop vs tokens",
                    _line_panels([("forward", forward), ("backward", backward)], "speedup (x)", unity=True)))
    syncs = _points(cases, lambda record, base: _metric(record, "syncs_per_step"))
    if syncs:
        out.append(("Device-to-host synchronizations per step (forward + backward) vs tokens",
                    _line_panels([("host syncs per step", syncs)], "syncs per step", unity=False)))
    return out
