"""Serving metrics of one run, as ``vllm bench serve`` reports them: request and token
throughput, TTFT / TPOT / ITL / end-to-end latency (ms: mean, median, p90, p99), goodput under
SLOs; and from the engine's timeline, KV utilization, peak concurrency and preemptions.

The duration every throughput divides by is vLLM's benchmark duration: from the run's start
(time 0, before the first request's arrival gap) to the last request's finish. Where we differ
from ``vllm bench serve``: times are taken inside the engine's loop (no HTTP client or
detokenizer between), every request generates exactly its output_len tokens (as
``--ignore-eos``), percentiles interpolate linearly as numpy's do, and KV utilization, peak
concurrency and preemptions come from the engine's own timeline."""
from __future__ import annotations

import statistics
from typing import Any

import torch

from gpubench.serving.engine import ServingRun


def _summary(values: list[float], scale: float = 1e3) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "median": None, "p90": None, "p99": None}
    t = torch.tensor(values, dtype=torch.float64) * scale
    q = torch.quantile(t, torch.tensor([0.5, 0.9, 0.99], dtype=torch.float64)).tolist()
    return {"mean": float(t.mean()), "median": q[0], "p90": q[1], "p99": q[2]}


def latencies_s(run: ServingRun) -> dict[str, list[float]]:
    """Per request: TTFT (first token - arrival), TPOT ((last - first) / (n - 1), requests of
    more than one token), end-to-end; per token gap: ITL."""
    out: dict[str, list[float]] = {"ttft": [], "tpot": [], "itl": [], "e2e": []}
    for r in run.requests:
        times = r.token_times_s
        out["ttft"].append(times[0] - r.arrival_s)
        out["e2e"].append(r.finish_s - r.arrival_s)
        if len(times) > 1:
            out["tpot"].append((times[-1] - times[0]) / (len(times) - 1))
        out["itl"] += [b - a for a, b in zip(times, times[1:])]
    return out


def serving_metrics(run: ServingRun, slo_ttft_ms: float, slo_tpot_ms: float) -> dict[str, Any]:
    """The run's scalar metrics. Throughput is over the run's start (time 0, before the first
    arrival's gap, as vllm bench serve's duration) to the last finish; goodput counts the
    requests within both SLOs; KV utilization is live / reserved bytes averaged over steps;
    kv_budget_used is the most reserved over the budget."""
    reqs = run.requests
    duration = max(r.finish_s for r in reqs)  # every time is measured from the run's start
    lat = latencies_s(run)
    good = 0
    for r, ttft in zip(reqs, lat["ttft"]):
        times = r.token_times_s
        per_token = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0
        good += ttft * 1e3 <= slo_ttft_ms and per_token * 1e3 <= slo_tpot_ms
    out_tokens = sum(r.output_len for r in reqs)
    in_tokens = sum(r.prompt_len for r in reqs)
    tl = run.timeline
    util = [live / res for live, res in zip(tl.live_bytes, tl.reserved_bytes) if res > 0]
    metrics: dict[str, Any] = {
        "requests": len(reqs),
        "duration_s": duration,
        "request_throughput": len(reqs) / duration,
        "output_tokens_per_s": out_tokens / duration,
        "total_tokens_per_s": (out_tokens + in_tokens) / duration,
        "goodput_requests_per_s": good / duration,
        "slo_attained": good / len(reqs),
        "kv_utilization": sum(util) / len(util) if util else None,
        "kv_budget_used": max(tl.reserved_bytes) / run.kv_budget_bytes if tl.reserved_bytes else None,
        "max_concurrency": max(tl.running) if tl.running else 0,
        "preemptions": run.preemptions,
        # how far from its end a preempted request was: what its recompute had to get right
        "median_preempted_tokens_left": (statistics.median(run.preempted_tokens_left)
                                         if run.preempted_tokens_left else None),
        "steps": len(tl.t_s),
        "kv_capacity_tokens": run.kv_capacity_tokens,
    }
    for name, values in lat.items():
        for stat, value in _summary(values).items():
            metrics[f"{stat}_{name}_ms"] = value
    return metrics


def serving_series(run: ServingRun) -> dict[str, list]:
    """The raw series the report draws: latencies (ms) per request or token gap, and per step the
    time, running requests and KV utilization (None where nothing was reserved)."""
    lat = latencies_s(run)
    tl = run.timeline
    return {**{f"{name}_ms": [x * 1e3 for x in values] for name, values in lat.items()},
            "t_s": tl.t_s, "running": tl.running,
            "kv_utilization": [live / res if res else None for live, res in zip(tl.live_bytes, tl.reserved_bytes)],
            "kv_live_fraction": [live / run.kv_budget_bytes for live in tl.live_bytes]}
