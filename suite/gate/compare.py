"""The regression gate: compare a current run with a stored baseline, from results files only.

For each case in both runs, the optimized variant's time ratio ``median(current) /
median(baseline)`` gets a bootstrap 95% CI from the raw samples and a p-value from the same
bootstrap replicates (:func:`gpubench.records.stats.bootstrap_ratio_test`: two-sided, of "no change"), so
the two never contradict each other: the 95% CI excludes no change exactly when p < 0.05 (before
issue 34 the p was a Mann-Whitney U test's, printed beside CIs it contradicted: "-36.5% [-37.5,
-35.5], p 0.2"). A case **regresses** only when the slowdown is beyond the threshold *and*
statistically real: the whole CI lies beyond the threshold, or p < P_SIGNIFICANT (0.002: the
99.8% CI from those replicates excludes no change) with the median effect beyond it (asv's rule,
read on one bootstrap). It **improves** by the mirror rule. So an unchanged build on a noisy
machine passes.

The gate fails (exit 1) on a regression, on any case that failed or was interrupted in the current
run (a wrong result, an error, a timeout, Ctrl-C), on a case it cannot judge (no samples or no
figure on either side, or a baseline case that did not pass), on a case missing from the current
run unless allowed, and on a current run that never completed (killed, interrupted, aborted, out of
disk), whatever ``--allow-missing`` says: that option is for cases a complete run left out on
purpose, not for the cases a dead run never reached. A baseline that never completed fails the
gate too, unless forced.
Runs from different hardware or different scenario definitions are refused unless forced; forced
over different definitions, the gate compares the cases both runs hold (a case only in the baseline
is listed as missing, and does not fail).
A case a ``--budget`` run never started (``not_run``), or stopped when the budget ran out, is
missing, its reason "not run: budget": it fails the gate as any missing case does, unless
``--allow-missing`` (a run cut by its budget is complete: what it measured is gated).
When the case's baseline variant (timed interleaved with the optimized one in each run) moved the
same way too, clearly (its CI excludes no change) or by at least half as much, the machine changed
between the runs (a noisy neighbour, other clocks) and the optimized variant's own change proves
nothing: the case is judged by its optimized/baseline time ratio instead, current vs stored, with a
bootstrap CI that resamples each run's interleaved rounds together. It stays regressed (improved)
only when that ratio's whole CI lies beyond the threshold and beyond half the baseline variant's
move (log terms: a machine change does not slow both variants alike), each variant having at least
5 samples in each run; otherwise it is **inconclusive**, with both figures in its reason, and ``--strict``
fails on it. The ratio is the figure a machine's move does not make, so it is judged whatever the
optimized variant's own time says (issue 34: a machine that got faster, the baseline variant x0.90,
hid an optimized variant at x0.99, read "unchanged"): where its whole CI lies beyond that same
bound (at least 5 samples a variant and run) the case is **regressed** (**improved**) by the ratio,
even when the optimized variant's time did not move beyond the threshold or moved the other way.
A technique whose figure of merit is not time names a ``gate_metric`` (kv_cache: bytes
reserved); its cases are gated on that deterministic figure instead (no CI needed).
Times are compared on one clock (device or wall time, :mod:`gpubench.measure.timing`): where the runs'
headline clocks differ, on a clock both recorded; where they share none (a baseline of an older
gpubench on a GPU), the case is **inconclusive**, never judged on mixed clocks.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpubench.errors import BadInput
from gpubench.records import pytest_benchmark, stats
from gpubench.records.policy import parse_threshold as parse_threshold  # the gate's spelling of it (cli, tests)
from gpubench.records.results import CaseRecord, Device, RunRecord, as_run, load_run

DEFAULT_THRESHOLD = 0.05
# A median beyond the threshold is real when the whole 95% CI lies beyond it, or when the bootstrap
# p of no change (from the same replicates) is below this: the 99.8% CI excludes no change.
P_SIGNIFICANT = 0.002
# A machine that changed between runs does not slow both variants alike: on 14 A/A run pairs on this
# project's 2-core CPU the optimized/baseline ratio of unchanged code moved the baseline variant's
# way by up to 0.6 of its move (log terms), the near end of its CI by up to 0.22 (moe_grouping:
# +11.3% [+6.9, +16.7] beside +35.0%). A ratio must move beyond this share of it, as well as
# beyond the threshold, to count.
MACHINE_SHARE = 0.5
MIN_SAMPLES_FOR_RATIO = (
    stats.MIN_CI_SAMPLES
)  # per variant and run, to judge a case by its optimized/baseline ratio (the default min_reps)
ORDER = ("regressed", "failed", "missing", "no_samples", "inconclusive", "improved", "unchanged", "new")


# --------------------------------------------------------------------------------------------
# Inputs: gpubench results, or pytest-benchmark JSON


def load_any(path: str | Path) -> RunRecord:
    """A gpubench run directory / results.json (:func:`gpubench.records.results.load_run`: BadInput, exit 2,
    naming the file, for a missing or corrupt file or one of another schema version), or a
    pytest-benchmark JSON file (:mod:`gpubench.records.pytest_benchmark`), as the run it records."""
    path = Path(path)
    if path.is_file() and path.suffix == ".json":
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            raw = None  # load_run gives the clear message
        if pytest_benchmark.is_pytest_benchmark(raw):
            return pytest_benchmark.run_of(raw, path)
    return load_run(path)


# --------------------------------------------------------------------------------------------


@dataclass
class BaselineVariantChange:
    """The case's baseline variant, current vs baseline run (the machine's move, when the code did
    not change it), and the optimized/baseline ratio's change when the case was judged by it."""

    variant: str | None
    ratio: float
    ci_low: float | None  # None: too few samples for an interval
    ci_high: float | None
    relative_ratio: float | None = None
    relative_ci_low: float | None = None
    relative_ci_high: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The keys ``compare --json`` has always given: the relative ratio's only when judged by it."""
        return {k: v for k, v in asdict(self).items() if v is not None or not k.startswith("relative")}


