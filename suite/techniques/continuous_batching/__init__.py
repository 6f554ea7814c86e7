"""continuous_batching: static batches against iteration-level scheduling, the KV layout held
equal so only the scheduling differs (a serving run over a request trace)."""

from __future__ import annotations

from gpubench.contract import Claim, Headline, Param, Recorder, Technique
from gpubench.serving import bench
from gpubench.serving.bench import ServingWorkload
from gpubench.serving.engine import ServingRun

TECHNIQUE = Technique(
    name="continuous_batching",
    summary="Serving: static batches that run until their longest request ends vs requests joining "
    "and leaving at every step (same KV memory and layout)",
    shape="serving_run",
    params=bench.common_params()
    + [
        Param(
            "kv",
            str,
            "contiguous",
            "KV layout of both engines (held equal to isolate scheduling)",
            choices=["contiguous", "paged"],
        )
    ],
    anchor="Anyscale (2023): up to 23x throughput over naive static batching with vLLM; Orca (OSDI'22): 36.9x",
    claims=[
        Claim(
            "Anyscale (2023)",
            "https://www.anyscale.com/blog/continuous-batching-llm-inference",
            text="up to 23x throughput over naive static batching (vLLM)",
            figure=(23.0, 23.0),
            measures="serving throughput of one request trace, continuous vs static batching",
            conditions="OPT-13B on one A100, generation lengths of high variance",
            when={"requests": (">=", 100)},
            caveat="Anyscale's 23x is vLLM (paged KV and continuous batching) over naive static "
            "batching; this pair changes the scheduler only, on a small model",
            device_reason="a GPU decodes a batch in about the time of one request, a CPU does not",
        )
    ],
    gpu_specific="Both engines run the same model on the same device, so the ratio is mostly scheduling: "
    "idle slots and waiting for a batch's longest request cost time on any device. What is "
    "GPU-specific is the size of the effect: a GPU decodes a batch of 16 in about the time of "
    "a batch of 1 (memory-bound), so every idle slot is lost throughput, while a CPU's step "
    "time grows with the batch.",
    benchmarks=bench.BENCHMARKS,
    headline_figures=(
        Headline("output_tokens_per_s", "output tokens/s"),
        Headline("median_ttft_ms", "median TTFT (ms)", higher_is_better=False),
    ),
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
