"""Energy per call from NVML's energy counter, which advances in steps.

The driver refreshes ``nvmlDeviceGetTotalEnergyConsumption`` (mJ) at a cadence of its own
(around 100 ms on some boards); between refreshes a read returns the last value. One read before
and one after a short run can therefore be off by up to one refresh's energy at each end: issue
24 saw 97.5 J for a 116 ms call from a 0.1 s window, 840 W on a 700 W board.

So the counter's own steps are timed. The variant runs back to back and the counter is read after
every call; a change of value (an *edge*) is a refresh that happened between two reads. The
energy between the first and the last edge is exact (both values are fresh); only the instants
of those two refreshes are uncertain, each to within the gap between the reads around it. Mean
power = that energy / the time between the edges, with bounds from those gaps; energy per call =
mean power x wall time per call. A mean power above the board's limit is flagged, never reported.

A call that outlasts several refreshes (:func:`calls_are_long`) cannot be measured that way: a
read after each call sees at most one edge per call, and four of them take more than the window's
cap. Such a variant gets no window of its own: the counter is read at a steady cadence throughout
(the telemetry sampler's thread keeps the readings, :class:`CounterLog`) and each timed call's own
edges are used (:func:`measure_over_calls`): the energy between a call's first and last edge,
summed over the calls, over the summed time between those edges, with the same bounds. That mean
power stands for the whole call: the part of a call before its first and after its last edge (up
to a refresh period at each end) is not weighed in it, which ``covered_s`` against ``window_s``
shows.
"""

from __future__ import annotations

import bisect
import collections
import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from gpubench.records.energy import METHOD_TIMED_CALLS as METHOD_TIMED_CALLS
from gpubench.records.energy import METHOD_WINDOW as METHOD_WINDOW
from gpubench.records.energy import EnergyMeasurement as EnergyMeasurement

# Changes of the counter to see before a figure is given: 4 changes span 3 whole refresh periods,
# so one late or irregular refresh moves the window by a third at most, and the cadence is
# measured from at least 3 intervals. Against a 100 ms counter that is 0.3-0.4 s, about the
# default policy.energy_s, so a default window is rarely lengthened.
MIN_COUNTER_STEPS = 4
# Past MIN_COUNTER_STEPS and the minimum window, calls go on until the mean power is known to
# +-5% (long calls make the edges' timing coarse) or the window reaches its cap.
TARGET_REL_UNCERTAINTY = 0.05
# The window's cap (s), or twice policy.energy_s where that is longer: no case hangs on a
# counter that never moves.
MAX_WINDOW_S = 3.0
# A mean power above the limit by more than this fraction is not a reading but an error: the
# board's limiter holds the average to the limit within a few percent, and NVML's power
# figures are good to about +-5%.
POWER_LIMIT_MARGIN = 0.10
# A call at least this many counter refresh periods long is measured over the timed calls
# themselves (:func:`calls_are_long`). Against a 100 ms counter that is 0.4 s, where the two ways
# are about as good: the window's reads, one per call, bound its power to +-1/(cap/call - 1)
# (+-15% in 3 s), the sampler's 50 ms reads a call's own edges to +-0.05 s / 0.3 s (+-17%). Past
# it the timed calls do better, and they cost no call.
LONG_CALL_PERIODS = 4
# Whatever the counter's cadence: a call this long gets at most MIN_COUNTER_STEPS reads in a
# window of MAX_WINDOW_S, each edge bracketed by a whole call (+-1/3 at best; beyond it, none).
LONG_CALL_S = MAX_WINDOW_S / MIN_COUNTER_STEPS


@dataclass(frozen=True)
class _Edge:
    before_s: float  # the last read that still returned the old value
    seen_s: float  # the read that returned the new one
    mj: float


class Reading(NamedTuple):
    """One read of the counter and the host-clock instants just before and just after it."""

    t0: float
    t1: float
    mj: float


