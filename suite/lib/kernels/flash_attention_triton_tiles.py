"""The flash-attention kernels' tiles: which (BLOCK_M, BLOCK_N, warps, stages) the forward's
autotuners try, on which path (pointers, or tensor descriptors / TMA on sm_90 and later) and head
dim, how a descriptor's box follows the tile being tried, and the shared-memory bound that prunes a
descriptor config before it is tried. The kernels: :mod:`.flash_attention_triton` (forward) and
:mod:`.flash_attention_triton_bwd` (backward, whose own tiles live beside its kernels).
"""

from __future__ import annotations

import torch
import triton

try:  # host-side tensor descriptors (TMA on sm_90+), as Triton 3.6's own Hopper attention tutorial uses
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # a Triton without them: the pointer path only
    TensorDescriptor = None


def pointer_configs(shapes):
    """Autotuning configs of the pointer path from (BLOCK_M, BLOCK_N, warps, stages) tuples."""
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=stages)
        for bm, bn, warps, stages in shapes
    ]


# The pointer path's autotuning candidates (GPUs before sm_90; on sm_90 and later, varlen, fp32
# and layouts TMA cannot address), head_dim (of q/k and of v) up to 128.
# 128 x 64 with 4-8 warps is where 16-bit attention usually lands; the smaller tiles are there
# for short sequences (more programs to fill the SMs) and for fp32 at head_dim 128, whose tiles
# are twice the bytes and may not fit shared memory at the bigger sizes (the autotuner skips
# configs that fail to fit).
GPU_CONFIGS = pointer_configs(
    (
        (128, 128, 8, 3),
        (128, 64, 8, 3),
        (128, 64, 4, 3),
        (128, 32, 4, 4),
        (64, 64, 4, 4),
        (64, 32, 4, 3),
        (64, 32, 4, 2),
    )
)
# Head dims above 128 (Gemma's 256, MLA's 192 / 128, padded to 256 / 128 tiles): the query
# tile, the K/V tiles and the fp32 BLOCK_M x BLOCK_DV accumulator are up to twice as wide, so at
# most 2 stages and never the 128-key tiles. Shared memory per config, from compiling this kernel
# for sm_90 (H100 / H200: 227 KiB per block; A100: 163 KiB) with Triton 3.9 on a machine without
# a GPU, head_dim 256 / 256 (192 / 128 in brackets), bf16: 128 x 64 / 8 warps 96 KiB (96),
# 64 x 64 64 (64), 64 x 32 48 (48), 32 x 32 34 (32); fp32 (twice the bytes): 288 (256), 208 (176),
# 136 (120), 100 (84), so fp32 always has a config that fits, 64 x 32 or smaller on an A100.
# 128 x 64 with 8 warps is FlashAttention-2's own head_dim-256 tile. Configs that do not fit are
# skipped by the autotuner. (The same compile of head_dim 128, bf16, 128 x 64 / 8 warps / 3
# stages gives 48 KiB and 255 registers, as the kernel before issue 20's changes did.)
GPU_CONFIGS_LARGE_HEAD = pointer_configs(
    ((128, 64, 8, 2), (64, 64, 8, 2), (64, 64, 4, 2), (64, 32, 4, 2), (32, 32, 4, 2))
)


# Which rows and channels a descriptor's box spans, by kernel argument: the forward's and the
# backward's kernels share the names (q, k, v; out in the forward, do in the backward).
DESCRIPTOR_BOXES = {
    "q_ptr": ("BLOCK_M", "BLOCK_D"),
    "k_ptr": ("BLOCK_N", "BLOCK_D"),
    "v_ptr": ("BLOCK_N", "BLOCK_DV"),
    "out_ptr": ("BLOCK_M", "BLOCK_DV"),
    "do_ptr": ("BLOCK_M", "BLOCK_DV"),
}


def set_descriptor_boxes(nargs):
    """Autotuner pre-hook of the descriptor configs: a descriptor's box is its config's tile (the
    4-D (batch, head, rows, channels) tensors read one (1, 1, rows, channels) box at a time)."""
    for name, (rows, cols) in DESCRIPTOR_BOXES.items():
        if isinstance(nargs.get(name), TensorDescriptor):
            nargs[name].block_shape = [1, 1, nargs[rows], nargs[cols]]


def descriptor_configs(shapes):
    """Autotuning configs of the descriptor path: as :func:`pointer_configs`, each setting the
    descriptors' boxes to its tile before it runs."""
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=stages, pre_hook=set_descriptor_boxes)
        for bm, bn, warps, stages in shapes
    ]


