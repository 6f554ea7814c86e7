"""Paged attention (decode): attend over a KV cache kept in fixed-size blocks scattered through a
pool, reading every key and value through the sequence's block table, with no gather copy.

A paged cache (see :mod:`gpubench.optimizations.kv_cache`) keeps each sequence's tokens in
``block_size``-token physical blocks taken on demand from a shared pool; ``block_tables[b, j]``
names the physical block that holds tokens ``j * block_size ..`` of sequence ``b``. The common
way to attend over it copies each sequence's blocks into a contiguous tensor first, then runs
ordinary attention: every KV byte is read, written again and read a second time. Decode (one
query token per sequence) does two multiply-adds per KV element, so it is bound by memory
traffic, and that copy roughly triples it. Here the kernel follows the block table itself: one
program per (sequence, query head) walks the sequence's blocks, loads each block's keys and
values straight from the pool, and folds them into an fp32 *online softmax* (running maximum,
running denominator, rescaled accumulator), so every KV byte is read once and nothing the size of
the context is ever written.

What paging buys is memory: vLLM (Kwon et al., 2023) reports under 4% of KV memory wasted,
against 60-80% (20.4-38.2% of it holding tokens) in systems that reserve contiguous max-length
KV per request, and 2-4x the serving throughput at the same latency from the bigger batches that
fit. This kernel is what makes the paged layout cost nothing at attention time.

On CUDA, :func:`paged_decode_attention` runs the Triton kernel; elsewhere it runs the same
block-by-block online softmax in PyTorch. :func:`paged_decode_attention_triton` always runs the
kernel (on CPU tensors that needs ``TRITON_INTERPRET=1`` set before this module is imported).
"""
from __future__ import annotations

import math
import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the PyTorch path still works; the kernel says why it cannot run
    triton = None

