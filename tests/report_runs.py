"""Runs for the report tests: a real run small enough for a slow machine (every technique at a
small case, two cases where a figure needs a line, a short policy), and a hand-made 200-case
flash_attention sweep that is never run (results synthesized the way the runner writes them)."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path
from typing import Any

# Every technique, every figure path of the report: a numeric sweep (speedup against a param),
# single and categorical cases (speedup per case), FLOP counts (% of peak), each declared plot
# kind (line, stacked, bars, series, cdf, relative). Five timed calls a variant, so speedups have a
# CI; the serving pair two (none: the report's "n=2" path). About 20 s on 2 CPU cores when the
# speculative pair is cached (its first build trains it: ~25 s more).
SCENARIO = """
name: report-test
description: every technique at a small case, for the report tests
device: cpu
policy: {warmup_s: 0, min_reps: 5, max_reps: 6, min_time_s: 0, max_time_s: 0.2, target_iqr: 1.0,
         case_timeout_s: 300, energy_s: 0}
entries:
  - technique: flash_attention
    params: {batch: 1, heads: 2, seq_len: [32, 64], head_dim: 32, causal: [false, true]}
  - technique: kv_cache
    params: {model: [llama-3.1-8b, deepseek-v3], layers: 1, requests: 2, max_len: 64}
  - technique: paged_attention
    params: {batch: [1, 2], heads: 2, kv_heads: 1, head_dim: 64, context_len: [32, 64]}
  - technique: continuous_batching
    params: {requests: 6, arrival: all, prompt_len: "uniform:4:8", output_len: "uniform:4:12", max_len: 32,
             kv_budget_mib: 0.25, max_batch: 4}
    policy: {min_reps: 2, max_reps: 2}
  - technique: paged_kv_serving
    params: {requests: 6, arrival: all, prompt_len: "uniform:4:8", output_len: "uniform:4:12", max_len: 32,
             kv_budget_mib: 0.25, max_batch: 4}
    policy: {min_reps: 2, max_reps: 2}
  - technique: activation_offload
    params: {layers: [1, 2], hidden: 16, heads: 2, kv_heads: 1, batch: 1, seq_len: 8, vocab: 32}
  - technique: moe_grouping
    params: {experts: 4, top_k: 2, hidden: 16, expert_dim: 16, tokens: [16, 32]}
  - technique: packed_metadata
    params: {model: tiny, layers: [1, 2], rows: 1, seq_len: 32, mean_doc_len: 8, backend: sdpa}
  - technique: speculative_decoding
    params: {drafter: ngram, k: [2, 4], prompts: 1, prompt_len: 16, max_new_tokens: 8}
