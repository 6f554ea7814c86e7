"""Energy per call against an NVML energy counter that refreshes only every 100 ms (issue 24):
windows span several counter steps, the figure carries its uncertainty, and a mean power above
the board's limit, or a counter that does not move, gives a reason instead of a number."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch
from test_telemetry import NOT_SUPPORTED, FakeClock, FakeNvml, FakeNVMLError

from gpubench.measure import energy, timing
from gpubench.measure.energy import (
    MIN_COUNTER_STEPS,
    TARGET_REL_UNCERTAINTY,
    measure_energy_per_call,
    power_limit_problem,
)
from gpubench.measure.telemetry import NvmlSource, TelemetrySampler
from gpubench.records.results import cases_frame, json_safe
from gpubench.run import runner
from gpubench.run.scenario import Case


class SteppedNvml(FakeNvml):
    """A fake NVML whose energy counter is refreshed every ``period_s`` of ``clock`` (at
    ``phase_s + k * period_s``) with what a board drawing ``power_w`` has used since t = 0, in
    whole mJ; between refreshes it returns the last value. The board's enforced limit is
    ``limit_w`` (None: NVML does not report one)."""

    def __init__(
        self, clock, power_w: float, period_s: float = 0.1, phase_s: float = 0.0, limit_w: float | None = 700.0
    ):
        super().__init__()
        self.clock, self.power_w, self.period_s, self.phase_s = clock, power_w, period_s, phase_s
        self.limit_w = limit_w

    def refreshed_at(self) -> float:
        return self.phase_s + math.floor((self.clock() - self.phase_s) / self.period_s) * self.period_s

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self.calls["energy"] += 1
        return 9_000_000 + math.floor(self.power_w * self.refreshed_at() * 1000.0)

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        if self.limit_w is None:
            raise FakeNVMLError(NOT_SUPPORTED)
        return int(self.limit_w * 1000)

    def nvmlDeviceGetPowerManagementLimit(self, h):
        raise FakeNVMLError(NOT_SUPPORTED)


def measure(
    power_w: float,
    call_s: float,
    min_window_s: float,
    *,
    phase_s: float = 0.0,
    period_s: float = 0.1,
    limit_w: float | None = 700.0,
    start_s: float = 10.0,
):
    """Measure a call that takes ``call_s`` of a fake clock, through NvmlSource and the sampler,
    as the runner does."""
    clock = FakeClock(start_s)
    sampler = TelemetrySampler(NvmlSource(0, nvml=SteppedNvml(clock, power_w, period_s, phase_s, limit_w)), clock=clock)

    def call():
        clock.t += call_s

    return measure_energy_per_call(
        call, sampler.energy_mj, clock, min_window_s=min_window_s, power_limit_w=sampler.power_limit_w()
    )


def test_a_window_shorter_than_the_counters_step_is_widened_until_it_has_advanced_several_times():
    m = measure(power_w=300.0, call_s=0.01, min_window_s=0.05)
    assert m.error is None and m.mj_per_call is not None
    assert m.counter_steps >= MIN_COUNTER_STEPS >= 4
    assert m.window_s >= 0.3  # 4 changes span 3 refresh periods
    assert m.calls == round(m.window_s / 0.01)
    assert m.counter_period_s == pytest.approx(0.1, rel=0.15)  # the cadence it saw
    assert m.mj_per_call == pytest.approx(300.0 * 0.01 * 1000.0, rel=TARGET_REL_UNCERTAINTY)


@pytest.mark.parametrize("call_s", [0.001, 0.01, 0.037, 0.116])
@pytest.mark.parametrize("phase_s", [0.0, 0.033, 0.071])
def test_the_recorded_uncertainty_covers_the_true_energy_per_call(call_s, phase_s):
    m = measure(power_w=450.0, call_s=call_s, min_window_s=0.3, phase_s=phase_s)
    true_mj = 450.0 * call_s * 1000.0
    assert m.error is None
    assert 0 < m.uncertainty_mj
    assert abs(m.mj_per_call - true_mj) <= m.uncertainty_mj
    assert m.power_limit_w == 700.0 and m.mean_power_w == pytest.approx(450.0, rel=0.1)
    # Short calls time the counter's changes finely: the +-5% target is met.
    if call_s <= 0.01:
        assert m.uncertainty_mj <= TARGET_REL_UNCERTAINTY * m.mj_per_call


def test_a_counter_implying_power_above_the_board_limit_is_flagged_not_reported():
    m = measure(power_w=840.0, call_s=0.01, min_window_s=0.3, limit_w=700.0)
    assert m.mj_per_call is None and m.mean_power_w is None and m.uncertainty_mj is None
    assert "mean power 840 W" in m.error and "700 W board limit" in m.error
    assert m.power_limit_w == 700.0 and m.counter_steps >= MIN_COUNTER_STEPS  # the window is still described
    # Within the stated margin (+10%) a reading stands; without a known limit nothing is checked.
    assert measure(power_w=740.0, call_s=0.01, min_window_s=0.3, limit_w=700.0).mj_per_call is not None
    assert measure(power_w=840.0, call_s=0.01, min_window_s=0.3, limit_w=None).mj_per_call is not None


def test_a_counter_that_never_advances_gives_a_reason_not_a_number():
    m = measure(power_w=0.0, call_s=0.01, min_window_s=0.3)
    assert m.mj_per_call is None and m.mean_power_w is None
    assert "changed 0 time(s)" in m.error and f"{MIN_COUNTER_STEPS} changes are needed" in m.error
    assert energy.MAX_WINDOW_S <= m.window_s < energy.MAX_WINDOW_S + 0.02  # capped: the case cannot hang
    # A counter refreshed every 2 s changes once or twice in the capped window: still no figure.
    slow = measure(power_w=300.0, call_s=0.01, min_window_s=0.3, period_s=2.0)
    assert slow.mj_per_call is None and slow.counter_steps < MIN_COUNTER_STEPS


def test_calls_longer_than_the_window_say_so():
    m = measure(power_w=300.0, call_s=4.0, min_window_s=0.3)
    assert m.mj_per_call is None and m.calls == 1 and "outlasts the counter's refresh" in m.error


def test_a_counter_that_goes_backwards_gives_a_reason():
    values = iter([5_000.0, 6_000.0, 1_000.0])
    clock = FakeClock()

    def call():
        clock.t += 0.01

    m = measure_energy_per_call(call, lambda: next(values), clock, min_window_s=0.3)
    assert m.mj_per_call is None and "went backwards" in m.error


def test_the_issue_24_figure_is_rejected_and_its_window_now_measures_right():
    # Issue 24: 97.5 J for one 116 ms call, on a 700 W board, from a 0.1 s window. The fake reproduces it:
    # a board at 487.5 W whose counter refreshes every 100 ms, one read before and one after the call.
    clock = FakeClock(0.095)
    nv = SteppedNvml(clock, power_w=487.5)
    src = NvmlSource(0, nvml=nv)
    before = src.energy_mj()
    clock.t += 0.116
    old_mj_per_call = src.energy_mj() - before
    assert old_mj_per_call == pytest.approx(97_500.0, abs=1.0)
    problem = power_limit_problem(old_mj_per_call / 1000.0 / 0.116, src.power_limit_w(), 0.116)
    assert problem is not None and "841 W" in problem and "700 W board limit" in problem
    # The same board, call and 0.1 s minimum window, measured against the counter's steps.
    m = measure(power_w=487.5, call_s=0.116, min_window_s=0.1, start_s=0.095)
    assert m.error is None and m.counter_steps >= MIN_COUNTER_STEPS
    assert abs(m.mj_per_call - 487.5 * 116.0) <= m.uncertainty_mj
    assert m.uncertainty_mj < 0.1 * m.mj_per_call


# -- in the runner ------------------------------------------------------------------------------


class SteppedProbe:
    """What a worker gives run_case: tags, and a counter refreshed every ``period_s`` of real time
    at ``power_w`` (the runner reads time.perf_counter; the counter is a function of it)."""

    def __init__(self, power_w: float, limit_w: float | None, period_s: float = 0.02):
        self.power_w, self.limit_w, self.period_s = power_w, limit_w, period_s

    def set_tag(self, case_id, variant):
        pass

    def energy_mj(self):
        refreshed = math.floor(time.perf_counter() / self.period_s) * self.period_s
        return math.floor(self.power_w * refreshed * 1000.0)

    def power_limit_w(self):
        return self.limit_w


def run_toy(probe):
    policy = timing.Policy(
        warmup_s=0.0, min_reps=2, max_reps=3, min_time_s=0.0, max_time_s=1.0, target_iqr=1.0, energy_s=0.01
    )
    case = Case("toy_kernel", {"n": 64, "mode": "ok"}, policy, 1)
    cpu = torch.device("cpu")
    return runner.run_case(case, cpu, timing.Clock(cpu, flush_l2=False), probe, None)


def test_the_runner_records_each_variants_energy_window(toys):
    record = run_toy(SteppedProbe(power_w=300.0, limit_w=700.0))
    assert record.status == "passed"
    for name in ("baseline", "optimized"):
        v = record.variants[name]
        assert v.energy_error is None and v.energy_mj_per_call == v.energy.mj_per_call
        assert v.energy.counter_steps >= MIN_COUNTER_STEPS and v.energy.window_s >= 3 * 0.02
        assert v.energy.uncertainty_mj > 0 and v.energy.power_limit_w == 700.0
        # Reads and the clock are not one instant on a real machine: a loose bound, far from normal error.
        assert v.energy.mean_power_w == pytest.approx(300.0, rel=0.25)
    doc = json.loads(json.dumps(json_safe(record.to_dict()), allow_nan=False))
    assert doc["variants"]["optimized"]["energy"]["counter_steps"] >= MIN_COUNTER_STEPS
    row = cases_frame({"cases": [doc]}).set_index("variant").loc["optimized"]
    assert row["energy_uncertainty_mj"] == pytest.approx(doc["variants"]["optimized"]["energy"]["uncertainty_mj"])


def test_the_runner_flags_an_impossible_energy_figure_and_the_case_still_passes(toys):
    record = run_toy(SteppedProbe(power_w=840.0, limit_w=700.0))
    assert record.status == "passed"
    for name in ("baseline", "optimized", "peer"):
        v = record.variants[name]
        assert v.energy_mj_per_call is None and "700 W board limit" in v.energy_error
    assert record.variants["elsewhere"].energy is None  # skipped: never called


def test_results_without_energy_windows_still_tabulate():
    old = {
        "id": "c",
        "technique": "t",
        "status": "passed",
        "params": {},
        "variants": {"baseline": {"role": "baseline", "energy_mj_per_call": 12.0, "energy_error": None}},
    }
    row = cases_frame({"cases": [old]}).iloc[0]
    assert row["energy_mj_per_call"] == 12.0 and row["energy_uncertainty_mj"] is None


# -- long calls: measured over the timed calls themselves (issue 33) -------------------------------


def over_timed_calls(
    power_w: float,
    call_s: float,
    calls: int = 5,
    *,
    read_s: float = 0.05,
    gap_s: float = 0.013,
    phase_s: float = 0.0,
    period_s: float = 0.1,
    limit_w: float | None = 700.0,
    counter=None,
):
    """``calls`` calls of ``call_s`` each on a fake clock, ``gap_s`` apart (the other variants'
    calls, resets), while a reader takes the counter every ``read_s`` into a CounterLog, as the
    sampler's thread does; then energy over those calls. ``counter``: a function of the time
    replacing the stepped board. Returns the measurement and the fake NVML (its reads counted)."""
    clock = FakeClock(10.0)
    nv = SteppedNvml(clock, power_w, period_s, phase_s, limit_w)
    if counter is not None:
        nv.nvmlDeviceGetTotalEnergyConsumption = lambda h: counter(clock.t)
    src = NvmlSource(0, nvml=nv)
    log = energy.CounterLog(clock)
    next_read = [clock.t]

    def advance(seconds: float) -> None:
        end = clock.t + seconds
        while next_read[0] <= end:
            clock.t = next_read[0]
            log.read(src.energy_mj)
            next_read[0] += read_s
        clock.t = end

    bounds = []
    for _ in range(calls):
        advance(gap_s)
        start = clock.t
        advance(call_s)
        bounds.append((start, clock.t))
    advance(gap_s)
    return energy.measure_over_calls(log.readings(), bounds, power_limit_w=src.power_limit_w()), nv


@pytest.mark.parametrize("call_s", [0.45, 0.8, 1.7, 5.0])
@pytest.mark.parametrize("phase_s", [0.0, 0.033, 0.071])
@pytest.mark.parametrize("read_s", [0.05, 0.02])
def test_long_calls_get_the_true_energy_within_the_stated_bounds_from_their_own_counter_changes(
    call_s, phase_s, read_s
):
    m, _ = over_timed_calls(power_w=450.0, call_s=call_s, phase_s=phase_s, read_s=read_s)
    true_mj = 450.0 * call_s * 1000.0
    assert m.error is None and m.method == energy.METHOD_TIMED_CALLS
    assert 0 < m.uncertainty_mj and abs(m.mj_per_call - true_mj) <= m.uncertainty_mj
    assert m.mean_power_w == pytest.approx(450.0, rel=0.02) and m.power_limit_w == 700.0
    assert m.calls == 5 and m.window_s == pytest.approx(5 * call_s)
    assert m.counter_period_s == pytest.approx(0.1, rel=0.05)  # the cadence within the calls
    # Taken over each call between its first and last change: less than the calls' own time.
    assert 0 < m.covered_s < m.window_s
    # Each change is timed to within the reads around it, so longer calls and finer reads give
    # tighter bounds: the brackets are +-read_s against the time between a call's edges.
    assert m.uncertainty_mj / m.mj_per_call <= 2 * read_s / (call_s - 2 * 0.1 - read_s)


def test_the_calls_changes_are_used_not_those_between_them():
    # Between the calls (gaps of 0.5 s: other variants, resets) the board draws 900 W; inside them
    # 300 W. Only the calls' own edges count, so the figure is the calls' power, not the mix.
    call_s, gap_s = 1.0, 0.5

    def counter(t: float) -> float:
        k = math.floor((t - 10.0) / 0.1 + 1e-9)  # refreshed every 100 ms from t = 10
        refreshed, mj = 10.0, 0.0
        for _ in range(k):  # energy of each 100 ms step at the power drawn then
            mid = refreshed + 0.05 - 10.0
            inside = (mid % (call_s + gap_s)) >= gap_s
            mj += (300.0 if inside else 900.0) * 0.1 * 1000.0
            refreshed += 0.1
        return 5_000_000 + math.floor(mj)

    m, _ = over_timed_calls(power_w=0.0, call_s=call_s, gap_s=gap_s, counter=counter)
    assert m.error is None and m.mean_power_w == pytest.approx(300.0, rel=0.02)
    assert abs(m.mj_per_call - 300.0 * call_s * 1000.0) <= m.uncertainty_mj


def test_a_counter_that_does_not_move_during_long_calls_gives_a_reason_not_a_number():
    m, _ = over_timed_calls(power_w=0.0, call_s=1.0)
    assert m.mj_per_call is None and m.method == energy.METHOD_TIMED_CALLS
    assert "changed 0 time(s) inside 5 timed call(s)" in m.error and "a figure needs 3" in m.error
    # A counter refreshed every 2 s changes at most once inside a 1 s call: no span within a call.
    slow, _ = over_timed_calls(power_w=300.0, call_s=1.0, period_s=2.0)
    assert slow.mj_per_call is None and "spanning 0 refresh period(s)" in slow.error
    # Nothing read inside the calls at all (a reader that stopped): said so.
    none = energy.measure_over_calls([], [(10.0, 11.0), (11.5, 12.5)])
    assert none.mj_per_call is None and "no reading of the counter fell inside them" in none.error


def test_a_counter_that_goes_backwards_inside_a_long_call_gives_a_reason():
    m, _ = over_timed_calls(
        power_w=300.0,
        call_s=1.0,
        counter=lambda t: 1_000.0 if 12.0 <= t < 12.3 else 9_000_000 + math.floor(300 * t) * 1000,
    )
    assert m.mj_per_call is None and "went backwards during a timed call" in m.error


def test_long_calls_implying_power_above_the_board_limit_are_flagged_not_reported():
    m, _ = over_timed_calls(power_w=840.0, call_s=1.0, limit_w=700.0)
    assert m.mj_per_call is None and m.mean_power_w is None and m.uncertainty_mj is None
    assert "mean power 840 W" in m.error and "700 W board limit" in m.error
    assert m.counter_steps >= MIN_COUNTER_STEPS  # what was seen is still described
    assert over_timed_calls(power_w=840.0, call_s=1.0, limit_w=None)[0].mj_per_call is not None


def test_a_call_counts_as_long_from_four_counter_periods_or_the_windows_limit():
    assert energy.long_call_s(0.1) == pytest.approx(0.4)
    # A window reads once per call: 4 changes need 4 reads, which calls of 0.75 s fill to the 3 s cap.
    assert energy.long_call_s(None) == energy.long_call_s(1.0) == energy.LONG_CALL_S == pytest.approx(0.75)
    assert energy.calls_are_long(0.4, 0.1) and not energy.calls_are_long(0.39, 0.1)
    assert energy.calls_are_long(0.75, None) and not energy.calls_are_long(0.5, None)
    # For the estimate: a long call's variant adds no window, a short one's or an unknown one's does.
    assert energy.window_bounds_s(0.3, call_s=2.0) == (0.0, 0.0)
    assert energy.window_bounds_s(0.3, call_s=0.01) == energy.window_bounds_s(0.3) == (0.3, energy.max_window_s(0.3))
    assert energy.window_bounds_s(0.0, call_s=0.01) == (0.0, 0.0)


def test_the_counters_cadence_is_read_from_its_changes_and_a_stall_does_not_stretch_it():
    reads = [energy.Reading(t, t, 1000.0 * math.floor(t / 0.1)) for t in (i * 0.05 for i in range(40))]
    assert energy.counter_period_s(reads) == pytest.approx(0.1, rel=0.01)
    stalled = reads[:10] + reads[25:]  # the reader missed 0.75 s
    assert energy.counter_period_s(stalled) == pytest.approx(0.1, rel=0.01)
    assert energy.counter_period_s(reads[:6]) is None  # fewer than 4 changes


def test_older_results_read_as_windows():
    old = {
        "mj_per_call": 12.0,
        "uncertainty_mj": 1.0,
        "mean_power_w": 300.0,
        "power_limit_w": 700.0,
        "window_s": 0.4,
        "calls": 40,
        "counter_steps": 4,
        "counter_period_s": 0.1,
    }
    m = energy.EnergyMeasurement.from_dict(old)
    assert m.method == energy.METHOD_WINDOW and m.covered_s is None and m.mj_per_call == 12.0
    assert measure(power_w=300.0, call_s=0.01, min_window_s=0.3).method == energy.METHOD_WINDOW


def test_a_counter_reader_thread_logs_reads_until_stopped():
    values = iter(range(10**6))
    reader = energy.CounterReader(lambda: float(next(values)), interval_s=0.001)
    reader.start()
    deadline = time.monotonic() + 5.0
    while len(reader.log.readings()) < 3 and time.monotonic() < deadline:
        time.sleep(0.002)
    reader.stop()
    reads = reader.log.readings()
    assert len(reads) >= 3 and not reader.running
    assert all(r.t0 <= r.t1 for r in reads) and [r.mj for r in reads] == sorted(r.mj for r in reads)
    assert len(reader.log.readings()) == len(reads)  # nothing read after stop()


# -- long calls in the runner --------------------------------------------------------------------


class FakeBoard:
    """A board on a fake clock: NVML's counter refreshed every 100 ms at ``power_w``, read by the
    real TelemetrySampler every 50 ms of that clock as the calls advance it (its thread stands
    in: ``advance`` takes the reads a running thread would have taken meanwhile)."""

    def __init__(self, power_w: float, limit_w: float | None = 700.0):
        self.clock = FakeClock(10.0)
        self.nvml = SteppedNvml(self.clock, power_w, limit_w=limit_w)
        self.sampler = TelemetrySampler(NvmlSource(0, nvml=self.nvml), interval_s=0.05, clock=self.clock)
        self.next_read = self.clock.t
        self.calls: dict[str, int] = {}

    def advance(self, seconds: float) -> None:
        end = self.clock.t + seconds
        while self.next_read <= end:
            self.clock.t = self.next_read
            self.sampler.sample_once()
            self.next_read = round(self.next_read + 0.05, 9)
        self.clock.t = end

    def call(self, name: str, seconds: float) -> torch.Tensor:
        self.calls[name] = self.calls.get(name, 0) + 1
        self.advance(seconds)
        return torch.zeros(1)


BOARD: list[FakeBoard] = []  # the board the test's technique calls on


@pytest.fixture
def long_and_short(monkeypatch):
    """A technique whose baseline takes 1.5 s of the fake clock per call and its optimized
    variant 10 ms, on a 300 W board; the sampler counts as running (its reads are the board's)."""
    from gpubench import techniques
    from gpubench.contract import CheckResult, Technique, Workload

    tech = Technique("energy_long_short", summary="a long and a short call", shape="kernel", params=[])
    tech.build(lambda params, device, seed: Workload(params, device, seed, {}))
    tech.variant("baseline", role="baseline")(lambda w: BOARD[0].call("baseline", 1.5))
    tech.variant("optimized", role="optimized")(lambda w: BOARD[0].call("optimized", 0.01))
    tech.check(lambda ref, out: CheckResult(True, 0.0, 0.0, "exact"))
    techniques.register(tech, "test_energy:long_and_short")
    board = FakeBoard(power_w=300.0)
    BOARD[:] = [board]
    monkeypatch.setattr(TelemetrySampler, "running", property(lambda self: True))
    yield board
    techniques.unregister(tech.name)
    BOARD.clear()


def test_the_runner_measures_long_calls_over_their_timed_calls_with_no_call_of_their_own(long_and_short):
    board = long_and_short
    policy = timing.Policy(
        warmup_s=0.0, min_reps=3, max_reps=3, min_time_s=0.0, max_time_s=60.0, target_iqr=1.0, energy_s=0.3
    )
    cpu = torch.device("cpu")
    record = runner.run_case(
        Case("energy_long_short", {}, policy, 1), cpu, timing.Clock(cpu, flush_l2=False), board.sampler, None
    )
    assert record.status == "passed", record.failure
    long, short = record.variants["baseline"], record.variants["optimized"]
    # The long variant: its checked call, one warm-up call and its 3 timed calls, nothing more.
    assert board.calls["baseline"] == 1 + 1 + len(long.samples_s) == 5
    assert long.energy.method == energy.METHOD_TIMED_CALLS and long.energy.calls == 3
    assert long.energy_error is None and long.energy_mj_per_call == long.energy.mj_per_call
    assert abs(long.energy_mj_per_call - 300.0 * 1.5 * 1000.0) <= long.energy.uncertainty_mj
    assert long.energy.window_s == pytest.approx(3 * 1.5)  # the timed calls' own time on the clock
    # The short variant: a window of its own after timing, many calls more.
    assert short.energy.method == energy.METHOD_WINDOW
    assert board.calls["optimized"] == 1 + 1 + len(short.samples_s) + short.energy.calls
    assert short.energy.calls >= 0.3 / 0.01 and short.energy_error is None
    assert abs(short.energy_mj_per_call - 300.0 * 0.01 * 1000.0) <= short.energy.uncertainty_mj
    # What a results file holds, and reads back.
    doc = json.loads(json.dumps(json_safe(record.to_dict()), allow_nan=False))
    assert doc["variants"]["baseline"]["energy"]["method"] == "timed_calls"
    assert doc["variants"]["optimized"]["energy"]["method"] == "window"
    row = cases_frame({"cases": [doc]}).set_index("variant")
    assert list(row["energy_method"]) == ["timed_calls", "window"]


def test_the_runner_gives_long_calls_too_few_counter_changes_an_error_without_extra_calls(long_and_short):
    board = long_and_short
    board.nvml.period_s = 2.0  # a counter refreshed every 2 s: at most one change in a 1.5 s call
    policy = timing.Policy(
        warmup_s=0.0, min_reps=3, max_reps=3, min_time_s=0.0, max_time_s=60.0, target_iqr=1.0, energy_s=0.3
    )
    cpu = torch.device("cpu")
    record = runner.run_case(
        Case("energy_long_short", {}, policy, 1), cpu, timing.Clock(cpu, flush_l2=False), board.sampler, None
    )
    long = record.variants["baseline"]
    assert record.status == "passed" and board.calls["baseline"] == 5
    assert long.energy.method == energy.METHOD_TIMED_CALLS and long.energy_mj_per_call is None
    assert "inside 3 timed call(s)" in long.energy_error and "a figure needs 3" in long.energy_error


def test_a_workers_probe_reads_the_counter_throughout_on_a_thread_of_its_own():
    # In a worker the telemetry sampler runs in the supervisor; its probe reads the counter itself,
    # from the first ask (before a case is timed) until closed, and has no log without a counter.
    import ctypes

    from gpubench.run import worker

    buffer = ctypes.create_string_buffer(worker.TAG_BYTES)
    assert worker.SharedTag(buffer, None).energy_log is None

    class Counter:
        def __init__(self):
            self.reads = 0

        def energy_mj(self):
            self.reads += 1
            return float(self.reads)

        def power_limit_w(self):
            return 700.0

    counter = Counter()
    probe = worker.SharedTag(buffer, counter, interval_s=0.001)
    log = probe.energy_log
    assert log is not None and log is probe.energy_log  # one reader, however often asked
    deadline = time.monotonic() + 5.0
    while len(log.readings()) < 3 and time.monotonic() < deadline:
        time.sleep(0.002)
    probe.close()
    reads = log.readings()
    assert len(reads) >= 3 and [r.mj for r in reads] == sorted(r.mj for r in reads)
    assert len(log.readings()) == len(reads)  # closed: no more reads


def test_the_report_marks_energy_taken_over_the_timed_calls_and_says_what_the_mark_means(tmp_path):
    from gpubench.reports import html, markdown

    def variant(role, mj, method):
        measured = {
            "mj_per_call": mj,
            "uncertainty_mj": 1.0,
            "mean_power_w": 300.0,
            "power_limit_w": 700.0,
            "window_s": 3.3,
            "calls": 3,
            "counter_steps": 30,
            "counter_period_s": 0.1,
        }
        return {
            "role": role,
            "status": "ok",
            "samples_s": [1.0, 1.1, 1.2],
            "stats": {"median": 1.1, "n": 3},
            "energy_mj_per_call": mj,
            "energy": dict(measured, method=method) if method else measured,
        }

    def doc(base_method):
        return {
            "kind": "gpubench.results",
            "schema_version": 3,
            "run_id": "r",
            "scenario": {"name": "s"},
            "device": "cuda:0",
            "cases": [
                {
                    "id": "t[a=1]",
                    "technique": "t",
                    "status": "passed",
                    "params": {"a": 1},
                    "speedups": {},
                    "variants": {
                        "base": variant("baseline", 330_000.0, base_method),
                        "opt": variant("optimized", 3.0, "window"),
                    },
                }
            ],
        }

    def report(base_method):
        run_dir = tmp_path / str(base_method)
        run_dir.mkdir()
        (run_dir / "results.json").write_text(json.dumps(doc(base_method)))
        written = html.write_report(run_dir)
        return written.html.read_text(encoding="utf-8"), written.markdown.read_text(encoding="utf-8")

    page, md = report("timed_calls")
    assert '<span class="nw">330 J*</span> / <span class="nw">3 mJ</span>' in page and "| 330 J* / 3 mJ |" in md
    assert 'id="energy-note"' in page and markdown.TIMED_CALLS_NOTE in md
    # Windows only, or a file from before the method was recorded (a window): no mark, no note.
    for method in ("window", None):
        page, md = report(method)
        assert "330 J / 3 mJ" in md and "J*" not in page + md
        assert 'id="energy-note"' not in page and markdown.TIMED_CALLS_NOTE not in md
