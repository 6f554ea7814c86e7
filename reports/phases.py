"""Where a case's wall time went, from the ``phases_s`` the runner records per case: seconds spent
building inputs, checking, warming up, in the timing loop (of which the timed calls themselves),
on derived metrics, measuring energy and profiling, and the rest.

Pure functions of the records: :func:`breakdown` reads one case, :func:`timed_share` the run (the
timed calls' share of the cases' wall time, the figure that says how much of a run was
measurement). A record without ``phases_s`` (runs written before it existed) has no breakdown, and
every reader here then says nothing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

from gpubench.reports.terminal import format_seconds

# The phases as the runner records them, in its order, and how the report names them. "timed"
# (the timed calls' own samples) is part of "timing": a breakdown splits "timing" into the timed
# calls and the rest of the timing loop, so the parts add up to the case's wall time.
PHASES = (("build", "build"), ("check", "check"), ("warmup", "warm-up"), ("timed", "timed calls"),
          ("loop", "timing loop"), ("metrics", "metrics"), ("energy", "energy"), ("profile", "profile"),
          ("other", "other"))
# What each name stands for, for a legend.
MEANING = {"build": "building inputs", "check": "the first checked call of each variant, the reference and the checks",
           "warmup": "warm-up calls", "timed": "the timed calls' own samples",
           "loop": "the rest of the timing loop (between and around the timed calls)", "metrics": "derived metrics",
           "energy": "measuring energy", "profile": "profiling", "other": "the rest of the case's wall time"}
LABELS = dict(PHASES)
_RECORDED = ("build", "check", "warmup", "timing", "metrics", "energy", "profile")


@dataclass(frozen=True)
class Breakdown:
    """One case's wall time in parts that add up to it (``parts``: phase key and seconds, in
    :data:`PHASES` order, none negative)."""

    elapsed_s: float
    timed_s: float
    parts: tuple[tuple[str, float], ...]

    def share(self, key: str) -> float:
        return dict(self.parts).get(key, 0.0) / self.elapsed_s if self.elapsed_s > 0 else 0.0


def _seconds(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value > 0 else 0.0


def breakdown(case: dict[str, Any]) -> Breakdown | None:
    """The case's ``phases_s`` as parts of its wall time; None when it recorded none. "other" is
    the record's, or what the recorded phases leave of ``elapsed_s``."""
    phases = case.get("phases_s")
    if not isinstance(phases, dict) or not phases:
        return None
    recorded = {k: _seconds(phases.get(k)) for k in _RECORDED}
    timed = min(_seconds(phases.get("timed")), recorded["timing"])
    elapsed = _seconds(case.get("elapsed_s")) or sum(recorded.values()) + _seconds(phases.get("other"))
    other = _seconds(phases["other"]) if "other" in phases else max(0.0, elapsed - sum(recorded.values()))
    values = {**recorded, "timed": timed, "loop": recorded["timing"] - timed, "other": other}
    return Breakdown(elapsed, timed, tuple((key, values[key]) for key, _ in PHASES))


def timed_share(cases: Iterable[dict[str, Any]]) -> tuple[float, float] | None:
    """(seconds in timed calls, wall seconds) summed over the cases that recorded phases; None
    when none did."""
    found = [b for b in map(breakdown, cases) if b is not None]
    if not found:
        return None
    return sum(b.timed_s for b in found), sum(b.elapsed_s for b in found)


def percent(share: float) -> str:
    """41%, 4.1%, 0.41%: two significant figures below 10%."""
    return f"{100 * share:.0f}%" if share >= 0.1 else f"{100 * share:.2g}%"


def timed_share_text(doc: dict[str, Any]) -> str | None:
    """"timed calls were 41% of wall time (52.1 s of 127 s)" over the run's cases; None when no
    case recorded its phases."""
    found = timed_share(doc.get("cases") or [])
    if found is None or found[1] <= 0:
        return None
    timed, wall = found
    return f"timed calls were {percent(timed / wall)} of wall time ({format_seconds(timed)} of {format_seconds(wall)})"


def breakdown_text(found: Breakdown) -> str:
    """"1.2 s: build 0.3 s, ..., timed calls 0.5 s (41%), ..." leaving out the phases that took no
    time."""
    parts = [f"{LABELS[key]} {format_seconds(seconds)}" + (f" ({percent(found.share(key))})" if key == "timed" else "")
             for key, seconds in found.parts if seconds > 0]
    return f"{format_seconds(found.elapsed_s)}: " + ", ".join(parts)
