"""The regression gate: compare a current run with a stored baseline, from results files only.

For each case in both runs, the optimized variant's time ratio ``median(current) /
median(baseline)`` gets a bootstrap 95% CI from the raw samples and a Mann-Whitney U p-value.
A case **regresses** only when the slowdown is beyond the threshold *and* statistically real:
the whole CI lies beyond the threshold, or p < 0.002 with the median effect beyond it (the rule
asv uses). It **improves** by the mirror rule. So an unchanged build on a noisy machine passes.

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
When the case's baseline variant (timed interleaved with the optimized one in each run) moved the
same way too, clearly (its CI excludes no change) or by at least half as much, the machine changed
between the runs (a noisy neighbour, other clocks) and the optimized variant's own change proves
nothing: the case is judged by its optimized/baseline time ratio instead, current vs stored, with a
bootstrap CI that resamples each run's interleaved rounds together. It stays regressed (improved)
only when that ratio's whole CI lies beyond the threshold and beyond half the baseline variant's
move (log terms: a machine change does not slow both variants alike), each variant having at least
5 samples in each run; otherwise it is **inconclusive**, with both figures in its reason, and ``--strict``
fails on it. A technique whose figure of merit is not time names a ``gate_metric`` (kv_cache: bytes
reserved); its cases are gated on that deterministic figure instead (no CI needed).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpubench import stats
from gpubench.errors import BadInput
from gpubench.results import SCHEMA_VERSION, load_results, role_variant

DEFAULT_THRESHOLD = 0.05
P_SIGNIFICANT = 0.002
# A machine that changed between runs does not slow both variants alike: on 14 A/A run pairs on this
# project's 2-core CPU the optimized/baseline ratio of unchanged code moved the baseline variant's
# way by up to 0.6 of its move (log terms), the near end of its CI by up to 0.22 (moe_grouping:
# +11.3% [+6.9, +16.7] beside +35.0%). A ratio must move beyond this share of it, as well as
# beyond the threshold, to count.
MACHINE_SHARE = 0.5
MIN_SAMPLES_FOR_RATIO = 5  # per variant and run, to judge a case by its optimized/baseline ratio (the default min_reps)
ORDER = ("regressed", "failed", "missing", "no_samples", "inconclusive", "improved", "unchanged", "new")


def parse_threshold(text: str | float, source: str = "--threshold") -> float:
    """'5%', '0.05' or 0.05 -> 0.05."""
    try:
        value = float(str(text).strip().rstrip("%")) / (100.0 if str(text).strip().endswith("%") else 1.0)
    except ValueError:
        value = -1.0
    if not 0 < value < 10:
        raise BadInput(f"{source}: {text!r} is not a valid threshold; allowed: a slowdown fraction "
                       f"such as 5% or 0.05 (greater than 0).")
    return value


# --------------------------------------------------------------------------------------------
# Inputs: gpubench results, or pytest-benchmark JSON

def load_any(path: str | Path) -> dict[str, Any]:
    """A gpubench run directory / results.json, or a pytest-benchmark JSON file, as a results doc."""
    path = Path(path)
    if path.is_file() and path.suffix == ".json":
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            raw = None  # load_results gives the clear message
        if isinstance(raw, dict) and "benchmarks" in raw and "machine_info" in raw:
            return from_pytest_benchmark(raw, path)
    return load_results(path)


def from_pytest_benchmark(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    """pytest-benchmark's --benchmark-json output as a results doc: one case per benchmark, its
    raw times (saved with --benchmark-save-data) as the samples."""
    machine = raw.get("machine_info") or {}
    cpu = (machine.get("cpu") or {}).get("brand_raw") or machine.get("processor") or "unknown CPU"
    cases = []
    for bench in raw.get("benchmarks") or []:
        st = bench.get("stats") or {}
        data = st.get("data") or []
        name = bench.get("fullname") or bench.get("name")
        variant = {"role": "optimized", "status": "ok", "samples_s": [float(x) for x in data],
                   "stats": {"median": st.get("median"), "n": st.get("rounds")}}
        cases.append({"id": name, "technique": bench.get("group") or "pytest-benchmark",
                      "params": bench.get("params") or {}, "status": "passed", "failure": None,
                      "variants": {"benchmark": variant}})
    return {"kind": "gpubench.results", "schema_version": SCHEMA_VERSION, "source": "pytest-benchmark",
            "path": str(path), "device_label": f"CPU: {cpu}", "run_id": path.stem,
            "scenario": {"name": "pytest-benchmark", "entries": None}, "cases": cases}


# --------------------------------------------------------------------------------------------

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
    reason: str = ""
    context: dict[str, Any] = field(default_factory=dict)  # the baseline variant's change, for reading
    device: str = ""  # the device model, when the runs span several

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Comparison:
    baseline: dict[str, Any]  # run_id, scenario, device_label of each side
    current: dict[str, Any]
    changes: list[Change]
    allow_missing: bool
    forced: list[str]  # refusals overridden with --force
    strict: bool = False  # inconclusive cases fail too
    problems: list[str] = field(default_factory=list)  # what fails the gate besides its cases (a run that never completed)
    unfinished: list[str] = field(default_factory=list)  # "current", "baseline": the runs that never completed

    @property
    def failing(self) -> list[Change]:
        bad = ({"regressed", "failed", "no_samples"} | (set() if self.allow_missing else {"missing"})
               | ({"inconclusive"} if self.strict else set()))
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
        return {"passed": self.passed, "baseline": self.baseline, "current": self.current, "counts": self.counts(),
                "forced": self.forced, "strict": self.strict, "problems": self.problems,
                "unfinished": self.unfinished, "changes": [c.to_dict() for c in self.changes]}


def verdict_of(ci: stats.RatioCI, p: float, threshold: float) -> str:
    """Beyond the threshold, and real: the CI lies beyond it, or p < 0.002."""
    slower, faster = 1.0 + threshold, 1.0 / (1.0 + threshold)
    if ci.ratio > slower and (ci.ci_low > slower or p < P_SIGNIFICANT):
        return "regressed"
    if ci.ratio < faster and (ci.ci_high < faster or p < P_SIGNIFICANT):
        return "improved"
    return "unchanged"


def classify(baseline_samples: list[float], current_samples: list[float], threshold: float,
             seed: int = 0) -> tuple[str, float, float, float, float]:
    """(verdict, ratio, ci_low, ci_high, p) for current vs baseline times."""
    ci = stats.bootstrap_ratio_ci(current_samples, baseline_samples, seed=seed)
    p = stats.mann_whitney_u(current_samples, baseline_samples) if min(len(current_samples), len(baseline_samples)) > 1 else 1.0
    return verdict_of(ci, p, threshold), ci.ratio, ci.ci_low, ci.ci_high, p


def _meta(doc: dict[str, Any]) -> dict[str, Any]:
    return {"run_id": doc.get("run_id"), "scenario": (doc.get("scenario") or {}).get("name"),
            "device_label": doc.get("device_label"), "source": doc.get("source", "gpubench"),
            "path": doc.get("path")}


def never_completed(doc: dict[str, Any]) -> str | None:
    """Why a run's record is not a whole run (its status and how many cases it holds), or None
    for a complete one. A file without a status (pytest-benchmark JSON) is whole."""
    status = doc.get("status")
    if status in (None, "complete"):
        return None
    cases = len(doc.get("cases") or [])
    planned = doc.get("planned_cases")
    held = f"{cases} case{'s' if cases != 1 else ''} recorded" + (f" of {planned} planned" if planned else "")
    why = {"running": "still 'running': the process was killed or is still going",
           "interrupted": "interrupted"}.get(status, status)
    reason = doc.get("abort_reason")
    return f"status {why}{f' ({reason})' if reason else ''}; {held}"


def _definition(doc: dict[str, Any]) -> Any:
    s = doc.get("scenario") or {}
    return s.get("name"), json.dumps(s.get("entries"), sort_keys=True)


def case_device(case: dict[str, Any], doc: dict[str, Any]) -> str:
    """The hardware a case ran on: its own record's (a run over several device models), else the run's."""
    return (case.get("device") or {}).get("label") or doc.get("device_label") or "?"


def device_labels(doc: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(case_device(c, doc) for c in doc.get("cases", []))) or [doc.get("device_label") or "?"]


def for_device(doc: dict[str, Any], label: str) -> dict[str, Any]:
    """The part of a run measured on one device model, as a run of its own."""
    cases = [c for c in doc.get("cases", []) if case_device(c, doc) == label]
    statuses = [c.get("status") for c in cases]
    return {**doc, "device_label": label, "cases": cases,
            "summary": {"cases": len(cases), "passed": statuses.count("passed"), "failed": statuses.count("failed"),
                        "interrupted": statuses.count("interrupted")}}


def compare(baseline: dict[str, Any], current: dict[str, Any], *, threshold: float = DEFAULT_THRESHOLD,
            allow_missing: bool = False, force: bool = False, strict: bool = False) -> Comparison:
    """Each case of ``current`` against the same case on the same device model in ``baseline``
    (a run over several models is gated model by model)."""
    forced = []
    base_labels, cur_labels = device_labels(baseline), device_labels(current)
    if not set(base_labels) & set(cur_labels):
        message = (f"the runs were measured on different hardware: baseline on "
                   f"{' + '.join(base_labels)!r}, current on {' + '.join(cur_labels)!r}")
        if not force:
            raise BadInput(f"compare: {message}. Timings do not transfer between devices; compare runs of "
                           f"one GPU model (keep one baseline per model with `gpubench baseline save`), "
                           f"or pass --force.")
        forced.append(message)
    if _definition(baseline) != _definition(current):
        message = (f"the scenario definitions differ (baseline {_definition(baseline)[0]!r}, current "
                   f"{_definition(current)[0]!r}, or their entries)")
        if not force:
            raise BadInput(f"compare: {message}; cases would not be like for like. Re-run the same scenario, "
                           f"or pass --force to compare the cases they share (with --force, cases only in "
                           f"the baseline are listed as missing but do not fail the gate).")
        # The runs were not meant to hold the same cases: what the baseline has and the current run
        # lacks is a difference of definitions, not a lost case (as --allow-missing).
        allow_missing = True
        forced.append(f"{message}: compared the cases both runs hold; cases only in the baseline do not "
                      f"fail the gate")
    per_technique = ((current.get("scenario") or {}).get("thresholds") or {})
    several = len(set(base_labels) | set(cur_labels)) > 1 and not forced
    key = (lambda c, doc: (c["id"], case_device(c, doc))) if several else (lambda c, doc: (c["id"], ""))
    problems, unfinished = [], []
    for side, doc in (("current", current), ("baseline", baseline)):
        why = never_completed(doc)
        if why is None:
            continue
        unfinished.append(side)
        if side == "current":
            problems.append(f"the current run never completed ({why}): the cases it did not reach were never "
                            f"measured, so the gate cannot pass it (--allow-missing covers cases a complete run "
                            f"left out, not these); run the scenario to the end")
        elif force:
            forced.append(f"the baseline run never completed ({why}): cases it lacks are new, not gated")
        else:
            problems.append(f"the baseline run never completed ({why}): cases it lacks would be new, not gated; "
                            f"store a complete run as the baseline (gpubench baseline save refuses any other), "
                            f"or pass --force")
    base_cases = {key(c, baseline): c for c in baseline.get("cases", [])}
    cur_cases = {key(c, current): c for c in current.get("cases", [])}
    changes = []
    for index, ((case_id, device), cur) in enumerate(cur_cases.items()):
        t = float(per_technique.get(cur.get("technique"), threshold))
        change = Change(case_id, cur.get("technique", "?"), "new", threshold=t, device=device)
        base = base_cases.get((case_id, device))
        if cur.get("status") != "passed":
            change.verdict, change.reason = "failed", _not_passed(cur, "")
        elif base is not None and base.get("status") != "passed":
            change.verdict, change.reason = "no_samples", _not_passed(base, "in the baseline, ") + ": nothing to compare with"
        elif base is not None:
            _fill(change, base, cur, seed=index)
        changes.append(change)
    for (case_id, device), base in base_cases.items():
        if (case_id, device) not in cur_cases:
            changes.append(Change(case_id, base.get("technique", "?"), "missing",
                                  threshold=float(per_technique.get(base.get("technique"), threshold)),
                                  reason="in the baseline, not in the current run" + (
                                      ", which stopped before it" if "current" in unfinished else ""), device=device))
    changes.sort(key=lambda c: (ORDER.index(c.verdict), -(c.ratio or 0.0) if c.verdict == "regressed"
                                else (c.ratio or 0.0)))
    return Comparison(_meta(baseline), _meta(current), changes, allow_missing, forced, strict, problems,
                      unfinished)


def _not_passed(case: dict[str, Any], where: str) -> str:
    """What happened to a case that did not pass: its failure's message, or 'case interrupted
    (stopped by Ctrl-C)' and the like."""
    status = case.get("status") or "never finished"
    message = (case.get("failure") or {}).get("message")
    if status == "failed":
        return f"{where}{message}" if message else f"{where}case failed"
    return f"{where}case {status}" + (f" ({message})" if message else "")


