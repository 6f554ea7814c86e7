"""Change points over a case's history: where, run by run, a case's figure moved to a new level.

E-Divisive means (Matteson & James 2014; the method MongoDB's performance CI adopted, Daly et al.,
ICPE 2020) in Apache Otava 0.8.0's implementation, with its permutation significance test: a
change point is kept when at most ``max_pvalue`` of ``permutations`` shuffles of its segment give
as large a divergence. Defaults: p <= 0.01 over 100 permutations, seed 0 (the same history always
gives the same change points). Otava is installed without its dependencies (only numpy is used):
``pip install --no-deps apache-otava==0.8.0``; its internal classes are pinned to that version.

Each change point is reported with the run (and commit) where the new level starts, its magnitude
(the relative change of the median run figure, segment after / segment before - 1, segments bounded
by the neighbouring change points) with a bootstrap 95% CI (:func:`gpubench.stats.bootstrap_ratio_ci`
over the two segments' run figures), and whether it is a regression or an improvement. Direction:
time is lower-is-better; a technique's ``gate_metric`` is lower-is-better by the technique contract
(``gpubench.contract.Technique.gate_metric``: "per call, lower is better"); no other metric is read.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from gpubench import stats
from gpubench.errors import BadInput
from gpubench.history.store import HistoryCase, HistoryStore, Point

MAX_PVALUE = 0.01
PERMUTATIONS = 100
SEED = 0
MIN_RUNS = 4  # fewer runs than this: no change point can be significant at p <= 0.01 anyway
INSTALL = "pip install --no-deps apache-otava==0.8.0"


def _otava() -> tuple[Any, Any, Any]:
    """Otava's E-Divisive classes, imported when first needed (BadInput, exit 2, naming the install)."""
    try:
        from otava.change_point_divisive.calculator import PairDistanceCalculator
        from otava.change_point_divisive.detector import ChangePointDetector
        from otava.change_point_divisive.significance_test import PermutationsSignificanceTester
    except ImportError:
        raise BadInput(f"change points need Apache Otava's E-Divisive means, which is not installed: {INSTALL} "
                       f"(numpy is all it needs here; --no-deps keeps its other dependencies out).") from None
    return PairDistanceCalculator, ChangePointDetector, PermutationsSignificanceTester


def change_indices(values: Sequence[float], *, max_pvalue: float = MAX_PVALUE, permutations: int = PERMUTATIONS,
                   seed: int = SEED) -> list[tuple[int, float]]:
    """(index of the first value of the new level, p-value) of each significant change point in
    ``values``, by index."""
    if len(values) < MIN_RUNS:
        return []
    calculator, detector, tester = _otava()
    found = detector(tester(max_pvalue=max_pvalue, permutations=permutations, calculator=calculator, seed=seed),
                     calculator).get_change_points(np.asarray(values, dtype=np.float64))
    return sorted((int(cp.index), float(cp.stats.pvalue)) for cp in found)


def lower_is_better(metric: str, gate_metric: str | None) -> bool:
    """The metric's direction: time and the technique's gate_metric are lower-is-better."""
    if metric == "time" or (gate_metric and metric == gate_metric):
        return True
    raise BadInput(f"metric {metric!r}: its direction is not known; allowed: time, or the case's gate_metric "
                   f"({gate_metric or 'none for this case'}).")


@dataclass(frozen=True)
class ChangePoint:
    """A new level starting at ``index`` (run ``run_id``, commit ``commit``)."""

    index: int
    run_id: str
    commit: str | None
    started_at: str
    pvalue: float
    before_median: float  # median run figure of the segment before
    after_median: float
    magnitude: float  # after / before - 1
    ci_low: float | None  # bootstrap 95% CI of the magnitude; None: a level of fewer than MIN_CI_SAMPLES runs
    ci_high: float | None
    kind: str  # "regression" or "improvement"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def magnitude_text(self) -> str:
        """``+18.6% [+10.1%, +25.0%]``; ``+18.6% (no CI: too few runs a side)`` without an interval."""
        if self.ci_low is None or self.ci_high is None:
            return f"{self.magnitude:+.1%} (no CI: too few runs a side)"
        return f"{self.magnitude:+.1%} [{self.ci_low:+.1%}, {self.ci_high:+.1%}]"


@dataclass(frozen=True)
class CaseHistory:
    """A (device model, case, variant, metric)'s figures in run order and its change points."""

    device_model: str
    case_id: str
    variant: str
    metric: str
    points: tuple[Point, ...]
    changes: tuple[ChangePoint, ...]

    @property
    def latest(self) -> ChangePoint | None:
        return self.changes[-1] if self.changes else None

    def since_last_change(self) -> tuple[Point, ...]:
        """The points of the current level: after the latest change point (all when none)."""
        return self.points[self.latest.index:] if self.latest else self.points


def segment_bounds(n: int, indices: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) of each level of ``n`` values split at ``indices``."""
    cuts = [0, *sorted(indices), n]
    return list(zip(cuts[:-1], cuts[1:]))


def change_points(points: Sequence[Point], *, lower_better: bool = True, max_pvalue: float = MAX_PVALUE,
                  permutations: int = PERMUTATIONS, seed: int = SEED) -> list[ChangePoint]:
    """The change points of ``points`` (a case's figures in run order)."""
    values = [p.median for p in points]
    found = change_indices(values, max_pvalue=max_pvalue, permutations=permutations, seed=seed)
    bounds = segment_bounds(len(values), [i for i, _ in found])
    out = []
    for k, (index, pvalue) in enumerate(found):
        before, after = values[bounds[k][0]:bounds[k][1]], values[bounds[k + 1][0]:bounds[k + 1][1]]
        ci = stats.bootstrap_ratio_ci(after, before, seed=seed)
        worse = ci.ratio > 1.0 if lower_better else ci.ratio < 1.0
        point = points[index]
        out.append(ChangePoint(index, point.run_id, point.commit, point.started_at, pvalue,
                               stats.median(before), stats.median(after), ci.ratio - 1.0,
                               *((ci.ci_low - 1.0, ci.ci_high - 1.0) if ci.has_interval else (None, None)),
                               "regression" if worse else "improvement"))
    return out


def case_metric(case: HistoryCase) -> str:
    """The figure a case is followed on: its gate_metric where it has one (kv_cache: bytes
    reserved), else time (as the gate judges it)."""
    return case.gate_metric or "time"


def case_histories(store: HistoryStore, device_model: str, *, case_ids: Sequence[str] | None = None,
                   branch: str | None = None, max_pvalue: float = MAX_PVALUE, permutations: int = PERMUTATIONS,
                   seed: int = SEED) -> list[CaseHistory]:
    """Every (case, variant) of ``device_model``'s history (or of ``case_ids``) with its change
    points; ``branch``: that branch's runs (:meth:`HistoryStore.series`), None: every run."""
    out = []
    for case in store.cases(device_model):
        if case_ids is not None and case.case_id not in case_ids:
            continue
        metric = case_metric(case)
        lower = lower_is_better(metric, case.gate_metric)
        for variant, _role in case.variants:
            points = store.series(device_model, case.case_id, variant, metric, branch=branch)
            if not points:
                continue
            changes = change_points(points, lower_better=lower, max_pvalue=max_pvalue, permutations=permutations,
                                    seed=seed)
            out.append(CaseHistory(device_model, case.case_id, variant, metric, tuple(points), tuple(changes)))
    return out
