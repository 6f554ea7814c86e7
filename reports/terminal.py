"""The end-of-run summary: one row per case, baseline vs optimized; a table on a terminal, one
plain line per case in a log."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich.console import Console, JustifyMethod
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from gpubench.records.case_ids import id_pairs
from gpubench.records.results import BASIS_TEXT, MATERIAL_SHARE, CaseRecord, RunRecord, Speedup, VariantRecord, as_run
from gpubench.records.stats import MIN_CI_SAMPLES


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def count_text(n: Any) -> str:
    """``(n=1)``: what a figure without a CI shows in place of one; ``(no CI)`` where the count is
    not recorded."""
    return f"(n={n})" if isinstance(n, int) and not isinstance(n, bool) else "(no CI)"


def ratio_text(value: float) -> str:
    """A ratio to two decimals (``1.23``), or to two significant digits where two decimals would
    read as zero or lose it (``0.0043``): a tiny figure never prints as a broken-looking ``0.00``."""
    return f"{value:.2f}" if abs(value) >= 0.1 or value == 0 else f"{value:.2g}"


def format_speedup(speedup: Speedup | Mapping[str, Any] | None) -> str:
    """``1.23x [1.10, 1.35]``; ``0.37x (n=1)`` for a speedup from fewer than MIN_CI_SAMPLES samples
    a side (no CI: :attr:`gpubench.records.results.Speedup.has_interval`); ``-`` for none. A dict (a
    results document's) is read as the :class:`Speedup` it holds."""
    if speedup is not None and not isinstance(speedup, Speedup):
        speedup = Speedup.from_dict(speedup)
    if speedup is None or speedup.ratio is None or not speedup.has_ratio:
        return "-"
    if speedup.ci_low is not None and speedup.ci_high is not None and speedup.has_interval:
        return f"{ratio_text(speedup.ratio)}x [{ratio_text(speedup.ci_low)}, {ratio_text(speedup.ci_high)}]"
    return f"{ratio_text(speedup.ratio)}x {count_text(speedup.n)}"


def few_samples_lines(run: RunRecord) -> list[str]:
    """Why some speedups carry no CI, where they do: how many rest on fewer than MIN_CI_SAMPLES
    timed calls a variant and what made it so (the run's ``--repeat-scale`` setting ``min_reps``
    below it, or timing's time cap arriving before ``min_reps``)."""
    few = [s for c in run.cases for s in [c.speedup(c.role_variant("optimized"))] if s and not s.has_interval]
    if not few:
        return []
    counts = sorted({s.n for s in few if isinstance(s.n, int)})
    shown = f"n={counts[0]}" if len(counts) == 1 else f"n={counts[0]} to {counts[-1]}" if counts else "n not recorded"
    lines = [
        f"samples: {len(few)} speedup{'s' if len(few) != 1 else ''} rest{'s' if len(few) == 1 else ''} on fewer "
        f"than {MIN_CI_SAMPLES} timed calls a variant ({shown}, below {MIN_CI_SAMPLES}): shown without a CI, "
        f"and no verdict rests on {'them' if len(few) != 1 else 'it'}"
    ]
    min_reps = {m for c in run.cases if isinstance(m := c.policy.get("min_reps"), int)}
    low = sorted(m for m in min_reps if m < MIN_CI_SAMPLES)
    if low:
        lines.append(
            f"samples: min_reps is {', '.join(map(str, low))} in this run"
            + (f" (--repeat-scale {run.repeat_scale:g})" if run.repeat_scale != 1 else "")
            + f"; a CI needs {MIN_CI_SAMPLES} timed calls a variant"
        )
    capped = [c for c in run.cases if any(v.under_sampled for v in c.variants.values())]
    if capped:
        example = next(v.under_sampled for v in capped[0].variants.values() if v.under_sampled)
        lines.append(
            f"samples: timing stopped before min_reps in {len(capped)} case{'s' if len(capped) != 1 else ''} "
            f"(a loaded or slow machine), e.g. {capped[0].id}: {example}"
        )
    return lines


def named_time(case: CaseRecord, name: str | None) -> str:
    """A variant's median time after its name (what ran: ``triton 1.2 ms``)."""
    variant = case.variant(name)
    if variant is None:
        return "-" if name is None else f"{name} -"
    return f"{name} {format_seconds(variant.median_s)}"


def other_clock_text(variant: VariantRecord | None, always: bool = False) -> str:
    """The other clock's median beside the headline's and the share of wall time that device time
    leaves out, e.g. ``wall 78.1 us (launch and syncs 42%)``, where it is material
    (:data:`MATERIAL_SHARE` of wall time or more) or ``always``; "" where there is no other clock."""
    if variant is None or variant.launch_share is None:
        return ""
    share = variant.launch_share
    if variant.other_basis is None or (abs(share) < MATERIAL_SHARE and not always):
        return ""
    return f"{variant.other_basis} {format_seconds(variant.other_median_s)} (launch and syncs {share:.0%})"


def clock_lines(run: RunRecord) -> list[str]:
    """Which clock each technique's times are on, one line each (one line for a CPU run: one
    clock), and where wall time differs materially from device time, in how many cases and by how
    much at most (the optimized variant's launch and sync share)."""
    bases: dict[str, dict[str, int]] = {}
    shares: dict[str, list[float]] = {}
    for case in run.cases:
        variant = case.variant(case.role_variant("optimized")) or case.variant(case.role_variant("baseline"))
        if variant is None or not variant.samples_s:
            continue
        per = bases.setdefault(case.technique, {})
        per[variant.basis] = per.get(variant.basis, 0) + 1
        if variant.launch_share is not None:
            shares.setdefault(case.technique, []).append(variant.launch_share)
    if not bases:
        return []
    if all(set(per) == {"host"} for per in bases.values()):
        return [f"time: {BASIS_TEXT['host']}"]
    lines = []
    for name, per in bases.items():
        said = "; ".join(BASIS_TEXT.get(b, "clock not recorded") for b in per)
        line = f"time: {name} on {said}"
        material = [x for x in shares.get(name, []) if abs(x) >= MATERIAL_SHARE]
        if material:
            line += (
                f" (launch and syncs are {MATERIAL_SHARE:.0%} or more of wall time in {len(material)} of "
                f"{len(shares[name])} cases, up to {max(material, key=abs):.0%}: both clocks in the results)"
            )
        lines.append(line)
    return lines


def param_text(params: Mapping[str, Any], key: str) -> str:
    """``key=value`` as a label shows it: a value that stands for another is resolved
    (``kv_heads=0`` means as many as ``heads``: ``kv_heads=8`` for 8 heads)."""
    value = params.get(key)
    if key == "kv_heads" and str(value) == "0" and params.get("heads") is not None:
        value = params["heads"]
    return f"{key}={value}"


def case_params(case: CaseRecord | Mapping[str, Any], swept: set[str] | None = None) -> str:
    params = case.params if isinstance(case, CaseRecord) else case["params"]
    return " ".join(param_text(params, k) for k in params if swept is None or k in swept)


def id_labels(case_ids: Iterable[str]) -> dict[str, str]:
    """Labels for case ids (``kv_cache[model=x,kv_dtype=bf16]``) that tell them apart: the
    technique and only the params whose values differ between its cases here; an id that does not
    parse as ``name[k=v,...]`` is its own label. A param one id names and another leaves out (one
    declared ``omit_default_from_id``, at its default there) shows as ``name=default``."""
    case_ids = list(case_ids)  # read twice: a generator (the history's) would be spent after once
    parsed: dict[str, tuple[str, dict[str, str]]] = {}
    for case_id in case_ids:
        name, bracket, inner = case_id.partition("[")
        if bracket and inner.endswith("]"):
            parsed[case_id] = (name, dict(kv.split("=", 1) for kv in id_pairs(inner[:-1]) if "=" in kv))
    labels = {case_id: case_id for case_id in case_ids}
    for case_id, (name, params) in parsed.items():
        peers = [p for n, p in parsed.values() if n == name]
        keys = dict.fromkeys([*params, *(k for p in peers for k in p)])
        varying = [k for k in keys if len({p.get(k) for p in peers}) > 1]
        if varying:
            labels[case_id] = f"{name} " + " ".join(
                param_text(params, k) if k in params else f"{k}=default" for k in varying
            )
    return labels


def plain_lines(
    header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = (), widest: int | None = None
) -> list[str]:
    """Rows as a log shows them: columns two spaces apart, aligned by padding to the widest
    cell (the last column is not padded; none past ``widest`` characters, so one long case id
    does not pad every line to its length), no box drawing, nothing cut and nothing wrapped."""
    table = [list(header)] + [list(r) for r in rows]
    widths = [min(widest or 10**9, max(len(r[j]) for r in table)) for j in range(len(header))]
    last = len(header) - 1
    return [
        "  ".join(
            cell if j == last and j not in right else cell.rjust(w) if j in right else cell.ljust(w)
            for j, (cell, w) in enumerate(zip(r, widths))
        ).rstrip()
        for r in table
    ]


def row_fields(header: Sequence[str] | None, row: Sequence[str]) -> list[str]:
    """One row as whole fields for a narrow terminal: ``label: value``, then each other cell
    (after its column's name, where the table has a header); empty cells left out."""
    named = [f"{header[j]} {cell}" if header else cell for j, cell in enumerate(row) if j and cell]
    if not named:
        return [row[0]]
    return [f"{row[0]}: {named[0]}"] + named[1:]


GRID_NOTE_MIN = 40  # a grid's last column narrower than this reads worse than a line per row


def _aligned(cells: Sequence[str], widths: Sequence[int], right: Sequence[int]) -> str:
    return "  ".join(
        cell.rjust(w) if j in right else cell.ljust(w) for j, (cell, w) in enumerate(zip(cells, widths))
    ).rstrip()


def print_rows(
    console: Console,
    header: Sequence[str] | None,
    rows: Sequence[Sequence[str]],
    right: Sequence[int] = (),
    title: str = "",
) -> None:
    """A table as a person reads it on any screen. On a terminal wide enough for it unfolded: a
    rich table (box lines where it has a ``header``; a borderless label/value grid where it has
    none; a grid's last column wrapped at spaces where the others fit whole beside
    :data:`GRID_NOTE_MIN` columns of it); else its columns unboxed where they fit, else with their
    names wrapped between words.
    On a narrower terminal: a line per row, its label then its cells as whole fields
    (:func:`fit_fields`, wrapped at spaces, never cut). In a log: aligned plain lines
    (:func:`plain_lines`), nothing padded past its text, nothing cut or wrapped."""
    rows = [[str(cell) for cell in row] for row in rows]
    if not rows:
        return
    if title:
        console.print(title, markup=False, highlight=False, soft_wrap=not console.is_terminal)
    if not console.is_terminal:
        lines = plain_lines(header, rows, right) if header else plain_lines(rows[0], rows[1:], right)
        for line in lines:
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        return
    table = Table(box=None, show_header=False, padding=(0, 2), pad_edge=False) if header is None else Table()
    for j, name in enumerate(header or [""] * len(rows[0])):
        table.add_column(
            name, justify="right" if j in right else "left", style="bold" if header is None and j == 0 else None
        )
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))  # Text: a cell such as "[1, 2]" is no rich markup
    if Measurement.get(console, console.options.update_width(10**6), table).maximum <= console.width:
        console.print(table)
        return
    if header is None and len(rows[0]) > 1:  # a grid: its label and figure columns whole, the last wrapped
        fixed = [max(len(row[j]) for row in rows) for j in range(len(rows[0]) - 1)]
        if sum(fixed) + 4 * len(fixed) + GRID_NOTE_MIN <= console.width:
            grid = Table(box=None, show_header=False, padding=(0, 2), pad_edge=False)
            for j, w in enumerate(fixed):
                grid.add_column(
                    justify="right" if j in right else "left",
                    style="bold" if j == 0 else None,
                    no_wrap=True,
                    min_width=w,
                )
            grid.add_column(ratio=1)
            for row in rows:
                grid.add_row(*(Text(cell) for cell in row))
            console.print(grid)
            return
    lines = plain_lines(header, rows, right) if header else plain_lines(rows[0], rows[1:], right)
    if max(map(len, lines)) <= console.width:  # the same columns, unboxed, still fit
        for line in lines:
            console.print(line, markup=False, highlight=False)
        return
    if header:  # column names wrapped between their words, every cell whole on its line
        widths = [
            max([len(row[j]) for row in rows] + [len(word) for word in name.split()]) for j, name in enumerate(header)
        ]
        if sum(widths) + 2 * (len(widths) - 1) <= console.width:
            names = [wrap_words(name, w) for name, w in zip(header, widths)]
            depth = max(map(len, names))
            names = [[""] * (depth - len(n)) + n for n in names]  # the names' last lines on one line
            for k in range(depth):
                console.print(
                    _aligned([n[k] for n in names], widths, right), style="bold", markup=False, highlight=False
                )
            for row in rows:
                console.print(_aligned(row, widths, right), markup=False, highlight=False)
            return
    for row in rows:  # too narrow for the table unfolded: a line per row, wrapped between fields
        for line in fit_fields(row_fields(header, row), console.width):
            console.print(line, markup=False, highlight=False)