"""


def small_run(out_dir: Path) -> Path:
    """Run :data:`SCENARIO` on the CPU into ``out_dir``; the run directory."""
    from gpubench.run import scenario, supervisor

    path = out_dir / "report-test.yaml"
    path.write_text(SCENARIO)
    options = supervisor.RunOptions(devices=["cpu"], isolation="none")  # in this process: no worker start-up
    outcome = supervisor.run_scenario(scenario.load(str(path)), options, out_dir / "runs")
    assert outcome.doc["summary"]["failed"] == 0, [c.get("failure") for c in outcome.doc["cases"]]
    return outcome.run_dir


# -- a 200-case sweep, synthesized -----------------------------------------------------------
SWEEP_LENGTHS = [128 * i for i in range(1, 26)]  # 25 lengths
SWEEP_AXES = {"causal": [False, True], "dtype": ["float32", "bfloat16"], "kv_heads": [0, 2]}


def _variant(role: str, description: str, median: float, flops: float, rng: random.Random) -> dict[str, Any]:
    samples = [median * (1 + 0.05 * (rng.random() - 0.5)) for _ in range(15)]
    mid = statistics.median(samples)
    return {
        "role": role,
        "status": "ok",
        "description": description,
        "reason": None,
        "samples_s": samples,
        "stats": {"median": mid, "ci_low": 0.98 * mid, "ci_high": 1.02 * mid, "n": len(samples)},
        "metrics": {"flops": flops, "tflops": flops / mid / 1e12, "pct_peak_flops": 100 * flops / mid / 20e12},
        "check": {"passed": True, "error": 1e-7, "tolerance": 1e-5, "metric": "rel_l2", "detail": ""},
    }


def sweep_case(seq_len: int, causal: bool, dtype: str, kv_heads: int, rng: random.Random) -> dict[str, Any]:
    """One flash_attention case record as results.json holds it; the speedup grows with the
    length (about 0.5x to 3.5x), more so for causal and bfloat16 (a surface with a shape)."""
    params = {
        "batch": 1,
        "heads": 8,
        "kv_heads": kv_heads,
        "seq_len": seq_len,
        "head_dim": 64,
        "dtype": dtype,
        "causal": causal,
        "block_m": 0,
        "block_n": 0,
    }
    speedup = 0.4 + seq_len / 1600 * (1.3 if causal else 1.0) * (1.2 if dtype == "bfloat16" else 1.0)
    base, flops = 1e-9 * seq_len**2, 4.0 * 8 * 64 * seq_len**2  # 4 b h n^2 d
    case_id = (
        "flash_attention["
        + ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in params.items())
        + "]"
    )
    eager = _variant("baseline", "materialized scores, float32 softmax, @ V", base, flops, rng)
    tiled = _variant("optimized", "the same online softmax as a loop of tile operations", base / speedup, flops, rng)
    ratio = eager["stats"]["median"] / tiled["stats"]["median"]
    return {
        "id": case_id,
        "technique": "flash_attention",
        "params": params,
        "seed": 0,
        "source": "",
        "headline": "",
        "gate_metric": "",
        "status": "passed",
        "failure": None,
        "elapsed_s": 0.1,
        "variants": {"eager": eager, "torch_tiled": tiled},
        "speedups": {"torch_tiled": {"ratio": ratio, "ci_low": 0.95 * ratio, "ci_high": 1.05 * ratio}},
    }


def sweep_doc() -> dict[str, Any]:
    """A results document of 200 flash_attention cases: 25 lengths x causal x dtype x kv_heads."""
    rng = random.Random(0)
    cases = [
        sweep_case(n, causal, dtype, kv, rng)
        for causal in SWEEP_AXES["causal"]
        for dtype in SWEEP_AXES["dtype"]
        for kv in SWEEP_AXES["kv_heads"]
        for n in SWEEP_LENGTHS
    ]
    entry = {"technique": "flash_attention", "params": {"seq_len": SWEEP_LENGTHS, **SWEEP_AXES}}
    return {
        "kind": "gpubench.results",
        "schema_version": 2,
        "run_id": "sweep-200",
        "status": "complete",
        "device": "cpu",
        "device_label": "CPU (synthesized)",
        "started_at": "2026-01-01T00:00:00+00:00",
        "finished_at": "2026-01-01T00:00:13+00:00",
        "scenario": {"name": "sweep-200", "description": "a 200-case flash_attention sweep", "entries": [entry]},
        "telemetry": {"status": "unavailable", "reason": "synthesized"},
        "cases": cases,
        "summary": {"cases": len(cases), "passed": len(cases), "failed": 0, "interrupted": 0},
    }


def recorded_runs(root: Path, names: tuple[str, ...] = ("a", "b"), cases: int = 4) -> list[Path]:
    """Small runs of schema 3 (the first ``cases`` cases of :func:`sweep_doc`, their technique's
    declarations recorded as a run records them), one folder per name under ``root``: what a
    report, compare or history reads without technique code."""
    from gpubench import techniques
    from gpubench.records.declarations import Declarations, declare

    held = Declarations()
    declare(held, {"flash_attention": ""}, techniques)  # the registry, in this process
    out = []
    for name in names:
        doc = sweep_doc()
        doc["cases"] = doc["cases"][:cases]
        doc["summary"] = {"cases": cases, "passed": cases, "failed": 0, "interrupted": 0}
        doc["run_id"], doc["schema_version"] = f"run-{name}", 3
        doc["techniques"], doc["claims_elsewhere"] = held.to_dicts()
        out.append(write_run(root / name, json.loads(json.dumps(doc, default=str))))
    return out


def write_run(root: Path, doc: dict[str, Any]) -> Path:
    """A run directory holding ``doc`` as its results.json."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "results.json").write_text(json.dumps(doc))
    return root


# -- a run shaped like the H200 gpu-quick run of issue 24 --------------------------------------
H200_RESULTS = Path(__file__).resolve().parents[1] / "results" / "NVIDIA-H200" / "combined_training-h200-results.json"
H200_TECHNIQUES = ("flash_attention", "activation_offload", "moe_grouping")  # with combined_training, as that run
H200_PEAK_TFLOPS = 703.0  # the H200 run's measured bf16 matmul peak
GPU_QUICK_FLASH = [
    (batch, seq_len, heads, head_dim)
    for batch, seq_len in ((32, 512), (16, 1024), (8, 2048), (4, 4096), (2, 8192))
    for heads, head_dim in ((32, 64), (16, 128))
] + [(1, 16384, 16, 128)]


