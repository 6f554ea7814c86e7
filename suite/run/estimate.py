"""How long a run will take, said before it starts (``gpubench run --dry-run``, the warning
before a large run, and the plan ``--budget`` makes: :mod:`gpubench.run.budget`).

A case that ran before on this device model (at the same ``--repeat-scale``) counts what it took
then, from the device's case-time history (:class:`gpubench.measure.devicecache.CaseTimes`, which every run
adds to), and the run's fixed cost (worker start-up, calibration) is what the last runs there spent
beside their cases. Failing that, a case that ran before under the same ``--out`` directory (the same case id, device type and
``--repeat-scale``) counts what it took then; a case with no such record counts its technique's
mean there. Any other case counts the bounds its measurement policy sets: per variant, the
warm-up, then the timing loop, which ``max_reps`` may end at once and ``max_time_s`` ends at the
latest (plus energy windows on a GPU), and on top of that what the policy does not bound, its
fixed cost (:class:`CaseCosts`): building inputs and checking them at the case's size, a first
compile or tuning per new kernel form, worker start-up and calibration per run. Those come from
what this device measured of the technique before where it did, else from the conservative
allowances below; such a figure is a lower bound ("at least"), never a span that looks sure, and
the allowances make the figure a budget counts. Cases spread over the workers run side by side.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpubench import techniques
from gpubench.measure.devicecache import CaseTimes, fixed_cost_s
from gpubench.measure.energy import window_bounds_s
from gpubench.records.policy import Policy
from gpubench.records.results import duration_text
from gpubench.run.scenario import Case, Scenario

if TYPE_CHECKING:  # torch in annotations only: a dry run's checks and --help import none
    import torch

EARLIER_RUNS = 20  # the most recent run directories read for measured case times
BY_ID_UP_TO = 20_000  # cases matched one by one up to this many; past it, by technique only

# What a case's policy does not bound, allowed for where this device never measured it (keyed by
# device type). Measured on this project's 2-core CPU (torch 2.13, loaded by other work): smoke's
# kv_cache, paged_attention and moe_grouping cases at --repeat-scale 0.3 spent at most 1.0 s each
# beside their warm-up and timing (checks in float64 and Triton's interpreter 0.8 s of it); smoke's
# flash_attention cases under the interpreter ~2-5 s; checks were 53% of a loaded smoke run's wall
# time. A run's start (spawn, import torch, environment, calibration) and close took 5.5 s beside
# 21 cases, its report 0.23 s per case. On a GPU the first call of a new kernel form compiles and
# tunes (Triton's autotuner times every config: tens of seconds), and float64 references at real
# sizes take seconds: gpu-quick took more than 8 minutes where a dry run from its policy alone
# said "8 s to 3 min" (issue 33); it has 60 cases of 22 forms now.
FIXED_CASE_S = {"cpu": 2.5, "cuda": 5.0}  # building inputs, checks, metrics: per case
FIRST_FORM_S = {"cpu": 5.0, "cuda": 30.0}  # first compile / tuning: per new kernel form in a run
STARTUP_S = {"cpu": 15.0, "cuda": 45.0}  # worker start-up and calibration: per run
REPORT_S_PER_CASE = 0.5  # results files and the report, per case
CLOSE_S = 5.0  # closing the workers and the run
HISTORY_MARGIN = 1.25  # a case's own measured time, counted by a budget with this margin


@dataclass(frozen=True)
class CaseEstimate:
    """One case's time: ``low_s`` (what it takes at least), ``plan_s`` (the conservative figure a
    budget counts), and what they rest on: ``history`` (its own time on this device), ``earlier``
    (an earlier run under --out), ``technique`` (its policy and its technique's fixed costs as this
    device measured them) or ``policy`` (its policy and the allowances)."""

    low_s: float
    plan_s: float
    basis: str

    @property
    def lower_bound(self) -> bool:
        """Whether the figure rests on the policy's bounds, not on a time this case took."""
        return self.basis in ("technique", "policy")

    def text(self) -> str:
        if not self.lower_bound:
            return f"about {duration_text(self.low_s)}"
        return f"at least {duration_text(self.low_s)}" if self.low_s >= 0.05 else "not measured here"


def form_key(case: Case) -> tuple:
    """A case's kernel form: its technique, variants and non-numeric params (dtype, causal, mode,
    model, ...). The first case of a form in a run pays its compiles and tunings; sizes (integer
    params) are taken as the same form (a tuner keyed on sizes re-tunes: a lower bound then)."""
    return (case.technique, case.variants, tuple((k, v) for k, v in case.params.items() if isinstance(v, (str, bool))))


