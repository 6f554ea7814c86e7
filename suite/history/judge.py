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
"""
from __future__ import annotations

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
    for (model, case_id), case_rows in by_case.items():
        row = next((r for r in case_rows if r.role == "optimized"), case_rows[0])
        metric = row.gate_metric or "time"
        points = [p for p in store.series(model, case_id, row.variant, metric, branch=branch)
                  if p.run_id != row.run_id]
        changes = changepoints.change_points(points)
        level = points[changes[-1].index:] if changes else points
        since = changes[-1].commit if changes else None
        current = _figure(row, metric)
        base = dict(case_id=case_id, variant=row.variant, metric=metric, current=current, level_runs=len(level),
                    since_commit=since)
        if current is None:
            out.append(HistoryVerdict(**base, verdict="no_figure", level_median=None, level_ci_low=None,
                                      level_ci_high=None, reason=f"the run has no {metric} figure"))
            continue
        if len(level) < MIN_RUNS:
            out.append(HistoryVerdict(**base, verdict="inconclusive", level_median=None, level_ci_low=None,
                                      level_ci_high=None, reason=f"{len(level)} run(s) since the last change point; "
                                      f"{MIN_RUNS} needed"))
            continue
        summary = stats.summarize([p.median for p in level])
        if current > summary.ci_high * (1 + threshold):
            verdict = "regressed"
        elif current < summary.ci_low * (1 - threshold):
            verdict = "improved"
        else:
            verdict = "passed"
        out.append(HistoryVerdict(**base, verdict=verdict, level_median=summary.median, level_ci_low=summary.ci_low,
                                  level_ci_high=summary.ci_high,
                                  reason=f"{current / summary.median - 1:+.1%} vs the median of {len(level)} runs"))
    return out


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
