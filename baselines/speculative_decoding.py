"""Plain autoregressive decoding: the target model produces one token per forward pass, reading
its past from a KV cache.

This is how every serving stack decodes by default. Each new token costs one full forward pass
of the target over a single position; on a GPU that pass is memory-bound (every weight is read
from HBM to do a few FLOPs per weight), so the hardware idles on arithmetic while the sequence
crawls forward a token at a time. Speculative decoding (:mod:`gpubench.optimizations.speculative_decoding`)
spends that idle arithmetic: a cheap drafter guesses k tokens and the target checks all of them
in one pass, keeping its own output distribution exactly. Published figure the pair is measured
against: Leviathan et al. (ICML 2023), 2-3x faster generation from T5-XXL with identical outputs.

The KV cache here (:class:`KVCache`: preallocated per-layer buffers and a length, so rolling
back is setting the length) is shared with the speculative decoder, which must undo the K/V of
rejected draft tokens in both of its models.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from gpubench.models.llama import LlamaWeights, causal_attention, forward


class KVCache:
    """The K/V of one sequence in every layer of one model, in buffers of ``capacity`` tokens.

    :meth:`forward` runs the model over new tokens, appending their K/V after ``length``;
    :meth:`truncate` rolls the cache back to a shorter prefix (the entries past it are simply
    overwritten by the next forward pass)."""

    def __init__(self, weights: LlamaWeights, capacity: int):
        c = weights.config
        if capacity > c.max_position:
            raise ValueError(f"a sequence of {capacity} tokens exceeds the model's {c.max_position} positions")
        self.weights = weights
        self.capacity = capacity
        shape = (c.num_layers, capacity, c.num_kv_heads, c.head_dim)
        self.k = torch.empty(shape, dtype=weights.dtype, device=weights.device)
        self.v = torch.empty(shape, dtype=weights.dtype, device=weights.device)
        self.length = 0
        self._positions = torch.arange(capacity, device=weights.device)
        self._last = {}  # n -> tensor([n - 1]) on the device: the last position's logits only

    def forward(self, tokens: Sequence[int], all_logits: bool = False) -> torch.Tensor:
        """Logits after each of ``tokens`` (``(n, vocab)``) or after the last only (``(1, vocab)``);
        the tokens' K/V are appended to the cache."""
        n, start = len(tokens), self.length
        if n == 0:
            raise ValueError("forward needs at least one token")
        if start + n > self.capacity:
            raise ValueError(f"KV cache full: {start} + {n} tokens > capacity {self.capacity}")
        kbuf, vbuf = self.k, self.v

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            kbuf[layer, start:start + n] = k
            vbuf[layer, start:start + n] = v
            return causal_attention(q, k, v, kbuf[layer, :start], vbuf[layer, :start])

        tok = torch.tensor(tokens, dtype=torch.long).to(self.weights.device, non_blocking=True)
        logits_at = None
        if not all_logits:
            logits_at = self._last.get(n)
            if logits_at is None:
                logits_at = self._last[n] = torch.tensor([n - 1], device=self.weights.device)
        logits = forward(self.weights, tok, self._positions[start:start + n], attend, logits_at=logits_at)
        self.length = start + n
        return logits

    def truncate(self, length: int) -> None:
        """Forget every position from ``length`` on."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} tokens to {length}")
        self.length = length


def pick(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """Greedy (temperature 0: argmax) or one draw from softmax(logits / T), from ``generator``
    (a CPU generator: the same draws on every device)."""
    if temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / temperature, dim=-1).cpu()
    return int(torch.multinomial(probs, 1, generator=generator))


def generate(weights: LlamaWeights, prompt: Sequence[int], max_new_tokens: int, temperature: float = 0.0,
             generator: torch.Generator | None = None) -> tuple[list[int], dict[str, Any]]:
    """``max_new_tokens`` tokens after ``prompt``, one target forward pass each (the first comes
    from the prompt's prefill). Returns the tokens and ``{"target_forwards": ...}``."""
    if len(prompt) < 1 or max_new_tokens < 1:
        raise ValueError("need a prompt of at least one token and at least one new token")
    cache = KVCache(weights, len(prompt) + max_new_tokens)
    out: list[int] = []
    with torch.inference_mode():
        logits = cache.forward(list(prompt))[0]
        forwards = 1
        while True:
            token = pick(logits, temperature, generator)
            out.append(token)
            if len(out) == max_new_tokens:
                break
            logits = cache.forward([token])[0]
            forwards += 1
    return out, {"target_forwards": forwards}
