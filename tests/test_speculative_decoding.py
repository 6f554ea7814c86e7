"""speculative_decoding: greedy output identical to plain decoding, sampled output distributed as
the target's (chi-square), both KV caches rolled back, both drafters and adaptive k behaving as
stated, a default model pair that really agrees, trained deterministically and cached, and the
technique's build / check / metrics (from the timed calls' records) / plots as the harness relies on.
The run's check: its replay of the verifications and the drafter's state fails what was tampered
with and passes a clean run; its test of the acceptance rule rejects wrong rules at the run's own
verifications and is calibrated for a right one."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

from gpubench.baselines.speculative_decoding import generate
from gpubench.contract import Measured, Recorder
from gpubench.errors import BadInput
from gpubench.lib.drafting import ModelDrafter, NgramDrafter, Verification
from gpubench.models import train_small
from gpubench.models.decode_cache import KVCache, probabilities
from gpubench.models.decode_pair import early_layers
from gpubench.models.llama import LlamaConfig, random_weights
from gpubench.optimizations import speculative_decoding as spec
from gpubench.optimizations.speculative_decoding import speculative_generate
from gpubench.reports import figures
from gpubench.techniques import speculative_decoding as technique_module
from gpubench.techniques.speculative_decoding import TECHNIQUE
from gpubench.techniques.speculative_decoding import run_check as speculative_check
from gpubench.techniques.speculative_decoding.figures import predicted_speedup
from gpubench.techniques.speculative_decoding.generation import SpecWorkload
from gpubench.techniques.speculative_decoding.run_check import (
    RULE_DRAWS,
    RULE_P_FAIL,
    Decoded,
    prompt_lookup,
    recomputed,
    rule_p_value,
    rule_steps,
)

CPU = torch.device("cpu")
SMALL = LlamaConfig(
    vocab_size=64, hidden_size=32, num_layers=3, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64
)
# Three tokens: a small vocabulary, so a few thousand draws resolve every 3-token sequence's probability.
VOCAB3 = LlamaConfig(
    vocab_size=3, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8, intermediate_size=32
)


@pytest.fixture(scope="module")
def small():
    return random_weights(SMALL, seed=11)


@pytest.fixture(scope="module")
def pair():
    """The default trained pair (from the user's cache; trained there on the first run, ~30 s)."""
    return train_small.trained_pair()


def prompt_of(seed: int, n: int, vocab: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# -- greedy: token for token ---------------------------------------------------------------------


@pytest.mark.parametrize("draft_kind", ["same", "early", "other"])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_output_equals_plain_decoding_whatever_the_drafts(small, draft_kind, k):
    """Greedy speculative decoding emits exactly plain greedy decoding's tokens, whether the draft
    always agrees (every draft accepted, bonus tokens), sometimes (its first layer) or almost never
    (an unrelated model: a rejection at nearly every step), at every k, for fixed and adaptive k,
    and with the token budget ending inside a verification."""
    draft = {"same": small, "early": early_layers(small, 1), "other": random_weights(SMALL, seed=99)}[draft_kind]
    for i, new in enumerate((1, k + 1, 30)):
        prompt = prompt_of(i, 12, SMALL.vocab_size)
        expected, _ = generate(small, prompt, new)
        for adaptive in (False, True):
            out, stats = speculative_generate(small, ModelDrafter(draft, 80), prompt, new, k, adaptive)
            assert out == expected, (draft_kind, k, new, adaptive)
            assert stats.emitted == new and stats.accepted + stats.verifications == new
    if draft_kind == "same":
        assert stats.accepted == stats.drafted  # the identical draft is always accepted
    if draft_kind == "other":
        assert stats.accepted < stats.drafted / 4


def test_greedy_output_equals_plain_decoding_on_the_trained_pair_with_both_drafters(pair):
    """On the default trained pair and held-out prompts, both drafters (fixed and adaptive k)
    reproduce plain greedy decoding exactly."""
    held = pair.held_out
    for i, start in enumerate((1000, 20000)):
        prompt = held[start : start + 40].tolist()
        expected, _ = generate(pair.target, prompt, 32)
        for drafter, adaptive in itertools.product(("model", "ngram"), (False, True)):
            d = ModelDrafter(pair.draft, 160) if drafter == "model" else NgramDrafter(3, 1)
            out, _ = speculative_generate(pair.target, d, prompt, 32, 4, adaptive)
            assert out == expected, (i, drafter, adaptive)


def test_without_the_target_cache_rollback_the_output_would_differ(small, monkeypatch):
    """The equality above rests on rolling the target's cache back past rejected drafts: with
    truncation disabled, the target attends to rejected tokens' K/V (or overruns its cache) and
    greedy output no longer equals plain decoding's. So the equality tests guard the rollback."""
    prompt = prompt_of(3, 12, SMALL.vocab_size)
    expected, _ = generate(small, prompt, 30)
    monkeypatch.setattr(KVCache, "truncate", lambda self, length: None)
    try:
        out, _ = speculative_generate(small, ModelDrafter(random_weights(SMALL, seed=99), 200), prompt, 30, 3)
    except ValueError as exc:  # the cache overran: also a failure the equality tests would show
        assert "full" in str(exc) or "at least one token" in str(exc)
    else:
        assert out != expected


# -- the KV cache -------------------------------------------------------------------------------


def test_kv_cache_truncate_then_forward_equals_a_fresh_cache(small):
    """Rolling the cache back and feeding other tokens gives the logits a cache that never saw
    the discarded tokens gives: truncation really forgets them."""
    prompt = prompt_of(5, 20, SMALL.vocab_size)
    with torch.inference_mode():
        cache = KVCache(small, 40)
        cache.forward(prompt)
        cache.forward([1, 2, 3, 4, 5], all_logits=True)  # drafts, then rejected
        cache.truncate(len(prompt) + 1)
        rolled = cache.forward([7, 8], all_logits=True)
        fresh = KVCache(small, 40)
        fresh.forward(prompt + [1])
        expected = fresh.forward([7, 8], all_logits=True)
    assert cache.length == fresh.length == len(prompt) + 3
    torch.testing.assert_close(rolled, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        cache.truncate(cache.length + 1)
    with pytest.raises(ValueError, match="full"):
        cache.forward(list(range(40)))


def test_model_drafter_rolls_back_to_the_accepted_prefix(small):
    """After a proposal, rollback(valid) leaves exactly the confirmed tokens' K/V in the draft's
    cache, so the next proposal only feeds what the cache has not seen."""
    drafter = ModelDrafter(small, 64)
    tokens = prompt_of(6, 10, SMALL.vocab_size)
    drafts, q = drafter.propose(tokens, 4, 0.0, None)
    assert len(drafts) == 4 and q is None
    assert drafter.cache.length == len(tokens) + 3  # the last draft is never fed
    drafter.rollback(len(tokens) + 1)  # one draft accepted
    assert drafter.cache.length == len(tokens) + 1
    again, _ = drafter.propose(tokens + drafts[:1] + [5], 2, 0.0, None)
    fresh, _ = ModelDrafter(small, 64).propose(tokens + drafts[:1] + [5], 2, 0.0, None)
    assert again == fresh


# -- sampling: the target's distribution --------------------------------------------------------


def chi_square_p(observed: dict[tuple, int], expected_prob: dict[tuple, float], draws: int) -> float:
    """Pearson's chi-square test of observed counts against probabilities; cells expected fewer
    than 5 times are pooled. Returns the p-value (survival function of chi-square, df = cells - 1)."""
    cells, pooled_obs, pooled_exp = [], 0, 0.0
    for key, p in expected_prob.items():
        e = p * draws
        if e < 5:
            pooled_obs += observed.get(key, 0)
            pooled_exp += e
        else:
            cells.append((observed.get(key, 0), e))
    if pooled_exp > 0:
        cells.append((pooled_obs, pooled_exp))
    stat = sum((o - e) ** 2 / e for o, e in cells)
    df = len(cells) - 1
    return float(
        torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64))
    )


def sequence_probs(target, prompt: list[int], length: int, temperature: float) -> dict[tuple, float]:
    """Exact probability of every ``length``-token continuation under the target at this temperature."""
    vocab = target.config.vocab_size
    probs = {}
    with torch.inference_mode():
        for seq in itertools.product(range(vocab), repeat=length):
            cache = KVCache(target, len(prompt) + length)
            logits = cache.forward(prompt + list(seq[:-1]), all_logits=True)[len(prompt) - 1 :]
            p = torch.softmax(logits.double() / temperature, dim=-1)
            probs[seq] = math.prod(float(p[i, t]) for i, t in enumerate(seq))
    return probs


def draw(target, make_drafter, prompt, length, k, temperature, draws, seed, adaptive=False):
    g = torch.Generator().manual_seed(seed)
    counts: dict[tuple, int] = {}
    for _ in range(draws):
        out, _ = speculative_generate(target, make_drafter(), prompt, length, k, adaptive, temperature, g)
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
    return counts


@pytest.fixture(scope="module")
def vocab3():
    target = random_weights(VOCAB3, seed=1)
    draft = random_weights(VOCAB3, seed=2)
    prompt = [0, 1, 2, 2, 1, 0, 1]
    return target, draft, prompt, sequence_probs(target, prompt, 3, 2.0)


def test_sampled_tokens_follow_the_targets_distribution_with_a_draft_model(vocab3):
    """Chi-square over 1000 three-token continuations (27 outcomes; every path: rejection and
    resampling at each position, all accepted plus the bonus): speculative sampling with a
    different draft model matches the target's exact distribution, not the draft's."""
    target, draft, prompt, probs = vocab3
    draws = 1000
    counts = draw(target, lambda: ModelDrafter(draft, 16), prompt, 3, 2, 2.0, draws, seed=1)
    assert chi_square_p(counts, probs, draws) > 1e-3
    draft_probs = sequence_probs(draft, prompt, 3, 2.0)
    assert chi_square_p(counts, draft_probs, draws) < 1e-6  # the test can tell the two apart


def test_sampled_tokens_follow_the_targets_distribution_with_prompt_lookup_and_adaptive_k(vocab3):
    """The same for the deterministic n-gram drafter (one-hot q: accept with probability p(x),
    resample from p without x) with adaptive k."""
    target, _, prompt, probs = vocab3
    draws = 800
    counts = draw(target, lambda: NgramDrafter(2, 1), prompt, 3, 2, 2.0, draws, seed=1, adaptive=True)
    assert chi_square_p(counts, probs, draws) > 1e-3


def test_the_chi_square_test_catches_a_sampler_that_skips_the_rejection_rule(vocab3, monkeypatch):
    """A sampler that accepts every draft (no rejection rule) yields the draft's distribution,
    and the test rejects it: the tests above would fail if the rule broke."""
    target, draft, prompt, probs = vocab3

    def accept_all(logits, drafts, q, temperature, generator):
        p = torch.softmax(logits.float() / temperature, dim=-1)
        return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator))

    monkeypatch.setattr(spec, "verify", accept_all)
    draws = 400
    counts = draw(target, lambda: ModelDrafter(draft, 16), prompt, 3, 2, 2.0, draws, seed=2)
    assert chi_square_p(counts, probs, draws) < 1e-4


