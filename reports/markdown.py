"""summary.md: what to turn on (the answer table), the run's headline, summary table and published
claims (and, with --compare, the count of changes) in GitHub-flavoured Markdown, for a CI job
summary or a pull-request comment.

It formats what :mod:`gpubench.reports.html` has already read out of the results (the headline
and summary rows), escapes every cell, and stays under :data:`MAX_BYTES`: rows past the budget
are left out with a note pointing to the HTML report.
"""

from __future__ import annotations

from typing import Any

from gpubench.reports import answer as answer_table
from gpubench.reports.claims import markdown_lines

MAX_BYTES = 60_000
# An energy figure taken over the timed calls (gpubench.measure.energy's timed_calls method) is marked in
# the summary (here and in report.html) with this, and the note under the table says what it means.
TIMED_CALLS_MARK = "*"
TIMED_CALLS_NOTE = (
    f"{TIMED_CALLS_MARK} energy per call taken over the timed calls themselves (calls lasting 4 or "
    "more refreshes of NVML's energy counter); the others from a window of the variant's own calls "
    "after timing."
)
_NOTE_RESERVE = 300  # room kept for a "rows left out" note


def cell(value: Any) -> str:
    """Text safe inside a table cell: no line breaks, pipes escaped, no HTML tag (``<`` as ``&lt;``)."""
    text = " ".join(str(value).split())
    return text.replace("<", "&lt;").replace("|", "\\|")


def _size(parts: list[str]) -> int:
    return sum(len(p.encode("utf-8")) + 1 for p in parts)


def _row(values: list[Any]) -> str:
    return "| " + " | ".join(cell(v) for v in values) + " |"


def _table(header: list[str], rows: list[list[Any]], budget: int) -> list[str]:
    lines = [_row(header), "|" + "---|" * len(header)]
    for i, row in enumerate(rows):
        line = _row(row)
        if _size(lines) + len(line.encode("utf-8")) + _NOTE_RESERVE > budget:
            lines.append(
                f"\n_{len(rows) - i} more cases left out to keep this summary under "
                f"{MAX_BYTES // 1000} KB; report.html has them all._"
            )
            break
        lines.append(line)
    return lines


def _sentence_case(text: str) -> str:
    return text[:1].upper() + text[1:]


def _headline(head: dict[str, Any]) -> list[str]:
    counts = (
        f"{head['cases']} case{'s' if head['cases'] != 1 else ''}: {head['passed']} passed, {head['failed']} failed"
    )
    if head.get("interrupted"):
        counts += f", {head['interrupted']} interrupted"
    if head.get("not_run"):
        counts += f", {head['not_run']} not run: budget"
    if head.get("not_started"):
        counts += f", {head['not_started']} of {head['planned']} planned not run ({cell(head['not_started_why'])})"
    extremes = f"Best speedup {cell(head['best'])}; worst {cell(head['worst'])}"
    if head.get("not_by_time"):
        extremes += f" (over the techniques read by time; not {cell(', '.join(head['not_by_time']))})"
    if head.get("too_few_samples"):
        extremes += f" (not counted: {cell(head['too_few_samples'])}; no CI)"
    lines = [
        f"### gpubench: {cell(head['scenario'])} on {cell(head['device'])}",
        "",
        f"{cell(head['date'])}, run {cell(head['run_id'])}: **{counts}**. {extremes}."
        + (f" {_sentence_case(cell(head['timed_share']))}." if head.get("timed_share") else ""),
    ]
    if head.get("techniques"):  # each technique by its own headline figure
        lines += [""] + [f"- **{cell(t['name'])}**: {cell(t['text'])}" for t in head["techniques"]]
    if head.get("clocks"):  # which clock the times are on
        lines += [""] + [f"Time: {cell(c)}." for c in head["clocks"]]
    if head.get("description"):
        lines += ["", f"_{cell(head['description'])}_"]
    lines += [f"\n> **Warning:** {cell(w)}" for w in head.get("warnings", [])]
    if head.get("on_cpu"):
        lines += ["", "Measured on a CPU: where a technique's win is GPU-specific, these ratios are not the GPU's."]
    return lines + [""]


