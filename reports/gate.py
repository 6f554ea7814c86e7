"""Rendering of a regression-gate comparison: a terminal table and a Markdown summary
(regressions first), both from a :class:`gpubench.gate.compare.Comparison`."""

from __future__ import annotations

from rich.console import Console, JustifyMethod
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from gpubench.gate.compare import Comparison
from gpubench.reports.terminal import count_text, fit_fields, format_seconds, id_labels, shorten_words, wrap_words

STYLE = {
    "regressed": "bold red",
    "failed": "bold red",
    "missing": "red",
    "no_samples": "yellow",
    "inconclusive": "yellow",
    "improved": "green",
    "unchanged": "",
    "new": "cyan",
}
MARK = {
    "regressed": "❌ regressed",
    "failed": "❌ failed",
    "missing": "❌ missing",
    "no_samples": "⚠️ no samples",
    "inconclusive": "⚠️ inconclusive",
    "improved": "✅ improved",
    "unchanged": "unchanged",
    "new": "new",
}


NOTE_CHARS = 400  # a note in the Markdown table past this is shortened between words (the terminal's is whole)


def _change(c) -> str:
    if c.ratio is None:
        return "-"
    if c.ci_low is None or c.ci_high is None:  # too few samples: the figure, its count, no CI
        return f"{(c.ratio - 1) * 100:+.1f}% {count_text(c.n)}"
    return f"{(c.ratio - 1) * 100:+.1f}% [{(c.ci_low - 1) * 100:+.1f}, {(c.ci_high - 1) * 100:+.1f}]"


def _context(c) -> str:
    return f"{(c.context.ratio - 1) * 100:+.1f}%" if c.context is not None and c.context.ratio is not None else "-"


def case_labels(changes) -> dict[str, str]:
    """Short labels: the technique and only the params whose values differ between its cases."""
    return id_labels(c.case_id for c in changes)


def headline(comp: Comparison) -> str:
    counts = comp.counts()
    parts = [f"{n} {v.replace('_', ' ')}" for v, n in counts.items() if n]
    budget = sum(
        c.verdict == "missing" and c.reason.startswith(("not run: budget", "not run to the end: budget"))
        for c in comp.changes
    )
    if budget:  # say which of the missing the current run's --budget left out
        parts = [p + f" ({budget} not run: budget)" if p.endswith(" missing") else p for p in parts]
    verdict = "PASS" if comp.passed else "FAIL"
    missing_note = " (missing cases allowed)" if comp.allow_missing and counts["missing"] else ""
    never = (
        f"the {' and the '.join(comp.unfinished)} run{'s' if len(comp.unfinished) > 1 else ''} never completed; "
        if comp.unfinished
        else ""
    )
    return (
        f"{verdict}: {never}{', '.join(parts) or 'no cases'}{missing_note}; current {comp.current.run_id} vs "
        f"baseline {comp.baseline.run_id} on {comp.current.device_label}"
    )


def print_table(comp: Comparison, console: Console) -> None:
    table = Table(title=headline(comp), title_justify="left")
    labels = case_labels(comp.changes)
    table.add_column("case", overflow="fold")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("verdict", "left"),
        ("baseline", "right"),
        ("current", "right"),
        ("change [95% CI]", "right"),
        ("p", "right"),
        ("threshold", "right"),
        ("baseline variant", "right"),
        ("note", "left"),
    )
    for col, justify in columns:
        table.add_column(col, justify=justify, overflow="fold")
    for c in comp.changes:
        # Text, not a markup string: a case id such as "kv_cache[model=...]" is no rich tag.
        label = labels[c.case_id] + (f" ({c.variant})" if c.variant else "") + (f" on {c.device}" if c.device else "")
        table.add_row(
            Text(label),
            Text(c.verdict, style=STYLE[c.verdict]),
            format_seconds(c.baseline_median_s),
            format_seconds(c.current_median_s),
            _change(c),
            f"{c.p_value:.2g}" if c.p_value is not None else "-",
            f"{c.threshold * 100:g}%",
            _context(c),
            c.reason,
        )  # folded by the table, never cut
    if not console.is_terminal:  # a log: a block per case, each line whole (no padding, no wrapping)
        for line in _blocks(comp, labels, 10**6):
            console.print(line, highlight=False, soft_wrap=True)
    elif Measurement.get(console, console.options.update_width(10**6), table).maximum <= console.width:
        console.print(table)
    else:  # a terminal too narrow for the table unfolded: a block per case, its note wrapped at spaces
        for line in _blocks(comp, labels, console.width):
            console.print(line, highlight=False)
    for message in comp.problems:
        console.print(f"[bold red]fails the gate[/]: {escape(message)}", soft_wrap=True)
    for message in comp.forced:
        console.print(f"[yellow]forced[/]: {escape(message)}", soft_wrap=True)


