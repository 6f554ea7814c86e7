"""pytest-benchmark's ``--benchmark-json`` output read into the records a gpubench run is read into,
so the gate and the history store take either source in one typed form.

Each benchmark becomes a passed case (its ``fullname``, its ``group`` as the technique) with one
variant, ``benchmark``, in the optimized role: its raw times (saved with ``--benchmark-save-data``)
are the samples, its median and rounds the stats. The run is whole (status complete), labelled by
the machine's CPU, with the file's commit, branch, host and time (``commit_info``, ``machine_info``,
``datetime``). benchmarks/conftest.py says how such a file is made.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpubench.records.results import CaseRecord, RunRecord, Stats, VariantRecord

SOURCE = "pytest-benchmark"


def is_pytest_benchmark(raw: Any) -> bool:
    """Whether a parsed JSON document is pytest-benchmark's (a results.json is not)."""
    return isinstance(raw, Mapping) and "benchmarks" in raw and "machine_info" in raw


def run_of(raw: Mapping[str, Any], path: Path) -> RunRecord:
    """The run a pytest-benchmark JSON document (read from ``path``) records."""
    machine = raw.get("machine_info") or {}
    commit = raw.get("commit_info") or {}
    cpu = (machine.get("cpu") or {}).get("brand_raw") or machine.get("processor") or "unknown CPU"
    return RunRecord(
        run_id=run_id(raw, path),
        device="",
        device_label=f"CPU: {cpu}",
        scenario={"name": SOURCE, "entries": None},
        env={
            "host": machine.get("node") or "",
            "git": {"commit": commit.get("id"), "branch": commit.get("branch"), "dirty": commit.get("dirty")},
        },
        status="complete",
        started_at=raw.get("datetime") or "",
        cases=[_case(bench) for bench in raw.get("benchmarks") or [] if isinstance(bench, Mapping)],
        source=SOURCE,
        path=str(path),
    )


def run_id(raw: Mapping[str, Any], path: Path) -> str:
    """The run's id: the file's name and a digest of what identifies the run inside it (its time,
    commit and machine). CI writes every commit's results to the same ``--benchmark-json out.json``;
    an id from the name alone made the history store take the second commit's file for the first
    (``0 rows added, 2 already there``) and drop it. The same file read again has the same id."""
    machine = raw.get("machine_info") or {}
    commit = raw.get("commit_info") or {}
    identity = [
        raw.get("datetime"),
        commit.get("id"),
        commit.get("dirty"),
        machine.get("node"),
        (machine.get("cpu") or {}).get("brand_raw"),
    ]
    digest = hashlib.sha256(json.dumps(identity, default=str).encode()).hexdigest()[:10]
    return f"{path.stem}-{digest}"


def _case(bench: Mapping[str, Any]) -> CaseRecord:
    timed = bench.get("stats") or {}
    variant = VariantRecord(
        role="optimized",
        status="ok",
        samples_s=[float(x) for x in timed.get("data") or []],
        stats=Stats.from_dict({"median": timed.get("median"), "n": timed.get("rounds")}),
    )
    return CaseRecord(
        id=str(bench.get("fullname") or bench.get("name")),
        technique=bench.get("group") or SOURCE,
        params=dict(bench.get("params") or {}),
        seed=0,
        policy={},
        status="passed",
        variants={"benchmark": variant},
    )
