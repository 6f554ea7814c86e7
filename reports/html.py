"""The HTML report of a run directory: one self-contained file (inline CSS, inline SVG figures).

It reads what the run wrote (``results.json``, ``telemetry.csv``, ``env.json``) and never re-runs
anything. :func:`load_run` reads the directory; the functions below turn result documents into
the template's context (pure: documents in, plain dicts of strings and numbers out); :func:`render`
fills ``templates/report.html.j2``; :func:`write_report` writes ``report.html`` and, beside it,
``summary.md``. Everything taken from results (params, descriptions, failure messages) is escaped
by jinja2's autoescaping; only matplotlib's SVG markup is inserted as it is.
"""
from __future__ import annotations

import datetime as _dt
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import jinja2
import pandas as pd

from gpubench import compare as gate
from gpubench import techniques
from gpubench.atomic import DiskFull, atomic_write_text
from gpubench.errors import BadInput
from gpubench.reports import claims, figures, markdown, phases, profile_view, sweep
from gpubench.reports.kv_table import human_bytes
from gpubench.reports.terminal import (shown_by_technique, case_params, check_text, format_seconds,
                                       format_speedup, headline_text, named_time, param_text, shown_params)
from gpubench.results import load_results, role_variant
from gpubench.telemetry import BENIGN_REASONS

TELEMETRY_PANELS = (("power_w", "power (W)"), ("sm_clock_mhz", "SM clock (MHz)"),
                    ("temp_c", "temperature (C)"), ("mem_used_mb", "memory used (MiB)"))
# The gate's verdicts, in the order the comparison lists them, and how the report words them.
COMPARE_ORDER = ("regressed", "failed", "no_samples", "unchanged", "improved")
VERDICT_TEXT = {"regressed": "regressed", "failed": "failed now", "no_samples": "not comparable",
                "unchanged": "unchanged", "improved": "improved"}

_TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
)


@dataclass
class Run:
    """A run directory as the report sees it."""

    path: Path
    doc: dict[str, Any]
    env: dict[str, Any] | None
    telemetry: pd.DataFrame | None  # None when there is none; telemetry_note says why
    telemetry_note: str | None


def load_run(path: str | Path) -> Run:
    """Read a run directory (or its results.json); BadInput when results.json is missing or
    corrupt. A missing env.json or telemetry.csv is not an error: the report says so."""
    path = Path(path)
    doc = load_results(path)
    root = path if path.is_dir() else path.parent
    frame, note = _read_telemetry(root, doc)
    return Run(root, doc, _read_env(root, doc), frame, note)


