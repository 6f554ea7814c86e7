"""Reading a technique's cases together: each case by the technique's headline figure (time, or the
:class:`~gpubench.contract.Headline` metrics it declares), the line the report's headline gives
the technique, its best and worst cases and, once a sweep is large, the surface of that figure
over the swept params (a heatmap) in place of one row per case.

Pure: case records in (:class:`gpubench.records.results.CaseRecord`), strings, rows and matplotlib
figures out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpubench.contract import Headline
from gpubench.records.declarations import TechniqueRecord
from gpubench.records.results import CaseRecord, has_interval
from gpubench.records.stats import MIN_CI_SAMPLES
from gpubench.reports import figure_style
from gpubench.reports.plots import read_value
from gpubench.reports.terminal import case_params, format_speedup, ratio_text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

LARGE = 24  # past this many cases a technique reads as a surface; its per-case rows collapse
EXTREMES = 5  # best and worst cases listed first in a large sweep
ANNOTATED_COLUMNS = 32  # up to this many heatmap columns, each cell carries its number


@dataclass
class Reading:
    """One passed case read by its technique's headline figure."""

    case: CaseRecord
    factor: float  # how many times better the optimized variant is (> 1: a win)
    text: str  # as the report shows it: "1.23x [1.10, 1.35]", "KV utilization 42% -> 98%"


def headline_figures(tech: TechniqueRecord | None) -> tuple[Headline, ...]:
    """What ``tech`` is read by in place of time; empty for time (and for a technique this gpubench
    does not know). A figure declared with ``replaces_time=False`` is shown beside the speedup."""
    declared = tech.headline_figures if tech is not None else ()
    return tuple(h for h in declared if getattr(h, "replaces_time", True))


def value_text(value: float, figure: Headline) -> str:
    if figure.percent:
        return f"{100 * value:.0f}%"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _pair(case: CaseRecord, figure: Headline) -> tuple[float, float] | None:
    """The figure's value for the baseline and the optimized variant, when both are numbers."""
    values = [read_value(case, case.role_variant(role), figure.metric) for role in ("baseline", "optimized")]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
        return float(values[0]), float(values[1])
    return None


def _factor(before: float, after: float, figure: Headline) -> float | None:
    better, worse = (after, before) if figure.higher_is_better else (before, after)
    return better / worse if better > 0 and worse > 0 else None


def readings(cases: Sequence[CaseRecord], read_by: Sequence[Headline]) -> list[Reading]:
    """The passed cases that have the figure, in run order: by time, the optimized variant's
    speedup; else by the first declared figure, optimized against baseline."""
    out = []
    for case in cases:
        if not case.passed:
            continue
        if not read_by:
            ratio = case.speedup(case.role_variant("optimized"))
            if ratio is not None and ratio.ratio is not None:
                out.append(Reading(case, ratio.ratio, format_speedup(ratio)))
            continue
        figure = read_by[0]
        pair = _pair(case, figure)
        factor = _factor(*pair, figure) if pair else None
        if pair and factor is not None:
            out.append(
                Reading(case, factor, f"{figure.name} {value_text(pair[0], figure)} -> {value_text(pair[1], figure)}")
            )
    return out


def fewest_samples(case: CaseRecord) -> int | None:
    """The fewer timed calls of the case's baseline and optimized variants (None where neither was
    timed): under :data:`gpubench.records.stats.MIN_CI_SAMPLES` no figure of the pair has a CI."""
    counts = [
        len(v.samples_s)
        for v in (case.variant(case.role_variant(r)) for r in ("baseline", "optimized"))
        if v is not None and v.samples_s
    ]
    return min(counts) if counts else None


def too_few_text(counts: Sequence[int | None]) -> str:
    """``1 case too few samples (n=1)``: the cases a count of wins leaves out."""
    known = sorted({n for n in counts if n is not None})
    shown = (f"n={known[0]}" if len(known) == 1 else f"n={known[0]} to {known[-1]}") if known else "n not recorded"
    return f"{len(counts)} case{'s' if len(counts) != 1 else ''} too few samples ({shown}, below {MIN_CI_SAMPLES})"


def _span(values: list[float], figure: Headline) -> str:
    low, high = value_text(min(values), figure), value_text(max(values), figure)
    return low if low == high else f"{low}–{high}"


