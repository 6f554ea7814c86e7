"""Attention the eager way: materialize the scores, softmax them, multiply by V.

This is what Hugging Face's ``eager`` attention and most reference code do. For a sequence of
N tokens it writes the full N x N score matrix (and then the N x N probabilities) to memory and
reads them back: O(N^2) memory and HBM traffic per head, while the useful inputs and output are
only O(N * head_dim). That traffic, not the arithmetic, is what flash attention removes.

Published figures the optimized pair is measured against: FlashAttention-2 reaches 50-73% of the
A100's peak; FlashAttention-3 reaches 740 TFLOP/s in fp16 on an H100 (75% of peak).
"""
from __future__ import annotations

import torch


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v with SDPA's layout: q (batch, heads, seq, head_dim), k and v
    (batch, kv_heads, seq, head_dim) where heads is a multiple of kv_heads (GQA/MQA).

    ``causal``: query i sees keys 0..i (top-left aligned, as SDPA's ``is_causal``).
    """
    batch, heads, seq_q, head_dim = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    if heads % kv_heads != 0:
        raise ValueError(f"heads ({heads}) must be divisible by kv_heads ({kv_heads})")
    if scale is None:
        scale = head_dim ** -0.5

    # GQA: copy each k/v head once per query head that shares it, so every query head gets
    # its own (head j reads kv head j // group).
    group = heads // kv_heads
    if group > 1:
        k = k[:, :, None].expand(batch, kv_heads, group, seq_k, head_dim).reshape(batch, heads, seq_k, head_dim)
        v = v[:, :, None].expand(batch, kv_heads, group, seq_k, head_dim).reshape(batch, heads, seq_k, head_dim)

    # The N x N score matrix, in memory.
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        above_diagonal = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(above_diagonal, float("-inf"))

    # Softmax in float32 for stability, then back to the input dtype for the second matmul.
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)
