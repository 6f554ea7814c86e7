"""Decode attention over a paged KV cache the common way: gather every sequence's blocks into a
contiguous tensor through its block table (padded to the longest context, the padding masked),
then run ordinary attention on the copy. Every KV byte is read from the pool, written into the
copy and read again, and the scores are materialized before the softmax.
"""

from __future__ import annotations

import torch


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """softmax(q k^T * scale) v for one query token per sequence, K and V first gathered out of the
    paged cache. q (batch, heads, head_dim); k_cache, v_cache (num_blocks, block_size, kv_heads,
    head_dim), heads a multiple of kv_heads; block_tables (batch, max_blocks) int32; context_lens
    (batch,) int32. Slots past a context are masked out of the scores but still multiplied (by 0)
    with V, so they must hold finite values, as code written for zero-padded caches assumes."""
    batch, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    if heads % kv_heads != 0:
        raise ValueError(f"heads ({heads}) must be divisible by kv_heads ({kv_heads})")
    if scale is None:
        scale = head_dim**-0.5
    group = heads // kv_heads
    max_blocks = block_tables.shape[1]  # the table is as wide as the longest sequence needs
    lens = context_lens.to(device=q.device, dtype=torch.long)
    position = torch.arange(max_blocks * block_size, device=q.device)
    live = position[None, :] < lens[:, None]  # (batch, padded context): keys inside each context

    # The gather: every sequence's blocks copied out of the pool into one contiguous tensor,
    # padded to the longest sequence. Table entries past a sequence's last block may hold
    # anything, so they are pointed at block 0 and masked out below.
    blocks = torch.where(live[:, ::block_size], block_tables.to(device=q.device, dtype=torch.long), 0)
    k = k_cache.index_select(0, blocks.flatten()).reshape(batch, max_blocks * block_size, kv_heads, head_dim)
    v = v_cache.index_select(0, blocks.flatten()).reshape(batch, max_blocks * block_size, kv_heads, head_dim)

    # Ordinary attention on the copy: materialized scores, padding masked, softmax in float32.
    qg = q.reshape(batch, kv_heads, group, head_dim)
    scores = torch.einsum("bkgd,btkd->bkgt", qg, k) * scale
    scores = scores.masked_fill(~live[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    # A sequence with no context has only -inf scores (NaN probabilities): it gets zeros.
    probs = probs.nan_to_num(0.0)
    return torch.einsum("bkgt,btkd->bkgd", probs, v).reshape(batch, heads, head_dim)
