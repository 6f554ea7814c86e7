"""Runs side by side in the report: the comparison of two runs per case, as the regression gate
decides it, and the technique x device matrix of runs over several device models."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpubench.gate import compare as gate
from gpubench.records.results import CaseRecord, RunRecord
from gpubench.reports import charts
from gpubench.reports.sections import Figure, Labels, drawn
from gpubench.reports.terminal import count_text, format_seconds, format_speedup, shown_params

# The gate's verdicts, in the order the comparison lists them, and how the report words them.
COMPARE_ORDER = ("regressed", "failed", "no_samples", "inconclusive", "unchanged", "improved")
VERDICT_TEXT = {
    "regressed": "regressed",
    "failed": "failed now",
    "no_samples": "not comparable",
    "inconclusive": "inconclusive",
    "unchanged": "unchanged",
    "improved": "improved",
}


def _change_text(ratio: float | None, low: float | None, high: float | None, n: int | None = None) -> str:
    """``+3.1% [-1.0, +7.2]``; ``+3.1% (n=1)`` where too few samples gave no CI."""
    if ratio is None:
        return "-"
    pct = lambda r: f"{(r - 1) * 100:+.1f}"
    if low is None or high is None:
        return f"{pct(ratio)}% {count_text(n)}"
    return f"{pct(ratio)}% [{pct(low)}, {pct(high)}]"


def _median(case: CaseRecord, role: str) -> float | None:
    variant = case.variant(case.role_variant(role))
    return variant.median_s if variant is not None else None


def compare_runs(
    current: RunRecord, other: RunRecord, headline: Callable[[RunRecord], dict[str, Any]]
) -> dict[str, Any]:
    """Both runs side by side, per case the change with its CI, as the regression gate
    (:func:`gpubench.gate.compare.compare`) decides it: cases matched by id; the optimized variant's
    median time now / in ``other`` with a bootstrap CI from both runs' raw samples, and the
    baseline variant's change beside it. Regressions first (largest slowdown first), then failed
    and not comparable cases, unchanged, improvements; cases of one run only listed apart. Runs of
    different devices or scenarios are compared anyway, with a warning. ``headline``: each run's
    headline (the report's)."""
    result = gate.compare(other, current, force=True)
    several = any(change.device for change in result.changes)

    def key(case: CaseRecord, run: RunRecord) -> tuple[str, str]:
        return case.id, run.device_of(case) if several else ""

    now = {key(c, current): c for c in current.cases}
    before = {key(c, other): c for c in other.cases}
    labels_now, labels_before = Labels(current), Labels(other)
    rows = [
        _change_row(change, now[k], before[k], labels_now)
        for change in result.changes
        for k in [(change.case_id, change.device)]
        if k in now and k in before
    ]
    rows.sort(key=lambda r: (COMPARE_ORDER.index(r["class"]), -(r["ratio"] or 0.0)))
    return {
        "rows": rows,
        "counts": {VERDICT_TEXT[v]: sum(r["class"] == v for r in rows) for v in COMPARE_ORDER},
        "threshold": gate.DEFAULT_THRESHOLD,
        "p_significant": gate.P_SIGNIFICANT,
        "only_current": [labels_now.label(c) for i, c in now.items() if i not in before],
        "only_other": [labels_before.label(c) for i, c in before.items() if i not in now],
        "current": headline(current),
        "other": headline(other),
        "warnings": [f"{m}: the changes mix that difference with the code's." for m in result.forced],
    }


def _change_row(change: gate.Change, case: CaseRecord, old: CaseRecord, labels: Labels) -> dict[str, Any]:
    ctx = change.context
    return {
        "id": change.case_id,
        "label": labels.label(case),
        "class": change.verdict,
        "verdict": VERDICT_TEXT.get(change.verdict, change.verdict),
        "note": change.reason,
        "ratio": change.ratio,
        "ci": (change.ratio, change.ci_low, change.ci_high)
        if change.ratio is not None and change.ci_low is not None
        else None,
        "change": _change_text(change.ratio, change.ci_low, change.ci_high, change.n),
        "baseline_change": _change_text(ctx.ratio, ctx.ci_low, ctx.ci_high) if ctx else "-",
        # the medians compared (on the clock both runs recorded), else each run's own
        "before": format_seconds(
            change.baseline_median_s if change.baseline_median_s is not None else _median(old, "optimized")
        ),
        "after": format_seconds(
            change.current_median_s if change.current_median_s is not None else _median(case, "optimized")
        ),
        "speedup_before": format_speedup(old.speedup(old.role_variant("optimized"))),
        "speedup_after": format_speedup(case.speedup(case.role_variant("optimized"))),
    }


def comparison_figure(comparison: dict[str, Any]) -> Figure | None:
    colors = {"regressed": "#c0392b", "improved": "#2e9b45", "unchanged": "#8c8c8c"}
    rows = [r for r in comparison["rows"] if r["ci"] is not None and r["class"] in colors]
    if not rows:
        return None
    return drawn(
        "change per case (95% CI)",
        charts.ratio_points,
        [r["label"] for r in rows],
        [r["ci"][0] for r in rows],
        [r["ci"][1] for r in rows],
        [r["ci"][2] for r in rows],
        x_label="optimized time, this run / the other (> 1: slower now)",
        colors=[colors[r["class"]] for r in rows],
    )


def _cell(case: CaseRecord) -> dict[str, str]:
    ratio = case.speedup(case.role_variant("optimized"))
    if ratio is not None:
        low, high = ratio.ci_low, ratio.ci_high
        return {
            "text": format_speedup(ratio),  # marked only where a CI says so (none from too few samples)
            "class": ""
            if low is None or high is None or not ratio.has_interval
            else "faster"
            if low > 1
            else "slower"
            if high < 1
            else "",
        }
    return {"text": case.status or "-", "class": "" if case.passed else "fail"}


def fleet_matrix(runs: list[RunRecord]) -> dict[str, Any] | None:
    """Technique x device: per case, the optimized variant's speedup with its CI on each device
    model, from the cases of one run over several models or of several runs; None when all ran on
    one model. A cell is marked faster / slower only when its whole CI is above / below 1."""
    columns: list[str] = []
    rows: dict[str, dict[str, Any]] = {}
    by_technique: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        for case in run.cases:
            by_technique.setdefault(case.technique, []).append(case.params)
    shown = {t: shown_params(params, {k for p in params for k in p}) for t, params in by_technique.items()}
    for run in runs:
        labels = Labels(run)
        labels.shown = shown  # every run's cases labelled alike: the params that vary over all of them
        for case in run.cases:
            device = run.device_of(case)
            columns += [device] if device not in columns else []
            row = rows.setdefault(case.id, {"label": labels.label(case), "technique": case.technique, "cells": {}})
            row["cells"][device] = _cell(case)
    if len(columns) < 2:
        return None
    empty = {"text": "-", "class": ""}
    return {
        "columns": columns,
        "rows": [{**r, "cells": [r["cells"].get(c, empty) for c in columns]} for r in rows.values()],
    }
