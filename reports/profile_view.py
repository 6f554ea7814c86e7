"""The profiles in the report: per case, a "what changed" table (baseline and optimized side by
side, peers after them: ops, kernel launches, syncs, copies, peak memory, top ops with their
share of the time, links to the traces) and a one-line "why" for the summary row where the
profiles show a clear difference (``syncs 33 -> 1``). Reads only what
:mod:`gpubench.measure.profiling` recorded in results.json."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from gpubench.records.results import CaseRecord, Profile, RunRecord
from gpubench.reports.terminal import fit_fields, wrap_words
from gpubench.units import human_bytes

TOP_SHOWN = 5
CLEAR_RATIO = 1.25  # a count that moved by less than this is not called a reason
# (label in the "why" line, the profile's count), in the order a reason is looked for
WHY_COUNTS: tuple[tuple[str, Callable[[Profile], float | None]], ...] = (
    ("syncs", lambda p: p.syncs_per_call),
    ("launches", lambda p: p.kernel_launches_per_call),
    ("ops", lambda p: p.ops_per_call),
)


def _number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.3g}"
    return f"{int(value):,}"


def _profiled(case: CaseRecord) -> list[tuple[str, Profile]]:
    """The case's profiled variants, baseline first, then optimized, then peers."""
    order = [case.role_variant("baseline"), case.role_variant("optimized")]
    names = [n for n in order if n] + [n for n in case.variants if n not in order]
    return [
        (n, profile)
        for n in names
        if n in case.variants
        for profile in (case.variants[n].profile,)
        if profile is not None
    ]


def _profile(case: CaseRecord, role: str) -> Profile | None:
    variant = case.variant(case.role_variant(role))
    return None if variant is None else variant.profile or Profile()


def why(case: CaseRecord) -> str:
    """``syncs 33 -> 1``: the counts that changed clearly between baseline and optimized (at most
    two, the first of :data:`WHY_COUNTS` first); empty when neither was profiled or nothing did."""
    a, b = _profile(case, "baseline"), _profile(case, "optimized")
    if a is None or b is None:
        return ""
    reasons = []
    for label, count in WHY_COUNTS:
        x, y = count(a), count(b)
        if not isinstance(x, (int, float)) or not isinstance(y, (int, float)) or x == y:
            continue
        low, high = sorted((x, y))
        if low == 0 or high / low >= CLEAR_RATIO:
            reasons.append(f"{label} {_number(x)} -> {_number(y)}")
    return ", ".join(reasons[:2])


def _copies(profile: Profile) -> str:
    parts = []
    for direction, c in profile.copies_per_call.items():  # open: {direction: {count, bytes}}
        size = f" ({human_bytes(c['bytes'])})" if c.get("bytes") else ""
        parts.append(f"{direction} {_number(c.get('count'))}{size}")
    return ", ".join(parts) or "none"


def _syncs(profile: Profile) -> str:
    detail = ", ".join(f"{name} {_number(n)}" for name, n in profile.sync_ops.items())
    return _number(profile.syncs_per_call) + (f" ({detail})" if detail else "")


def _time(us: float) -> str:
    """350 us, 4.2 ms, 1.6 s (never ``1.6e+03 ms``)."""
    if us >= 999_500:
        return f"{us / 1e6:.3g} s"
    return f"{us / 1000:.3g} ms" if us >= 999.5 else f"{us:.3g} us"


def _top(profile: Profile) -> list[str]:
    return [
        f"{op.name} {100 * (op.share or 0.0):.0f}% ({_time(op.self_us_per_call or 0.0)}, x{_number(op.count_per_call)})"
        for op in profile.top_ops[:TOP_SHOWN]
    ]


