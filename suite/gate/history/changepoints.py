"""Change points over a case's history: where, run by run, a case's figure moved to a new level.

Apache Otava 0.8.0's change point detection as Otava itself runs it (Fleming et al., "Hunter",
ICPE 2023): E-Divisive means (Matteson & James 2014) proposes where a series splits, and Student's
t-test on the two sides decides whether the split is kept; a split pass over windows of
:data:`WINDOW` runs keeps weak change points at 10 x ``max_pvalue``, then a merge pass drops the
weakest until every one left has p <= ``max_pvalue`` against its neighbouring levels. The test is
on the logarithm of each run's figure (a level moves by a factor: +25% and -20% weigh the same),
or on the figure itself where one is 0 or less. Default: p <= 0.0001 (:data:`MAX_PVALUE`). It is
deterministic (no permutations, no seed: the same history always gives the same change points).

Why not E-Divisive's permutation test (used before, p <= 0.01 over 100 permutations): its greedy
search stops at the first split that fails its test, so a first run's warm-up outlier, tested
first, hid a +25% step found once 14 or 15 runs were stored but not 13 or 16; no test on ranks or
permutations can name a level of 2 runs out of 10 at p <= 0.01 anyway (a given 2 of 10 are the 2
highest with probability 1/45).

**A level holds at least :data:`MIN_LEVEL` runs.** A run that stands alone (a warm-up outlier,
one run on a loaded machine: :func:`lone_runs`, far from the runs on both sides of it) is set
aside before the search, and a run that the search makes a level of its own (the newest run,
while nothing after it says whether it starts a level) is set aside and the search repeated
without it, so it neither becomes a change point nor hides one (Otava's search, like E-Divisive's,
stops at the first split that fails its test, and a lone run is often the split tested first).
Its figure stays in the history (the charts), not in the medians of the levels beside it; a
change point right after set-aside runs nearer the new level starts at the first of them.

**A change found stays found unless the data says otherwise** (:func:`detect`, ``keep_found``):
one found at p <= ``max_pvalue`` with fewer runs stored, or in the runs between two changes found,
stays while all the runs still hold it at :data:`KEEP_FACTOR` x ``max_pvalue`` against its
neighbouring levels (tested directly, as Otava's merge pass tests); runs that return to the old
level drop it. A regression later reverted keeps both changes (Otava's one greedy pass over fewer
runs than a window tests the split between the outer levels first, fails and stops).

Each change point is reported with the run (and commit) where the new level starts, its magnitude
(the relative change of the median run figure, segment after / segment before - 1, segments bounded
by the neighbouring change points, set-aside runs left out) with a bootstrap 95% CI
(:func:`gpubench.records.stats.bootstrap_ratio_ci` over the two segments' run figures), and whether it is
a regression or an improvement. Direction: time is lower-is-better; a technique's ``gate_metric``
is lower-is-better by the technique contract (``gpubench.contract.Technique.gate_metric``: "per
call, lower is better"); no other metric is read.

Otava is installed without its dependencies (its pins would downgrade numpy); it needs numpy and
scipy (its t-test): ``pip install --no-deps apache-otava==0.8.0`` and scipy, a dependency of
gpubench.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from gpubench.errors import BadInput
from gpubench.gate.history.store import HistoryCase, HistoryStore, Point
from gpubench.lazy import LazyModule
from gpubench.records import stats

if TYPE_CHECKING:
    import numpy as np
else:
    np = LazyModule("numpy")  # imported when first used (0.1 s of a command's start)

MAX_PVALUE = 0.0001
WINDOW = 50  # Otava's split pass: runs per window (half a window's step)
MIN_LEVEL = 2  # runs a level needs; a run alone between two levels is set aside
MIN_RUNS = 4  # fewer runs than this: no two levels of MIN_LEVEL runs to tell apart
OUTLIER_K = 5.0  # a run this many robust SDs of the run-to-run moves from its neighbours on both sides stands alone
NEIGHBOURS = 3
MEAN_FLOOR = 0.25  # lone_runs' SD: at least this share of the one the mean absolute deviation gives
KEEP_FACTOR = 10  # a change point found with fewer runs stays while all the runs hold it at 10 x max_pvalue
SEED = 0  # the bootstrap CI of each change point's magnitude
METHOD = (
    f"Apache Otava's E-Divisive means with Student's t-test on log figures, p <= {MAX_PVALUE}; "
    f"a level holds {MIN_LEVEL} runs or more"
)
INSTALL = "pip install --no-deps apache-otava==0.8.0 scipy"


def _otava() -> tuple[Any, Any]:
    """Otava's split and merge passes, imported when first needed (BadInput, exit 2, naming the install)."""
    try:
        from otava.analysis import merge, split
    except ImportError as exc:
        raise BadInput(
            f"change points need Apache Otava's change point detection, which is not installed "
            f"({exc}): {INSTALL} (numpy and scipy are all it needs here; --no-deps keeps its other "
            f"dependencies out)."
        ) from None
    return split, merge


