"""Paged decode attention as one Triton kernel: each (sequence, query head) is one program.

A program keeps its query row in registers and walks the sequence's block table, loading each
step's keys and values straight from the pool and folding them into an fp32 online softmax, so
every KV byte is read once and nothing the size of the context is written. GQA by index (query
head h reads kv head h // (heads // kv_heads)), any strides, any head_dim (padded to a power of
two and masked). Runs under Triton's interpreter (``TRITON_INTERPRET=1`` before import) on CPU
tensors, for tests.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from gpubench.paged_decode import check_shapes
from gpubench.triton_support import interpreted

INTERPRETED = interpreted()  # fixed when the kernel below is decorated

# Keys per loop step (a power of two): one (tokens x head_dim) tile of K and of V in registers;
# 64 x 128 fp32 is 64 registers per thread at 4 warps.
TOKENS_PER_STEP = 64


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, out_ptr,
    scale_log2e,
    stride_qb, stride_qh, stride_qd,
    stride_kn, stride_ks, stride_kh, stride_kd,
    stride_vn, stride_vs, stride_vh, stride_vd,
    stride_tb, stride_tj,
    stride_ob, stride_oh, stride_od,
    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr, TOKENS: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    context_len = tl.load(lens_ptr + seq)

    dims = tl.arange(0, DIM_PAD)
    dim_ok = dims < HEAD_DIM
    # The query row stays in registers for the whole walk; the softmax scale and log2(e) are
    # folded into it once so each step's scores go straight into exp2.
    q = tl.load(q_ptr + seq * stride_qb + head * stride_qh + dims * stride_qd, mask=dim_ok, other=0.0)
    q = q.to(tl.float32) * scale_log2e

    m = -float("inf")  # running max of the scores (log2 units)
    l = 0.0  # running softmax denominator
    acc = tl.zeros((DIM_PAD,), dtype=tl.float32)  # running sum of p * v

    offs = tl.arange(0, TOKENS)
    for start in range(0, context_len, TOKENS):
        # Where this step's keys live: logical position -> (block table entry, slot in block).
        # Positions past the context are masked, so a table entry past the sequence's last
        # block is never read (it may hold anything).
        token = start + offs
        live = token < context_len
        block = tl.load(tables_ptr + seq * stride_tb + (token // BLOCK_SIZE) * stride_tj, mask=live, other=0)
        row = block.to(tl.int64) * stride_kn + (token % BLOCK_SIZE) * stride_ks  # int64: big pools
        both = live[:, None] & dim_ok[None, :]

        # Keys straight from the pool (no gather copy), scores in fp32.
        k = tl.load(k_ptr + row[:, None] + kv_head * stride_kh + dims[None, :] * stride_kd, mask=both, other=0.0)
        s = tl.sum(k.to(tl.float32) * q[None, :], axis=1)
        s = tl.where(live, s, float("-inf"))

        # Online softmax: the new maximum rescales what was accumulated so far. Each step has
        # at least one live key, so m_new is finite and exp2(-inf - m_new) is a clean 0.
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new)
        l = l * alpha + tl.sum(p, axis=0)

        vrow = block.to(tl.int64) * stride_vn + (token % BLOCK_SIZE) * stride_vs
        v = tl.load(v_ptr + vrow[:, None] + kv_head * stride_vh + dims[None, :] * stride_vd, mask=both, other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
        m = m_new

    # A context of 0 tokens leaves l = 0: write zeros rather than 0 / 0.
    out = tl.where(l > 0, acc / tl.maximum(l, 1e-30), 0.0)
    tl.store(out_ptr + seq * stride_ob + head * stride_oh + dims * stride_od,
             out.to(out_ptr.dtype.element_ty), mask=dim_ok)


def paged_decode_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                  block_tables: torch.Tensor, context_lens: torch.Tensor,
                                  scale: float | None = None, *, tokens_per_step: int = TOKENS_PER_STEP,
                                  out: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`gpubench.paged_decode.paged_decode_attention` by the Triton kernel.
    ``tokens_per_step``: keys loaded per loop step, a power of two. ``out``: written in place
    (shaped, typed and placed like q), else allocated."""
    if not q.is_cuda and not INTERPRETED:
        raise RuntimeError("the Triton paged-decode kernel needs CUDA tensors, or TRITON_INTERPRET=1 set "
                           "before gpubench.optimizations.paged_attention_triton is imported")
    if tokens_per_step < 1 or tokens_per_step & (tokens_per_step - 1):
        raise ValueError(f"tokens_per_step must be a power of two (got {tokens_per_step})")
    batch, heads, head_dim, block_size, kv_heads = check_shapes(q, k_cache, v_cache, block_tables, context_lens)
    if scale is None:
        scale = head_dim ** -0.5
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(f"out must be shaped, typed and placed like q ({tuple(q.shape)}, {q.dtype}, {q.device})")
    if batch == 0 or heads == 0:
        return out
    tables = block_tables.to(device=q.device, dtype=torch.int32)
    lens = context_lens.to(device=q.device, dtype=torch.int32)
    _paged_decode_kernel[(batch, heads)](
        q, k_cache, v_cache, tables, lens, out,
        scale * math.log2(math.e),
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *tables.stride(), *out.stride(),
        GROUP=heads // kv_heads, BLOCK_SIZE=block_size, HEAD_DIM=head_dim,
        DIM_PAD=triton.next_power_of_2(head_dim), TOKENS=tokens_per_step,
        num_warps=4,
    )
    return out
