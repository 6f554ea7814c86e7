"""The HTML report of a run directory: one self-contained file (inline CSS, inline SVG figures).

It reads what the run wrote (``results.json`` read back into its records, ``telemetry.csv``,
``env.json``) and never re-runs anything, nor imports technique code: what it says of a
technique is what the run recorded of it. :func:`load_run` reads the directory; the functions
below turn the run's records into the template's context (pure: records in, plain dicts of
strings and numbers out; :mod:`~gpubench.reports.sections` makes the technique sections,
:mod:`~gpubench.reports.comparison` the comparisons); :func:`render` fills
``templates/report.html.j2``; :func:`write_report` writes ``report.html`` and, beside it,
``summary.md``. Everything taken from results (params, descriptions, failure messages) is escaped
by jinja2's autoescaping; only matplotlib's SVG markup is inserted as it is.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import itertools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import jinja2
import markupsafe

from gpubench.errors import BadInput
from gpubench.gate.history.trends import RunTrends, run_trends
from gpubench.measure.energy import METHOD_TIMED_CALLS
from gpubench.measure.throttle import BENIGN_REASONS
from gpubench.records.atomic import DiskFull, atomic_write_text
from gpubench.records.declarations import Registry
from gpubench.records.results import CaseRecord, RunRecord, RunTelemetry, as_run, duration_text, not_run_text
from gpubench.records.results import load_run as load_record
from gpubench.reports import answer, charts, claims, figure_cache, markdown, phases, profile_view, sweep
from gpubench.reports import comparison as side_by_side
from gpubench.reports.sections import Figure, Labels, drawn, technique_sections
from gpubench.units import human_bytes

if TYPE_CHECKING:  # pandas is imported only where a run has telemetry (0.4 s of a report's start)
    import pandas as pd
from gpubench.reports.sparkline import sparkline_svg
from gpubench.reports.terminal import (
    case_params,
    check_text,
    clock_lines,
    format_speedup,
    headline_text,
    named_time,
    ratio_text,
)

__all__ = ["Run", "case_params", "fleet_matrix", "headline", "load_run", "render", "summary_rows", "write_report"]

TELEMETRY_PANELS = (
    ("power_w", "power (W)"),
    ("sm_clock_mhz", "SM clock (MHz)"),
    ("temp_c", "temperature (C)"),
    ("mem_used_mb", "memory used (MiB)"),
)


# How the templates are compiled: jinja2 keys its bytecode cache on a template's name and source
# only, so these go into the cache files' names (an upgrade or a changed option compiles anew).
class _Options(TypedDict):
    autoescape: bool
    trim_blocks: bool
    lstrip_blocks: bool


_TEMPLATE_OPTIONS: _Options = {"autoescape": True, "trim_blocks": True, "lstrip_blocks": True}


class _TemplateCache(jinja2.FileSystemBytecodeCache):
    """The templates compiled once per user (jinja2's per-user temporary folder): compiling them
    took 0.4 s of every report. A cache that cannot be written (a full disk, a read-only temporary
    folder) or read back (a file cut short) costs only the time it would have saved, never the
    report."""

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except Exception:  # noqa: BLE001 - a damaged cache file: compile from the template
            bucket.reset()

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().dump_bytecode(bucket)
        except OSError:
            pass


def _template_cache() -> jinja2.BytecodeCache | None:
    key = hashlib.sha256(repr((jinja2.__version__, sorted(_TEMPLATE_OPTIONS.items()))).encode()).hexdigest()[:12]
    try:
        return _TemplateCache(pattern=f"__gpubench_{key}_%s.cache")
    except (OSError, RuntimeError):  # no safe per-user temporary folder: compile each time
        return None


_TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).with_name("templates")),
    bytecode_cache=_template_cache(),
    undefined=jinja2.StrictUndefined,
    **_TEMPLATE_OPTIONS,
)


def _arrows(text: str) -> markupsafe.Markup:
    """``text`` escaped, each ``->`` unbreakable: a narrow page wrapped "8 -> 32" as "8 - / > 32"."""
    return markupsafe.Markup(str(markupsafe.escape(text)).replace("-&gt;", '<span class="nw">-&gt;</span>'))


_TEMPLATES.filters["arrows"] = _arrows


@dataclass
class Run:
    """A run directory as the report sees it."""

    path: Path
    record: RunRecord
    env: dict[str, Any] | None
    telemetry: pd.DataFrame | None  # None when there is none; telemetry_note says why
    telemetry_note: str | None


def load_run(path: str | Path, registry: Registry | None = None) -> Run:
    """Read a run directory (or its results.json); BadInput when results.json is missing,
    corrupt or of another schema version. A missing env.json or telemetry.csv is not an error:
    the report says so. ``registry``: the caller's (the CLI's), for an old run's declarations and
    a technique's own figure function (:attr:`gpubench.records.results.RunRecord.registry`)."""
    path = Path(path)
    record = load_record(path, registry)
    root = path if path.is_dir() else path.parent
    frame, note = _read_telemetry(root, record)
    return Run(root, record, _read_env(root, record), frame, note)