def test_verify_resamples_from_the_residual_at_the_first_rejection():
    """The acceptance rule alone, drafts drawn from q: the token it emits at the first position is
    distributed as p (chi-square), the bonus row is used only when every draft is accepted, and
    greedy accepts exactly the prefix that matches the target's argmax."""
    g = torch.Generator().manual_seed(3)
    logits = torch.tensor([[2.0, 0.5, -1.0, 0.0], [0.0, 1.0, 0.0, -2.0]])
    q = torch.softmax(torch.tensor([[-1.0, 2.0, 0.5, 0.0]]), dim=-1)
    p0 = torch.softmax(logits[0], dim=-1)
    counts: dict[tuple, int] = {}
    draws = 4000
    for _ in range(draws):
        d = int(torch.multinomial(q[0], 1, generator=g))
        n, nxt = spec.verify(logits, [d], q, 1.0, g)
        first = d if n == 1 else nxt
        counts[(first,)] = counts.get((first,), 0) + 1
    assert chi_square_p(counts, {(t,): float(p0[t]) for t in range(4)}, draws) > 1e-3
    assert spec.verify(logits, [0], None, 0.0, None) == (1, 1)  # argmax 0 matches; bonus is row 1's argmax
    assert spec.verify(logits, [2], None, 0.0, None) == (0, 0)  # mismatch: the target's argmax instead


