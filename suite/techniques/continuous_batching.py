"""continuous_batching: static batches against iteration-level scheduling, the KV layout held
equal so only the scheduling differs (a serving run over a request trace)."""
from __future__ import annotations

from typing import Any

from gpubench.contract import Param, Technique, Workload
from gpubench.serving import bench

TECHNIQUE = Technique(
    name="continuous_batching",
    summary="Serving: static batches that run until their longest request ends vs requests joining "
            "and leaving at every step (same KV memory and layout)",
    shape="serving_run",
    params=bench.common_params() + [
        Param("kv", str, "contiguous", "KV layout of both engines (held equal to isolate scheduling)",
              choices=["contiguous", "paged"]),
    ],
    anchor="Anyscale (2023): up to 23x throughput over naive static batching with vLLM; Orca (OSDI'22): 36.9x",
    gpu_specific="Both engines run the same model on the same device, so the ratio is mostly scheduling: "
                 "idle slots and waiting for a batch's longest request cost time on any device. What is "
                 "GPU-specific is the size of the effect: a GPU decodes a batch of 16 in about the time of "
                 "a batch of 1 (memory-bound), so every idle slot is lost throughput, while a CPU's step "
                 "time grows with the batch.",
    headline="output_tokens_per_s",
)
bench.register(TECHNIQUE)


@TECHNIQUE.variant("baseline", role="baseline")
def run_static(w: Workload) -> dict[str, Any]:
    """Static batching: a batch of up to max_batch starts when full or after batch_timeout_ms, and
    runs until its longest request finishes."""
    return bench.serve(w, "static", w.params["kv"])


@TECHNIQUE.variant("optimized", role="optimized")
def run_continuous(w: Workload) -> dict[str, Any]:
    """Continuous batching: requests join at the next step after they arrive and leave when done."""
    return bench.serve(w, "continuous", w.params["kv"])
