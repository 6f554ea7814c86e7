"""paged_attention's variants, each one decode step on a :class:`PagedDecodeWorkload`: the gather
baseline, the library's Triton kernel (loaded lazily) and the PyTorch chunk loop standing in for
it, SDPA over a contiguous cache, and FlashInfer's paged decode where it is installed.
"""

from __future__ import annotations

from typing import Any

import torch

from gpubench.baselines.paged_attention import paged_decode_attention as gather_then_attend
from gpubench.lib.optional import optional_import
from gpubench.lib.paged_decode import KERNEL, grouped_decode_sdpa
from gpubench.lib.triton_support import kernel_module, kernel_problem
from gpubench.optimizations.paged_attention import paged_decode_attention_torch
from gpubench.techniques.paged_attention.workload import PagedDecodeWorkload


def gather(w: PagedDecodeWorkload) -> torch.Tensor:
    """gather each sequence's blocks into a contiguous copy, then masked eager attention"""
    return gather_then_attend(*w.args())


def triton_problem(device: torch.device) -> str | None:
    """On CUDA, or in Triton's interpreter on a CPU (checked there, never timed)."""
    return kernel_problem(KERNEL[0], device, interpreter_ok=True)


def triton_kernel(w: PagedDecodeWorkload) -> torch.Tensor:
    """the Triton kernels: one program per (sequence, KV head, context split) loads each K/V tile once for its
    whole query-head group (tensor-core dots), a second kernel combines the splits"""
    return getattr(kernel_module(KERNEL[0]), KERNEL[1])(*w.args(), out=w.triton_out)


def torch_blocks(w: PagedDecodeWorkload) -> torch.Tensor:
    """the kernel's logic as vectorized PyTorch: chunks of many blocks, one grouped softmax each, merged by
    log-sum-exp (stands in where the kernel cannot run)"""
    return paged_decode_attention_torch(*w.args(), out=w.torch_out)


def sdpa_contiguous(w: PagedDecodeWorkload) -> torch.Tensor:
    """torch SDPA over the same keys in a contiguous (batch, kv_heads, longest, d) cache (copied outside the timed
    call), the query-head group as rows, padding masked: no paging at all, an upper bound for a paged kernel when
    contexts are equal (with mixed lengths it also reads the padding)"""
    return grouped_decode_sdpa(w.q, w.contiguous_k, w.contiguous_v, w.contiguous_mask)


def flashinfer_unavailable(device: torch.device, params: dict[str, Any] | None = None) -> str | None:
    if torch.device(device).type != "cuda":  # GPU-only below: FlashInfer is CUDA-only
        return "FlashInfer's kernels need CUDA"
    if params is not None and params.get("dtype") == "float32":
        return "FlashInfer's paged decode takes fp16 / bf16 caches, not float32"
    imported = optional_import("flashinfer")
    return imported if isinstance(imported, str) else None


def flashinfer_wrapper(w: PagedDecodeWorkload) -> Any:
    """FlashInfer's BatchDecodeWithPagedKVCacheWrapper planned for the workload's tables (plan()
    is the host-side scheduling a server does once per step, outside the timed call)."""
    flashinfer = optional_import("flashinfer")
    _, heads, head_dim = w.q.shape
    _, block_size, kv_heads, _ = w.k_cache.shape
    counts = [-(-n // block_size) for n in w.lens]
    tables = w.block_tables.cpu()
    indices = torch.cat([tables[b, :c] for b, c in enumerate(counts)]).to(device=w.device, dtype=torch.int32)
    indptr = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32, device=w.device)
    last = torch.tensor([n - (c - 1) * block_size for n, c in zip(w.lens, counts)], dtype=torch.int32, device=w.device)
    workspace = torch.zeros(128 << 20, dtype=torch.uint8, device=w.device)
    # Tensor-core decode for groups above 4 query heads per KV head, as vLLM chooses it.
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=heads // kv_heads > 4)
    wrapper.plan(
        indptr,
        indices,
        last,
        heads,
        kv_heads,
        head_dim,
        block_size,
        q_data_type=w.q.dtype,
        kv_data_type=w.k_cache.dtype,
        sm_scale=head_dim**-0.5,
    )
    return wrapper


def flashinfer_decode(w: PagedDecodeWorkload) -> torch.Tensor:
    """FlashInfer's paged decode (BatchDecodeWithPagedKVCacheWrapper, NHD pages read through the same block
    table; plan() on the first, checked call, never timed)"""
    if w.flashinfer_decode is None:
        w.flashinfer_decode = flashinfer_wrapper(w)
    return w.flashinfer_decode.run(w.q, (w.k_cache, w.v_cache))
