"""The answer first: "what should I turn on?" for the run's model on its device, one row per case
measured, ranked, before anything else in the HTML report, the terminal summary and summary.md.

Each row says what the technique buys at these shapes, what it costs, whether its published
claims hold here and a verdict from fixed rules (:func:`verdict`). What it buys is the figure the
report's headline reads the technique by (:func:`gpubench.reports.sweep.readings`): the optimized
variant's speedup with its bootstrap 95% CI, or, where the technique declares a figure that
replaces time (kv_cache: KV utilization; paged_kv_serving: requests that fit; serving: tokens/s),
that figure's factor, optimized against baseline. Its interval: none needed where the figure is
declared exact (bookkeeping, :attr:`gpubench.contract.Headline.exact`); else the speedup's,
scaled to it (a figure measured over the timed calls is as sure as their time, as a claim's
``per_time`` figure is). The claims column is :mod:`gpubench.reports.claims`' rule, read against
the row's case alone.

The verdicts, in the order the table lists them:

1. the optimized variant's check failed: "wrong here: do not turn on" (first, as a warning; a
   baseline's or a peer's failed check fails the case, rule 7, with its reason);
2. the whole CI above 1: "turn on", ranked by the CI's lower end (the median breaks ties);
3. the CI reaches 1: "no gain at these shapes" (never ranked);
4. the whole CI below 1: "slower here: leave off" ("worse here" for a figure that is not time);
5. fewer than MIN_CI_SAMPLES timed calls a variant (no CI): "too few samples to rank";
6. a CPU run of a technique whose win is GPU-specific (its ``gpu_specific`` declaration), read by
   time or a figure measured over it: "GPU-only effect: not measurable on this device";
7. the case failed otherwise (an error, out of memory, a timeout, another variant's check): "not
   measured here".

:func:`verdict` checks them in this order, the first that applies: rule 1, then rule 7 (a case
that failed, or has no figure of both variants, is not measured on any device, a GPU-specific
technique's CPU case too), then rule 6 (a CPU ratio of such a technique says nothing of the GPU's,
whichever way it points), then rule 5, then rules 2-4 (which exclude each other).

Cases: a run with a ``model`` block (``gpubench run --model``) has a row per case, named by its
scenario entry's ``note`` (which layers it stands for: "sliding layers (12 of 24), window 128")
and, where a technique has several, the params that tell them apart; each is ranked on its own
figure. A run without one (an ordinary scenario) gets the same table titled by the scenario,
for the techniques it measured at :data:`MAX_CASES` cases or fewer; a larger sweep has no one
answer at one size and is named under the table (its section reads the sweep); a run of sweeps
alone has no table.

Pure: a run record in, an :class:`Answer` (plain strings and numbers) out; :func:`print_answer`
and :func:`markdown_lines` format it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from gpubench.records.declarations import TechniqueRecord
from gpubench.records.model_origin import ModelOrigin
from gpubench.records.results import CaseRecord, RunRecord, as_run, has_interval
from gpubench.records.stats import MIN_CI_SAMPLES
from gpubench.reports import claims, sweep
from gpubench.reports.terminal import (
    case_params,
    count_text,
    fit_fields,
    plain_lines,
    ratio_text,
    shorten_words,
    shown_params,
    wrap_words,
)
from gpubench.units import human_bytes

WRONG = "wrong here: do not turn on"
TURN_ON = "turn on"
NO_GAIN = "no gain at these shapes"
SLOWER = "slower here: leave off"
WORSE = "worse here: leave off"
TOO_FEW = "too few samples to rank"
GPU_ONLY = "GPU-only effect: not measurable on this device"
NOT_MEASURED = "not measured here"
# The order rows are listed in (ranked ones by their figure within theirs), and each one's CSS class.
ORDER = (WRONG, TURN_ON, NO_GAIN, SLOWER, WORSE, TOO_FEW, GPU_ONLY, NOT_MEASURED)
VERDICT_CLASS = {
    WRONG: "fail",
    TURN_ON: "pass",
    NO_GAIN: "not-comparable",
    SLOWER: "regressed",
    WORSE: "regressed",
    TOO_FEW: "not-comparable",
    GPU_ONLY: "not-comparable",
    NOT_MEASURED: "fail",
}
NO_MEMORY = "not measured"
MAX_CASES = 4  # a technique of more cases in a run without a model block is a sweep: left out
RULE = (
    "Ranked by the lower end of each figure's 95% CI (the speedup, or the technique's own figure where "
    "its win is not time); only a figure whose whole CI is above 1 is ranked. A CI that reaches 1 is no "
    "gain at these shapes; a failed check comes first, whatever its speed."
)
MEMORY_NOTE = "peak memory: not measured in this run (CUDA allocations only)"
RULE_SHORT = "ranked by the lower end of each 95% CI; nothing whose CI reaches 1 is ranked"
CPU_NOTE = (
    "Measured on a CPU: a technique whose win is GPU-specific (host syncs, HBM traffic, copy overlap) is "
    "not judged by its CPU ratio; bookkeeping figures (bytes, requests that fit) are the same on any device."
)


@dataclass(frozen=True)
class Bought:
    """What a technique buys in one case: ``factor`` times better (> 1: a win) with its 95% CI
    (``low``, ``high``: None without one), as the report shows it (``text``)."""

    factor: float
    low: float | None
    high: float | None
    text: str
    by_time: bool  # the speedup (else the technique's own figure)
    exact: bool = False  # bookkeeping: the interval has no width and needs no samples
    n: int | None = None  # the samples a variant behind the CI (the fewer)


@dataclass
class Row:
    """One case of the answer table."""

    technique: str
    note: str  # which layers the case stands for (its scenario entry's ``note``), "" if none
    params: str  # the params that tell it from the technique's other rows, "" for one row
    number: int  # the case's number in the summary table
    buys: str
    memory: str  # peak memory, optimized against baseline
    error: str  # the optimized output's check: its error against its tolerance
    claims: list[dict[str, Any]]  # claims.case_claim_rows: each claim read against this case
    verdict: str
    why: str = ""  # what the verdict rests on, where it needs saying (a failure's reason, n=2)
    rank: int | None = None  # 1, 2, ... for "turn on" rows; None for the others
    ranked_on: float | None = None  # the CI's lower end a "turn on" row is ranked by
    factor: float | None = None
    gpu_note: str = ""  # why a CPU ratio is not the GPU's (GPU-only rows)

    @property
    def label(self) -> str:
        return " ".join(filter(None, (self.technique, self.params)))

    @property
    def verdict_class(self) -> str:
        return VERDICT_CLASS.get(self.verdict, "")

    @property
    def claim_text(self) -> str:
        """The published claims in one line: each one's verdict and text, or, where none could be
        read against this case, why (the first reason)."""
        if not self.claims:
            return "no published claim"
        judged = [c for c in self.claims if c["verdict"] != "not comparable"]
        if not judged:
            reason = self.claims[0]["reason"].split(";")[0]
            return "not comparable" + (f": {shorten_words(reason, 70)}" if reason else "")
        return "; ".join(f"{c['verdict']}: {shorten_words(c['claim'], 60)}" for c in judged)

    @property
    def costs(self) -> str:
        return f"memory {self.memory}; check {self.error}"


@dataclass
class Answer:
    """The table and what goes with it."""

    title: str
    rows: list[Row]
    summary: str = ""  # the model in a line (its layers, attention, MoE), from the model block
    source: str = ""  # where the model came from ("preset gpt-oss-20b", a config path)
    not_applicable: list[tuple[str, str]] = field(default_factory=list)  # (technique, reason)
    sizing: list[str] = field(default_factory=list)  # how the model was fitted to the device
    left_out: list[str] = field(default_factory=list)  # sweeps of a run without a model block
    scope: str = ""  # which cases a run without a model block is answered by
    on_cpu: bool = False
    rule: str = RULE

    @property
    def memory_measured(self) -> bool:
        """Whether any row has a peak memory figure (CUDA allocations only: none on a CPU run)."""
        return any(r.memory != NO_MEMORY for r in self.rows)

    @property
    def cpu_note(self) -> str:
        return CPU_NOTE if self.on_cpu and any(r.verdict == GPU_ONLY for r in self.rows) else ""


UNAVAILABLE = "answer table unavailable"
log = logging.getLogger(__name__)


def unavailable(exc: Exception, where: str) -> str:
    """What a page says in place of the answer when building or drawing it raised (a gpubench bug):
    the answer section is lost, never the rest of the report. Logged with ``where`` it happened."""
    text = f"{UNAVAILABLE}: {type(exc).__name__}: {exc}"
    log.warning("%s: %s", where, text)
    return text


# -- reading a case ----------------------------------------------------------------------------
def bought(case: CaseRecord, tech: TechniqueRecord | None) -> Bought | None:
    """What the optimized variant buys in ``case`` by the technique's headline figure (see the
    module's docstring); None where the case has no such figure (it failed, or a variant is missing)."""
    read_by = sweep.headline_figures(tech)
    found = sweep.readings([case], read_by)
    if not found:
        return None
    factor, text = found[0].factor, found[0].text
    speedup = case.speedup(case.role_variant("optimized"))
    n = speedup.n if speedup is not None else None
    sure = speedup is not None and has_interval(speedup) and (n is None or n >= MIN_CI_SAMPLES)
    if not read_by:
        if sure and speedup is not None:
            return Bought(factor, speedup.ci_low, speedup.ci_high, text, True, n=n)
        return Bought(factor, None, None, text, True, n=n)
    if getattr(read_by[0], "exact", False):
        return Bought(factor, factor, factor, f"{text} ({ratio_text(factor)}x, exact)", False, exact=True)
    if sure and speedup is not None and speedup.ratio and speedup.ci_low and speedup.ci_high:
        low, high = factor * speedup.ci_low / speedup.ratio, factor * speedup.ci_high / speedup.ratio
        return Bought(
            factor, low, high, f"{text} ({ratio_text(factor)}x [{ratio_text(low)}, {ratio_text(high)}])", False, n=n
        )
    return Bought(factor, None, None, f"{text} ({ratio_text(factor)}x {count_text(n)})", False, n=n)