def shown_params(cases_params: list[dict[str, Any]], swept: set[str]) -> set[str]:
    """The params worth printing for a technique's cases: those whose value differs between
    cases; for a single case, those the scenario set. The rest are the same everywhere. A case
    recorded before a param existed (its params lack it) does not make that param vary."""
    keys = {k for k in swept if len({repr(p[k]) for p in cases_params if k in p}) > 1}
    return keys or set(swept)


def shown_by_technique(run: RunRecord) -> dict[str, set[str]]:
    """Per technique, the params its labels show: those that vary among its cases (of those the
    scenario set; of all its params for a technique the scenario's entries do not name)."""
    swept: dict[str, set[str]] = {}
    for entry in run.scenario.get("entries", []):
        swept.setdefault(entry["technique"], set()).update(entry.get("params", {}))
    for case in run.cases:
        if case.technique not in swept:
            swept[case.technique] = {k for c in run.cases if c.technique == case.technique for k in c.params}
    return {t: shown_params([c.params for c in run.cases if c.technique == t], keys) for t, keys in swept.items()}


def wrap_words(text: str, width: int, indent: str = "") -> list[str]:
    """``text`` wrapped at spaces to ``width`` columns, continuation lines after ``indent``: a
    word is never cut (one longer than the line stands alone on its own)."""
    return textwrap.wrap(
        text, max(1, width), subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    ) or [""]