def _read_env(root: Path, doc: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return json.loads((root / "env.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return doc.get("env")


def _read_telemetry(root: Path, doc: dict[str, Any]) -> tuple[pd.DataFrame | None, str | None]:
    summary = doc.get("telemetry") or {}
    if summary.get("status") != "ok":
        return None, summary.get("reason") or "the run recorded no telemetry"
    try:
        frame = pd.read_csv(root / "telemetry.csv")
    except FileNotFoundError:
        return None, "telemetry.csv is missing from the run directory"
    except (OSError, ValueError) as exc:
        return None, f"telemetry.csv cannot be read ({exc})"
    if frame.empty or "t_s" not in frame:
        return None, "no samples were recorded"
    return frame, None


# -- small readers of a case record ----------------------------------------------------------
def _median(case: dict[str, Any], name: str | None) -> float | None:
    return (((case.get("variants", {}).get(name) or {}).get("stats")) or {}).get("median") if name else None


def _samples(case: dict[str, Any], name: str | None) -> list[float]:
    raw = (case.get("variants", {}).get(name) or {}).get("samples_s") or [] if name else []
    return [x for x in raw if isinstance(x, (int, float)) and math.isfinite(x)]


_ratio = sweep.speedup_of


_OFF = (0, False, None, "")  # defaults that mean "off" or "as the others say" (seq_len_q=0: seq_len)


def _params(case: dict[str, Any], shown: set[str] | None) -> str:
    """The case's params as the report labels it: those that tell the technique's cases apart
    (``shown``), less those left at a default that means off or "the same as" (causal=False,
    block_m=0); two cases still differ in a param at least one of them sets."""
    tech = techniques.find(case["technique"], case.get("source", ""))
    defaults = tech.defaults() if tech is not None else {}
    params = case["params"]
    keep = {k for k in (params if shown is None else shown)
            if not (k in defaults and params.get(k) == defaults[k] and defaults[k] in _OFF)}
    return case_params(case, keep)


def _label(case: dict[str, Any], shown: dict[str, set[str]]) -> str:
    return f"{case['technique']} {_params(case, shown.get(case['technique']))}".strip()


def _date(iso: str | None) -> str:
    try:
        return _dt.datetime.fromisoformat(iso).astimezone(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    except (TypeError, ValueError):
        return iso or "-"


def _duration(doc: dict[str, Any]) -> str:
    try:
        start, end = (_dt.datetime.fromisoformat(doc[k]) for k in ("started_at", "finished_at"))
    except (KeyError, TypeError, ValueError):
        return "-"
    return format_seconds((end - start).total_seconds()) if end >= start else "-"


# -- headline and summary table (shared with summary.md) -------------------------------------
def _by_technique(cases: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for case in cases:
        grouped.setdefault(case["technique"], []).append(case)
    return grouped


def _read_by(name: str, cases: list[dict[str, Any]]) -> tuple[Any, ...]:
    """The figures a technique is read by (empty: time), from the registered technique."""
    return sweep.headline_figures(techniques.find(name, cases[0].get("source", "")))


def headline(doc: dict[str, Any]) -> dict[str, Any]:
    """Scenario, device, date, pass/fail counts, one line per technique by its own headline
    figure (time, or what it declares, e.g. KV utilization), the best and worst speedups over the
    techniques read by time, the timed calls' share of the wall time, the published claims, and
    warnings that belong at the top (a run that did not complete, a GPU that throttled)."""
    cases = doc.get("cases", [])
    shown = shown_by_technique(doc)
    counts = {s: sum(c.get("status") == s for c in cases) for s in ("passed", "failed", "interrupted")}
    grouped = _by_technique(cases)
    read_by = {name: _read_by(name, group) for name, group in grouped.items()}
    lines = [{"name": name, "text": sweep.technique_line(group, read_by[name]), "by_time": not read_by[name]}
             for name, group in grouped.items()]
    measured = [(r["ratio"], _label(c, shown)) for c in cases if c.get("status") == "passed"
                and not read_by[c["technique"]] for r in [_ratio(c, role_variant(c, "optimized"))] if r]
    warnings = []
    status = doc.get("status", "unknown")
    if status != "complete":
        why = doc.get("abort_reason") or {"running": "still writing, or the process died",
                                          "interrupted": "stopped by Ctrl-C"}.get(status, "")
        warnings.append(f"run {status}" + (f": {why}" if why else "") + "; not every case may have run.")
    warnings += [str(w) for w in doc.get("warnings") or []]
    tele = doc.get("telemetry") or {}
    if tele.get("throttled"):
        share = tele.get("throttled_fraction")
        warnings.append("the GPU throttled during the run (" + ", ".join(tele.get("throttle_reasons", []))
                        + (f", {share:.0%} of samples" if isinstance(share, (int, float)) else "")
                        + "): timings may be slower than the hardware allows.")
    scenario = doc.get("scenario") or {}
    claim_rows = claims.claim_rows(doc)
    judged, not_in_run = claims.split(claim_rows)
    return {
        "scenario": scenario.get("name", "?"), "description": scenario.get("description") or "",
        "device": doc.get("device_label") or doc.get("device", "?"), "date": _date(doc.get("started_at")),
        "duration": _duration(doc), "run_id": doc.get("run_id", ""), "status": status,
        "cases": len(cases), **counts,
        "best": _extreme(max, measured), "worst": _extreme(min, measured), "techniques": lines,
        "not_by_time": [line["name"] for line in lines if not line["by_time"]],
        "ceilings": _ceilings_text(doc.get("ceilings")), "warnings": warnings,
        "on_cpu": doc.get("device") == "cpu", "claims": claim_rows, "claims_judged": judged,
        "claims_not_in_run": not_in_run, "claims_folded": claims.not_in_run_line(claim_rows),
        "timed_share": phases.run_text(doc),
    }


def _extreme(pick: Callable, measured: list[tuple[float, str]]) -> str:
    if not measured:
        return "-"
    ratio, label = pick(measured, key=lambda m: m[0])
    return f"{ratio:.2f}x ({label})"


def _ceilings_text(ceilings: dict[str, Any] | None) -> str:
    if not ceilings:
        return "not measured (--no-calibrate)"
    if "error" in ceilings:
        return f"calibration failed: {ceilings['error']}"
    parts = []
    if (ceilings.get("matmul") or {}).get("peak_tflops"):
        parts.append(f"{ceilings['matmul']['peak_tflops']:.3g} TFLOP/s {ceilings['matmul'].get('dtype', '')} matmul")
    if (ceilings.get("copy") or {}).get("peak_gbps"):
        parts.append(f"{ceilings['copy']['peak_gbps']:.4g} GB/s copy")
    return ", ".join(parts) or "-"


def _pair(variants: dict[str, Any], base: str | None, opt: str | None, key: str,
          fmt: Callable[[float], str]) -> list[str]:
    """The baseline's and the optimized variant's ``key``, formatted; empty when neither has it."""
    values = [(variants.get(n) or {}).get(key) if n else None for n in (base, opt)]
    if all(v is None for v in values):
        return []
    return ["-" if v is None else fmt(v) for v in values]


def energy_text(mj: float) -> str:
    """Energy per call in the unit that reads best: 137 mJ, 80.3 J."""
    return f"{mj / 1000:.3g} J" if abs(mj) >= 1000 else f"{mj:.3g} mJ"


def summary_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per case, numbered in run order: params, medians, speedup with CI, headline metric,
    check, peak memory and energy (baseline / optimized), status and failure reason. The
    ``*_parts`` keys hold the same figures in pieces the HTML table may wrap between."""
    shown = shown_by_technique(doc)
    rows = []
    for number, case in enumerate(doc.get("cases", []), 1):
        variants = case.get("variants", {})
        base, opt = role_variant(case, "baseline"), role_variant(case, "optimized")
        passed = case.get("status") == "passed"
        speedup = format_speedup(_ratio(case, opt))
        memory = _pair(variants, base, opt, "peak_memory_bytes", human_bytes)
        energy = _pair(variants, base, opt, "energy_mj_per_call", energy_text)
        rows.append({
            "number": number, "id": case["id"], "technique": case["technique"],
            "params": _params(case, shown.get(case["technique"])),
            "baseline": named_time(case, base), "optimized": named_time(case, opt),
            "speedup": speedup, "speedup_parts": speedup.split(" ", 1), "headline": headline_text(case, base, opt),
            "check": check_text(case, opt).plain if opt else "-",
            "check_passed": ((variants.get(opt) or {}).get("check") or {}).get("passed"),
            "memory": " / ".join(memory) or "-", "memory_parts": memory,
            "energy": " / ".join(energy) or "-", "energy_parts": energy,
            "status": case.get("status", "?"), "failed": not passed, "device": gate.case_device(case, doc),
            "reason": "" if passed else (case.get("failure") or {}).get("message", ""),
            "why": profile_view.why(case),
        })
    return rows


# -- one section per technique ----------------------------------------------------------------
def _figure(title: str, fig: Any) -> dict[str, str | None] | None:
    """A figure for the template: its SVG, or None when there is no figure or it has no data: the
    report leaves out what it cannot draw rather than show an empty frame."""
    if fig is None or figures.mark_data(fig) == 0:
        if fig is not None:
            figures.close(fig)
        return None
    return {"title": title, "svg": figures.to_svg(fig), "note": None}


def speedup_figure(cases: list[dict[str, Any]], labels: list[str]) -> dict[str, str | None] | None:
    """Speedup against the swept numeric param (one line per combination of the other varying
    params); without a numeric sweep (one case, categorical params) one point per case."""
    title = "speedup of optimized over baseline (95% CI)"
    points = [(c, r, label) for c, label in zip(cases, labels)
              for r in [_ratio(c, role_variant(c, "optimized"))] if r]
    if not points:
        return None
    params = list(dict.fromkeys(k for c, _, _ in points for k in c["params"]))
    varying = [k for k in params if len({repr(c["params"].get(k)) for c, _, _ in points}) > 1]
    numeric = [k for k in varying if all(isinstance(c["params"].get(k), (int, float))
                                         and not isinstance(c["params"].get(k), bool) for c, _, _ in points)]
    if numeric:
        x = max(numeric, key=lambda k: len({c["params"][k] for c, _, _ in points}))
        series: dict[str, list[tuple[float, float, float, float]]] = {}
        for c, r, _ in points:
            key = " ".join(param_text(c["params"], k) for k in varying if k != x)
            series.setdefault(key, []).append((c["params"][x], r["ratio"], r["ci_low"], r["ci_high"]))
        return _figure(f"{title} vs {x}", figures.speedup_sweep(series, x))
    ratios = [(r["ratio"], r["ci_low"], r["ci_high"]) for _, r, _ in points]
    fig = figures.ratio_points([p[2] for p in points], *zip(*ratios), x_label="speedup over baseline (x)")
    return _figure(title, fig)


def latency_figure(cases: list[dict[str, Any]], labels: list[str]) -> dict[str, str | None] | None:
    rows = [(label, {n: _samples(c, n) for n in (role_variant(c, "baseline"), role_variant(c, "optimized")) if n})
            for c, label in zip(cases, labels)]
    return _figure("time per call, raw samples (box: quartiles, line: median)", figures.latency_boxes(rows))


def peak_figure(cases: list[dict[str, Any]], labels: list[str]) -> dict[str, str | None] | None:
    roles = ("baseline", "optimized")
    def metric(case: dict[str, Any], role: str, key: str) -> Any:
        return ((case["variants"].get(role_variant(case, role)) or {}).get("metrics") or {}).get(key)

    panels = {title: {role: [metric(c, role, key) for c in cases] for role in roles}
              for key, title in (("pct_peak_flops", "% of measured peak FLOP/s"),
                                 ("pct_peak_bandwidth", "% of measured peak bandwidth"))}
    return _figure("share of the measured device peak", figures.peak_bars(labels, panels))


def technique_figures(tech: Any, cases: list[dict[str, Any]]) -> list[dict[str, str | None]]:
    """The figures the technique declares (``plots``), then those of its own hook
    (``figures_fn``), each left out when the run holds no data for it. A figure that fails to draw
    costs that figure only, with the reason shown."""
    if tech is None:
        return []
    out = []
    for plot in tech.plots:
        try:
            out.append(_figure(plot.title, figures.declared(plot, cases, tech.defaults())))
        except Exception as exc:  # noqa: BLE001 - a figure never takes the report down
            out.append({"title": plot.title, "svg": None, "note": f"the figure failed: {type(exc).__name__}: {exc}"})
    if tech.figures_fn is not None:
        try:
            with figures.styled():
                made = list(tech.figures_fn(cases))
            out += [_figure(str(title), fig) for title, fig in made]
        except Exception as exc:  # noqa: BLE001 - a technique's hook never takes the report down
            out.append({"title": f"{tech.name} figures", "svg": None,
                        "note": f"the technique's figure hook failed: {type(exc).__name__}: {exc}"})
    return [fig for fig in out if fig is not None]


def variant_rows(case: dict[str, Any], number: int) -> list[dict[str, Any]]:
    rows = []
    for name, v in case.get("variants", {}).items():
        s = v.get("stats") or {}
        rows.append({"case": number, "variant": name, "role": v.get("role", ""), "status": v.get("status", ""),
                     "reason": v.get("reason") or "", "median": format_seconds(s.get("median")),
                     "ci": (f"[{format_seconds(s.get('ci_low'))}, {format_seconds(s.get('ci_high'))}]" if s else ""),
                     "n": s.get("n", 0), "speedup": format_speedup(_ratio(case, name)),
                     "check": check_text(case, name).plain})
    return rows


def _sentence(text: str) -> str:
    """``text`` on one line, ending as a sentence ends (a full stop added where it has none)."""
    text = " ".join(text.split())
    return text if not text or text[-1] in ".!?" else text + "."


def variant_descriptions(cases: list[dict[str, Any]]) -> list[dict[str, str]]:
    """What each variant runs, in full as the run recorded it: the baseline and the optimized
    variant first, then the peers that were timed."""
    seen: dict[str, dict[str, str]] = {}
    for case in cases:
        for name, v in (case.get("variants") or {}).items():
            role = v.get("role", "")
            if name not in seen and (role != "peer" or v.get("stats")):
                seen[name] = {"name": name, "role": role, "description": v.get("description") or ""}
    order = {"baseline": 0, "optimized": 1}
    return sorted(seen.values(), key=lambda d: order.get(d["role"], 2))


def _extreme_rows(found: list[sweep.Reading], numbers: dict[int, int], shown: set[str] | None) -> list[dict[str, Any]]:
    return [{"number": numbers[id(r.case)], "params": _params(r.case, shown), "figure": r.text,
             "baseline": named_time(r.case, role_variant(r.case, "baseline")),
             "optimized": named_time(r.case, role_variant(r.case, "optimized"))} for r in found]


def technique_sections(doc: dict[str, Any], rows: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Per technique: what it does and what each variant runs, the published figure, a CPU
    caveat where the win is GPU-specific, generic figures, its own figures, and every variant of
    every case. A technique with more than :data:`sweep.LARGE` cases reads as a sweep: the surface
    of its headline figure over the swept params and its best and worst cases come first; its
    per-case rows (``rows``: the summary table's) and per-case figures sit in collapsed sections."""
    shown = shown_by_technique(doc)
    rows = summary_rows(doc) if rows is None else rows
    by_technique: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for number, case in enumerate(doc.get("cases", []), 1):
        by_technique.setdefault(case["technique"], []).append((number, case))
    sections = []
    for name, group in by_technique.items():
        cases = [c for _, c in group]
        labels = [f"#{n} {_params(c, shown.get(name))}".strip() for n, c in group]
        tech = techniques.find(name, cases[0].get("source", ""))
        read_by = sweep.headline_figures(tech)
        large = len(cases) > sweep.LARGE
        per_case = [f for f in (latency_figure(cases, labels), peak_figure(cases, labels)) if f is not None]
        best, worst = sweep.extremes(sweep.readings(cases, read_by)) if large else ([], [])
        numbers = {id(c): n for n, c in group}
        sections.append({
            "name": name, "registered": tech is not None, "count": len(cases), "large": large,
            "summary": _sentence(tech.summary) if tech else "",
            "variant_notes": variant_descriptions(cases),
            "anchor": tech.anchor if tech else "",
            "cpu_note": tech.gpu_specific if tech and doc.get("device") == "cpu" else "",
            "surface": _figure(sweep.surface_title(read_by), sweep.surface(cases, read_by)) if large else None,
            "ranked_by": read_by[0].name if read_by else "speedup [95% CI]",
            "best": _extreme_rows(best, numbers, shown.get(name)),
            "worst": _extreme_rows(worst, numbers, shown.get(name)),
            "figures": [f for f in [speedup_figure(cases, labels)] if f] + ([] if large else per_case)
                       + technique_figures(tech, cases),
            "per_case_figures": per_case if large else [],
            "rows": [r for r in rows if r["technique"] == name] if large else [],
            "variants": [row for n, c in group for row in variant_rows(c, n)],
            "phases": phase_rows(group, shown.get(name)),
            "timed_share": phases.cases_text(cases),
        })
        section = sections[-1]
        section["unplotted"] = ("" if section["figures"] or section["surface"] or section["per_case_figures"]
                                else _unplotted(cases))
        shown_keys = {seg["key"] for row in section["phases"] for seg in row["segments"]}
        section["phase_legend"] = [(key, phases.LABELS.get(key, key), phases.MEANING.get(key, key))
                                   for key in dict.fromkeys([k for k, _ in phases.PHASES] + sorted(shown_keys))
                                   if key in shown_keys]
    return sections


def _unplotted(cases: list[dict[str, Any]]) -> str:
    """Why a technique's section has no figure, in one sentence."""
    failed = sum(c.get("status") != "passed" for c in cases)
    if failed == len(cases):
        return f"No figure: {'its case' if failed == 1 else f'all {failed} cases'} failed (why: the summary table)."
    return "No figure: its cases recorded no timings or figures to plot."


def phase_rows(group: list[tuple[int, dict[str, Any]]], shown: set[str] | None) -> list[dict[str, Any]]:
    """Per case that recorded its phases: where its wall time went, as a sentence and as the
    segments of a stacked bar (percent of the case's wall time)."""
    rows = []
    for number, case in group:
        found = phases.breakdown(case)
        if found is not None:
            rows.append({"number": number, "params": _params(case, shown), "text": phases.breakdown_text(found),
                         "elapsed": format_seconds(found.elapsed_s),
                         "segments": [{"key": key, "label": phases.LABELS.get(key, key), "pct": 100 * found.share(key),
                                       "seconds": format_seconds(seconds)} for key, seconds in found.parts if seconds > 0]})
    return rows


# -- telemetry ---------------------------------------------------------------------------------
def telemetry_section(run: Run) -> dict[str, Any]:
    """Power, SM clock, temperature and memory over time with each case's span shaded, and the
    throttle reasons that fired (run-wide and per case)."""
    doc = run.doc
    summary = doc.get("telemetry") or {}
    numbers = {c["id"]: n for n, c in enumerate(doc.get("cases", []), 1)}
    shown = shown_by_technique(doc)
    throttled_cases = [f"#{numbers[c['id']]} {_label(c, shown)}: "
                       + ", ".join(c["telemetry"].get("throttle_reasons", []))
                       for c in doc.get("cases", []) if (c.get("telemetry") or {}).get("throttled")]
    section = {"available": run.telemetry is not None, "note": f"telemetry unavailable: {run.telemetry_note}",
               "figure": None, "reasons": summary.get("throttle_reasons") or [],
               "benign": summary.get("benign_reasons") or [], "throttled_cases": throttled_cases,
               "samples": summary.get("n_samples"), "interval": summary.get("interval_s")}
    if run.telemetry is None:
        return section
    frame = run.telemetry
    t = pd.to_numeric(frame["t_s"], errors="coerce")
    t = (t - t.min()).tolist()
    half = (summary.get("interval_s") or 0.0) / 2
    spans = []
    case_col = frame["case"] if "case" in frame else pd.Series([None] * len(frame))
    for case_id, rows in itertools.groupby(zip(t, case_col), key=lambda r: r[1]):
        times = [r[0] for r in rows]
        if case_id in numbers:
            spans.append((times[0] - half, times[-1] + half, f"#{numbers[case_id]}"))
    reasons = frame["throttle_reasons"].fillna("") if "throttle_reasons" in frame else pd.Series([""] * len(frame))
    throttled_t = [ts for ts, r in zip(t, reasons) if set(str(r).split("|")) - BENIGN_REASONS - {""}]
    panels = [(label, pd.to_numeric(frame[col], errors="coerce").tolist()) for col, label in TELEMETRY_PANELS
              if col in frame]
    section["figure"] = _figure("telemetry over the run (shaded: cases, numbered as in the summary table)",
                                figures.telemetry_timeline(t, panels, spans, throttled_t))
    if section["figure"] is None:
        section.update(available=False, note="telemetry unavailable: the samples hold no power, clock, temperature "
                                             "or memory readings.")
    return section


# -- comparison of two runs --------------------------------------------------------------------
def _change_text(ratio: float | None, low: float | None, high: float | None) -> str:
    if ratio is None or low is None or high is None:
        return "-"
    pct = lambda r: f"{(r - 1) * 100:+.1f}"  # noqa: E731
    return f"{pct(ratio)}% [{pct(low)}, {pct(high)}]"


def compare_runs(current: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Both runs side by side, per case the change with its CI, as the regression gate
    (:func:`gpubench.compare.compare`) decides it: cases matched by id; the optimized variant's
    median time now / in ``other`` with a bootstrap CI from both runs' raw samples, and the
    baseline variant's change beside it. Regressions first (largest slowdown first), then failed
    and not comparable cases, unchanged, improvements; cases of one run only listed apart. Runs of
    different devices or scenarios are compared anyway, with a warning."""
    result = gate.compare(other, current, force=True)
    several = any(change.device for change in result.changes)

    def key(case: dict[str, Any], doc: dict[str, Any]) -> tuple[str, str]:
        return case["id"], gate.case_device(case, doc) if several else ""

    now = {key(c, current): c for c in current.get("cases", [])}
    before = {key(c, other): c for c in other.get("cases", [])}
    shown_now, shown_before = shown_by_technique(current), shown_by_technique(other)
    rows = [_change_row(change, now[k], before[k], shown_now)
            for change in result.changes for k in [(change.case_id, change.device)] if k in now and k in before]
    rows.sort(key=lambda r: (COMPARE_ORDER.index(r["class"]), -(r["ratio"] or 0.0)))
    return {"rows": rows, "counts": {VERDICT_TEXT[v]: sum(r["class"] == v for r in rows) for v in COMPARE_ORDER},
            "threshold": gate.DEFAULT_THRESHOLD, "p_significant": gate.P_SIGNIFICANT,
            "only_current": [_label(c, shown_now) for i, c in now.items() if i not in before],
            "only_other": [_label(c, shown_before) for i, c in before.items() if i not in now],
            "current": headline(current), "other": headline(other),
            "warnings": [f"{m}: the changes mix that difference with the code's." for m in result.forced]}


def _change_row(change: gate.Change, case: dict[str, Any], old: dict[str, Any],
                shown: dict[str, set[str]]) -> dict[str, Any]:
    ctx = change.context or {}
    opt, old_opt = role_variant(case, "optimized"), role_variant(old, "optimized")
    return {"id": change.case_id, "label": _label(case, shown), "class": change.verdict,
            "verdict": VERDICT_TEXT.get(change.verdict, change.verdict), "note": change.reason,
            "ratio": change.ratio,
            "ci": None if change.ratio is None else (change.ratio, change.ci_low, change.ci_high),
            "change": _change_text(change.ratio, change.ci_low, change.ci_high),
            "baseline_change": _change_text(ctx.get("ratio"), ctx.get("ci_low"), ctx.get("ci_high")),
            "before": format_seconds(_median(old, old_opt)), "after": format_seconds(_median(case, opt)),
            "speedup_before": format_speedup(_ratio(old, old_opt)), "speedup_after": format_speedup(_ratio(case, opt))}


def comparison_figure(comparison: dict[str, Any]) -> dict[str, str | None] | None:
    colors = {"regressed": "#c0392b", "improved": "#2e9b45", "unchanged": "#8c8c8c"}
    rows = [r for r in comparison["rows"] if r["ci"] is not None and r["class"] in colors]
    fig = figures.ratio_points([r["label"] for r in rows], *zip(*[r["ci"] for r in rows]),
                               x_label="optimized time, this run / the other (> 1: slower now)",
                               colors=[colors[r["class"]] for r in rows]) if rows else None
    return _figure("change per case (95% CI)", fig)


# -- the document ------------------------------------------------------------------------------
def fleet_matrix(docs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Technique x device: per case, the optimized variant's speedup with its CI on each device
    model, from the cases of one run over several models or of several runs; None when all ran on
    one model. A cell is marked faster / slower only when its whole CI is above / below 1."""
    columns: list[str] = []
    rows: dict[str, dict[str, Any]] = {}
    by_technique: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        for case in doc.get("cases", []):
            by_technique.setdefault(case["technique"], []).append(case.get("params") or {})
    shown = {t: shown_params(params, {k for p in params for k in p}) for t, params in by_technique.items()}
    for doc in docs:
        for case in doc.get("cases", []):
            device = gate.case_device(case, doc)
            columns += [device] if device not in columns else []
            ratio = _ratio(case, role_variant(case, "optimized"))
            cell = ({"text": format_speedup(ratio), "class": "faster" if ratio["ci_low"] > 1
                     else "slower" if ratio["ci_high"] < 1 else ""} if ratio
                    else {"text": case.get("status", "-"), "class": "" if case.get("status") == "passed" else "fail"})
            row = rows.setdefault(case["id"], {"label": _label(case, shown), "technique": case["technique"],
                                               "cells": {}})
            row["cells"][device] = cell
    if len(columns) < 2:
        return None
    empty = {"text": "-", "class": ""}
    return {"columns": columns,
            "rows": [{**r, "cells": [r["cells"].get(c, empty) for c in columns]} for r in rows.values()]}


def render(run: Run, other: Run | None = None, comparison: dict[str, Any] | None = None,
           more: Sequence[Run] = (), output_dir: Path | None = None) -> str:
    """The report as one HTML string: with a comparison section when ``other`` is given, and a
    technique x device matrix when the cases span several device models (``more``: further runs)."""
    doc = run.doc
    if other is not None and comparison is None:
        comparison = compare_runs(doc, other.doc)
    rows = summary_rows(doc)
    others = [r.doc for r in ([other] if other is not None else []) + list(more)]
    head = headline(doc)
    sections = technique_sections(doc, rows)
    lines = {line["name"]: line["text"] for line in head["techniques"]}
    # A large sweep's cases fold into one row of the summary table; its section holds them all.
    collapsed = {t["name"]: {"first": t["rows"][0]["number"], "last": t["rows"][-1]["number"], "count": t["count"],
                             "text": lines[t["name"]]} for t in sections if t["large"]}
    # Columns no case fills are left out, so the table fits the page with the ones that say something.
    show = {"show_device": len({r["device"] for r in rows}) > 1, "show_headline": any(r["headline"] or r["why"] for r in rows),
            "show_memory": any(r["memory"] != "-" for r in rows), "show_energy": any(r["energy"] != "-" for r in rows)}
    context = {
        "head": head, "rows": rows, "fleet": fleet_matrix([doc, *others]), **show,
        "columns": 6 + sum(show.values()), "collapsed": collapsed,
        "techniques": sections, "telemetry": telemetry_section(run),
        "profiles": profile_view.tables_by_technique(doc, _link_base(run.path, output_dir)),
        "env": json.dumps(run.env, indent=2, default=str) if run.env else None,
        "scenario": json.dumps(doc.get("scenario"), indent=2, default=str),
        "comparison": comparison, "comparison_figure": comparison_figure(comparison) if comparison else None,
        "other_run": str(other.path) if other else "",
        "generated": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    return _TEMPLATES.get_template("report.html.j2").render(**context)


def _link_base(run_dir: Path, output_dir: Path | None) -> str:
    """The run directory as a link prefix from the report's directory ("" when beside it)."""
    if output_dir is None:
        return ""
    import os

    rel = os.path.relpath(Path(run_dir).resolve(), Path(output_dir).resolve())
    return "" if rel == "." else Path(rel).as_posix() + "/"


@dataclass
class Written:
    html: Path
    markdown: Path


def write_report(run_dir: str | Path, output: str | Path | None = None,
                 compare: str | Path | Sequence[str | Path] | None = None) -> Written:
    """Write the report (default ``RUN_DIR/report.html``) and ``summary.md`` beside it. With one
    other run, a comparison; with several, the technique x device matrix over all of them."""
    run = load_run(run_dir)
    paths = [compare] if isinstance(compare, (str, Path)) else list(compare or [])
    loaded = [load_run(p) for p in paths]
    other = loaded[0] if len(loaded) == 1 else None
    comparison = compare_runs(run.doc, other.doc) if other else None
    html_path = Path(output) if output is not None else run.path / "report.html"
    md_path = html_path.with_name("summary.md")
    text = render(run, other, comparison, more=() if other is not None else loaded, output_dir=html_path.parent)
    summary = markdown.render_summary(headline(run.doc), summary_rows(run.doc), comparison)
    try:
        atomic_write_text(html_path, text)
        atomic_write_text(md_path, summary)
    except DiskFull:
        raise  # not bad input: the CLI says so, exit 74
    except OSError as exc:
        raise BadInput(f"{html_path}: cannot write the report there ({exc.strerror or exc}); "
                       f"give a writable file with -o/--output.") from None
    return Written(html_path, md_path)
