"""``gpubench run --budget DURATION``: a run planned to fit a wall-clock budget.

The budget counts the whole run from when the command starts: worker start-up and calibration,
the cases, writing the results and the report. Under a budget the cases run breadth-first
(:func:`breadth_first`: each technique's first case before any technique's second, techniques in
the scenario's ``order``, else in the order they first appear), so a budget that runs out leaves
every technique measured at least once. A case starts only where the time left, less what closing
the run takes, holds its estimate (:class:`gpubench.run.estimate.CaseCosts`: a conservative figure, the
allowances where this device never measured it); a case that does not fit is passed over and
recorded as not run (:class:`gpubench.records.results.NotRunCase`), and later, smaller cases that fit
still run. A case in flight when the budget runs out is stopped at the time left plus
:data:`GRACE_S` (its worker's alarm; the supervisor kills it shortly after) and keeps the samples
it took, as an interrupted case.

``--fill-budget`` admits on a case's lower figure instead (what it takes at least: its own time
where this device measured it, else its policy's bounds): the budget is used to its end, at the
price of a last case that may be stopped at the budget. A short GPU session wants that on a device
with no case times yet, where the conservative figures (first compiles, energy windows at their
cap) would leave minutes unused.

:func:`plan` answers the same questions before anything runs (``--dry-run --budget``); the
executors ask :class:`Budget` at each case they are about to start, with the real time left, so a
case that finishes early leaves room for more.
"""

from __future__ import annotations

import heapq
import re
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpubench.errors import BadInput
from gpubench.records.results import NotRunCase
from gpubench.run.estimate import CaseCosts, CaseEstimate
from gpubench.run.scenario import Case

GRACE_S = 2.0  # how far past the budget a case in flight may run before its alarm stops it
DURATION_FORMS = (
    "seconds (540 or 540s), minutes (9m), hours (1h), or a combination in that order "
    "(1h30m, 2m30s); a number may have a fraction (1.5h); more than 0"
)
_DURATION = re.compile(r"^(?:(?P<h>\d+(?:\.\d+)?)h)?(?:(?P<m>\d+(?:\.\d+)?)m)?(?:(?P<s>\d+(?:\.\d+)?)s?)?$")


def parse_duration(text: str, source: str = "--budget") -> float:
    """``540``, ``540s``, ``9m``, ``1h30m``, ``1.5h`` -> seconds; BadInput naming the forms otherwise."""
    raw = str(text).strip().lower().replace(" ", "")
    found = _DURATION.match(raw) if raw else None
    if found is None or not any(found.groupdict().values()) or raw.endswith(("hs", "ms")):
        raise BadInput(f"{source}: {text!r} is not a duration; allowed: {DURATION_FORMS}.")
    parts = found.groupdict()
    seconds = sum(float(parts[k] or 0) * scale for k, scale in (("h", 3600), ("m", 60), ("s", 1)))
    if seconds <= 0:
        raise BadInput(f"{source}: {text!r} is no time at all; allowed: {DURATION_FORMS}.")
    return seconds


def breadth_first(cases: Sequence[Case], order: Sequence[str] = ()) -> list[Case]:
    """Round-robin over techniques: each one's first case, then each one's second, ...; the
    techniques in ``order`` first (a scenario's ``order`` key), the rest as they first appear.
    Each technique's own cases keep their scenario order."""
    queues: dict[str, deque[Case]] = {name: deque() for name in order}
    for case in cases:
        queues.setdefault(case.technique, deque()).append(case)
    rounds = [q for q in queues.values() if q]
    out: list[Case] = []
    while rounds:
        out += [q.popleft() for q in rounds]
        rounds = [q for q in rounds if q]
    return out


def not_run(case: Case, guess: CaseEstimate, left_s: float, target: str | None = None) -> NotRunCase:
    return NotRunCase(
        case.id,
        case.technique,
        dict(case.params),
        "budget",
        round(guess.plan_s, 3),
        round(guess.low_s, 3),
        guess.basis,
        round(max(0.0, left_s), 3),
        target,
    )


@dataclass
class PlannedCase:
    """One line of a plan: the case, its estimate, and when it would start (seconds from the
    run's start; None: not run, the budget left then being ``left_s``)."""

    case: Case
    estimate: CaseEstimate
    start_s: float | None
    left_s: float


def admitted_s(guess: CaseEstimate, fill: bool) -> float:
    """The part of a case's estimate the time left must hold for it to start: its conservative
    planning figure, or (``fill``: ``--fill-budget``) what it takes at least."""
    return guess.low_s if fill else guess.plan_s


def plan(
    cases: Sequence[Case], costs: CaseCosts, budget_s: float, workers: int = 1, fill: bool = False
) -> list[PlannedCase]:
    """What a run under ``budget_s`` would do, case by case in run order: the workers start after
    the run's start-up, each takes the next case when free, a case runs if the time left then
    (less closing the run) holds its planning figure (``fill``: its lower figure). The same rule
    :class:`Budget` applies while a run goes, with estimates in place of the times the cases will
    take (a planned case is taken to last its planning figure either way)."""
    free = [costs.startup_s()] * max(1, workers)
    heapq.heapify(free)
    out: list[PlannedCase] = []
    started = 0
    for case in cases:
        now = free[0]
        guess = costs.of(case)
        left = budget_s - now - costs.closing_s(started + 1)
        if admitted_s(guess, fill) > left:
            out.append(PlannedCase(case, guess, None, left))
            continue
        costs.started(case)
        started += 1
        heapq.heapreplace(free, now + guess.plan_s)
        out.append(PlannedCase(case, guess, now, left))
    return out


class Budget:
    """The budget while a run goes: :meth:`admit` before each case starts (its time limit, or
    None: not run, recorded in :attr:`not_run`), :meth:`finished` after each one."""

    def __init__(
        self,
        seconds: float,
        costs: CaseCosts,
        started_at: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        fill: bool = False,
    ):
        self.seconds = seconds
        self.costs = costs
        self.fill = fill  # --fill-budget: admit on a case's lower figure
        self.clock = clock
        self.end = (started_at if started_at is not None else clock()) + seconds
        self.started = 0
        self.not_run: list[NotRunCase] = []

    def left_s(self) -> float:
        return self.end - self.clock()

    def admit(self, case: Case, target: str | None = None, timeout_s: float | None = None) -> float | None:
        """The seconds ``case`` may take (the time left, less closing the run, plus
        :data:`GRACE_S`; at most ``timeout_s``, default its policy's ``case_timeout_s``), or None
        when the time left cannot hold its estimate (:func:`admitted_s`): then it is recorded as
        not run."""
        guess = self.costs.of(case)
        left = self.left_s() - self.costs.closing_s(self.started + 1)
        if admitted_s(guess, self.fill) > left:
            self.not_run.append(not_run(case, guess, left, target))
            return None
        self.costs.started(case)
        self.started += 1
        return min(case.policy.case_timeout_s if timeout_s is None else timeout_s, max(0.0, left) + GRACE_S)

    def finished(self, record: object) -> None:
        self.costs.learn(record)