class CounterLog:
    """Readings of the energy counter with their host-clock instants, appended by whoever reads it
    at a steady cadence (the telemetry sampler's thread, or a worker's :class:`CounterReader`), so
    that the runner can pick out those inside a variant's timed calls. ``clock`` is the host clock
    the instants are on (the runner times the calls' bounds on the same one); only the last
    ``max_readings`` are kept (2**16: 55 min at 50 ms)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_readings: int = 2**16):
        self.clock = clock
        self._readings: collections.deque[Reading] = collections.deque(maxlen=max_readings)
        self._lock = threading.Lock()

    def read(self, read_mj: Callable[[], float | None]) -> float | None:
        """Read the counter through ``read_mj`` now and keep the value (None, a failed read, is
        not kept: the readings around it are then further apart, and so are their bounds)."""
        t0 = self.clock()
        value = read_mj()
        t1 = self.clock()
        if value is not None:
            with self._lock:
                self._readings.append(Reading(t0, t1, float(value)))
        return value

    def readings(self, start_s: float = -math.inf, end_s: float = math.inf) -> list[Reading]:
        """The readings taken wholly within [start_s, end_s], oldest first."""
        with self._lock:
            return [r for r in self._readings if r.t0 >= start_s and r.t1 <= end_s]


class CounterReader:
    """A daemon thread that reads the counter into a :class:`CounterLog` every ``interval_s``: for
    a process that runs cases without the telemetry sampler's thread beside it (a worker: the
    sampler runs in the supervisor). ``read_mj`` must not raise."""

    def __init__(
        self, read_mj: Callable[[], float | None], interval_s: float, clock: Callable[[], float] = time.monotonic
    ):
        self.log = CounterLog(clock)
        self._read_mj = read_mj
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="gpubench-energy-counter", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.log.read(self._read_mj)
            self._stop.wait(self._interval_s)

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=max(5.0, 20 * self._interval_s))


def max_window_s(min_window_s: float) -> float:
    return max(MAX_WINDOW_S, 2.0 * min_window_s)


def long_call_s(counter_period_s: float | None) -> float:
    """Seconds from which a call counts as long: :data:`LONG_CALL_PERIODS` refreshes of the counter
    as seen, and never more than :data:`LONG_CALL_S` (nor that where the cadence is not known)."""
    if counter_period_s is None or not counter_period_s > 0:
        return LONG_CALL_S
    return min(LONG_CALL_S, LONG_CALL_PERIODS * counter_period_s)


def calls_are_long(call_s: float, counter_period_s: float | None) -> bool:
    """Whether a variant whose calls take ``call_s`` (its median) is measured over its timed calls
    (:data:`METHOD_TIMED_CALLS`) rather than in a window of its own."""
    return call_s >= long_call_s(counter_period_s)


def window_bounds_s(
    energy_s: float, call_s: float | None = None, counter_period_s: float | None = None
) -> tuple[float, float]:
    """Seconds a variant's separate energy window takes, at least and at most, for an estimate:
    (0, 0) with energy off (``energy_s`` 0) or where its calls (``call_s``, as known, e.g. from an
    earlier run) are long, which are measured over the timed calls with no call of their own;
    else ``energy_s`` up to :func:`max_window_s`. ``call_s`` None: not known, a window is counted."""
    if energy_s <= 0 or (call_s is not None and calls_are_long(call_s, counter_period_s)):
        return 0.0, 0.0
    return energy_s, max_window_s(energy_s)


def counter_period_s(readings: Sequence[Reading]) -> float | None:
    """The counter's refresh cadence seen in consecutive ``readings``: the median time between its
    changes (each change placed midway in its bracket; a stalled reader's gap does not stretch the
    median); None with fewer than :data:`MIN_COUNTER_STEPS` changes. No finer than the reads: a
    counter refreshed faster than it is read shows the reading interval."""
    edges = _edges(readings)
    if len(edges) < MIN_COUNTER_STEPS:
        return None
    mids = [(e.before_s + e.seen_s) / 2 for e in edges]
    return statistics.median(b - a for a, b in zip(mids, mids[1:]))


def _edges(readings: Sequence[Reading]) -> list[_Edge]:
    return [_Edge(a.t0, b.t1, b.mj) for a, b in zip(readings, readings[1:]) if b.mj != a.mj]


def measure_over_calls(
    readings: Sequence[Reading], calls: Sequence[tuple[float, float]], *, power_limit_w: float | None = None
) -> EnergyMeasurement:
    """Energy per call of a variant whose timed calls ran from ``calls[i][0]`` to ``calls[i][1]``
    (host clock, the device synchronized at the end), from the counter ``readings`` (a
    :class:`CounterLog`'s, oldest first, on the same clock) taken wholly inside them: no call is
    made. Each call's own edges count: the energy between its first and last, summed over the
    calls, over the summed time between them (bounded by the summed inner and outer gaps, each
    call's energy to +-1 mJ). Energy per call = that mean power x the calls' mean wall time. A
    counter that goes backwards inside a call, or that changes too few times inside the calls
    (their edges must span :data:`MIN_COUNTER_STEPS` - 1 refresh periods, as a window's), gives an
    error; so does a mean power above the board's limit (:func:`power_limit_problem`)."""
    starts = [r.t0 for r in readings]
    energy_mj = inner = outer = 0.0
    steps = periods = spanned = read_inside = 0
    problem = None
    for start, end in calls:
        inside = [
            r for r in readings[bisect.bisect_left(starts, start) : bisect.bisect_right(starts, end)] if r.t1 <= end
        ]
        back = next(((a, b) for a, b in zip(inside, inside[1:]) if b.mj < a.mj), None)
        if back is not None:
            problem = (
                f"the energy counter went backwards during a timed call ({back[0].mj:.0f} -> "
                f"{back[1].mj:.0f} mJ: a driver reset or a wrap)"
            )
            break
        edges = _edges(inside)
        steps += len(edges)
        read_inside += len(inside)
        if len(edges) < 2:
            continue
        first, last = edges[0], edges[-1]
        energy_mj += last.mj - first.mj
        # The readings between two edges of a call are one instant at least apart: never below 0.
        inner += max(0.0, last.before_s - first.seen_s)
        outer += last.seen_s - first.before_s
        periods += len(edges) - 1
        spanned += 1
    durations = [end - start for start, end in calls]
    window_s = sum(durations)
    covered = (inner + outer) / 2 if spanned else None
    period = covered / periods if periods and covered is not None else None

    def failed(error: str) -> EnergyMeasurement:
        return EnergyMeasurement(
            mj_per_call=None,
            uncertainty_mj=None,
            mean_power_w=None,
            power_limit_w=power_limit_w,
            window_s=window_s,
            calls=len(calls),
            counter_steps=steps,
            counter_period_s=period,
            error=error,
            method=METHOD_TIMED_CALLS,
            covered_s=covered,
        )

    if problem is None and (periods < MIN_COUNTER_STEPS - 1 or inner <= 0):
        problem = (
            f"the energy counter changed {steps} time(s) inside {len(calls)} timed call(s) of "
            f"{window_s:.3g} s in all, spanning {periods} refresh period(s) between changes within a call; "
            f"a figure needs {MIN_COUNTER_STEPS - 1} (as a window needs {MIN_COUNTER_STEPS} changes)"
            + ("" if read_inside else ": no reading of the counter fell inside them (was it read throughout?)")
        )
    if problem is not None or covered is None:  # covered: None only where periods is 0 (a problem)
        return failed(problem or "no timed call spanned a counter change")
    mean = energy_mj / covered / 1000.0
    low = max(energy_mj - spanned, 0.0) / outer / 1000.0
    high = (energy_mj + spanned) / inner / 1000.0
    flagged = power_limit_problem(mean, power_limit_w, covered)
    if flagged is not None:
        return failed(flagged)
    s_per_call = window_s / len(calls)
    return EnergyMeasurement(
        mj_per_call=mean * s_per_call * 1000.0,
        uncertainty_mj=max(high - mean, mean - low) * s_per_call * 1000.0,
        mean_power_w=mean,
        power_limit_w=power_limit_w,
        window_s=window_s,
        calls=len(calls),
        counter_steps=steps,
        counter_period_s=period,
        method=METHOD_TIMED_CALLS,
        covered_s=covered,
    )


def power_limit_problem(mean_power_w: float, power_limit_w: float | None, window_s: float) -> str | None:
    """Why a mean power cannot be real on this board (None when it can, or the limit is unknown)."""
    if power_limit_w is None or power_limit_w <= 0 or mean_power_w <= power_limit_w * (1 + POWER_LIMIT_MARGIN):
        return None
    return (
        f"mean power {mean_power_w:.0f} W over {window_s:.3g} s is above the {power_limit_w:.0f} W board limit "
        f"(+{POWER_LIMIT_MARGIN:.0%} margin): the energy counter's window cannot be right, so no figure is given"
    )


def _power_bounds_w(edges: list[_Edge]) -> tuple[float, float, float]:
    """(mean power, lowest, highest) in W between the first and the last edge. The refreshes lie
    somewhere in (before_s, seen_s] of their edge, so the time between them lies between the
    inner and outer gaps; the counter's values are whole mJ, so the energy is known to +-1 mJ."""
    first, last = edges[0], edges[-1]
    energy_mj = last.mj - first.mj
    inner = last.before_s - first.seen_s
    outer = last.seen_s - first.before_s
    mean = energy_mj / ((inner + outer) / 2) / 1000.0
    low = max(energy_mj - 1.0, 0.0) / outer / 1000.0
    high = (energy_mj + 1.0) / inner / 1000.0 if inner > 0 else math.inf
    return mean, low, high


def _settled(edges: list[_Edge]) -> bool:
    if len(edges) < MIN_COUNTER_STEPS:
        return False
    mean, low, high = _power_bounds_w(edges)
    return mean > 0 and max(high - mean, mean - low) <= TARGET_REL_UNCERTAINTY * mean


def measure_energy_per_call(
    call: Callable[[], Any],
    read_mj: Callable[[], float | None],
    clock: Callable[[], float],
    *,
    min_window_s: float,
    power_limit_w: float | None = None,
    sync: Callable[[], Any] = lambda: None,
) -> EnergyMeasurement:
    """Run ``call`` back to back until the counter ``read_mj`` (cumulative mJ) has changed
    :data:`MIN_COUNTER_STEPS` times, ``min_window_s`` has passed and the mean power is known to
    :data:`TARGET_REL_UNCERTAINTY`, or :func:`max_window_s` is reached. ``clock`` gives seconds;
    ``sync`` waits for the device (before the first call and after the last). Exceptions of
    ``call`` propagate. A window that cannot give a figure returns one with ``error`` set."""
    cap = max_window_s(min_window_s)
    sync()
    t_start = clock()
    last = read_mj()
    if last is None:
        return _failed("the energy counter cannot be read", power_limit_w, 0.0, 0, [])
    edges: list[_Edge] = []
    t_prev, calls, problem = t_start, 0, None
    while True:
        call()
        calls += 1
        t = clock()
        value = read_mj()
        if value is None:
            problem = "the energy counter stopped answering during the window"
            break
        if value < last:
            problem = f"the energy counter went backwards ({last:.0f} -> {value:.0f} mJ: a driver reset or a wrap)"
            break
        if value != last:
            edges.append(_Edge(t_prev, t, value))
            last = value
        t_prev = t
        elapsed = t - t_start
        if elapsed >= cap or (elapsed >= min_window_s and _settled(edges)):
            break
    sync()
    window_s = clock() - t_start
    if problem is None and len(edges) < MIN_COUNTER_STEPS:
        problem = (
            f"the energy counter changed {len(edges)} time(s) in {window_s:.3g} s over {calls} call(s); "
            f"{MIN_COUNTER_STEPS} changes are needed for a figure"
            + (
                " (each call outlasts the counter's refresh: too few reads fit in the window)"
                if calls <= MIN_COUNTER_STEPS
                else ""
            )
        )
    if problem is not None:
        return _failed(problem, power_limit_w, window_s, calls, edges)
    mean, low, high = _power_bounds_w(edges)
    span_s = (edges[-1].seen_s + edges[-1].before_s - edges[0].seen_s - edges[0].before_s) / 2
    period = span_s / (len(edges) - 1)
    flagged = power_limit_problem(mean, power_limit_w, span_s)
    if flagged is not None:
        return _failed(flagged, power_limit_w, window_s, calls, edges, period, span_s)
    s_per_call = window_s / calls
    return EnergyMeasurement(
        mj_per_call=mean * s_per_call * 1000.0,
        uncertainty_mj=max(high - mean, mean - low) * s_per_call * 1000.0,
        mean_power_w=mean,
        power_limit_w=power_limit_w,
        window_s=window_s,
        calls=calls,
        counter_steps=len(edges),
        counter_period_s=period,
        covered_s=span_s,
    )


def _failed(
    error: str,
    power_limit_w: float | None,
    window_s: float,
    calls: int,
    edges: list[_Edge],
    period: float | None = None,
    covered_s: float | None = None,
) -> EnergyMeasurement:
    return EnergyMeasurement(
        mj_per_call=None,
        uncertainty_mj=None,
        mean_power_w=None,
        power_limit_w=power_limit_w,
        window_s=window_s,
        calls=calls,
        counter_steps=len(edges),
        counter_period_s=period,
        error=error,
        covered_s=covered_s,
    )