def verdict(case: CaseRecord, figure: Bought | None, gpu_specific: str = "", on_cpu: bool = False) -> tuple[str, str]:
    """The verdict on one case and what it rests on (the module's rules, checked 1, 7, 6, 5, 2-4)."""
    optimized = case.variant(case.role_variant("optimized"))
    check = optimized.check if optimized is not None else None
    if (check is not None and check.passed is False) or (optimized is not None and optimized.status == "check_failed"):
        return WRONG, case.failure.message if case.failure is not None else (check.detail if check else "")
    if not case.passed or figure is None:
        reason = case.failure.message if case.failure is not None else "no figure of both variants was recorded"
        return NOT_MEASURED, f"{case.status}: {reason}" if not case.passed else reason
    if on_cpu and gpu_specific and not figure.exact:
        return GPU_ONLY, ""
    if figure.low is None or figure.high is None:
        if figure.n is not None and figure.n >= MIN_CI_SAMPLES:
            return TOO_FEW, f"n={figure.n}, but no CI recorded"  # (a hand-made or pytest-benchmark record)
        shown = f"n={figure.n}" if figure.n is not None else "n not recorded"
        return TOO_FEW, f"{shown}; a CI needs {MIN_CI_SAMPLES} timed calls a variant"
    if figure.low > 1:
        return TURN_ON, ""
    if figure.high < 1:
        return (SLOWER if figure.by_time else WORSE), ""
    return NO_GAIN, ("the CI reaches 1" if not figure.exact else "the same either way")