def _read_env(root: Path, run: RunRecord) -> dict[str, Any] | None:
    try:
        return json.loads((root / "env.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return run.env or None


def _read_telemetry(root: Path, run: RunRecord) -> tuple[pd.DataFrame | None, str | None]:
    summary = run.telemetry
    if summary is None or not summary.available:
        return None, (summary.reason if summary is not None else None) or "the run recorded no telemetry"
    import pandas as pd

    try:
        frame = pd.read_csv(root / "telemetry.csv")
    except FileNotFoundError:
        return None, "telemetry.csv is missing from the run directory"
    except (OSError, ValueError) as exc:
        return None, f"telemetry.csv cannot be read ({exc})"
    if frame.empty or "t_s" not in frame:
        return None, "no samples were recorded"
    return frame, None


def _date(iso: str | None) -> str:
    if iso is None:
        return "-"
    try:
        return _dt.datetime.fromisoformat(iso).astimezone(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    except (TypeError, ValueError):
        return iso or "-"


# -- headline and summary table (shared with summary.md) -------------------------------------
def _by_technique(cases: list[CaseRecord]) -> dict[str, list[CaseRecord]]:
    grouped: dict[str, list[CaseRecord]] = {}
    for case in cases:
        grouped.setdefault(case.technique, []).append(case)
    return grouped


def _warnings(run: RunRecord) -> list[str]:
    """What belongs at the top: a run that did not complete, the run's own warnings, a GPU that
    throttled."""
    warnings = []
    if run.status != "complete":
        why = run.abort_reason or {
            "running": "still writing, or the process died",
            "interrupted": "stopped by Ctrl-C",
        }.get(run.status, "")
        warnings.append(f"run {run.status}" + (f": {why}" if why else "") + "; not every case may have run.")
    warnings += [str(w) for w in run.warnings]
    if run.not_run:
        warnings.append(
            f"{not_run_text(run.not_run)}: the run's --budget of {duration_text(run.budget_s or 0.0)} "
            "could not hold them, so they were never started (listed under the counts; neither passed "
            "nor failed, and missing to the gate)."
        )
    tele = run.telemetry
    if tele is not None and tele.throttled:
        share = tele.throttled_fraction
        warnings.append(
            "the GPU throttled during the run ("
            + ", ".join(tele.throttle_reasons)
            + (f", {share:.0%} of samples" if isinstance(share, (int, float)) else "")
            + "): timings may be slower than the hardware allows."
        )
    return warnings


def headline(doc: RunRecord | Mapping[str, Any]) -> dict[str, Any]:
    """Scenario, device, date, pass/fail counts, one line per technique by its own headline
    figure (time, or what it declared, e.g. KV utilization), the best and worst speedups over the
    techniques read by time, the timed calls' share of the wall time, the published claims, and
    warnings that belong at the top (a run that did not complete, a GPU that throttled)."""
    run = as_run(doc)
    labels = Labels(run)
    counts = run.summary
    grouped = _by_technique(run.cases)
    read_by = {name: sweep.headline_figures(run.technique(name)) for name in grouped}
    lines = [
        {"name": name, "text": sweep.technique_line(group, read_by[name]), "by_time": not read_by[name]}
        for name, group in grouped.items()
    ]
    timed = [
        (r, labels.label(c))
        for c in run.cases
        if c.passed and not read_by[c.technique]
        for r in [c.speedup(c.role_variant("optimized"))]
        if r
    ]
    # Best and worst only over speedups with a CI: one timed call a variant is no headline.
    measured = [(float(r.ratio or 0.0), label) for r, label in timed if r.has_interval]
    few = [r.n for r, _ in timed if not r.has_interval]
    claim_rows = claims.claim_rows(run)
    judged, not_in_run = claims.split(claim_rows)
    return {
        "scenario": run.scenario.get("name", "?"),
        "description": run.scenario.get("description") or "",
        "device": run.device_label or run.device or "?",
        "date": _date(run.started_at),
        "duration": run.wall_time_text(),
        "run_id": run.run_id,
        "status": run.status or "unknown",
        "cases": counts["cases"],
        "passed": counts["passed"],
        "failed": counts["failed"],
        "interrupted": counts["interrupted"],
        "not_run": counts["not_run"],
        **_never_reached(run),
        "not_run_cases": [
            {"label": f"{c.technique} {c.id[len(c.technique) :]}", "reason": c.reason, "need": c.need_text()}
            for c in run.not_run
        ],
        "best": _extreme(max, measured),
        "worst": _extreme(min, measured),
        "techniques": lines,
        "too_few_samples": sweep.too_few_text(few) if few else "",
        "not_by_time": [line["name"] for line in lines if not line["by_time"]],
        "ceilings": _ceilings_text(run.ceilings),
        "warnings": _warnings(run),
        "on_cpu": run.device == "cpu",
        "claims": claim_rows,
        "claims_judged": judged,
        "claims_not_in_run": not_in_run,
        "claims_folded": claims.not_in_run_line(claim_rows),
        "timed_share": phases.run_text(run),
        "clocks": [line.removeprefix("time: ") for line in clock_lines(run)],
    }


def _never_reached(run: RunRecord) -> dict[str, Any]:
    """The cases a run planned and never reached (killed, stopped by Ctrl-C or an abort; not the
    ones a --budget left out, counted apart): ``not_started`` of ``planned``, and why in a few
    words; 0 for a run that reached all it planned, or that did not record its plan."""
    planned = run.planned_cases
    missing = planned - len(run.cases) - len(run.not_run) if isinstance(planned, int) else 0
    if missing <= 0:
        return {"planned": planned, "not_started": 0, "not_started_why": ""}
    why = run.abort_reason or {
        "running": "the run never finished: killed, or still going",
        "interrupted": "stopped by Ctrl-C",
    }.get(run.status or "", f"run {run.status}")
    return {"planned": planned, "not_started": missing, "not_started_why": why}


def _extreme(pick: Callable, measured: list[tuple[float, str]]) -> str:
    if not measured:
        return "-"
    ratio, label = pick(measured, key=lambda m: m[0])
    return f"{ratio_text(ratio)}x ({label})"


def _ceilings_text(ceilings: dict[str, Any] | None) -> str:
    if not ceilings:
        return "not measured (--no-calibrate)"
    if "error" in ceilings:
        return f"calibration failed: {ceilings['error']}"
    matmul, copy = ceilings.get("matmul") or {}, ceilings.get("copy") or {}
    parts = []
    if matmul.get("peak_tflops"):
        at = f" (n={matmul['n']})" if matmul.get("n") else ""
        parts.append(f"{matmul['peak_tflops']:.3g} TFLOP/s {matmul.get('dtype', '')} matmul{at}")
    if copy.get("peak_gbps"):
        parts.append(f"{copy['peak_gbps']:.4g} GB/s copy")
    return ", ".join(parts) or "-"


def _pair(case: CaseRecord, read: Callable[[Any], Any], fmt: Callable[[float], str]) -> list[str]:
    """The baseline's and the optimized variant's figure (``read`` of its record), formatted;
    empty when neither has it."""
    values = [
        read(v) if v is not None else None
        for v in (case.variant(case.role_variant("baseline")), case.variant(case.role_variant("optimized")))
    ]
    if all(v is None for v in values):
        return []
    return ["-" if v is None else fmt(v) for v in values]


def energy_text(mj: float) -> str:
    """Energy per call in the unit that reads best: 137 mJ, 80.3 J."""
    return f"{mj / 1000:.3g} J" if abs(mj) >= 1000 else f"{mj:.3g} mJ"


def _energy_cell(v: Any) -> str | None:
    """A variant's energy per call, marked where it was taken over its timed calls; None if none."""
    if v.energy_mj_per_call is None:
        return None
    timed = v.energy is not None and v.energy.method == METHOD_TIMED_CALLS
    return energy_text(v.energy_mj_per_call) + (markdown.TIMED_CALLS_MARK if timed else "")


def summary_rows(doc: RunRecord | Mapping[str, Any], labels: Labels | None = None) -> list[dict[str, Any]]:
    """One row per case, numbered in run order: params, medians, speedup with CI, headline metric,
    check, peak memory and energy (baseline / optimized), status and failure reason. The
    ``*_parts`` keys hold the same figures in pieces the HTML table may wrap between."""
    run = as_run(doc)
    labels = labels or Labels(run)
    rows = []
    for number, case in enumerate(run.cases, 1):
        base, opt = case.role_variant("baseline"), case.role_variant("optimized")
        speedup = format_speedup(case.speedup(opt))
        memory = _pair(case, lambda v: v.peak_memory_bytes, human_bytes)
        energy = _pair(case, _energy_cell, str)
        optimized = case.variant(opt)
        rows.append(
            {
                "number": number,
                "id": case.id,
                "technique": case.technique,
                "params": labels.params(case),
                "baseline": named_time(case, base),
                "optimized": named_time(case, opt),
                "speedup": speedup,
                "speedup_parts": speedup.split(" ", 1),
                "headline": headline_text(case, base, opt),
                "check": check_text(case, opt).plain if opt else "-",
                "check_passed": optimized.passed_check if optimized is not None else None,
                "memory": " / ".join(memory) or "-",
                "memory_parts": memory,
                "energy": " / ".join(energy) or "-",
                "energy_parts": energy,
                "energy_over_timed_calls": any(e.endswith(markdown.TIMED_CALLS_MARK) for e in energy),
                "status": case.status or "?",
                "failed": not case.passed,
                "device": case.device_label or run.device_label or "?",
                "reason": "" if case.passed or case.failure is None else case.failure.message,
                "why": profile_view.why(case),
            }
        )
    return rows


# -- telemetry ---------------------------------------------------------------------------------
def telemetry_section(run: Run) -> dict[str, Any]:
    """Power, SM clock, temperature and memory over time with each case's span shaded, and the
    throttle reasons that fired (run-wide and per case)."""
    record = run.record
    summary = record.telemetry or RunTelemetry()
    numbers = {c.id: n for n, c in enumerate(record.cases, 1)}
    labels = Labels(record)
    throttled_cases = [
        f"#{numbers[c.id]} {labels.label(c)}: " + ", ".join(c.telemetry.throttle_reasons)
        for c in record.cases
        if c.telemetry is not None and c.telemetry.throttled
    ]
    section = {
        "available": run.telemetry is not None,
        "note": f"telemetry unavailable: {run.telemetry_note}",
        "figure": None,
        "reasons": summary.throttle_reasons,
        "benign": summary.benign_reasons,
        "throttled_cases": throttled_cases,
        "samples": summary.n_samples,
        "interval": summary.interval_s,
    }
    if run.telemetry is None:
        return section
    section["figure"] = _telemetry_figure(run.telemetry, numbers, (summary.interval_s or 0.0) / 2)
    if section["figure"] is None:
        section.update(
            available=False,
            note="telemetry unavailable: the samples hold no power, clock, temperature or memory readings.",
        )
    return section


def _telemetry_figure(frame: pd.DataFrame, numbers: dict[str, int], half: float) -> Figure | None:
    import pandas as pd

    t = pd.to_numeric(frame["t_s"], errors="coerce")
    t = (t - t.min()).tolist()
    spans = []
    case_col = frame["case"] if "case" in frame else pd.Series([None] * len(frame))
    for case_id, rows in itertools.groupby(zip(t, case_col), key=lambda r: r[1]):
        times = [r[0] for r in rows]
        if case_id in numbers:
            spans.append((times[0] - half, times[-1] + half, f"#{numbers[case_id]}"))
    reasons = frame["throttle_reasons"].fillna("") if "throttle_reasons" in frame else pd.Series([""] * len(frame))
    throttled_t = [ts for ts, r in zip(t, reasons) if set(str(r).split("|")) - BENIGN_REASONS - {""}]
    panels = [
        (label, pd.to_numeric(frame[col], errors="coerce").tolist()) for col, label in TELEMETRY_PANELS if col in frame
    ]
    return drawn(
        "telemetry over the run (shaded: cases, numbered as in the summary table)",
        charts.telemetry_timeline,
        t,
        panels,
        spans,
        throttled_t,
    )


# -- the document ------------------------------------------------------------------------------
def compare_runs(current: RunRecord | Mapping[str, Any], other: RunRecord | Mapping[str, Any]) -> dict[str, Any]:
    """Both runs side by side (:func:`gpubench.reports.comparison.compare_runs`)."""
    return side_by_side.compare_runs(as_run(current), as_run(other), headline)


def fleet_matrix(docs: Sequence[RunRecord | Mapping[str, Any]]) -> dict[str, Any] | None:
    """The technique x device matrix (:func:`gpubench.reports.comparison.fleet_matrix`)."""
    return side_by_side.fleet_matrix([as_run(d) for d in docs])


def answer_section(record: RunRecord) -> markupsafe.Markup:
    """The answer's section of the page (answer.html.j2), "" where the run has none. A fault in
    building or drawing it costs that section only: it reads "answer table unavailable: <error>"
    (logged), and the rest of the report is written."""
    try:
        ans = answer.answer(record)
        if ans is None:
            return markupsafe.Markup("")
        return markupsafe.Markup(_TEMPLATES.get_template("answer.html.j2").render(answer=ans))
    except Exception as exc:  # noqa: BLE001 - the rest of the report still follows
        text = markupsafe.escape(answer.unavailable(exc, "report.html"))
        return markupsafe.Markup('<section id="answer"><p class="note">') + text + markupsafe.Markup("</p></section>")


def render(
    run: Run,
    other: Run | None = None,
    comparison: dict[str, Any] | None = None,
    more: Sequence[Run] = (),
    output_dir: Path | None = None,
    trends: RunTrends | None = None,
) -> str:
    """The report as one HTML string: with a comparison section when ``other`` is given, a
    technique x device matrix when the cases span several device models (``more``: further runs),
    and a sparkline per case from ``trends`` (the history store's, read by :func:`write_report`)."""
    figure_cache.new_page()
    record = run.record
    if other is not None and comparison is None:
        comparison = compare_runs(record, other.record)
    labels = Labels(record)
    rows = summary_rows(record, labels)
    _add_sparklines(rows, trends)
    others = [r.record for r in ([other] if other is not None else []) + list(more)]
    head = headline(record)
    sections = technique_sections(record, rows, labels)
    lines = {line["name"]: line["text"] for line in head["techniques"]}
    # A large sweep's cases fold into one row of the summary table; its section holds them all.
    collapsed = {
        t["name"]: {
            "first": t["rows"][0]["number"],
            "last": t["rows"][-1]["number"],
            "count": t["count"],
            "text": lines[t["name"]],
        }
        for t in sections
        if t["large"]
    }
    # Columns no case fills are left out, so the table fits the page with the ones that say something.
    show = {
        "show_device": len({r["device"] for r in rows}) > 1,
        "show_headline": any(r["headline"] or r["why"] for r in rows),
        "show_memory": any(r["memory"] != "-" for r in rows),
        "show_energy": any(r["energy"] != "-" for r in rows),
        "show_history": any(r["sparkline"] for r in rows),
    }
    energy_note = markdown.TIMED_CALLS_NOTE if any(r["energy_over_timed_calls"] for r in rows) else None
    context = {
        "answer": answer_section(record),
        "head": head,
        "rows": rows,
        "fleet": side_by_side.fleet_matrix([record, *others]),
        **show,
        "columns": 6 + sum(show.values()),
        "collapsed": collapsed,
        "techniques": sections,
        "telemetry": telemetry_section(run),
        "profiles": profile_view.tables_by_technique(record, _link_base(run.path, output_dir)),
        "env": json.dumps(run.env, indent=2, default=str) if run.env else None,
        "scenario": json.dumps(record.scenario or None, indent=2, default=str),
        "comparison": comparison,
        "comparison_figure": side_by_side.comparison_figure(comparison) if comparison else None,
        "other_run": str(other.path) if other else "",
        "history_note": trends.note if trends else None,
        "energy_note": energy_note,
        "generated": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    return _TEMPLATES.get_template("report.html.j2").render(**context)


def _add_sparklines(rows: list[dict[str, Any]], trends: RunTrends | None) -> None:
    """Each summary row's ``sparkline``: the case's SVG line over the history, "" without one."""
    lines = trends.lines if trends else {}
    for row in rows:
        line = lines.get(row["id"])
        row["sparkline"] = sparkline_svg(line.values, line.current, line.metric) if line else ""


def _link_base(run_dir: Path, output_dir: Path | None) -> str:
    """The run directory as a link prefix from the report's directory ("" when beside it)."""
    if output_dir is None:
        return ""
    rel = os.path.relpath(Path(run_dir).resolve(), Path(output_dir).resolve())
    return "" if rel == "." else Path(rel).as_posix() + "/"


@dataclass
class Written:
    html: Path
    markdown: Path


def write_report(
    run_dir: str | Path,
    output: str | Path | None = None,
    compare: str | Path | Sequence[str | Path] | None = None,
    *,
    history_store: str | None = None,
    read_history: bool = True,
    registry: Registry | None = None,
) -> Written:
    """Write the report (default ``RUN_DIR/report.html``) and ``summary.md`` beside it. With one
    other run, a comparison; with several, the technique x device matrix over all of them. Each
    case's sparkline comes from the history store ``history_store`` (None: the default one; not
    read with ``read_history=False``); whatever goes wrong there costs the sparklines, never the report.
    ``registry``: the caller's technique registry (:func:`load_run`); the report never imports one."""
    run = load_run(run_dir, registry)
    trends = run_trends(run.record, run.path / "results.json", history_store, read=read_history)
    paths = [compare] if isinstance(compare, (str, Path)) else list(compare or [])
    loaded = [load_run(p, registry) for p in paths]
    other = loaded[0] if len(loaded) == 1 else None
    compared = compare_runs(run.record, other.record) if other else None
    html_path = Path(output) if output is not None else run.path / "report.html"
    md_path = html_path.with_name("summary.md")
    text = render(
        run, other, compared, more=() if other is not None else loaded, output_dir=html_path.parent, trends=trends
    )
    summary = markdown.render_summary(
        headline(run.record), summary_rows(run.record), compared, answer=markdown.guarded_answer(run.record)
    )
    write_pages([(html_path, text), (md_path, summary)], "the report", "-o/--out")
    return Written(html_path, md_path)


def write_pages(pages: Sequence[tuple[Path, str]], what: str, option: str) -> None:
    """Write each (path, text), atomically. A path that cannot be written is bad input naming it
    and ``option`` (exit 2); a full disk is not (DiskFull: exit 74)."""
    for path, text in pages:
        try:
            atomic_write_text(path, text)
        except DiskFull:
            raise  # not bad input: the CLI says so, exit 74
        except OSError as exc:
            raise BadInput(
                f"{path}: cannot write {what} there ({exc.strerror or exc}); give a writable file with {option}."
            ) from None