def fit_fields(fields: Iterable[str], width: int, indent: str = "    ", sep: str = "  ") -> list[str]:
    """Fields (a label, ``1.04x [0.71, 1.22]``, a time) packed into lines of ``width`` columns:
    a field that does not fit on the line goes whole onto the next (after ``indent``), so a CI is
    never split between lines; one wider than a line is wrapped at its spaces."""
    lines: list[str] = []
    line = ""
    for field in (f for f in fields if f):
        joined = f"{line}{sep}{field}" if line else field
        if len(joined) <= width or not line.strip():
            line = joined
        else:
            lines.append(line)
            line = indent + field
        if len(line) > width:  # a field wider than a line alone: wrapped at its spaces
            *done, line = wrap_words(line, width, indent)
            lines += done
    return lines + [line] if line else lines


def shorten_words(text: str, limit: int) -> str:
    """``text`` in at most about ``limit`` characters, cut only between words (`` ...`` marks a
    cut); a text that fits is returned as it is."""
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0] if " " in text[:limit] else text[:limit]
    return cut.rstrip(" ,;:") + " ..."


def check_text(case: CaseRecord, name: str) -> Text:
    v = case.variant(name)
    if v is None:
        return Text("-")
    if v.status in ("error", "skipped") or v.check is None:
        return Text(v.status or "-", style="red" if v.status == "error" else "dim")
    err, metric, passed = v.check.error, v.check.metric, v.check.passed
    figure = f" {metric}={err:.1e}" if isinstance(err, float) and metric != "reference" else ""
    return Text(("pass" if passed else "FAIL") + figure, style="green" if passed else "bold red")


