"""What the two serving techniques (``continuous_batching`` and ``paged_kv_serving``) share: their
params, the workload (model weights, a request trace, the engine settings), the check of a run's
tokens and KV accounting against one-request-at-a-time generation, the metrics of the timed runs
and the figures the report draws."""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from gpubench.contract import Bench, CheckResult, Measured, Param, Plot, Recorder, Workload
from gpubench.measure import machine_load
from gpubench.models import stand_in
from gpubench.models.llama import SIZES, LlamaWeights, causal_attention, forward, model_from
from gpubench.serving.config import EngineConfig
from gpubench.serving.engine import Engine, ServingRun
from gpubench.serving.metrics import serving_metrics, serving_series
from gpubench.serving.reference import reference_batch
from gpubench.serving.traces import ARRIVAL_HELP, LENGTH_HELP, Request, TraceSpec, generate, parse_arrival, parse_length

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
# Decoding is compared token for token, greedy and sampled alike (a sampled request draws from its
# own seeded generator, however it is batched or preempted). Batching changes floating-point
# rounding (a different matmul shape, padded vs paged attention), so where the one-at-a-time
# reference's choice was nearer a tie than this (in logit units: greedy's top-2 logit gap, the
# sampled race's margin), the engines may legitimately pick the other token; such a divergence is
# counted and reported, not failed. Any other difference fails.
NEAR_TIE = {torch.float64: 1e-9, torch.float32: 1e-3, torch.float16: 0.1, torch.bfloat16: 0.1}

LATENCY_PERCENTILES = tuple(
    f"{stat}_{name}_ms" for name in ("ttft", "tpot", "itl") for stat in ("median", "p90", "p99")
)
PLOTS = [
    Plot("Output tokens/s", y="output_tokens_per_s", kind="bars", ylabel="output tokens/s"),
    Plot("TTFT, TPOT and ITL percentiles (ms)", y=LATENCY_PERCENTILES, kind="bars", ylabel="ms", log_y=True),
    Plot(
        "KV utilization over time: bytes holding live tokens / bytes reserved (%)",
        y="series.kv_utilization",
        x="series.t_s",
        kind="series",
        scale=100,
        ylabel="KV live / reserved %",
        xlabel="seconds since the run's start",
    ),
    Plot(
        "Running requests over time",
        y="series.running",
        x="series.t_s",
        kind="series",
        ylabel="running requests",
        xlabel="seconds since the run's start",
    ),
    Plot("Time to first token, CDF over requests (ms)", y="series.ttft_ms", kind="cdf", ylabel="TTFT (ms)"),
    Plot("End-to-end latency, CDF over requests (ms)", y="series.e2e_ms", kind="cdf", ylabel="end-to-end latency (ms)"),
]
# What benchmarks/ times both serving pairs at: 16 requests at once (offline throughput), tiny model.
BENCHMARKS = [
    Bench(
        "16-requests",
        {
            "requests": 16,
            "arrival": "all",
            "prompt_len": "uniform:8:32",
            "output_len": "exp:24:64",
            "max_len": 96,
            "kv_budget_mib": 0.5,
        },
    )
]