class CaseCosts:
    """Per-case estimates for one device type: from the device's case-time history, earlier runs
    under ``out_root``, or the policy plus fixed costs (this device's measured ones per technique,
    else the allowances). :meth:`started` and :meth:`learn` keep it current while a run goes: a
    form compiled once is not compiled again, a technique's first finished case says what its
    fixed costs are here."""

    def __init__(
        self,
        device: torch.device,
        *,
        history: CaseTimes | None = None,
        out_root: Path | None = None,
        repeat_scale: float = 1.0,
    ):
        self.device, self.repeat_scale = device, repeat_scale
        self.gpu = device.type == "cuda"
        kind = "cuda" if self.gpu else "cpu"
        self.fixed_case_s, self.first_form_s, self.startup_default_s = (
            FIXED_CASE_S[kind],
            FIRST_FORM_S[kind],
            STARTUP_S[kind],
        )
        self.by_id, self.by_technique = (
            earlier_times(out_root, self.gpu, repeat_scale) if out_root is not None else ({}, {})
        )
        self.known, self.overhead_s, self.report_s = history.read_all() if history is not None else ({}, None, None)
        self.fixed = history.fixed_costs() if history is not None else {}
        self.forms: set[tuple] = set()
        self._bounds: dict[tuple, tuple[float, float]] = {}

    def of(self, case: Case) -> CaseEstimate:
        seconds = self.known.get(CaseTimes.key(case.id, self.repeat_scale))
        if seconds is not None:
            return CaseEstimate(seconds, seconds * HISTORY_MARGIN, "history")
        seconds = self.by_id.get(case.id, self.by_technique.get(case.technique))
        if seconds is not None:
            return CaseEstimate(seconds, seconds * HISTORY_MARGIN, "earlier")
        key = (case.technique, case.variants, case.policy)
        if key not in self._bounds:
            self._bounds[key] = policy_bounds_s(
                case.policy, variants_run(case.technique, case.variants, self.device), self.gpu
            )
        low, high = self._bounds[key]
        measured = self.fixed.get(case.technique)
        new_form = form_key(case) not in self.forms
        if measured:
            fixed = max(measured) if new_form else statistics.median(measured)
            return CaseEstimate(low, high + fixed, "technique")
        return CaseEstimate(low, high + self.fixed_case_s + (self.first_form_s if new_form else 0.0), "policy")

    def started(self, case: Case) -> None:
        """``case`` runs (or is planned to): later cases of its form pay no first compile."""
        self.forms.add(form_key(case))

    def learn(self, record: Any) -> None:
        """A finished case's fixed cost counts for the later cases of its technique in this run."""
        seconds = fixed_cost_s(record) if getattr(record, "status", None) in ("passed", "failed") else None
        if seconds is not None:
            self.fixed.setdefault(record.technique, []).append(seconds)

    def startup_s(self) -> float:
        """Worker start-up and calibration (and closing the run's records): this device's last
        runs' fixed cost where measured, else the allowance."""
        return self.overhead_s if self.overhead_s is not None else self.startup_default_s

    def closing_s(self, cases: int) -> float:
        """Writing the results and the report of ``cases`` cases, after the last case."""
        per_case = self.report_s if self.report_s is not None else REPORT_S_PER_CASE
        return CLOSE_S + per_case * cases


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
    policy_only: int = 0  # cases whose figure rests on their policy's bounds: the total is a lower bound

    def text(self) -> str:
        if self.policy_only:  # no span that looks sure: what it takes at least, and what a budget counts
            least = f"at least {duration_text(self.low_s)}" if self.low_s >= 0.05 else "not measured here"
            span = (
                f"{least} (a --budget counts {duration_text(self.high_s)}, with "
                "allowances for start-up, calibration, building, checks and first compiles)"
            )
        else:
            span = (
                f"about {duration_text(self.high_s)}"
                if self.high_s <= 1.25 * self.low_s
                else f"{duration_text(self.low_s)} to {duration_text(self.high_s)}"
            )
        basis = []
        if self.from_history:
            basis.append(
                f"{self.from_history} of {self.cases} cases from what they took on this device "
                f"({self.history}), with its runs' start-up and report of {duration_text(self.overhead_s)}"
            )
        if self.measured:
            basis.append(f"{self.measured} of {self.cases} cases from earlier runs in {self.earlier}")

        if self.from_history + self.measured < self.cases:
            basis.append(
                f"{'the other cases' if self.measured or self.from_history else 'every case'} from its measurement "
                "policy: warm-up and timing loop, with building inputs, checks and compiles on top"
            )
        if self.workers > 1:
            basis.append(f"{self.workers} workers side by side")
        return f"{span} ({'; '.join(basis)})"


