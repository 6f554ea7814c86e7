"""``gpubench compare --history``: a run's cases judged against their history since its last change
point (same device model), not against one baseline run.

Rule: for each case, the optimized variant's figure (its median time, or the case's gate_metric)
is compared with the runs of the current level, i.e. the store's runs of that case and variant
**before the run judged** (in run order: start time, then run id; where the store holds the run,
its place there) after the latest change point among them (:mod:`gpubench.gate.history.changepoints`),
less the runs it sets aside (levels of one run: a cold start, one run on a loaded machine).
Runs stored after it never judge it: an old run reads as it read when it was new.
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

A regressed case names its **suspects**: the runs of the level after the last one whose figure
was within the level (at or below the bound it failed), then the run itself, with their commits
and start times (a regression seen in an earlier run too, not yet a level of its own, puts that
run's commit among them).

The ratio is judged whatever the optimized variant's figure says (issue 34: a machine that got
faster, the baseline variant x0.90, hid an optimized variant at x0.99, passed at "+6.6%"): where the
run's own optimized/baseline ratio CI (:func:`run_ratios`: from its samples, at least
MIN_SAMPLES_FOR_RATIO a variant) lies wholly beyond the level's ratio CI times (1 +/- threshold),
and beyond half the baseline variant's move where that move went its way, the case is
**regressed** (**improved**) by the ratio.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpubench.errors import BadInput
from gpubench.gate.compare import MACHINE_SHARE, MIN_SAMPLES_FOR_RATIO, load_any
from gpubench.gate.history import changepoints
from gpubench.gate.history.rows import ResultRow, device_model
from gpubench.gate.history.since import Since
from gpubench.gate.history.store import HistoryStore, Point
from gpubench.records import stats
from gpubench.records.results import RunRecord

MIN_RUNS = 5


@dataclass(frozen=True)
class HistoryVerdict:
    case_id: str
    variant: str
    metric: str
    verdict: str  # regressed, failed, improved, passed, inconclusive, no_figure
    current: float | None
    level_median: float | None
    level_ci_low: float | None
    level_ci_high: float | None
    level_runs: int
    since_commit: str | None  # where the level starts (None: the whole history is one level)
    reason: str
    machine_move: float | None = None  # the baseline variant against its level (relative), where it was read
    ratio_move: float | None = None  # the optimized/baseline ratio against the level's ratios
    suspects: tuple[Suspect, ...] = ()  # regressed: the runs since the last one within the level, this one last
    last_within: Suspect | None = None  # regressed: the last run of the level within it (None: none was)


@dataclass(frozen=True)
class Suspect:
    """A run (and the commit it measured) a regression may have come in with."""

    run_id: str
    commit: str | None
    started_at: str

    def describe(self) -> str:
        return f"{(self.commit or 'no commit')[:12]} ({self.run_id}, {self.started_at[:16]})"


@dataclass(frozen=True)
class _Level:
    """A variant's runs since its last change point (the run judged left out), less those set
    aside (``runs``: all of them, set-aside ones included, the suspects' runs)."""

    points: list[Point]
    since_commit: str | None
    runs: tuple[Point, ...] = ()

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


def judge_run(
    store: HistoryStore,
    rows: Sequence[ResultRow],
    threshold: float,
    branch: str | None = None,
    run: RunRecord | None = None,
    model: str | None = None,
) -> list[HistoryVerdict]:
    """A verdict per case of the current run (its optimized variant, else its only variant),
    against ``branch``'s runs (:meth:`HistoryStore.series`; None: every run). ``run``: the run the
    rows are of, for its optimized/baseline ratio CIs (:func:`run_ratios`); None: read again from
    the rows' results file where it is one. A case that did not pass is ``failed`` (also one of
    ``run`` that recorded no rows, on device ``model`` where given)."""
    run = run if run is not None else _run_of(rows)
    cis = run_ratios(run) if run is not None else {}
    cases = {(device_model(run, c), c.id): c for c in run.cases} if run is not None else {}
    by_case: dict[tuple[str, str], list[ResultRow]] = {}
    for row in rows:
        by_case.setdefault((row.device_model, row.case_id), []).append(row)
    out = []
    for case_rows in by_case.values():
        row = next((r for r in case_rows if r.role == "optimized"), case_rows[0])
        control = next((r for r in case_rows if r.role == "baseline" and r is not row), None)
        if row.case_status not in (None, "passed"):
            failure = getattr(cases.get((row.device_model, row.case_id)), "failure", None)
            out.append(
                _not_passed(
                    row.case_id,
                    row.variant,
                    row.gate_metric or "time",
                    row.case_status,
                    failure.message if failure else None,
                )
            )
            continue
        ratio = cis.get((row.device_model, row.case_id, row.variant, control.variant if control else None))
        out.append(_judge_case(store, row, control, threshold, branch, ratio))
    if run is not None:  # a case that failed before any variant recorded anything has no rows
        models = {row.device_model for row in rows} or {key[0] for key in cases}
        for key, case in cases.items():
            if (
                case.status not in (None, "passed")
                and key not in by_case
                and (model is None or key[0] == model)
                and key[0] in models
                and not (case.status == "interrupted" and case.failure is not None and case.failure.kind == "budget")
            ):
                out.append(
                    _not_passed(
                        case.id,
                        case.role_variant("optimized") or "",
                        case.gate_metric or "time",
                        case.status,
                        case.failure.message if case.failure else None,
                    )
                )
    return out


def _not_passed(
    case_id: str, variant: str, metric: str, status: str | None, message: str | None = None
) -> HistoryVerdict:
    """A case that did not pass in the judged run (a wrong result, an error, a timeout, an overloaded
    machine): nothing measured to judge, and a gate never passes it (as the pairwise gate)."""
    return HistoryVerdict(
        case_id=case_id,
        variant=variant,
        metric=metric,
        verdict="failed",
        current=None,
        level_median=None,
        level_ci_low=None,
        level_ci_high=None,
        level_runs=0,
        since_commit=None,
        reason=f"the case {status or 'never finished'} in this run"
        + (f": {message}" if message else "")
        + "; nothing measured to judge",
    )


def before(points: Sequence[Point], row: ResultRow) -> list[Point]:
    """The points of runs before ``row``'s run: up to its place where ``points`` hold it (a run is
    its id and host), else those that started before it (start time, then run id: run order)."""
    held = next((i for i, p in enumerate(points) if (p.run_id, p.host) == (row.run_id, row.host)), None)
    if held is not None:
        return list(points[:held])
    return [p for p in points if (p.started_at, p.run_id) < (row.started_at, row.run_id)]


def _level(store: HistoryStore, row: ResultRow, metric: str, branch: str | None) -> _Level:
    """The runs since the last change point, less those change point detection set aside (a cold
    start 3x slower, kept, made the level's CI reach 3x and passed a run 50% slower)."""
    points = before(store.series(row.device_model, row.case_id, row.variant, metric, branch=branch), row)
    found = changepoints.levels(points)
    start = found.changes[-1].index if found.changes else 0
    aside = set(found.set_aside)
    return _Level(
        [p for i, p in enumerate(points) if i >= start and i not in aside],
        found.changes[-1].commit if found.changes else None,
        tuple(points[start:]),
    )


def _verdict(figure: float, level: Sequence[float], threshold: float) -> tuple[str, stats.SampleStats]:
    """regressed above the level's 95% CI x (1 + threshold), improved below its low end x (1 - threshold)."""
    summary = stats.summarize(level)
    low, high = summary.bounds()
    if figure > high * (1 + threshold):
        return "regressed", summary
    if figure < low * (1 - threshold):
        return "improved", summary
    return "passed", summary


def _judge_case(
    store: HistoryStore,
    row: ResultRow,
    control: ResultRow | None,
    threshold: float,
    branch: str | None,
    run_ratio: stats.RatioCI | None = None,
) -> HistoryVerdict:
    metric = row.gate_metric or "time"
    level = _level(store, row, metric, branch)
    current = _figure(row, metric)
    base: dict[str, Any] = dict(
        case_id=row.case_id,
        variant=row.variant,
        metric=metric,
        current=current,
        level_runs=len(level.points),
        since_commit=level.since_commit,
    )
    if current is None:
        return HistoryVerdict(
            **base,
            verdict="no_figure",
            level_median=None,
            level_ci_low=None,
            level_ci_high=None,
            reason=f"the run has no {metric} figure",
        )
    if metric == "time" and row.n is not None and not stats.has_interval(row.n):  # a count needs no samples
        return HistoryVerdict(
            **base,
            verdict="inconclusive",
            level_median=None,
            level_ci_low=None,
            level_ci_high=None,
            reason=f"the run's figure rests on too few samples (n={row.n}; a CI needs {stats.MIN_CI_SAMPLES})",
        )
    if len(level.points) < MIN_RUNS:
        return HistoryVerdict(
            **base,
            verdict="inconclusive",
            level_median=None,
            level_ci_low=None,
            level_ci_high=None,
            reason=f"{len(level.points)} run(s) since the last change point; {MIN_RUNS} needed",
        )
    verdict, summary = _verdict(current, [p.median for p in level.points], threshold)
    reason = (
        f"{current / summary.median - 1:+.1%} vs the median of {len(level.points)} runs"
        if summary.median > 0
        else f"{current:.4g} vs the median of {len(level.points)} runs, {summary.median:.4g}"
    )
    moves: dict[str, Any] = {}  # HistoryVerdict's machine_move and ratio_move, where judged
    # Machine noise moves times, never a count (bytes reserved): a count is judged as it is.
    if control is not None and metric == "time":
        verdict, reason, moves = _by_ratio(
            store, row, control, metric, branch, level, verdict, reason, threshold, run_ratio
        )
    named: dict[str, Any] = {}  # HistoryVerdict's suspects and last_within
    if verdict == "regressed":
        named = _suspects(store, row, control, metric, branch, level, threshold, "ratio_move" in moves)
        reason += _suspects_text(named["suspects"], named["last_within"])
    return HistoryVerdict(
        **base,
        verdict=verdict,
        level_median=summary.median,
        level_ci_low=summary.ci_low,
        level_ci_high=summary.ci_high,
        reason=reason,
        **moves,
        **named,
    )


def _suspects(
    store: HistoryStore,
    row: ResultRow,
    control: ResultRow | None,
    metric: str,
    branch: str | None,
    level: _Level,
    threshold: float,
    by_ratio: bool,
) -> dict[str, Any]:
    """The runs a regression may have come in with: those of the level after the last one within
    it (at or below the bound the run failed: ci_high x (1 + threshold) of the figures it was
    judged on, the optimized/baseline ratios where the machine moved), then the run itself. Runs
    set aside are not in the bound but may be suspects (a newest run already as slow)."""
    points, values = list(level.runs or level.points), [p.median for p in level.runs or level.points]
    if by_ratio and control is not None:
        by_run = {
            (p.run_id, p.host): p.median
            for p in store.series(control.device_model, control.case_id, control.variant, metric, branch=branch)
            if p.median > 0
        }
        points = [p for p in points if (p.run_id, p.host) in by_run]
        values = [p.median / by_run[p.run_id, p.host] for p in points]
    judged = [v for p, v in zip(points, values) if p in level.points]
    summary = stats.summarize(judged) if judged else None
    # Fewer runs than a CI needs (ratios of only some runs): the highest of them bounds the level.
    high = summary.ci_high if summary is not None and summary.ci_high is not None else max(judged, default=0.0)
    bound = high * (1 + threshold)
    last = max((i for i, v in enumerate(values) if v <= bound), default=None)
    after = points[0 if last is None else last + 1 :]
    this = Suspect(row.run_id, row.git_commit, row.started_at)
    return {
        "suspects": tuple(Suspect(p.run_id, p.commit, p.started_at) for p in after) + (this,),
        "last_within": None
        if last is None
        else Suspect(points[last].run_id, points[last].commit, points[last].started_at),
    }


def _suspects_text(suspects: Sequence[Suspect], last_within: Suspect | None) -> str:
    runs = ", ".join(s.describe() for s in suspects)
    if last_within is None:
        return f"; suspect commits: {runs} (no run of the level was within it)"
    return f"; suspect commits, after {last_within.describe()}, the last run within the level: {runs}"


def _by_ratio(
    store: HistoryStore,
    row: ResultRow,
    control: ResultRow,
    metric: str,
    branch: str | None,
    level: _Level,
    verdict: str,
    reason: str,
    threshold: float,
    run_ratio: stats.RatioCI | None = None,
) -> tuple[str, str, dict[str, Any]]:
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
    by_run = {
        (p.run_id, p.host): p.median
        for p in store.series(control.device_model, control.case_id, control.variant, metric, branch=branch)
        if (p.run_id, p.host) in runs and p.median > 0
    }
    if (
        figure is None
        or not control_figure
        or control_figure <= 0
        or figure <= 0
        or level.median() <= 0
        or len(by_run) < MIN_RUNS
    ):
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
        return (
            verdict,
            reason,
            ({"machine_move": math.exp(machine) - 1} if verdict in ("regressed", "improved") else {}),
        )
    ratio_text = f"the optimized/baseline ratio moved {math.exp(ratio_move) - 1:+.1%}" + (
        f" [{run_ratio.bounds()[0] / ratio_level.median - 1:+.1%}, {run_ratio.bounds()[1] / ratio_level.median - 1:+.1%}]"
        if clear is not None and run_ratio is not None
        else ""
    )
    if not moved:
        assert clear is not None  # not moved, and clear neither None nor the verdict (returned above)
        return (
            clear,
            (
                f"{ratio_text} against its level, its whole CI beyond the level's and the threshold, while "
                f"the baseline variant {control.variant} moved {math.exp(machine) - 1:+.1%}: the ratio "
                f"decides, not the optimized variant's own {reason} ({verdict} by itself)"
            ),
            moves,
        )
    moved_text = (
        f"{reason}, but the baseline variant {control.variant} moved {math.exp(machine) - 1:+.1%} in the same "
        f"runs too (the machine changed); {ratio_text}"
    )
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
    (low, high), (level_low, level_high) = run_ratio.bounds(), level.bounds()
    if low > max(level_high * (1 + threshold), allowance if machine > 0 else 0.0):
        return "regressed"
    if high < min(level_low * (1 - threshold), allowance if machine < 0 else math.inf):
        return "improved"
    return None


def run_ratios(run: RunRecord) -> dict[tuple[str, str, str | None, str | None], stats.RatioCI]:
    """Per (device model, case id, optimized variant, baseline variant) of ``run``: the time ratio
    with a bootstrap CI from its own samples (interleaved rounds resampled together,
    :func:`gpubench.records.stats.run_ratio_ci`), where both variants have at least MIN_SAMPLES_FOR_RATIO
    samples on one clock. What lets the history gate call a ratio move clear."""
    out = {}
    for index, case in enumerate(run.cases):
        names = case.role_variant("optimized"), case.role_variant("baseline")
        opt, ref = (case.variant(name) for name in names)
        if opt is None or ref is None or opt is ref or case.gate_metric or (opt.basis or "") != (ref.basis or ""):
            continue
        a, b = list(opt.samples_s), list(ref.samples_s)
        if min(len(a), len(b)) >= MIN_SAMPLES_FOR_RATIO and stats.median(b) > 0:
            key = (device_model(run, case), case.id, *names)  # mypy reads out[a, *b] as 3.11-only syntax
            out[key] = stats.run_ratio_ci(a, b, seed=index)
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


def changes_since(histories: Sequence[changepoints.CaseHistory], since: Since) -> list[Regression]:
    """Change points of ``histories`` (regressions and improvements) starting at or after the
    first run ``since`` starts at (:mod:`gpubench.gate.history.since`: a run id, a commit, a release tag)."""
    out = []
    for h in histories:
        start = next((i for i, p in enumerate(h.points) if since.starts_at(p)), None)
        if start is None:
            continue
        out += [Regression(h.case_id, h.variant, c) for c in h.changes if c.index >= start]
    return out


def regressions_since(histories: Sequence[changepoints.CaseHistory], since: Since) -> list[Regression]:
    """The regression change points of :func:`changes_since`."""
    return [r for r in changes_since(histories, since) if r.change.kind == "regression"]


def histories_before(
    store: HistoryStore, rows: Sequence[ResultRow], branch: str | None
) -> list[changepoints.CaseHistory]:
    """The case histories of ``rows``' run's device model (``rows``: one run, one device model),
    each cut before that run as :func:`before` cuts a level: the runs ``--since`` lists change
    points of are those each case's level was read from, so both name the same change points."""
    if not rows:
        return []
    return changepoints.case_histories(
        store, rows[0].device_model, branch=branch, keep=lambda points: before(points, rows[0])
    )