@dataclass
class Change:
    case_id: str
    technique: str
    verdict: str  # one of ORDER
    variant: str | None = None
    baseline_median_s: float | None = None
    current_median_s: float | None = None
    ratio: float | None = None  # current / baseline time: above 1 is slower
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None
    threshold: float = DEFAULT_THRESHOLD
    n: int | None = None  # the fewer samples of the two runs' optimized variant (under MIN_CI_SAMPLES: no CI)
    reason: str = ""
    context: BaselineVariantChange | None = None  # None where the case has no baseline variant to read
    device: str = ""  # the device model, when the runs span several
    # The clock the samples compared are on (device, wall, host; cuda_event_legacy for two older
    # GPU runs); None where not compared by time, "" where a record does not say.
    time_basis: str | None = None

    def to_dict(self) -> dict[str, Any]:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {**fields, "context": self.context.to_dict() if self.context else {}}


@dataclass(frozen=True)
class Side:
    """What the comparison says of each run it compared (the keys of ``compare --json``)."""

    run_id: str | None = None
    scenario: str | None = None
    device_label: str | None = None
    source: str = "gpubench"
    path: str | None = None

    @classmethod
    def of(cls, run: RunRecord) -> Side:
        return cls(run.run_id, run.scenario_name, run.device_label, run.source, run.path)


@dataclass
class Comparison:
    baseline: Side
    current: Side
    changes: list[Change]
    allow_missing: bool
    forced: list[str]  # refusals overridden with --force
    strict: bool = False  # inconclusive cases fail too
    problems: list[str] = field(
        default_factory=list
    )  # what fails the gate besides its cases (a run that never completed)
    unfinished: list[str] = field(default_factory=list)  # "current", "baseline": the runs that never completed

    @property
    def failing(self) -> list[Change]:
        bad = (
            {"regressed", "failed", "no_samples"}
            | (set() if self.allow_missing else {"missing"})
            | ({"inconclusive"} if self.strict else set())
        )
        return [c for c in self.changes if c.verdict in bad]

    @property
    def passed(self) -> bool:
        return not self.failing and not self.problems

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def counts(self) -> dict[str, int]:
        return {v: sum(c.verdict == v for c in self.changes) for v in ORDER}

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "baseline": asdict(self.baseline),
            "current": asdict(self.current),
            "counts": self.counts(),
            "forced": self.forced,
            "strict": self.strict,
            "problems": self.problems,
            "unfinished": self.unfinished,
            "changes": [c.to_dict() for c in self.changes],
        }


