"""One layer of the MoE decoder (:mod:`gpubench.models.moe_decoder`) written again from its
definition, in float64 with plain tensor ops and none of the model's code: what a bug shared by
every variant and by their plain step (both run ``moe_decoder_layer``) cannot hide from.

The definition: ``x + attention(rmsnorm(x) * attn_norm)``, then ``+ moe(rmsnorm(.) * mlp_norm)``.
Attention: q, k, v projections, rotate-half RoPE from the given cos/sin tables, each query head
reading KV head ``head // (heads / kv_heads)``, causal within each document, scaled by
1/sqrt(head_dim). MoE (gpt-oss): router logits + bias, the top_k experts, softmax over their
logits; each expert ``act(x @ gate_up + b) @ down + b`` with act over interleaved columns
(gate = even clamped <= limit, linear = odd clamped to +-limit, gate * sigmoid(alpha gate) *
(linear + 1)); computed densely (every expert on every token, weighted 0 where not chosen), as
neither MoE path does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from gpubench.models.llama import LlamaConfig
from gpubench.models.moe import MoEConfig


def _rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps)


def _rotate_half_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (tokens, heads, d); cos, sin (tokens, d): channel i pairs with channel i + d/2."""
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    c1, c2 = cos[:, None, :half], cos[:, None, half:]
    s1, s2 = sin[:, None, :half], sin[:, None, half:]
    return torch.cat([first * c1 - second * s1, second * c2 + first * s2], dim=-1)


def _document_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, doc_lens: list[int]) -> torch.Tensor:
    """q (tokens, heads, d), k/v (tokens, kv_heads, d): causal attention inside each document."""
    tokens, heads, d = q.shape
    group = heads // k.shape[1]
    outs, start = [], 0
    for length in doc_lens:
        stop = start + length
        qd = q[start:stop].reshape(length, k.shape[1], group, d)  # query heads grouped by their KV head
        scores = torch.einsum("qngd,knd->ngqk", qd, k[start:stop]) / math.sqrt(d)
        future = torch.ones(length, length, dtype=torch.bool, device=q.device).triu(1)
        probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        outs.append(torch.einsum("ngqk,knd->qngd", probs, v[start:stop]).reshape(length, heads, d))
        start = stop
    return torch.cat(outs)


def _moe(x: torch.Tensor, p: Mapping[str, torch.Tensor], m: MoEConfig) -> tuple[torch.Tensor, float]:
    """The MoE MLP on x (tokens, hidden), and the smallest gap between a token's top_k-th and
    next router logit (how near its routing was to a tie)."""
    logits = x @ p["router_weight"].T + p["router_bias"]
    ranked = logits.detach().sort(dim=-1, descending=True).values
    gap = float((ranked[:, m.top_k - 1] - ranked[:, m.top_k]).min()) if m.top_k < m.experts else math.inf
    top, chosen = logits.topk(m.top_k, dim=-1)
    share = torch.zeros_like(logits).scatter(1, chosen, torch.softmax(top, dim=-1))  # (tokens, experts)
    pre = torch.einsum("th,ehf->etf", x, p["gate_up"]) + p["gate_up_bias"][:, None, :]
    gate = pre[..., 0::2].clamp(max=m.limit)
    linear = pre[..., 1::2].clamp(min=-m.limit, max=m.limit)
    act = gate * torch.sigmoid(m.alpha * gate) * (linear + 1)
    each = torch.einsum("etf,efh->eth", act, p["down"]) + p["down_bias"][:, None, :]  # (experts, tokens, hidden)
    return torch.einsum("te,eth->th", share, each), gap


def moe_decoder_layer_float64(
    c: LlamaConfig,
    m: MoEConfig,
    p: Mapping[str, torch.Tensor],
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    doc_lens: list[int],
) -> tuple[torch.Tensor, float]:
    """The layer on one packed row ``x`` (tokens, hidden), its documents ``doc_lens`` (summing to
    tokens), RoPE tables ``cos``/``sin`` (tokens, head_dim), parameters ``p`` by name (attn_norm,
    wq, wk, wv, wo, mlp_norm and the experts' router_weight, router_bias, gate_up, gate_up_bias,
    down, down_bias); everything float64. Returns the output and the routing's nearest tie."""
    n = x.shape[0]
    h = _rmsnorm(x, p["attn_norm"], c.rms_eps)
    q = _rotate_half_rope((h @ p["wq"].T).view(n, c.num_heads, c.head_dim), cos, sin)
    k = _rotate_half_rope((h @ p["wk"].T).view(n, c.num_kv_heads, c.head_dim), cos, sin)
    v = (h @ p["wv"].T).view(n, c.num_kv_heads, c.head_dim)
    x = x + _document_attention(q, k, v, doc_lens).reshape(n, -1) @ p["wo"].T
    mixed, gap = _moe(_rmsnorm(x, p["mlp_norm"], c.rms_eps), p, m)
    return x + mixed, gap
