"""Figures over telemetry samples (pure functions): a whole-run or one case's aggregate, its
breakdown per variant, and the samples as a table (telemetry.csv's rows)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from gpubench.measure.throttle import BENIGN_REASONS, split_reasons
from gpubench.records.results import Telemetry, VariantTelemetry

# Columns read as pandas' nullable Int64 (an unsupported reading stays empty instead of turning floats).
INT_COLUMNS = ("sm_clock_mhz", "mem_clock_mhz", "temp_c", "util_gpu_pct", "util_mem_pct", "throttle_mask")
# What a case's per-variant breakdown keeps of each variant's aggregate.
VARIANT_FIGURES = (
    "n_samples",
    "power_w_mean",
    "power_w_max",
    "sm_clock_mhz_mean",
    "temp_c_max",
    "throttled",
    "throttle_reasons",
)


def _clean(values: Iterable[Any]) -> list[float]:
    out = []
    for v in values:
        if v is None:
            continue
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            out.append(f)
    return out


def _mean(values: Iterable[Any]) -> float | None:
    v = _clean(values)
    return sum(v) / len(v) if v else None


def _max(values: Iterable[Any]) -> float | None:
    v = _clean(values)
    return max(v) if v else None


def _min(values: Iterable[Any]) -> float | None:
    v = _clean(values)
    return min(v) if v else None


def aggregate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Figures over a list of samples (all JSON-safe: None where there is nothing to aggregate)."""
    col = lambda k: [s.get(k) for s in samples]
    reasons: set[str] = set()
    n_throttled = 0
    for s in samples:
        names = s.get("throttle_reasons") or []
        reasons.update(names)
        if any(n not in BENIGN_REASONS for n in names):
            n_throttled += 1
    harmful, benign = split_reasons(reasons)
    energy = _clean(col("energy_mj"))
    t = _clean(col("t_s"))
    return {
        "n_samples": len(samples),
        "duration_s": (max(t) - min(t)) if t else None,
        "power_w_mean": _mean(col("power_w")),
        "power_w_max": _max(col("power_w")),
        # Energy seen between the first and last sample (a sampled estimate; the runner's
        # per-variant energy reads the counter around the calls themselves).
        "energy_j_sampled": ((energy[-1] - energy[0]) / 1000.0) if len(energy) >= 2 else None,
        "temp_c_max": _max(col("temp_c")),
        "sm_clock_mhz_min": _min(col("sm_clock_mhz")),
        "sm_clock_mhz_mean": _mean(col("sm_clock_mhz")),
        "mem_clock_mhz_min": _min(col("mem_clock_mhz")),
        "mem_used_mb_max": _max(col("mem_used_mb")),
        "util_gpu_pct_mean": _mean(col("util_gpu_pct")),
        "throttled": bool(harmful),
        "throttled_fraction": (n_throttled / len(samples)) if samples else None,
        "throttle_reasons": harmful,
        "benign_reasons": benign,
    }


def case_summary(samples: list[dict[str, Any]], case_id: str) -> Telemetry:
    """Aggregates over the samples tagged with ``case_id``, with a ``variants`` breakdown (power,
    SM clock, throttling per variant tag)."""
    mine = [s for s in samples if s["case"] == case_id]
    by_variant: dict[str, list[dict[str, Any]]] = {}
    for s in mine:
        by_variant.setdefault(str(s["variant"]), []).append(s)
    return Telemetry(
        **aggregate(mine),
        variants={
            name: VariantTelemetry(**{k: agg[k] for k in VARIANT_FIGURES})
            for name, group in by_variant.items()
            for agg in (aggregate(group),)
        },
    )


def samples_dataframe(samples: list[dict[str, Any]], columns: list[str]):
    """One row per sample; ``throttle_reasons`` joined with ``|``. Integer columns use pandas'
    nullable Int64 so unsupported readings stay empty instead of turning floats."""
    import pandas as pd

    rows = [dict(s, throttle_reasons="|".join(s["throttle_reasons"])) for s in samples]
    df = pd.DataFrame(rows, columns=columns)
    for c in INT_COLUMNS:
        try:
            df[c] = df[c].astype("Int64")
        except (TypeError, ValueError):
            pass  # a source that reports fractional values keeps floats
    return df