# -- drafters and adaptive k --------------------------------------------------------------------


def test_ngram_drafter_proposes_what_followed_the_latest_longest_match():
    """Prompt lookup: the longest suffix (n_max down to n_min) that occurred before, its latest
    occurrence, the k tokens after it; nothing when there is no match; token ids above 255 are
    matched whole (never inside another token's bytes)."""
    d = NgramDrafter(3, 1)
    tokens = [5, 6, 7, 1, 5, 6, 7, 2, 9, 5, 6, 7]
    assert d.propose(tokens, 2, 0.0, None) == ([2, 9], None)  # latest "5 6 7" is followed by 2, 9
    assert NgramDrafter(3, 1).propose([1, 2, 3, 4], 3, 0.0, None) == ([], None)
    assert NgramDrafter(1, 1).propose([4, 8, 9, 4], 5, 0.0, None) == ([8, 9, 4], None)
    big = [256 * 3, 1, 300, 2, 300]  # 768's and 300's bytes overlap at a misaligned offset
    assert NgramDrafter(1, 1).propose(big, 2, 0.0, None) == ([2, 300], None)
    assert NgramDrafter(3, 2).propose([1, 2, 9, 1, 3, 2], 2, 0.0, None) == ([], None)  # only n=1 would match


def test_adaptive_k_grows_when_all_accepted_and_shrinks_otherwise(small):
    """With a draft identical to the target every draft is accepted and k climbs to 2k; with an
    unrelated draft nearly every step rejects and k falls to 1."""
    prompt = prompt_of(8, 12, SMALL.vocab_size)
    _, agree = speculative_generate(small, ModelDrafter(small, 120), prompt, 60, 2, adaptive=True)
    assert agree.k_used[:4] == [2, 3, 4, 4] and max(agree.k_used) == 4
    other = random_weights(SMALL, seed=99)
    _, disagree = speculative_generate(small, ModelDrafter(other, 120), prompt, 60, 4, adaptive=True)
    asked = [k for k in disagree.k_used if k]  # 0: the last token needs no drafts
    assert asked[0] == 4 and min(asked) == 1 and asked[-10:].count(1) >= 6
    _, fixed = speculative_generate(small, ModelDrafter(other, 120), prompt, 60, 4, adaptive=False)
    assert set(fixed.k_used[:-4]) == {4}


# -- the model pair -----------------------------------------------------------------------------


def test_default_pair_really_agrees_unlike_untrained_models(pair):
    """The default pair's agreement is learned, not configured: greedy acceptance on held-out
    prompts is well above that of the same draft architecture untrained."""
    untrained = train_small.init_weights(train_small.DRAFT_CONFIG, seed=5)
    trained, random = spec.SpecStats(), spec.SpecStats()
    for start in (3000, 9000, 15000, 27000):
        prompt = pair.held_out[start : start + 48].tolist()
        trained.add(speculative_generate(pair.target, ModelDrafter(pair.draft, 200), prompt, 48, 4)[1])
        random.add(speculative_generate(pair.target, ModelDrafter(untrained, 200), prompt, 48, 4)[1])
    assert trained.accepted / trained.drafted > 0.35
    assert random.accepted / random.drafted < 0.1
    assert pair.info["target_held_out_loss"] < 2.2 and pair.info["draft_held_out_loss"] < 2.6  # ln 256 = 5.5


MINI_T = LlamaConfig(
    vocab_size=256, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64
)
MINI_D = LlamaConfig(
    vocab_size=256, hidden_size=16, num_layers=1, num_heads=1, num_kv_heads=1, head_dim=16, intermediate_size=32
)
MINI = dict(
    target_config=MINI_T,
    draft_config=MINI_D,
    target_recipe=train_small.Recipe(steps=4, batch=4, seq_len=32),
    draft_recipe=train_small.Recipe(steps=3, batch=4, seq_len=32, seed=3),
)


