"""One sequence's KV cache for decoding with :mod:`gpubench.models.llama` (rolled back by setting
its length, as speculative decoding needs), and token choice from logits (greedy or sampled)."""

from __future__ import annotations

from collections.abc import Sequence

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
        self._last: dict[int, torch.Tensor] = {}  # n -> tensor([n - 1]) on the device: the last position's logits only

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
            kbuf[layer, start : start + n] = k
            vbuf[layer, start : start + n] = v
            return causal_attention(q, k, v, kbuf[layer, :start], vbuf[layer, :start])

        tok = torch.tensor(tokens, dtype=torch.long).to(self.weights.device, non_blocking=True)
        logits_at = None
        if not all_logits:
            logits_at = self._last.get(n)
            if logits_at is None:
                logits_at = self._last[n] = torch.tensor([n - 1], device=self.weights.device)
        logits = forward(self.weights, tok, self._positions[start : start + n], attend, logits_at=logits_at)
        self.length = start + n
        return logits

    def truncate(self, length: int) -> None:
        """Forget every position from ``length`` on."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} tokens to {length}")
        self.length = length


def probabilities(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T) in float32 on the CPU, where the CPU generators draw from it (the same
    draws on every device)."""
    return torch.softmax(logits.float() / temperature, dim=-1).cpu()


def pick(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """Greedy (temperature 0: argmax) or one draw from softmax(logits / T) with ``generator``."""
    if temperature <= 0:
        return int(logits.argmax())
    return int(torch.multinomial(probabilities(logits, temperature), 1, generator=generator))
