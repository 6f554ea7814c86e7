"""The record of one variant's energy figure (:class:`EnergyMeasurement`), as results.json holds
it; :mod:`gpubench.measure.energy` takes the figure."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

METHOD_WINDOW = "window"  # a window of calls of its own after timing (measure_energy_per_call)
METHOD_TIMED_CALLS = "timed_calls"  # the counter's edges inside the timed calls (measure_over_calls)


@dataclass
class EnergyMeasurement:
    """One variant's energy figure and how it was taken (``method``). When ``error`` is set,
    ``mj_per_call``, ``uncertainty_mj`` and ``mean_power_w`` are None and the error says why (with
    the figures that were rejected)."""

    mj_per_call: float | None
    uncertainty_mj: float | None  # +- per call: the edges' timing and the counter's 1 mJ resolution
    mean_power_w: float | None  # between the first and last counter change seen
    power_limit_w: float | None  # the board's enforced limit from NVML; None: not known, not checked
    window_s: float  # wall time of the calls, synchronized at both ends
    calls: int
    counter_steps: int  # changes of the counter seen during the calls
    counter_period_s: float | None  # mean time between those changes (the refresh cadence seen)
    error: str | None = None
    # How the figure was taken: METHOD_WINDOW (the variant alone, after timing) or METHOD_TIMED_CALLS
    # (the timed calls themselves: window_s is then their summed wall time). Older files: window.
    method: str = METHOD_WINDOW
    # The time the mean power is taken over: between the first and last change (summed over the
    # calls for timed_calls, each call's own). None in older files.
    covered_s: float | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EnergyMeasurement:
        """The measurement a results file recorded (an older file's is a window); keys this
        version does not know are ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        given = {k: v for k, v in data.items() if k in known}
        return cls(
            **{
                "mj_per_call": None,
                "uncertainty_mj": None,
                "mean_power_w": None,
                "power_limit_w": None,
                "window_s": 0.0,
                "calls": 0,
                "counter_steps": 0,
                "counter_period_s": None,
                **given,
            }
        )
