"""The run's check of speculative decoding: greedy tokens against plain decoding; every
draft_verify run's verifications and its drafter's final state replayed against a cacheless
recomputation; for sampled runs, a chi-square test of the acceptance rule at the run's own
verifications. Nothing here reuses the KV cache or rollback logic under test."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gpubench.contract import DTYPE_TOLERANCE, CheckResult
from gpubench.lib.drafting import ModelDrafter, NgramDrafter, Verification
from gpubench.models.llama import LlamaWeights, causal_attend, forward


@dataclass(frozen=True)
class Generation:
    """One prompt's speculative generation, as the check replays it: its verifications and the
    drafter as the generation left it."""

    prompt: list[int]
    steps: list[Verification]
    drafter: ModelDrafter | NgramDrafter


@dataclass(frozen=True)
class Replay:
    """What draft_verify hands its check besides the tokens: each prompt's generation, the models
    the check recomputes with, the acceptance rule the run used and the case's seed (the rule's
    distribution test draws from it)."""

    generations: list[Generation]
    target: LlamaWeights
    draft: LlamaWeights | None
    ngram: tuple[int, int]  # (ngram_max, ngram_min)
    rule: Callable[..., tuple[int, int]]
    seed: int


@dataclass(frozen=True)
class Decoded:
    """A variant's output: each prompt's new tokens, the temperature they were drawn at and, from
    draft_verify, what its check replays."""

    tokens: list[list[int]]
    temperature: float
    replay: Replay | None = None


RULE_STEPS, RULE_DRAWS = 4, 500  # the rule's distribution test: draws of the rule at this many verifications
RULE_P_FAIL = 1e-6  # fail below this p-value: a correct rule fails about once in a million cases
MIN_EXPECTED = 20  # chi-square cells expected fewer times are pooled (keeps the tail approximation honest)
# Incremental and cacheless passes round differently, and softmax turns an absolute logit error
# into a relative probability error: float32 gets 10x the usual bound (a stale K/V entry is ~1e-1).
REPLAY_TOLERANCE = {**DTYPE_TOLERANCE, torch.float32: 1e-4}


def check(ref: Decoded, out: Decoded) -> CheckResult:
    """Greedy: each prompt's tokens equal plain decoding's (the error counts mismatched tokens, a
    missing or extra one counting as one). Sampled: lengths, and the rule's distribution test.
    Both: draft_verify's verifications are replayed against recomputation (see :func:`replayed`)."""
    if len(ref.tokens) != len(out.tokens):
        return CheckResult(
            False, None, None, "mismatched_tokens", f"{len(out.tokens)} sequences, expected {len(ref.tokens)}"
        )
    sampled = ref.temperature > 0
    results = [_lengths(ref, out) if sampled else _tokens(ref, out)]
    if out.replay is not None:
        results += replayed(out)
    elif sampled:
        results.append(
            CheckResult(
                False,
                None,
                None,
                "replay",
                "a sampled output without its verifications: its distribution cannot be tested",
            )
        )
    failed = [r for r in results if not r.passed]
    main = failed[0] if failed else results[-1] if sampled else results[0]
    rest = "; ".join(_summary(r) for r in results if r is not main)
    return CheckResult(
        not failed, main.error, main.tolerance, main.metric, "; ".join(x for x in (main.detail, rest) if x)
    )


def _summary(r: CheckResult) -> str:
    if r.error is None:
        return f"{r.metric} {'passed' if r.passed else 'failed'}"
    bound = "exact" if r.tolerance is None else f"{'<=' if r.passed else '>'} {r.tolerance:.3g}"
    return f"{r.metric} {r.error:.3g} ({bound})"


def _lengths(ref: Decoded, out: Decoded) -> CheckResult:
    bad = [i for i, (r, o) in enumerate(zip(ref.tokens, out.tokens)) if len(r) != len(o)]
    return CheckResult(
        not bad,
        float(len(bad)),
        None,
        "wrong_length_sequences",
        f"sequences {bad} have the wrong length" if bad else "",
    )


