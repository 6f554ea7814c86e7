"""Paged decode attention read in place: one query token per sequence attends over a KV cache kept
in blocks scattered through a pool, reading each key and value through the sequence's block table
(no gather copy) into an fp32 online softmax. On CUDA that is the Triton kernel
(:mod:`.paged_attention_triton`, run by :func:`gpubench.paged_decode.paged_decode_attention`);
:func:`paged_decode_attention_torch` is the kernel's walk over blocks as PyTorch steps (the
paged_attention technique's CPU stand-in). Shapes and conventions: :mod:`gpubench.paged_decode`.
"""
from __future__ import annotations

import math

import torch

from gpubench.paged_decode import check_shapes

# Keys per step of the PyTorch loop: a few blocks at a time keeps the Python loop short while the
# working set stays a small slice of the context, never the whole gathered cache.
TORCH_TOKENS_PER_STEP = 256


def paged_decode_attention_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                 block_tables: torch.Tensor, context_lens: torch.Tensor,
                                 scale: float | None = None, *, tokens_per_step: int = TORCH_TOKENS_PER_STEP,
                                 out: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`gpubench.paged_decode.paged_decode_attention` as PyTorch steps on any device: every sequence advances
    through its blocks together, each step loading just those blocks from the pool; the result is
    written into ``out`` (allocated when not given)."""
    batch, heads, head_dim, block_size, kv_heads = check_shapes(q, k_cache, v_cache, block_tables, context_lens)
    if scale is None:
        scale = head_dim ** -0.5
    group = heads // kv_heads
    device = q.device
    lens = context_lens.to(device=device, dtype=torch.long)
    tables = block_tables.to(device=device, dtype=torch.long)
    longest = int(lens.max()) if batch else 0  # the loop bound (a host sync per call)
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
        # Table entries past a sequence's end may hold anything: they are pointed at block 0
        # (read, then masked out) instead of trusted.
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

    result = torch.where(l[..., None] > 0, acc / l.clamp_min(1e-30)[..., None], torch.zeros_like(acc))
    out = torch.empty_like(q) if out is None else out
    return out.copy_(result.reshape(batch, heads, head_dim))