def technique_line(cases: Sequence[CaseRecord], read_by: Sequence[Headline]) -> str:
    """The technique in one line, by its own figure: by time, the speedup (its range and median
    over several cases); else each declared figure, baseline -> optimized (ranges over several
    cases, and in how many the optimized variant was better). A case whose figure rests on fewer
    than MIN_CI_SAMPLES timed calls a variant is counted apart ("1 case too few samples"), never
    in a range or a count of wins."""
    passed = [c for c in cases if c.passed]
    if not read_by:
        found = readings(passed, ())
        if not found:
            return "speedup: no passed case has both timings"
        if len(found) == 1:
            return f"speedup {found[0].text}"
        speedups = [r.case.speedup(r.case.role_variant("optimized")) for r in found]
        sure = [r for r, s in zip(found, speedups) if has_interval(s)]
        few = [s.n if s is not None else None for s in speedups if not has_interval(s)]
        apart = too_few_text(few) if few else ""
        if not sure:  # the range, said to rest on too few samples: no median, no CI
            factors = sorted(r.factor for r in found)
            return f"speedup {ratio_text(factors[0])}x to {ratio_text(factors[-1])}x, no CI: {apart}"
        if len(sure) == 1:
            return f"speedup {sure[0].text}" + (f"; {apart}" if apart else "")
        factors = sorted(r.factor for r in sure)
        return (
            f"speedup {ratio_text(factors[0])}x to {ratio_text(factors[-1])}x over {len(sure)} cases "
            f"(median {ratio_text(statistics.median(factors))}x)" + (f"; {apart}" if apart else "")
        )
    parts = []
    for figure in read_by:
        pairs = [p for c in passed for p in [_pair(c, figure)] if p]
        if not pairs:
            parts.append(f"{figure.name}: not recorded")
            continue
        text = f"{figure.name} {_span([p[0] for p in pairs], figure)} -> {_span([p[1] for p in pairs], figure)}"
        counts = [fewest_samples(c) for c in passed if _pair(c, figure)]
        few = [n for n in counts if n is not None and n < MIN_CI_SAMPLES]
        sure_pairs = [p for p, n in zip(pairs, counts) if n is None or n >= MIN_CI_SAMPLES]
        better = sum((_factor(*p, figure) or 0) > 1 for p in sure_pairs)
        if few and len(pairs) > 1:
            text += f" (better in {better} of {len(sure_pairs)} cases; {too_few_text(few)})"
        elif few:
            text += f" ({too_few_text(few)})"
        elif len(pairs) > 1:
            text += f" (better in {better} of {len(pairs)} cases)"
        elif not figure.percent and (factor := _factor(*pairs[0], figure)):
            text += f" ({factor:.2f}x better)" if factor >= 1 else f" ({1 / factor:.2f}x worse)"
        parts.append(text)
    return "; ".join(parts)


def extremes(found: list[Reading], k: int = EXTREMES) -> tuple[list[Reading], list[Reading]]:
    """The ``k`` best cases (best first) and the ``k`` worst (worst first); with ``2k`` cases or
    fewer, all of them best first and no separate worst list."""
    ranked = sorted(found, key=lambda r: -r.factor)
    if len(ranked) <= 2 * k:
        return ranked, []
    return ranked[:k], ranked[::-1][:k]


# -- the surface -------------------------------------------------------------------------------
def _order(value: Any) -> tuple:
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return (0, value, "") if numeric else (1, 0, str(value))


def surface_title(read_by: Sequence[Headline]) -> str:
    if not read_by:
        return "speedup over the swept params (optimized / baseline; blue: faster, red: slower)"
    return f"{read_by[0].name} over the swept params, optimized against baseline (blue: better, red: worse)"


ROWS_FIT = 40  # heatmap rows that fit a screen at a readable row height
MAX_COLUMNS = 48  # past this, cells are too narrow to tell apart at the report's width


def _layout(varying: list[str], distinct: dict[str, list[Any]]) -> tuple[list[str], list[str]]:
    """The params across (columns: every combination of them) and down (rows): across, the one
    with the most values; while the rows would not fit a screen (:data:`ROWS_FIT`), the fewest-
    valued param that brings them in (else the most-valued) moves across too, as long as the
    columns stay under :data:`MAX_COLUMNS`."""
    count = lambda keys: math.prod(len(distinct[k]) for k in keys)
    across = [max(varying, key=lambda k: (len(distinct[k]), _order(distinct[k][0])[0] == 0))]
    down = [k for k in varying if k != across[0]]
    while count(down) > ROWS_FIT and len(down) > 1:
        fitting = [k for k in down if count([d for d in down if d != k]) <= ROWS_FIT]
        move = min(fitting, key=lambda k: len(distinct[k])) if fitting else max(down, key=lambda k: len(distinct[k]))
        if count(across) * len(distinct[move]) > MAX_COLUMNS:
            break
        across.append(move)
        down.remove(move)
    return across, down


