"""One section of the report per technique: what it does and what each variant runs, the published
figure, a CPU caveat where the win is GPU-specific, the clock its times are on, its params and what
they mean, the generic figures, the figures it declared, and every variant of every case.

Everything a section says of a technique comes from the run's own record of it
(:meth:`gpubench.records.results.RunRecord.technique`): a run is drawn by the declarations of its day,
also where the technique's code is gone. The one exception is a technique's own figure function
(deprecated ``figures_fn``: code, not data), called through :func:`gpubench.records.declarations.figures_hook`
when it can be loaded here; when it cannot, the section says why its figures are missing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from gpubench.records.declarations import Registry, TechniqueRecord, figures_hook
from gpubench.records.results import (
    BASIS_TEXT,
    MATERIAL_SHARE,
    CaseRecord,
    RunRecord,
    Speedup,
    elapsed_text,
    has_interval,
)
from gpubench.reports import charts, figure_cache, phases, plots, roofline, sweep
from gpubench.reports.figure_style import variant_color
from gpubench.reports.terminal import (
    case_params,
    check_text,
    count_text,
    format_seconds,
    format_speedup,
    named_time,
    other_clock_text,
    param_text,
    shown_by_technique,
)

Figure = dict[str, Any]  # a figure as the template takes it: title, svg, note
_OFF = (0, False, None, "")  # defaults that mean "off" or "as the others say" (seq_len_q=0: seq_len)


def params_label(case: CaseRecord, shown: set[str] | None, defaults: dict[str, Any]) -> str:
    """The case's params as the report labels it: those that tell the technique's cases apart
    (``shown``), less those left at a default that means off or "the same as" (causal=False,
    block_m=0); two cases still differ in a param at least one of them sets."""
    keep = {
        k
        for k in (case.params if shown is None else shown)
        if not (k in defaults and case.params.get(k) == defaults[k] and defaults[k] in _OFF)
    }
    return case_params(case, keep)


class Labels:
    """How the report names a run's cases: the technique and the params that tell them apart."""

    def __init__(self, run: RunRecord) -> None:
        self.run = run
        self.shown = shown_by_technique(run)
        self._defaults: dict[str, dict[str, Any]] = {}

    def defaults(self, technique: str) -> dict[str, Any]:
        if technique not in self._defaults:
            tech = self.run.technique(technique)
            self._defaults[technique] = tech.defaults() if tech is not None else {}
        return self._defaults[technique]

    def params(self, case: CaseRecord) -> str:
        return params_label(case, self.shown.get(case.technique), self.defaults(case.technique))

    def label(self, case: CaseRecord) -> str:
        return f"{case.technique} {self.params(case)}".strip()


# -- figures -----------------------------------------------------------------------------------
def figure(title: str, fig: Any) -> Figure | None:
    """A figure for the template: its SVG, or None when there is no figure or it has no data: the
    report leaves out what it cannot draw rather than show an empty frame. ``fig``: one drawn
    already (a technique's own hook's); the report's own figures go through :func:`drawn`."""
    text = figure_cache.figure_svg(fig)
    return {"title": title, "svg": text, "note": None} if text is not None else None


def drawn(title: str, builder: Callable[..., Any], *args: Any, **kwargs: Any) -> Figure | None:
    """:func:`figure` of ``builder(*args, **kwargs)``, read from the figure cache where the same
    builder drew it from the same numbers before (:mod:`gpubench.reports.figure_cache`)."""
    text = figure_cache.svg(builder, *args, **kwargs)
    return {"title": title, "svg": text, "note": None} if text is not None else None


def _missing(title: str, why: str) -> Figure:
    return {"title": title, "svg": None, "note": why}


