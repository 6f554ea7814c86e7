"""Timing harness: accurate on a known-duration workload, interleaved, adaptive, fault-tolerant."""

import dataclasses
import time
import traceback
import weakref

import pytest
import torch

from gpubench.contract import Param
from gpubench.measure import timing
from gpubench.records import stats

CPU = torch.device("cpu")


def busy_wait(seconds):
    """Spin (no sleep: sleeping overshoots by the scheduler's slack) until `seconds` have passed."""
    end = time.perf_counter_ns() + int(seconds * 1e9)
    while time.perf_counter_ns() < end:
        pass


class FakeTime:
    """The clock the timing loop reads, advanced only by the workloads: a call of 4 ms takes 4 ms
    exactly however loaded the machine is, so the test checks the loop's arithmetic, not the host."""

    def __init__(self):
        self.ns = 1_000_000_000

    def perf_counter_ns(self):
        return self.ns

    def perf_counter(self):
        return self.ns * 1e-9

    def work(self, seconds):
        self.ns += int(round(seconds * 1e9))


def test_known_duration_workload_is_reported_exactly_and_its_ratio_ci_holds_it(monkeypatch):
    fake = FakeTime()
    monkeypatch.setattr(timing.time, "perf_counter_ns", fake.perf_counter_ns)
    monkeypatch.setattr(timing.time, "perf_counter", fake.perf_counter)
    policy = timing.Policy(warmup_s=0.0, min_reps=10, max_reps=30, min_time_s=0.0, target_iqr=1.0)
    out = timing.measure_interleaved(
        {"a": lambda _: fake.work(0.004), "b": lambda _: fake.work(0.002)}, timing.Clock(CPU), policy
    )
    assert stats.median(out["a"].samples_s) == pytest.approx(0.004, rel=1e-9)
    assert stats.median(out["b"].samples_s) == pytest.approx(0.002, rel=1e-9)
    ratio = stats.bootstrap_ratio_ci(out["a"].samples_s, out["b"].samples_s)
    assert ratio.ci_low <= 2.0 <= ratio.ci_high


def test_a_real_busy_wait_is_never_reported_shorter_than_it_lasted():
    """On the real clock a call can only be preempted, never shortened: a 2 ms spin is at least
    2 ms (no upper limit: a loaded machine stretches it)."""
    policy = timing.Policy(warmup_s=0.0, min_reps=3, max_reps=5, min_time_s=0.0, target_iqr=1.0)
    out = timing.measure_interleaved({"a": lambda _: busy_wait(0.002)}, timing.Clock(CPU), policy)
    assert min(out["a"].samples_s) >= 0.002


def test_variants_are_interleaved_a_b_a_b():
    calls = []
    policy = timing.Policy(warmup_s=0.0, min_reps=4, max_reps=4, min_time_s=0.0, target_iqr=1.0)
    timing.measure_interleaved(
        {"a": lambda _: calls.append("a"), "b": lambda _: calls.append("b")}, timing.Clock(CPU), policy
    )
    assert calls[:2] == ["a", "b"]  # warm-up: one call each
    assert calls[2:] == ["a", "b"] * 4


def test_reset_runs_before_every_call_outside_the_timed_region():
    events = []
    policy = timing.Policy(warmup_s=0.0, min_reps=3, max_reps=3, min_time_s=0.0, target_iqr=1.0)
    out = timing.measure_interleaved(
        {"a": lambda _: events.append("call")},
        timing.Clock(CPU),
        policy,
        reset=lambda: (events.append("reset"), busy_wait(0.01)),
    )
    assert events == ["reset", "call"] * 4
    assert max(out["a"].samples_s) < 0.005  # the 10 ms reset is not in the samples


def test_stops_at_max_reps_and_respects_min_reps():
    policy = timing.Policy(warmup_s=0.0, min_reps=7, max_reps=9, min_time_s=0.0, target_iqr=0.0)
    out = timing.measure_interleaved({"a": lambda _: None}, timing.Clock(CPU), policy)
    assert out["a"].n == 9
    policy = timing.Policy(warmup_s=0.0, min_reps=7, max_reps=50, min_time_s=0.0, target_iqr=10.0)
    out = timing.measure_interleaved({"a": lambda _: busy_wait(0.0005)}, timing.Clock(CPU), policy)
    assert out["a"].n == 7  # settled as soon as min_reps allowed it