def test_training_is_deterministic_and_cached_and_a_corrupt_cache_is_rebuilt(tmp_path, monkeypatch):
    """Two trainings from the same recipe give bit-identical weights; the first build is cached on
    disk and reloaded as is; a corrupt or mismatched cache file is rebuilt, not trusted."""
    monkeypatch.setattr(train_small, "_MEMO", {})
    first = train_small.trained_pair(tmp_path / "a", **MINI)
    assert not first.info["from_cache"]
    monkeypatch.setattr(train_small, "_MEMO", {})
    second = train_small.trained_pair(tmp_path / "b", **MINI)
    for x, y in zip(
        first.target.parameters() + first.draft.parameters(), second.target.parameters() + second.draft.parameters()
    ):
        assert torch.equal(x, y)
    monkeypatch.setattr(train_small, "_MEMO", {})
    cached = train_small.trained_pair(tmp_path / "a", **MINI)
    assert cached.info["from_cache"] and torch.equal(cached.target.lm_head, first.target.lm_head)
    path = tmp_path / "a" / "spec_pair" / f"{first.info['key']}.pt"
    for junk in (b"not a torch file", None):
        if junk is None:  # a valid file whose tensors do not fit the config
            state = torch.load(path, weights_only=True)
            state["target"]["embed"] = torch.zeros(3, 3)
            torch.save(state, path)
        else:
            path.write_bytes(junk)
        monkeypatch.setattr(train_small, "_MEMO", {})
        rebuilt = train_small.trained_pair(tmp_path / "a", **MINI)
        assert not rebuilt.info["from_cache"] and rebuilt.info["rebuilt_because"]
        assert torch.equal(rebuilt.target.embed, first.target.embed)
    assert train_small.trained_pair(tmp_path / "a", **MINI) is rebuilt  # memoized within the process


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    """GPUBENCH_CACHE_DIR moves the cache; without it, ~/.cache/gpubench."""
    monkeypatch.setenv("GPUBENCH_CACHE_DIR", str(tmp_path))
    assert train_small.cache_dir() == tmp_path
    monkeypatch.delenv("GPUBENCH_CACHE_DIR")
    assert train_small.cache_dir().parts[-2:] == (".cache", "gpubench")


# -- the technique ------------------------------------------------------------------------------


def make_workload(seed: int = 0, **overrides):
    params = {**TECHNIQUE.defaults(), "prompts": 1, "prompt_len": 32, "max_new_tokens": 24, **overrides}
    assert TECHNIQUE.validate_fn(params) == []
    return TECHNIQUE.build_fn(params, CPU, seed)


def run_case(w):
    """Both roles' variants once, each with its own recorder: (outputs, records, the check)."""
    recorders = (Recorder(), Recorder())
    base, out = (TECHNIQUE.playing(role, CPU).call(w, rec) for role, rec in zip(("baseline", "optimized"), recorders))
    return (base, out), tuple(rec.values for rec in recorders), TECHNIQUE.check_fn(base, out)


def test_plain_plays_baseline_and_draft_verify_optimized():
    assert TECHNIQUE.playing("baseline", CPU).name == "plain"
    assert TECHNIQUE.playing("optimized", CPU).name == "draft_verify"


@pytest.mark.parametrize(
    "overrides",
    [{}, {"drafter": "ngram", "adaptive_k": True}, {"draft": "early:2", "k": 2}],
    ids=["draft_model", "ngram_adaptive", "early_layers"],
)
def test_technique_greedy_passes_its_check_and_reports_vllm_metrics(overrides):
    """Each drafter passes the exact check on seeded held-out prompts; metrics carry acceptance
    rate, mean accepted length, tokens/s, the measured c and verification cost, and Leviathan's
    predicted speedup computed from them."""
    w = make_workload(**overrides)
    assert w.prompts and all(len(p) == 32 for p in w.prompts)
    (base, out), (base_rec, out_rec), result = run_case(w)
    assert result.passed and result.error == 0.0 and result.metric == "mismatched_tokens"
    # the harness derives metrics baseline first: plain's timed call gives the target step
    mb = TECHNIQUE.metrics_fn(w, Measured("plain", [0.2], 0.2, base, CPU, records=[base_rec]))
    assert mb["predicted_speedup"] == 1.0 and mb["target_forwards_per_token"] == 1.0
    m = TECHNIQUE.metrics_fn(w, Measured("draft_verify", [0.1], 0.1, out, CPU, records=[out_rec]))
    for key in (
        "acceptance_rate",
        "mean_accepted_length",
        "tokens_per_s",
        "c",
        "verify_cost",
        "predicted_speedup",
        "predicted_speedup_with_verify_cost",
        "per_position_acceptance",
        "k_mean",
    ):
        assert key in m, key
    assert m["tokens_per_s"] == pytest.approx(24 / 0.1)
    if m["acceptance_rate"] is not None:
        assert m["predicted_speedup"] == pytest.approx(predicted_speedup(m["acceptance_rate"], m["k_mean"], m["c"]))
        assert m["predicted_speedup_from_accepted_length"] == pytest.approx(
            m["mean_accepted_length"] / (m["k_mean"] * m["c"] + m["verify_cost"])
        )
    assert 1.0 <= m["mean_accepted_length"] <= w.params["k"] * (2 if w.params["adaptive_k"] else 1) + 1


