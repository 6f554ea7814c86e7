"""How long a run will take, said before it starts (``gpubench run --dry-run``, and the warning
before a large run).

A case that ran before on this device model (at the same ``--repeat-scale``) counts what it took
then, from the device's case-time history (:class:`gpubench.devicecache.CaseTimes`, which every run
adds to), and the run's fixed cost (worker start-up, calibration) is what the last runs there spent
beside their cases. Failing that, a case that ran before under the same ``--out`` directory (the same case id, device type and
``--repeat-scale``) counts what it took then; a case with no such record counts its technique's
mean there; any other case counts the bounds its measurement policy sets: per variant, the
warm-up, then the timing loop, which ``max_reps`` may end at once and ``max_time_s`` ends at the
latest (plus energy sampling on a GPU). Building the inputs and checking the outputs come on top of
a policy figure. Cases spread over the workers run side by side.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import torch

from gpubench import techniques
from gpubench.devicecache import CaseTimes
from gpubench.energy import max_window_s
from gpubench.scenario import Case, Scenario
from gpubench.timing import Policy

EARLIER_RUNS = 20  # the most recent run directories read for measured case times
BY_ID_UP_TO = 20_000  # cases matched one by one up to this many; past it, by technique only


@dataclass
class Estimate:
    low_s: float
    high_s: float
    cases: int
    measured: int  # cases whose figure is an earlier run's time (their own, or their technique's)
    earlier: Path | None  # where those runs were found
    workers: int
    from_history: int = 0  # cases whose figure is their own time in this device's history
    history: Path | None = None
    overhead_s: float = 0.0  # the run's start-up and report, from the history

    def text(self) -> str:
        span = (f"about {duration_text(self.high_s)}" if self.high_s <= 1.25 * self.low_s
                else f"{duration_text(self.low_s)} to {duration_text(self.high_s)}")
        basis = []
        if self.from_history:
            basis.append(f"{self.from_history} of {self.cases} cases from what they took on this device "
                         f"({self.history}), with its runs' start-up and report of {duration_text(self.overhead_s)}")
        if self.measured:
            basis.append(f"{self.measured} of {self.cases} cases from earlier runs in {self.earlier}")

        if self.from_history + self.measured < self.cases:
            basis.append(f"{'the other cases' if self.measured or self.from_history else 'every case'} from its measurement "
                         "policy: warm-up and timing loop, with building inputs and checking on top")
        if self.workers > 1:
            basis.append(f"{self.workers} workers side by side")
        return f"{span} ({'; '.join(basis)})"


def duration_text(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 72 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:,.0f} days"


def policy_bounds_s(policy: Policy, variants: int, gpu: bool) -> tuple[float, float]:
    """Seconds one case's measurement takes at least and at most, by its policy alone: the warm-up
    of each variant, then a timing loop that ``max_reps`` may end at once (short calls) and
    ``max_time_s`` ends at the latest (and energy sampling on a GPU)."""
    # Energy: at least energy_s per variant, and up to the window's cap where the counter is slow
    # or the calls long (gpubench.energy); none without a GPU or with energy_s 0.
    energy_low = policy.energy_s if gpu and policy.energy_s > 0 else 0.0
    energy_high = max_window_s(policy.energy_s) if energy_low else 0.0
    fixed = variants * (policy.warmup_s + energy_low)
    return fixed, fixed + policy.max_time_s + variants * (energy_high - energy_low)


def variants_run(technique: str, variants: tuple[str, ...] | None, device: torch.device) -> int:
    """How many of a case's variants run on ``device`` (a scenario's subset, less the unavailable)."""
    tech = techniques.get(technique)
    names = tech.resolve(variants, device) if variants is not None else list(tech.variants)
    cast = tech.cast(device)
    return max(1, sum(cast[n][1] is None for n in names))


def earlier_times(out_root: Path, gpu: bool, repeat_scale: float) -> tuple[dict[str, float], dict[str, float]]:
    """(seconds by case id, mean seconds by technique) from the most recent runs under
    ``out_root`` on the same device type and repeat scale; the newest record of a case wins."""
    by_id: dict[str, float] = {}
    by_technique: dict[str, list[float]] = {}
    runs = sorted((p for p in Path(out_root).glob("*/results.json")), reverse=True)[:EARLIER_RUNS]
    for path in runs:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if not isinstance(doc, dict) or ("cuda" in str(doc.get("device"))) != gpu \
                or doc.get("repeat_scale", 1.0) != repeat_scale:
            continue
        for case in doc.get("cases") or []:
            seconds = case.get("elapsed_s") if isinstance(case, dict) else None
            if isinstance(seconds, (int, float)) and seconds > 0 and case.get("status") in ("passed", "failed"):
                by_id.setdefault(case.get("id"), float(seconds))
                by_technique.setdefault(case.get("technique"), []).append(float(seconds))
    return by_id, {t: statistics.fmean(v) for t, v in by_technique.items()}


def estimate(scenario: Scenario, cases: Iterable[Case] | None, device: torch.device, *, out_root: Path | None,
             only: list[str] | None = None, repeat_scale: float = 1.0, workers: int = 1,
             history: CaseTimes | None = None) -> Estimate:
    """The run's wall time. ``cases``: the cases when they are built already (else a large sweep is
    estimated entry by entry, from its technique's earlier mean or its policy, never built).
    ``history``: this device model's case times."""
    gpu = device.type == "cuda"
    by_id, by_technique = earlier_times(out_root, gpu, repeat_scale) if out_root is not None else ({}, {})
    known, overhead, report_s = history.read_all() if history is not None else ({}, None, None)
    from_history = 0
    counts = scenario.count(only)
    total = sum(counts.values())
    low = high = 0.0
    measured = 0
    bounds: dict[tuple, tuple[float, float]] = {}  # per technique, variants and policy: the same for many cases
    if cases is not None or total <= BY_ID_UP_TO:
        for case in cases if cases is not None else scenario.iter_cases(only, repeat_scale):
            seconds = known.get(CaseTimes.key(case.id, repeat_scale))
            if seconds is not None:
                low, high, from_history = low + seconds, high + seconds, from_history + 1
                continue
            seconds = by_id.get(case.id, by_technique.get(case.technique))
            if seconds is not None:
                low, high, measured = low + seconds, high + seconds, measured + 1
            else:
                key = (case.technique, case.variants, case.policy)
                if key not in bounds:
                    bounds[key] = policy_bounds_s(case.policy, variants_run(case.technique, case.variants, device), gpu)
                low, high = low + bounds[key][0], high + bounds[key][1]
    else:  # every case of an entry shares its policy and variants: no case is built
        for entry in scenario.entries:
            if only and entry.technique not in only:
                continue
            n = entry.size
            seconds = by_technique.get(entry.technique)
            if seconds is not None:
                low, high, measured = low + n * seconds, high + n * seconds, measured + n
                continue
            policy = entry.policy.scaled(repeat_scale) if repeat_scale != 1.0 else entry.policy
            lo, hi = policy_bounds_s(policy, variants_run(entry.technique, entry.variants, device), gpu)
            low, high = low + n * lo, high + n * hi
    workers = max(1, min(workers, total or 1))
    overhead = overhead if from_history and overhead is not None else 0.0
    if from_history and report_s is not None:  # the report comes after the cases, and grows with them
        overhead += report_s * total
    return Estimate(low / workers + overhead, high / workers + overhead, total, measured,
                    Path(out_root) if measured and out_root is not None else None, workers,
                    from_history, history.path if from_history else None, overhead)

