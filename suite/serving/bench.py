"""What the two serving techniques (``continuous_batching`` and ``paged_kv_serving``) share: their
params, the workload (model weights and a request trace), the exact-greedy check against
one-request-at-a-time generation, vLLM-style serving metrics and the report's figures."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from gpubench.contract import CheckResult, Measured, Param, Workload
from gpubench.models.llama import SIZES, forward, causal_attention, model_from
from gpubench.serving.engine import Engine, EngineConfig, reference_generate, serving_metrics
from gpubench.serving.traces import ARRIVAL_HELP, LENGTH_HELP, TraceSpec, generate, parse_arrival, parse_length

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
# Greedy decoding is compared token for token. Batching changes floating-point rounding (a
# different matmul shape, padded vs paged attention), so where the one-at-a-time reference's two
# best logits were closer than this, the engines may legitimately pick the other one; such a
# divergence is counted and reported, not failed. Any other difference fails.
NEAR_TIE = {torch.float64: 1e-9, torch.float32: 1e-3, torch.float16: 0.1, torch.bfloat16: 0.1}


def common_params() -> list[Param]:
    return [
        Param("model", str, "tiny", f"a built-in size ({', '.join(SIZES)}; seeded random weights) or a "
              "local Hugging Face Llama-style checkpoint directory"),
        Param("dtype", str, "float32", "weights, activations and KV cache", choices=list(DTYPES)),
        Param("requests", int, 50, "requests in the synthetic trace", min=1),
        Param("arrival", str, "poisson:40", f"arrival process: {ARRIVAL_HELP} (requests/s)"),
        Param("prompt_len", str, "uniform:16:64", f"prompt lengths: {LENGTH_HELP}"),
        Param("output_len", str, "exp:48:160", f"output lengths: {LENGTH_HELP}"),
        Param("trace_file", str, "", "JSONL trace ({arrival_s, prompt_len | prompt, output_len} per line); "
              "replaces the synthetic trace when set"),
        Param("max_len", int, 256, "longest request, prompt + output (contiguous KV reserves this)", min=2),
        Param("kv_budget_mib", float, 2.0, "KV-cache memory, the same for every engine (MiB)", min=0.001),
        Param("block_size", int, 16, "tokens per paged KV block", choices=[8, 16, 32]),
        Param("max_batch", int, 16, "most requests decoding at once", min=1),
        Param("batch_timeout_ms", float, 50.0, "static batching: start a partial batch after its oldest "
              "request waited this long", min=0.0),
        Param("temperature", float, 0.0, "0: greedy (checked token for token); > 0: sampled", min=0.0),
        Param("wait", bool, True, "honour arrival times (false: every request at time 0, offline throughput)"),
        Param("slo_ttft_ms", float, 1000.0, "goodput: time-to-first-token target", min=0.0),
        Param("slo_tpot_ms", float, 100.0, "goodput: time-per-output-token target", min=0.0),
        Param("check_requests", int, 0, "requests regenerated alone for the token check (0: all); the rest "
              "are checked for length and accounting only (a GPU-sized trace alone takes minutes)", min=0),
    ]


def validate(params: dict[str, Any]) -> list[str]:
    problems = []
    for key, parse in (("arrival", parse_arrival), ("prompt_len", parse_length), ("output_len", parse_length)):
        try:
            parse(params[key])
        except ValueError as exc:
            problems.append(f"{key}: {exc}")
    if not problems and not params["trace_file"]:
        longest = parse_length(params["prompt_len"]).max + parse_length(params["output_len"]).max
        if longest > params["max_len"]:
            problems.append(f"max_len {params['max_len']} is below the longest request the trace can draw "
                            f"({longest} tokens: prompt_len and output_len maxima)")
    if params["model"] not in SIZES and not Path(params["model"]).is_dir():
        problems.append(f"model {params['model']!r} is neither a built-in size ({', '.join(SIZES)}) nor a directory")
    if params["trace_file"] and not Path(params["trace_file"]).is_file():
        problems.append(f"trace_file {params['trace_file']!r} does not exist")
    return problems


def build(params: dict[str, Any], device: torch.device, seed: int) -> Workload:
    device = torch.device(device)
    weights = model_from(params["model"], seed, DTYPES[params["dtype"]], device)
    spec = TraceSpec(params["requests"], params["arrival"], params["prompt_len"], params["output_len"],
                     weights.config.vocab_size, params["trace_file"] or None)
    requests = generate(spec, seed + 1)
    too_long = [r.id for r in requests if r.prompt_len + r.output_len > params["max_len"]]
    if too_long:
        raise ValueError(f"requests {too_long[:5]} exceed max_len {params['max_len']} (prompt + output)")
    _warm_up(weights)
    return Workload(params=dict(params), device=device, seed=seed,
                    inputs={"weights": weights, "requests": requests})


def _warm_up(weights) -> None:
    """One small forward pass so lazy initialization is not charged to the first engine run."""
    tok = torch.arange(8, device=weights.device) % weights.config.vocab_size
    with torch.inference_mode():
        forward(weights, tok, torch.arange(8, device=weights.device), lambda i, q, k, v: causal_attention(q, k, v))


def engine_config(params: dict[str, Any], scheduler: str, kv: str) -> EngineConfig:
    return EngineConfig(scheduler=scheduler, kv=kv, kv_budget_bytes=int(params["kv_budget_mib"] * 2**20),
                        block_size=params["block_size"], max_len=params["max_len"], max_batch=params["max_batch"],
                        batch_timeout_s=params["batch_timeout_ms"] / 1e3, temperature=params["temperature"],
                        wait=params["wait"])


def serve(w: Workload, scheduler: str, kv: str) -> dict[str, Any]:
    run = Engine(w.weights, engine_config(w.params, scheduler, kv)).run(w.requests)
    run["temperature"] = w.params["temperature"]
    run["dtype"] = w.params["dtype"]
    return run


def reference(w: Workload) -> dict[str, Any]:
    """Every request (or the first ``check_requests``) generated alone, with a plain growing KV
    cache: what batching must not change."""
    tokens, gaps = {}, {}
    limit = w.params["check_requests"] or len(w.requests)
    for r in w.requests[:limit]:
        tokens[r.id], gaps[r.id] = reference_generate(w.weights, r, w.params["temperature"])
    return {"tokens": tokens, "gaps": gaps, "temperature": w.params["temperature"], "dtype": w.params["dtype"],
            "lengths": {r.id: r.output_len for r in w.requests}, "accounting_problems": []}


def check(ref: dict[str, Any], out: dict[str, Any]) -> CheckResult:
    """Greedy: every request's tokens equal the reference's (a divergence where the reference's top
    two logits were within the dtype's near-tie margin is allowed and reported). Sampled: every
    request produced its full length. Always: exact KV accounting (no leaked or doubly owned
    block, never over the budget)."""
    problems = list(out.get("accounting_problems") or [])
    if problems:
        return CheckResult(False, float(len(problems)), None, "accounting_problems", "; ".join(problems[:3]))
    greedy = ref["temperature"] <= 0
    margin = NEAR_TIE[DTYPES[ref["dtype"]]]
    mismatched, near_ties, first_bad = 0, 0, None
    for rid, length in (ref.get("lengths") or {}).items():
        if rid not in ref["tokens"] and len(out["tokens"].get(rid, [])) != length:
            mismatched += 1
            first_bad = first_bad or f"request {rid}: {len(out['tokens'].get(rid, []))} tokens, expected {length}"
    for rid, expected in ref["tokens"].items():
        got = out["tokens"].get(rid, [])
        if len(got) != len(expected):
            mismatched += 1
            first_bad = first_bad or f"request {rid}: {len(got)} tokens, expected {len(expected)}"
            continue
        if not greedy or got == expected:
            continue
        i = next(j for j, (a, b) in enumerate(zip(got, expected)) if a != b)
        if ref["gaps"][rid][i] < margin:
            near_ties += 1
        else:
            mismatched += 1
            first_bad = first_bad or (f"request {rid}: token {i} is {got[i]}, alone it is {expected[i]} "
                                      f"(top-2 logit gap {ref['gaps'][rid][i]:.3g})")
    detail = first_bad or ""
    if near_ties:
        detail = (detail + "; " if detail else "") + (f"{near_ties} request(s) diverged at a near-tie "
                                                      f"(top-2 logits within {margin:g}), allowed")
    if not greedy:
        detail = (detail + "; " if detail else "") + "sampled decoding: lengths and accounting checked, not tokens"
    return CheckResult(mismatched == 0, float(mismatched), 0.0, "mismatched_requests", detail)


def metrics(w: Workload, measured: Measured) -> dict[str, Any]:
    out = measured.output
    m = serving_metrics(out, w.params["slo_ttft_ms"], w.params["slo_tpot_ms"])
    m["scheduler"], m["kv"] = out["scheduler"], out["kv"]
    m["model_params"] = w.weights.config.num_params()
    return m


# -- report -----------------------------------------------------------------------------------

ROLE_STYLE = {"baseline": ("#8c8c8c", "--"), "optimized": ("#1f6fb4", "-")}


def _label(case: dict[str, Any]) -> str:
    p = case.get("params", {})
    return f"{p.get('model')} {p.get('requests')} req, {p.get('arrival')}, out {p.get('output_len')}"


def _engines(case: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    for name, record in (case.get("variants") or {}).items():
        m = record.get("metrics") or {}
        if record.get("role") in ROLE_STYLE and m.get("series"):
            out.append((record["role"], f"{name}: {m.get('scheduler')} + {m.get('kv')} KV", m))
    return out


def figures(cases: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """Per case (up to four): throughput and latency percentiles side by side; KV utilization and
    running requests over time; TTFT and end-to-end latency CDFs."""
    from matplotlib.figure import Figure

    out = []
    for case in cases[:4]:
        engines = _engines(case)
        if len(engines) < 2:
            continue
        label = _label(case)
        # 1. throughput and percentiles
        fig = Figure(figsize=(7, 3.0))
        ax_t, ax_l = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 3]})
        names = [e[1] for e in engines]
        for k, (role, name, m) in enumerate(engines):
            color = ROLE_STYLE[role][0]
            ax_t.bar(k, m["output_tokens_per_s"], color=color)
            groups = [("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl")]
            xs, ys = [], []
            for g, (_, key) in enumerate(groups):
                for s, stat in enumerate(("median", "p90", "p99")):
                    xs.append(g * 4 + s + k * 0.4 - 0.2)
                    ys.append(m.get(f"{stat}_{key}_ms") or 0.0)
            ax_l.bar(xs, ys, width=0.4, color=color, label=name)
        ax_t.set_xticks(range(len(names)), [n.split(":")[0] for n in names], fontsize=7)
        ax_t.set_ylabel("output tokens/s")
        ax_l.set_xticks([g * 4 + s for g in range(3) for s in range(3)],
                        [f"{g}\n{s}" for g in ("TTFT", "TPOT", "ITL") for s in ("p50", "p90", "p99")], fontsize=7)
        ax_l.set_yscale("log")
        ax_l.set_ylabel("ms")
        ax_l.legend(fontsize=7)
        fig.tight_layout()
        out.append((f"Serving throughput and latency percentiles ({label})", fig))
        # 2. KV utilization and running requests over time
        fig = Figure(figsize=(7, 3.4))
        ax_u, ax_r = fig.subplots(2, 1, sharex=True)
        for role, name, m in engines:
            color, style = ROLE_STYLE[role]
            s = m["series"]
            util = [math.nan if u is None else 100 * u for u in s["kv_utilization"]]
            ax_u.plot(s["t_s"], util, color=color, linestyle=style, label=name, linewidth=1)
            ax_r.plot(s["t_s"], s["running"], color=color, linestyle=style, linewidth=1, drawstyle="steps-post")
        ax_u.set_ylabel("KV live / reserved %", fontsize=8)
        ax_r.set_ylabel("running requests", fontsize=8)
        ax_r.set_xlabel("seconds since the first arrival")
        ax_u.legend(fontsize=7)
        fig.tight_layout()
        out.append((f"KV utilization and running requests over time ({label})", fig))
        # 3. latency CDFs
        fig = Figure(figsize=(7, 2.8))
        axes = fig.subplots(1, 2)
        for ax, key, title in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "e2e_ms", "end-to-end latency")):
            for role, name, m in engines:
                values = sorted(m["series"][key])
                if values:
                    color, style = ROLE_STYLE[role]
                    ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], color=color,
                            linestyle=style, label=name, drawstyle="steps-post")
            ax.set_xlabel(f"{title} (ms)")
            ax.set_ylabel("fraction of requests")
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        out.append((f"Latency CDFs ({label})", fig))
    return out


def register(technique) -> None:
    """Attach the shared pieces (validate, build, reference, check, metrics, figures) to a technique."""
    technique.validate(validate)
    technique.build(build)
    technique.reference(reference)
    technique.check(check)
    technique.metrics(metrics)
    technique.figures(figures)