def memory_text(case: CaseRecord) -> str:
    """Peak memory, the optimized variant's against the baseline's: ``-1.5 GiB (2.0 GiB -> 512 MiB)``;
    "not measured" where either has none (a CPU: CUDA allocations only)."""
    base, opt = (case.variant(case.role_variant(role)) for role in ("baseline", "optimized"))
    before = base.peak_memory_bytes if base is not None else None
    after = opt.peak_memory_bytes if opt is not None else None
    if before is None or after is None:
        return NO_MEMORY
    change = after - before
    sign = "+" if change > 0 else "-" if change < 0 else "±"
    return f"{sign}{human_bytes(abs(change))} ({human_bytes(before)} -> {human_bytes(after)})"


def error_text(case: CaseRecord) -> str:
    """The optimized output's check: ``rel_l2 2.1e-07 (tolerance 1e-05)``; ``mismatched_tokens 0
    (exact)``; ``FAILED: ...`` where it failed; "not checked" where it was not."""
    opt = case.variant(case.role_variant("optimized"))
    check = opt.check if opt is not None else None
    if check is None:
        return "not checked"
    if check.metric == "reference":
        return "it is the reference"
    figure = f"{check.metric or 'error'} {check.error:.2g}" if isinstance(check.error, (int, float)) else "passed"
    if isinstance(check.tolerance, (int, float)) and check.tolerance > 0:
        figure += f" (tolerance {check.tolerance:.0e})"
    elif isinstance(check.error, (int, float)):
        figure += " (exact)"  # no tolerance, or none above 0: the outputs must match
    return figure if check.passed is not False else f"FAILED: {figure}"