def _samples(case: dict[str, Any], name: str | None) -> list[float]:
    if name is None:
        return []
    return list(((case.get("variants") or {}).get(name) or {}).get("samples_s") or [])


def _control_moved(control: stats.RatioCI, ratio: float) -> bool:
    """Did the case's baseline variant move the way the optimized one did, so that the machine, not
    the code, may explain the optimized variant's change? Yes when it moved the same way clearly (its
    CI excludes no change) or by at least half as much (point estimates, in log terms). Either is
    enough: a few heavy-tailed samples give the baseline variant a CI that spans 1 while it moved as
    far as the optimized one (issue 27: +15.3% beside +13.2%)."""
    if math.log(control.ratio) * math.log(ratio) <= 0:
        return False  # it stood still or moved the other way
    clearly = control.ci_low > 1.0 if ratio > 1 else control.ci_high < 1.0
    return clearly or math.log(control.ratio) / math.log(ratio) >= 0.5


def _pct(ci: stats.RatioCI) -> str:
    return f"{(ci.ratio - 1) * 100:+.1f}% [{(ci.ci_low - 1) * 100:+.1f}, {(ci.ci_high - 1) * 100:+.1f}]"


def _judge_by_relative_ratio(change: Change, control: stats.RatioCI, relative: stats.RatioCI,
                             fewest_samples: int) -> None:
    """The baseline variant moved too: the case keeps its verdict only if the optimized/baseline
    ratio moved the same way beyond the threshold and beyond what the machine's move can do to the
    ratio of unchanged code (MACHINE_SHARE of the baseline variant's move), its whole CI included,
    and that CI rests on enough samples (one round taken under load gives a CI of no width)."""
    moved = f"the baseline variant moved {(control.ratio - 1) * 100:+.1f}% too"
    if fewest_samples < MIN_SAMPLES_FOR_RATIO:
        change.verdict = "inconclusive"
        change.reason = (f"{moved}; the optimized/baseline ratio moved {(relative.ratio - 1) * 100:+.1f}%, but a "
                         f"variant has {fewest_samples} sample{'s' if fewest_samples != 1 else ''} in a run (fewer "
                         f"than {MIN_SAMPLES_FOR_RATIO}): too few to tell the code from the machine")
        return
    allowance = control.ratio ** MACHINE_SHARE
    if change.verdict == "regressed":
        bound = max(1.0 + change.threshold, allowance)
        kept = relative.ci_low > bound
    else:
        bound = min(1.0 / (1.0 + change.threshold), allowance)
        kept = relative.ci_high < bound
    beyond = f"beyond the {change.threshold * 100:g}% threshold"
    if bound == allowance:
        beyond += f" and the {(bound - 1) * 100:+.1f}% that half the machine's move can put on it"
    if kept:
        change.reason = f"{moved}, but the optimized/baseline ratio moved {_pct(relative)}, {beyond}"
        return
    change.verdict = "inconclusive"
    change.reason = (f"{moved}; the optimized/baseline ratio moved {_pct(relative)}, not wholly {beyond}: "
                     f"the machine changed between the runs")


