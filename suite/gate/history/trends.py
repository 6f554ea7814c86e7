"""What the reports read of the history: a run's cases' figures up to and including that run (the
run report's sparklines, :func:`run_trends`) and a device model's case histories grouped by
technique (the history page, :func:`technique_histories`).

The run report reads the store at render time and never fails because of it: no store, a store
that cannot be read, or too few runs give no sparkline and one note saying why. A store that does
not exist is not created by reading it. The run's own figure comes from its record (through
:func:`gpubench.gate.history.rows_of_run`, the rows the store would hold), so a run added with
``--no-history``, or a report of an old run, still ends its line with its own point.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpubench.errors import BadInput
from gpubench.gate.history import changepoints
from gpubench.gate.history.rows import ResultRow, rows_of_run
from gpubench.gate.history.store import HistoryStore, Point, open_store, resolve_store
from gpubench.records.results import RunRecord

MIN_POINTS = 2  # a line needs two runs


@dataclass(frozen=True)
class Sparkline:
    """A case's figure run by run on one device model, this run last: ``values`` in run order,
    ``commits`` beside them (None where a run recorded none)."""

    case_id: str
    variant: str
    metric: str  # "time" (seconds) or the case's gate_metric
    values: tuple[float, ...]
    commits: tuple[str | None, ...]

    @property
    def current(self) -> int:
        """The index of this run's point (the last: runs after it are not part of its report)."""
        return len(self.values) - 1


@dataclass(frozen=True)
class RunTrends:
    """The sparklines of a run's cases (by case id) and, where some or all are missing, why."""

    where: str | None
    lines: dict[str, Sparkline]
    note: str | None


def _figure(row: ResultRow) -> float | None:
    return row.median_s if not row.gate_metric else row.gate_value


def _followed_rows(run: RunRecord, results_path: str | Path) -> list[ResultRow]:
    """Per case of the run, the row of the variant the history follows: the optimized one (else
    the case's only variant)."""
    by_case: dict[str, list[ResultRow]] = {}
    for row in rows_of_run(run, results_path):
        by_case.setdefault(row.case_id, []).append(row)
    return [next((r for r in rows if r.role == "optimized"), rows[0]) for rows in by_case.values() if rows]


def _sparkline(store: HistoryStore, row: ResultRow) -> Sparkline | None:
    current = _figure(row)
    if current is None:
        return None
    metric = row.gate_metric or "time"
    this = (row.started_at, row.run_id)
    # The base branch's runs (the level ``compare --history`` judges a run against), then this run.
    branch = store.default_branch(row.device_model)
    earlier = [
        p
        for p in store.series(row.device_model, row.case_id, row.variant, metric, branch=branch)
        if (p.started_at, p.run_id) < this and not (p.run_id == row.run_id and p.host == row.host)
    ]
    if len(earlier) + 1 < MIN_POINTS:
        return None
    return Sparkline(
        row.case_id,
        row.variant,
        metric,
        tuple(p.median for p in earlier) + (current,),
        tuple(p.commit for p in earlier) + (row.git_commit,),
    )


def _is_stored(where: str) -> bool:
    """Whether ``where`` holds a store to read (a database URL is taken as one); an absent or empty
    file is none, and reading it must not create one."""
    if "://" in where:
        return True
    path = Path(where).expanduser()
    try:
        return path.is_file() and path.stat().st_size > 0
    except OSError:  # unreadable: opening it says why
        return True


def run_trends(run: RunRecord, results_path: str | Path, store: str | None = None, *, read: bool = True) -> RunTrends:
    """The sparklines of ``run``'s cases from the history store ``store`` (None: the default one,
    :func:`resolve_store`); ``read=False`` (``--no-history``): none, and the note says so."""
    if not read:
        return RunTrends(None, {}, "no history sparklines: the history store was not read (--no-history).")
    where = resolve_store(store)
    if not _is_stored(where):
        return RunTrends(
            where,
            {},
            f"no history sparklines: there is no history store at {where} (each "
            f"`gpubench run` adds its run to it; `gpubench history add` imports old ones).",
        )
    try:
        rows = _followed_rows(run, results_path)
        with open_store(where, read_only=True) as opened:
            lines = {line.case_id: line for line in (_sparkline(opened, row) for row in rows) if line}
    except BadInput as exc:
        return RunTrends(where, {}, f"no history sparklines: {exc}")
    except Exception as exc:  # noqa: BLE001 - a locked, corrupt or unreachable store: the report goes on
        return RunTrends(
            where,
            {},
            f"no history sparklines: the history store {where} could not be read ({type(exc).__name__}: {exc}).",
        )
    return RunTrends(where, lines, _missing_note(where, rows, lines))


def _missing_note(where: str, rows: Sequence[ResultRow], lines: dict[str, Sparkline]) -> str | None:
    missing = len({r.case_id for r in rows} - set(lines))
    if not missing:
        return None
    if not lines:
        return (
            f"no history sparklines: the history store {where} holds no earlier run of this run's cases "
            f"on this device model (a line needs {MIN_POINTS} runs)."
        )
    return (
        f"history: {missing} case{'s' if missing != 1 else ''} without a sparkline (no earlier run of it in "
        f"{where} on this device model, or no figure in this run)."
    )


@dataclass(frozen=True)
class TechniqueHistories:
    """A technique's cases on one device model, each with its variants' histories."""

    technique: str
    cases: tuple[tuple[str, tuple[changepoints.CaseHistory, ...]], ...]  # (case id, its histories)
    roles: dict[tuple[str, str], str | None]  # (case id, variant) -> its role (optimized, baseline, ...)
    params: dict[str, dict[str, Any]]  # case id -> its params


def natural_key(text: str) -> tuple[Any, ...]:
    """``text`` ordered as a reader expects: "n=3" before "n=12"."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def technique_histories(
    store: HistoryStore, device_model: str, histories: Sequence[changepoints.CaseHistory]
) -> list[TechniqueHistories]:
    """``histories`` (:func:`changepoints.case_histories`) grouped by technique, then case, each in
    name order (numbers by value); a case's optimized variant first, then its baseline."""
    held = {case.case_id: case for case in store.cases(device_model)}
    roles = {(case.case_id, name): role for case in held.values() for name, role in case.variants}
    grouped: dict[str, dict[str, list[changepoints.CaseHistory]]] = {}
    for h in histories:
        technique = held[h.case_id].technique if h.case_id in held else None
        grouped.setdefault(technique or "other", {}).setdefault(h.case_id, []).append(h)
    rank = {"optimized": 0, "baseline": 1}

    def variant_order(h: changepoints.CaseHistory) -> tuple[int, str]:
        return rank.get(roles.get((h.case_id, h.variant)) or "", 2), h.variant

    return [
        TechniqueHistories(
            name,
            tuple(
                (case_id, tuple(sorted(cases[case_id], key=variant_order)))
                for case_id in sorted(cases, key=natural_key)
            ),
            {key: role for key, role in roles.items() if key[0] in cases},
            {case_id: held[case_id].params if case_id in held else {} for case_id in cases},
        )
        for name, cases in sorted(grouped.items())
    ]


def points_by_run(histories: Sequence[changepoints.CaseHistory]) -> list[Point]:
    """One point per run any of ``histories`` holds (the first variant's), in run order: the
    runs a case's chart shares between its variants."""
    runs: dict[tuple[str, str], Point] = {}
    for h in histories:
        for p in h.points:
            runs.setdefault((p.run_id, p.host), p)
    return sorted(runs.values(), key=lambda p: (p.started_at, p.run_id))