def common_params() -> list[Param]:
    return [
        Param(
            "model",
            str,
            "tiny",
            f"a built-in size ({', '.join(SIZES)}; seeded random weights), a preset or a config.json "
            "(seeded random weights at that model's shapes: a Llama-style stand-in, MoE as a dense MLP of "
            "the active width, sliding windows not applied; the case records which), or a local Hugging "
            "Face Llama-style checkpoint directory (its weights)",
            value_check="gpubench.models.stand_in:model_name_problem",
        ),
        Param("ignore_fields", str, "", stand_in.IGNORE_FIELDS_HELP, omit_default_from_id=True),
        Param(
            "layers",
            int,
            0,
            "decoder layers run: 0 keeps the model's own; else a built-in size gets that many, a "
            "preset, config or checkpoint its first N",
            min=0,
            omit_default_from_id=True,
        ),
        Param("dtype", str, "float32", "weights, activations and KV cache", choices=list(DTYPES)),
        Param("requests", int, 50, "requests in the synthetic trace", min=1),
        Param("arrival", str, "poisson:40", f"arrival process: {ARRIVAL_HELP} (requests/s)"),
        Param("prompt_len", str, "uniform:16:64", f"prompt lengths: {LENGTH_HELP}"),
        Param("output_len", str, "exp:48:160", f"output lengths: {LENGTH_HELP}"),
        Param(
            "trace_file",
            str,
            "",
            "JSONL trace ({arrival_s, prompt_len | prompt, output_len} per line); "
            "replaces the synthetic trace when set",
        ),
        Param("max_len", int, 256, "longest request, prompt + output (contiguous KV reserves this)", min=2),
        Param("kv_budget_mib", float, 2.0, "KV-cache memory, the same for every engine (MiB)", min=0.001),
        Param("block_size", int, 16, "tokens per paged KV block", choices=[8, 16, 32]),
        Param("max_batch", int, 16, "most requests decoding at once", min=1),
        Param(
            "batch_timeout_ms",
            float,
            50.0,
            "static batching: start a partial batch after its oldest request waited this long",
            min=0.0,
        ),
        Param("temperature", float, 0.0, "0: greedy (checked token for token); > 0: sampled", min=0.0),
        Param("wait", bool, True, "honour arrival times (false: every request at time 0, offline throughput)"),
        Param("slo_ttft_ms", float, 1000.0, "goodput: time-to-first-token target", min=0.0),
        Param("slo_tpot_ms", float, 100.0, "goodput: time-per-output-token target", min=0.0),
        Param(
            "min_preemptions",
            int,
            0,
            "the check fails an engine run with paged KV that preempted fewer "
            "times (a case meant to test preemption cannot silently stop doing so); needs arrival all or "
            "wait false, so the count does not depend on the machine's speed",
            min=0,
        ),
        Param(
            "check_requests",
            int,
            0,
            "requests regenerated alone for the token check (0: all); the rest "
            "are checked for length and accounting only (a GPU-sized trace alone takes minutes)",
            min=0,
        ),
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
            problems.append(
                f"max_len {params['max_len']} is below the longest request the trace can draw "
                f"({longest} tokens: prompt_len and output_len maxima)"
            )
    problems += stand_in.model_problems(
        params["model"], params["layers"], ignore_fields=params.get("ignore_fields", "")
    )
    if params["trace_file"] and not Path(params["trace_file"]).is_file():
        problems.append(f"trace_file {params['trace_file']!r} does not exist")
    if params["min_preemptions"]:
        if params.get("kv") == "contiguous":
            problems.append("min_preemptions: contiguous KV never preempts (a slab holds max_len); use kv: paged")
        if params["wait"] and (params["trace_file"] or params["arrival"] != "all"):
            problems.append(
                "min_preemptions: with arrivals honoured, preemptions depend on the machine's speed; "
                "use arrival: all or wait: false"
            )
    return problems


@dataclass(kw_only=True)
class ServingWorkload(Workload):
    weights: LlamaWeights
    requests: list[Request]
    engine: EngineConfig  # a technique holds its scheduler or its KV layout here; variants set the other
    slo_ttft_ms: float
    slo_tpot_ms: float
    check_requests: int  # requests regenerated alone for the token check (0: all)
    min_preemptions: int  # the fewest preemptions a run with paged KV must make
    model_note: str = ""  # which model the weights stand for, when they are a stand-in (stand_in_note)


def build(params: dict[str, Any], device: torch.device, seed: int) -> ServingWorkload:
    device = torch.device(device)
    ignore = params.get("ignore_fields", "")
    weights = model_from(
        params["model"], seed, DTYPES[params["dtype"]], device, layers=params["layers"], ignore_fields=ignore
    )
    spec = TraceSpec(
        params["requests"],
        params["arrival"],
        params["prompt_len"],
        params["output_len"],
        weights.config.vocab_size,
        params["trace_file"] or None,
    )
    requests = generate(spec, seed + 1)
    too_long = [r.id for r in requests if r.prompt_len + r.output_len > params["max_len"]]
    if too_long:
        raise ValueError(f"requests {too_long[:5]} exceed max_len {params['max_len']} (prompt + output)")
    _warm_up(weights)
    engine = EngineConfig(
        scheduler=params.get("scheduler", "continuous"),
        kv=params.get("kv", "paged"),
        kv_budget_bytes=int(params["kv_budget_mib"] * 2**20),
        block_size=params["block_size"],
        max_len=params["max_len"],
        max_batch=params["max_batch"],
        batch_timeout_s=params["batch_timeout_ms"] / 1e3,
        temperature=params["temperature"],
        wait=params["wait"],
    )
    return ServingWorkload(
        params=dict(params),
        device=device,
        seed=seed,
        weights=weights,
        requests=requests,
        engine=engine,
        slo_ttft_ms=params["slo_ttft_ms"],
        slo_tpot_ms=params["slo_tpot_ms"],
        check_requests=params["check_requests"],
        min_preemptions=params["min_preemptions"],
        model_note=stand_in.case_note(params["model"], params["layers"], ignore_fields=ignore),
    )


def _warm_up(weights: LlamaWeights) -> None:
    """One small forward pass so lazy initialization is not charged to the first engine run."""
    tok = torch.arange(8, device=weights.device) % weights.config.vocab_size
    with torch.inference_mode():
        forward(weights, tok, torch.arange(8, device=weights.device), lambda i, q, k, v: causal_attention(q, k, v))


def serve(w: ServingWorkload, rec: Recorder, **engine: Any) -> ServingRun:
    """One run of the trace through an engine (``engine``: what the variant sets, e.g. its scheduler)."""
    run = Engine(w.weights, replace(w.engine, **engine)).run(w.requests)
    rec.record(run=run)
    return run


# -- correctness ------------------------------------------------------------------------------


@dataclass
class ServingReference:
    tokens: dict[int, list[int]]  # request id -> tokens generated alone
    gaps: dict[int, list[float]]  # request id -> how near a tie each of those choices was (logit units)
    temperature: float
    dtype: torch.dtype
    lengths: dict[int, int] = field(default_factory=dict)  # every request's output length
    min_preemptions: int = 0  # the fewest preemptions a run with paged KV must make


def reference(w: ServingWorkload) -> ServingReference:
    """Every request (or the first ``check_requests``) generated as if alone, with a plain KV
    cache: what batching must not change. Decoded together in padded batches, each row masked to
    its own keys (:func:`reference_batch`: the tokens of one pass per request, a fraction of the
    time)."""
    ref = ServingReference(
        {}, {}, w.engine.temperature, w.weights.dtype, {r.id: r.output_len for r in w.requests}, w.min_preemptions
    )
    checked = w.requests[: w.check_requests or len(w.requests)]
    with _one_thread_if_overloaded(w.device):
        decoded = reference_batch(w.weights, checked, w.engine.temperature)
    for rid, (tokens, gaps) in decoded.items():
        ref.tokens[rid], ref.gaps[rid] = tokens, gaps
    return ref


@contextlib.contextmanager
def _one_thread_if_overloaded(device: torch.device) -> Iterator[None]:
    """On a CPU with more runnable work than cores, torch's intra-op threads wait on siblings the
    OS has descheduled: the batched reference of smoke's 50 requests took 6-23 s with 2 threads
    and 0.8-1.0 s with one, at load 4 on 2 cores (docs/techniques/serving.md). Its tokens do not depend on it."""
    load = machine_load.read()
    if torch.device(device).type != "cpu" or load is None or load.load_1m <= load.cpus:  # any contention
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def utilization_problems(run: ServingRun) -> list[str]:
    """Steps whose KV utilization (live / reserved bytes, what the metrics average and the waste
    claims read) leaves [0, 1]: more bytes live than reserved means negative waste."""
    tl = run.timeline
    bad = [i for i, (live, res) in enumerate(zip(tl.live_bytes, tl.reserved_bytes)) if not 0 <= live <= res]
    if not bad:
        return []
    i = bad[0]
    return [
        f"KV utilization outside [0, 1] at {len(bad)} step(s): step {i + 1} has {tl.live_bytes[i]} bytes live "
        f"in {tl.reserved_bytes[i]} reserved"
    ]


def check(ref: ServingReference, out: ServingRun) -> CheckResult:
    """Every checked request's tokens equal the reference's, greedy or sampled (a divergence where
    the reference's choice was within the dtype's near-tie margin is allowed and reported); every
    other request produced its full length. Always: exact KV accounting (no leaked or doubly owned
    block, never over the budget, never more bytes live than reserved), and a run with paged KV
    preempted at least ``min_preemptions`` times."""
    problems = out.accounting_problems + utilization_problems(out)
    if problems:
        return CheckResult(False, float(len(problems)), None, "accounting_problems", "; ".join(problems[:3]))
    margin = NEAR_TIE[ref.dtype]
    mismatched, near_ties, first_bad = 0, 0, None
    for rid, length in ref.lengths.items():
        if rid not in ref.tokens and len(out.tokens.get(rid, [])) != length:
            mismatched += 1
            first_bad = first_bad or f"request {rid}: {len(out.tokens.get(rid, []))} tokens, expected {length}"
    for rid, expected in ref.tokens.items():
        got = out.tokens.get(rid, [])
        if len(got) != len(expected):
            mismatched += 1
            first_bad = first_bad or f"request {rid}: {len(got)} tokens, expected {len(expected)}"
            continue
        if got == expected:
            continue
        i = next(j for j, (a, b) in enumerate(zip(got, expected)) if a != b)
        if ref.gaps[rid][i] < margin:
            near_ties += 1
        else:
            mismatched += 1
            first_bad = first_bad or (
                f"request {rid}: token {i} is {got[i]}, alone it is {expected[i]} "
                f"({'top-2 logit gap' if ref.temperature <= 0 else 'sampling margin'} "
                f"{ref.gaps[rid][i]:.3g})"
            )
    notes = [first_bad] if first_bad else []
    if near_ties:
        notes.append(f"{near_ties} request(s) diverged at a near-tie (top-2 logits within {margin:g}), allowed")
    if left := out.preempted_tokens_left:
        notes.append(f"{len(left)} preemption(s), {min(left)} to {max(left)} tokens still to generate")
    missing = max(0, ref.min_preemptions - out.preemptions) if out.kv == "paged" else 0
    if missing:
        notes.append(
            f"{out.preemptions} preemption(s) of an engine with paged KV where the case asks for "
            f"at least {ref.min_preemptions}"
        )
    detail = "; ".join(notes)
    if missing and not mismatched:
        return CheckResult(False, float(missing), 0.0, "missing_preemptions", detail)
    return CheckResult(mismatched == 0, float(mismatched), 0.0, "mismatched_requests", detail)


# -- metrics ----------------------------------------------------------------------------------


def _median(values: list[Any]) -> Any:
    numbers = [v for v in values if isinstance(v, (int, float))]
    if not numbers:
        return None
    median = statistics.median(numbers)
    counts = all(isinstance(v, int) for v in numbers) and median == int(median)
    return int(median) if counts else median  # requests, steps: whole numbers stay whole


def metrics(w: ServingWorkload, measured: Measured) -> dict[str, Any]:
    """The serving metrics of the timed runs: each scalar the median over them; the series (what
    the figures draw) of the run whose duration is the median (the lower one of an even count)."""
    runs = [r["run"] for r in measured.records if isinstance(r.get("run"), ServingRun)]
    if not runs:
        raise ValueError(f"{measured.variant}: no timed serving run was recorded")
    per_run = [serving_metrics(run, w.slo_ttft_ms, w.slo_tpot_ms) for run in runs]
    m: dict[str, Any] = {key: _median([p[key] for p in per_run]) for key in per_run[0]}
    typical = sorted(runs, key=lambda run: run.duration_s)[(len(runs) - 1) // 2]
    m["series"] = serving_series(typical)
    m["scheduler"], m["kv"] = typical.scheduler, typical.kv
    m["model_params"] = w.weights.config.num_params()
    m["model_layers"] = w.weights.config.num_layers
    if w.model_note:
        m["model_note"] = w.model_note
    return m


def register(technique) -> None:
    """Attach the shared pieces (validate, build, reference, check, metrics) to a technique."""
    technique.validate(validate)
    technique.build(build)
    technique.reference(reference)
    technique.check(check)
    technique.metrics(metrics)