def speedup_figure(cases: list[CaseRecord], labels: list[str], defaults: dict[str, Any] | None = None) -> Figure | None:
    """Speedup against the swept numeric param (one line per combination of the other varying
    params, named by those not at their ``defaults``); without a numeric sweep (one case,
    categorical params) one point per case."""
    title = "speedup of optimized over baseline (95% CI)"
    points = [(c, r, label) for c, label in zip(cases, labels) for r in [c.speedup(c.role_variant("optimized"))] if r]
    if not points:
        return None
    keys = list(dict.fromkeys(k for c, _, _ in points for k in c.params))
    varying = [k for k in keys if len({repr(c.params.get(k)) for c, _, _ in points}) > 1]
    numeric = [
        k
        for k in varying
        if all(
            isinstance(c.params.get(k), (int, float)) and not isinstance(c.params.get(k), bool) for c, _, _ in points
        )
    ]
    if numeric:
        x = max(numeric, key=lambda k: len({c.params[k] for c, _, _ in points}))
        series: dict[tuple[str, ...], list[tuple[float, float, float, float]]] = {}
        known = defaults or {}
        for c, r, _ in points:
            key = tuple(
                param_text(c.params, k) for k in varying if k != x and not (k in known and c.params.get(k) == known[k])
            )
            series.setdefault(key, []).append((c.params[x], *_with_ends(r)))
        return drawn(f"{title} vs {x}", charts.speedup_sweep, series, x)
    ratios = [_with_ends(r) for _, r, _ in points]
    return drawn(
        title,
        charts.ratio_points,
        [p[2] for p in points],
        [r[0] for r in ratios],
        [r[1] for r in ratios],
        [r[2] for r in ratios],
        x_label="speedup over baseline (x)",
    )


def _with_ends(speedup: Speedup) -> tuple[float, float, float]:
    """(ratio, low, high) to draw: a speedup without a CI (too few samples) is a point with no bar."""
    ratio = float(speedup.ratio or 0.0)  # case.speedup() gives only speedups with a ratio
    if speedup.ci_low is not None and speedup.ci_high is not None and speedup.has_interval:
        return ratio, speedup.ci_low, speedup.ci_high
    return ratio, ratio, ratio


def _samples(case: CaseRecord, name: str) -> list[float]:
    return [x for x in case.variants[name].samples_s if isinstance(x, (int, float)) and math.isfinite(x)]


def latency_figure(cases: list[CaseRecord], labels: list[str]) -> Figure | None:
    rows = [
        (label, {n: _samples(c, n) for n in (c.role_variant("baseline"), c.role_variant("optimized")) if n})
        for c, label in zip(cases, labels)
    ]
    return drawn("time per call, raw samples (box: quartiles, line: median)", charts.latency_boxes, rows)


def variant_colors(cases: list[CaseRecord]) -> dict[str, str]:
    """One colour per timed variant of a technique, the same in each of its figures."""
    return {name: variant_color(name, k) for k, name in enumerate(roofline.variant_order(cases))}


def peak_figure(cases: list[CaseRecord], labels: list[str]) -> Figure | None:
    """Every timed variant's share of the measured peak, peers included: each read against the
    case's once-counted FLOPs and bytes."""

    def metric(case: CaseRecord, name: str, key: str) -> Any:
        variant = case.variant(name)
        return variant.metric(key) if variant is not None else None

    variants = roofline.variant_order(cases)
    panels = {
        title: {name: [metric(c, name, key) for c in cases] for name in variants}
        for key, title in (
            ("pct_peak_flops", "% of measured peak FLOP/s"),
            ("pct_peak_bandwidth", "% of measured peak bandwidth"),
        )
    }
    return drawn("share of the measured device peak", charts.peak_bars, labels, panels, variant_colors(cases))


def roofline_block(run: RunRecord, group: list[tuple[int, CaseRecord]], labels: Labels) -> dict[str, Any] | None:
    """The technique's roofline (a figure per device model it ran on, where its cases count both
    FLOPs and bytes), what a reader must know to read it, and per case a table of every timed
    variant against the case's counts and the measured ceilings. None: no variant counts either."""
    found = roofline.readings(run, group, labels.params)
    if not found:
        return None
    colors = variant_colors([c for _, c in group])
    several = len({r.roof.device for r in found}) > 1
    figures = []
    for roof, series in roofline.chart_groups(found):
        note = "" if roof.complete else f"no roof: {roof.missing}"
        peak = f"{roof.dtype} matmul peak".strip()
        title = (
            "roofline: each variant of each case under the measured ceilings"
            if roof.complete
            else "achieved TFLOP/s against arithmetic intensity (no measured ceilings)"
        )
        title += f" of {roof.device}" if several else ""
        figures.append(drawn(title, charts.roofline, series, roof.peak_tflops, roof.peak_gbps, peak, note, colors))
    ridges = [f"{roof.ridge:.3g}" for roof in roofline.device_roofs(found).values() if roof.ridge]
    return {
        "figures": [f for f in figures if f],
        "notes": roofline.notes(found),
        "ridge": " / ".join(ridges),
        "folded": len(group) > sweep.LARGE,
        **roofline.case_tables(found),
    }


