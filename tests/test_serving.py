"""The serving engine and its two techniques: batching must never change what a request generates,
KV bookkeeping is exact under any sequence of operations, the schedulers do what their names say,
traces follow their stated distributions, and the metrics mean what vLLM's benchmark means."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from planted import caught, mutant, run_planted

from gpubench.contract import Measured, Recorder
from gpubench.errors import BadInput
from gpubench.models.llama import SIZES, LlamaConfig, load_hf, random_weights
from gpubench.reports import figures
from gpubench.serving import reference as reference_mod
from gpubench.serving.bench import LATENCY_PERCENTILES as LATENCY
from gpubench.serving.bench import PLOTS, ServingReference, check
from gpubench.serving.blocks import BlockManager, SlabAllocator
from gpubench.serving.config import EngineConfig
from gpubench.serving.engine import Engine, RequestTimes, ServingRun, Timeline
from gpubench.serving.kv import make_kv
from gpubench.serving.metrics import serving_metrics, serving_series
from gpubench.serving.model_runner import ModelRunner, sample
from gpubench.serving.reference import reference_batch, reference_generate
from gpubench.serving.sequence import Sequence
from gpubench.serving.traces import Request, TraceSpec, arrival_times, generate, parse_arrival, parse_length, read_jsonl
from gpubench.techniques import continuous_batching, paged_kv_serving

CPU = torch.device("cpu")
TINY = LlamaConfig(
    vocab_size=128, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128
)


@pytest.fixture(scope="module")
def weights64():
    return random_weights(TINY, seed=3, dtype=torch.float64)


def trace(n=10, seed=0, arrival="all", prompt="uniform:3:20", output="uniform:1:24", vocab=128):
    return generate(TraceSpec(n, arrival, prompt, output, vocab), seed)


ENGINES = [(s, k) for s in ("static", "continuous") for k in ("contiguous", "paged")]


# -- exactness --------------------------------------------------------------------------------


@pytest.mark.parametrize("scheduler,kv", ENGINES)
def test_greedy_tokens_equal_one_request_at_a_time_in_every_engine(weights64, scheduler, kv):
    """Batching, KV layout, padding and preemption-with-recompute never change a greedy request's
    tokens (float64, so no near-ties: exact equality with the lone reference)."""
    requests = trace(12, seed=1)
    # A budget of 16 blocks of 8 tokens: tight enough that the paged engine preempts.
    cfg = EngineConfig(
        scheduler=scheduler,
        kv=kv,
        kv_budget_bytes=16 * 8 * TINY.kv_bytes_per_token(8),
        block_size=8,
        max_len=48,
        max_batch=8,
        wait=False,
    )
    run = Engine(weights64, cfg).run(requests)
    assert run.accounting_problems == []
    for r in requests:
        expected, _ = reference_generate(weights64, r)
        assert run.tokens[r.id] == expected, f"request {r.id} under {scheduler}+{kv}"
    if kv == "paged" and scheduler == "continuous":
        assert run.preemptions > 0, "the budget was meant to force preemption"


@pytest.mark.parametrize("scheduler", ["continuous", "static"])
@pytest.mark.parametrize("seed", range(4))
def test_requests_preempted_far_from_their_end_resume_with_their_lone_tokens(weights64, scheduler, seed):
    """Every request at time 0 into 20 blocks of 8 tokens: requests are preempted with 5 or more
    tokens still to generate (so a wrong resume changes tokens that follow it), and every request
    still generates exactly what it generates alone (float64: no near-ties)."""
    requests = trace(10, seed=seed, prompt="uniform:4:12", output="uniform:20:32")
    cfg = EngineConfig(
        scheduler=scheduler,
        kv="paged",
        kv_budget_bytes=20 * 8 * TINY.kv_bytes_per_token(8),
        block_size=8,
        max_len=48,
        max_batch=8,
        wait=False,
    )
    run = Engine(weights64, cfg).run(requests)
    assert run.preemptions >= 3 and min(run.preempted_tokens_left) >= 5, run.preempted_tokens_left
    assert run.accounting_problems == []
    for r in requests:
        assert run.tokens[r.id] == reference_generate(weights64, r)[0], f"request {r.id}"


@pytest.mark.parametrize("kv", ["contiguous", "paged"])
def test_a_prefill_feeds_only_what_is_not_cached_and_attends_over_the_cached_prefix(weights64, kv):
    """The model runner prefills ``tokens[cached:]`` over the K/V already cached: a prompt fed in
    two prefills (7 tokens, then 13 more) gives the token the whole prompt gives alone."""
    prompt = torch.randint(0, 128, (20,), generator=torch.Generator().manual_seed(11)).tolist()
    backend = make_kv(
        weights64, EngineConfig(kv=kv, kv_budget_bytes=4 * 48 * TINY.kv_bytes_per_token(8), block_size=8, max_len=48)
    )
    runner = ModelRunner(weights64, backend, 0.0)
    seq = Sequence.of(Request(0, 0.0, prompt[:7], 1), 0.0)
    backend.admit(seq)
    runner.run([seq], [])
    seq.tokens = list(prompt)
    assert seq.cached == 7 and backend.allocator.ensure(seq.id, len(prompt))
    assert runner.run([seq], []) == reference_generate(weights64, Request(0, 0.0, prompt, 1))[0]
    assert seq.cached == 20


def test_static_batch_goes_on_when_its_unfinished_requests_are_preempted(weights64):
    """Static + paged: a short request finishes but keeps its blocks until the batch ends; when
    the long one then has no room and preempts itself, the batch ends and the long one is
    recomputed in the next (once a deadlock), with the tokens it would have generated alone."""
    requests = [Request(0, 0.0, list(range(1, 9)), 8), Request(1, 0.0, list(range(9, 17)), 20)]
    cfg = EngineConfig(
        scheduler="static",
        kv="paged",
        kv_budget_bytes=4 * 8 * TINY.kv_bytes_per_token(8),
        block_size=8,
        max_len=32,
        max_batch=2,
        wait=False,
    )
    run = Engine(weights64, cfg).run(requests)
    assert run.preemptions == 1 and run.accounting_problems == []
    for r in requests:
        assert run.tokens[r.id] == reference_generate(weights64, r)[0]


def test_a_request_larger_than_the_whole_budget_is_an_error_not_a_hang(weights64):
    """Under either scheduler, a request whose tokens cannot fit even in an empty pool stops the
    run with a message naming it."""
    request = Request(0, 0.0, list(range(1, 21)), 4)  # 20 prompt tokens, 16 slots
    for scheduler in ("static", "continuous"):
        cfg = EngineConfig(
            scheduler=scheduler,
            kv="paged",
            kv_budget_bytes=2 * 8 * TINY.kv_bytes_per_token(8),
            block_size=8,
            max_len=32,
            wait=False,
        )
        with pytest.raises(RuntimeError, match="request 0 does not fit the KV budget even alone"):
            Engine(weights64, cfg).run([request])


def test_sampled_decoding_is_reproducible_and_batching_invariant(weights64):
    """Each request samples from its own seeded generator: the same tokens alone, in a static batch
    and under continuous batching."""
    requests = trace(6, seed=2)
    runs = [
        Engine(
            weights64,
            EngineConfig(scheduler=s, kv="paged", kv_budget_bytes=1 << 20, max_len=48, temperature=0.8, wait=False),
        ).run(requests)
        for s in ("static", "continuous")
    ]
    for r in requests:
        alone, _ = reference_generate(weights64, r, temperature=0.8)
        assert runs[0].tokens[r.id] == runs[1].tokens[r.id] == alone
    greedy = [reference_generate(weights64, r)[0] for r in requests]
    assert greedy != [runs[0].tokens[r.id] for r in requests], "sampling at T=0.8 should differ from greedy"


def test_the_sampler_draws_what_torch_multinomial_draws_and_its_margin_says_how_near_a_tie():
    """The written-out exponential race picks the token torch.multinomial picks from the same
    generator state (the sampled tokens of earlier versions stay the same), and its margin is T
    times the log-ratio of the race's top two scores, the greedy one the top-2 logit gap."""
    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    seqs = [Sequence.of(Request(i, 0.0, [1], 4, seed=100 + i), 0.8) for i in range(4)]
    margins: list[float] = []
    drawn = sample(logits, seqs, 0.8, margins)
    probs = torch.softmax(logits.float() / 0.8, dim=-1)
    for i, token in enumerate(drawn):
        assert token == int(torch.multinomial(probs[i], 1, generator=torch.Generator().manual_seed(100 + i)))
        race = probs[i] / torch.empty_like(probs[i]).exponential_(generator=torch.Generator().manual_seed(100 + i))
        top = race.topk(2).values
        assert margins[i] == pytest.approx(0.8 * math.log(top[0] / top[1]))
    greedy: list[float] = []
    assert sample(logits, seqs, 0.0, greedy) == logits.argmax(-1).tolist()
    top = logits.float().topk(2).values
    assert greedy == pytest.approx((top[:, 0] - top[:, 1]).tolist())


