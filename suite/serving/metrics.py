"""Serving metrics of one run, as ``vllm bench serve`` reports them: request and token
throughput, TTFT / TPOT / ITL / end-to-end latency (ms: mean, median, p90, p99), goodput under
SLOs; and from the engine's timeline, KV utilization, peak concurrency and preemptions.

The duration every throughput divides by is vLLM's benchmark duration: from the run's start
(time 0, before the first request's arrival gap) to the last request's finish. Where we differ
from ``vllm bench serve``: times are taken inside the engine's loop (no HTTP client or
detokenizer between), every request generates exactly its output_len tokens (as
``--ignore-eos``), percentiles interpolate linearly as numpy's do, and KV utilization, peak
concurrency and preemptions come from the engine's own timeline.

Counted as ``vllm bench serve`` counts them (vllm/benchmarks/serve.py ``calculate_metrics`` and
lib/endpoint_request_func.py, main of early 2026, read at 009e6d4 / 02cfb53): TPOT is (end-to-end
latency - TTFT) / (tokens - 1), 0 for goodput when a request has one token; a request is good when
``slo_ms / 1000 >= metric_s`` for every SLO, compared in seconds in floating point exactly as
vLLM does (so a TTFT exactly at the SLO counts as vLLM counts it); a request that produced no
token is failed (vLLM: "Never received a valid chunk"): not completed, no latency, not good."""

from __future__ import annotations

import statistics
from typing import Any

import torch

from gpubench.serving.engine import RequestTimes, ServingRun

MS_PER_S = 1000  # vLLM divides the SLO (ms) by this and compares in seconds


def _summary(values: list[float], scale: float = 1e3) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "median": None, "p90": None, "p99": None}
    t = torch.tensor(values, dtype=torch.float64) * scale
    q = torch.quantile(t, torch.tensor([0.5, 0.9, 0.99], dtype=torch.float64)).tolist()
    return {"mean": float(t.mean()), "median": q[0], "p90": q[1], "p99": q[2]}


def completed(run: ServingRun) -> list[RequestTimes]:
    """The requests vLLM's client counts as successful: those that produced a token."""
    return [r for r in run.requests if r.token_times_s]


def request_latencies_s(r: RequestTimes) -> tuple[float, float, float]:
    """(TTFT, end-to-end, TPOT for goodput) of a completed request, each computed as vLLM does:
    TTFT = first token - arrival; end-to-end = last token - arrival; TPOT = (end-to-end - TTFT) /
    (tokens - 1), and 0 for a request of one token."""
    times = r.token_times_s
    ttft = times[0] - r.arrival_s
    e2e = (r.finish_s if r.finish_s is not None else times[-1]) - r.arrival_s
    tpot = (e2e - ttft) / (len(times) - 1) if len(times) > 1 else 0.0
    return ttft, e2e, tpot


def latencies_s(run: ServingRun) -> dict[str, list[float]]:
    """Per completed request: TTFT, end-to-end and (requests of more than one token) TPOT, as
    :func:`request_latencies_s`; per token gap: ITL."""
    out: dict[str, list[float]] = {"ttft": [], "tpot": [], "itl": [], "e2e": []}
    for r in completed(run):
        ttft, e2e, tpot = request_latencies_s(r)
        times = r.token_times_s
        out["ttft"].append(ttft)
        out["e2e"].append(e2e)
        if len(times) > 1:
            out["tpot"].append(tpot)
        out["itl"] += [b - a for a, b in zip(times, times[1:])]
    return out


def is_good(r: RequestTimes, slo_ttft_ms: float, slo_tpot_ms: float) -> bool:
    """Within both SLOs, compared as vLLM does: ``slo_ms / 1000 >= latency_s`` (seconds, floats)."""
    if not r.token_times_s:
        return False
    ttft, _, tpot = request_latencies_s(r)
    return all(slo >= value for slo, value in ((slo_ttft_ms / MS_PER_S, ttft), (slo_tpot_ms / MS_PER_S, tpot)))


def serving_metrics(run: ServingRun, slo_ttft_ms: float, slo_tpot_ms: float) -> dict[str, Any]:
    """The run's scalar metrics. Throughput is over the run's start (time 0, before the first
    arrival's gap, as vllm bench serve's duration) to the last finish; goodput counts the
    requests within both SLOs; KV utilization is live / reserved bytes averaged over steps;
    kv_budget_used is the most reserved over the budget."""
    reqs, done = run.requests, completed(run)
    finishes = [r.finish_s for r in reqs if r.finish_s is not None]
    # every time is measured from the run's start. A request that never finished (no output, no
    # finish time) was in the system until the run ended: vLLM's benchmark duration waits for every
    # request, so the last finish alone would end the duration early and inflate every throughput.
    duration = max(finishes) if finishes and len(finishes) == len(reqs) else max([*finishes, run.duration_s])
    lat = latencies_s(run)
    good = sum(is_good(r, slo_ttft_ms, slo_tpot_ms) for r in done)
    out_tokens = sum(len(r.token_times_s) for r in done)
    in_tokens = sum(r.prompt_len for r in done)

    def per_s(count: int) -> float | None:
        return count / duration if duration > 0 else None

    tl = run.timeline
    util = [live / res for live, res in zip(tl.live_bytes, tl.reserved_bytes) if res > 0]
    metrics: dict[str, Any] = {
        "requests": len(reqs),
        "completed": len(done),  # produced a token (vLLM's successful requests)
        "duration_s": duration,
        "request_throughput": per_s(len(done)),
        "output_tokens_per_s": per_s(out_tokens),
        "total_tokens_per_s": per_s(out_tokens + in_tokens),
        "goodput_requests_per_s": per_s(good),
        "slo_attained": good / len(reqs) if reqs else None,
        "kv_utilization": sum(util) / len(util) if util else None,
        "kv_budget_used": max(tl.reserved_bytes) / run.kv_budget_bytes if tl.reserved_bytes else None,
        "max_concurrency": max(tl.running) if tl.running else 0,
        "preemptions": run.preemptions,
        # how far from its end a preempted request was: what its recompute had to get right
        "median_preempted_tokens_left": (
            statistics.median(run.preempted_tokens_left) if run.preempted_tokens_left else None
        ),
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
    return {
        **{f"{name}_ms": [x * 1e3 for x in values] for name, values in lat.items()},
        "t_s": tl.t_s,
        "running": tl.running,
        "kv_utilization": [live / res if res else None for live, res in zip(tl.live_bytes, tl.reserved_bytes)],
        "kv_live_fraction": [live / run.kv_budget_bytes for live in tl.live_bytes],
    }