def verdict_of(ci: stats.RatioCI, p: float, threshold: float) -> str:
    """Beyond the threshold, and real: the CI lies beyond it, or p < P_SIGNIFICANT (``p`` from the
    CI's own replicates: then the 99.8% CI excludes no change)."""
    slower, faster = 1.0 + threshold, 1.0 / (1.0 + threshold)
    low, high = ci.bounds()
    if ci.ratio > slower and (low > slower or p < P_SIGNIFICANT):
        return "regressed"
    if ci.ratio < faster and (high < faster or p < P_SIGNIFICANT):
        return "improved"
    return "unchanged"


def classify(
    baseline_samples: list[float], current_samples: list[float], threshold: float, seed: int = 0
) -> tuple[str, float, float | None, float | None, float | None]:
    """(verdict, ratio, ci_low, ci_high, p) for current vs baseline times: the CI and p from the
    same bootstrap replicates (:func:`gpubench.records.stats.bootstrap_ratio_test`). With fewer than
    :data:`gpubench.records.stats.MIN_CI_SAMPLES` samples on either side: ``inconclusive``, the ratio with
    no CI and no p (one timed call under load is no measurement to gate on)."""
    ci, p = stats.bootstrap_ratio_test(current_samples, baseline_samples, seed=seed)
    if not ci.has_interval or p is None:
        return "inconclusive", ci.ratio, None, None, None
    return verdict_of(ci, p, threshold), ci.ratio, ci.ci_low, ci.ci_high, p


def never_completed(run: RunRecord) -> str | None:
    """Why a run's record is not a whole run (its status and how many cases it holds), or None
    for a complete one. A pytest-benchmark file is whole."""
    if run.status == "complete":
        return None
    cases = len(run.cases)
    held = f"{cases} case{'s' if cases != 1 else ''} recorded" + (
        f" of {run.planned_cases} planned" if run.planned_cases else ""
    )
    why = {"running": "still 'running': the process was killed or is still going", "interrupted": "interrupted"}.get(
        run.status, run.status
    )
    return f"status {why}{f' ({run.abort_reason})' if run.abort_reason else ''}; {held}"


def _definition(run: RunRecord) -> tuple[str | None, str]:
    return run.scenario_name, json.dumps(run.scenario_entries, sort_keys=True)


def for_device(run: RunRecord, label: str) -> RunRecord:
    """The part of a run measured on one device model, as a run of its own."""
    return dataclasses.replace(run, device_label=label, cases=[c for c in run.cases if run.device_of(c) == label])


def compare(
    baseline: RunRecord | Mapping[str, Any],
    current: RunRecord | Mapping[str, Any],
    *,
    threshold: float = DEFAULT_THRESHOLD,
    allow_missing: bool = False,
    force: bool = False,
    strict: bool = False,
) -> Comparison:
    """Each case of ``current`` against the same case on the same device model in ``baseline``
    (a run over several models is gated model by model). The runs are records; a results
    document (a dict, as a script or a test builds one) is read into one first."""
    baseline, current = as_run(baseline), as_run(current)
    forced: list[str] = []
    several = _check_like_for_like(baseline, current, force, forced)
    # Different definitions, forced: the runs were not meant to hold the same cases, so what the
    # baseline has and the current run lacks is a difference of definitions, not a lost case.
    allow_missing = allow_missing or _definition(baseline) != _definition(current)
    problems, unfinished = _unfinished(baseline, current, force, forced)
    changes = _changes(baseline, current, threshold, several, "current" in unfinished)
    changes.sort(
        key=lambda c: (ORDER.index(c.verdict), -(c.ratio or 0.0) if c.verdict == "regressed" else (c.ratio or 0.0))
    )
    return Comparison(Side.of(baseline), Side.of(current), changes, allow_missing, forced, strict, problems, unfinished)


