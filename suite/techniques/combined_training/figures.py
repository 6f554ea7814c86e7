"""combined_training's figures: tokens per second, the step's split by phase, and its host syncs
(counted by construction; on CUDA also observed in one extra, untimed step)."""

from __future__ import annotations

import statistics
from typing import Any

from gpubench.contract import Measured
from gpubench.measure.timing import count_cuda_syncs
from gpubench.techniques.combined_training.step import Step, train_step
from gpubench.techniques.combined_training.workload import VARIANTS, CombinedWorkload

SPLIT = ("build_ms", "moe_forward_ms", "wait_ms", "optimizer_ms", "other_ms")
COUNTS = {
    "builds": "metadata_builds_per_step",
    "metadata_syncs": "metadata_syncs_per_step",
    "moe_host_reads": "moe_host_reads_per_step",
    "cache_hits": "cache_hits_per_step",
    "buffers": "buffers",
    "bytes_h2d": "bytes_reloaded_per_step",
}


def step_metrics(w: CombinedWorkload, measured: Measured) -> dict[str, Any]:
    """Tokens per second, ms per step, the loss, and with the variant's records the counts of
    :data:`COUNTS`, host syncs per step and the split of :data:`SPLIT`."""
    tokens = w.tokens.numel()
    out: dict[str, Any] = {
        "tokens_per_s": tokens / measured.median_s,
        "ms_per_step": 1e3 * measured.median_s,
        "loss": float(_step(measured.output).loss),
        "tokens": tokens,
        "documents": int(w.doc_lens.numel()),
        "params": w.weights.num_params(),
    }
    if measured.records:
        # every call records each count (step.train_step)
        out.update({metric: int(statistics.median(r[key] for r in measured.records)) for key, metric in COUNTS.items()})
        out["host_syncs_per_step"] = int(
            statistics.median(r["metadata_syncs"] + r["moe_host_reads"] for r in measured.records)
        )
        out.update({key: measured.median_of(key) for key in SPLIT[:-1]})
        # the rest of the step: attention, dense layers, head, backward passes, copies not waited for
        out["other_ms"] = statistics.median(
            r["step_ms"] - r["build_ms"] - r["moe_forward_ms"] - r["wait_ms"] - r["optimizer_ms"]
            for r in measured.records
        )
        out["fallback"] = next((r["fallback"] for r in measured.records if r.get("fallback")), "")
    if w.device.type == "cuda":  # GPU-only: sync debug mode sees CUDA syncs only
        # Sync debug mode perturbs timing: CUDA's own count comes from one extra, untimed step.
        assert w.reset is not None  # (build_workload sets it)
        w.reset()
        with count_cuda_syncs(True) as seen:
            train_step(w, VARIANTS[measured.variant].options)
        out["host_syncs_observed"] = seen["n"]
    return out


def _step(output: Any) -> Step:
    if not isinstance(output, Step):
        raise TypeError(f"combined_training's variants return a Step, got {type(output).__name__}")
    return output