def _blocks(comp: Comparison, labels: dict[str, str], width: int) -> list[Text]:
    """The gate's table as a block per case for a narrow terminal: the case and its verdict, then
    its figures as whole fields (a CI never split), then its note wrapped at spaces, never cut."""
    out = [Text(headline(comp))]
    for c in comp.changes:
        label = labels[c.case_id] + (f" ({c.variant})" if c.variant else "") + (f" on {c.device}" if c.device else "")
        head = fit_fields([label], width - len(c.verdict) - 2, indent="  ")
        block = Text("\n".join(head) + "  ")
        block.append(c.verdict, style=STYLE[c.verdict])
        fields = [
            f"baseline {format_seconds(c.baseline_median_s)}",
            f"current {format_seconds(c.current_median_s)}",
            f"change {_change(c)}",
            f"p {c.p_value:.2g}" if c.p_value is not None else "",
            f"threshold {c.threshold * 100:g}%",
            f"baseline variant {_context(c)}" if _context(c) != "-" else "",
        ]
        for line in fit_fields(fields, width - 2, indent="") + (wrap_words(c.reason, width - 2) if c.reason else []):
            block.append("\n  " + line)
        out.append(block)
    return out


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def to_markdown(comp: Comparison, limit_bytes: int = 60_000) -> str:
    lines = [
        f"## gpubench compare: {'✅' if comp.passed else '❌'} {_cell(headline(comp))}",
        "",
        "Change is the optimized variant's median time, current vs baseline, with a bootstrap 95% CI "
        "(positive = slower). A case regresses only when the slowdown exceeds its threshold and is "
        "statistically real (CI beyond the threshold, or p < 0.002; p is a bootstrap p of no change from the "
        "CI's own replicates, so the CI excludes 0 exactly when p < 0.05). When the baseline variant, "
        "timed alongside, moved the same way (the machine changed), the case is judged by its "
        "optimized/baseline time ratio instead: regressed only if that ratio got worse beyond the "
        "threshold, its whole CI included; otherwise inconclusive. Where that ratio's whole CI lies beyond "
        "the threshold, it decides whatever the optimized variant's own time says (a faster machine can "
        "hide a regression).",
        "",
        "| case | verdict | baseline | current | change [95% CI] | p | threshold | baseline variant | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for message in comp.forced:
        lines.insert(2, f"> forced: {_cell(message)}")
    for message in comp.problems:
        lines.insert(2, f"> **fails the gate**: {_cell(message)}")
    size = sum(len(x) + 1 for x in lines)
    for i, c in enumerate(comp.changes):
        row = (
            f"| `{_cell(c.case_id)}`{f' ({_cell(c.variant)})' if c.variant else ''}"
            f"{f' on {_cell(c.device)}' if c.device else ''} | {MARK[c.verdict]} | {format_seconds(c.baseline_median_s)} | "
            f"{format_seconds(c.current_median_s)} | {_change(c)} | "
            f"{f'{c.p_value:.2g}' if c.p_value is not None else '-'} | {c.threshold * 100:g}% | {_context(c)} | "
            f"{_cell(shorten_words(c.reason, NOTE_CHARS))} |"
        )
        if size + len(row) + 200 > limit_bytes:
            lines.append(
                f"\n_{len(comp.changes) - i} more case(s) left out to stay under "
                f"{limit_bytes // 1000} KB; see the terminal output or --json._"
            )
            break
        lines.append(row)
        size += len(row) + 1
    return "\n".join(lines) + "\n"
