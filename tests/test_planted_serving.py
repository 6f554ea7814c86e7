"""Serving: bugs planted in the optimized engine (continuous scheduling, paged KV, preemption) fail
the run's own check (every request's greedy tokens against lone generation), not by an exception."""

from __future__ import annotations

from planted import caught, passed, run_planted
from planted import mutant as _mutant

from gpubench.serving.kv import PagedKV
from gpubench.serving.scheduler import Scheduler
from gpubench.serving.sequence import Sequence

# Smoke's preemption case: every request at time 0 into 32 blocks of 8 tokens (three 72-token slabs
# for the contiguous baseline): the paged engine preempts 15 times, 15 to 37 tokens from the end.
FORCING = dict(
    requests=12,
    arrival="all",
    prompt_len="uniform:8:24",
    output_len="uniform:24:48",
    max_len=72,
    kv_budget_mib=0.125,
    block_size=8,
    max_batch=12,
    min_preemptions=5,
)
# Smoke's continuous_batching case, shorter: requests join a batch of four as others leave.
JOINING = dict(requests=10, arrival="all", output_len="uniform:8:24", max_batch=4, kv="contiguous")
# Smoke's paged_kv_serving case, shorter: no preemption needed.
PAGED = dict(requests=10, arrival="all", output_len="uniform:8:24", kv_budget_mib=0.5)


def _assert_caught_on(monkeypatch, technique: str, params: dict, owner: type, method: str, old: str, new: str):
    """The case passes as shipped, and with the mutant in place fails by its token check on the
    optimized variant only."""
    assert passed(run_planted(technique, **params))
    monkeypatch.setattr(owner, method, _mutant(getattr(owner, method), old, new))
    record = run_planted(technique, **params)
    assert caught(record), (record.status, record.failure)
    optimized = record.variants[record.role_variant("optimized")].check
    assert optimized["metric"] == "mismatched_requests" and optimized["error"] >= 1, optimized
    assert record.variants[record.role_variant("baseline")].status == "ok"
    return record


def test_resumed_request_that_keeps_its_stale_cached_count_is_caught(monkeypatch):
    """A preempted request keeps its count of cached tokens, so on readmission only its last token
    is prefilled, attending over blocks that now hold other requests' K/V (resumed without
    recompute). Invisible when a request is preempted with a token or two to go, or when its
    blocks come back untouched; the forcing case preempts requests far from their end."""
    record = _assert_caught_on(monkeypatch, "paged_kv_serving", FORCING, Sequence, "preempt", "self.cached = 0", "pass")
    assert record.variants["paged"].metrics["preemptions"] >= FORCING["min_preemptions"]


def test_running_list_extended_in_place_is_caught(monkeypatch):
    """``self.running += admitted`` for ``self.running = self.running + admitted``: the continuous
    scheduler's step holds its running list as its decodes, so requests joining that step are
    also decoded in it, before their prefill is cached (a garbage second token). Static batching
    never admits while a batch decodes, so only the optimized variant breaks."""
    _assert_caught_on(
        monkeypatch,
        "continuous_batching",
        JOINING,
        Scheduler,
        "_admit",
        "self.running = self.running + admitted",
        "self.running += admitted",
    )


def test_paged_decode_that_leaves_out_the_decoding_token_is_caught(monkeypatch):
    """Context lengths of the paged decode count the cached tokens but not the one being decoded
    (already written to its slot): each decoding token attends over its past, never itself."""
    _assert_caught_on(
        monkeypatch,
        "paged_kv_serving",
        PAGED,
        PagedKV,
        "decode_rows",
        "[s.cached + 1 for s in seqs]",
        "[s.cached for s in seqs]",
    )


def test_a_preempted_request_whose_sampler_is_reseeded_is_caught(monkeypatch):
    """Sampled serving (T=0.8) with preemption forced: a preempted request's generator starts over
    from its seed, so after its recompute it redraws numbers it already used and its tokens leave
    those it samples alone. The check compares sampled tokens as greedy ones (a request draws from
    its own generator however it is batched), so the paged variant fails; the contiguous one never
    preempts and passes."""
    record = _assert_caught_on(
        monkeypatch,
        "paged_kv_serving",
        dict(FORCING, temperature=0.8),
        Sequence,
        "preempt",
        "self.preemptions += 1",
        "self.preemptions += 1; self.generator.manual_seed(self.req.seed)",
    )
    assert record.variants["paged"].metrics["preemptions"] >= FORCING["min_preemptions"]
    assert "sampling margin" in record.variants["paged"].check["detail"]