def _gpu_quick_flash_case(
    batch: int, seq_len: int, heads: int, head_dim: int, causal: bool, rng: random.Random
) -> dict[str, Any]:
    """A flash_attention case at a gpu-quick size, with the figures an H200 records (times of the
    order it measures, peak memory of the materialized scores, energy per call)."""
    params = {
        "batch": batch,
        "heads": heads,
        "seq_len": seq_len,
        "head_dim": head_dim,
        "dtype": "bfloat16",
        "causal": causal,
        "mode": "forward",
        "varlen": False,
    }
    flops = 4.0 * batch * heads * head_dim * seq_len**2 / (2 if causal else 1)
    base = flops / 150e12 * (1 + seq_len / 8192)
    speedup = 2.0 + seq_len / 4096 + (0.6 if causal else 0.0)
    eager = _variant("baseline", "materialized scores, float32 softmax, @ V", base, flops, rng)
    triton = _variant("optimized", "Triton forward kernel: tiled online softmax", base / speedup, flops, rng)
    for v in (eager, triton):
        v["metrics"]["pct_peak_flops"] = 100 * v["metrics"]["tflops"] / H200_PEAK_TFLOPS
    scores = 2.0 * batch * heads * seq_len**2
    eager.update(peak_memory_bytes=int(3 * scores + 3e8), energy_mj_per_call=650_000 * eager["stats"]["median"])
    triton.update(peak_memory_bytes=int(3e8), energy_mj_per_call=600_000 * triton["stats"]["median"])
    ratio = eager["stats"]["median"] / triton["stats"]["median"]
    case_id = (
        "flash_attention["
        + ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in params.items())
        + "]"
    )
    return {
        "id": case_id,
        "technique": "flash_attention",
        "params": params,
        "seed": 0,
        "source": "",
        "headline": "",
        "gate_metric": "",
        "status": "passed",
        "failure": None,
        "elapsed_s": 0.0,
        "variants": {"eager": eager, "triton": triton},
        "speedups": {"triton": {"ratio": ratio, "ci_low": 0.97 * ratio, "ci_high": 1.03 * ratio}},
    }


def synthetic_phases(case: dict[str, Any], rng: random.Random) -> dict[str, float]:
    """A ``phases_s`` breakdown as the runner records it (its keys, in its order: the phases, then
    "timed", the sum of the timed samples and part of "timing", then "other"), and the case's
    ``elapsed_s`` set to match."""
    timed = sum(sum(v.get("samples_s") or []) for v in case["variants"].values())
    phases = {
        "build": rng.uniform(0.2, 2.0),
        "check": rng.uniform(0.1, 1.0),
        "warmup": rng.uniform(0.05, 0.3),
        "timing": timed * rng.uniform(1.05, 1.6) + 0.01,
        "metrics": rng.uniform(0.0, 0.05),
        "energy": rng.uniform(0.2, 0.6),
        "profile": 0.0,
        "stats": rng.uniform(0.001, 0.01),
        "timed": timed,
        "other": rng.uniform(0.01, 0.2),
    }
    case["elapsed_s"] = sum(v for k, v in phases.items() if k != "timed")
    return phases