def surface(cases: Sequence[CaseRecord], read_by: Sequence[Headline]) -> Figure | None:
    """A heatmap of each case's factor (see :func:`readings`) on a log scale centred on 1: the
    swept param with the most values across (with more beside it while the rows would not fit a
    screen: :func:`_layout`), one row per combination of the other swept params; a failed case is
    a grey cell marked "fail". The figure is the report's width and at most a screen tall (rows
    past that are drawn evenly spread, said above the axes); tick labels that would overlap are
    thinned. None when fewer than two cases have the figure or nothing varies."""
    import matplotlib
    import numpy as np
    from matplotlib.figure import Figure

    from gpubench.reports import drawing

    found = readings(cases, read_by)
    if len(found) < 2:
        return None
    keys = list(dict.fromkeys(k for c in cases for k in c.params))
    distinct = {k: sorted({repr(c.params.get(k)): c.params.get(k) for c in cases}.values(), key=_order) for k in keys}
    varying = [k for k in keys if len(distinct[k]) > 1]
    if not varying:
        return None
    across, down = _layout(varying, distinct)

    def combos(of: list[str]) -> list[tuple]:
        return sorted(
            {tuple(repr(c.params.get(k)) for k in of): tuple(c.params.get(k) for k in of) for c in cases}.values(),
            key=lambda row: tuple(_order(v) for v in row),
        )

    rows, cols = combos(down), combos(across)
    row_of = {tuple(repr(v) for v in row): i for i, row in enumerate(rows)}
    col_of = {tuple(repr(v) for v in col): j for j, col in enumerate(cols)}
    # Labels as the rest of the report writes params (case_params), from a case of each row / column.
    row_labels = {row_of[tuple(repr(c.params.get(k)) for k in down)]: case_params(c, set(down)) for c in cases}
    col_labels = {
        col_of[tuple(repr(c.params.get(k)) for k in across)]: " ".join(
            case_params(c, {k}).split("=", 1)[-1] for k in across
        )
        for c in cases
    }

    def cell(case: CaseRecord) -> tuple[int, int]:
        params = case.params
        return row_of[tuple(repr(params.get(k)) for k in down)], col_of[tuple(repr(params.get(k)) for k in across)]

    grid = np.full((len(rows), len(cols)), np.nan)
    for r in found:
        grid[cell(r.case)] = math.log2(r.factor)
    failed = [cell(c) for c in cases if c.status not in ("passed", None)]
    bound = max(float(np.nanmax(np.abs(grid))), math.log2(1.25))
    shown_rows = figure_style.spread_pick(len(rows), ROWS_FIT)
    note = (
        f"{len(shown_rows)} of {len(rows)} rows drawn, evenly spread (every case: the tables below)"
        if len(shown_rows) < len(rows)
        else ""
    )
    new_row = {old: new for new, old in enumerate(shown_rows)}
    grid = grid[shown_rows]
    n_rows, n_cols = grid.shape
    width_pt = (figure_style.WIDTH_IN - 2.8) * 72 / n_cols  # a cell's width, the row labels and colour bar aside
    longest = max(len(t) for t in col_labels.values())
    rotate = longest * 6.5 * 0.62 > width_pt - 2
    fixed_in = 1.1 + (longest * 6.5 * 0.62 / 72 if rotate else 0.0) + 0.15 * bool(note)
    row_in = min(0.3, max(0.12, (figure_style.MAX_HEIGHT_IN - fixed_in) / n_rows))
    annotate = n_cols <= ANNOTATED_COLUMNS and width_pt >= 20 and row_in >= 0.15
    with drawing.styled():
        fig = Figure(figsize=(drawing.WIDTH_IN, fixed_in + row_in * n_rows))
        ax = fig.add_subplot()
        # Vector cells (a mesh, not an embedded bitmap) centred on integer positions, first row on top.
        image = ax.pcolormesh(
            np.arange(n_cols + 1) - 0.5,
            np.arange(n_rows + 1) - 0.5,
            np.ma.masked_invalid(grid),
            cmap=matplotlib.colormaps["RdBu"].with_extremes(bad="#e8e8e8"),
            vmin=-bound,
            vmax=bound,
        )
        ax.invert_yaxis()
        ax.set_xticks(range(n_cols), [col_labels[j] for j in range(n_cols)], rotation=90 if rotate else 0, fontsize=6.5)
        ax.set_yticks(range(n_rows), [row_labels[i] for i in shown_rows], fontsize=6.5)
        ax.set_xlabel(" ".join(across))
        ax.grid(False)
        ax.tick_params(length=0)
        for r in found:
            i, j = cell(r.case)
            if annotate and i in new_row:
                ax.text(
                    j,
                    new_row[i],
                    f"{r.factor:.2g}",
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="white" if abs(grid[new_row[i], j]) > 0.6 * bound else "black",
                )
        for i, j in failed:
            if i in new_row:
                ax.text(j, new_row[i], "fail", ha="center", va="center", fontsize=6 if annotate else 5, color="#a61b1b")
        if note:
            ax.set_title(note, loc="left", fontsize=7)
        bar = fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
        steps = (0.8, 1.0, 1.25) if bound < 1 else (1.0,)
        ticks = [t for t in sorted(math.log2(f) + e for f in steps for e in range(-6, 7)) if abs(t) <= bound + 1e-9]
        bar.set_ticks(ticks, labels=[f"{2.0**t:.3g}x" for t in ticks])
        bar.set_label("optimized / baseline" if not read_by else f"{read_by[0].name}: optimized vs baseline")
        fig.tight_layout()
        drawing.thin_ticks(ax, "x", 6.5, rotated=rotate)
        drawing.thin_ticks(ax, "y", 6.5)
    return fig
