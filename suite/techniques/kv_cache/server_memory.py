"""One GPU of a server that holds a whole model and fills its memory with KV: how many GPUs the
weights need, and how that GPU's memory splits into weights, KV holding tokens, KV reserved but
empty, and free, for an allocator's layout of a given set of sequences (the kv_cache pair's
memory breakdown).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from gpubench.errors import BadInput
from gpubench.lib import kvmath
from gpubench.models import config as model_config
from gpubench.models import params as model_params
from gpubench.models import stand_in

GIB = 2**30
REFERENCE_GPU_BYTES = 80 * GIB  # for the memory breakdown when the run is not on a GPU
UTILIZATION = 0.9  # of a GPU's memory the server fills (vLLM's default gpu_memory_utilization, the calculator's)
KV_ROOM = 0.1  # the least share of each GPU the weights must leave for KV


def gpus_for_weights(cfg: model_config.ModelConfig, kv_dtype: str, tp: int, gpu_bytes: int) -> int:
    """The case's tp, doubled until each GPU's share of the weights leaves :data:`KV_ROOM` of it
    under :data:`UTILIZATION` and the KV heads split evenly (DeepSeek-V3's 627 GiB on 80 GiB
    GPUs: 16)."""
    weights = model_params.weight_bytes(cfg).bytes
    n = tp
    while n < 4096:
        if weights / n <= (UTILIZATION - KV_ROOM) * gpu_bytes:
            try:
                kvmath.layout_for(cfg, kv_dtype, n)
                return n
            except BadInput:  # KV heads that n GPUs cannot share: try 2n
                pass
        n *= 2
    return n


def serving_memory(
    device: torch.device, p: Mapping[str, Any], lengths: Sequence[int], allocator: str
) -> dict[str, Any]:
    """One GPU of a server that holds the whole model ``p["model"]`` (all layers) over
    :func:`gpus_for_weights` GPUs and fills :data:`UTILIZATION` of its memory with copies of the
    sequences of ``lengths``, laid out by ``allocator`` (``p``: kv_dtype, tp, block_size, max_len):
    weights, KV holding tokens, KV reserved but empty, free, in GiB."""
    cfg = model_config.load_model(p["model"], stand_in.ignore_list(p.get("ignore_fields", "")))
    on_gpu = device.type == "cuda"
    gpu = torch.cuda.get_device_properties(device).total_memory if on_gpu else REFERENCE_GPU_BYTES
    gpus = gpus_for_weights(cfg, p["kv_dtype"], p["tp"], gpu)
    layout = kvmath.layout_for(cfg, p["kv_dtype"], gpus)
    weights = -(-model_params.weight_bytes(cfg).bytes // gpus)
    fixed = kvmath.cache_bytes(layout, [], allocator, p["block_size"], p["max_len"])  # per-tensor scales
    one_copy = kvmath.cache_bytes(layout, list(lengths), allocator, p["block_size"], p["max_len"]) - fixed
    copies = max(0, (int(gpu * UTILIZATION) - weights - fixed) // one_copy) if one_copy else 0
    kv = copies * one_copy + (fixed if copies else 0)
    holding = copies * kvmath.token_bytes(layout, list(lengths))
    return {
        "gpus": gpus,
        "weights_per_gpu_gib": weights / GIB,
        "kv_holding_tokens_gib": holding / GIB,
        "kv_reserved_but_empty_gib": (kv - holding) / GIB,
        "free_gib": max(0, gpu - weights - kv) / GIB,
        "sequences_per_gpu": copies * len(lengths),
        "gpu_memory_gib": gpu / GIB,
        "gpu_memory_source": torch.cuda.get_device_name(device) if on_gpu else "reference 80 GiB GPU (run on CPU)",
    }
