"""speculative_decoding: one-line bugs planted in draft_verify fail the run's own check (not an
exception, not only a unit test), and the same case passes as shipped. The drafter bugs leave
greedy output exact (the target decides every token): only the replay of the drafter sees them."""

from __future__ import annotations

from planted import caught, passed, run_planted, shipped
from planted import mutant as _mutant

from gpubench.lib import drafting
from gpubench.optimizations import speculative_decoding as spec
from gpubench.techniques import speculative_decoding as technique

SMALL = {"prompts": 1, "prompt_len": 32, "max_new_tokens": 24, "k": 4}


def _caught_not_as_shipped(monkeypatch, owner, name: str, old: str, new: str, **params):
    """The case as shipped (it must pass), then with ``owner.name`` mutated, wherever the technique
    looks it up (its check must fail it)."""
    assert passed(control := shipped("speculative_decoding", **SMALL, **params)), control.failure
    mutant = _mutant(getattr(owner, name), old, new)
    monkeypatch.setattr(owner, name, mutant)
    if getattr(technique, name, None) is not None:
        monkeypatch.setattr(technique, name, mutant)
    record = run_planted("speculative_decoding", **SMALL, **params)
    assert caught(record), (record.status, record.failure)
    return record.variants["draft_verify"].check


def test_resampling_from_p_instead_of_the_residual_fails_a_sampled_runs_check(monkeypatch):
    """After a rejection the token must come from norm(max(0, p - q)); drawing it from p favours the
    draft's tokens. The sampled run's check draws the rule at the run's own verifications and its
    chi-square test rejects it (before, a sampled run checked lengths only)."""
    check = _caught_not_as_shipped(
        monkeypatch, spec, "residual", "out = (p - q).clamp_(min=0)", "out = p.clone()", temperature=1.0
    )
    assert check["metric"] == "rule_chi2_neg_log10_p" and check["error"] > check["tolerance"], check


def test_a_draft_cache_rollback_that_keeps_one_rejected_draft_fails_a_greedy_runs_check(monkeypatch):
    """A rollback off by one keeps a rejected draft's K/V in the draft model's cache: the tokens stay
    exact, only acceptance drops; the check recomputes the draft cache without it."""
    check = _caught_not_as_shipped(monkeypatch, drafting.ModelDrafter, "rollback", "min(valid, ", "min(valid + 1, ")
    assert "mismatched_tokens 0" in check["detail"], check  # greedy output is still exact
    assert check["metric"] in ("drafter_state_mismatches", "unexplained_drafts"), check


def test_prompt_lookup_indexing_its_buffer_by_bytes_fails_a_greedy_runs_check(monkeypatch):
    """Prompt lookup's buffer holds int32 bytes; skipping what it holds by its length in bytes, not
    tokens, leaves it with the prompt only, and later proposals come from a stale context. The
    output stays exact; the check's own prompt lookup (and the buffer's replay) disagree."""
    check = _caught_not_as_shipped(
        monkeypatch,
        drafting.NgramDrafter,
        "_sync",
        "tokens[self.length :]",
        "tokens[len(self.context_bytes) :]",
        drafter="ngram",
    )
    assert "mismatched_tokens 0" in check["detail"], check
    assert check["metric"] in ("unexplained_drafts", "drafter_state_mismatches"), check


def test_a_target_cache_rollback_one_short_fails_a_sampled_runs_check(monkeypatch):
    """Truncating the target's cache one token short drops the last token's K/V: the next
    verification scores the drafts at shifted positions. A sampled run passed that before (lengths
    only); its check now compares the target logits each verification used with a cacheless pass."""
    check = _caught_not_as_shipped(
        monkeypatch,
        spec,
        "speculative_generate",
        "cache.truncate(base + 1 + n)",
        "cache.truncate(base + n)",
        temperature=1.0,
    )
    assert check["metric"] == "target_logits_rel_l2" and check["error"] > check["tolerance"], check


# Each generation case here takes 30-45 s on 2 loaded cores (the check replays every
# verification): one case per bug, smoke runs each at T 0.6 and 1.5 with both drafters.


def test_draft_probabilities_taken_at_temperature_1_are_caught_at_another_temperature(monkeypatch):
    """The draft model's q computed from softmax(logits), not softmax(logits / T): its drafts and
    the acceptance ratios use the wrong q (the output still follows the target, rejection sampling
    corrects it), so only the replay of the drafter's probabilities sees it, and only where T is not
    1.0 (smoke's only sampled temperature before; a T = 1.0 case passes with the bug)."""
    old, new = "q = probabilities(logits, temperature)", "q = probabilities(logits, 1.0)"
    check = _caught_not_as_shipped(monkeypatch, drafting.ModelDrafter, "propose", old, new, temperature=0.6)
    assert not check["passed"], check
    assert passed(run_planted("speculative_decoding", **SMALL, temperature=1.0))


def test_target_probabilities_taken_at_temperature_1_fail_the_rule_test(monkeypatch):
    """The acceptance rule's p computed from the target's logits at T = 1.0 whatever the run's
    temperature: the tokens follow softmax(logits), not softmax(logits / T). The check's
    distribution test of the rule at the run's own verifications rejects it (T = 1.5, prompt
    lookup, whose q is one-hot: the target's p alone decides)."""
    check = _caught_not_as_shipped(
        monkeypatch,
        spec,
        "verify",
        "p = probabilities(logits, temperature)",
        "p = probabilities(logits, 1.0)",
        temperature=1.5,
        drafter="ngram",
    )
    assert not check["passed"], check