@pytest.mark.parametrize("scheduler", ["continuous", "static"])
def test_sampled_requests_preempted_far_from_their_end_equal_lone_generation_token_for_token(weights64, scheduler):
    """T=0.8 with preemption forced (every request at time 0 into 20 blocks of 8 tokens): a
    preempted request's generator goes on where it stopped, so each request's sampled tokens are
    exactly those it samples alone (float64: no near-ties), and the technique's check says so."""
    requests = trace(10, seed=1, prompt="uniform:4:12", output="uniform:20:32")
    cfg = EngineConfig(
        scheduler=scheduler,
        kv="paged",
        kv_budget_bytes=20 * 8 * TINY.kv_bytes_per_token(8),
        block_size=8,
        max_len=48,
        max_batch=8,
        wait=False,
        temperature=0.8,
    )
    run = Engine(weights64, cfg).run(requests)
    assert run.preemptions >= 3 and min(run.preempted_tokens_left) >= 5, run.preempted_tokens_left
    ref = ServingReference({}, {}, 0.8, torch.float64, {r.id: r.output_len for r in requests})
    for r in requests:
        ref.tokens[r.id], ref.gaps[r.id] = reference_generate(weights64, r, temperature=0.8)
        assert run.tokens[r.id] == ref.tokens[r.id], f"request {r.id}"
    result = check(ref, run)
    assert result.passed and result.error == 0 and "near-tie" not in result.detail, result


# -- the reference: every request decoded as if alone, in padded batches ---------------------------


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_batched_reference_equals_lone_generation_token_for_token(weights64, temperature):
    """The check's reference decodes its requests together (a padded batch, each row masked to its
    own keys) and gives every request exactly the tokens it gets alone, greedy or sampled from its
    own generator, at prompt lengths from 1 to 30 (much padding) and batches of 5 rows (several
    batches, rows finishing at different steps); the near-tie margins agree to rounding (float64)."""
    requests = trace(13, seed=4, prompt="uniform:1:30", output="uniform:1:24")
    batched = reference_batch(weights64, requests, temperature, rows=5)
    assert sorted(batched) == [r.id for r in requests]
    for r in requests:
        tokens, gaps = reference_generate(weights64, r, temperature)
        assert batched[r.id][0] == tokens, f"request {r.id}"
        assert batched[r.id][1] == pytest.approx(gaps, abs=1e-9), f"request {r.id}"