def _figure(value: Any, key: str) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    return f"{100 * value:.1f}%" if key in ("utilization",) or key.startswith("pct_") else f"{value:.3g}"


def headline_text(case: CaseRecord, base: str | None, opt: str | None) -> str:
    """The technique's headline metric, baseline -> optimized (for wins that are not time)."""
    key = case.headline
    before, after = case.variant(base), case.variant(opt)
    if not key or before is None or after is None:
        return ""
    return f"{key} {_figure(before.metric(key), key)} -> {_figure(after.metric(key), key)}"


SUMMARY_COLUMNS: tuple[tuple[str, JustifyMethod], ...] = (
    ("case", "left"),
    ("baseline", "right"),
    ("optimized", "right"),
    ("speedup [95% CI]", "right"),
    ("headline", "left"),
    ("check", "left"),
    ("status", "left"),
)


# A summary row: label, baseline, optimized, speedup, headline (text), check and status (styled).
SummaryRow = tuple[str, str, str, str, str, Text, Text]


def summary_rows(run: RunRecord) -> list[SummaryRow]:
    """One row per case, in :data:`SUMMARY_COLUMNS` order."""
    shown = shown_by_technique(run)
    rows: list[SummaryRow] = []
    for case in run.cases:
        base, opt = case.role_variant("baseline"), case.role_variant("optimized")
        status = Text(case.status, style="green" if case.passed else "bold red")
        if not case.passed and case.failure:
            status.append(f": {case.failure.message}", style="red")
        rows.append(
            (
                f"{case.technique} {case_params(case, shown.get(case.technique))}".strip(),
                named_time(case, base),
                named_time(case, opt),
                format_speedup(case.speedups.get(opt) if opt else None),
                headline_text(case, base, opt),
                check_text(case, opt) if opt else Text("-"),
                status,
            )
        )
    return rows