# The descriptor (TMA) path's candidates, sm_90 and later, 16-bit only. The copies are asynchronous
# and cost no registers, so deeper pipelines (3-4 stages of K/V tiles in shared memory, 227 KiB
# per block on an H100 / H200) and bigger query tiles pay here: 128 x 128 over 8 warps (two
# warpgroups of 64 rows, each a wgmma of 64 x 128) and 256 x 64 over 8 warps (two warpgroups of
# 128 rows), as Triton's Hopper tutorial and FlashAttention-3 favour; 128 x 64 over 4 warps for
# shorter sequences. As the tutorial's Hopper filter: 8 warps only on tiles of at least 128 x 128
# elements. Shared memory is the query tile plus num_stages K/V tiles (descriptor_shared_bytes,
# which the sm_90 compile test checks against the compiler's figure): 128 x 128 at head_dim 128
# takes 161 KiB at 2 stages and 225 KiB at 3, so 4 would not fit; configs that do not fit the
# device are pruned before tuning (prune_forward).
GPU_CONFIGS_TMA = descriptor_configs(
    (
        (128, 128, 8, 2),
        (128, 128, 8, 3),
        (256, 64, 8, 2),
        (256, 64, 8, 3),
        (128, 64, 4, 3),
        (128, 64, 4, 4),
        (128, 64, 4, 5),
        (64, 64, 4, 4),
    )
)
GPU_CONFIGS_TMA_LARGE_HEAD = descriptor_configs(
    ((128, 64, 8, 2), (128, 64, 8, 3), (64, 64, 4, 2), (64, 64, 4, 3), (64, 32, 4, 2))
)
# Lengths enter the key as power-of-two buckets (seq_*_bucket, read by nothing else), so a new
# length re-tunes only when it crosses a power of two, and the tunings persist on disk per GPU model
# and Triton version (gpubench.measure.autotune); so does a local mask's size (local_bucket). USE_TMA selects the path (each has its own tuner and
# candidates; in the key too, so a tuning never crosses paths). Triton adds the dtypes of the
# tensor arguments; a descriptor's is not among them, so on the descriptor path fp16 and bf16 may
# share a tuning (the same tiles suit both: same bytes, same tensor-core rate).
AUTOTUNE_KEY = [
    "seq_q_bucket",
    "seq_k_bucket",
    "HEAD_DIM",
    "HEAD_DIM_V",
    "CAUSAL",
    "VARLEN",
    "USE_TMA",
    # a local mask's kind and its window or chunk as a bucket: a 128-key window is a different
    # loop from the causal triangle at the same length
    "LOCAL",
    "local_bucket",
]


def descriptor_shared_bytes(
    block_m: int, block_n: int, block_d: int, block_dv: int, stages: int, elem_bytes: int = 2
) -> int:
    """Shared memory of one descriptor-path program, an upper bound: the query tile and
    ``stages`` buffers of a K and a V tile, plus 1 KiB for the pipeline's barriers (what compiling
    for sm_90 with Triton 3.9 gives, within those 1,024 bytes)."""
    return elem_bytes * (block_m * block_d + stages * block_n * (block_d + block_dv)) + 1024


def shared_memory_limit(t: torch.Tensor) -> int | None:
    """Shared memory a block may opt into on t's GPU (232,448 bytes on an H100 / H200); None off CUDA."""
    # (the ignore: CUDA builds of torch have the field; the stub the CPU wheel ships does not)
    return torch.cuda.get_device_properties(t.device).shared_memory_per_block_optin if t.is_cuda else None  # type: ignore[attr-defined]


def descriptor_configs_fit(t: torch.Tensor, block_d: int, block_dv: int) -> bool:
    """Whether any descriptor candidate of these padded head dims fits t's GPU's shared memory.
    The candidates are sized for the datacenter parts' 227 KiB (H100, H200, B200); a GPU of
    compute capability 9+ with less (consumer Blackwell, sm_120: 99 KiB) would be left with none
    (the autotuner then raises), so it takes the pointer path instead."""
    limit = shared_memory_limit(t)
    if limit is None:
        return True
    wide = max(block_d, block_dv) > 128
    configs = GPU_CONFIGS_TMA_LARGE_HEAD if wide else GPU_CONFIGS_TMA
    return any(
        descriptor_shared_bytes(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], block_d, block_dv, c.num_stages) <= limit
        for c in configs
    )


def prune_forward(configs, named_args, **kwargs):
    """The candidates for this call's padded head dims (both lists of a path are in its
    autotuner); on the descriptor path, only those whose shared memory fits the device."""
    large = max(kwargs["BLOCK_D"], kwargs["BLOCK_DV"]) > 128
    wide = GPU_CONFIGS_TMA_LARGE_HEAD if kwargs["USE_TMA"] else GPU_CONFIGS_LARGE_HEAD
    kept = [c for c in configs if any(c is w for w in wide) == large]
    limit = shared_memory_limit(named_args["lse_ptr"])  # a tensor on either path
    if kwargs["USE_TMA"] and limit is not None:
        kept = [
            c
            for c in kept
            if descriptor_shared_bytes(
                c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], kwargs["BLOCK_D"], kwargs["BLOCK_DV"], c.num_stages
            )
            <= limit
        ]
    return kept