def test_batched_reference_equals_lone_generation_at_smokes_serving_sizes():
    """The technique's own reference (the default tiny model in float32, smoke's prompt and
    output lengths) gives the lone tokens exactly; its near-tie gaps differ by rounding only, far
    below the float32 margin the check allows (1e-3)."""
    params = {p.name: p.default for p in continuous_batching.TECHNIQUE.params}
    params.update(requests=12, output_len="exp:24:64", kv="contiguous")
    w = continuous_batching.TECHNIQUE.build_fn(params, CPU, 0)
    ref = continuous_batching.TECHNIQUE.reference_fn(w)
    assert sorted(ref.tokens) == [r.id for r in w.requests]
    for r in w.requests:
        tokens, gaps = reference_generate(w.weights, r)
        assert ref.tokens[r.id] == tokens, f"request {r.id}"
        assert max(abs(a - b) for a, b in zip(ref.gaps[r.id], gaps)) < 1e-4


def test_a_batched_reference_whose_rows_see_past_their_own_keys_is_caught(weights64, monkeypatch):
    """The equality above has teeth: a mask that lets every row see up to the batch's furthest
    position (its padding, slots not yet written) changes the tokens of the shorter rows."""
    requests = trace(8, seed=4, prompt="uniform:1:30", output="uniform:4:24")
    leaky = mutant(reference_mod._decode_together, "<= pos.unsqueeze(-1)", "<= pos.max()")
    monkeypatch.setattr(reference_mod, "_decode_together", leaky)
    batched = reference_batch(weights64, requests, 0.0)
    assert any(batched[r.id][0] != reference_generate(weights64, r)[0] for r in requests)


def test_batched_reference_makes_one_forward_pass_per_step_for_all_its_requests(weights64, monkeypatch):
    """Why it is cheaper: one prefill and then one pass per step of the longest request, for the
    whole batch, where lone generation makes one pass per token of every request."""
    requests = trace(10, seed=2, prompt="uniform:3:20", output="uniform:5:24")
    passes = []
    real = reference_mod.forward
    monkeypatch.setattr(reference_mod, "forward", lambda *a, **k: passes.append(1) or real(*a, **k))
    reference_batch(weights64, requests)
    assert len(passes) == max(r.output_len for r in requests)  # the prefill gives each row its first token
    passes.clear()
    for r in requests:
        reference_generate(weights64, r)
    assert len(passes) == sum(r.output_len for r in requests)


# -- the check --------------------------------------------------------------------------------


def _ref(tokens, gaps, temperature=0.0, dtype=torch.float32, lengths=None, min_preemptions=0):
    return ServingReference(tokens, gaps, temperature, dtype, lengths or {}, min_preemptions)


def _run(tokens, problems=(), requests=(), timeline=None, preemptions=0, duration_s=1.0, kv="paged"):
    return ServingRun(
        scheduler="continuous",
        kv=kv,
        wait=True,
        tokens=tokens,
        requests=list(requests),
        timeline=timeline or Timeline(),
        duration_s=duration_s,
        preemptions=preemptions,
        preempted_tokens_left=[5] * preemptions,
        kv_budget_bytes=1000,
        kv_capacity_tokens=10,
        kv_token_bytes=100,
        accounting_problems=list(problems),
    )


def test_check_fails_on_a_real_divergence_and_names_it():
    """A token that differs where the reference had a clear winner fails, with the request named."""
    ref = _ref({0: [5, 6, 7]}, {0: [2.0, 2.0, 2.0]})
    result = check(ref, _run({0: [5, 9, 7]}))
    assert not result.passed and result.error == 1.0 and "request 0: token 1" in result.detail


def test_check_allows_a_divergence_at_a_near_tie_and_reports_it():
    """Where the lone reference's top-2 logits were within the margin, the other choice is allowed
    (batching changes rounding) but counted in the detail."""
    ref = _ref({0: [5, 6, 7], 1: [1, 2]}, {0: [2.0, 1e-5, 2.0], 1: [1.0, 1.0]})
    result = check(ref, _run({0: [5, 8, 9], 1: [1, 2]}))
    assert result.passed and "1 request(s) diverged at a near-tie" in result.detail


def test_check_fails_on_accounting_problems_and_short_outputs():
    """Leaked or doubly owned KV fails the run whatever the tokens; so does a request cut short."""
    ref = _ref({0: [5, 6]}, {0: [1.0, 1.0]})
    assert not check(ref, _run({0: [5, 6]}, problems=["3 blocks leaked"])).passed
    assert not check(ref, _run({0: [5]})).passed
    over = Timeline(live_bytes=[300, 900], reserved_bytes=[400, 800])  # utilization 1.125 at step 2
    result = check(ref, _run({0: [5, 6]}, timeline=over))
    assert not result.passed and result.metric == "accounting_problems"
    assert "KV utilization outside [0, 1] at 1 step(s): step 2 has 900 bytes live in 800 reserved" in result.detail


def test_check_compares_sampled_tokens_as_greedy_ones():
    """Sampled decoding is checked token for token against the lone reference: a clear divergence
    fails, naming the sampling margin; one at a near-tie of the race is allowed and reported."""
    ref = _ref({0: [5, 6, 7]}, {0: [0.5, 1e-5, 0.5]}, temperature=0.8)
    assert check(ref, _run({0: [5, 6, 7]})).passed
    wrong = check(ref, _run({0: [9, 6, 7]}))
    assert not wrong.passed and "request 0: token 0 is 9, alone it is 5 (sampling margin 0.5)" in wrong.detail
    near = check(ref, _run({0: [5, 8, 1]}))
    assert near.passed and "1 request(s) diverged at a near-tie" in near.detail


