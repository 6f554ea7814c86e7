"""What gpubench learns about this machine's devices between runs, kept under :func:`cache_root`
(``GPUBENCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/gpubench``, else ``~/.cache/gpubench``):

- ``autotune/<GPU model>/triton-<version>/<kernel>.json``: Triton tunings (:mod:`gpubench.measure.autotune`);
- ``case-times/<device>.json``: what each case took on this device model, what each technique's
  cases spent beside their warm-up and timing loops (building inputs, checks, first compiles), and
  a run's fixed cost (worker start-up, calibration), so ``gpubench run --dry-run`` and ``--budget``
  can say how long a run will take from what this device measured before (:class:`CaseTimes`);
- ``figures/<key>.svg``: the report's figures, each drawn once from the same numbers
  (:mod:`gpubench.reports.figure_cache`).

Everything here is a cache: a missing, unreadable or foreign file costs a tuning or a vaguer
estimate, never a run; writers merge under a lock, so two runs on one machine can share it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import os
import re
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpubench.records.atomic import atomic_write_json

CASE_TIMES_SCHEMA = 1
MAX_CASES = 50_000  # per device file; the oldest go first
RUN_OVERHEADS_KEPT = 10
FIXED_KEPT = 50  # per technique: the newest cases' fixed costs
# The phases a case's measurement policy bounds (gpubench.run.runner.PHASES); the rest of its elapsed
# time (building, checking, first compiles, metrics, profiles) is its fixed cost.
POLICY_PHASES = ("warmup", "timing", "energy")


def cache_root() -> Path:
    """Where gpubench keeps what it learned about this machine's devices between runs."""
    if os.environ.get("GPUBENCH_CACHE_DIR"):
        return Path(os.environ["GPUBENCH_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "gpubench"


def slug(text: str) -> str:
    """``text`` as one path component: ``NVIDIA H200`` -> ``NVIDIA-H200``."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip("-") or "unknown"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path``'s sidecar ``.lock`` file (two processes writing one file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def read_cache_doc(path: Path, schema: int) -> dict[str, Any] | None:
    """The JSON object in ``path`` if it is one of ``schema``, else None (missing, corrupt, foreign)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == schema else None


def _median(values: Any) -> float | None:
    kept = [float(x) for x in values or [] if isinstance(x, (int, float)) and x >= 0]
    return statistics.median(kept) if kept else None


def fixed_cost_s(case: Any) -> float | None:
    """What a finished case spent outside the phases its policy bounds (building inputs, checks,
    first compiles and tunings, metrics, profiles); None for a record without phases (older runs)."""
    phases = getattr(case, "phases_s", None)
    if not phases or not isinstance(getattr(case, "elapsed_s", None), (int, float)):
        return None
    return max(0.0, float(case.elapsed_s) - sum(float(phases.get(p) or 0.0) for p in POLICY_PHASES))


def _dict(value: Any) -> dict[str, Any]:
    """A cache document's table: ``value`` where it is one, else empty (a file written by hand)."""
    return value if isinstance(value, dict) else {}


class CaseTimes:
    """The wall time of each case on one device model (``device_label``, as runs record it), by
    case id and ``--repeat-scale``, the newest run's figure winning; each technique's fixed cost
    per case (:func:`fixed_cost_s`, the newest :data:`FIXED_KEPT`; the first case of a run pays
    its compiles); the fixed cost of the last runs (their wall time less their cases' time, per
    worker); and what their reports took per case."""

    def __init__(self, device_label: str, root: Path | None = None):
        self.device_label = device_label
        self.path = (root or cache_root()) / "case-times" / f"{slug(device_label)}.json"

    @staticmethod
    def key(case_id: str, repeat_scale: float) -> str:
        return f"{case_id}@{repeat_scale:g}"

    def read(self) -> tuple[dict[str, float], float | None]:
        """(seconds by :meth:`key`, a run's fixed cost in seconds or None)."""
        known, overhead, _ = self.read_all()
        return known, overhead

    def read_all(self) -> tuple[dict[str, float], float | None, float | None]:
        """:meth:`read`, and the seconds the report took per case (None: never measured here)."""
        doc = read_cache_doc(self.path, CASE_TIMES_SCHEMA) or {}
        cases = _dict(doc.get("cases"))
        seconds = {
            k: float(v["s"])
            for k, v in cases.items()
            if isinstance(v, dict) and isinstance(v.get("s"), (int, float)) and v["s"] > 0
        }
        return seconds, _median(doc.get("run_overheads_s")), _median(doc.get("report_s_per_case"))

    def fixed_costs(self) -> dict[str, list[float]]:
        """Per technique, the fixed costs (seconds) of its newest cases on this device model."""
        doc = read_cache_doc(self.path, CASE_TIMES_SCHEMA) or {}
        raw = _dict(doc.get("fixed_s"))
        return {
            str(t): [float(x) for x in v if isinstance(x, (int, float)) and x >= 0]
            for t, v in raw.items()
            if isinstance(v, list)
        }

    def record_report(self, seconds: float, cases: int) -> None:
        """What writing a run's report (HTML and summary.md) took, per case: the part of a
        `gpubench run` that comes after its cases and grows with them."""
        if cases < 1 or seconds < 0:
            return
        with locked(self.path):
            doc = read_cache_doc(self.path, CASE_TIMES_SCHEMA) or {
                "schema": CASE_TIMES_SCHEMA,
                "device": self.device_label,
            }
            kept = [x for x in doc.get("report_s_per_case") or [] if isinstance(x, (int, float))]
            doc["report_s_per_case"] = (kept + [round(seconds / cases, 5)])[-RUN_OVERHEADS_KEPT:]
            atomic_write_json(self.path, doc)

    def record(self, cases: list[Any], repeat_scale: float, wall_s: float, workers: int) -> None:
        """Add a run's finished cases (records with ``id``, ``status`` and ``elapsed_s``) and its
        fixed cost."""
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        finished = [c for c in cases if c.status in ("passed", "failed") and (c.elapsed_s or 0) > 0]
        with locked(self.path):
            doc = read_cache_doc(self.path, CASE_TIMES_SCHEMA) or {}
            known = _dict(doc.get("cases"))
            for c in finished:
                known[self.key(c.id, repeat_scale)] = {"s": round(float(c.elapsed_s), 4), "at": now}
            if len(known) > MAX_CASES:
                newest = sorted(known.items(), key=lambda kv: str(kv[1].get("at", "")), reverse=True)[:MAX_CASES]
                known = dict(newest)
            fixed = _dict(doc.get("fixed_s"))
            for c in finished:
                seconds = fixed_cost_s(c)
                if seconds is not None:
                    kept = [x for x in fixed.get(c.technique) or [] if isinstance(x, (int, float))]
                    fixed[c.technique] = (kept + [round(seconds, 4)])[-FIXED_KEPT:]
            overheads = [x for x in doc.get("run_overheads_s") or [] if isinstance(x, (int, float))]
            if finished and len(finished) == len(cases):  # an interrupted run's wall time says nothing
                cases_s = sum(float(c.elapsed_s) for c in finished)
                overheads = (overheads + [round(max(0.0, wall_s - cases_s / max(workers, 1)), 3)])[-RUN_OVERHEADS_KEPT:]
            doc.update(
                {
                    "schema": CASE_TIMES_SCHEMA,
                    "device": self.device_label,
                    "cases": known,
                    "fixed_s": fixed,
                    "run_overheads_s": overheads,
                }
            )
            atomic_write_json(self.path, doc)