def _metric(case: dict[str, Any], variant: str | None, key: str) -> float | None:
    value = (((case.get("variants") or {}).get(variant) or {}).get("metrics") or {}).get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _fill(change: Change, base: dict[str, Any], cur: dict[str, Any], seed: int) -> None:
    # Variants are matched by role: a stored baseline may name them otherwise (schema 1 called
    # them "baseline" and "optimized"; a CPU run's optimized variant is not a GPU run's).
    name, base_name = role_variant(cur, "optimized"), role_variant(base, "optimized")
    key = cur.get("gate_metric")
    if key:
        change.variant = name
        a, b = _metric(base, base_name, key), _metric(cur, name, key)
        if a is None or b is None or a <= 0:
            change.verdict, change.reason = "no_samples", f"no {key} figure to gate on"
            return
        ratio = b / a
        change.verdict = verdict_of(stats.RatioCI(ratio, ratio, ratio), 1.0, change.threshold)
        change.ratio = change.ci_low = change.ci_high = ratio
        change.reason = f"gated on {key}: {a:,.0f} -> {b:,.0f} (exact)"
        return
    a, b = _samples(base, base_name), _samples(cur, name)
    change.variant = name if base_name in (name, None) else f"{base_name} -> {name}"
    if not a or not b:
        change.verdict = "no_samples"
        change.reason = f"no raw samples of {name or 'an optimized variant'} in " + ("the baseline" if not a else "the current run")
        return
    change.verdict, change.ratio, change.ci_low, change.ci_high, change.p_value = classify(a, b, change.threshold, seed)
    change.baseline_median_s, change.current_median_s = stats.median(a), stats.median(b)
    ref = role_variant(cur, "baseline")
    ra, rb = _samples(base, role_variant(base, "baseline")), _samples(cur, ref)
    if ra and rb and ref != name:
        ci = stats.bootstrap_ratio_ci(rb, ra, seed=seed)
        change.context = {"variant": ref, "ratio": ci.ratio, "ci_low": ci.ci_low, "ci_high": ci.ci_high}
        if change.verdict in ("regressed", "improved") and _control_moved(ci, change.ratio):
            relative = stats.relative_ratio_ci(a, ra, b, rb, seed=seed)
            change.context.update(relative_ratio=relative.ratio, relative_ci_low=relative.ci_low,
                                  relative_ci_high=relative.ci_high)
            _judge_by_relative_ratio(change, ci, relative, min(len(a), len(b), len(ra), len(rb)))


