"""What proposes draft tokens for speculative decoding, and the record of one verification: shared
by the draft-and-verify generation (:mod:`gpubench.optimizations.speculative_decoding`) and the
check that replays it (:mod:`gpubench.techniques.speculative_decoding.run_check`). :class:`ModelDrafter` decodes a small
model from its own KV cache; :class:`NgramDrafter` looks the context's last tokens up in the
context itself (prompt lookup).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from gpubench.models.decode_cache import KVCache, probabilities
from gpubench.models.llama import LlamaWeights


class Drafter(Protocol):
    def propose(
        self, tokens: list[int], k: int, temperature: float, generator: torch.Generator | None
    ) -> tuple[list[int], torch.Tensor | None]:
        """Up to ``k`` draft tokens after ``tokens``, and the drafter's probabilities of them
        (``(len(drafts), vocab)``), or None when the drafter is deterministic (a one-hot q)."""

    def rollback(self, valid: int) -> None:
        """Only the first ``valid`` tokens of the last proposal's context plus drafts still stand."""


class ModelDrafter:
    """Drafts by decoding a small model autoregressively from its own KV cache. A proposal of k
    drafts feeds the context and the first k - 1 drafts; ``rollback(valid)`` keeps the first
    ``valid`` of those (or all, when fewer were fed)."""

    def __init__(self, weights: LlamaWeights, capacity: int):
        self.cache = KVCache(weights, capacity)
        self.forwards = 0

    def propose(
        self, tokens: list[int], k: int, temperature: float, generator: torch.Generator | None
    ) -> tuple[list[int], torch.Tensor | None]:
        drafts: list[int] = []
        probs: list[torch.Tensor] = []
        # The cache holds a prefix of the context, never its last token (the rollback keeps it so):
        # feed the confirmed tokens it has not seen, then the last one, whose logits give draft 0.
        feed = tokens[self.cache.length : -1] + tokens[-1:]
        for _ in range(k):
            logits = self.cache.forward(feed)[0]
            self.forwards += 1
            if temperature <= 0:
                token = int(logits.argmax())
            else:
                q = probabilities(logits, temperature)
                token = int(torch.multinomial(q, 1, generator=generator))
                probs.append(q)
            drafts.append(token)
            feed = [token]
        # The last draft is never fed: its K/V are only needed if it is accepted, and then the next
        # proposal feeds it (with the bonus token) anyway.
        return drafts, (torch.stack(probs) if probs else None)

    def rollback(self, valid: int) -> None:
        self.cache.truncate(min(valid, self.cache.length))


class NgramDrafter:
    """Prompt-lookup decoding: find the latest earlier occurrence of the context's last n tokens
    (n from ``n_max`` down to ``n_min``) and propose the k tokens that followed it. No model;
    deterministic, so its q is one-hot."""

    def __init__(self, n_max: int = 3, n_min: int = 1):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= n_min ({n_min}) <= n_max ({n_max})")
        self.n_max, self.n_min = n_max, n_min
        # The state: the first ``length`` context tokens as little-endian int32s (bytes.rfind searches them).
        self.context_bytes = bytearray()
        self.length = 0
        self._tokens: list[int] = []
        self.forwards = 0

    def _sync(self, tokens: list[int]) -> None:
        if self.length > len(tokens) or self._tokens is not tokens:
            self.context_bytes, self.length, self._tokens = bytearray(), 0, tokens
        for t in tokens[self.length :]:
            self.context_bytes += t.to_bytes(4, "little")
        self.length = len(tokens)

    def propose(
        self, tokens: list[int], k: int, temperature: float, generator: torch.Generator | None
    ) -> tuple[list[int], torch.Tensor | None]:
        self._sync(tokens)
        n_tokens = len(tokens)
        buf = self.context_bytes
        for n in range(min(self.n_max, n_tokens - 1), self.n_min - 1, -1):
            pattern = bytes(buf[(n_tokens - n) * 4 :])
            end = (n_tokens - 1) * 4  # a match must leave at least one token after it
            while True:
                at = buf.rfind(pattern, 0, end)
                if at < 0:
                    break
                if at % 4 == 0:
                    start = at // 4 + n
                    return list(tokens[start : start + k]), None
                end = at + len(pattern) - 1  # misaligned (inside a token): look further back
        return [], None

    def rollback(self, valid: int) -> None:
        pass  # nothing is cached beyond the confirmed tokens


@dataclass(frozen=True)
class Verification:
    """One verification as it ran: after the first ``start`` tokens, ``asked`` drafts were asked
    for and ``drafts`` proposed (with the drafter's probabilities ``q``, None when one-hot); the
    target's ``logits`` scored them; ``accepted`` were kept and ``token`` followed."""

    start: int
    asked: int
    drafts: list[int]
    q: torch.Tensor | None
    logits: torch.Tensor
    accepted: int
    token: int