def test_check_fails_a_paged_run_that_preempted_less_than_the_case_asks():
    """min_preemptions: a run with paged KV that preempted fewer times fails (the case no longer
    tests preemption), saying how many it made; contiguous KV, which never preempts, is exempt;
    wrong tokens are still reported as such."""
    ref = _ref({0: [5, 6]}, {0: [1.0, 1.0]}, min_preemptions=3)
    result = check(ref, _run({0: [5, 6]}, preemptions=2))
    assert not result.passed and result.metric == "missing_preemptions" and result.error == 1.0
    assert "2 preemption(s) of an engine with paged KV where the case asks for at least 3" in result.detail
    assert check(ref, _run({0: [5, 6]}, preemptions=3)).passed
    assert check(ref, _run({0: [5, 6]}, kv="contiguous")).passed
    assert check(ref, _run({0: [5, 9]}, preemptions=0)).metric == "mismatched_requests"


def test_a_case_meant_to_preempt_that_does_not_fails_by_its_check():
    """Through the harness: the paged engine's preemptions reach the check, and a case asking for
    more than happen fails by its check on the paged variant (the contiguous one is fine)."""
    record = run_planted("paged_kv_serving", **SMALL, min_preemptions=1000)
    assert caught(record), record.failure
    assert record.variants["paged"].check["metric"] == "missing_preemptions"
    assert record.variants["contiguous"].status == "ok"


# -- KV bookkeeping ---------------------------------------------------------------------------


def test_block_manager_invariants_under_random_operations():
    """Over thousands of random allocate / grow / release operations, checked against a shadow
    model: no block owned twice, none lost, tables exactly as long as their tokens need, and a
    request the pool cannot hold takes nothing."""
    rng = random.Random(7)
    bm = BlockManager(num_blocks=37, block_size=5)
    shadow: dict[int, int] = {}  # seq -> tokens covered
    next_id = 0
    for _ in range(4000):
        op = rng.random()
        if op < 0.35 or not shadow:
            tokens = rng.randint(1, 40)
            if bm.can_allocate(tokens):
                bm.allocate(next_id, tokens)
                shadow[next_id] = tokens
                next_id += 1
            else:
                free_before = bm.num_free
                with pytest.raises(MemoryError):
                    bm.allocate(next_id, tokens)
                assert bm.num_free == free_before and next_id not in bm.tables
        elif op < 0.8:
            seq = rng.choice(list(shadow))
            want = shadow[seq] + rng.randint(1, 12)
            free_before = bm.num_free
            if bm.ensure(seq, want):
                shadow[seq] = want
            else:
                assert bm.num_free == free_before
        else:
            seq = rng.choice(list(shadow))
            bm.release(seq)
            del shadow[seq]
        assert bm.check() == []
        assert bm.num_owned + bm.num_free == bm.num_blocks
        for seq, tokens in shadow.items():
            assert len(bm.tables[seq]) == bm.blocks_for(tokens)
    for seq in list(shadow):
        bm.release(seq)
    assert bm.num_free == bm.num_blocks and bm.check() == []


def test_block_manager_check_reports_leaks_and_double_ownership():
    """check() is what a run records; it must see a leaked block and a block owned twice."""
    bm = BlockManager(8, 4)
    bm.allocate(1, 8)
    bm.free.popleft()  # lose a block
    assert any("leaked" in p for p in bm.check())
    bm = BlockManager(8, 4)
    bm.allocate(1, 4)
    bm.allocate(2, 4)
    bm.tables[2][0] = bm.tables[1][0]
    assert any("also owned" in p for p in bm.check())


def test_slab_allocator_holds_whole_slabs_and_never_double_books():
    """Contiguous KV: one max_len slab per request however short, nothing past the slab count."""
    slabs = SlabAllocator(3, 64)
    for seq in range(3):
        assert slabs.can_allocate(10)
        slabs.allocate(seq, 10)
    assert not slabs.can_allocate(1)
    assert not SlabAllocator(1, 64).can_allocate(65)
    slabs.release(1)
    assert slabs.check() == [] and slabs.num_free == 1


@pytest.mark.parametrize("kv", ["contiguous", "paged"])
def test_engine_never_exceeds_its_budget_and_frees_everything(weights64, kv):
    """At every step the reserved KV bytes stay within the budget; at the end nothing is held."""
    budget = 12 * 8 * TINY.kv_bytes_per_token(8)
    run = Engine(
        weights64,
        EngineConfig(scheduler="continuous", kv=kv, kv_budget_bytes=budget, block_size=8, max_len=48, wait=False),
    ).run(trace(10, seed=4))
    assert max(run.timeline.reserved_bytes) <= budget
    assert run.timeline.reserved_bytes[0] > 0 and run.accounting_problems == []


def test_paged_holds_more_requests_than_contiguous_in_the_same_bytes(weights64):
    """Same budget, same scheduler: contiguous admits at most budget / max_len requests, paged
    admits by the tokens actually held, so more run at once and memory holds tokens, not padding."""
    budget = 4 * 48 * TINY.kv_bytes_per_token(8)  # four 48-token slabs
    runs = {
        kv: Engine(
            weights64,
            EngineConfig(
                scheduler="continuous",
                kv=kv,
                kv_budget_bytes=budget,
                block_size=8,
                max_len=48,
                max_batch=32,
                wait=False,
            ),
        ).run(trace(16, seed=5))
        for kv in ("contiguous", "paged")
    }
    m = {kv: serving_metrics(run, 1e9, 1e9) for kv, run in runs.items()}
    assert m["contiguous"]["max_concurrency"] <= 4 < m["paged"]["max_concurrency"]
    assert m["paged"]["kv_utilization"] > m["contiguous"]["kv_utilization"]


