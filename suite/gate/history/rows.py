"""A run as the history store's rows: one :class:`ResultRow` per (case, variant), with what the
run recorded of where it came from (commit, branch, versions, device) and its summary figures.
The raw samples stay in the run's results file; a row says where (``results_path`` and its
case and variant keys).

Inputs: a gpubench run (read through :func:`gpubench.records.results.load_run`), or a pytest-benchmark
JSON file (read through :func:`gpubench.gate.compare.load_any`, the gate's own reader).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpubench.gate.compare import load_any
from gpubench.records import stats
from gpubench.records.results import CaseRecord, RunRecord, Stats, VariantRecord


@dataclass(frozen=True)
class ResultRow:
    """One (run, case, variant): the fields of :data:`gpubench.gate.history.schema.COLUMNS`."""

    run_id: str
    host: str
    device_model: str
    case_id: str
    variant: str
    started_at: str
    source: str
    run_status: str | None
    git_commit: str | None
    branch: str | None
    dirty: int | None
    driver_version: str | None
    torch_version: str | None
    triton_version: str | None
    gpubench_version: str | None
    scenario: str | None
    technique: str | None
    params_json: str
    role: str | None
    case_status: str | None
    variant_status: str | None
    median_s: float | None
    ci_low_s: float | None
    ci_high_s: float | None
    iqr_s: float | None
    n: int | None
    gate_metric: str | None
    gate_value: float | None
    metrics_json: str
    results_path: str
    added_at: str = ""

    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = json.loads(self.params_json)
        return params

    def to_params(self, added_at: str) -> dict[str, Any]:
        """The row as the SQL's named parameters."""
        return {**dataclasses.asdict(self), "added_at": added_at}


def utc_iso(text: str | None) -> str | None:
    """An ISO 8601 time as UTC to the second (a time without a zone is taken as UTC); None when
    it is not one. Run order is this text's order."""
    if not text:
        return None
    try:
        when = _dt.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.timezone.utc)
    return when.astimezone(_dt.timezone.utc).isoformat(timespec="seconds")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _text(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


def _summary(variant: VariantRecord) -> dict[str, Any]:
    """median, CI, IQR and n of the variant's time: its recorded stats, else its samples'."""
    found = variant.stats or Stats()
    if _number(found.median) is None and variant.samples_s:
        found = Stats.from_dict(stats.summarize(variant.samples_s).to_dict())
    n = found.n
    return {
        "median_s": _number(found.median),
        "ci_low_s": _number(found.ci_low),
        "ci_high_s": _number(found.ci_high),
        "iqr_s": _number(found.iqr),
        "n": int(n) if isinstance(n, (int, float)) and not isinstance(n, bool) else None,
    }


def _scalar_metrics(metrics: Mapping[str, Any]) -> str:
    kept = {str(k): v for k, v in metrics.items() if isinstance(v, (str, bool)) or v is None or _number(v) is not None}
    return json.dumps(kept, sort_keys=True)


def rows_of_run(
    run: RunRecord, results_path: str | Path, *, source: str = "gpubench", branch: str | None = None
) -> list[ResultRow]:
    """Every (case, variant) of ``run``, whose results file is ``results_path``. ``branch``
    stands in where the run did not record its branch. A case the run's ``--budget`` cut short is
    left out (its samples stay in results.json; the gate counts it missing too), as are the cases
    it never started (``run.not_run``)."""
    env = run.env or {}
    git = env.get("git") or {}
    gpu = env.get("gpu") or {}
    dirty = git.get("dirty")
    started = (
        utc_iso(run.started_at)
        or utc_iso(env.get("captured_at"))
        or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    )
    common = {
        "run_id": run.run_id or Path(results_path).parent.name,
        "host": str(env.get("host") or ""),
        "started_at": started,
        "source": source,
        "run_status": _text(run.status),
        "git_commit": _text(git.get("commit")),
        "branch": _text(git.get("branch")) or branch,
        "dirty": None if dirty is None else int(bool(dirty)),
        "driver_version": _text(gpu.get("driver_version")),
        "torch_version": _text(env.get("torch")),
        "triton_version": _text(env.get("triton")),
        "gpubench_version": _text(env.get("gpubench_version")),
        "scenario": _text((run.scenario or {}).get("name")),
        "results_path": str(Path(results_path).resolve()),
    }
    return [
        _row(common, run, case, name, variant)
        for case in run.cases
        if not _cut_by_budget(case)
        for name, variant in case.variants.items()
    ]


def device_model(run: RunRecord, case: CaseRecord) -> str:
    """The device model a case's rows are stored under."""
    return case.device_label or run.device_label or "unknown device"


def _cut_by_budget(case: CaseRecord) -> bool:
    return case.status == "interrupted" and case.failure is not None and case.failure.kind == "budget"


def _row(common: dict[str, Any], run: RunRecord, case: CaseRecord, name: str, variant: VariantRecord) -> ResultRow:
    gate = case.gate_metric or None
    return ResultRow(
        **common,
        device_model=device_model(run, case),
        case_id=case.id,
        variant=name,
        technique=case.technique,
        params_json=json.dumps(case.params, sort_keys=True, default=str),
        role=_text(variant.role),
        case_status=_text(case.status),
        variant_status=_text(variant.status),
        **_summary(variant),
        gate_metric=gate,
        gate_value=_number(variant.metric(gate)) if gate else None,
        metrics_json=_scalar_metrics(variant.metrics),
    )


def rows_of_file(path: str | Path, branch: str | None = None) -> list[ResultRow]:
    """The rows of a run directory, a results.json or a pytest-benchmark JSON file (BadInput,
    exit 2, naming the file, for anything else)."""
    path = Path(path)
    run = load_any(path)
    file = path / "results.json" if path.is_dir() else path
    return rows_of_run(run, file, source=run.source, branch=branch)