def case_table(case: CaseRecord | Mapping[str, Any], number: int, link_base: str = "") -> dict[str, Any] | None:
    """The "what changed" table of one case, or None when no variant was profiled."""
    case = case if isinstance(case, CaseRecord) else CaseRecord.from_dict(case)
    profiled = _profiled(case)
    if not profiled:
        return None
    ok = [p for _, p in profiled if p.error is None]
    rows = [("ops per call", [_number(p.ops_per_call) for _, p in profiled])]
    if any(p.kernel_launches_per_call is not None for p in ok):
        rows.append(("kernel launches per call", [_number(p.kernel_launches_per_call) for _, p in profiled]))
    rows.append(("host syncs per call", [_syncs(p) for _, p in profiled]))
    if any(p.event_waits_per_call for p in ok):
        rows.append(("event waits per call", [_number(p.event_waits_per_call) for _, p in profiled]))
    rows.append(("copies per call", [_copies(p) for _, p in profiled]))
    rows.append(
        (
            "peak memory",
            [human_bytes(p.peak_memory_bytes) if p.peak_memory_bytes is not None else "-" for _, p in profiled],
        )
    )
    basis = (ok[0].time_basis or "cpu") if ok else "cpu"
    common = set.intersection(*(set(p.notes) for _, p in profiled))
    columns = []
    for name, p in profiled:
        columns.append(
            {
                "name": name,
                "role": case.variants[name].role,
                "error": p.error,
                "top": _top(p),
                "trace": f"{link_base}{p.trace}" if p.trace else None,
                "notes": [n for n in p.notes if n not in common],
            }
        )
    return {
        "number": number,
        "id": case.id,
        "why": why(case),
        "columns": columns,
        "rows": [{"label": label, "cells": cells} for label, cells in rows],
        "top_title": f"top ops by self {'device' if basis == 'device' else 'CPU'} time (share, per call)",
        "calls": ok[0].calls if ok else None,
        "sync_counting": ok[0].sync_counting if ok else "",
        "notes": [n for n in ok[0].notes if n in common] if ok else [],
    }


def tables_by_technique(run: RunRecord, link_base: str = "") -> dict[str, list[dict[str, Any]]]:
    """Each technique's "what changed" tables, numbered as the summary table numbers the cases.
    ``link_base``: the run directory relative to the report's (traces are linked from there)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for number, case in enumerate(run.cases, 1):
        table = case_table(case, number, link_base)
        if table is not None:
            out.setdefault(case.technique, []).append(table)
    return out


def print_case(table: Mapping[str, Any], console: Console) -> None:
    """One case's "what changed" table (:func:`case_table`) in a terminal: the variants side by
    side where the table fits unfolded; on a narrower terminal, and in a log, a block per variant
    (its counts as whole fields, then its top ops a line each), so no op name or count is cut
    (a log's lines are whole, never padded to a width)."""
    columns = table["columns"]
    title = f"{table['id']} ({table['calls']} calls per variant)" + (f": {table['why']}" if table["why"] else "")
    log = not console.is_terminal
    if not log:
        grid = Table(title=Text(title), title_justify="left")  # Text: the case id's [..] is no markup
        grid.add_column("per call")
        for col in columns:
            grid.add_column(f"{col['role']} {col['name']}")
        for row in table["rows"]:
            grid.add_row(*(Text(cell) for cell in [row["label"], *row["cells"]]))
        grid.add_row(Text(table["top_title"]), *[Text("\n".join(c["top"]) or (c["error"] or "-")) for c in columns])
        if Measurement.get(console, console.options.update_width(10**6), grid).maximum <= console.width:
            console.print(grid)
            return
    width = 10**6 if log else console.width
    console.print(title, markup=False, highlight=False, soft_wrap=log)
    for j, col in enumerate(columns):
        console.print(f"{col['role']} {col['name']}", style="bold", markup=False, highlight=False, soft_wrap=log)
        fields = [f"{row['label']} {row['cells'][j]}" for row in table["rows"]]
        for line in fit_fields(fields, width - 2, indent=""):
            console.print("  " + line, markup=False, highlight=False, soft_wrap=log)
        tops = [f"{table['top_title']}:"] + ["  " + op for op in col["top"]] if col["top"] else []
        if not tops:
            tops = wrap_words(f"{table['top_title']}: {col['error'] or '-'}", width - 4, "  ")
        for line in tops:
            console.print("  " + line, markup=False, highlight=False, soft_wrap=log)
