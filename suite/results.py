"""The run directory and its files (schema documented in docs/results.md).

``runs/<timestamp>-<scenario>/`` holds ``results.json`` (everything, raw samples included),
``results.csv`` (one row per case x variant), ``telemetry.csv`` and ``env.json``. Every write is
atomic: a crash leaves the last complete file.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import re
from pathlib import Path
from typing import Any

import pandas as pd

from gpubench.atomic import atomic_write_json, atomic_write_text
from gpubench.errors import BadInput

SCHEMA_VERSION = 1


def json_safe(value: Any) -> Any:
    """Replace NaN/inf by None (JSON has no such numbers) and tuples by lists, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


class RunDirectory:
    def __init__(self, path: Path):
        self.path = Path(path)

    @classmethod
    def create(cls, out_root: Path, scenario_name: str, now: _dt.datetime | None = None) -> "RunDirectory":
        stamp = (now or _dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", scenario_name)
        try:
            out_root.mkdir(parents=True, exist_ok=True)
            for suffix in [""] + [f"-{i}" for i in range(1, 1000)]:
                path = out_root / f"{stamp}-{safe}{suffix}"
                try:
                    path.mkdir()
                    return cls(path)
                except FileExistsError:
                    continue
        except OSError as exc:
            raise BadInput(f"--out {out_root}: cannot create the run directory there ({exc.strerror or exc}); "
                           f"give a writable directory.") from None
        raise BadInput(f"{out_root}: cannot create a new run directory for {scenario_name}")

    @property
    def results_json(self) -> Path:
        return self.path / "results.json"

    def write_env(self, env: dict[str, Any]) -> None:
        atomic_write_json(self.path / "env.json", json_safe(env))

    def write_results(self, doc: dict[str, Any]) -> None:
        atomic_write_json(self.results_json, json_safe(doc))

    def write_cases_csv(self, doc: dict[str, Any]) -> None:
        atomic_write_text(self.path / "results.csv", cases_frame(doc).to_csv(index=False))


def role_variant(case: dict[str, Any], role: str) -> str | None:
    """The name of a case record's variant with this role (baseline, optimized), if any."""
    return next((n for n, v in (case.get("variants") or {}).items() if v.get("role") == role), None)


def cases_frame(doc: dict[str, Any]) -> pd.DataFrame:
    """One row per case x variant: params as ``p_<name>``, metrics as ``m_<name>``."""
    rows = []
    for case in doc.get("cases", []):
        for name, v in case.get("variants", {}).items():
            s = v.get("stats") or {}
            check = v.get("check") or {}
            speed = case.get("speedups", {}).get(name, {})
            row = {
                "run_id": doc.get("run_id"), "case_id": case["id"], "technique": case["technique"],
                "case_status": case["status"], "variant": name, "role": v.get("role"),
                "variant_status": v.get("status"), "reason": v.get("reason"),
                "n": s.get("n"), "median_ms": _ms(s.get("median")), "iqr_ms": _ms(s.get("iqr")),
                "ci_low_ms": _ms(s.get("ci_low")), "ci_high_ms": _ms(s.get("ci_high")),
                "min_ms": _ms(s.get("min")),
                "speedup": speed.get("ratio"), "speedup_ci_low": speed.get("ci_low"),
                "speedup_ci_high": speed.get("ci_high"),
                "check_passed": check.get("passed"), "check_metric": check.get("metric"),
                "check_error": check.get("error"), "check_tolerance": check.get("tolerance"),
                "peak_memory_bytes": v.get("peak_memory_bytes"),
                "energy_mj_per_call": v.get("energy_mj_per_call"),
            }
            row.update({f"p_{k}": val for k, val in case.get("params", {}).items()})
            row.update({f"m_{k}": val for k, val in (v.get("metrics") or {}).items()
                        if isinstance(val, (int, float, str, bool)) or val is None})
            rows.append(row)
    return pd.DataFrame(rows)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def load_results(path: str | Path) -> dict[str, Any]:
    """Read a run directory or a results.json; raise :class:`BadInput` when it is missing,
    corrupt, or of another schema version."""
    path = Path(path)
    file = path / "results.json" if path.is_dir() else path
    if not file.exists():
        what = "run directory has no results.json" if path.is_dir() else "no such file"
        raise BadInput(f"{file}: {what}; give a run directory (runs/<timestamp>-<scenario>/) or its results.json.")
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInput(f"{file}: not a readable results file ({exc}); it may be truncated or not a gpubench result.") from None
    if not isinstance(doc, dict) or doc.get("kind") != "gpubench.results":
        raise BadInput(f"{file}: not a gpubench results file (key 'kind' should be 'gpubench.results').")
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        raise BadInput(f"{file}: schema_version is {version!r}; this gpubench reads version {SCHEMA_VERSION}.")
    return doc
