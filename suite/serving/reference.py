"""What batching must not change: one request generated alone, its K/V kept by concatenation and
attention by SDPA (no KV backend, no scheduler)."""
from __future__ import annotations

import torch

from gpubench.models.llama import LlamaWeights, causal_attention, forward
from gpubench.serving.model_runner import sample
from gpubench.serving.sequence import Sequence
from gpubench.serving.traces import Request


def reference_generate(weights: LlamaWeights, request: Request,
                       temperature: float = 0.0) -> tuple[list[int], list[float]]:
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