# -- scheduling -------------------------------------------------------------------------------


def _first_last(run):
    return {r.id: (r.token_times_s[0], r.finish_s) for r in run.requests}


def test_static_batches_run_until_their_longest_request_finishes(weights64):
    """Static: the second batch's first token comes after every request of the first batch
    finished; continuous: a waiting request starts before the first ones are all done."""
    requests = trace(8, seed=6, output="uniform:2:30")
    runs = {
        s: Engine(
            weights64,
            EngineConfig(scheduler=s, kv="contiguous", kv_budget_bytes=1 << 22, max_len=64, max_batch=4, wait=False),
        ).run(requests)
        for s in ("static", "continuous")
    }
    static = _first_last(runs["static"])
    first_batch_end = max(static[i][1] for i in range(4))
    assert all(static[i][0] >= first_batch_end for i in range(4, 8))
    cont = _first_last(runs["continuous"])
    assert min(cont[i][0] for i in range(4, 8)) < max(cont[i][1] for i in range(4))


def test_static_batch_starts_on_timeout_when_not_full(weights64):
    """With arrivals honoured and a batch that never fills, the batch starts once its oldest request
    has waited batch_timeout_s (not before), and the run completes."""
    requests = [Request(i, 0.01 * i, [1, 2, 3], 2) for i in range(3)]
    cfg = EngineConfig(
        scheduler="static",
        kv="contiguous",
        kv_budget_bytes=1 << 22,
        max_len=16,
        max_batch=8,
        batch_timeout_s=0.1,
        wait=True,
    )
    run = Engine(weights64, cfg).run(requests)
    first = min(r.token_times_s[0] for r in run.requests)
    assert first >= 0.1 and all(len(t) == 2 for t in run.tokens.values())


def test_requests_are_not_served_before_they_arrive(weights64):
    """Real arrivals: no request's first token precedes its arrival time."""
    requests = generate(TraceSpec(6, "poisson:50", "fixed:4", "fixed:3", 128), 9)
    run = Engine(weights64, EngineConfig(kv_budget_bytes=1 << 22, max_len=16, wait=True)).run(requests)
    assert all(r.token_times_s[0] >= r.arrival_s for r in run.requests)
    assert run.duration_s >= requests[-1].arrival_s


# -- traces -----------------------------------------------------------------------------------


def test_poisson_and_gamma_arrivals_have_their_stated_rate_and_burstiness():
    """Mean gap 1/rate for both; coefficient of variation 1 for Poisson, 1/sqrt(k) for gamma."""
    g = torch.Generator().manual_seed(0)
    for spec, cv in (("poisson:20", 1.0), ("gamma:20:0.25", 2.0), ("gamma:20:4", 0.5)):
        t = torch.tensor(arrival_times(spec, 20000, g), dtype=torch.float64)
        gaps = torch.diff(t, prepend=torch.zeros(1, dtype=torch.float64))
        assert abs(gaps.mean().item() * 20 - 1) < 0.05, spec
        assert abs(gaps.std().item() / gaps.mean().item() - cv) < 0.1 * cv, spec
    assert arrival_times("all", 5, g) == [0.0] * 5


def test_length_distributions_match_their_parameters():
    """fixed is constant; uniform stays in [lo, hi] with the midpoint mean; capped exponential and
    lognormal have their stated mean (the cap far away) and never leave [1, cap]."""
    g = torch.Generator().manual_seed(1)
    assert parse_length("fixed:7").sample(5, g) == [7] * 5
    u = parse_length("uniform:10:20").sample(20000, g)
    assert min(u) == 10 and max(u) == 20 and abs(sum(u) / len(u) - 15) < 0.2
    for spec, mean in (("exp:50:100000", 50), ("lognormal:50:0.8:100000", 50)):
        x = parse_length(spec).sample(20000, g)
        assert abs(sum(x) / len(x) / mean - 1) < 0.05, spec
    capped = parse_length("exp:50:60").sample(5000, g)
    assert max(capped) == 60 and min(capped) >= 1


@pytest.mark.parametrize("spec", ["exp:50", "uniform:9:3", "normal:4", "fixed:x", "poisson", "gamma:2"])
def test_bad_specs_say_what_is_allowed(spec):
    """A malformed length or arrival spec is a ValueError naming the forms allowed."""
    with pytest.raises(ValueError):
        (parse_arrival if spec.startswith(("poisson", "gamma")) else parse_length)(spec)


def test_generated_traces_are_seeded():
    """Same seed, same trace; another seed, another."""
    spec = TraceSpec(20, "poisson:10", "uniform:4:30", "exp:20:60", 100)
    a, b, c = generate(spec, 1), generate(spec, 1), generate(spec, 2)
    key = lambda t: [(r.arrival_s, r.prompt, r.output_len) for r in t]
    assert key(a) == key(b) != key(c)