def _check_like_for_like(baseline: RunRecord, current: RunRecord, force: bool, forced: list[str]) -> bool:
    """Refuse runs of different hardware or scenario definitions (BadInput) unless forced, noting
    what was forced in ``forced``. Returns whether cases are matched per device model (runs over
    several models, not forced)."""
    base_labels, cur_labels = baseline.device_labels(), current.device_labels()
    if not set(base_labels) & set(cur_labels):
        message = (
            f"the runs were measured on different hardware: baseline on "
            f"{' + '.join(base_labels)!r}, current on {' + '.join(cur_labels)!r}"
        )
        if not force:
            raise BadInput(
                f"compare: {message}. Timings do not transfer between devices; compare runs of "
                f"one GPU model (keep one baseline per model with `gpubench baseline save`), "
                f"or pass --force."
            )
        forced.append(message)
    if _definition(baseline) != _definition(current):
        message = (
            f"the scenario definitions differ (baseline {baseline.scenario_name!r}, current "
            f"{current.scenario_name!r}, or their entries)"
        )
        if not force:
            raise BadInput(
                f"compare: {message}; cases would not be like for like. Re-run the same scenario, "
                f"or pass --force to compare the cases they share (with --force, cases only in "
                f"the baseline are listed as missing but do not fail the gate)."
            )
        forced.append(f"{message}: compared the cases both runs hold; cases only in the baseline do not fail the gate")
    return len(set(base_labels) | set(cur_labels)) > 1 and not forced


def _unfinished(baseline: RunRecord, current: RunRecord, force: bool, forced: list[str]) -> tuple[list[str], list[str]]:
    """(problems that fail the gate, the sides whose run never completed)."""
    problems, unfinished = [], []
    for side, run in (("current", current), ("baseline", baseline)):
        why = never_completed(run)
        if why is None:
            continue
        unfinished.append(side)
        if side == "current":
            problems.append(
                f"the current run never completed ({why}): the cases it did not reach were never "
                f"measured, so the gate cannot pass it (--allow-missing covers cases a complete run "
                f"left out, not these); run the scenario to the end"
            )
        elif force:
            forced.append(f"the baseline run never completed ({why}): cases it lacks are new, not gated")
        else:
            problems.append(
                f"the baseline run never completed ({why}): cases it lacks would be new, not gated; "
                f"store a complete run as the baseline (gpubench baseline save refuses any other), "
                f"or pass --force"
            )
    return problems, unfinished


def _changes(
    baseline: RunRecord, current: RunRecord, threshold: float, several: bool, current_stopped: bool
) -> list[Change]:
    """A change per case of either run, keyed by case id (and device model when ``several``)."""

    def keyed(run: RunRecord) -> dict[tuple[str, str], CaseRecord]:
        return {(c.id, run.device_of(c) if several else ""): c for c in run.cases}

    thresholds = current.thresholds
    base_cases, cur_cases = keyed(baseline), keyed(current)
    changes = []
    for index, ((case_id, device), cur) in enumerate(cur_cases.items()):
        change = Change(
            case_id, cur.technique, "new", threshold=thresholds.get(cur.technique, threshold), device=device
        )
        base = base_cases.get((case_id, device))
        if cur.status == "interrupted" and cur.failure is not None and cur.failure.kind == "budget":
            change.verdict = "missing"  # cut short by --budget: its samples are partial, not a measurement
            change.reason = f"not run to the end: budget ({cur.failure.message})"
        elif not cur.passed:
            change.verdict, change.reason = "failed", _not_passed(cur, "")
        elif base is not None and not base.passed:
            change.verdict, change.reason = (
                "no_samples",
                _not_passed(base, "in the baseline, ") + ": nothing to compare with",
            )
        elif base is not None:
            _fill(change, base, cur, seed=index)
        changes.append(change)
    not_run = {(c.id, (c.target or "") if several else ""): c for c in current.not_run}
    for (case_id, device), base in base_cases.items():
        if (case_id, device) not in cur_cases and (case_id, device) not in not_run:
            changes.append(
                Change(
                    case_id,
                    base.technique,
                    "missing",
                    threshold=thresholds.get(base.technique, threshold),
                    device=device,
                    reason="in the baseline, not in the current run"
                    + (", which stopped before it" if current_stopped else ""),
                )
            )
    for (case_id, device), skipped in not_run.items():  # never started: missing, whatever the baseline holds
        changes.append(
            Change(
                case_id,
                skipped.technique,
                "missing",
                threshold=thresholds.get(skipped.technique, threshold),
                device=device,
                reason=f"not run: {skipped.reason} (would have needed {skipped.need_text()})",
            )
        )
    return changes


def _not_passed(case: CaseRecord, where: str) -> str:
    """What happened to a case that did not pass: its failure's message, or 'case interrupted
    (stopped by Ctrl-C)' and the like."""
    status = case.status or "never finished"
    message = case.failure.message if case.failure else None
    if status == "failed":
        return f"{where}{message}" if message else f"{where}case failed"
    return f"{where}case {status}" + (f" ({message})" if message else "")