# --------------------------------------------------------------------------------------------
# Baseline store: one stored results file per GPU model and scenario

def device_slug(label: str | None) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'NVIDIA-H100-80GB-HBM3' (a directory name)."""
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", label or "unknown-device").strip("-")
    return slug or "unknown-device"


def store_path(store: Path, doc: dict[str, Any], name: str | None = None) -> Path:
    scenario = name or (doc.get("scenario") or {}).get("name") or "run"
    return Path(store) / device_slug(doc.get("device_label")) / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', scenario)}.json"


def load_from_store(store: Path, current: dict[str, Any]) -> tuple[dict[str, Any], list[Path]]:
    """The stored baseline of each device model ``current`` ran on, merged into one document (each
    case keeps its device); BadInput when there is none for any of them."""
    found = [(label, store_path(store, for_device(current, label))) for label in device_labels(current)]
    found = [(label, path) for label, path in found if path.is_file()]
    if not found:
        find_in_store(store, current)  # raises, listing what is stored
    docs = [(label, for_device(load_any(path), label)) for label, path in found]
    if len(docs) == 1:
        return docs[0][1], [found[0][1]]
    merged = dict(docs[0][1])
    merged["cases"] = [{**c, "device": {**(c.get("device") or {}), "label": label}} for label, d in docs
                       for c in d["cases"]]
    merged["device_label"] = " + ".join(label for label, _ in docs)
    return merged, [path for _, path in found]


def find_in_store(store: Path, current: dict[str, Any]) -> Path:
    path = store_path(store, current)
    if path.is_file():
        return path
    available = sorted(str(p.relative_to(store)) for p in Path(store).glob("*/*.json")) if Path(store).is_dir() else []
    raise BadInput(f"--baseline-store {store}: no baseline for this device and scenario (looked for {path}); "
                   f"stored: {', '.join(available) or 'none'}. Save one with "
                   f"`gpubench baseline save RUN_DIR --baseline-dir {store}`.")