def test_jsonl_trace_reads_lengths_and_text_and_rejects_bad_lines(tmp_path):
    """A JSONL trace gives requests sorted by arrival (prompt text becomes byte tokens); a bad line
    is BadInput naming the file, the line and the key."""
    good = tmp_path / "t.jsonl"
    good.write_text(
        '{"arrival_s": 0.5, "prompt_len": 4, "output_len": 3}\n\n{"arrival_s": 0.1, "prompt": "hi", "output_len": 2}\n'
    )
    reqs = read_jsonl(good, vocab_size=100)
    assert [r.arrival_s for r in reqs] == [0.1, 0.5] and reqs[0].prompt == [104 % 100, 105 % 100]
    assert reqs[1].prompt_len == 4 and [r.id for r in reqs] == [0, 1]
    bad = tmp_path / "b.jsonl"
    bad.write_text(
        '{"arrival_s": 0.5, "prompt_len": 4, "output_len": 3}\n{"arrival_s": 1, "output_len": 0, "prompt_len": 2}\n'
    )
    with pytest.raises(BadInput, match=r"b.jsonl:2: key 'output_len'"):
        read_jsonl(bad, 100)
    (tmp_path / "c.jsonl").write_text("not json\n")
    with pytest.raises(BadInput, match=r"c.jsonl:1: not JSON"):
        read_jsonl(tmp_path / "c.jsonl", 100)
    with pytest.raises(BadInput, match="cannot read"):
        read_jsonl(tmp_path / "missing.jsonl", 100)


# -- metrics ----------------------------------------------------------------------------------


def _timed_run(ttft_s, gap_s, preemptions=0, duration_s=1.0):
    """Two requests at time 0, two tokens each: the first after ttft_s, the next gap_s later."""
    times = [ttft_s, ttft_s + gap_s]
    requests = [RequestTimes(i, 0.0, 4, 2, list(times), times[-1]) for i in range(2)]
    timeline = Timeline(
        t_s=times,
        running=[2, 2],
        waiting=[0, 0],
        live_bytes=[800, 1000],
        reserved_bytes=[1000, 1000],
        step_tokens=[8, 2],
    )
    return _run(
        {0: [1, 2], 1: [3, 4]}, requests=requests, timeline=timeline, preemptions=preemptions, duration_s=duration_s
    )


def test_serving_metrics_follow_vllm_definitions():
    """TTFT = first token - arrival; TPOT = (last - first) / (n - 1); ITL = gaps between tokens;
    throughput over the run's start (time 0) to last finish; goodput counts requests meeting both SLOs;
    KV utilization = live / reserved bytes averaged over steps."""
    run = _run(
        {0: [1, 2, 3], 1: [4]},
        requests=[RequestTimes(0, 0.0, 10, 3, [0.1, 0.2, 0.4], 0.4), RequestTimes(1, 0.2, 6, 1, [0.3], 0.3)],
        timeline=Timeline(
            t_s=[0.1, 0.2],
            running=[1, 2],
            waiting=[0, 0],
            live_bytes=[50, 100],
            reserved_bytes=[100, 400],
            step_tokens=[10, 7],
        ),
    )
    m = serving_metrics(run, slo_ttft_ms=150, slo_tpot_ms=500)
    assert m["duration_s"] == pytest.approx(0.4)
    assert m["output_tokens_per_s"] == pytest.approx(4 / 0.4) and m["total_tokens_per_s"] == pytest.approx(20 / 0.4)
    assert m["mean_ttft_ms"] == pytest.approx(100.0)
    assert m["median_tpot_ms"] == pytest.approx(150.0)
    assert sorted(serving_series(run)["itl_ms"]) == pytest.approx([100.0, 200.0])
    assert m["goodput_requests_per_s"] == pytest.approx(2 / 0.4)
    assert m["kv_utilization"] == pytest.approx((0.5 + 0.25) / 2) and m["max_concurrency"] == 2
    assert serving_metrics(run, slo_ttft_ms=50, slo_tpot_ms=500)["slo_attained"] == 0.0


def test_a_request_that_never_finished_keeps_the_duration_to_the_runs_end():
    """vLLM's benchmark duration waits for every request: one with no output and no finish time
    must not let the last other finish (0.4 s) end the duration early (the run lasted 3 s)."""
    run = _run(
        {0: [1, 2, 3], 1: []},
        requests=[RequestTimes(0, 0.0, 10, 3, [0.1, 0.2, 0.4], 0.4), RequestTimes(1, 0.2, 6, 1, [], None)],
        timeline=Timeline(
            t_s=[0.1, 0.2],
            running=[1, 2],
            waiting=[0, 0],
            live_bytes=[50, 100],
            reserved_bytes=[100, 400],
            step_tokens=[10, 7],
        ),
        duration_s=3.0,
    )
    m = serving_metrics(run, slo_ttft_ms=150, slo_tpot_ms=500)
    assert m["duration_s"] == pytest.approx(3.0) and m["completed"] == 1
    assert m["output_tokens_per_s"] == pytest.approx(3 / 3.0)


def test_technique_metrics_are_medians_over_the_timed_runs_not_the_checked_one():
    """Scalars are the median over the timed calls' recorded runs; the series come from the run
    of median duration; the checked call's output (here a far slower run) is never read."""
    T = continuous_batching.TECHNIQUE
    w = T.build_fn({**T.defaults(), **SMALL}, CPU, 0)
    runs = [_timed_run(0.1, 0.02, preemptions=1, duration_s=2.0), _timed_run(0.3, 0.04, preemptions=4, duration_s=1.0)]
    checked = _timed_run(9.0, 1.0, preemptions=100, duration_s=50.0)
    m = T.metrics_fn(w, Measured("continuous", [2.0, 1.0], 1.5, checked, CPU, records=[{"run": r} for r in runs]))
    assert m["median_ttft_ms"] == pytest.approx(200.0) and m["median_tpot_ms"] == pytest.approx(30.0)
    assert m["preemptions"] == 2.5 and m["max_concurrency"] == 2 and m["median_preempted_tokens_left"] == 5
    assert m["duration_s"] == pytest.approx((0.12 + 0.34) / 2)
    assert m["series"]["ttft_ms"] == pytest.approx([300.0, 300.0])  # the shorter run: the lower median of two
    with pytest.raises(ValueError, match="no timed serving run"):
        T.metrics_fn(w, Measured("continuous", [], 0.0, checked, CPU, records=[]))


