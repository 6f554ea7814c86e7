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

The ratio is judged whatever the optimized variant's figure says (issue 34: a machine that got
faster, the baseline variant x0.90, hid an optimized variant at x0.99, passed at "+6.6%"): where the
run's own optimized/baseline ratio CI (:func:`run_ratios`: from its samples, at least
MIN_SAMPLES_FOR_RATIO a variant) lies wholly beyond the level's ratio CI times (1 +/- threshold),
and beyond half the baseline variant's move where that move went its way, the case is
**regressed** (**improved**) by the ratio.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from gpubench import stats
from gpubench.compare import MACHINE_SHARE, MIN_SAMPLES_FOR_RATIO, load_any
from gpubench.errors import BadInput
from gpubench.history import changepoints
from gpubench.history.rows import ResultRow, device_model
from gpubench.history.since import Since
from gpubench.history.store import HistoryStore
from gpubench.results import RunRecord

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
              branch: str | None = None, run: RunRecord | None = None) -> list[HistoryVerdict]:
    """A verdict per case of the current run (its optimized variant, else its only variant),
    against ``branch``'s runs (:meth:`HistoryStore.series`; None: every run). ``run``: the run the
    rows are of, for its optimized/baseline ratio CIs (:func:`run_ratios`); None: read again from
    the rows' results file where it is one."""
    run = run if run is not None else _run_of(rows)
    cis = run_ratios(run) if run is not None else {}
    by_case: dict[tuple[str, str], list[ResultRow]] = {}
    for row in rows:
        by_case.setdefault((row.device_model, row.case_id), []).append(row)
    out = []
    for case_rows in by_case.values():
        row = next((r for r in case_rows if r.role == "optimized"), case_rows[0])
        control = next((r for r in case_rows if r.role == "baseline" and r is not row), None)
        ratio = cis.get((row.device_model, row.case_id, row.variant, control.variant if control else None))
        out.append(_judge_case(store, row, control, threshold, branch, ratio))
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
                branch: str | None, run_ratio: stats.RatioCI | None = None) -> HistoryVerdict:
    metric = row.gate_metric or "time"
    level = _level(store, row, metric, branch)
    current = _figure(row, metric)
    base = dict(case_id=row.case_id, variant=row.variant, metric=metric, current=current,
                level_runs=len(level.points), since_commit=level.since_commit)
    if current is None:
        return HistoryVerdict(**base, verdict="no_figure", level_median=None, level_ci_low=None, level_ci_high=None,
                              reason=f"the run has no {metric} figure")
    if len(level.points) < MIN_RUNS:
        return HistoryVerdict(**base, verdict="inconclusive", level_median=None, level_ci_low=None,
                              level_ci_high=None, reason=f"{len(level.points)} run(s) since the last change point; "
                              f"{MIN_RUNS} needed")
    verdict, summary = _verdict(current, [p.median for p in level.points], threshold)
    reason = (f"{current / summary.median - 1:+.1%} vs the median of {len(level.points)} runs" if summary.median > 0
              else f"{current:.4g} vs the median of {len(level.points)} runs, {summary.median:.4g}")
    moves: dict[str, float | None] = {}
    # Machine noise moves times, never a count (bytes reserved): a count is judged as it is.
    if control is not None and metric == "time":
        verdict, reason, moves = _by_ratio(store, row, control, metric, branch, level, verdict, reason, threshold,
                                           run_ratio)
    return HistoryVerdict(**base, verdict=verdict, level_median=summary.median, level_ci_low=summary.ci_low,
                          level_ci_high=summary.ci_high, reason=reason, **moves)