def technique_figures(
    tech: TechniqueRecord | None, cases: list[CaseRecord], registry: Registry | None = None
) -> list[Figure]:
    """The figures the technique declared (``plots``, as the run recorded them), then those of
    its own figure function where its code can be found through ``registry`` (the caller's: the
    report never imports the registry; else a note says why they are missing), each left out when the run holds no data for it. A figure that fails to draw
    costs that figure only, with the reason shown."""
    if tech is None:
        return []
    out = []
    for plot in tech.plots:
        try:
            out.append(drawn(plot.title, plots.declared, plot, cases, tech.defaults()))
        except Exception as exc:  # noqa: BLE001 - a figure never takes the report down
            out.append(_missing(plot.title, f"the figure failed: {type(exc).__name__}: {exc}"))
    hook, why_not = figures_hook(tech, registry)
    if why_not:
        out.append(_missing(f"{tech.name}'s own figures", f"not drawn: {why_not}"))
    if hook is not None:
        try:
            from gpubench.reports import drawing

            with drawing.styled():
                made = list(hook([c.to_dict() for c in cases]))  # the hook's contract: case dicts
            out += [figure(str(title), fig) for title, fig in made]
        except Exception as exc:  # noqa: BLE001 - a technique's hook never takes the report down
            out.append(
                _missing(f"{tech.name} figures", f"the technique's figure hook failed: {type(exc).__name__}: {exc}")
            )
    return [fig for fig in out if fig is not None]


# -- tables ------------------------------------------------------------------------------------
def variant_rows(case: CaseRecord, number: int) -> list[dict[str, Any]]:
    rows = []
    for name, v in case.variants.items():
        s = v.stats
        rows.append(
            {
                "case": number,
                "variant": name,
                "role": v.role,
                "status": v.status,
                "reason": "; ".join(filter(None, (v.reason, v.under_sampled and f"under-sampled: {v.under_sampled}"))),
                "median": format_seconds(v.median_s),
                "ci": (
                    ""
                    if s is None
                    else f"[{format_seconds(s.ci_low)}, {format_seconds(s.ci_high)}]"
                    if has_interval(s)
                    else f"none {count_text(s.n)}"
                ),
                "n": s.n if s is not None and s.n is not None else 0,
                "speedup": format_speedup(case.speedup(name)),
                "check": check_text(case, name).plain,
                "other_clock": other_clock_text(v, always=True),
            }
        )
    return rows


def clock_note(cases: list[CaseRecord]) -> str:
    """Which clock the technique's times are on, in a sentence (and that the other is in the
    variants table), from its variants' records; "" where none was timed."""
    bases = list(dict.fromkeys(v.basis for c in cases for v in c.variants.values() if v.samples_s))
    if not bases:
        return ""
    said = "; ".join(BASIS_TEXT.get(b, "the records do not say which clock") for b in bases)
    note = f"Times here are {said}."
    if any(v.other_samples_s for c in cases for v in c.variants.values()):
        material = sum(
            1
            for c in cases
            for v in c.variants.values()
            if v.launch_share is not None and abs(v.launch_share) >= MATERIAL_SHARE
        )
        shared = sum(
            1 for c in cases for v in c.variants.values() if v.timing is not None and v.timing.both_clocks_one_call
        )
        note += (
            " The other clock was recorded beside it, a call of its own in the same rounds"
            + (
                f" (in {shared} variant{'s' if shared != 1 else ''}, whose calls are long beside the L2 flush, "
                "the same call: its wall time may hold up to the flush's duration, at most 1% of the call)"
                if shared
                else ""
            )
            + ": its median and the share of wall time outside device time (launch work, host syncs) are in "
            f"the table of every variant ({material} variant{'s' if material != 1 else ''} at "
            f"{MATERIAL_SHARE:.0%} or more)."
        )
    exposed, device_samples = 0, 0
    for c in cases:
        for v in c.variants.values():
            count = v.timing.launch_outlasted_flush if v.timing is not None else None
            if isinstance(count, int) and v.samples_on("device"):
                exposed, device_samples = exposed + count, device_samples + len(v.samples_on("device") or [])
    if exposed:
        note += (
            f" In {exposed} of {device_samples} device-time samples the call's launch took longer than the L2 "
            f"flush ran, so those may hold some launch work."
        )
    return note


