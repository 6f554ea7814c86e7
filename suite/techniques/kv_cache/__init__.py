"""kv_cache: allocate a model's real KV cache, ``contiguous`` at max length vs ``paged`` blocks, and
check the bytes each holds against the calculator's (:mod:`gpubench.lib.kvmath`) prediction, to the
byte. The layout is a preset's published config or a config.json's (its first ``layers`` layers, so the cache fits
any machine); every sequence's tokens (random data, never zeros) are written and read back
bit-exact through the allocator's addressing. Lengths are random, or ``edges``: at and around
block (and window) edges, where block arithmetic goes wrong.
"""

from __future__ import annotations

from gpubench.baselines.kv_cache import build_cache as build_contiguous
from gpubench.contract import Bench, Headline, Param, Plot, Technique
from gpubench.lib import kvmath
from gpubench.models import config as model_config
from gpubench.models import stand_in
from gpubench.optimizations.kv_cache import build_cache as build_paged
from gpubench.records.claims import vllm_kv_waste
from gpubench.techniques.kv_cache.allocation import (
    Allocation,
    KVCacheWorkload,
    allocate,
    allocation_check,
    allocation_metrics,
    build_workload,
    layout_problems,
    predicted_bytes,
)

TECHNIQUE = Technique(
    name="kv_cache",
    shape="analytic",
    summary="KV memory of a real model layout: contiguous max-length reservation vs paged blocks, "
    "measured bytes checked against the calculator.",
    anchor="vLLM: prior systems use 20.4-38.2% of KV memory for token states; vLLM wastes under 4%",
    claims=[vllm_kv_waste("utilization")],
    benchmarks=[Bench(model, {"model": model, "max_len": 512}) for model in ("llama-3.1-8b", "gpt-oss-20b")],
    headline_figures=(Headline("utilization", "KV utilization", percent=True, exact=True),),
    gate_metric="bytes_reserved",
    gpu_specific="The bytes are the same on any device; the time (allocate and write the cache) "
    "is a device figure, and on a CPU it says little about a GPU allocator.",
    params=[
        Param(
            "model",
            str,
            "llama-2-7b",
            f"whose layout is allocated: a preset ({', '.join(model_config.preset_names())}) or a "
            "Hugging Face config.json path (or a checkpoint directory holding one)",
            value_check="gpubench.models.config:model_name_problem",
        ),
        Param("ignore_fields", str, "", stand_in.IGNORE_FIELDS_HELP, omit_default_from_id=True),
        Param("kv_dtype", str, "bf16", "KV storage format (scales included)", choices=list(kvmath.KV_FORMATS)),
        Param("layers", int, 2, "first N layers of the model (0 = all)", min=0),
        Param("requests", int, 4, "sequences in the cache (lengths: random)", min=1),
        Param("max_len", int, 1024, "longest sequence; what contiguous reserves", min=1),
        Param(
            "lengths",
            str,
            "random",
            "random: `requests` lengths in [1, max_len]; edges: one sequence per "
            "length at and around block edges (1, B-1, B, B+1, 2B-1, .., max_len) and sliding-window edges",
            choices=["random", "edges"],
        ),
        Param("block_size", int, 16, "tokens per paged block", min=1),
        Param("tp", int, 1, "tensor-parallel degree (one GPU's share is allocated)", min=1),
    ],
    plots=[
        Plot(
            "KV bytes (MiB): measured allocation beside the calculator's prediction",
            kind="bars",
            y=("bytes_reserved", "bytes_predicted"),
            scale=2**-20,
            ylabel="MiB",
        ),
        # A case's few sequences are a sliver of a GPU (DeepSeek-V3's four hold 0.1 GiB beside 39 GiB
        # of weights), so the breakdown fills the GPU with copies of them, as a server would.
        Plot(
            "One GPU serving copies of this case's sequences until 90% of its memory is used (GiB): the "
            "model's weights split over the fewest GPUs that leave 10% of each for KV (the case's tp, "
            "doubled until they do), KV holding tokens, KV reserved but empty, free",
            kind="stacked",
            y=("weights_per_gpu_gib", "kv_holding_tokens_gib", "kv_reserved_but_empty_gib", "free_gib"),
            ylabel="GiB per GPU",
        ),
    ],
)


validate = TECHNIQUE.validate(layout_problems)
build = TECHNIQUE.build(build_workload)


@TECHNIQUE.variant("contiguous", role="baseline")
def contiguous(w: KVCacheWorkload) -> Allocation:
    """max_len slots per sequence in every layer, reserved up front"""
    return allocate(build_contiguous, w)


@TECHNIQUE.variant("paged", role="optimized")
def paged(w: KVCacheWorkload) -> Allocation:
    """block_size-token blocks on demand, window-aware for sliding layers"""
    return allocate(build_paged, w)


reference = TECHNIQUE.reference(predicted_bytes)
check = TECHNIQUE.check(allocation_check)
metrics = TECHNIQUE.metrics(allocation_metrics)
