"""Speculative decoding: a cheap drafter proposes k tokens, the target scores all of them in one
forward pass, and a rejection rule keeps exactly the target's output distribution.

The idea (Leviathan, Kalman and Matias, ICML 2023; Chen et al. 2023, "speculative sampling"):
decoding one token per target pass leaves a GPU idle on arithmetic, since each pass reads every
weight to compute a single position. Scoring k + 1 positions reads the same weights once, so it
costs about one decode step. If a drafter that costs c target steps per token guesses k tokens,
and each guess survives with probability a, one verification yields (1 - a^(k+1)) / (1 - a)
tokens on average for k·c + 1 steps of time: a speedup of (1 - a^(k+1)) / ((1 - a)(k·c + 1)).
Leviathan et al. measured 2-3x on T5-XXL with identical outputs.

Where the win comes from: verification of k + 1 tokens costing about one step (memory-bound
decode) and a drafter much cheaper than the target that often agrees with it. Where it goes:
wasted drafts (low a), an expensive drafter (high c), and hardware on which scoring k + 1 tokens
costs more than one (a CPU, or a GPU at large batch, where decode is compute-bound).

The rule (what keeps the output exactly the target's):

- sampling: draft token x_i, drafted with probability q_i(x_i), is accepted with probability
  min(1, p_i(x_i) / q_i(x_i)) where p_i is the target's distribution at that position; at the
  first rejection one token is drawn from norm(max(0, p_i - q_i)) and the rest are discarded;
  when all k survive, a bonus token is drawn from p_{k+1}. A deterministic drafter (prompt
  lookup) has q_i = one-hot(x_i).
- greedy: drafts are accepted while they equal the target's argmax; the first mismatch is
  replaced by the target's argmax; with all k accepted, the target's argmax after them is the
  bonus. The output is token for token that of plain greedy decoding.

Both models' KV caches are rolled back past the rejected tokens (a length, not a copy:
:class:`gpubench.baselines.speculative_decoding.KVCache`).

Drafters: a small draft model (:class:`ModelDrafter`) and prompt-lookup / n-gram drafting
(:class:`NgramDrafter`, no model: the continuation of the latest earlier occurrence of the last
n tokens). The number of drafts is a fixed k, or adaptive: one more after a verification that
accepted every draft, one fewer after one that rejected any (between 1 and 2k).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import torch

from gpubench.baselines.speculative_decoding import KVCache
from gpubench.models.llama import LlamaWeights


class Drafter(Protocol):
    def propose(self, tokens: list[int], k: int, temperature: float,
                generator: torch.Generator | None) -> tuple[list[int], torch.Tensor | None]:
        """Up to ``k`` draft tokens after ``tokens``, and the drafter's probabilities of them
        (``(len(drafts), vocab)``), or None when the drafter is deterministic (a one-hot q)."""

    def rollback(self, valid: int) -> None:
        """Only the first ``valid`` tokens of the last proposal's context plus drafts still stand."""


class ModelDrafter:
    """Drafts by decoding a small model autoregressively from its own KV cache."""

    def __init__(self, weights: LlamaWeights, capacity: int):
        self.cache = KVCache(weights, capacity)
        self.forwards = 0

    def propose(self, tokens: list[int], k: int, temperature: float,
                generator: torch.Generator | None) -> tuple[list[int], torch.Tensor | None]:
        drafts: list[int] = []
        probs: list[torch.Tensor] = []
        feed = tokens[self.cache.length:]  # what the cache has not seen yet (at least the last token)
        for i in range(k):
            logits = self.cache.forward(feed)[0]
            self.forwards += 1
            if temperature <= 0:
                token = int(logits.argmax())
            else:
                q = torch.softmax(logits.float() / temperature, dim=-1).cpu()
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
        self._buf = bytearray()  # the context as little-endian int32s: bytes.rfind does the search
        self._len = 0
        self._tokens: list[int] = []
        self.forwards = 0

    def _sync(self, tokens: list[int]) -> None:
        if self._len > len(tokens) or self._tokens is not tokens:
            self._buf, self._len, self._tokens = bytearray(), 0, tokens
        for t in tokens[self._len:]:
            self._buf += t.to_bytes(4, "little")
        self._len = len(tokens)

    def propose(self, tokens: list[int], k: int, temperature: float,
                generator: torch.Generator | None) -> tuple[list[int], torch.Tensor | None]:
        self._sync(tokens)
        n_tokens = len(tokens)
        buf = self._buf
        for n in range(min(self.n_max, n_tokens - 1), self.n_min - 1, -1):
            pattern = bytes(buf[(n_tokens - n) * 4:])
            end = (n_tokens - 1) * 4  # a match must leave at least one token after it
            while True:
                at = buf.rfind(pattern, 0, end)
                if at < 0:
                    break
                if at % 4 == 0:
                    start = at // 4 + n
                    return list(tokens[start:start + k]), None
                end = at + len(pattern) - 1  # misaligned (inside a token): look further back
        return [], None

    def rollback(self, valid: int) -> None:
        pass  # nothing is cached beyond the confirmed tokens