def _sentence(text: str) -> str:
    """``text`` on one line, ending as a sentence ends (a full stop added where it has none)."""
    text = " ".join(text.split())
    return text if not text or text[-1] in ".!?" else text + "."


def variant_descriptions(cases: list[CaseRecord]) -> list[dict[str, str]]:
    """What each variant runs, in full as the run recorded it: the baseline and the optimized
    variant first, then the peers that were timed."""
    seen: dict[str, dict[str, str]] = {}
    for case in cases:
        for name, v in case.variants.items():
            if name not in seen and (v.role != "peer" or v.stats):
                seen[name] = {"name": name, "role": v.role, "description": v.description or ""}
    order = {"baseline": 0, "optimized": 1}
    return sorted(seen.values(), key=lambda d: order.get(d["role"], 2))


def param_rows(tech: TechniqueRecord | None, cases: list[CaseRecord]) -> list[dict[str, str]]:
    """The params the run's cases set, with what each means and accepts (as the run recorded
    the technique's declaration), and the values the cases took."""
    if tech is None:
        return []
    rows = []
    for p in tech.params:
        values = list(dict.fromkeys(repr(c.params[p.name]) for c in cases if p.name in c.params))
        rows.append(
            {
                "name": p.name,
                "help": p.help,
                "allowed": p.allowed,
                "default": repr(p.default),
                "values": ", ".join(v.strip("'") for v in values) or "-",
            }
        )
    return rows


def _extreme_rows(found: list[sweep.Reading], numbers: dict[int, int], labels: Labels) -> list[dict[str, Any]]:
    return [
        {
            "number": numbers[id(r.case)],
            "params": labels.params(r.case),
            "figure": r.text,
            "baseline": named_time(r.case, r.case.role_variant("baseline")),
            "optimized": named_time(r.case, r.case.role_variant("optimized")),
        }
        for r in found
    ]


def _unplotted(cases: list[CaseRecord]) -> str:
    """Why a technique's section has no figure, in one sentence."""
    failed = sum(not c.passed for c in cases)
    if failed == len(cases):
        return f"No figure: {'its case' if failed == 1 else f'all {failed} cases'} failed (why: the summary table)."
    return "No figure: its cases recorded no timings or figures to plot."


def phase_rows(group: list[tuple[int, CaseRecord]], labels: Labels) -> list[dict[str, Any]]:
    """Per case that recorded its phases: where its wall time went, as a sentence and as the
    segments of a stacked bar (percent of the case's wall time)."""
    rows = []
    for number, case in group:
        found = phases.breakdown(case)
        if found is not None:
            rows.append(
                {
                    "number": number,
                    "params": labels.params(case),
                    "text": phases.breakdown_text(found),
                    "elapsed": elapsed_text(found.elapsed_s),
                    "segments": [
                        {
                            "key": key,
                            "label": phases.LABELS.get(key, key),
                            "pct": 100 * found.share(key),
                            "seconds": elapsed_text(seconds),
                        }
                        for key, seconds in found.parts
                        if seconds > 0
                    ],
                }
            )
    return rows