# -- the table ---------------------------------------------------------------------------------
def _in_grid(value: Any, values: Any) -> bool:
    values = values if isinstance(values, list) else [values]
    return any(value == v or str(value) == str(v) for v in values)  # (a path, a preset: as recorded)


def entry_notes(run: RunRecord) -> dict[str, str]:
    """Each case's note (by case id): the ``note`` of the first scenario entry of its technique
    whose params it was drawn from; none where that entry has none."""
    entries = [e for e in run.scenario.get("entries") or [] if isinstance(e, Mapping)]
    notes = {}
    for case in run.cases:
        for entry in entries:
            grid = entry.get("params") or {}
            if entry.get("technique") == case.technique and all(
                _in_grid(case.params.get(k), v) for k, v in grid.items()
            ):
                if isinstance(entry.get("note"), str) and entry["note"].strip():
                    notes[case.id] = entry["note"].strip()
                break
    return notes


def title(run: RunRecord, model: ModelOrigin | None) -> str:
    device = run.device_label or run.device or "?"
    if model is None:
        return f"What to turn on: {run.scenario.get('name', '?')} on {device}"
    family = f" ({model.family})" if model.family else ""
    shapes = model.shapes_text()
    return (
        f"What to turn on for {model.name or 'the model'}{family}"
        + (f": {shapes}," if shapes else "")
        + f" on {device}"
    )


