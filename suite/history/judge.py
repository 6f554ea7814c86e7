"""``gpubench compare --history``: a run's cases judged against their history since its last change
point (same device model), not against one baseline run.

Rule: for each case, the optimized variant's figure (its median time, or the case's gate_metric)
is compared with the runs of the current level, i.e. the store's runs of that case and variant
after the latest change point (:mod:`gpubench.history.changepoints`), the run itself left out.
With fewer than :data:`MIN_RUNS` such runs the case is **inconclusive**. Otherwise it **regressed**
when the figure lies above the level's bootstrap 95% CI of the median run figure widened by the
threshold (figure > ci_high x (1 + threshold)), **improved** below ci_low x (1 - threshold), and
otherwise **passed**. Any regression fails the gate (exit 1). The level is read from one branch's
runs (the caller's ``branch``: a pull request's run is judged against its base branch), so runs of
other branches, pull requests included, never move it.

The machine moves between runs too (on a shared CPU VM, unchanged code's A/A runs moved -98% to
+80% against their history). As in the pairwise gate, when the case's baseline variant (unchanged
code, timed beside it in each run) moved the same way, against its own figures in the same level
runs, by at least half as much (log terms), the case is judged by its optimized/baseline ratio
against the level's ratios by the same rule, and keeps its verdict only when that ratio also
moved beyond half the baseline variant's move; otherwise it is **inconclusive**, with both moves
in its reason.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from gpubench import stats
from gpubench.history import changepoints
from gpubench.history.rows import ResultRow
from gpubench.history.since import Since
from gpubench.history.store import HistoryStore

MIN_RUNS = 5


@dataclass(frozen=True)
class HistoryVerdict:
    case_id: str
    variant: str
    metric: str
    verdict: str  # regressed, improved, passed, inconclusive, no_figure
    current: float | None
    level_median: float | None
    level_ci_low: float | None
    level_ci_high: float | None
    level_runs: int
    since_commit: str | None  # where the level starts (None: the whole history is one level)
    reason: str
    machine_move: float | None = None  # the baseline variant against its level (relative), where it was read
    ratio_move: float | None = None  # the optimized/baseline ratio against the level's ratios


@dataclass(frozen=True)
class _Level:
    """A variant's runs since its last change point (the run judged left out)."""

    points: list
    since_commit: str | None

    def median(self) -> float:
        return stats.median([p.median for p in self.points])


@dataclass(frozen=True)
class Regression:
    """A regression change point of the history after a release (``--since``)."""

    case_id: str
    variant: str
    change: changepoints.ChangePoint


def _figure(row: ResultRow, metric: str) -> float | None:
    return row.median_s if metric == "time" else row.gate_value


def judge_run(store: HistoryStore, rows: Sequence[ResultRow], threshold: float,
              branch: str | None = None) -> list[HistoryVerdict]:
    """A verdict per case of the current run (its optimized variant, else its only variant),
    against ``branch``'s runs (:meth:`HistoryStore.series`; None: every run)."""
    by_case: dict[tuple[str, str], list[ResultRow]] = {}
    for row in rows:
        by_case.setdefault((row.device_model, row.case_id), []).append(row)
    out = []
    for case_rows in by_case.values():
        row = next((r for r in case_rows if r.role == "optimized"), case_rows[0])
        control = next((r for r in case_rows if r.role == "baseline" and r is not row), None)
        out.append(_judge_case(store, row, control, threshold, branch))
    return out


def _level(store: HistoryStore, row: ResultRow, metric: str, branch: str | None) -> _Level:
    points = [p for p in store.series(row.device_model, row.case_id, row.variant, metric, branch=branch)
              if (p.run_id, p.host) != (row.run_id, row.host)]
    changes = changepoints.change_points(points)
    return _Level(points[changes[-1].index:], changes[-1].commit) if changes else _Level(points, None)


def _verdict(figure: float, level: Sequence[float], threshold: float) -> tuple[str, stats.SampleStats]:
    """regressed above the level's 95% CI x (1 + threshold), improved below its low end x (1 - threshold)."""
    summary = stats.summarize(level)
    if figure > summary.ci_high * (1 + threshold):
        return "regressed", summary
    if figure < summary.ci_low * (1 - threshold):
        return "improved", summary
    return "passed", summary