def _phase_legend(rows: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    shown_keys = {seg["key"] for row in rows for seg in row["segments"]}
    return [
        (key, phases.LABELS.get(key, key), phases.MEANING.get(key, key))
        for key in dict.fromkeys([k for k, _ in phases.PHASES] + sorted(shown_keys))
        if key in shown_keys
    ]


# -- the sections --------------------------------------------------------------------------------
def technique_section(
    run: RunRecord, name: str, group: list[tuple[int, CaseRecord]], labels: Labels, rows: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """One technique's section (see the module's docstring). A technique with more than
    :data:`sweep.LARGE` cases reads as a sweep: the surface of its headline figure over the swept
    params and its best and worst cases come first; its per-case rows (``rows``: the summary
    table's) and per-case figures sit in collapsed sections."""
    cases = [c for _, c in group]
    case_labels = [f"#{n} {labels.params(c)}".strip() for n, c in group]
    tech = run.technique(name)
    read_by = sweep.headline_figures(tech)
    large = len(cases) > sweep.LARGE
    per_case = [f for f in (latency_figure(cases, case_labels), peak_figure(cases, case_labels)) if f is not None]
    best, worst = sweep.extremes(sweep.readings(cases, read_by)) if large else ([], [])
    numbers = {id(c): n for n, c in group}
    phase_table = phase_rows(group, labels)
    declared = technique_figures(tech, cases, run.registry)
    section = {
        "name": name,
        "registered": tech is not None,
        "count": len(cases),
        "large": large,
        "summary": _sentence(tech.summary) if tech else "",
        "variant_notes": variant_descriptions(cases),
        "anchor": tech.anchor if tech else "",
        "params": param_rows(tech, cases),
        "cpu_note": tech.gpu_specific if tech and run.device == "cpu" else "",
        "clock_note": clock_note(cases),
        "surface": drawn(sweep.surface_title(read_by), sweep.surface, cases, read_by) if large else None,
        "ranked_by": read_by[0].name if read_by else "speedup [95% CI]",
        "best": _extreme_rows(best, numbers, labels),
        "worst": _extreme_rows(worst, numbers, labels),
        "figures": [f for f in [speedup_figure(cases, case_labels, labels.defaults(name))] if f]
        + ([] if large else per_case)
        + declared,
        "per_case_figures": per_case if large else [],
        "rows": [r for r in rows if r["technique"] == name] if large else [],
        "variants": [row for n, c in group for row in variant_rows(c, n)],
        "phases": phase_table,
        "phase_legend": _phase_legend(phase_table),
        "timed_share": phases.cases_text(cases),
        "roofline": roofline_block(run, group, labels),
    }
    section["unplotted"] = (
        "" if section["figures"] or section["surface"] or section["per_case_figures"] else _unplotted(cases)
    )
    section.update(answer(section, declared, read_by, rows))
    return section


def answer(
    section: dict[str, Any], declared: list[Figure], read_by: Sequence[Any], rows: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """What a technique's section opens with: one figure (a sweep's surface; else the figure it
    is read by: its first declared figure (``declared``) where it is read by its own figure, the
    first of its figures otherwise, the speedup's where it has one) and a compact table of its
    cases by the params that vary (``rows``: the summary table's); ``more_figures``, the rest of
    its figures, are folded under them. A sweep's best and worst cases are its compact table."""
    figures = list(section["figures"])
    if section["large"]:
        first = section["surface"]
    else:
        drawn = [f for f in declared if f["svg"]] if read_by else []
        first = drawn[0] if drawn else next((f for f in figures if f["svg"]), None)
    mine = [r for r in rows if r["technique"] == section["name"]]
    with_headline = any(r["headline"] for r in mine)
    compact = {
        "rows": [] if section["large"] else mine,
        "speedup": not (read_by and with_headline),
        "headline": with_headline,
    }
    return {"answer": first, "more_figures": [f for f in figures if f is not first], "compact": compact}


def technique_sections(
    run: RunRecord, rows: Sequence[dict[str, Any]], labels: Labels | None = None
) -> list[dict[str, Any]]:
    """A section per technique, in the order the run first ran each."""
    labels = labels or Labels(run)
    by_technique: dict[str, list[tuple[int, CaseRecord]]] = {}
    for number, case in enumerate(run.cases, 1):
        by_technique.setdefault(case.technique, []).append((number, case))
    return [technique_section(run, name, group, labels, rows) for name, group in by_technique.items()]