def _record(draft_s, verify_s):
    return {
        "drafted": 8,
        "accepted": 6,
        "verifications": 3,
        "emitted": 9,
        "target_forwards": 4,
        "draft_s": draft_s,
        "verify_s": verify_s,
        "accepted_at": [3, 2, 1],
        "drafted_at": [3, 3, 2],
    }


def test_metrics_come_from_the_timed_calls_records_only(small):
    """Counts are summed over the timed calls' records, times are their medians; the checked
    call's output is not read (None here), and the target step is the workload's typed field."""
    params = {**TECHNIQUE.defaults(), "prompts": 1, "max_new_tokens": 9}
    w = SpecWorkload(
        params=params, device=CPU, seed=0, target=small, draft=small, prompts=[[1, 2, 3]], target_step_s=0.01
    )
    records = [_record(0.02, 0.03), _record(0.08, 0.09), _record(0.04, 0.06)]
    m = TECHNIQUE.metrics_fn(w, Measured("draft_verify", [0.1, 0.3, 0.2], 0.2, None, CPU, records=records))
    assert m["acceptance_rate"] == pytest.approx(6 / 8) and m["mean_accepted_length"] == pytest.approx(3.0)
    assert m["k_mean"] == pytest.approx(8 / 3) and m["drafted_tokens"] == pytest.approx(8)
    assert m["per_position_acceptance"] == pytest.approx([1.0, 2 / 3, 0.5])
    assert m["c"] == pytest.approx(0.04 / 8 / 0.01)  # median draft_s per drafted token, in target steps
    assert m["verify_cost"] == pytest.approx(0.06 / 3 / 0.01)  # median verify_s per verification
    assert m["target_step_s"] == 0.01 and m["target_forwards_per_token"] == pytest.approx(4 / 9)
    assert m["predicted_speedup"] == pytest.approx(predicted_speedup(0.75, 8 / 3, 0.5))
    assert m["predicted_speedup_with_verify_cost"] == pytest.approx(predicted_speedup(0.75, 8 / 3, 0.5, 2.0))


def test_the_target_step_is_plains_decode_phase_in_its_timed_calls_and_metrics_time_nothing(small, monkeypatch):
    """c and verify_cost are in units of one plain decode step, read from what plain's timed calls
    recorded (decode phase over decode steps, median over the calls); metrics call no model."""
    params = {**TECHNIQUE.defaults(), "prompts": 1, "max_new_tokens": 9}
    w = SpecWorkload(params=params, device=CPU, seed=0, target=small, draft=small, prompts=[[1, 2, 3]])
    rec = Recorder()
    TECHNIQUE.variants["plain"].call(w, rec)
    assert rec.values["decode_steps"] == 8 and rec.values["decode_s"] > 0
    monkeypatch.setattr(technique_module, "generate", None)  # a metric that decoded would raise
    plain = [{"target_forwards": 9, "decode_s": s, "decode_steps": 8} for s in (0.08, 0.16, 0.24)]
    mb = TECHNIQUE.metrics_fn(w, Measured("plain", [0.2] * 3, 0.2, None, CPU, records=plain))
    assert mb["predicted_speedup"] == 1.0 and w.target_step_s == pytest.approx(0.02)
    m = TECHNIQUE.metrics_fn(w, Measured("draft_verify", [0.2], 0.2, None, CPU, records=[_record(0.04, 0.06)]))
    assert m["target_step_s"] == pytest.approx(0.02) and m["c"] == pytest.approx(0.04 / 8 / 0.02)


def test_prompts_are_seeded_and_come_from_the_held_out_text():
    """The same seed draws the same prompts; another seed others; all from the held-out bytes."""
    a, b, c = make_workload(seed=1), make_workload(seed=1), make_workload(seed=2)
    assert a.prompts == b.prompts and a.prompts != c.prompts
    held = bytes(train_small.trained_pair().held_out.tolist())
    assert bytes(a.prompts[0]) in held


def test_greedy_check_counts_mismatches_and_a_sampled_check_needs_lengths_and_the_replay():
    """The check fails on a real greedy divergence, counting mismatched (and missing) tokens and
    naming the first; a sampled output fails on a wrong length, and without the verifications its
    distribution cannot be tested, so it fails too; a real sampled run passes."""
    ref = Decoded([[1, 2, 3, 4], [5, 6]], 0.0)
    bad = TECHNIQUE.check_fn(ref, Decoded([[1, 2, 9, 9], [5]], 0.0))
    assert not bad.passed and bad.error == 3.0 and "prompt 0 first differs at token 2" in bad.detail
    short = TECHNIQUE.check_fn(ref, Decoded([[1, 2, 3, 4], [5]], 0.0))
    assert not short.passed and short.error == 1.0 and "prompt 1 first differs at token 1" in short.detail
    assert TECHNIQUE.check_fn(ref, Decoded([[1, 2, 3, 4], [5, 6]], 0.0)).passed
    sref = Decoded([[1, 2, 3]], 1.0)
    assert not TECHNIQUE.check_fn(sref, Decoded([[3, 3]], 1.0)).passed
    blind = TECHNIQUE.check_fn(sref, Decoded([[3, 3, 1]], 1.0))
    assert not blind.passed and blind.metric == "replay"
    w = make_workload(temperature=1.0, drafter="ngram")
    assert run_case(w)[2].passed