@dataclass(frozen=True)
class Detection:
    """Where ``values`` change level: (index of the new level's first value, p-value) by index,
    and the indices of the values set aside as levels of one run."""

    changes: tuple[tuple[int, float], ...]
    set_aside: tuple[int, ...]


def _levels(series: list[float], max_pvalue: float) -> list[tuple[int, float]]:
    split, merge = _otava()
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # a level of equal figures: a t-test of no spread
        # A list, not an array: Otava 0.8.0 slices a window only out of a sequence that is not one.
        weak = split(series, WINDOW, min(max_pvalue * 10, 0.5))
        found = merge(weak, series, max_pvalue, 0.0)
    return [
        (int(c.index), float(c.stats.pvalue))
        for c in found
        if not math.isnan(c.stats.pvalue) and c.stats.pvalue <= max_pvalue
    ]


def lone_runs(values: Sequence[float], *, k: float = OUTLIER_K, neighbours: int = NEIGHBOURS) -> list[int]:
    """The indices of runs that stand alone: farther than ``k`` robust standard deviations of the
    run-to-run moves (1.4826 MAD of successive differences / sqrt 2; at least :data:`MEAN_FLOOR`
    x 1.2533 x their mean absolute deviation / sqrt 2, for figures of few distinct values) from the median of the
    ``neighbours`` runs before them and, the same way, from that of the ``neighbours`` after (a
    Hampel identifier taken on each side, so the first run of a new level, near the runs after it,
    is never one). The first run is judged by the runs after it alone (a cold start); the last
    never is (only the runs after it can say whether it starts a level)."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) < MIN_RUNS:
        return []
    moves = np.diff(x)
    spread = np.abs(moves - np.median(moves))
    # Figures of few distinct values (most moves alike, MAD near 0): at least a quarter of the
    # mean absolute deviation's SD, else every run one step off its neighbours stood alone.
    sigma = max(1.4826 * float(np.median(spread)), MEAN_FLOOR * 1.2533 * float(np.mean(spread))) / math.sqrt(2)
    out = []
    for i in range(len(x) - 1):
        sides = [side for side in (x[max(0, i - neighbours) : i], x[i + 1 : i + 1 + neighbours]) if len(side)]
        away = [float(x[i] - np.median(side)) for side in sides]
        if all(abs(a) > k * sigma for a in away) and (all(a > 0 for a in away) or all(a < 0 for a in away)):
            out.append(i)
    return out


def _search(logs: Sequence[float], max_pvalue: float) -> Detection:
    """Otava's change points of ``logs`` at ``max_pvalue``, lone runs and one-run levels set aside."""
    lone = set(lone_runs(logs))
    kept = [i for i in range(len(logs)) if i not in lone]
    while len(kept) >= MIN_RUNS:
        found = _levels([logs[i] for i in kept], max_pvalue)
        cuts = [0, *(i for i, _ in found), len(kept)]
        alone = next(((a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b - a < MIN_LEVEL), None)
        if alone is None:
            return Detection(_boundaries(logs, kept, found), tuple(sorted(set(range(len(logs))) - set(kept))))
        del kept[alone[0] : alone[1]]  # a level of one run: set it aside and look again without it
    return Detection((), tuple(sorted(set(range(len(logs))) - set(kept))) if len(logs) >= MIN_RUNS else ())


def _boundaries(
    logs: Sequence[float], kept: list[int], found: list[tuple[int, float]]
) -> tuple[tuple[int, float], ...]:
    """``found`` (indices into ``kept``) as indices into ``logs``; a change point whose runs just
    before it were set aside starts at the first of them nearer the new level's median than the
    old one's (the first run of a new level, overshooting it, is where the change came in)."""
    cuts = [0, *(i for i, _ in found), len(kept)]
    out = []
    for k, (i, p) in enumerate(found):
        old = float(np.median([logs[j] for j in kept[cuts[k] : cuts[k + 1]]]))
        new = float(np.median([logs[j] for j in kept[cuts[k + 1] : cuts[k + 2]]]))
        start = kept[i]
        while start - 1 > kept[i - 1] and abs(logs[start - 1] - new) < abs(logs[start - 1] - old):
            start -= 1
        out.append((start, p))
    return tuple(out)


def detect(values: Sequence[float], *, max_pvalue: float = MAX_PVALUE, keep_found: bool = True) -> Detection:
    """The change points of ``values`` (run figures in run order) and the runs set aside.

    ``keep_found``: a change point found at p <= ``max_pvalue`` with fewer runs stored (any prefix
    of ``values``, read up to :data:`WINDOW` runs back; or in the runs between two changes found,
    searched on their own) stays while all the runs still hold it at
    :data:`KEEP_FACTOR` x ``max_pvalue`` against its neighbouring levels (the runs between the
    change points kept before and after it, set-aside runs left out; its p-value is then that one):
    one more run of noise does not undo a change, only runs that make it doubtful do. Tested
    directly, not by the search proposing it again: Otava's search over fewer runs than a window is
    one greedy pass that stops at the first split failing its test, and in a level that later
    returns (8 runs at 1.0, 8 at 1.2, 8 at 1.0) the split it tests first is between the two outer
    levels, which fails, so both changes were lost although each holds at p ~ 1e-17."""
    figures = [float(v) for v in values]
    logs = [math.log(v) for v in figures] if figures and min(figures) > 0 else figures
    strict = _search(logs, max_pvalue)
    if not keep_found or len(logs) <= MIN_RUNS:
        return strict
    found = dict(strict.changes)
    for n in range(len(logs) - 1, MIN_RUNS, -1):  # the latest evidence first
        lo = max(0, n - WINDOW)
        for i, p in _search(logs[lo:n], max_pvalue).changes:
            if all(abs(lo + i - j) >= MIN_LEVEL for j in found):
                found[lo + i] = p
    grown = True
    while grown:  # the runs between two changes found, on their own (the greedy pass stopped above them)
        grown = False
        cuts = [0, *sorted(found), len(logs)]
        for a, b in zip(cuts[:-1], cuts[1:]):
            for i, p in _search(logs[a:b], max_pvalue).changes if b - a > MIN_RUNS and len(cuts) > 2 else ():
                if all(abs(a + i - j) >= MIN_LEVEL for j in found):
                    found[a + i], grown = p, True
    if len(found) == len(strict.changes):
        return strict
    held = _held(logs, found, set(strict.set_aside), max_pvalue * KEEP_FACTOR)
    return Detection(held, tuple(i for i in strict.set_aside if i not in {j for j, _ in held}))


def _held(
    logs: Sequence[float], found: dict[int, float], aside: set[int], max_pvalue: float
) -> tuple[tuple[int, float], ...]:
    """The change points of ``found`` (index: p-value) that hold at ``max_pvalue`` against their
    neighbouring levels, each level's set-aside runs left out: as Otava's merge pass, the weakest
    is dropped and the rest tested again until every one left holds."""
    from scipy.stats import ttest_ind_from_stats

    kept = sorted(found)
    while kept:
        cuts, out = [0, *kept, len(logs)], aside - set(kept)  # a change's first run starts its level
        pvalues = []
        for k in range(1, len(cuts) - 1):
            left = [logs[j] for j in range(cuts[k - 1], cuts[k]) if j not in out]
            right = [logs[j] for j in range(cuts[k], cuts[k + 1]) if j not in out]
            if len(left) < MIN_LEVEL or len(right) < MIN_LEVEL:
                pvalues.append(1.0)
                continue
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore", RuntimeWarning)  # levels of equal figures: no spread
                _, p = ttest_ind_from_stats(
                    np.mean(left), np.std(left), len(left), np.mean(right), np.std(right), len(right)
                )
            pvalues.append(1.0 if math.isnan(p) else float(p))
        worst = max(range(len(kept)), key=lambda k: pvalues[k])
        if pvalues[worst] <= max_pvalue:
            return tuple(zip(kept, pvalues))
        del kept[worst]
    return ()


def change_indices(values: Sequence[float], *, max_pvalue: float = MAX_PVALUE) -> list[tuple[int, float]]:
    """(index of the first value of the new level, p-value) of each significant change point in
    ``values``, by index."""
    if len(values) < MIN_RUNS:
        return []
    return list(detect(values, max_pvalue=max_pvalue).changes)


def lower_is_better(metric: str, gate_metric: str | None) -> bool:
    """The metric's direction: time and the technique's gate_metric are lower-is-better."""
    if metric == "time" or (gate_metric and metric == gate_metric):
        return True
    raise BadInput(
        f"metric {metric!r}: its direction is not known; allowed: time, or the case's gate_metric "
        f"({gate_metric or 'none for this case'})."
    )


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
        return self.points[self.latest.index :] if self.latest else self.points


def segment_bounds(n: int, indices: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) of each level of ``n`` values split at ``indices``."""
    cuts = [0, *sorted(indices), n]
    return list(zip(cuts[:-1], cuts[1:]))


@dataclass(frozen=True)
class Levels:
    """A case's change points and the indices of the runs set aside (levels of one run: in no
    level's median, nor in the history gate's level)."""

    changes: list[ChangePoint]
    set_aside: tuple[int, ...]


def change_points(
    points: Sequence[Point], *, lower_better: bool = True, max_pvalue: float = MAX_PVALUE, seed: int = SEED
) -> list[ChangePoint]:
    """The change points of ``points`` (a case's figures in run order)."""
    return levels(points, lower_better=lower_better, max_pvalue=max_pvalue, seed=seed).changes


def levels(
    points: Sequence[Point], *, lower_better: bool = True, max_pvalue: float = MAX_PVALUE, seed: int = SEED
) -> Levels:
    """The change points of ``points`` (a case's figures in run order) and the runs set aside."""
    values = [p.median for p in points]
    if len(values) < MIN_RUNS:
        return Levels([], ())
    found = detect(values, max_pvalue=max_pvalue)
    bounds = segment_bounds(len(values), [i for i, _ in found.changes])
    aside = set(found.set_aside)

    def level(k: int) -> list[float]:
        return [values[i] for i in range(*bounds[k]) if i not in aside]

    out = []
    for k, (index, pvalue) in enumerate(found.changes):
        before, after = level(k), level(k + 1)
        ci = stats.bootstrap_ratio_ci(after, before, seed=seed)
        worse = ci.ratio > 1.0 if lower_better else ci.ratio < 1.0
        point = points[index]
        low, high = (ci.bounds()[0] - 1.0, ci.bounds()[1] - 1.0) if ci.has_interval else (None, None)
        out.append(
            ChangePoint(
                index,
                point.run_id,
                point.commit,
                point.started_at,
                pvalue,
                stats.median(before),
                stats.median(after),
                ci.ratio - 1.0,
                low,
                high,
                "regression" if worse else "improvement",
            )
        )
    return Levels(out, found.set_aside)


def case_metric(case: HistoryCase) -> str:
    """The figure a case is followed on: its gate_metric where it has one (kv_cache: bytes
    reserved), else time (as the gate judges it)."""
    return case.gate_metric or "time"


def case_histories(
    store: HistoryStore,
    device_model: str,
    *,
    case_ids: Sequence[str] | None = None,
    branch: str | None = None,
    max_pvalue: float = MAX_PVALUE,
    seed: int = SEED,
    keep: Callable[[list[Point]], list[Point]] | None = None,
) -> list[CaseHistory]:
    """Every (case, variant) of ``device_model``'s history (or of ``case_ids``) with its change
    points; ``branch``: that branch's runs (:meth:`HistoryStore.series`), None: every run;
    ``keep``: the runs of each series to read (the history gate: those before the run judged)."""
    out = []
    for case in store.cases(device_model):
        if case_ids is not None and case.case_id not in case_ids:
            continue
        metric = case_metric(case)
        lower = lower_is_better(metric, case.gate_metric)
        for variant, _role in case.variants:
            points = store.series(device_model, case.case_id, variant, metric, branch=branch)
            points = keep(points) if keep is not None else points
            if not points:
                continue
            changes = change_points(points, lower_better=lower, max_pvalue=max_pvalue, seed=seed)
            out.append(CaseHistory(device_model, case.case_id, variant, metric, tuple(points), tuple(changes)))
    return out
