"""A synthesized run for the roofline tests: two flash_attention cases (one compute-bound, one
memory-bound under the ceilings below) with a baseline, an optimized variant and two peers, and a
paged_attention case that counts bytes but no FLOPs; each variant's metrics as the runner derives
them (``derive_rates``). Round numbers, so each figure the report prints can be computed by hand."""

from __future__ import annotations

from typing import Any

from gpubench.run.runner import derive_rates

PEAK_TFLOPS, PEAK_GBPS = 800.0, 4000.0  # ridge: 800e12 / 4000e9 = 200 FLOPs per byte
CEILINGS = {
    "matmul": {"dtype": "bfloat16", "n": 8192, "peak_tflops": PEAK_TFLOPS, "median_tflops": 780.0},
    "copy": {"bytes": 1 << 28, "peak_gbps": PEAK_GBPS, "median_gbps": 3900.0, "counts": "bytes read + bytes written"},
}
# case -> (flops, bytes) and variant -> (role, median seconds)
FLASH = {
    "compute": (
        (2e12, 1e9),
        {
            "eager": ("baseline", 0.04),
            "triton": ("optimized", 0.01),
            "sdpa_cudnn": ("peer", 0.005),
            "flash_attn": ("peer", 0.008),
        },
    ),
    "memory": (
        (1e11, 1e10),
        {
            "eager": ("baseline", 0.05),
            "triton": ("optimized", 0.005),
            "sdpa_cudnn": ("peer", 0.004),
            "flash_attn": ("peer", 0.01),
        },
    ),
}
PAGED = (
    (None, 4e9),
    {"gather": ("baseline", 0.01), "triton": ("optimized", 0.002), "sdpa_contiguous": ("peer", 0.0016)},
)


def _variant(
    role: str, median: float, counts: tuple[float | None, float | None], ceilings: dict[str, Any] | None
) -> dict[str, Any]:
    samples = [median * f for f in (0.99, 1.0, 1.01)]
    metrics = derive_rates({k: v for k, v in zip(("flops", "bytes_moved"), counts) if v is not None}, median, ceilings)
    return {
        "role": role,
        "status": "ok",
        "description": "",
        "samples_s": samples,
        "stats": {"median": median, "ci_low": 0.99 * median, "ci_high": 1.01 * median, "n": 3},
        "metrics": metrics,
        "check": {"passed": True, "error": 0.0, "tolerance": 1e-3, "metric": "rel_l2"},
    }


def _case(
    technique: str,
    params: dict[str, Any],
    counts: tuple,
    variants: dict[str, tuple[str, float]],
    device_type: str,
    ceilings: dict[str, Any] | None,
) -> dict[str, Any]:
    records = {name: _variant(role, median, counts, ceilings) for name, (role, median) in variants.items()}
    base = next(v for v in records.values() if v["role"] == "baseline")["stats"]["median"]
    speedups = {
        n: {
            "ratio": base / v["stats"]["median"],
            "ci_low": 0.9 * base / v["stats"]["median"],
            "ci_high": 1.1 * base / v["stats"]["median"],
        }
        for n, v in records.items()
        if v["role"] != "baseline"
    }
    case_id = technique + "[" + ",".join(f"{k}={v}" for k, v in params.items()) + "]"
    return {
        "id": case_id,
        "technique": technique,
        "params": params,
        "seed": 0,
        "status": "passed",
        "variants": records,
        "speedups": speedups,
        "device": {
            "key": "cuda:0" if device_type == "cuda" else "cpu",
            "type": device_type,
            "index": 0,
            "label": "NVIDIA H200" if device_type == "cuda" else "CPU: test (2 logical cores)",
        },
    }


def roofline_doc(ceilings: dict[str, Any] | None = CEILINGS, device_type: str = "cuda") -> dict[str, Any]:
    """A schema-2 results document (techniques read from today's registry) with the cases above."""
    cases = [
        _case(
            "flash_attention", {"seq_len": 4096 if bound == "compute" else 256}, counts, variants, device_type, ceilings
        )
        for bound, (counts, variants) in FLASH.items()
    ]
    cases.append(_case("paged_attention", {"batch": 64, "context_len": 8192}, *PAGED, device_type, ceilings))
    label = cases[0]["device"]["label"]
    return {
        "kind": "gpubench.results",
        "schema_version": 2,
        "run_id": "roofline",
        "status": "complete",
        "device": device_type,
        "device_label": label,
        "started_at": "2026-01-01T00:00:00+00:00",
        "finished_at": "2026-01-01T00:01:00+00:00",
        "ceilings": ceilings,
        "devices": {cases[0]["device"]["key"]: {**cases[0]["device"], "ceilings": ceilings}},
        "scenario": {"name": "roofline", "entries": []},
        "telemetry": {"status": "unavailable", "reason": "synthesized"},
        "cases": cases,
        "summary": {"cases": 3, "passed": 3, "failed": 0, "interrupted": 0},
    }