def test_stops_at_max_time():
    policy = timing.Policy(warmup_s=0.0, min_reps=1, max_reps=10_000, min_time_s=0.0, max_time_s=0.1, target_iqr=0.0)
    t0 = time.perf_counter()
    out = timing.measure_interleaved({"a": lambda _: busy_wait(0.002)}, timing.Clock(CPU), policy)
    # Stopped by max_time_s (0.1 s), not by max_reps (10,000 calls = 20 s): limits far from both.
    assert time.perf_counter() - t0 < 10 and 1 <= out["a"].n < 60


def test_a_raising_variant_is_dropped_and_the_others_keep_their_samples():
    state = {"n": 0}

    def flaky(_):
        state["n"] += 1
        if state["n"] == 3:
            raise RuntimeError("boom")

    policy = timing.Policy(warmup_s=0.0, min_reps=5, max_reps=5, min_time_s=0.0, target_iqr=1.0)
    out = timing.measure_interleaved({"ok": lambda _: None, "flaky": flaky}, timing.Clock(CPU), policy)
    assert out["ok"].n == 5 and out["ok"].error is None
    assert out["flaky"].n == 1 and isinstance(out["flaky"].error, RuntimeError)


def test_harness_overhead_is_measured_and_small():
    overhead = timing.harness_overhead_s(CPU)
    assert 0 < overhead < 50e-6


def test_policy_validation_names_bad_keys_and_values():
    problems = timing.policy_problems({"min_reps": 0, "flush_l2": "yes", "warm": 1})
    assert set(problems) == {"min_reps", "flush_l2", "warm"}
    assert problems["min_reps"].startswith("0 is below the minimum 1; allowed: int >= 1")
    assert problems["flush_l2"].startswith("'yes' is not a bool; allowed: true or false")
    assert problems["warm"].startswith("unknown policy key; allowed: warmup_s, min_reps")
    assert timing.policy_problems({"case_timeout_s": 0})["case_timeout_s"].startswith(
        "0 is not above 0; allowed: float > 0"
    )
    # a warm-up of 0 s is allowed, a timing loop of 0 s is not
    assert set(timing.policy_problems({"max_time_s": 0.0, "warmup_s": 0})) == {"max_time_s"}
    assert timing.policy_problems({"min_reps": 10, "max_reps": 5}) == {"min_reps": "10 is above max_reps (5)"}
    assert timing.policy_problems({"min_reps": 2, "max_time_s": 1.5, "cuda_graph": True}) == {}
    assert set(timing.policy_problems({"case_timeout_s": float("inf"), "warmup_s": float("nan")})) == {
        "case_timeout_s",
        "warmup_s",
    }


def test_every_policy_key_is_one_declared_param_with_the_policys_default():
    # One mechanism checks typed values: a policy key is a contract.Param (its problem() is the
    # technique params' check), declared once, so a new Policy field without a declaration fails here.
    fields = {f.name: f.default for f in dataclasses.fields(timing.Policy)}
    assert list(timing.POLICY_PARAMS) == list(fields)
    for name, param in timing.POLICY_PARAMS.items():
        assert isinstance(param, Param) and param.default == fields[name] and param.help, name
    assert timing.POLICY_PARAMS["warmup_s"].coerce(1) == 1.0 and isinstance(
        timing.POLICY_PARAMS["warmup_s"].coerce(1), float
    )


def test_a_failed_call_does_not_keep_its_tensors_alive():
    # A kept exception pins its frames' locals; after an out-of-memory error that would keep the
    # failed variant's tensors allocated while the next variants run.
    refs = []

    def fails(_):
        scratch = torch.randn(1000)
        refs.append(weakref.ref(scratch))
        raise MemoryError("simulated out of memory")

    policy = timing.Policy(warmup_s=0.0, min_reps=1, max_reps=1, min_time_s=0.0, target_iqr=1.0)
    out = timing.measure_interleaved({"a": fails}, timing.Clock(CPU), policy)
    assert refs and refs[0]() is None
    assert "simulated out of memory" in "".join(traceback.format_exception(out["a"].error))


