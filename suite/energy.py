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
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

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


@dataclass
class EnergyMeasurement:
    """One variant's energy window. When ``error`` is set, ``mj_per_call``, ``uncertainty_mj``
    and ``mean_power_w`` are None and the error says why (with the figures that were rejected)."""

    mj_per_call: float | None
    uncertainty_mj: float | None  # +- per call: the edges' timing and the counter's 1 mJ resolution
    mean_power_w: float | None  # between the first and last counter change seen
    power_limit_w: float | None  # the board's enforced limit from NVML; None: not known, not checked
    window_s: float  # wall time of the calls, synchronized at both ends
    calls: int
    counter_steps: int  # changes of the counter seen during the calls
    counter_period_s: float | None  # mean time between those changes (the refresh cadence seen)
    error: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "EnergyMeasurement":
        """The window a results file recorded; keys this version does not know are ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        given = {k: v for k, v in data.items() if k in known}
        return cls(**{"mj_per_call": None, "uncertainty_mj": None, "mean_power_w": None, "power_limit_w": None,
                      "window_s": 0.0, "calls": 0, "counter_steps": 0, "counter_period_s": None, **given})


@dataclass(frozen=True)
class _Edge:
    before_s: float  # the last read that still returned the old value
    seen_s: float  # the read that returned the new one
    mj: float


def max_window_s(min_window_s: float) -> float:
    return max(MAX_WINDOW_S, 2.0 * min_window_s)


def power_limit_problem(mean_power_w: float, power_limit_w: float | None, window_s: float) -> str | None:
    """Why a mean power cannot be real on this board (None when it can, or the limit is unknown)."""
    if power_limit_w is None or power_limit_w <= 0 or mean_power_w <= power_limit_w * (1 + POWER_LIMIT_MARGIN):
        return None
    return (f"mean power {mean_power_w:.0f} W over {window_s:.3g} s is above the {power_limit_w:.0f} W board limit "
            f"(+{POWER_LIMIT_MARGIN:.0%} margin): the energy counter's window cannot be right, so no figure is given")


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


def measure_energy_per_call(call: Callable[[], Any], read_mj: Callable[[], float | None], clock: Callable[[], float],
                            *, min_window_s: float, power_limit_w: float | None = None,
                            sync: Callable[[], Any] = lambda: None) -> EnergyMeasurement:
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
        problem = (f"the energy counter changed {len(edges)} time(s) in {window_s:.3g} s over {calls} call(s); "
                   f"{MIN_COUNTER_STEPS} changes are needed for a figure"
                   + (" (each call outlasts the counter's refresh: too few reads fit in the window)"
                      if calls <= MIN_COUNTER_STEPS else ""))
    if problem is not None:
        return _failed(problem, power_limit_w, window_s, calls, edges)
    mean, low, high = _power_bounds_w(edges)
    span_s = (edges[-1].seen_s + edges[-1].before_s - edges[0].seen_s - edges[0].before_s) / 2
    period = span_s / (len(edges) - 1)
    flagged = power_limit_problem(mean, power_limit_w, span_s)
    if flagged is not None:
        return _failed(flagged, power_limit_w, window_s, calls, edges, period)
    s_per_call = window_s / calls
    return EnergyMeasurement(mj_per_call=mean * s_per_call * 1000.0,
                             uncertainty_mj=max(high - mean, mean - low) * s_per_call * 1000.0,
                             mean_power_w=mean, power_limit_w=power_limit_w, window_s=window_s, calls=calls,
                             counter_steps=len(edges), counter_period_s=period)


def _failed(error: str, power_limit_w: float | None, window_s: float, calls: int, edges: list[_Edge],
            period: float | None = None) -> EnergyMeasurement:
    return EnergyMeasurement(mj_per_call=None, uncertainty_mj=None, mean_power_w=None, power_limit_w=power_limit_w,
                             window_s=window_s, calls=calls, counter_steps=len(edges), counter_period_s=period,
                             error=error)
