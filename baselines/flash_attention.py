"""Eager attention: materialize the N x N scores, softmax them in float32, multiply by V (what
Hugging Face's ``eager`` attention and most reference code do). Conventions (layouts, GQA, causal
alignment, rows that see no key): :mod:`gpubench.lib.attention`.
"""

from __future__ import annotations

import torch

from gpubench.lib.attention import causal_offset, check_shapes, softmax_with_empty_rows


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    *,
    causal_align: str = "bottom_right",
) -> torch.Tensor:
    """softmax(q k^T * scale) v in SDPA's layout (conventions: :mod:`gpubench.lib.attention`), differentiable."""
    check_shapes(q, k, v)
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
    if causal:
        above_diagonal = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device).triu(offset + 1)
        scores = scores.masked_fill(above_diagonal, float("-inf"))
    if causal and offset < 0 or seq_k == 0:  # some rows see no key: softmax would make them NaN
        return softmax_with_empty_rows(scores, v)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)