def policy_bounds_s(policy: Policy, variants: int, gpu: bool) -> tuple[float, float]:
    """Seconds one case's measurement takes at least and at most, by its policy alone: the warm-up
    of each variant, then a timing loop that ``max_reps`` may end at once (short calls) and
    ``max_time_s`` ends at the latest (and energy sampling on a GPU)."""
    # Energy (gpubench.measure.energy): a window of energy_s up to its cap per variant, where the counter is
    # slow; none without a GPU or with energy_s 0, and none for a variant whose calls are long
    # (measured over its timed calls), which a policy alone cannot rule out: the lower bound counts none.
    energy_high = window_bounds_s(policy.energy_s)[1] if gpu else 0.0
    fixed = variants * policy.warmup_s
    return fixed, fixed + policy.max_time_s + variants * energy_high


def variants_run(technique: str, variants: tuple[str, ...] | None, device: torch.device) -> int:
    """How many of a case's variants run on ``device`` (a scenario's subset, less the unavailable)."""
    tech = techniques.get(technique)
    assert tech is not None, technique  # a case's technique was found when its scenario was read
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
        if (
            not isinstance(doc, dict)
            or ("cuda" in str(doc.get("device"))) != gpu
            or doc.get("repeat_scale", 1.0) != repeat_scale
        ):
            continue
        for case in doc.get("cases") or []:
            seconds = case.get("elapsed_s") if isinstance(case, dict) else None
            if isinstance(seconds, (int, float)) and seconds > 0 and case.get("status") in ("passed", "failed"):
                by_id.setdefault(case.get("id"), float(seconds))
                by_technique.setdefault(case.get("technique"), []).append(float(seconds))
    return by_id, {t: statistics.fmean(v) for t, v in by_technique.items()}


def estimate(
    scenario: Scenario,
    cases: Iterable[Case] | None,
    device: torch.device,
    *,
    out_root: Path | None,
    only: list[str] | None = None,
    repeat_scale: float = 1.0,
    workers: int = 1,
    history: CaseTimes | None = None,
) -> Estimate:
    """The run's wall time. ``cases``: the cases when they are built already (else a large sweep is
    estimated entry by entry, from its technique's earlier mean or its policy, never built).
    ``history``: this device model's case times."""
    costs = CaseCosts(device, history=history, out_root=out_root, repeat_scale=repeat_scale)
    counts = scenario.count(only)
    total = sum(counts.values())
    low = high = 0.0
    measured = from_history = policy_only = 0
    if cases is not None or total <= BY_ID_UP_TO:
        for case in cases if cases is not None else scenario.iter_cases(only, repeat_scale):
            guess = costs.of(case)
            costs.started(case)
            from_history += guess.basis == "history"
            measured += guess.basis == "earlier"
            policy_only += guess.lower_bound
            low, high = low + guess.low_s, high + (guess.low_s if not guess.lower_bound else guess.plan_s)
    else:  # every case of an entry shares its policy and variants: no case is built
        for entry in scenario.entries:
            if only and entry.technique not in only:
                continue
            n = entry.size
            seconds = costs.by_technique.get(entry.technique)
            if seconds is not None:
                low, high, measured = low + n * seconds, high + n * seconds, measured + n
                continue
            policy = entry.policy.scaled(repeat_scale) if repeat_scale != 1.0 else entry.policy
            lo, hi = policy_bounds_s(policy, variants_run(entry.technique, entry.variants, device), costs.gpu)
            low, high = low + n * lo, high + n * (hi + costs.fixed_case_s) + costs.first_form_s
            policy_only += n
    workers = max(1, min(workers, total or 1))
    overhead = costs.overhead_s if from_history and costs.overhead_s is not None else 0.0
    if from_history and costs.report_s is not None:  # the report comes after the cases, and grows with them
        overhead += costs.report_s * total
    extra = 0.0  # what a budget counts beside the cases where this device measured none of it
    if policy_only and not from_history:
        extra = costs.startup_s() + costs.closing_s(total)
    return Estimate(
        low / workers + overhead,
        high / workers + overhead + extra,
        total,
        measured,
        Path(out_root) if measured and out_root is not None else None,
        workers,
        from_history,
        history.path if from_history and history is not None else None,
        overhead,
        policy_only,
    )
