"""Where a case's wall time went, from the ``phases_s`` the runner records per case (building
inputs, checking, warming up, the timing loop and, within it, the timed calls themselves, metrics,
energy, profiling, statistics, the rest), and the run's share of timed calls.

Pure functions of the records: :func:`breakdown` reads one case, :func:`timed_share_text` the run:
the run's own closing line when results.json has its ``time_use``, else the timed calls' share
of the cases' wall time. A record without ``phases_s`` (runs written before it existed) has no
breakdown, and every reader here then says nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpubench.records.results import CaseRecord, RunRecord, elapsed_text

# How the report names each phase, and what it stands for (a legend). "timed" (the timed calls'
# own samples) is part of "timing": a breakdown splits "timing" into the timed calls and the rest
# of the loop ("loop"), so the parts add up to the case's wall time. A phase the runner records
# that is not named here is shown under its own key.
PHASES = (
    ("build", "build"),
    ("check", "check"),
    ("warmup", "warm-up"),
    ("timed", "timed calls"),
    ("loop", "timing loop"),
    ("metrics", "metrics"),
    ("energy", "energy"),
    ("profile", "profile"),
    ("stats", "statistics"),
    ("other", "other"),
)
LABELS = dict(PHASES)
MEANING = {
    "build": "building inputs",
    "check": "the first checked call of each variant, the reference and the checks",
    "warmup": "warm-up calls",
    "timed": "the timed calls' own samples",
    "loop": "the rest of the timing loop (between and around the timed calls)",
    "metrics": "derived metrics",
    "energy": "measuring energy per call",
    "profile": "profiling",
    "stats": "statistics over the samples",
    "other": "the rest of the case's wall time",
}


@dataclass(frozen=True)
class Breakdown:
    """One case's wall time in parts that add up to it (``parts``: phase key and seconds, in the
    record's order with "timing" split into "timed" and "loop" and "other" last; none negative)."""

    elapsed_s: float
    timed_s: float
    parts: tuple[tuple[str, float], ...]

    def share(self, key: str) -> float:
        return dict(self.parts).get(key, 0.0) / self.elapsed_s if self.elapsed_s > 0 else 0.0


def _seconds(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value > 0 else 0.0


def breakdown(case: CaseRecord) -> Breakdown | None:
    """The case's ``phases_s`` as parts of its wall time; None when it recorded none. "other" is
    the record's, or what the recorded phases leave of ``elapsed_s``."""
    phases = case.phases_s
    if not isinstance(phases, dict) or not phases:
        return None
    timed = min(_seconds(phases.get("timed")), _seconds(phases.get("timing")))
    parts: list[tuple[str, float]] = []
    for key, value in phases.items():
        if key == "timing":
            parts += [("timed", timed), ("loop", _seconds(value) - timed)]
        elif key not in ("timed", "other"):
            parts.append((str(key), _seconds(value)))
    spent = sum(seconds for _, seconds in parts)
    elapsed = _seconds(case.elapsed_s) or spent + _seconds(phases.get("other"))
    other = _seconds(phases["other"]) if "other" in phases else max(0.0, elapsed - spent)
    return Breakdown(elapsed, timed, tuple(parts + [("other", other)]))


def cases_timed_share(cases: Iterable[CaseRecord]) -> tuple[float, float] | None:
    """(seconds in timed calls, wall seconds) summed over the cases that recorded phases; None
    when none did."""
    found = [b for b in map(breakdown, cases) if b is not None]
    if not found:
        return None
    return sum(b.timed_s for b in found), sum(b.elapsed_s for b in found)


def percent(share: float) -> str:
    """41%, 4.1%, 0.41%: two significant figures below 10%."""
    return f"{100 * share:.0f}%" if share >= 0.1 else f"{100 * share:.2g}%"


def cases_text(cases: Iterable[CaseRecord]) -> str | None:
    """ "timed calls were 41% of the cases' wall time (52.1 s of 127 s)"; None when no case
    recorded its phases."""
    found = cases_timed_share(cases)
    if found is None or found[1] <= 0:
        return None
    timed, wall = found
    return (
        f"timed calls were {percent(timed / wall)} of the cases' wall time "
        f"({elapsed_text(timed)} of {elapsed_text(wall)})"
    )


def run_text(run: RunRecord) -> str | None:
    """The run's closing line on where its wall time went, as ``gpubench run`` printed it (from
    results.json's ``time_use``); for a run without one, the share over its cases
    (:func:`cases_text`); None when neither was recorded."""
    if run.time_use is not None:
        try:
            return run.time_use.text()
        except (TypeError, ValueError, AttributeError):
            pass  # a malformed record: the cases still say it
    return cases_text(run.cases)


def breakdown_text(found: Breakdown) -> str:
    """ "1.2 s: build 0.3 s, ..., timed calls 0.5 s (41%), ..." leaving out the phases that took no
    time."""
    parts = [
        f"{LABELS.get(key, key)} {elapsed_text(seconds)}"
        + (f" ({percent(found.share(key))})" if key == "timed" else "")
        for key, seconds in found.parts
        if seconds > 0
    ]
    return f"{elapsed_text(found.elapsed_s)}: " + ", ".join(parts)
