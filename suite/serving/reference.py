"""What batching must not change: each request generated as if alone, its K/V kept in a plain
cache and attention by SDPA (no KV backend, no scheduler).

:func:`reference_generate` decodes one request alone; :func:`reference_batch` decodes many at
once, each row of a padded batch at its own positions over its own keys only (a mask hides the
padding and every other row), one forward pass per step for all of them: the same greedy tokens
and the same sampled draws (each request draws from its own generator), in a fraction of the
time of one pass per request and step. Batched rows round differently from a lone pass (a
matmul's shape picks its kernel), so the logits agree within rounding, not bit for bit; the
serving check allows a divergence only where the choice was a near-tie anyway (its margin is far
above that rounding), and tests hold the two to the same tokens."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from gpubench.models.llama import LlamaWeights, causal_attention, forward
from gpubench.serving.model_runner import sample
from gpubench.serving.sequence import Sequence
from gpubench.serving.traces import Request

BATCH_ROWS = 64  # requests decoded together: a bigger batch pads more (the rows sorted by length)


def reference_generate(
    weights: LlamaWeights, request: Request, temperature: float = 0.0
) -> tuple[list[int], list[float]]:
    """The request's tokens decoded alone, and at each step how near a tie its choice was, in
    logit units (:func:`sample`'s margins: greedy's top-2 logit gap, or the sampled race's)."""
    c = weights.config
    past_k: list[torch.Tensor | None] = [None] * c.num_layers
    past_v: list[torch.Tensor | None] = [None] * c.num_layers
    seq = Sequence.of(request, temperature)
    gaps: list[float] = []
    feed, start = list(request.prompt), 0

    def attend(layer, q, k, v):
        out = causal_attention(q, k, v, past_k[layer], past_v[layer])
        past_k[layer] = k if past_k[layer] is None else torch.cat([past_k[layer], k])
        past_v[layer] = v if past_v[layer] is None else torch.cat([past_v[layer], v])
        return out

    with torch.inference_mode():
        while len(seq.output) < request.output_len:
            tok = torch.tensor(feed, dtype=torch.long, device=weights.device)
            pos = torch.arange(start, start + len(feed), device=weights.device)
            logits = forward(weights, tok, pos, attend, logits_at=torch.tensor([len(feed) - 1], device=weights.device))
            token = sample(logits, [seq], temperature, margins=gaps)[0]
            seq.output.append(token)
            start += len(feed)
            feed = [token]
    return seq.output, gaps


def reference_batch(
    weights: LlamaWeights, requests: list[Request], temperature: float = 0.0, rows: int = BATCH_ROWS
) -> dict[int, tuple[list[int], list[float]]]:
    """:func:`reference_generate` of every request, by request id, decoded ``rows`` requests at
    a time (sorted by length, so a batch's rows finish close together)."""
    ordered = sorted(requests, key=lambda r: (r.prompt_len + r.output_len, r.id))
    out: dict[int, tuple[list[int], list[float]]] = {}
    for i in range(0, len(ordered), max(1, rows)):
        out.update(_decode_together(weights, ordered[i : i + max(1, rows)], temperature))
    return out


def _decode_together(
    weights: LlamaWeights, requests: list[Request], temperature: float
) -> dict[int, tuple[list[int], list[float]]]:
    """One padded batch: a prefill of every prompt (right-padded), then one token per unfinished
    row and step. Row b's keys are its own slots 0..length_b - 1 of the cache; a query sees the
    keys at or before its own position, nothing padded, nothing of another row."""
    c, device = weights.config, weights.device
    n = len(requests)
    total = max(r.prompt_len + r.output_len for r in requests)
    cache_k = [
        torch.zeros(n, total, c.num_kv_heads, c.head_dim, dtype=weights.dtype, device=device)
        for _ in range(c.num_layers)
    ]
    cache_v = [torch.zeros_like(t) for t in cache_k]
    seqs = [Sequence.of(r, temperature) for r in requests]
    gaps: list[list[float]] = [[] for _ in requests]
    slots = torch.arange(total, device=device)
    group = c.num_heads // c.num_kv_heads
    state: dict[str, Any] = {}  # pos and rows (tensors), seen (an int)

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        pos, rows, seen = state["pos"], state["rows"], state["seen"]  # (b, t) positions; (b,) rows; slots seen
        at = (rows.unsqueeze(1), pos)
        cache_k[layer].index_put_(at, k)  # padded tokens write slots past their row's length: never read
        cache_v[layer].index_put_(at, v)
        keys, values = cache_k[layer][rows, :seen], cache_v[layer][rows, :seen]  # (b, seen, kv_heads, d)
        mask = (slots[:seen].view(1, 1, -1) <= pos.unsqueeze(-1)).unsqueeze(1)  # (b, 1, t, seen)
        kt = keys.repeat_interleave(group, dim=2).transpose(1, 2)  # (b, heads, seen, d)
        vt = values.repeat_interleave(group, dim=2).transpose(1, 2)
        return F.scaled_dot_product_attention(q.transpose(1, 2), kt, vt, attn_mask=mask).transpose(1, 2)

    with torch.inference_mode():
        prompt_lens = torch.tensor([r.prompt_len for r in requests], device=device)
        longest = int(prompt_lens.max())
        tokens = torch.zeros(n, longest, dtype=torch.long, device=device)
        for b, r in enumerate(requests):
            tokens[b, : r.prompt_len] = torch.tensor(r.prompt, dtype=torch.long)
        # a padded token sits past its row's prompt: a real query never sees it, and its slot is
        # written again (by the row's next token) before any query reads it
        pos = torch.arange(longest, device=device).expand(n, longest)
        state.update(pos=pos, rows=torch.arange(n, device=device), seen=longest)
        last = torch.arange(n, device=device) * longest + prompt_lens - 1
        active = [b for b in range(n) if not seqs[b].done]  # (a request asking no token gets none)
        logits = forward(weights, tokens, pos, attend, logits_at=last)[active]
        lengths = [r.prompt_len for r in requests]
        while True:
            if not active:
                break
            margins: list[float] = []
            chosen = sample(logits, [seqs[b] for b in active], temperature, margins=margins)
            for b, token, gap in zip(active, chosen, margins):
                seqs[b].output.append(token)
                gaps[b].append(gap)
            active = [b for b in active if not seqs[b].done]
            if not active:
                break
            rows = torch.tensor(active, device=device)
            pos = torch.tensor([[lengths[b]] for b in active], device=device)
            seen = max(lengths[b] for b in active) + 1  # no query sees a slot past the furthest position
            for b in active:
                lengths[b] += 1
            feed = torch.tensor([[seqs[b].output[-1]] for b in active], dtype=torch.long, device=device)
            state.update(pos=pos, rows=rows, seen=seen)
            logits = forward(weights, feed, pos, attend, logits_at=torch.arange(len(active), device=device))
    return {r.id: (seqs[b].output, gaps[b]) for b, r in enumerate(requests)}