def _tokens(ref: Decoded, out: Decoded) -> CheckResult:
    mismatched, first = 0, ""
    for i, (r, o) in enumerate(zip(ref.tokens, out.tokens)):
        diff = [j for j, (a, b) in enumerate(itertools.zip_longest(r, o)) if a != b]
        mismatched += len(diff)
        if diff and not first:
            first = f"prompt {i} first differs at token {diff[0]} of {len(r)}"
    return CheckResult(mismatched == 0, float(mismatched), None, "mismatched_tokens", first)


def recomputed(weights: LlamaWeights, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The model's logits after each of ``tokens`` and every layer's K/V ``(layers, n, kv_heads, d)``,
    from one causal pass over the whole sequence: no KV cache, nothing rolled back."""
    ks, vs = [], []

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ks.append(k[0])
        vs.append(v[0])
        return causal_attend(layer, q, k, v)

    device = weights.device
    with torch.inference_mode():
        logits = forward(
            weights, torch.tensor([tokens], device=device), torch.arange(len(tokens), device=device)[None], attend
        )[0]
    return logits, torch.stack(ks), torch.stack(vs)


def _row_errors(reference: torch.Tensor, got: torch.Tensor) -> torch.Tensor:
    """Relative L2 error of each row (first dimension) of ``got``, in float64 on the CPU."""
    ref = reference.detach().double().cpu().flatten(1)
    diff = got.detach().double().cpu().flatten(1) - ref
    return diff.norm(dim=1) / ref.norm(dim=1).clamp(min=1e-300)


def prompt_lookup(context: list[int], k: int, n_max: int, n_min: int) -> list[int]:
    """What prompt lookup proposes, by plain list search: the k tokens after the latest earlier
    occurrence of the longest suffix of n_max down to n_min tokens that leaves one token after it."""
    size = len(context)
    for n in range(min(n_max, size - 1), n_min - 1, -1):
        suffix = context[size - n :]
        for at in range(size - n - 1, -1, -1):
            if context[at : at + n] == suffix:
                return context[at + n : at + n + k]
    return []


def replayed(out: Decoded) -> list[CheckResult]:
    """draft_verify's verifications against what they should have been, recomputed here without
    the code under test: (1) they account for the output token for token; (2) the target logits each
    used equal one cacheless pass over the sequence; (3) each draft is what the drafter should have
    proposed there (the draft model's argmax, or its probabilities q, by a cacheless pass; prompt
    lookup by list search); (4) the drafter's state after the run: the draft model's KV cache holds
    the confirmed tokens it was fed, with the K/V of a cacheless pass (prompt lookup's buffer, the
    context); (5) sampled: the acceptance rule's distribution test (:func:`rule_p_value`)."""
    replay, temperature = out.replay, out.temperature
    assert replay is not None  # called where the run kept its replay
    unaccounted = [
        f"prompt {i}: {why}"
        for i, (g, new) in enumerate(zip(replay.generations, out.tokens))
        if (why := _accounts_for(g, new))
    ]
    if unaccounted or len(replay.generations) != len(out.tokens):
        return [
            CheckResult(
                False,
                float(max(len(unaccounted), 1)),
                None,
                "unaccounted_generations",
                unaccounted[0] if unaccounted else "a generation is missing",
            )
        ]
    tolerance = REPLAY_TOLERANCE.get(replay.target.dtype, 1e-2)
    # q is computed in float32 whatever the model's dtype, and softmax(l / T) divides a logit's
    # rounding error by T.
    q_tolerance = REPLAY_TOLERANCE[torch.float32] / min(1.0, temperature) if temperature > 0 else None
    worst_target, worst_q, unexplained, state = 0.0, 0.0, [], []
    for i, (g, new) in enumerate(zip(replay.generations, out.tokens)):
        seq = g.prompt + new
        target_logits = recomputed(replay.target, seq[:-1])[0]
        # Row j of a verification scores the context plus j drafts: rows up to the accepted ones
        # lie on the output's path (the rule's outcome depended on those only).
        worst_target = max(
            [worst_target]
            + [
                float(_row_errors(target_logits[s.start - 1 : s.start + s.accepted], s.logits[: s.accepted + 1]).max())
                for s in g.steps
            ]
        )
        if isinstance(g.drafter, NgramDrafter):
            unexplained += [
                f"prompt {i} after {s.start} tokens"
                for s in g.steps
                if s.asked and s.drafts != prompt_lookup(seq[: s.start], s.asked, *replay.ngram)
            ]
            state += _ngram_state(g, seq, i)
            continue
        assert replay.draft is not None  # not prompt lookup: a draft model
        draft_logits, k, v = recomputed(replay.draft, seq[:-1])
        if temperature > 0:
            worst_q = max([worst_q] + _draft_q_errors(g, draft_logits, temperature))
        else:
            unexplained += _unexplained_greedy_drafts(g, draft_logits, tolerance, i)
        state += _draft_cache_state(g, k, v, tolerance, i)
    results = [
        CheckResult(
            worst_target <= tolerance,
            worst_target,
            tolerance,
            "target_logits_rel_l2",
            ""
            if worst_target <= tolerance
            else "a verification scored the drafts with target logits other than the model's",
        )
    ]
    if replay.draft is not None and q_tolerance is not None:  # q_tolerance: temperature > 0
        results.append(
            CheckResult(
                worst_q <= q_tolerance,
                worst_q,
                q_tolerance,
                "draft_probs_rel_l2",
                "" if worst_q <= q_tolerance else "the drafts' q differs from the draft model's",
            )
        )
    else:
        results.append(
            CheckResult(
                not unexplained,
                float(len(unexplained)),
                None,
                "unexplained_drafts",
                f"not the drafter's proposal: {', '.join(unexplained[:3])}" if unexplained else "",
            )
        )
    results.append(CheckResult(not state, float(len(state)), None, "drafter_state_mismatches", "; ".join(state[:3])))
    if temperature > 0:
        results.append(_rule_result(replay, temperature))
    return results


def _drafted_rows(g: Generation, draft_logits: torch.Tensor):
    """(verification, rows, the draft model's logits there) for each verification's drafts that
    followed confirmed tokens only (the accepted ones and the first rejected)."""
    for s in g.steps:
        rows = min(s.accepted + 1, len(s.drafts))
        if rows:
            yield s, rows, draft_logits[s.start - 1 : s.start - 1 + rows].double().cpu()


def _draft_q_errors(g: Generation, draft_logits: torch.Tensor, temperature: float) -> list[float]:
    return [
        float(_row_errors(torch.softmax(ref / temperature, dim=-1), s.q[:rows]).max())
        for s, rows, ref in _drafted_rows(g, draft_logits)
    ]


def _unexplained_greedy_drafts(g: Generation, draft_logits: torch.Tensor, tolerance: float, i: int) -> list[str]:
    out = []
    for s, rows, ref in _drafted_rows(g, draft_logits):
        best = ref.max(dim=-1).values
        tie = tolerance * ref.abs().max(dim=-1).values  # rounding may reorder near-ties
        chosen = ref[torch.arange(rows), torch.tensor(s.drafts[:rows])]
        out += [f"prompt {i} draft {j} after {s.start} tokens" for j in range(rows) if chosen[j] < best[j] - tie[j]]
    return out


def _accounts_for(g: Generation, new: list[int]) -> str:
    """Why ``g``'s verifications do not produce ``new`` token for token ("" when they do)."""
    at = len(g.prompt)
    seq = g.prompt + new
    for s in g.steps:
        emitted = s.drafts[: s.accepted] + [s.token]
        if (
            s.start != at
            or seq[at : at + len(emitted)] != emitted
            or len(s.drafts) > s.asked
            or s.logits.shape[0] != len(s.drafts) + 1
            or (s.q is not None and s.q.shape[0] != len(s.drafts))
        ):
            return f"the verification after {s.start} tokens does not produce token {at - len(g.prompt)} on"
        at += len(emitted)
    return "" if at == len(seq) else f"the verifications produce {at - len(g.prompt)} tokens of {len(new)}"


def _draft_cache_state(g: Generation, k: torch.Tensor, v: torch.Tensor, tolerance: float, i: int) -> list[str]:
    """The draft model's cache after the run against recomputation: it holds the confirmed tokens
    of the last verification that drafted, at least those its proposal fed (the context and every
    draft but the last), with the K/V of a cacheless pass over them."""
    assert isinstance(g.drafter, ModelDrafter)  # prompt lookup's state is _ngram_state's
    cache = g.drafter.cache
    last = next((s for s in reversed(g.steps) if s.asked), None)
    low, high = (
        (0, 0) if last is None else (last.start + min(last.accepted, len(last.drafts) - 1), last.start + last.accepted)
    )
    if not low <= cache.length <= high:
        return [
            f"prompt {i}: the draft cache holds {cache.length} tokens, not the {low}"
            + (f" to {high}" if high > low else "")
            + " confirmed ones it was fed"
        ]
    n = cache.length
    errors = torch.maximum(
        _row_errors(k[:, :n].transpose(0, 1), cache.k[:, :n].transpose(0, 1)),
        _row_errors(v[:, :n].transpose(0, 1), cache.v[:, :n].transpose(0, 1)),
    )
    bad = (errors > tolerance).nonzero().flatten().tolist()
    return (
        [
            f"prompt {i}: the draft cache's K/V at position {bad[0]} differ from recomputation "
            f"(relative L2 {float(errors[bad[0]]):.3g})"
        ]
        if bad
        else []
    )


def _ngram_state(g: Generation, seq: list[int], i: int) -> list[str]:
    """Prompt lookup's buffer after the run: the context of its last proposal as int32s."""
    last = next((s for s in reversed(g.steps) if s.asked), None)
    expected = 0 if last is None else last.start
    d = g.drafter
    assert isinstance(d, NgramDrafter)  # called for prompt lookup only
    if d.length != expected or bytes(d.context_bytes) != b"".join(t.to_bytes(4, "little") for t in seq[:expected]):
        return [f"prompt {i}: prompt lookup's buffer ({d.length} tokens) is not the {expected}-token context"]
    return []


def _coin_flip(s: Verification, temperature: float) -> float:
    """a (1 - a), a = sum(min(p, q)) the probability that the rule accepts the first draft; -1
    without drafts."""
    if not s.drafts:
        return -1.0
    p = torch.softmax(s.logits[0].double().cpu() / temperature, dim=-1)
    q = s.q[0].double() if s.q is not None else torch.nn.functional.one_hot(torch.tensor(s.drafts[0]), p.numel())
    a = float(torch.minimum(p, q).sum())
    return a * (1 - a)


def rule_steps(replay: Replay, temperature: float) -> list[Verification]:
    """The RULE_STEPS verifications the rule's distribution test draws at: where the first draft's
    acceptance is nearest a coin flip, both branches of the rule (accept; reject and resample) run
    most often; verifications without drafts (the bonus draw only) come last."""
    steps = sorted((s for g in replay.generations for s in g.steps), key=lambda s: -_coin_flip(s, temperature))
    return steps[:RULE_STEPS]


def _rule_result(replay: Replay, temperature: float) -> CheckResult:
    steps = rule_steps(replay, temperature)
    p, stat, df = rule_p_value(replay.rule, steps, temperature, RULE_DRAWS, replay.seed)
    error = -math.log10(max(p, 1e-300))
    what = (
        f"acceptance rule at {len(steps)} verifications, {RULE_DRAWS} draws each: "
        f"chi-square {stat:.1f} on {df} df, p = {p:.2g} (fails below {RULE_P_FAIL:g})"
    )
    return CheckResult(p >= RULE_P_FAIL, error, -math.log10(RULE_P_FAIL), "rule_chi2_neg_log10_p", what)


def rule_p_value(
    rule: Callable[..., tuple[int, int]], steps: list[Verification], temperature: float, draws: int, seed: int
) -> tuple[float, float, int]:
    """A chi-square test that ``rule`` keeps the target's distribution at these verifications.

    Each draw redraws the drafts (draft i from the verification's q row i; prompt lookup's fixed)
    and calls the rule with the verification's logits and q, every other draw with the first draft
    only (so bonus draws are frequent too). Whatever the rows, if the rule is right,
    the token it emits at row j, among the draws that reach row j, is distributed as
    softmax(logits[j] / T): rows that do not depend on earlier drafts are a valid model too. Returns
    (p-value, statistic, degrees of freedom) of the test summed over every row."""
    g = torch.Generator().manual_seed(seed)
    stat, df = 0.0, 0
    with torch.inference_mode():
        for s in steps:
            logits, k = s.logits.cpu(), len(s.drafts)
            if s.q is not None:
                drafts = (
                    torch.stack(
                        [torch.multinomial(s.q[i], draws, replacement=True, generator=g) for i in range(k)], dim=1
                    ).tolist()
                    if k
                    else [[]] * draws
                )
            else:
                drafts = [s.drafts] * draws
            emitted: list[list[int]] = [[] for _ in range(k + 1)]
            for m, d in enumerate(drafts):
                used = k if m % 2 == 0 else min(k, 1)
                q = s.q[:used] if s.q is not None else None
                n, token = rule(logits[: used + 1], d[:used], q, temperature, g)
                for j in range(n):
                    emitted[j].append(d[j])
                emitted[n].append(token)
            p = torch.softmax(logits.double() / temperature, dim=-1)
            for j, tokens in enumerate(emitted):
                if tokens:
                    counts = torch.bincount(torch.tensor(tokens), minlength=p.shape[-1]).double()
                    row_stat, row_df = _chi_square(counts, p[j] * len(tokens), _cell_order(s, j, p[j]))
                    stat, df = stat + row_stat, df + row_df
    if df == 0:
        return 1.0, stat, df
    half_df, half_stat = (torch.tensor(x / 2, dtype=torch.float64) for x in (df, stat))
    return float(torch.special.gammaincc(half_df, half_stat)), stat, df  # chi-square's survival function


def _cell_order(s: Verification, row: int, p: torch.Tensor) -> torch.Tensor:
    """Tokens in the order their cells are formed: by q / p where the row has a draft (a rule that
    confuses p and q moves mass along that order), then by p."""
    order = p.argsort(descending=True, stable=True)
    if row >= len(s.drafts):
        return order
    q = s.q[row].double() if s.q is not None else torch.nn.functional.one_hot(torch.tensor(s.drafts[row]), p.numel())
    ratio = (q / p)[order].nan_to_num(nan=0.0)  # 0 / 0: neither model has the token
    return order[ratio.argsort(descending=True, stable=True)]


def _chi_square(observed: torch.Tensor, expected: torch.Tensor, order: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom over cells of consecutive tokens in ``order``,
    each expected at least MIN_EXPECTED times (fixed before the counts are looked at)."""
    cell = (expected[order].cumsum(0) / MIN_EXPECTED).floor().long().clamp(max=len(order))
    exp = torch.zeros(int(cell.max()) + 1, dtype=torch.float64).index_add_(0, cell, expected[order])
    obs = torch.zeros_like(exp).index_add_(0, cell, observed[order])
    cells_exp, cells_obs = [0.0], [0.0]
    for e, o in zip(exp.tolist(), obs.tolist()):  # merge cells below the bound into the one before
        if cells_exp[-1] >= MIN_EXPECTED:
            cells_exp.append(0.0)
            cells_obs.append(0.0)
        cells_exp[-1] += e
        cells_obs[-1] += o
    if len(cells_exp) > 1 and cells_exp[-1] < MIN_EXPECTED:
        e, o = cells_exp.pop(), cells_obs.pop()
        cells_exp[-1] += e
        cells_obs[-1] += o
    if len(cells_exp) < 2:  # one cell: nothing to test
        return 0.0, 0
    return sum((o - e) ** 2 / e for o, e in zip(cells_obs, cells_exp)), len(cells_exp) - 1