def _samples(case: CaseRecord, name: str | None, basis: str | None = None) -> list[float]:
    """The variant's samples on clock ``basis`` (its headline's when None or unknown): [] where it
    recorded none on that clock."""
    variant = case.variant(name)
    if variant is None:
        return []
    if not basis or not variant.basis:
        return list(variant.samples_s)
    return variant.samples_on(basis) or []


CLOCK_NAMES = {
    "device": "device time",
    "wall": "wall time",
    "host": "the CPU's one clock",
    "cuda_event_legacy": "the older CUDA clock (events started after a host sync: launch work in, "
    "the final sync out; neither device nor wall time)",
}


def common_basis(base: Any, cur: Any) -> tuple[str | None, str]:
    """The clock two records of a variant are compared on, and a note where it is not both
    headlines' (None and why, where they hold no clock in common). Like with like: the current
    run's headline clock where the baseline recorded it too, else the baseline's where the
    current run recorded that; a record that does not say its clock is read as before (headline
    against headline)."""
    b, c = (base.basis if base is not None else ""), (cur.basis if cur is not None else "")
    if b == c or not b or not c:
        return c or b, ""
    if base.samples_on(c):
        return (
            c,
            f"compared on {CLOCK_NAMES.get(c, c)}, which the baseline recorded beside its headline ({CLOCK_NAMES.get(b, b)})",
        )
    if cur.samples_on(b):
        return b, (
            f"compared on {CLOCK_NAMES.get(b, b)}, the baseline's headline, which the current run recorded beside "
            f"its own ({CLOCK_NAMES.get(c, c)})"
        )
    return None, (
        f"not judged on mixed clocks: the baseline was timed on {CLOCK_NAMES.get(b, b)}, the current run "
        f"on {CLOCK_NAMES.get(c, c)}, and neither recorded the other's; re-record the baseline with this "
        f"gpubench (gpubench baseline save) to gate this case"
    )


def _control_moved(control: stats.RatioCI, ratio: float) -> bool:
    """Did the case's baseline variant move the way the optimized one did, so that the machine, not
    the code, may explain the optimized variant's change? Yes when it moved the same way clearly (its
    CI excludes no change) or by at least half as much (point estimates, in log terms). Either is
    enough: a few heavy-tailed samples give the baseline variant a CI that spans 1 while it moved as
    far as the optimized one (issue 27: +15.3% beside +13.2%)."""
    if math.log(control.ratio) * math.log(ratio) <= 0:
        return False  # it stood still or moved the other way
    # A baseline variant of too few samples has no CI: only its point estimate can say it moved.
    clearly = control.has_interval and (control.bounds()[0] > 1.0 if ratio > 1 else control.bounds()[1] < 1.0)
    return clearly or math.log(control.ratio) / math.log(ratio) >= 0.5


def _pct(ci: stats.RatioCI) -> str:
    if not ci.has_interval:
        return f"{(ci.ratio - 1) * 100:+.1f}% (n={ci.n})"
    low, high = ci.bounds()
    return f"{(ci.ratio - 1) * 100:+.1f}% [{(low - 1) * 100:+.1f}, {(high - 1) * 100:+.1f}]"


def _ratio_bound(direction: str, threshold: float, control: stats.RatioCI) -> float:
    """How far the optimized/baseline ratio must move to count as ``direction``: beyond the
    threshold, and beyond what the machine's move can do to the ratio of unchanged code
    (MACHINE_SHARE of the baseline variant's move, log terms; only a move the machine's way needs it)."""
    allowance = float(control.ratio**MACHINE_SHARE)
    return max(1.0 + threshold, allowance) if direction == "regressed" else min(1.0 / (1.0 + threshold), allowance)


def ratio_verdict(relative: stats.RatioCI, control: stats.RatioCI, threshold: float) -> str | None:
    """ "regressed" ("improved") when the optimized/baseline ratio's whole CI lies beyond
    :func:`_ratio_bound`; None when it does not clearly move (or has no CI: too few samples)."""
    if not relative.has_interval:
        return None
    low, high = relative.bounds()
    if low > _ratio_bound("regressed", threshold, control):
        return "regressed"
    if high < _ratio_bound("improved", threshold, control):
        return "improved"
    return None


