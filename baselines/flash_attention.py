"""Eager attention: materialize the N x N scores, softmax them in float32, multiply by V (what
Hugging Face's ``eager`` attention and most reference code do). Conventions (layouts, GQA, causal
alignment, rows that see no key): :mod:`gpubench.lib.attention`.
"""

from __future__ import annotations

import torch

from gpubench.lib.attention import (
    causal_offset,
    check_local,
    check_shapes,
    sees_no_key,
    softmax_with_empty_rows,
    visible_keys,
)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    *,
    causal_align: str = "bottom_right",
    window: int = 0,
    chunk: int = 0,
) -> torch.Tensor:
    """softmax(q k^T * scale) v in SDPA's layout (conventions: :mod:`gpubench.lib.attention`), differentiable.
    ``window`` / ``chunk`` (causal only): a sliding window or chunked local attention as a mask of the
    scores (transformers' eager path), every score still computed."""
    check_shapes(q, k, v)
    check_local(causal, window, chunk)
    batch, heads, seq_q, head_dim = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    offset = causal_offset(seq_q, seq_k, causal_align)
    if scale is None:
        scale = head_dim**-0.5
    group = heads // kv_heads
    if group > 1:  # GQA: each k/v head copied once per query head that shares it
        k = k[:, :, None].expand(batch, kv_heads, group, *k.shape[2:]).flatten(1, 2)
        v = v[:, :, None].expand(batch, kv_heads, group, *v.shape[2:]).flatten(1, 2)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    local = bool(window or chunk)
    if local:
        pos_q, pos_k = torch.arange(seq_q, device=q.device), torch.arange(seq_k, device=q.device)
        hidden = ~visible_keys(pos_q[:, None], pos_k[None, :], offset, window, chunk)
        scores = scores.masked_fill(hidden, float("-inf"))
    elif causal:
        above_diagonal = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device).triu(offset + 1)
        scores = scores.masked_fill(above_diagonal, float("-inf"))
    if sees_no_key(seq_q, seq_k, causal, causal_align, window, chunk):  # softmax would make those rows NaN
        return softmax_with_empty_rows(scores, v)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)