# -- techniques -------------------------------------------------------------------------------

SMALL = {
    "requests": 6,
    "arrival": "all",
    "prompt_len": "uniform:4:12",
    "output_len": "uniform:2:10",
    "max_len": 32,
    "kv_budget_mib": 0.05,
    "max_batch": 4,
}


@pytest.mark.parametrize(
    "module,names", [(continuous_batching, ("static", "continuous")), (paged_kv_serving, ("contiguous", "paged"))]
)
def test_techniques_check_both_engines_against_lone_generation(module, names):
    """Each serving technique's baseline and optimized runs pass its check against the reference;
    each timed run is recorded, and the metrics carry the headline and the series the report draws."""
    T = module.TECHNIQUE
    assert T.incomplete() == [] and tuple(T.playing(role, CPU).name for role in ("baseline", "optimized")) == names
    params = {**T.defaults(), **SMALL}
    assert T.validate_fn(params) == []
    w = T.build_fn(params, CPU, 0)
    ref = T.reference_fn(w)
    case = {"technique": T.name, "params": params, "variants": {}}
    for name, role in zip(names, ("baseline", "optimized")):
        rec = Recorder()
        out = T.variants[name].call(w, rec)
        assert rec.values["run"] is out
        result = T.check_fn(ref, out)
        assert result.passed, result.detail
        m = T.metrics_fn(w, Measured(name, [0.1], 0.1, out, CPU, records=[rec.values]))
        assert m[T.headline] > 0 and len(m["series"]["ttft_ms"]) == 6
        case["variants"][name] = {"role": role, "metrics": m}
    assert T.plots == PLOTS
    for plot in T.plots:
        fig = figures.declared(plot, [case])
        assert fig is not None and figures.mark_data(fig) > 0, plot.title


def _figure_case(ttft_ms, role_values):
    variants = {}
    for (name, role), scale in zip((("static", "baseline"), ("continuous", "optimized")), role_values):
        metrics = {
            "output_tokens_per_s": 100.0 * scale,
            **{key: 10.0 * scale for key in LATENCY},
            "series": {
                "t_s": [0.1, 0.2, 0.3],
                "running": [1, 2, 1],
                "kv_utilization": [None, 0.5 * scale, 0.25],
                "ttft_ms": ttft_ms,
                "e2e_ms": [2 * t for t in ttft_ms],
            },
        }
        variants[name] = {"role": role, "metrics": metrics}
    return {"technique": "continuous_batching", "params": {"requests": 3}, "variants": variants}


def _panel_lines(fig):
    return {line.get_label(): line for ax in fig.axes for line in ax.get_lines() if len(line.get_xdata())}


def test_report_figures_draw_throughput_percentiles_utilization_running_and_cdfs():
    """The declared figures: a bar per engine for tokens/s and each latency percentile, KV
    utilization (%) and running requests against time, and latency CDFs, per engine."""
    case = _figure_case([30.0, 10.0, 20.0], (1, 2))
    drawn = {plot.title: figures.declared(plot, [case]) for plot in PLOTS}
    assert all(fig is not None for fig in drawn.values())
    throughput, percentiles, util, running, ttft, e2e = drawn.values()
    assert sorted(p.get_height() for p in throughput.axes[0].patches) == [100.0, 200.0]
    assert len(percentiles.axes[0].patches) == 2 * len(LATENCY)
    util_lines = _panel_lines(util)
    assert set(util_lines) == {"static", "continuous"}
    assert list(util_lines["continuous"].get_ydata())[1:] == pytest.approx([100.0, 25.0])
    assert list(_panel_lines(running)["static"].get_ydata()) == [1, 2, 1]
    cdf = _panel_lines(ttft)["static"]
    assert list(cdf.get_xdata()) == [10.0, 20.0, 30.0] and list(cdf.get_ydata()) == pytest.approx([1 / 3, 2 / 3, 1])
    assert list(_panel_lines(e2e)["continuous"].get_xdata()) == [20.0, 40.0, 60.0]
    empty = {"technique": "continuous_batching", "params": {}, "variants": {}}
    assert all(figures.declared(plot, [empty]) is None for plot in PLOTS)


def test_validate_rejects_traces_longer_than_max_len_and_bad_specs():
    """A trace that can draw requests longer than max_len, an unknown model or a bad spec is
    rejected before anything runs, naming the key."""
    T = continuous_batching.TECHNIQUE
    problems = T.validate_fn({**T.defaults(), "max_len": 100})
    assert any("max_len 100" in p for p in problems)
    problems = T.validate_fn({**T.defaults(), "arrival": "poison:3", "model": "huge"})
    assert any(p.startswith("arrival:") for p in problems) and any("model 'huge'" in p for p in problems)


def test_validate_rejects_a_preemption_floor_that_cannot_hold_or_depends_on_speed():
    """min_preemptions is rejected with contiguous KV (it never preempts) and with real arrivals
    (the count would depend on the machine's speed); arrival all or wait false are accepted."""
    T = continuous_batching.TECHNIQUE
    params = {**T.defaults(), "min_preemptions": 2}
    assert any("contiguous KV never preempts" in p for p in T.validate_fn(params))
    problems = T.validate_fn({**params, "kv": "paged"})
    assert len(problems) == 1 and "machine's speed" in problems[0]
    assert T.validate_fn({**params, "kv": "paged", "arrival": "all"}) == []
    assert T.validate_fn({**params, "kv": "paged", "wait": False}) == []