def _judge_case(store: HistoryStore, row: ResultRow, control: ResultRow | None, threshold: float,
                branch: str | None) -> HistoryVerdict:
    metric = row.gate_metric or "time"
    level = _level(store, row, metric, branch)
    current = _figure(row, metric)
    base = dict(case_id=row.case_id, variant=row.variant, metric=metric, current=current,
                level_runs=len(level.points), since_commit=level.since_commit)
    if current is None:
        return HistoryVerdict(**base, verdict="no_figure", level_median=None, level_ci_low=None, level_ci_high=None,
                              reason=f"the run has no {metric} figure")
    if metric == "time" and row.n is not None and not stats.has_interval(row.n):  # a count needs no samples
        return HistoryVerdict(**base, verdict="inconclusive", level_median=None, level_ci_low=None,
                              level_ci_high=None, reason=f"the run's figure rests on too few samples (n={row.n}; "
                              f"a CI needs {stats.MIN_CI_SAMPLES})")
    if len(level.points) < MIN_RUNS:
        return HistoryVerdict(**base, verdict="inconclusive", level_median=None, level_ci_low=None,
                              level_ci_high=None, reason=f"{len(level.points)} run(s) since the last change point; "
                              f"{MIN_RUNS} needed")
    verdict, summary = _verdict(current, [p.median for p in level.points], threshold)
    reason = (f"{current / summary.median - 1:+.1%} vs the median of {len(level.points)} runs" if summary.median > 0
              else f"{current:.4g} vs the median of {len(level.points)} runs, {summary.median:.4g}")
    moves: dict[str, float | None] = {}
    # Machine noise moves times, never a count (bytes reserved): a count is judged as it is.
    if verdict in ("regressed", "improved") and control is not None and metric == "time":
        verdict, reason, moves = _by_ratio(store, row, control, metric, branch, level, verdict, reason, threshold)
    return HistoryVerdict(**base, verdict=verdict, level_median=summary.median, level_ci_low=summary.ci_low,
                          level_ci_high=summary.ci_high, reason=reason, **moves)


def _by_ratio(store: HistoryStore, row: ResultRow, control: ResultRow, metric: str, branch: str | None,
              level: _Level, verdict: str, reason: str, threshold: float) -> tuple[str, str, dict]:
    """The verdict when the baseline variant moved the same way, against its figures in the same
    level runs, by at least half as much (log terms): the optimized/baseline ratio against the
    level's ratios; else the verdict as it was."""
    figure, control_figure = _figure(row, metric), _figure(control, metric)
    runs = {(p.run_id, p.host) for p in level.points}  # a run is its id and host (runners may share a store)
    by_run = {(p.run_id, p.host): p.median
              for p in store.series(control.device_model, control.case_id, control.variant, metric, branch=branch)
              if (p.run_id, p.host) in runs and p.median > 0}
    if not control_figure or control_figure <= 0 or figure <= 0 or level.median() <= 0 or len(by_run) < MIN_RUNS:
        return verdict, reason, {}  # no ratio of logs to take
    move = math.log(figure / level.median())
    machine = math.log(control_figure / stats.median(list(by_run.values())))
    if move * machine <= 0 or abs(machine) < abs(move) / 2:
        return verdict, reason, {"machine_move": math.exp(machine) - 1}
    ratios = [p.median / by_run[p.run_id, p.host] for p in level.points if (p.run_id, p.host) in by_run]
    ratio_verdict, ratio_level = _verdict(figure / control_figure, ratios, threshold)
    ratio_move = math.log(figure / control_figure / ratio_level.median)
    moves = {"machine_move": math.exp(machine) - 1, "ratio_move": math.exp(ratio_move) - 1}
    moved = (f"{reason}, but the baseline variant {control.variant} moved {math.exp(machine) - 1:+.1%} in the same "
             f"runs too (the machine changed); the optimized/baseline ratio moved {math.exp(ratio_move) - 1:+.1%}")
    if ratio_verdict == verdict and abs(ratio_move) > abs(machine) / 2:
        return verdict, f"{moved}, beyond its level and half the machine's move", moves
    return "inconclusive", moved, moves


def regressions_since(histories: Sequence[changepoints.CaseHistory], since: Since) -> list[Regression]:
    """Regression change points of ``histories`` starting at or after the first run ``since``
    starts at (:mod:`gpubench.history.since`: a run id, a commit, a release tag)."""
    out = []
    for h in histories:
        start = next((i for i, p in enumerate(h.points) if since.starts_at(p)), None)
        if start is None:
            continue
        out += [Regression(h.case_id, h.variant, c) for c in h.changes if c.index >= start and c.kind == "regression"]
    return out