@dataclass
class SpecStats:
    """What one generation did, for vLLM-style metrics."""

    drafted: int = 0  # draft tokens proposed (and scored by the target)
    accepted: int = 0  # of those, accepted
    verifications: int = 0  # target forward passes after the prefill (each scores drafts + 1)
    emitted: int = 0  # tokens produced by verifications (accepted + one resampled or bonus each)
    draft_forwards: int = 0
    draft_s: float = 0.0  # wall time spent drafting
    verify_s: float = 0.0  # wall time spent in target passes and the acceptance rule
    k_used: list[int] = field(default_factory=list)  # the k asked of the drafter, per verification
    # accepted_at[i]: verifications that drafted at least i + 1 tokens and accepted the (i+1)-th
    accepted_at: list[int] = field(default_factory=list)
    drafted_at: list[int] = field(default_factory=list)

    def add(self, other: "SpecStats") -> None:
        for name in ("drafted", "accepted", "verifications", "emitted", "draft_forwards", "draft_s", "verify_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.k_used += other.k_used
        for mine, theirs in ((self.accepted_at, other.accepted_at), (self.drafted_at, other.drafted_at)):
            mine += [0] * (len(theirs) - len(mine))
            for i, v in enumerate(theirs):
                mine[i] += v

    def to_dict(self) -> dict[str, Any]:
        return {"drafted": self.drafted, "accepted": self.accepted, "verifications": self.verifications,
                "emitted": self.emitted, "draft_forwards": self.draft_forwards, "draft_s": self.draft_s,
                "verify_s": self.verify_s, "k_used": list(self.k_used), "accepted_at": list(self.accepted_at),
                "drafted_at": list(self.drafted_at)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def verify(logits: torch.Tensor, drafts: list[int], q: torch.Tensor | None, temperature: float,
           generator: torch.Generator | None) -> tuple[int, int]:
    """The acceptance rule. ``logits``: the target's ``(len(drafts) + 1, vocab)`` logits, row i
    scoring the token after the context plus drafts[:i]. Returns (accepted drafts, the token that
    follows them: the target's correction at the first rejection, or the bonus token)."""
    k = len(drafts)
    if temperature <= 0:
        best = logits.argmax(dim=-1).tolist()
        n = 0
        while n < k and drafts[n] == best[n]:
            n += 1
        return n, best[n]
    p = torch.softmax(logits.float() / temperature, dim=-1).cpu()
    if k:
        idx = torch.arange(k)
        d = torch.tensor(drafts)
        p_tok = p[idx, d]
        q_tok = q[idx, d] if q is not None else torch.ones(k)
        u = torch.rand(k, generator=generator)
        keep = (u * q_tok < p_tok).tolist()  # u < p / q: accepted with probability min(1, p / q)
        n = keep.index(False) if False in keep else k
    else:
        n = 0
    if n == k:  # every draft accepted: the bonus token comes from the target's last row
        return n, int(torch.multinomial(p[k], 1, generator=generator))
    residual = p[n].clone()
    if q is not None:
        residual = (residual - q[n]).clamp_(min=0)
    else:
        residual[drafts[n]] = 0.0
    if not float(residual.sum()) > 0:  # p == q at this row: a rejection had probability 0
        residual = p[n]
    return n, int(torch.multinomial(residual, 1, generator=generator))


def speculative_generate(target: LlamaWeights, drafter: Drafter, prompt: Sequence[int], max_new_tokens: int,
                         k: int, adaptive: bool = False, temperature: float = 0.0,
                         generator: torch.Generator | None = None) -> tuple[list[int], SpecStats]:
    """``max_new_tokens`` tokens after ``prompt``, distributed exactly as the target's own
    decoding (token for token equal to it when greedy). Returns the tokens and what it took."""
    if len(prompt) < 1 or max_new_tokens < 1 or k < 1:
        raise ValueError("need a prompt of at least one token, at least one new token and k >= 1")
    device = target.device
    k_max = 2 * k if adaptive else k
    stats = SpecStats(accepted_at=[0] * k_max, drafted_at=[0] * k_max)
    tokens = list(prompt)
    goal = len(prompt) + max_new_tokens
    # The target's cache holds every token but the last; each verification feeds the last token
    # and the drafts, so row 0 of its logits scores the first draft.
    cache = KVCache(target, goal + k_max + 1)
    k_now = k
    with torch.inference_mode():
        if len(tokens) > 1:
            cache.forward(tokens[:-1])
        while len(tokens) < goal:
            budget = min(k_now, goal - len(tokens) - 1)  # room for the token each verification adds
            t0 = time.perf_counter()
            drafts, q = drafter.propose(tokens, budget, temperature, generator) if budget > 0 else ([], None)
            _sync(device)
            t1 = time.perf_counter()
            base = cache.length
            logits = cache.forward([tokens[-1]] + drafts, all_logits=True)
            n, nxt = verify(logits, drafts, q, temperature, generator)
            cache.truncate(base + 1 + n)  # keep the last token and the accepted drafts
            drafter.rollback(len(tokens) + n)
            tokens += drafts[:n]
            tokens.append(nxt)
            stats.verify_s += time.perf_counter() - t1
            stats.draft_s += t1 - t0
            stats.verifications += 1
            stats.drafted += len(drafts)
            stats.accepted += n
            stats.emitted += n + 1
            stats.k_used.append(budget)
            for i in range(len(drafts)):
                stats.drafted_at[i] += 1
                stats.accepted_at[i] += i < n
            if adaptive and drafts:
                if n == len(drafts) == k_now:
                    k_now = min(k_now + 1, k_max)
                elif n < len(drafts):
                    k_now = max(1, k_now - 1)
    stats.draft_forwards = getattr(drafter, "forwards", 0)
    return tokens[len(prompt):], stats
