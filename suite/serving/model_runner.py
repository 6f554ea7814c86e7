"""The model runner: one forward pass over a step's prefills and decodes, then each sequence's
next token. Every sequence feeds the tokens whose K/V are not cached yet (``tokens[cached:]``): a
prefill all of them, attending over any cached prefix and causally among themselves; a decode its
last one, attending over its cache."""
from __future__ import annotations

import torch

from gpubench.models.llama import LlamaWeights, causal_attention, forward
from gpubench.serving.kv import KVBackend
from gpubench.serving.sequence import Sequence


def sample(logits: torch.Tensor, seqs: list[Sequence], temperature: float) -> list[int]:
    """Greedy (temperature 0: argmax) or sampled from softmax(logits / T), each request from its
    own seeded generator, so a request draws the same numbers however it is batched."""
    if temperature <= 0:
        return logits.argmax(dim=-1).tolist()
    probs = torch.softmax(logits.float() / temperature, dim=-1).cpu()
    return [int(torch.multinomial(probs[i], 1, generator=s.generator)) for i, s in enumerate(seqs)]


class ModelRunner:
    def __init__(self, weights: LlamaWeights, kv: KVBackend, temperature: float):
        self.weights, self.kv, self.temperature = weights, kv, temperature
        self.device = weights.device

    def run(self, prefills: list[Sequence], decodes: list[Sequence]) -> list[int]:
        """The next token of every sequence, prefills first; their K/V are cached on the way."""
        kv, device = self.kv, self.device
        tokens, positions, last = [], [], []
        for s in prefills:
            tokens += s.tokens[s.cached:]
            positions += range(s.cached, len(s.tokens))
            last.append(len(tokens) - 1)
        first_decode = len(tokens)
        for s in decodes:
            tokens.append(s.tokens[s.cached])
            positions.append(s.cached)
            last.append(len(tokens) - 1)
        new_slots = [kv.slots(s, s.cached, len(s.tokens)) for s in prefills]
        past_slots = [kv.slots(s, 0, s.cached) if s.cached else None for s in prefills]
        batch = kv.prepare_decode(decodes) if decodes else None

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            outs, start = [], 0
            for slots, past in zip(new_slots, past_slots):
                stop = start + len(slots)
                kv.write(layer, slots, k[start:stop], v[start:stop])
                past_k, past_v = kv.read(layer, past) if past is not None else (None, None)
                outs.append(causal_attention(q[start:stop], k[start:stop], v[start:stop], past_k, past_v))
                start = stop
            if batch is not None:
                kv.write(layer, batch.slots, k[first_decode:], v[first_decode:])
                outs.append(kv.decode_attention(layer, q[first_decode:], batch))
            return torch.cat(outs) if len(outs) > 1 else outs[0]

        tok = torch.tensor(tokens, dtype=torch.long, device=device)
        pos = torch.tensor(positions, dtype=torch.long, device=device)
        with torch.inference_mode():
            logits = forward(self.weights, tok, pos, attend, logits_at=torch.tensor(last, device=device))
        for s in prefills:
            s.cached = len(s.tokens)
        for s in decodes:
            s.cached += 1
        return sample(logits, prefills + decodes, self.temperature)
