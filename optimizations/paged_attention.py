"""Paged decode attention read in place: one query token per sequence attends over a KV cache kept
in blocks scattered through a pool, reading each key and value through the sequence's block table
(no gather copy of the whole context) into an fp32 softmax. On CUDA that is the Triton kernel
(:mod:`gpubench.lib.kernels.paged_attention_triton`, run by :func:`gpubench.lib.paged_decode.paged_decode_attention`);
:func:`paged_decode_attention_torch` is the kernel's logic as vectorized PyTorch (the
paged_attention technique's CPU stand-in): the context in chunks of many blocks, each chunk's
partial softmax for every sequence and query head at once, the chunks combined by log-sum-exp as
the kernel's splits are. Shapes and conventions: :mod:`gpubench.lib.paged_decode`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from gpubench.lib.paged_decode import check_shapes

# Elements of K one chunk gathers (as many of V): 2^22, 16 MiB in fp32, bounds the working set
# whatever the batch and context, and a single chunk covers whole contexts at test and smoke sizes.
CHUNK_ELEMENTS = 1 << 22


class Partial(NamedTuple):
    """A softmax over part of the keys, per (batch, kv_head, group row): the running max, the sum
    of exp(score - max) and the unnormalized sum of exp(score - max) * v. No keys: (-inf, 0, 0)."""

    m: torch.Tensor
    l: torch.Tensor
    acc: torch.Tensor


def merge_partials(a: Partial, b: Partial) -> Partial:
    """The softmax over both parts' keys: each rescaled to the larger max (log-sum-exp), so the
    order and size of the parts do not matter. Both empty: stays (-inf, 0, 0), never NaN."""
    m = torch.maximum(a.m, b.m)
    shift = torch.where(m == -math.inf, torch.zeros_like(m), m)
    wa, wb = torch.exp(a.m - shift), torch.exp(b.m - shift)
    return Partial(m, a.l * wa + b.l * wb, a.acc * wa[..., None] + b.acc * wb[..., None])


def attend_chunk(
    qg: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, blocks: torch.Tensor, live: torch.Tensor
) -> Partial:
    """The partial softmax of the grouped queries ``qg`` (batch, kv_heads, group, d), already
    scaled, over the keys of ``blocks`` (batch, n) of the pool; ``live`` (batch, n * block_size)
    marks the keys inside each context."""
    batch, kv_heads, _, head_dim = qg.shape
    block_size = k_cache.shape[1]
    # Table entries past a sequence's end may hold anything: they are pointed at block 0 (read,
    # then masked out) instead of trusted.
    blocks = torch.where(live[:, ::block_size], blocks, torch.zeros_like(blocks))
    k = k_cache[blocks].reshape(batch, -1, kv_heads, head_dim).to(qg.dtype)
    v = v_cache[blocks].reshape(batch, -1, kv_heads, head_dim).to(qg.dtype)
    # Slots past a context may hold anything (an engine's pool is torch.empty): 0 * NaN would
    # leak into the sum below, so dead values are zeroed (dead scores are masked to -inf).
    v = v.masked_fill(~live[:, :, None, None], 0.0)
    s = torch.einsum("bkgd,btkd->bkgt", qg, k).masked_fill(~live[:, None, None, :], -math.inf)
    m = s.amax(dim=-1)
    # A sequence with no key in this chunk has m = -inf; subtracting 0 keeps exp() at 0, not NaN.
    p = torch.exp(s - torch.where(m == -math.inf, torch.zeros_like(m), m)[..., None])
    return Partial(m, p.sum(dim=-1), torch.einsum("bkgt,btkd->bkgd", p, v))


def paged_decode_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    *,
    chunk_tokens: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`gpubench.lib.paged_decode.paged_decode_attention` as vectorized PyTorch on any device:
    every sequence's keys in chunks of whole blocks (``chunk_tokens``, rounded down to blocks;
    default from :data:`CHUNK_ELEMENTS`), each chunk one gather, one masked grouped softmax for
    all query heads, merged by log-sum-exp; the result is written into ``out`` (allocated when
    not given). Walks the table's width, so no host sync."""
    batch, heads, head_dim, block_size, kv_heads = check_shapes(q, k_cache, v_cache, block_tables, context_lens)
    if scale is None:
        scale = head_dim**-0.5
    device = q.device
    lens = context_lens.to(device=device, dtype=torch.long)
    tables = block_tables.to(device=device, dtype=torch.long)
    per_block = max(1, batch * block_size * kv_heads * head_dim)
    chunk_blocks = max(1, chunk_tokens // block_size if chunk_tokens else CHUNK_ELEMENTS // per_block)

    # GQA without copying K/V: the `group` query heads sharing a kv head sit side by side.
    # fp32 accumulation (fp64 when the inputs are fp64, so a float64 engine stays float64 throughout).
    acc_dtype = torch.promote_types(q.dtype, torch.float32)
    qg = q.reshape(batch, kv_heads, heads // kv_heads, head_dim).to(acc_dtype) * scale
    state = Partial(
        torch.full(qg.shape[:3], -math.inf, device=device, dtype=acc_dtype),
        torch.zeros(qg.shape[:3], device=device, dtype=acc_dtype),
        torch.zeros_like(qg),
    )
    offsets = torch.arange(chunk_blocks * block_size, device=device)
    for first in range(0, tables.shape[1], chunk_blocks):
        blocks = tables[:, first : first + chunk_blocks]
        token = first * block_size + offsets[: blocks.shape[1] * block_size]  # logical positions
        live = token[None, :] < lens[:, None]  # (batch, tokens): keys inside each context
        state = merge_partials(state, attend_chunk(qg, k_cache, v_cache, blocks, live))

    # A context of 0 tokens leaves l = 0: zeros rather than 0 / 0.
    result = torch.where(
        state.l[..., None] > 0, state.acc / state.l.clamp_min(1e-30)[..., None], torch.zeros_like(state.acc)
    )
    out = torch.empty_like(q) if out is None else out
    return out.copy_(result.reshape(batch, heads, head_dim))