# -- the run's check: replay of the verifications, the rule's distribution test -----------------


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"temperature": 1.0},
        {"drafter": "ngram"},
        {"drafter": "ngram", "temperature": 1.0, "adaptive_k": True},
        {"draft": "early:2", "temperature": 0.5, "dtype": "float64"},
    ],
    ids=["greedy", "sampled", "ngram_greedy", "ngram_sampled_adaptive", "early_sampled_float64"],
)
def test_check_replays_a_clean_run_within_its_bounds(overrides):
    """On a clean run every part of the check passes, with its figure reported: the target's logits
    and the draft's q within the replay tolerance of a cacheless pass, every draft explained, the
    drafter's state as recomputed; sampled, the rule's p-value above the failure bound."""
    (_, out), _, result = run_case(make_workload(**overrides))
    assert result.passed, result
    assert "target_logits_rel_l2" in result.detail and "drafter_state_mismatches 0" in result.detail
    if out.temperature > 0:
        assert result.metric == "rule_chi2_neg_log10_p" and result.error <= result.tolerance == 6.0
        assert "p = " in result.detail
    else:
        assert result.metric == "mismatched_tokens" and "unexplained_drafts 0" in result.detail


def _rejecting_step(out):
    """A verification that rejected a draft (the drafter's proposal there is checked)."""
    return next((g, j) for g in out.replay.generations for j, s in enumerate(g.steps) if s.accepted < len(s.drafts))


def _stale_draft_kv(out):
    out.replay.generations[0].drafter.cache.k[0, 3] += 1.0


def _draft_cache_one_longer(out):
    out.replay.generations[0].drafter.cache.length += 1


def _other_target_logits(out):
    steps = out.replay.generations[0].steps
    steps[1] = dataclasses.replace(steps[1], logits=steps[1].logits * 1.1)


def _other_draft_q(out):
    steps = out.replay.generations[0].steps
    steps[0] = dataclasses.replace(steps[0], q=steps[0].q.roll(1, dims=-1))


def _not_the_drafts_argmax(out):
    g, j = _rejecting_step(out)
    s = g.steps[j]
    drafts = list(s.drafts)
    drafts[s.accepted] = next(t for t in range(256) if t not in (s.drafts[s.accepted], s.token))
    g.steps[j] = dataclasses.replace(s, drafts=drafts)


def _token_no_verification_produced(out):
    out.tokens[0][5] = (out.tokens[0][5] + 1) % 256


def _ngram_buffer_byte(out):
    out.replay.generations[0].drafter.context_bytes[0] ^= 1


@pytest.mark.parametrize(
    "overrides,tamper,metric",
    [
        ({}, _stale_draft_kv, "drafter_state_mismatches"),
        ({}, _draft_cache_one_longer, "drafter_state_mismatches"),
        ({}, _not_the_drafts_argmax, "unexplained_drafts"),
        ({"temperature": 1.0}, _other_target_logits, "target_logits_rel_l2"),
        ({"temperature": 1.0}, _other_draft_q, "draft_probs_rel_l2"),
        ({"temperature": 1.0}, _token_no_verification_produced, "unaccounted_generations"),
        ({"drafter": "ngram"}, _ngram_buffer_byte, "drafter_state_mismatches"),
    ],
    ids=lambda x: getattr(x, "__name__", "").strip("_") or None,
)
def test_check_fails_a_run_whose_replay_was_tampered_with(overrides, tamper, metric):
    """Each part of the replay fails what it guards, in a greedy run whose tokens are still exact or
    a sampled run: a stale or extra entry in the draft cache, a draft the draft model would not have
    proposed, logits or q other than the models', output tokens no verification produced, a byte
    of prompt lookup's buffer."""
    w = make_workload(**overrides)
    base = TECHNIQUE.playing("baseline", CPU).call(w, Recorder())
    out = TECHNIQUE.playing("optimized", CPU).call(w, Recorder())
    assert TECHNIQUE.check_fn(base, out).passed
    tamper(out)
    result = TECHNIQUE.check_fn(base, out)
    assert not result.passed and result.metric == metric, result


def test_the_checks_cacheless_recomputation_equals_the_kv_caches_logits_and_kv(small):
    """The replay's reference agrees with a right incremental decode: logits and every layer's K/V
    of one causal pass equal those of a KV cache fed a prefill and then one token at a time."""
    tokens = prompt_of(12, 24, SMALL.vocab_size)
    logits, k, v = recomputed(small, tokens)
    with torch.inference_mode():
        cache = KVCache(small, 32)
        rows = [cache.forward(tokens[:10], all_logits=True)] + [cache.forward([t]) for t in tokens[10:]]
    torch.testing.assert_close(torch.cat(rows), logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache.k[:, :24], k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache.v[:, :24], v, rtol=1e-5, atol=1e-5)


