"""Speculative decoding: a drafter (a small model, or prompt lookup: :mod:`gpubench.lib.drafting`)
proposes k tokens, the target scores them all in one forward pass, and the acceptance rule
(:func:`verify`) keeps exactly the target's distribution (greedy: its tokens); both KV caches are
rolled back past rejected drafts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from gpubench.lib.drafting import Drafter, Verification
from gpubench.measure.phase_timer import PhaseTimer
from gpubench.models.decode_cache import KVCache, probabilities
from gpubench.models.llama import LlamaWeights


@dataclass
class SpecStats:
    """What one generation did, for vLLM-style metrics."""

    drafted: int = 0  # draft tokens proposed (and scored by the target)
    accepted: int = 0  # of those, accepted
    verifications: int = 0  # target forward passes after the prefill (each scores drafts + 1)
    target_forwards: int = 0  # verifications and the prefill
    emitted: int = 0  # tokens produced by verifications (accepted + one resampled or bonus each)
    draft_forwards: int = 0
    draft_s: float = 0.0  # time spent drafting (gpubench.measure.phase_timer: CUDA events on a GPU)
    verify_s: float = 0.0  # time spent in target passes and the acceptance rule
    k_used: list[int] = field(default_factory=list)  # the k asked of the drafter, per verification
    # accepted_at[i]: verifications that drafted at least i + 1 tokens and accepted the (i+1)-th
    accepted_at: list[int] = field(default_factory=list)
    drafted_at: list[int] = field(default_factory=list)

    def verified(self, drafted: int, accepted: int, asked: int) -> None:
        """Count one verification: ``drafted`` drafts scored (``asked`` were asked for), the first
        ``accepted`` of them kept."""
        self.verifications += 1
        self.target_forwards += 1
        self.drafted += drafted
        self.accepted += accepted
        self.emitted += accepted + 1
        self.k_used.append(asked)
        for i in range(drafted):
            self.drafted_at[i] += 1
            self.accepted_at[i] += i < accepted

    def add(self, other: SpecStats) -> None:
        """Add another generation's counts and times to these."""
        for name in (
            "drafted",
            "accepted",
            "verifications",
            "target_forwards",
            "emitted",
            "draft_forwards",
            "draft_s",
            "verify_s",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.k_used += other.k_used
        for mine, theirs in ((self.accepted_at, other.accepted_at), (self.drafted_at, other.drafted_at)):
            mine += [0] * (len(theirs) - len(mine))
            for i, v in enumerate(theirs):
                mine[i] += v


def residual(p: torch.Tensor, q: torch.Tensor | None, draft: int) -> torch.Tensor:
    """Where the token after a rejected ``draft`` is drawn from: max(0, p - q), unnormalized (a
    one-hot q when None: p without the draft); p itself where that is all zero (p == q)."""
    if q is None:
        out = p.clone()
        out[draft] = 0.0
    else:
        out = (p - q).clamp_(min=0)
    return out if float(out.sum()) > 0 else p


def verify(
    logits: torch.Tensor,
    drafts: list[int],
    q: torch.Tensor | None,
    temperature: float,
    generator: torch.Generator | None,
) -> tuple[int, int]:
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
    p = probabilities(logits, temperature)
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
    rest = residual(p[n], q[n] if q is not None else None, drafts[n])
    return n, int(torch.multinomial(rest, 1, generator=generator))


def speculative_generate(
    target: LlamaWeights,
    drafter: Drafter,
    prompt: Sequence[int],
    max_new_tokens: int,
    k: int,
    adaptive: bool = False,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    trace: list[Verification] | None = None,
) -> tuple[list[int], SpecStats]:
    """``max_new_tokens`` tokens after ``prompt``, distributed exactly as the target's own
    decoding (token for token equal to it when greedy). Returns the tokens and what it took;
    each verification is appended to ``trace`` when given."""
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
    timer = PhaseTimer(device)
    with torch.inference_mode():
        if len(tokens) > 1:
            cache.forward(tokens[:-1])
            stats.target_forwards += 1
        while len(tokens) < goal:
            budget = min(k_now, goal - len(tokens) - 1)  # room for the token each verification adds
            with timer.span("draft"):
                drafts, q = drafter.propose(tokens, budget, temperature, generator) if budget > 0 else ([], None)
            with timer.span("verify"):
                base = cache.length
                logits = cache.forward([tokens[-1]] + drafts, all_logits=True)
                n, nxt = verify(logits, drafts, q, temperature, generator)
                cache.truncate(base + 1 + n)  # keep the last token and the accepted drafts
                drafter.rollback(len(tokens) + n)
                if trace is not None:
                    trace.append(Verification(len(tokens), budget, drafts, q, logits, n, nxt))
                tokens += drafts[:n]
                tokens.append(nxt)
            stats.verified(len(drafts), n, budget)
            if adaptive and drafts:
                if n == len(drafts) == k_now:
                    k_now = min(k_now + 1, k_max)
                elif n < len(drafts):
                    k_now = max(1, k_now - 1)
    phases = timer.seconds
    stats.draft_s, stats.verify_s = phases.get("draft", 0.0), phases.get("verify", 0.0)
    stats.draft_forwards = getattr(drafter, "forwards", 0)
    return tokens[len(prompt) :], stats