# Keys per step of the PyTorch path's loop: a few blocks at a time keeps the Python loop short
# while the working set stays a small slice of the context, never the whole gathered cache.
TORCH_TOKENS_PER_STEP = 256
# Keys per step of the Triton kernel (a power of two): one (tokens x head_dim) tile of K and
# of V in registers; 64 x 128 fp32 is 64 registers per thread at 4 warps.
TRITON_TOKENS_PER_STEP = 64
# Decided when the kernel below is decorated, so it is read once, at import.
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _check_shapes(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  block_tables: torch.Tensor, context_lens: torch.Tensor) -> tuple[int, int, int, int, int]:
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"expected q (batch, heads, head_dim) and k_cache == v_cache shaped (num_blocks, "
                         f"block_size, kv_heads, head_dim); got q {tuple(q.shape)}, k_cache "
                         f"{tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}")
    batch, heads, head_dim = q.shape
    _, block_size, kv_heads, kv_dim = k_cache.shape
    if kv_dim != head_dim:
        raise ValueError(f"q head_dim ({head_dim}) != cache head_dim ({kv_dim})")
    if heads % kv_heads != 0:
        raise ValueError(f"heads ({heads}) must be divisible by kv_heads ({kv_heads})")
    if block_tables.dim() != 2 or block_tables.shape[0] != batch or tuple(context_lens.shape) != (batch,):
        raise ValueError(f"expected block_tables (batch, max_blocks) and context_lens (batch,) with batch "
                         f"{batch}; got {tuple(block_tables.shape)} and {tuple(context_lens.shape)}")
    return batch, heads, head_dim, block_size, kv_heads


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           scale: float | None = None, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v for one query token per sequence, keys and values read from a paged
    cache through the block table.

    q: (batch, heads, head_dim); k_cache, v_cache: (num_blocks, block_size, kv_heads, head_dim);
    block_tables: (batch, max_blocks_per_seq) int32 physical block ids (entries past a sequence's
    last block are never read); context_lens: (batch,) int32, tokens each sequence attends to
    (a sequence with 0 gets zeros). heads is a multiple of kv_heads (query head h uses kv head
    h // (heads // kv_heads)). Returns (batch, heads, head_dim) in q's dtype, written into ``out``
    when given (the suite passes a NaN-filled one to its checked call).
    """
    if q.is_cuda and triton is not None:
        return paged_decode_attention_triton(q, k_cache, v_cache, block_tables, context_lens, scale, out=out)
    result = paged_decode_attention_torch(q, k_cache, v_cache, block_tables, context_lens, scale)
    return result if out is None else out.copy_(result)


def paged_decode_attention_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                 block_tables: torch.Tensor, context_lens: torch.Tensor,
                                 scale: float | None = None, *,
                                 tokens_per_step: int = TORCH_TOKENS_PER_STEP) -> torch.Tensor:
    """The kernel's algorithm in PyTorch: every sequence advances through its blocks together, a
    few blocks per step, each step reading just those blocks from the pool (one small indexed
    load per step, never the whole context) and folding them into an fp32 online softmax."""
    batch, heads, head_dim, block_size, kv_heads = _check_shapes(q, k_cache, v_cache, block_tables, context_lens)
    if scale is None:
        scale = head_dim ** -0.5
    group = heads // kv_heads
    device = q.device
    lens = context_lens.to(device=device, dtype=torch.long)
    tables = block_tables.to(device=device, dtype=torch.long)
    longest = int(lens.max()) if batch else 0  # the loop bound (a host sync; this path is not CUDA's)
    blocks_per_step = max(1, tokens_per_step // block_size)

    # GQA without copying K/V: the `group` query heads sharing a kv head sit side by side.
    # fp32 accumulation (fp64 when the inputs are fp64, so a float64 engine stays float64 throughout).
    acc_dtype = torch.promote_types(q.dtype, torch.float32)
    qg = q.reshape(batch, kv_heads, group, head_dim).to(acc_dtype) * scale
    m = torch.full((batch, kv_heads, group), -math.inf, device=device, dtype=acc_dtype)  # running max
    l = torch.zeros(batch, kv_heads, group, device=device, dtype=acc_dtype)  # running softmax denominator
    acc = torch.zeros(batch, kv_heads, group, head_dim, device=device, dtype=acc_dtype)  # running sum of p * v

    slot = torch.arange(blocks_per_step * block_size, device=device)
    for first in range(0, -(-longest // block_size), blocks_per_step):
        last = min(first + blocks_per_step, tables.shape[1])
        n_tokens = (last - first) * block_size
        token = first * block_size + slot[:n_tokens]  # logical positions of this step's keys
        live = token[None, :] < lens[:, None]  # (batch, tokens): keys inside each context
        # Physical blocks of this step; entries past a sequence's end may hold anything, so they
        # are pointed at block 0 (read, then masked out) instead of trusted.
        blocks = tables[:, first:last]
        blocks = torch.where(live[:, ::block_size], blocks, torch.zeros_like(blocks))
        k = k_cache[blocks].reshape(batch, n_tokens, kv_heads, head_dim).to(acc_dtype)
        v = v_cache[blocks].reshape(batch, n_tokens, kv_heads, head_dim).to(acc_dtype)
        # Slots past a context may hold anything (an engine's pool is torch.empty): 0 * NaN would
        # leak into the sum below, so dead values are zeroed (dead scores are masked to -inf).
        v = v.masked_fill(~live[:, :, None, None], 0.0)

        s = torch.einsum("bkgd,btkd->bkgt", qg, k)
        s = s.masked_fill(~live[:, None, None, :], -math.inf)
        m_new = torch.maximum(m, s.amax(dim=-1))
        # A sequence already past its end has m_new = -inf; subtracting 0 keeps exp() at 0, not NaN.
        m_safe = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
        alpha = torch.exp(m - m_safe)  # rescales what was accumulated under the old maximum
        p = torch.exp(s - m_safe[..., None])
        l = l * alpha + p.sum(dim=-1)
        acc = acc * alpha[..., None] + torch.einsum("bkgt,btkd->bkgd", p, v)
        m = m_new

    out = torch.where(l[..., None] > 0, acc / l.clamp_min(1e-30)[..., None], torch.zeros_like(acc))
    return out.reshape(batch, heads, head_dim).to(q.dtype)


if triton is not None:

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
        # One program per (sequence, query head); query head h reads kv head h // GROUP.
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
                                  scale: float | None = None, *,
                                  tokens_per_step: int = TRITON_TOKENS_PER_STEP,
                                  out: torch.Tensor | None = None) -> torch.Tensor:
    """The Triton kernel, whatever the device (same contract as :func:`paged_decode_attention`).
    ``tokens_per_step``: keys loaded per loop step, a power of two. ``out``: written in place
    when given (shaped and typed like q), else allocated."""
    if triton is None:
        raise RuntimeError("the paged decode kernel needs triton, which is not installed")
    if not q.is_cuda and not _INTERPRETED:
        raise RuntimeError("the Triton kernel runs on CPU tensors only in Triton's interpreter: set "
                           "TRITON_INTERPRET=1 before gpubench.optimizations.paged_attention is imported")
    if tokens_per_step < 1 or tokens_per_step & (tokens_per_step - 1):
        raise ValueError(f"tokens_per_step must be a power of two (got {tokens_per_step})")
    batch, heads, head_dim, block_size, kv_heads = _check_shapes(q, k_cache, v_cache, block_tables, context_lens)
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
