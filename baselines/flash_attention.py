"""Eager attention: materialize the N x N scores, softmax them in float32, multiply by V (what
Hugging Face's ``eager`` attention and most reference code do)."""
from __future__ import annotations

import torch


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v in SDPA's layout: q (batch, heads, seq, head_dim), k and v
    (batch, kv_heads, seq, head_dim), heads a multiple of kv_heads; causal is top-left aligned."""
    batch, heads, seq_q, head_dim = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    if heads % kv_heads != 0:
        raise ValueError(f"heads ({heads}) must be divisible by kv_heads ({kv_heads})")
    if scale is None:
        scale = head_dim ** -0.5
    group = heads // kv_heads
    if group > 1:  # GQA: each k/v head copied once per query head that shares it
        k = k[:, :, None].expand(batch, kv_heads, group, seq_k, head_dim).reshape(batch, heads, seq_k, head_dim)
        v = v[:, :, None].expand(batch, kv_heads, group, seq_k, head_dim).reshape(batch, heads, seq_k, head_dim)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        above_diagonal = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(above_diagonal, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)