def test_the_checks_prompt_lookup_agrees_with_the_ngram_drafter():
    """The check's list search proposes what NgramDrafter's byte search does, on random contexts
    with many repeats and token ids above 255, for every n range and k."""
    g = torch.Generator().manual_seed(4)
    for trial in range(300):
        vocab = (3, 5, 700)[trial % 3]
        context = torch.randint(0, vocab, (int(torch.randint(1, 30, (1,), generator=g)),), generator=g).tolist()
        n_max = 1 + trial % 4
        n_min = 1 + (trial // 4) % n_max
        k = 1 + trial % 5
        assert NgramDrafter(n_max, n_min).propose(context, k, 0.0, None)[0] == prompt_lookup(context, k, n_max, n_min)


def _rule(accept=lambda u, p, q: u * q < p, residual=spec.residual, bonus_row=lambda k: k):
    """An acceptance rule written out, with one part swappable for a wrong one."""

    def rule(logits, drafts, q, temperature, generator):
        p = probabilities(logits, temperature)
        n = 0
        while n < len(drafts):
            p_tok, q_tok = float(p[n, drafts[n]]), float(q[n, drafts[n]]) if q is not None else 1.0
            if not accept(float(torch.rand(1, generator=generator)), p_tok, q_tok):
                break
            n += 1
        if n == len(drafts):
            return n, int(torch.multinomial(p[bonus_row(n)], 1, generator=generator))
        rest = residual(p[n], q[n] if q is not None else None, drafts[n])
        return n, int(torch.multinomial(rest, 1, generator=generator))

    return rule


def _one_hot(draft, like):
    return torch.nn.functional.one_hot(torch.tensor(draft), like.numel()).to(like.dtype)


WRONG_RULES = {
    "resample_from_p": _rule(residual=lambda p, q, d: p),
    "resample_from_q_minus_p": _rule(residual=lambda p, q, d: ((_one_hot(d, p) if q is None else q) - p).clamp(min=0)),
    "accept_every_draft": _rule(accept=lambda u, p, q: True),
    "accept_with_q_over_p": _rule(accept=lambda u, p, q: u * p < q),
    "bonus_from_the_last_drafts_row": _rule(bonus_row=lambda k: max(k - 1, 0)),
}


@pytest.mark.parametrize("drafter", ["draft_model", "ngram"])
def test_the_rule_test_rejects_wrong_rules_at_the_runs_own_verifications(drafter):
    """Power: at the verifications a sampled run's check picks (the trained pair, T = 1), each wrong
    rule gets a p-value below the failure bound, and the same rule written out right (and the
    shipped one) well above it. Prompt lookup's bonus rows often agree (runs of spaces in source
    text), so a bonus drawn from the row before is not resolved there."""
    out = run_case(make_workload(temperature=1.0, drafter=drafter))[0][1]
    steps = rule_steps(out.replay, 1.0)
    assert len(steps) == speculative_check.RULE_STEPS
    for rule in (spec.verify, _rule()):
        assert rule_p_value(rule, steps, 1.0, RULE_DRAWS, seed=1)[0] > 1e-3
    for name, rule in WRONG_RULES.items():
        if drafter == "ngram" and name == "bonus_from_the_last_drafts_row":
            continue
        p, stat, df = rule_p_value(rule, steps, 1.0, RULE_DRAWS, seed=1)
        assert p < RULE_P_FAIL, (name, p, stat, df)


def test_the_rule_tests_p_values_are_uniform_for_a_right_rule():
    """False failures: for the shipped rule at random rows (6 tokens, 2 drafts), the p-values spread
    as a uniform's do (about a tenth below 0.1) and none comes near the failure bound, so the
    bound's 1e-6 is the rate at which a right rule fails a run."""
    g = torch.Generator().manual_seed(0)
    pvalues = []
    for rep in range(60):
        logits = 1.5 * torch.randn(3, 6, generator=g)
        q = torch.softmax(1.5 * torch.randn(2, 6, generator=g), dim=-1)
        step = Verification(start=1, asked=2, drafts=[0, 0], q=q, logits=logits, accepted=0, token=0)
        pvalues.append(rule_p_value(spec.verify, [step], 1.0, 200, seed=rep)[0])
    assert 1 <= sum(p < 0.1 for p in pvalues) <= 14 and sum(p > 0.9 for p in pvalues) <= 14
    assert min(pvalues) > 1e-4


def test_validate_names_bad_combinations(tmp_path):
    """Cross-parameter problems are reported before anything runs."""
    base = TECHNIQUE.defaults()
    assert TECHNIQUE.validate_fn({**base, "ngram_min": 3, "ngram_max": 2})
    assert any("early" in p for p in TECHNIQUE.validate_fn({**base, "draft": "early:6"}))
    assert TECHNIQUE.validate_fn({**base, "draft": "early:x"})
    assert TECHNIQUE.validate_fn({**base, "target": str(tmp_path)})  # no config.json there
    (tmp_path / "config.json").write_text('{"num_hidden_layers": 2}')
    assert any("pairs only" in p for p in TECHNIQUE.validate_fn({**base, "target": str(tmp_path)}))
    assert TECHNIQUE.validate_fn({**base, "target": str(tmp_path), "drafter": "ngram"}) == []
    assert TECHNIQUE.validate_fn({**base, "draft": "early:3"}) == []


def test_predicted_speedup_is_leviathans_formula():
    """(1 - a^(k+1)) / ((1 - a)(k c + 1)), with its limits at a = 0 and a = 1 and a verification
    cost in place of the 1."""
    assert predicted_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / (0.2 * 1.4))
    assert predicted_speedup(0.0, 3, 0.2) == pytest.approx(1 / 1.6)
    assert predicted_speedup(1.0, 3, 0.0) == pytest.approx(4.0)
    assert predicted_speedup(0.5, 2, 0.0, verify_cost=2.0) == pytest.approx(1.75 / 2)