def answer(doc: RunRecord | Mapping[str, Any]) -> Answer | None:
    """The answer table of a run; None where there is nothing to answer (no model block, and no
    case outside a sweep)."""
    run = as_run(doc)
    model = run.model_origin
    if not run.cases and model is None:
        return None
    notes = entry_notes(run)
    numbers = {c.id: n for n, c in enumerate(run.cases, 1)}
    grouped: dict[str, list[CaseRecord]] = {}
    for case in run.cases:
        grouped.setdefault(case.technique, []).append(case)
    left_out = []
    if model is None:
        for name, cases in grouped.items():
            if len(cases) > MAX_CASES:
                left_out.append(f"{name}: {len(cases)} cases swept, no one answer at one size (its section reads them)")
        grouped = {n: cs for n, cs in grouped.items() if len(cs) <= MAX_CASES}
    rows = []
    for name, cases in grouped.items():
        tech = run.technique(name)
        keys = (
            shown_params([c.params for c in cases], set(k for c in cases for k in c.params))
            if len(cases) > 1
            else set()
        )
        for case in cases:
            on_cpu = _on_cpu(run, case)
            figure = bought(case, tech)
            gpu_specific = tech.gpu_specific if tech is not None else ""
            said, why = verdict(case, figure, gpu_specific, on_cpu)
            rows.append(
                Row(
                    technique=name,
                    note=notes.get(case.id, ""),
                    params=case_params(case, keys) if keys and not _notes_differ(cases, notes) else "",
                    number=numbers[case.id],
                    buys=figure.text if figure is not None else "-",
                    memory=memory_text(case),
                    error=error_text(case),
                    claims=claims.case_claim_rows(run, case),
                    verdict=said,
                    why=why,
                    ranked_on=(figure.low if said == TURN_ON and figure is not None else None),
                    factor=figure.factor if figure is not None else None,
                    gpu_note=gpu_specific if said == GPU_ONLY else "",
                )
            )
    rows = rank(rows)
    if not rows and model is None:  # only sweeps: nothing this table can answer
        return None
    scope = (
        ""
        if model is not None
        else f"A run without a model: a row per case of each technique it measured at {MAX_CASES} cases or fewer."
    )
    return Answer(
        title=title(run, model),
        rows=rows,
        summary=model.summary if model is not None else "",
        source=model.source if model is not None else "",
        not_applicable=[(n.technique, n.reason) for n in model.not_applicable] if model is not None else [],
        sizing=list(model.sizing) if model is not None else [],
        left_out=left_out,
        scope=scope,
        on_cpu=any(_on_cpu(run, c) for c in run.cases)
        or ((model.device if model is not None else "") or run.device) == "cpu",
    )


def _notes_differ(cases: Sequence[CaseRecord], notes: Mapping[str, str]) -> bool:
    """Whether the cases' notes alone tell them apart (then their params need not)."""
    said = [notes.get(c.id, "") for c in cases]
    return all(said) and len(set(said)) == len(said)


def _on_cpu(run: RunRecord, case: CaseRecord) -> bool:
    kind = case.device.type if case.device is not None and case.device.type else run.device.split(":")[0]
    return kind == "cpu"


def rank(rows: list[Row]) -> list[Row]:
    """Rows in :data:`ORDER`; the "turn on" ones by their CI's lower end, highest first (then the
    median), numbered 1, 2, ...; the others keep run order within their verdict."""
    order = {v: i for i, v in enumerate(ORDER)}
    ranked = sorted(
        enumerate(rows),
        key=lambda item: (
            order.get(item[1].verdict, len(ORDER)),
            -(item[1].ranked_on or 0.0) if item[1].verdict == TURN_ON else 0.0,
            -(item[1].factor or 0.0) if item[1].verdict == TURN_ON else 0.0,
            item[0],
        ),
    )
    out = [row for _, row in ranked]
    for i, row in enumerate(r for r in out if r.verdict == TURN_ON):
        row.rank = i + 1
    return out


# -- formatting --------------------------------------------------------------------------------
HEADER = ("technique", "verdict", "what it buys [95% CI]", "what it costs", "published claim")


def cells(row: Row, memory: bool = True) -> list[str]:
    """A row as the terminal and summary.md show it, in :data:`HEADER` order (``memory=False``:
    the costs without the peak memory no row of the run measured)."""
    name = (f"{row.rank}. " if row.rank else "") + row.label + (f" ({row.note})" if row.note else "")
    said = row.verdict + (f" ({row.why})" if row.why else "")
    return [name, said, row.buys, row.costs if memory else f"check {row.error}", row.claim_text]