def summary_title(run: RunRecord) -> str:
    # A run stopped while its workers started has no device label yet: name what it asked for.
    return f"{run.scenario.get('name', '?')} on {run.device_label or run.device or 'no device'}"


def _shown_columns(rows: Sequence[Sequence[str | Text]]) -> list[int]:
    """The columns worth a place: the case's, and every other that some row fills."""
    return [i for i in range(len(SUMMARY_COLUMNS)) if i == 0 or any(str(r[i]) not in ("", "-") for r in rows)]


def summary_table(run: RunRecord, reasons: bool = True) -> Table:
    """The summary as a table; ``reasons=False``: the status column holds the verdict only (the
    reasons printed under the table: :func:`reason_lines`)."""
    rows = summary_rows(run)
    keep = _shown_columns(rows)
    table = Table(title=summary_title(run), title_justify="left")
    for i in keep:
        column, justify = SUMMARY_COLUMNS[i]
        table.add_column(column, justify=justify, overflow="fold")
    for row in rows:
        cells: list[str | Text] = [row[i] for i in keep]
        if not reasons:
            cells[-1] = Text(row[-1].plain.split(":", 1)[0], style=row[-1].style)
        table.add_row(*cells)
    return table


def reason_lines(run: RunRecord) -> list[Text]:
    """A failed case's label and reason, whole, for under the table (a terminal wraps it at spaces)."""
    return [Text(f"{row[0]}: ") + row[-1] for row in summary_rows(run) if ":" in row[-1].plain]


def summary_blocks(run: RunRecord, width: int) -> list[Text]:
    """The summary for a terminal too narrow for the table: a block per case, its label and
    status on the first line, then baseline, optimized, speedup [CI], headline and check as
    whole fields (:func:`fit_fields`), a failure's reason wrapped at spaces, never cut."""
    out = [Text(f"{summary_title(run)}: {len(run.cases)} case{'s' if len(run.cases) != 1 else ''}")]
    for row in summary_rows(run):
        label, base, opt, speedup, headline, check, status = row
        verdict = status.plain.split(":", 1)[0]
        head = fit_fields([str(label), verdict], width, indent="  ")
        block = Text("\n".join(head[:-1] + [head[-1][: len(head[-1]) - len(verdict)]]))
        block.append(verdict, style=status.style)
        opt_text = f"{opt}" + (f"  speedup {speedup}" if speedup != "-" else "")
        fields = [
            f"baseline {base}" if base != "-" else "",
            f"optimized {opt_text}" if opt != "-" else "",
            headline,
            f"check {check.plain}" if check.plain != "-" else "",
        ]
        for line in fit_fields(fields, width - 2, indent=""):
            block.append("\n  " + line)
        reason = status.plain[len(verdict) + 2 :] if ":" in status.plain else ""
        for line in wrap_words(reason, width - 4) if reason else []:
            block.append("\n    " + line, style="red")
        out.append(block)
    return out