def test_hf_checkpoints_as_target_and_draft(tmp_path):
    """Local Hugging Face checkpoints stand in for both models (no tokenizer there: byte prompts),
    greedy still exact; a draft with another vocabulary is refused."""
    transformers = pytest.importorskip("transformers")

    def save(path, layers, vocab=256):
        cfg = transformers.LlamaConfig(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=layers,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=512,
            tie_word_embeddings=False,
        )
        torch.manual_seed(layers + vocab)
        transformers.LlamaForCausalLM(cfg).save_pretrained(path)
        return str(path)

    target, draft = save(tmp_path / "t", 2), save(tmp_path / "d", 1)
    w = make_workload(target=target, draft=draft, max_new_tokens=12)
    assert run_case(w)[2].passed
    w = make_workload(target=target, draft="early:1", max_new_tokens=12)
    assert run_case(w)[2].passed
    other = save(tmp_path / "o", 1, vocab=300)
    with pytest.raises(BadInput, match="vocabulary"):
        make_workload(target=target, draft=other)


def _case(drafter, k, ratio, predicted, rate, tps):
    metrics = {
        "predicted_speedup": predicted,
        "predicted_speedup_with_verify_cost": predicted * 0.8,
        "acceptance_rate": rate,
        "mean_accepted_length": 1 + rate * k,
        "tokens_per_s": tps,
    }
    return {
        "technique": "speculative_decoding",
        "params": {**TECHNIQUE.defaults(), "drafter": drafter, "k": k},
        "variants": {
            "plain": {"role": "baseline", "metrics": {"tokens_per_s": 100.0, "predicted_speedup": 1.0}},
            "draft_verify": {"role": "optimized", "metrics": metrics},
        },
        "speedups": {"draft_verify": {"ratio": ratio, "ci_low": ratio * 0.9, "ci_high": ratio * 1.1}},
    }


def _drawn(cases):
    return [(plot.title, fig) for plot in TECHNIQUE.plots for fig in [figures.declared(plot, cases)] if fig is not None]


def _lines(fig):
    return {
        line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
        for ax in fig.axes
        for line in ax.get_lines()
        if not line.get_label().startswith("_")
    }


def test_plots_show_speedup_acceptance_and_tokens_per_s_against_k_per_drafter():
    """Against k, a line per drafter: measured speedup beside both predictions on one axis,
    acceptance rate, mean accepted length, and both variants' tokens/s; nothing without data."""
    cases = [_case("draft_model", k, 1 + 0.1 * k, 1.2, 0.5, 120.0) for k in (2, 4)]
    cases += [_case("ngram", k, 1.5, 1.6, 0.4, 150.0) for k in (2, 4)]
    made = dict(_drawn(cases))
    assert list(made) == [
        "Measured and predicted speedup against k",
        "Acceptance rate against k",
        "Mean accepted length against k",
        "Tokens/s against k",
    ]
    speedup = _lines(made["Measured and predicted speedup against k"])
    assert set(speedup) == {
        f"draft_verify {y} (drafter={d})"
        for d in ("draft_model", "ngram")
        for y in ("speedup", "predicted_speedup", "predicted_speedup_with_verify_cost")
    }
    assert speedup["draft_verify speedup (drafter=draft_model)"] == ([2, 4], [pytest.approx(1.2), pytest.approx(1.4)])
    assert speedup["draft_verify predicted_speedup (drafter=ngram)"] == ([2, 4], [1.6, 1.6])
    assert _lines(made["Acceptance rate against k"])["draft_verify (drafter=ngram)"] == ([2, 4], [0.4, 0.4])
    assert _lines(made["Mean accepted length against k"])["draft_verify (drafter=draft_model)"][1] == [2.0, 3.0]
    assert set(_lines(made["Tokens/s against k"])) == {
        f"{v} (drafter={d})" for v in ("plain", "draft_verify") for d in ("draft_model", "ngram")
    }
    assert _drawn([]) == []


def test_prepare_trains_the_pair_into_the_cache_dir_before_any_run(monkeypatch, tmp_path):
    """`gpubench prepare` builds the pair a run's first speculative case would otherwise train
    inside itself (~25 s inside a case), under $GPUBENCH_CACHE_DIR (where a GPU session can tar
    it back from); a second call loads it; a device that is not here is exit 2 before any training."""
    import functools
    import json

    from click.testing import CliRunner

    from gpubench.cli import main

    real = train_small.trained_pair
    monkeypatch.setattr(train_small, "trained_pair", functools.partial(real, **MINI))
    monkeypatch.setattr(train_small, "_MEMO", {})
    monkeypatch.setenv("GPUBENCH_CACHE_DIR", str(tmp_path))
    first = CliRunner().invoke(main, ["prepare", "--device", "cpu", "--json"])
    assert first.exit_code == 0, first.output
    made = json.loads(first.output[first.output.index("{") :])["speculative_pair"]
    assert not made["from_cache"] and made["path"] == str(tmp_path / "spec_pair" / f"{made['key']}.pt")
    monkeypatch.setattr(train_small, "_MEMO", {})
    again = CliRunner().invoke(main, ["prepare", "--device", "cpu"])
    assert again.exit_code == 0 and "loaded from the cache" in again.output
    monkeypatch.setattr(train_small, "trained_pair", lambda *a, **k: pytest.fail("trained for a bad device"))
    bad = CliRunner().invoke(main, ["prepare", "--device", "cuda:7"])
    assert bad.exit_code == 2 and "--device" in bad.output and "Traceback" not in bad.output