def _summary(rows: list[dict[str, Any]], budget: int) -> list[str]:
    memory = any(r["memory"] != "-" for r in rows)
    energy = any(r["energy"] != "-" for r in rows)
    with_headline = any(r["headline"] or r.get("why") for r in rows)  # an empty column is left out
    header = ["#", "technique", "case", "baseline", "optimized", "speedup [95% CI]"] + ["headline"] * with_headline
    header += ["check"] + ["peak memory (base / opt)"] * memory + ["energy/call (base / opt)"] * energy + ["status"]
    body = []
    for r in rows:
        status = "passed" if not r["failed"] else f"**{r['status'].upper()}**: {r['reason'][:300]}"
        headline = (r["headline"] or "-") + (f" (why: {r['why']})" if r.get("why") else "")
        body.append(
            [r["number"], r["technique"], r["params"], r["baseline"], r["optimized"], r["speedup"]]
            + [headline] * with_headline
            + [r["check"]]
            + [r["memory"]] * memory
            + [r["energy"]] * energy
            + [status]
        )
    # A figure marked as taken over the timed calls (gpubench.measure.energy) says so under the table.
    note = [f"\n_{cell(TIMED_CALLS_NOTE)}_"] if any(r.get("energy_over_timed_calls") for r in rows) else []
    return _table(header, body, budget - _size(note)) + note


def _comparison(comparison: dict[str, Any]) -> list[str]:
    """One line: the per-case table is in report.html (and ``gpubench compare`` writes the gate's)."""
    counts = ", ".join(f"{n} {v}" for v, n in comparison["counts"].items() if n) or "no case in common"
    lines = [
        f"Compared with run {cell(comparison['other']['run_id'])} ({cell(comparison['other']['date'])}): "
        f"**{counts}**; per case in report.html."
    ]
    lines += [f"\n> **Warning:** {cell(w)}" for w in comparison["warnings"]]
    return lines + [""]


def guarded_answer(record: Any) -> answer_table.Answer | str | None:
    """The run's answer (:func:`gpubench.reports.answer.answer`), or where building it raised, the
    line that says so (logged): a fault in the answer costs its section, never summary.md."""
    try:
        return answer_table.answer(record)
    except Exception as exc:  # noqa: BLE001 - the rest of summary.md still follows
        return answer_table.unavailable(exc, "summary.md")


def _answer_lines(answer: answer_table.Answer | str | None) -> list[str]:
    """The answer's first section of summary.md; its error line where building or drawing it raised."""
    try:
        if isinstance(answer, str):
            return [f"_{cell(answer)}_", ""]
        return answer_table.markdown_lines(answer, cell)
    except Exception as exc:  # noqa: BLE001 - the rest of summary.md still follows
        return [f"_{cell(answer_table.unavailable(exc, 'summary.md'))}_", ""]


def render_summary(
    head: dict[str, Any],
    rows: list[dict[str, Any]],
    comparison: dict[str, Any] | None = None,
    max_bytes: int = MAX_BYTES,
    answer: answer_table.Answer | str | None = None,
) -> str:
    """The answer table first (:mod:`gpubench.reports.answer`: what to turn on, where given), the
    headline, the comparison's counts (if any), the summary table, then the published claims (the
    table gets what the rest leaves of ``max_bytes``)."""
    lines = _answer_lines(answer) + _headline(head)
    if comparison is not None:
        lines += _comparison(comparison)
    claims = markdown_lines(head.get("claims") or [], cell)
    lines += _summary(rows, max_bytes - _size(lines) - _size(claims))
    return "\n".join(lines + [""] + claims) + "\n"