def h200_shaped_doc(small_run_dir: Path) -> dict[str, Any]:
    """A results document shaped like the H200 run issue 24 reviewed: four techniques (the two real
    combined_training cases from results/NVIDIA-H200, 21 gpu-quick-sized flash_attention cases and
    the small run's activation_offload and moe_grouping cases moved onto the GPU), peak memory and
    energy for every variant, so the summary table has all its columns, and most published claims
    not judged by the run. Every case carries a ``phases_s`` breakdown."""
    rng = random.Random(24)
    small = json.loads((small_run_dir / "results.json").read_text())
    real = json.loads(H200_RESULTS.read_text())
    flash = [_gpu_quick_flash_case(*size, causal, rng) for size in GPU_QUICK_FLASH for causal in (False, True)]
    moved = [c for c in small["cases"] if c["technique"] in H200_TECHNIQUES[1:]]
    for case in moved:
        for v in case["variants"].values():
            if v.get("stats"):
                v.update(peak_memory_bytes=int(rng.uniform(1e8, 4e9)), energy_mj_per_call=rng.uniform(5, 900))
    cases = flash + moved + real["cases"]
    for case in cases:
        case["device"] = real["cases"][0]["device"]
        case["phases_s"] = synthetic_phases(case, rng)
    entries = [
        {
            "technique": "flash_attention",
            "params": {
                "batch": [],
                "heads": [],
                "seq_len": [],
                "head_dim": [],
                "dtype": "bfloat16",
                "causal": [False, True],
            },
        }
    ]
    entries += [e for e in small["scenario"]["entries"] if e["technique"] in H200_TECHNIQUES[1:]]
    entries += real["scenario"]["entries"]
    failed = sum(c["status"] != "passed" for c in cases)
    return {
        **real,
        "run_id": "h200-shaped",
        "cases": cases,
        "scenario": {**real["scenario"], "entries": entries},
        "telemetry": {"status": "unavailable", "reason": "synthesized: the H200 run's telemetry.csv is not kept"},
        "summary": {"cases": len(cases), "passed": len(cases) - failed, "failed": failed, "interrupted": 0},
    }


# -- an 864-case kv_cache sweep, synthesized from a real case ----------------------------------
KV_SWEEP_AXES = {
    "model": ["llama-2-7b", "llama-3.1-8b", "mistral-7b-v0.1", "qwen2.5-7b", "gpt-oss-20b", "deepseek-v3"],
    "kv_dtype": ["bf16", "fp8", "int4", "fp32"],
    "max_len": [512, 1024, 2048],
    "block_size": [8, 16, 32],
    "requests": [4, 8, 16, 32],
}  # 6 x 4 x 3 x 3 x 4 = 864 cases


def kv_sweep_doc(real_doc: dict[str, Any]) -> dict[str, Any]:
    """A results document of 864 kv_cache cases (the sweep issue 35 timed at 46.5 s to render),
    each a copy of ``real_doc``'s first case (a kv_cache record with the technique's metrics)
    with its params, byte figures and timings changed as an allocator's would: paged holds what
    it needs to the block, contiguous max_len a sequence; five timed calls a variant."""
    import copy
    import itertools

    rng = random.Random(35)
    template = real_doc["cases"][0]
    cases = []
    for model, kv_dtype, max_len, block, requests in itertools.product(*KV_SWEEP_AXES.values()):
        case = copy.deepcopy(template)
        params = {
            **case["params"],
            "model": model,
            "kv_dtype": kv_dtype,
            "max_len": max_len,
            "block_size": block,
            "requests": requests,
        }
        case["params"] = params
        case["id"] = "kv_cache[" + ",".join(f"{k}={v}" for k, v in params.items()) + "]"
        tokens = sum(rng.randint(1, max_len) for _ in range(requests))
        per_token = 4096 * (1 + KV_SWEEP_AXES["model"].index(model) % 3)
        for v in case["variants"].values():
            paged = v["role"] == "optimized"
            reserved = per_token * (tokens + requests * block // 2 if paged else requests * max_len)
            held = per_token * tokens
            v["metrics"].update(
                bytes_reserved=reserved,
                bytes_predicted=reserved,
                bytes_holding_tokens=held,
                utilization=held / reserved,
                tokens=tokens,
                sequences=requests,
            )
            v["samples_s"] = [1e-3 * rng.uniform(0.9, 1.1) for _ in range(5)]
            v["stats"] = {**(v.get("stats") or {}), "median": statistics.median(v["samples_s"])}
        base, opt = (
            next(n for n, v in case["variants"].items() if v["role"] == role) for role in ("baseline", "optimized")
        )
        ratio = case["variants"][base]["stats"]["median"] / case["variants"][opt]["stats"]["median"]
        case.update(
            status="passed",
            failure=None,
            speedups={opt: {"ratio": ratio, "ci_low": 0.95 * ratio, "ci_high": 1.05 * ratio, "n": 5}},
        )
        cases.append(case)
    entry = {
        **real_doc["scenario"]["entries"][0],
        "technique": "kv_cache",
        "params": {k: list(v) for k, v in KV_SWEEP_AXES.items()},
    }
    return {
        **real_doc,
        "run_id": "kv-sweep-864",
        "cases": cases,
        "planned_cases": len(cases),
        "scenario": {**real_doc["scenario"], "name": "kv-sweep-864", "entries": [entry]},
        "summary": {"cases": len(cases), "passed": len(cases), "failed": 0, "interrupted": 0},
    }