def summary_lines(run: RunRecord, widest: int = 60) -> list[str]:
    """The summary for a log (stdout not a terminal): plain text, one line per case, columns
    aligned by padding (a column wider than ``widest`` characters is not padded to), no box
    drawing and no wrapping. An empty column (no technique with a headline) is left out."""
    rows = [[str(cell) for cell in row] for row in summary_rows(run)]
    keep = [i for i in range(len(SUMMARY_COLUMNS)) if i == 0 or any(r[i] not in ("", "-") for r in rows)]
    table = [[SUMMARY_COLUMNS[i][0] for i in keep]] + [[r[i] for i in keep] for r in rows]
    widths = [min(widest, max(len(r[j]) for r in table)) for j in range(len(keep))]
    lines = []
    for r in table:
        cells = [
            cell.rjust(w) if SUMMARY_COLUMNS[keep[j]][1] == "right" else cell.ljust(w)
            for j, (cell, w) in enumerate(zip(r, widths))
        ]
        lines.append("  ".join(cells).rstrip())
    return [f"{summary_title(run)}: {len(rows)} case{'s' if len(rows) != 1 else ''}"] + lines


def print_summary(
    doc: RunRecord | Mapping[str, Any], console: Console, gpu_notes: dict[str, str] | None = None
) -> None:
    run = as_run(doc)
    if not run.cases:
        console.print(f"{summary_title(run)}: no case finished", markup=False, highlight=False)
    elif console.is_terminal:
        table = summary_table(run, reasons=False)
        if Measurement.get(console, console.options.update_width(10**6), table).maximum <= console.width:
            console.print(table)
            for line in reason_lines(run):
                console.print(line, highlight=False)
        else:  # a table this narrow would fold its cells: a block per case, wrapped at spaces
            for block in summary_blocks(run, console.width):
                console.print(block, highlight=False)
    else:
        for plain in summary_lines(run):
            console.print(plain, markup=False, highlight=False, soft_wrap=True)
    s = run.summary
    counts = Text(
        f"{s['passed']} passed, {s['failed']} failed"
        + (f", {s['interrupted']} interrupted" if s["interrupted"] else "")
        + (f", {s['not_run']} not run: budget" if s.get("not_run") else "")
    )
    planned = run.planned_cases
    never = planned - len(run.cases) - len(run.not_run) if isinstance(planned, int) else 0
    if never > 0:  # stopped before it reached them (Ctrl-C, SIGTERM, an abort): as the report's counts say
        counts.append(f", {never} of {planned} planned not run", style="bold red")
    console.print(counts + Text(f" ({run.status})"), highlight=False, soft_wrap=not console.is_terminal)
    for note in clock_lines(run) + few_samples_lines(run):
        console.print(note, markup=False, highlight=False, soft_wrap=not console.is_terminal)
    if run.abort_reason:
        console.print(
            f"[bold red]run {run.status}[/]: {escape(run.abort_reason)}", markup=True, soft_wrap=not console.is_terminal
        )
    if run.device == "cpu" and gpu_notes:
        ran = {c.technique for c in run.cases}
        for name, note in sorted(gpu_notes.items()):
            if name in ran and note:
                console.print(f"[yellow]note[/]: {name} measured on a CPU: {note}", soft_wrap=not console.is_terminal)
    tele = run.telemetry
    if tele is not None and tele.status == "unavailable":
        console.print(f"telemetry: unavailable: {tele.reason}")
    elif tele is not None and tele.throttled:
        console.print(f"[bold yellow]warning[/]: the GPU throttled during the run: {', '.join(tele.throttle_reasons)}")
