"""continuous_batching: static batches against iteration-level scheduling, the KV layout held
equal so only the scheduling differs (a serving run over a request trace)."""
from __future__ import annotations

from gpubench.contract import Headline, Param, Recorder, Technique
from gpubench.serving import bench
from gpubench.serving.bench import ServingWorkload
from gpubench.serving.engine import ServingRun

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
    headline_figures=(Headline("output_tokens_per_s", "output tokens/s"),
                      Headline("median_ttft_ms", "median TTFT (ms)", higher_is_better=False)),
    plots=bench.PLOTS,
)
bench.register(TECHNIQUE)


@TECHNIQUE.variant("static", role="baseline")
def static(w: ServingWorkload, rec: Recorder) -> ServingRun:
    """static batches: start when full or after batch_timeout_ms, run until the longest request ends"""
    return bench.serve(w, rec, scheduler="static")


@TECHNIQUE.variant("continuous", role="optimized")
def continuous(w: ServingWorkload, rec: Recorder) -> ServingRun:
    """iteration-level scheduling: requests join at the next step after they arrive and leave when done"""
    return bench.serve(w, rec, scheduler="continuous")