def _lines_after(ans: Answer, short: bool = False) -> list[str]:
    """What follows the table, each a line: not applicable, sizing, left out, the rule (``short``:
    in a few words, for a terminal), the CPU note."""
    lines = [
        f"not applicable: {name} ({reason})" if reason else f"not applicable: {name}"
        for name, reason in ans.not_applicable
    ]
    lines += [f"sizing: {s}" for s in ans.sizing]
    lines += [f"not in this table: {s}" for s in ans.left_out]
    if ans.rows and not ans.memory_measured:
        lines.append(MEMORY_NOTE)
    lines += [x for x in (ans.scope, RULE_SHORT if short else ans.rule, ans.cpu_note) if x]
    return lines


def blocks(ans: Answer, width: int) -> list[str]:
    """The rows for a terminal too narrow for the table: a block per row, its rank, name and
    verdict first (the verdict a whole field), then what it rests on, what it buys, its costs and
    the published claims as whole fields (:func:`gpubench.reports.terminal.fit_fields`: a CI never
    split between lines), wrapped at spaces, never cut."""
    lines = []
    for row in ans.rows:
        name, _, buys, _, claim = cells(row)
        lines += fit_fields([name + ":", row.verdict], width, indent="  ", sep=" ")
        if row.why:
            lines += ["    " + line for line in wrap_words(row.why, width - 4, "  ")]
        memory = [f"memory {row.memory}"] if ans.memory_measured else []
        fields = [f"buys {buys}", *memory, f"check {row.error}", f"claim {claim}"]
        lines += ["    " + line for line in fit_fields(fields, width - 4, indent="  ")]
    return lines


def table(ans: Answer) -> Table:
    """The rows as a rich table (a terminal wide enough for it)."""
    out = Table()
    for name in HEADER:
        out.add_column(name, overflow="fold")
    for row in ans.rows:
        out.add_row(
            *(
                Text(cell, style=_STYLE.get(row.verdict, "") if j == 1 else "")
                for j, cell in enumerate(cells(row, ans.memory_measured))
            )
        )
    return out


_STYLE = {WRONG: "bold red", TURN_ON: "green", NOT_MEASURED: "red"}


def print_answer(doc: RunRecord | Mapping[str, Any], console: Console) -> None:
    """The answer as the terminal summary's first block: its title, the model in a line, the rows
    (a table where it fits the terminal, else a block per row: :func:`blocks`; in a log, aligned
    plain lines, one per row), then what goes with it, wrapped at spaces."""
    ans = answer(doc)
    if ans is None:
        return
    log = not console.is_terminal
    width = console.width

    def say(text: str, style: str = "") -> None:
        for line in [text] if log else wrap_words(text, width, "  "):
            console.print(line, style=style or None, markup=False, highlight=False, soft_wrap=log)

    say(ans.title, "bold")
    if ans.summary:
        say(ans.summary + (f" ({ans.source})" if ans.source else ""))
    if not ans.rows:
        say("no case of this run can be answered here")
    elif log:
        for line in plain_lines(HEADER, [cells(r, ans.memory_measured) for r in ans.rows]):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    else:
        drawn = table(ans)
        if Measurement.get(console, console.options.update_width(10**6), drawn).maximum <= width:
            console.print(drawn)
        else:
            for line in blocks(ans, width):
                console.print(line, markup=False, highlight=False)
    for text in _lines_after(ans, short=not log):
        say(text)
    console.print()


def markdown_lines(ans: Answer | None, cell: Any) -> list[str]:
    """The answer in GitHub Markdown (``cell`` escapes a cell's text): the first section of
    summary.md."""
    if ans is None:
        return []
    lines = [f"### {cell(ans.title)}", ""]
    if ans.summary:
        lines += [f"_{cell(ans.summary)}_" + (f" ({cell(ans.source)})" if ans.source else ""), ""]
    if ans.rows:
        lines += ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
        for row in ans.rows:
            values = cells(row, ans.memory_measured)
            values[1] = f"**{values[1]}**"
            lines.append("| " + " | ".join(cell(v) for v in values) + " |")
        lines.append("")
    lines += [f"- {cell(line)}" for line in _lines_after(ans)]
    return lines + [""]