def test_hf_loader_says_what_is_missing(tmp_path):
    """A checkpoint path that is not a checkpoint, or transformers missing, is BadInput saying so."""
    with pytest.raises(BadInput, match="no config.json"):
        load_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    try:
        import transformers  # noqa: F401
    except ImportError:
        with pytest.raises(BadInput, match="transformers"):
            load_hf(tmp_path)


def test_model_sizes_span_cpu_tests_to_a_billion_parameters():
    """The named sizes run from under 1M parameters (CPU tests) to about 1B (a GPU)."""
    assert SIZES["tiny"].num_params() < 1e6 and 0.8e9 < SIZES["1b"].num_params() < 1.3e9
    assert math.isclose(SIZES["tiny"].kv_bytes_per_token(4), 2 * 2 * 2 * 32 * 4)


def test_check_requests_limits_the_token_check_but_still_checks_lengths():
    """With check_requests set, requests beyond it are still checked for their full length."""
    ref = _ref({0: [5, 6]}, {0: [1.0, 1.0]}, lengths={0: 2, 1: 3})
    assert check(ref, _run({0: [5, 6], 1: [1, 2, 3]})).passed
    result = check(ref, _run({0: [5, 6], 1: [1, 2]}))
    assert not result.passed and "request 1: 2 tokens, expected 3" in result.detail


def test_hf_checkpoint_loads_and_matches_transformers_logits(tmp_path):
    """A local Hugging Face Llama checkpoint read through load_hf gives the logits transformers
    computes (RoPE layout, GQA, RMSNorm, SwiGLU all as Llama defines them), and the engine serves it."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=112,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        rope_theta=5000.0,
        tie_word_embeddings=False,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # make the norms non-trivial so a misplaced norm weight shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(tmp_path)
    weights = load_hf(tmp_path, dtype=torch.float64)
    assert weights.config.num_kv_heads == 2 and weights.config.rope_theta == 5000.0
    tokens = torch.randint(0, 96, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model.double()(tokens).logits[0]
    from gpubench.models.llama import causal_attention, forward

    got = forward(weights, tokens[0], torch.arange(20), lambda i, q, k, v: causal_attention(q, k, v))
    assert torch.allclose(got, expected, atol=1e-8), (got - expected).abs().max()
    request = Request(0, 0.0, tokens[0].tolist(), 8)
    run = Engine(weights, EngineConfig(kv="paged", kv_budget_bytes=1 << 20, max_len=64, wait=False)).run([request])
    # No end-of-sequence token: the engine, like vLLM's benchmark with ignore_eos, generates output_len.
    hf = model.generate(tokens, max_new_tokens=8, do_sample=False)[0, 20:].tolist()
    assert run.tokens[0] == hf


def test_serve_command_prints_metrics_per_engine_and_rejects_bad_input(tmp_path):
    """`gpubench serve` runs a JSONL trace through each engine and reports vLLM-style metrics;
    a bad engine name, spec or too-small max-len is one paragraph and exit code 2."""
    from click.testing import CliRunner

    from gpubench.cli import main

    trace_file = tmp_path / "t.jsonl"
    trace_file.write_text(
        "".join(json.dumps({"arrival_s": 0.01 * i, "prompt_len": 5 + i, "output_len": 3 + i}) + "\n" for i in range(5))
    )
    runner = CliRunner()
    result = runner.invoke(
        main,
        [
            "serve",
            "--trace",
            str(trace_file),
            "--max-len",
            "32",
            "--no-wait",
            "--json",
            "--engine",
            "static+contiguous",
            "--engine",
            "continuous+paged",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    for name in ("static+contiguous", "continuous+paged"):
        m = doc["engines"][name]
        assert m["requests"] == 5 and m["output_tokens_per_s"] > 0 and m["accounting_problems"] == []
    for args, needle in (
        (["--engine", "dynamic+paged"], "--engine"),
        (["--arrival", "poisson"], "--arrival"),
        (["--max-len", "8"], "--max-len"),
        (["--kv-budget", "1KiB"], "--kv-budget"),
        (["--model", "nope"], "model 'nope'"),
    ):
        result = runner.invoke(main, ["serve", "--trace", str(trace_file), "--no-wait", *args])
        assert result.exit_code == 2 and needle in result.output and "Traceback" not in result.output, args


def test_the_reference_runs_on_one_thread_while_the_cpu_is_overloaded_and_restores_the_count(monkeypatch):
    """On an overloaded CPU (fake load 5 on 2 cores) the reference decodes on one torch thread
    (intra-op threads wait on descheduled siblings there) and puts the count back; on a quiet
    machine it leaves the count alone."""
    from gpubench.measure import machine_load
    from gpubench.serving import bench as serving_bench

    params = {p.name: p.default for p in continuous_batching.TECHNIQUE.params}
    params.update(requests=3, output_len="uniform:2:4", kv="contiguous")
    w = continuous_batching.TECHNIQUE.build_fn(params, CPU, 0)
    seen = []
    real = serving_bench.reference_batch
    monkeypatch.setattr(
        serving_bench, "reference_batch", lambda *a, **k: seen.append(torch.get_num_threads()) or real(*a, **k)
    )
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        monkeypatch.setattr(machine_load, "read", lambda: machine_load.Load(5.0, 2))
        serving_bench.reference(w)
        monkeypatch.setattr(machine_load, "read", lambda: machine_load.Load(1.0, 2))
        serving_bench.reference(w)
        assert seen == [1, 2] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