def _beyond(direction: str, threshold: float, control: stats.RatioCI) -> str:
    bound = _ratio_bound(direction, threshold, control)
    text = f"beyond the {threshold * 100:g}% threshold"
    if bound == control.ratio**MACHINE_SHARE:
        text += f" and the {(bound - 1) * 100:+.1f}% that half the machine's move can put on it"
    return text


def _judge_by_relative_ratio(
    change: Change, control: stats.RatioCI, relative: stats.RatioCI, fewest_samples: int
) -> None:
    """The optimized/baseline ratio's verdict (:func:`ratio_verdict`), where it may differ from the
    optimized variant's own. The baseline variant moved the way the optimized one did: the case
    keeps its verdict only if the ratio moved that way clearly too, and that CI rests on enough
    samples (one round taken under load gives a CI of no width). The ratio moved clearly
    where the optimized variant's time did not tell it (a faster machine hid a regression, issue
    34; or the machine's move hid a gain): the ratio's verdict is the case's, whatever the machine
    did."""
    own = change.verdict
    machine = f"the baseline variant moved {(control.ratio - 1) * 100:+.1f}%"
    if fewest_samples < MIN_SAMPLES_FOR_RATIO:
        change.verdict = "inconclusive"
        change.reason = (
            f"{machine} too; the optimized/baseline ratio moved {(relative.ratio - 1) * 100:+.1f}%, but a "
            f"variant has {fewest_samples} sample{'s' if fewest_samples != 1 else ''} in a run (fewer "
            f"than {MIN_SAMPLES_FOR_RATIO}): too few to tell the code from the machine"
        )
        return
    by_ratio = ratio_verdict(relative, control, change.threshold)
    if by_ratio == own:
        change.reason = (
            f"{machine} too, but the optimized/baseline ratio moved {_pct(relative)}, "
            f"{_beyond(own, change.threshold, control)}"
        )
    elif by_ratio is not None:
        change.verdict = by_ratio
        change.reason = (
            f"the optimized/baseline ratio moved {_pct(relative)}, {_beyond(by_ratio, change.threshold, control)}"
            f", while {machine}: the ratio decides, not the optimized variant's own "
            f"{((change.ratio or 1.0) - 1) * 100:+.1f}% ({own} by itself)"
        )
    else:
        change.verdict = "inconclusive"
        change.reason = (
            f"{machine} too; the optimized/baseline ratio moved {_pct(relative)}, not wholly "
            f"{_beyond(own, change.threshold, control)}: the machine changed between the runs"
        )


def _metric(case: CaseRecord, name: str | None, key: str) -> float | None:
    variant = case.variant(name)
    value = variant.metric(key) if variant is not None else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _fill(change: Change, base: CaseRecord, cur: CaseRecord, seed: int) -> None:
    # Variants are matched by role: a stored baseline may name them otherwise (schema 1 called
    # them "baseline" and "optimized"; a CPU run's optimized variant is not a GPU run's).
    name, base_name = cur.role_variant("optimized"), base.role_variant("optimized")
    if cur.gate_metric:
        _fill_by_metric(
            change,
            _metric(base, base_name, cur.gate_metric),
            _metric(cur, name, cur.gate_metric),
            cur.gate_metric,
            name,
        )
        return
    change.variant = name if base_name in (name, None) else f"{base_name} -> {name}"
    basis, note = common_basis(base.variant(base_name), cur.variant(name))
    change.time_basis = basis
    if basis is None:
        change.verdict, change.reason = "inconclusive", note
        return
    a, b = _samples(base, base_name, basis), _samples(cur, name, basis)
    if not a or not b:
        change.verdict = "no_samples"
        change.reason = f"no raw samples of {name or 'an optimized variant'} in " + (
            "the baseline" if not a else "the current run"
        )
        return
    change.verdict, change.ratio, change.ci_low, change.ci_high, change.p_value = classify(a, b, change.threshold, seed)
    change.baseline_median_s, change.current_median_s = stats.median(a), stats.median(b)
    change.n = min(len(a), len(b))
    if not stats.has_interval(change.n):
        change.reason = (
            f"too few samples to judge: {len(a)} in the baseline, {len(b)} now (a CI needs "
            f"{stats.MIN_CI_SAMPLES} a side)"
        )
    _judge_against_control(change, base, cur, name, basis, a, b, seed)
    if note:
        change.reason = f"{change.reason}; {note}" if change.reason else note