def _by_ratio(store: HistoryStore, row: ResultRow, control: ResultRow, metric: str, branch: str | None,
              level: _Level, verdict: str, reason: str, threshold: float,
              run_ratio: stats.RatioCI | None = None) -> tuple[str, str, dict]:
    """The verdict read with the optimized/baseline ratio against the level's ratios (the figure a
    machine's move does not make). The baseline variant moved the same way as the optimized one,
    against its figures in the same level runs, by at least half as much (log terms): the verdict
    stands only if the ratio moved that way too, beyond half the machine's move, else inconclusive.
    The ratio says otherwise than the optimized variant's figure, clearly (``run_ratio``, the run's
    own ratio CI, wholly beyond the level: :func:`_ratio_clear`): the ratio's verdict, whatever the
    machine did (issue 34: the baseline variant x0.90 and the optimized x0.99 passed at "+6.6%").
    Else the verdict as it was."""
    figure, control_figure = _figure(row, metric), _figure(control, metric)
    runs = {(p.run_id, p.host) for p in level.points}  # a run is its id and host (runners may share a store)
    by_run = {(p.run_id, p.host): p.median
              for p in store.series(control.device_model, control.case_id, control.variant, metric, branch=branch)
              if (p.run_id, p.host) in runs and p.median > 0}
    if not control_figure or control_figure <= 0 or figure <= 0 or level.median() <= 0 or len(by_run) < MIN_RUNS:
        return verdict, reason, {}  # no ratio of logs to take
    move = math.log(figure / level.median())
    machine = math.log(control_figure / stats.median(list(by_run.values())))
    moved = verdict in ("regressed", "improved") and move * machine > 0 and abs(machine) >= abs(move) / 2
    ratios = [p.median / by_run[p.run_id, p.host] for p in level.points if (p.run_id, p.host) in by_run]
    ratio_verdict, ratio_level = _verdict(figure / control_figure, ratios, threshold)
    ratio_move = math.log(figure / control_figure / ratio_level.median)
    clear = _ratio_clear(run_ratio, ratio_level, machine, threshold) if run_ratio is not None else None
    moves = {"machine_move": math.exp(machine) - 1, "ratio_move": math.exp(ratio_move) - 1}
    if not moved and clear in (None, verdict):
        return verdict, reason, ({"machine_move": math.exp(machine) - 1} if verdict in ("regressed", "improved") else {})
    ratio_text = (f"the optimized/baseline ratio moved {math.exp(ratio_move) - 1:+.1%}" + (
        f" [{run_ratio.ci_low / ratio_level.median - 1:+.1%}, {run_ratio.ci_high / ratio_level.median - 1:+.1%}]"
        if clear is not None else ""))
    if not moved:
        return clear, (f"{ratio_text} against its level, its whole CI beyond the level's and the threshold, while "
                       f"the baseline variant {control.variant} moved {math.exp(machine) - 1:+.1%}: the ratio "
                       f"decides, not the optimized variant's own {reason} ({verdict} by itself)"), moves
    moved_text = (f"{reason}, but the baseline variant {control.variant} moved {math.exp(machine) - 1:+.1%} in the same "
                  f"runs too (the machine changed); {ratio_text}")
    if ratio_verdict == verdict and abs(ratio_move) > abs(machine) * MACHINE_SHARE:
        return verdict, f"{moved_text}, beyond its level and half the machine's move", moves
    if clear is not None and clear != verdict:
        return clear, f"{moved_text}, its whole CI beyond its level the other way: {clear} by the ratio", moves
    return "inconclusive", moved_text, moves


def _ratio_clear(run_ratio: stats.RatioCI, level: stats.SampleStats, machine: float, threshold: float) -> str | None:
    """regressed (improved) when the run's optimized/baseline ratio CI lies wholly beyond the
    level's ratio CI widened by the threshold, as the time is judged (:func:`_verdict`), and, where
    the ratio moved the machine's way (``machine``: the baseline variant's move, log terms), beyond
    MACHINE_SHARE of that move from the level's median too (a machine change does not move both
    variants alike); else None."""
    allowance = level.median * math.exp(machine * MACHINE_SHARE)
    if run_ratio.ci_low > max(level.ci_high * (1 + threshold), allowance if machine > 0 else 0.0):
        return "regressed"
    if run_ratio.ci_high < min(level.ci_low * (1 - threshold), allowance if machine < 0 else math.inf):
        return "improved"
    return None


def run_ratios(run: RunRecord) -> dict[tuple[str, str, str, str], stats.RatioCI]:
    """Per (device model, case id, optimized variant, baseline variant) of ``run``: the time ratio
    with a bootstrap CI from its own samples (interleaved rounds resampled together,
    :func:`gpubench.stats.run_ratio_ci`), where both variants have at least MIN_SAMPLES_FOR_RATIO
    samples on one clock. What lets the history gate call a ratio move clear."""
    out = {}
    for index, case in enumerate(run.cases):
        names = case.role_variant("optimized"), case.role_variant("baseline")
        opt, ref = (case.variant(name) for name in names)
        if opt is None or ref is None or opt is ref or case.gate_metric or (opt.basis or "") != (ref.basis or ""):
            continue
        a, b = list(opt.samples_s), list(ref.samples_s)
        if min(len(a), len(b)) >= MIN_SAMPLES_FOR_RATIO and stats.median(b) > 0:
            out[device_model(run, case), case.id, *names] = stats.run_ratio_ci(a, b, seed=index)
    return out


def _run_of(rows: Sequence[ResultRow]) -> RunRecord | None:
    """The run ``rows`` were read from, read again from their results file; None where it is not
    one this gpubench reads (the rows then judge by time and the level's ratios only)."""
    paths = {row.results_path for row in rows}
    if len(paths) != 1 or not Path(next(iter(paths))).is_file():
        return None
    try:
        return load_any(next(iter(paths)))
    except (BadInput, OSError, ValueError, TypeError, KeyError):
        return None


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