def test_repeat_scale_never_shrinks_the_case_time_limit():
    policy = timing.Policy(case_timeout_s=100.0)
    assert policy.scaled(0.1).case_timeout_s == 100.0
    assert policy.scaled(3.0).case_timeout_s == 300.0


# -- the time cap before min_reps (issue 34: a loaded machine ended loops at one timed call) ------
def _slow_calls(monkeypatch, seconds):
    """Two variants of ``seconds`` a call on a fake clock: however loaded the machine, a round
    takes 2 x ``seconds`` exactly."""
    fake = FakeTime()
    monkeypatch.setattr(timing.time, "perf_counter_ns", fake.perf_counter_ns)
    monkeypatch.setattr(timing.time, "perf_counter", fake.perf_counter)
    return fake, {"a": lambda _: fake.work(seconds), "b": lambda _: fake.work(seconds)}


def test_with_a_deadline_timing_goes_past_the_time_cap_until_min_reps(monkeypatch):
    """A round of 4 s against max_time_s = 2 s: without the rule one round (n=1, no CI); with a
    deadline far off, timing goes on to min_reps and stops there, and nothing is under-sampled."""
    fake, calls = _slow_calls(monkeypatch, 2.0)
    policy = timing.Policy(warmup_s=0.0, min_reps=5, max_reps=50, min_time_s=0.0, max_time_s=2.0, target_iqr=0.0)
    out = timing.measure_interleaved(calls, timing.Clock(CPU), policy, deadline=fake.perf_counter() + 1000.0)
    assert out["a"].n == out["b"].n == 5
    assert out["a"].under_sampled is None and out["b"].under_sampled is None


def test_without_a_deadline_the_time_cap_ends_timing_and_marks_the_variants_under_sampled(monkeypatch):
    fake, calls = _slow_calls(monkeypatch, 2.0)
    policy = timing.Policy(warmup_s=0.0, min_reps=5, max_reps=50, min_time_s=0.0, max_time_s=2.0, target_iqr=0.0)
    out = timing.measure_interleaved(calls, timing.Clock(CPU), policy)
    assert out["a"].n == 1
    assert out["a"].under_sampled == "1 of min_reps 5 timed calls: time cap (max_time_s = 2 s) reached at 4.0 s"


def test_the_deadline_is_a_hard_bound_no_round_is_started_that_would_pass_it(monkeypatch):
    """Rounds of 4 s, the deadline 10 s after timing starts: after round 2 (8 s) a third would end
    at 12 s, past it, so timing stops at n=2 and says why; the case's own limit is never reached
    from timing."""
    fake, calls = _slow_calls(monkeypatch, 2.0)
    policy = timing.Policy(warmup_s=0.0, min_reps=5, max_reps=50, min_time_s=0.0, max_time_s=2.0, target_iqr=0.0)
    start = fake.perf_counter() + 4.0  # the warm-up round (one call each) comes first
    out = timing.measure_interleaved(calls, timing.Clock(CPU), policy, deadline=start + 10.0)
    assert out["a"].n == out["b"].n == 2
    assert fake.perf_counter() <= start + 10.0
    assert out["b"].under_sampled == (
        "2 of min_reps 5 timed calls: the case's time limit left no room for another round (8.0 s of timing)"
    )


def test_a_variant_that_raised_is_not_called_under_sampled(monkeypatch):
    """Its error says why it has no samples; the one that ran on, stopped by the cap, is marked."""
    _, calls = _slow_calls(monkeypatch, 2.0)

    def broken(_):
        raise RuntimeError("boom")

    policy = timing.Policy(warmup_s=0.0, min_reps=5, max_reps=50, min_time_s=0.0, max_time_s=2.0, target_iqr=0.0)
    out = timing.measure_interleaved({"a": calls["a"], "b": broken}, timing.Clock(CPU), policy)
    assert out["b"].error is not None and out["b"].under_sampled is None
    assert out["a"].under_sampled is not None


def test_the_runners_timing_deadline_is_a_share_of_the_case_limit():
    assert timing.timing_deadline(100.0, 300.0) == pytest.approx(100.0 + timing.TIMING_DEADLINE_SHARE * 300.0)
    assert 0.5 <= timing.TIMING_DEADLINE_SHARE < 1.0  # room left for metrics, energy and profiles