def _judge_against_control(
    change: Change,
    base: CaseRecord,
    cur: CaseRecord,
    name: str | None,
    basis: str,
    a: list[float],
    b: list[float],
    seed: int,
) -> None:
    """The case's baseline variant, on the same clock as the optimized one: the machine's move, and
    the optimized/baseline ratio where that move may explain the optimized variant's change."""
    ref = cur.role_variant("baseline")
    ra, rb = _samples(base, base.role_variant("baseline"), basis), _samples(cur, ref, basis)
    if not (ra and rb and ref != name):
        return
    ci = stats.bootstrap_ratio_ci(rb, ra, seed=seed)
    change.context = BaselineVariantChange(ref, ci.ratio, ci.ci_low, ci.ci_high)
    fewest = min(len(a), len(b), len(ra), len(rb))
    moved = (
        change.verdict in ("regressed", "improved") and change.ratio is not None and _control_moved(ci, change.ratio)
    )
    relative = stats.relative_ratio_ci(a, ra, b, rb, seed=seed)
    # The ratio is the figure a machine's move does not make: it decides where the baseline variant
    # moved too, and wherever it clearly says otherwise than the optimized variant's own time.
    if moved or (
        fewest >= MIN_SAMPLES_FOR_RATIO and ratio_verdict(relative, ci, change.threshold) not in (None, change.verdict)
    ):
        change.context.relative_ratio, change.context.relative_ci_low, change.context.relative_ci_high = (
            relative.ratio,
            relative.ci_low,
            relative.ci_high,
        )
        _judge_by_relative_ratio(change, ci, relative, fewest)


def _fill_by_metric(change: Change, before: float | None, now: float | None, key: str, name: str | None) -> None:
    """A technique gated on its own deterministic figure (kv_cache: bytes reserved): exact, no CI."""
    change.variant = name
    if before is None or now is None or before <= 0:
        change.verdict, change.reason = "no_samples", f"no {key} figure to gate on"
        return
    ratio = now / before
    change.verdict = verdict_of(stats.RatioCI(ratio, ratio, ratio), 1.0, change.threshold)
    change.ratio = change.ci_low = change.ci_high = ratio
    change.reason = f"gated on {key}: {before:,.0f} -> {now:,.0f} (exact)"


# --------------------------------------------------------------------------------------------
# Baseline store: one stored results file per GPU model and scenario


def device_slug(label: str | None) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'NVIDIA-H100-80GB-HBM3' (a directory name)."""
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", label or "unknown-device").strip("-")
    return slug or "unknown-device"


def store_path(store: Path, run: RunRecord, name: str | None = None) -> Path:
    scenario = name or run.scenario_name or "run"
    return Path(store) / device_slug(run.device_label) / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', scenario)}.json"


def load_from_store(store: Path, current: RunRecord) -> tuple[RunRecord, list[Path]]:
    """The stored baseline of each device model ``current`` ran on, merged into one run (each
    case keeps its device); BadInput when there is none for any of them."""
    found = [(label, store_path(store, for_device(current, label))) for label in current.device_labels()]
    found = [(label, path) for label, path in found if path.is_file()]
    if not found:
        find_in_store(store, current)  # raises, listing what is stored
    runs = [(label, for_device(load_any(path), label)) for label, path in found]
    if len(runs) == 1:
        return runs[0][1], [found[0][1]]
    cases = [
        dataclasses.replace(c, device=dataclasses.replace(c.device or Device.from_dict({}), label=label))
        for label, run in runs
        for c in run.cases
    ]
    merged = dataclasses.replace(runs[0][1], cases=cases, device_label=" + ".join(label for label, _ in runs))
    return merged, [path for _, path in found]


def find_in_store(store: Path, current: RunRecord) -> Path:
    path = store_path(store, current)
    if path.is_file():
        return path
    available = sorted(str(p.relative_to(store)) for p in Path(store).glob("*/*.json")) if Path(store).is_dir() else []
    raise BadInput(
        f"--baseline-store {store}: no baseline for this device and scenario (looked for {path}); "
        f"stored: {', '.join(available) or 'none'}. Save one with "
        f"`gpubench baseline save RUN_DIR --baseline-dir {store}`."
    )
