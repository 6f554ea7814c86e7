"""Decode attention over a paged KV cache, as the serving engine runs it and the paged_attention
technique checks it: the shapes every paged decode accepts, where each sequence's keys lie in the
pool, and :func:`paged_decode_attention`: the Triton kernel
(:mod:`gpubench.lib.kernels.paged_attention_triton`, loaded lazily by
:func:`gpubench.lib.triton_support.dispatch`) on CUDA and, elsewhere,
:func:`paged_decode_attention_gathered`: every sequence's keys gathered through the table in one
index_select, then one fused SDPA call (GQA without repeating K/V), no Python loop.

A serving engine calls the same decode every layer with the same tables: it builds its index
and mask once per step and calls :func:`gathered_decode` in each layer (whole blocks at a time
where its pool holds only finite values).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpubench.lib.triton_support import dispatch

# The library's paged-decode Triton kernel (the paged_attention optimization times it too): the engine
# runs it on CUDA, loaded on first use so that a machine without Triton still serves (gathered path).
KERNEL = ("gpubench.lib.kernels.paged_attention_triton", "paged_decode_attention_triton")


def check_shapes(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
) -> tuple[int, int, int, int, int]:
    """(batch, heads, head_dim, block_size, kv_heads), or ValueError naming what does not fit."""
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"expected q (batch, heads, head_dim) and k_cache == v_cache shaped (num_blocks, "
            f"block_size, kv_heads, head_dim); got q {tuple(q.shape)}, k_cache "
            f"{tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}"
        )
    batch, heads, head_dim = q.shape
    _, block_size, kv_heads, kv_dim = k_cache.shape
    if kv_dim != head_dim:
        raise ValueError(f"q head_dim ({head_dim}) != cache head_dim ({kv_dim})")
    if heads % kv_heads != 0:
        raise ValueError(f"heads ({heads}) must be divisible by kv_heads ({kv_heads})")
    if block_tables.dim() != 2 or block_tables.shape[0] != batch or tuple(context_lens.shape) != (batch,):
        raise ValueError(
            f"expected block_tables (batch, max_blocks) and context_lens (batch,) with batch "
            f"{batch}; got {tuple(block_tables.shape)} and {tuple(context_lens.shape)}"
        )
    return batch, heads, head_dim, block_size, kv_heads


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(q k^T * scale) v for one query token per sequence, K and V read from the paged cache
    through the block table. q (batch, heads, head_dim); k_cache, v_cache (num_blocks, block_size,
    kv_heads, head_dim), heads a multiple of kv_heads; block_tables (batch, max_blocks) int32,
    entries past a sequence's last block never read; context_lens (batch,) int32 (0 gives zeros).
    The Triton kernel on CUDA, one gather and SDPA elsewhere; ``out`` receives the result."""
    return dispatch(
        KERNEL, paged_decode_attention_gathered, q, k_cache, v_cache, block_tables, context_lens, scale=scale, out=out
    )


def decode_token_slots(
    block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each sequence's keys lie in the flattened pool (``num_blocks * block_size`` slots):
    ``(slots (batch, width) int64, live (batch, width) bool)``, width the table's blocks times
    ``block_size``. Positions past a context point at the sequence's first slot (written, so
    finite: an engine's pool is torch.empty and 0 * NaN would leak through the softmax) and are
    marked dead. Table entries past a sequence's last block are never followed. Host-sync free."""
    batch, blocks = block_tables.shape
    device = block_tables.device
    offsets = torch.arange(block_size, device=device)
    slots = (block_tables.to(torch.long)[:, :, None] * block_size + offsets).view(batch, blocks * block_size)
    live = torch.arange(blocks * block_size, device=device)[None, :] < context_lens.to(torch.long)[:, None]
    return torch.where(live, slots, slots[:, :1]), live


def gathered_decode(
    q: torch.Tensor,
    k_rows: torch.Tensor,
    v_rows: torch.Tensor,
    index: torch.Tensor,
    live: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Decode attention of q ``(batch, heads, head_dim)`` over keys gathered from a pool seen as
    rows of tokens ``(rows, tokens_per_row, kv_heads, head_dim)``: ``index`` ``(batch, n)``
    picks each sequence's rows (one index_select for K, one for V), ``live`` ``(batch, n *
    tokens_per_row)`` masks what lies past each context (those slots must hold finite values),
    and one SDPA call attends with GQA by head grouping (no K/V repeat). Rows of single tokens
    address slots (:func:`decode_token_slots`); rows of blocks follow a block table as it is.
    A sequence with no live key gets zeros."""
    batch, width = live.shape
    kv_heads, head_dim = k_rows.shape[-2:]
    if width == 0:
        return torch.zeros_like(q)
    flat = index.reshape(-1)
    k = k_rows.index_select(0, flat).view(batch, width, kv_heads, head_dim)
    v = v_rows.index_select(0, flat).view(batch, width, kv_heads, head_dim)
    out = grouped_decode_sdpa(q, k.transpose(1, 2), v.transpose(1, 2), live[:, None, None, :], scale)
    # An all-dead row (context 0) softmaxes over nothing: NaN there, zeros wanted.
    return out.masked_fill(~live[:, :1, None], 0.0)


def grouped_decode_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """One decoding query per sequence, q ``(batch, heads, d)``, over k, v ``(batch, kv_heads,
    tokens, d)``: the query heads sharing a KV head become that head's rows of queries, so each
    K/V is read once for its whole group (no repeat, no GQA broadcast inside SDPA). ``mask``
    ``(batch, 1, 1, tokens)``. Returns ``(batch, heads, d)``."""
    batch, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    out = F.scaled_dot_product_attention(
        q.reshape(batch, kv_heads, heads // kv_heads, head_dim), k, v, attn_mask=mask, scale=scale
    )
    return out.reshape(batch, heads, head_dim)


def paged_decode_attention_gathered(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`paged_decode_attention` vectorized: :func:`decode_token_slots` then
    :func:`gathered_decode` (no loop over blocks, no host sync); into ``out`` when given."""
    batch, heads, head_dim, block_size, _ = check_shapes(q, k_cache, v_cache, block_tables, context_lens)
    if scale is None:
        scale = head_dim**-0.5
    slots, live = decode_token_slots(block_tables.to(q.device), context_lens.to(q.device), block_size)
    kv_heads = k_cache.shape[2]
    result = gathered_decode(
        q, k_cache.reshape(-1, 1, kv_heads, head_dim), v_cache.reshape(-1, 1, kv_heads, head_dim), slots, live, scale
    )
    return result if out is None else out.copy_(result)
