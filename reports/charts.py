"""The generic figures of every report, from plain numbers (labels, ratios, samples): speedup
against a swept param, ratios with their CI per row, raw-sample boxes, shares of the device peak,
telemetry over time. Each returns a Figure, or None when there is nothing to draw, so the report
says so in words instead of showing empty axes."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpubench.reports.figure_style import (
    MAX_HEIGHT_IN,
    SERIES,
    WIDTH_IN,
    error_bars,
    label_rows,
    legend_below,
    legend_height_in,
    reference,
    row_labels,
    rows_that_fit,
    spread_pick,
    text_lines,
    time_unit,
    variant_color,
    wrap,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MARKERS = ("o", "s", "^", "D", "v", "P", "X")  # with the colours: 56 variants told apart


def fitting_rows(n: int, row_in: float, fixed_in: float) -> tuple[list[int], str]:
    """Which of ``n`` rows (``row_in`` inches each, beside ``fixed_in`` of axes and legend) a
    figure draws so it fits a screen: all, or as many as fit, evenly spread in order; and the
    sentence that says so ("" when all are drawn)."""
    keep = spread_pick(n, rows_that_fit(row_in, fixed_in))
    if len(keep) == n:
        return keep, ""
    return keep, f"{len(keep)} of {n} cases drawn, evenly spread in run order (every case: the tables below)"


MAX_SERIES = 6  # lines one axes tells apart (by colour, with CI bars on each); more: small multiples
PANEL_IN = 2.4  # the height of one small multiple


def series_label(parts: Sequence[str]) -> str:
    """A line's legend entry: its ``k=v`` parts (what tells it from the other lines), or
    "defaults" when it differs from them only in taking every default."""
    return " ".join(parts) or "defaults"


def split_series(keys: Sequence[tuple[str, ...]], limit: int = MAX_SERIES) -> list[tuple[str, list[int]]]:
    """Panels for lines named by ``keys`` (tuples of ``k=v`` parts): one panel when there are
    ``limit`` or fewer, else one per value of the param that splits them into the fewest panels of
    at most ``limit`` lines (else the smallest largest panel), each titled by that ``k=v`` (or
    "k: default"), cut in runs of ``limit`` where still too many. Returns (title, indices)."""
    if len(keys) <= limit:
        return [("", list(range(len(keys))))]
    names = list(dict.fromkeys(p.split("=", 1)[0] for key in keys for p in key))

    def groups(name: str) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            part = next((p for p in key if p.split("=", 1)[0] == name), f"{name}: default")
            out.setdefault(part, []).append(i)
        return out

    candidates = [(name, groups(name)) for name in names]
    candidates = [(n, g) for n, g in candidates if len(g) > 1]
    if candidates:
        _, best = min(
            candidates,
            key=lambda c: (max(len(v) for v in c[1].values()) > limit, len(c[1]), max(len(v) for v in c[1].values())),
        )
    else:
        best = {"": list(range(len(keys)))}
    return [
        (
            title + (f" (part {j // limit + 1} of {-(-len(members) // limit)})" if len(members) > limit else ""),
            members[j : j + limit],
        )
        for title, members in best.items()
        for j in range(0, len(members), limit)
    ]


def speedup_sweep(series: dict[Any, list[tuple[float, float, float, float]]], x_label: str) -> Figure | None:
    """Speedup (with CI bars) against a swept numeric parameter; one line per ``series`` key, each
    point ``(x, ratio, ci_low, ci_high)``. A key is a tuple of ``k=v`` parts (or one string): a
    part every line shares is left out of the labels; past :data:`MAX_SERIES` lines the figure
    splits into small multiples by a param (:func:`split_series`) sharing both axes, a colour per
    label the same in every panel."""
    from gpubench.reports.drawing import log_x_if_spread, new_figure, styled, ticks_at

    series = {(k,) if isinstance(k, str) else tuple(k): sorted(v) for k, v in series.items() if v}
    series = {tuple(p for p in k if p): v for k, v in series.items()}
    if not series:
        return None
    keys = list(series)
    shared = set(keys[0]).intersection(*map(set, keys[1:])) if len(keys) > 1 else set()
    keys = [tuple(p for p in k if p not in shared) for k in keys]
    panels = split_series(keys)
    fits = 2 * max(1, int((MAX_HEIGHT_IN - 1.0) / PANEL_IN))
    left_out = ""
    if len(panels) > fits:
        total = len(panels)
        panels = [panels[i] for i in spread_pick(total, fits)]
        left_out = f"{len(panels)} of {total} panels drawn, evenly spread (every case: the tables below)"
    xs = sorted({p[0] for pts in series.values() for p in pts})
    points = list(series.values())
    while True:  # the panels, and the legend they need, within a screen
        labels: dict[str, int] = {}
        for title, members in panels:
            for i in members:
                labels.setdefault(series_label([p for p in keys[i] if p != title]), len(labels))
        height = (3.0 if len(panels) == 1 else PANEL_IN * -(-len(panels) // 2) + 0.4) + legend_height_in(list(labels))
        if height <= MAX_HEIGHT_IN or len(panels) <= 1:
            break
        total = len(split_series(keys))
        panels = [panels[i] for i in spread_pick(len(panels), len(panels) - (2 if len(panels) > 2 else 1))]
        left_out = f"{len(panels)} of {total} panels drawn, evenly spread (every case: the tables below)"
    with styled():
        if len(panels) == 1:
            fig = new_figure(3.0)
            axes = [fig.add_subplot()]
        else:
            cols = 2
            fig = new_figure(PANEL_IN * -(-len(panels) // cols) + 0.4)
            axes = list(fig.subplots(-(-len(panels) // cols), cols, sharex=True, sharey=True, squeeze=False).flat)
            for ax in axes[len(panels) :]:
                ax.set_visible(False)
        handles: dict[str, Any] = {}
        for ax, (title, members) in zip(axes, panels):
            for i in members:
                label = series_label([p for p in keys[i] if p != title])
                k = labels[label]
                x, y, lo, hi = zip(*points[i])
                handles[label] = ax.errorbar(
                    x,
                    y,
                    yerr=error_bars(y, lo, hi),
                    ms=4,
                    capsize=3,
                    label=label,
                    color=SERIES[k % len(SERIES)],
                    marker=MARKERS[k // len(SERIES) % len(MARKERS)],
                )
            reference(ax.axhline(1.0, color="black", lw=0.8, ls="--"))
            log_x_if_spread(ax, xs)
            ticks_at(ax, xs)
            ax.set_xlabel(x_label)
            ax.set_ylabel("speedup over baseline (x)")
            if title:
                ax.set_title(title, fontsize=8)
        for ax in axes[: len(panels)]:
            if len(panels) > 1:
                ax.tick_params(labelbottom=True)  # shared x: each panel still reads its own values
                spec = ax.get_subplotspec()
                if spec is not None and not spec.is_first_col():
                    ax.set_ylabel("")
        if left_out:
            fig.suptitle(left_out, x=0.02, ha="left", fontsize=7)
        if len(handles) > 1 or (handles and next(iter(handles)) != "defaults"):
            legend_below(fig, handles)
        elif len(panels) > 1:
            fig.tight_layout()
    return fig


def ratio_points(
    labels: Sequence[str],
    ratios: Sequence[float],
    lows: Sequence[float],
    highs: Sequence[float],
    x_label: str,
    colors: Sequence[str] | None = None,
) -> Figure | None:
    """One row per label: a ratio with its CI as a horizontal bar, a dashed line at 1 (no change).
    Used where there is no numeric sweep (a single case, categorical params) and for comparisons."""
    from gpubench.reports.drawing import log_x_if_spread, new_figure, styled

    if not labels:
        return None
    rows, note = row_labels(labels)
    lines = max(text_lines(r) for r in rows)
    keep, left_out = fitting_rows(len(labels), 0.16 + 0.12 * lines, 1.2 + 0.14 * text_lines(note) * bool(note))
    if left_out:
        labels = [labels[i] for i in keep]
        ratios, lows, highs = ([seq[i] for i in keep] for seq in (ratios, lows, highs))
        colors = [colors[i] for i in keep] if colors else None
        rows, note = row_labels(labels)
        note = f"{note}; {left_out}" if note else left_out
    n = len(labels)
    with styled():
        fig = new_figure(0.9 + 0.14 * text_lines(note) * bool(note) + (0.16 + 0.12 * lines) * n)
        ax = fig.add_subplot()
        ys = list(range(n))[::-1]
        for i, (y, r, lo, hi) in enumerate(zip(ys, ratios, lows, highs)):
            ax.errorbar(
                [r],
                [y],
                xerr=error_bars([r], [lo], [hi]),
                fmt="o",
                ms=4,
                capsize=3,
                color=(colors[i] if colors else SERIES[0]),
            )
        reference(ax.axvline(1.0, color="black", lw=0.8, ls="--"))
        label_rows(ax, ys, rows, note)
        ax.set_ylim(-0.7, n - 0.3)
        log_x_if_spread(ax, list(lows) + list(highs))
        ax.set_xlabel(x_label)
        ax.grid(axis="y", visible=False)
    return fig


def latency_boxes(rows: Sequence[tuple[str, Mapping[str, Sequence[float]]]]) -> Figure | None:
    """Box plots of the raw timing samples: per row (a case), one box per variant."""
    from matplotlib.patches import Patch

    from gpubench.reports.drawing import log_x_if_spread, new_figure, styled

    rows = [(label, {v: s for v, s in groups.items() if s}) for label, groups in rows]
    rows = [(label, groups) for label, groups in rows if groups]
    if not rows:
        return None
    variants = list(dict.fromkeys(v for _, groups in rows for v in groups))
    unit, scale = time_unit([x for _, g in rows for s in g.values() for x in s])
    step = len(variants) + 1
    shown, note = row_labels([label for label, _ in rows])
    row_in = max(0.22 * step, 0.13 * max(text_lines(r) for r in shown) + 0.1)
    keep, left_out = fitting_rows(len(rows), row_in, 1.3 + 0.14 * text_lines(note) * bool(note))
    if left_out:
        rows = [rows[i] for i in keep]
        shown, note = row_labels([label for label, _ in rows])
        note = f"{note}; {left_out}" if note else left_out
    handles: dict[str, Any] = {}
    with styled():
        fig = new_figure(0.7 + 0.14 * text_lines(note) * bool(note) + row_in * len(rows))
        ax = fig.add_subplot()
        for k, variant in enumerate(variants):
            data = [[x / scale for x in groups[variant]] for _, groups in rows if variant in groups]
            pos = [-(i * step + k) for i, (_, groups) in enumerate(rows) if variant in groups]
            color = variant_color(variant, k)
            style = dict(
                positions=pos,
                widths=0.7,
                patch_artist=True,
                manage_ticks=False,
                boxprops={"facecolor": color, "alpha": 0.6},
                flierprops={"markersize": 2, "markeredgecolor": color},
                medianprops={"color": "black"},
            )
            _horizontal_boxplot(ax, data, style)
            handles[variant] = Patch(facecolor=color, alpha=0.6)
        label_rows(ax, [-(i * step + (len(variants) - 1) / 2) for i in range(len(rows))], shown, note)
        ax.set_ylim(-(len(rows) - 1) * step - len(variants) + 0.2, 0.8)
        log_x_if_spread(ax, [x / scale for _, g in rows for s in g.values() for x in s])
        ax.set_xlabel(f"time per call ({unit})")
        ax.grid(axis="y", visible=False)
        legend_below(fig, handles)
    return fig


def _horizontal_boxplot(ax: Any, data: list[list[float]], style: dict[str, Any]) -> dict[str, Any]:
    try:  # matplotlib >= 3.10 names the orientation; older ones take vert=False
        return ax.boxplot(data, orientation="horizontal", **style)
    except TypeError:
        return ax.boxplot(data, vert=False, **style)


def peak_bars(
    labels: Sequence[str],
    panels: Mapping[str, Mapping[str, Sequence[float | None]]],
    colors: dict[str, str] | None = None,
) -> Figure | None:
    """Grouped horizontal bars, one panel per metric (e.g. % of peak FLOP/s, % of peak
    bandwidth): per label, one bar per variant (``colors``: each variant's, else by its place);
    None values are left out."""
    from gpubench.reports.drawing import new_figure, styled

    panels = {
        title: {v: vals for v, vals in by_variant.items() if any(x is not None for x in vals)}
        for title, by_variant in panels.items()
    }
    panels = {title: by_variant for title, by_variant in panels.items() if by_variant}
    if not labels or not panels:
        return None
    variants = list(dict.fromkeys(v for by_variant in panels.values() for v in by_variant))
    height = 0.8 / len(variants)
    shown, note = row_labels(labels)
    row_in = max(0.2 * (len(variants) + 1), 0.13 * max(text_lines(r) for r in shown) + 0.1)
    keep, left_out = fitting_rows(len(labels), row_in, 1.3 + 0.14 * text_lines(note) * bool(note))
    if left_out:
        labels = [labels[i] for i in keep]
        panels = {
            title: {v: [vals[i] for i in keep] for v, vals in by_variant.items()}
            for title, by_variant in panels.items()
        }
        shown, note = row_labels(labels)
        note = f"{note}; {left_out}" if note else left_out
    with styled():
        fig = new_figure(0.7 + 0.14 * text_lines(note) * bool(note) + row_in * len(labels))
        axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
        for ax, (title, by_variant) in zip(axes, panels.items()):
            for k, variant in enumerate(variants):
                if variant not in by_variant:
                    continue
                offset = ((len(variants) - 1) / 2 - k) * height
                points = [(-i + offset, x) for i, x in enumerate(by_variant[variant]) if x is not None]
                ax.barh(
                    [p[0] for p in points],
                    [p[1] for p in points],
                    height=height,
                    label=variant,
                    color=(colors or {}).get(variant) or variant_color(variant, k),
                    hatch="///" if k >= len(SERIES) else None,
                )  # past the colours: a second look
            ax.set_xlabel(title)
            ax.grid(axis="y", visible=False)
        label_rows(axes[0], [-i for i in range(len(labels))], shown, "")
        if note:
            fig.suptitle(wrap(note, WIDTH_IN - 0.4, 7), x=0.02, ha="left", fontsize=7)
        handles: dict[str, Any] = {}
        for ax in axes:
            for bar in ax.containers:
                handles.setdefault(bar.get_label(), bar)
        legend_below(fig, handles)
    return fig


def roofline(
    series: dict[str, list[tuple[float, float, str]]],
    peak_tflops: float | None,
    peak_gbps: float | None,
    peak_label: str = "matmul peak",
    note: str = "",
    colors: dict[str, str] | None = None,
) -> Figure | None:
    """Achieved TFLOP/s against arithmetic intensity (FLOPs per byte), both log: per variant
    (``series``: its points ``(intensity, tflops, tag)``; ``colors``: each variant's, else by its
    place), under the roof min(``peak_tflops``, intensity x ``peak_gbps``) when both ceilings are
    given. Tags label the points where there are few; ``note`` goes above the axes."""
    from gpubench.reports.drawing import log_axis, new_figure, styled

    points = [p for pts in series.values() for p in pts if p[0] > 0 and p[1] > 0]
    if not points:
        return None
    roof = bool(peak_tflops and peak_gbps)
    tflops, gbps = peak_tflops or 0.0, peak_gbps or 0.0  # (read only under a roof: both given)
    ridge = tflops * 1e3 / gbps if roof else 0.0
    xs = [p[0] for p in points] + ([ridge] if roof else [])
    lo, hi = min(xs) / 4, max(xs) * 4
    with styled():
        fig = new_figure(3.4)
        ax = fig.add_subplot()
        if roof:
            _draw_roof(ax, lo, hi, ridge, tflops, gbps, peak_label)
        handles: dict[str, Any] = {}
        order = list(colors or {}) + [v for v in series if v not in (colors or {})]
        for variant, pts in series.items():
            k = order.index(variant)  # the variant's place among the technique's: its colour and marker
            handles[variant] = ax.scatter(
                [p[0] for p in pts],
                [p[1] for p in pts],
                s=18,
                zorder=3,
                marker=MARKERS[k % len(MARKERS)],
                color=(colors or {}).get(variant) or variant_color(variant, k),
                label=variant,
            )
        tagged = {tag: (x, y) for x, y, tag in sorted(points, key=lambda p: p[1])}  # each tag at its highest point
        if len(tagged) <= 24:
            for tag, (x, y) in tagged.items():
                ax.annotate(tag, (x, y), xytext=(3, 3), textcoords="offset points", fontsize=6)
        ys = [p[1] for p in points] + ([lo * gbps / 1e3, tflops] if roof else [])
        ax.set_xlim(lo, hi)
        ax.set_ylim(min(ys) / 3, max(ys) * 3)
        log_axis(ax, "x")
        log_axis(ax, "y")
        ax.set_xlabel("arithmetic intensity (FLOPs per byte, each counted once)")
        ax.set_ylabel("achieved TFLOP/s")
        if note:
            ax.set_title(wrap(note, WIDTH_IN - 0.4, 7), loc="left", fontsize=7)
        legend_below(fig, handles)
    return fig


def _draw_roof(
    ax: Any, lo: float, hi: float, ridge: float, peak_tflops: float, peak_gbps: float, peak_label: str
) -> None:
    """The roof (orientation, not data): the bandwidth slope up to the ridge point, the flat peak
    after it, each labelled with its measured figure."""
    reference(ax.plot([lo, ridge, hi], [lo * peak_gbps / 1e3, peak_tflops, peak_tflops], color="black", lw=1.2)[0])
    reference(ax.axvline(ridge, color="black", lw=0.6, ls=":"))
    ax.annotate(
        f"{peak_label} {peak_tflops:.3g} TFLOP/s",
        (hi, peak_tflops),
        xytext=(-2, 3),
        textcoords="offset points",
        ha="right",
        va="bottom",
        fontsize=7,
    )
    ax.annotate(
        f"copy {peak_gbps:.4g} GB/s",
        (lo, lo * peak_gbps / 1e3),
        xytext=(4, 4),
        textcoords="offset points",
        ha="left",
        va="bottom",
        fontsize=7,
    )
    ax.annotate(
        f"ridge {ridge:.3g} FLOPs/byte",
        (ridge, peak_tflops),
        xytext=(3, -10),
        textcoords="offset points",
        ha="left",
        va="top",
        fontsize=6,
    )


def telemetry_timeline(
    t_s: Sequence[float],
    panels: Sequence[tuple[str, Sequence[float]]],
    spans: Sequence[tuple[float, float, str]],
    throttled_t: Sequence[float],
) -> Figure | None:
    """Stacked time series (power, clocks, temperature, memory) sharing the time axis; each case's
    time span shaded and numbered; samples with a harmful throttle reason marked in red."""
    from matplotlib.lines import Line2D

    from gpubench.reports.drawing import new_figure, styled

    panels = [(label, values) for label, values in panels if any(v is not None and not math.isnan(v) for v in values)]
    if not t_s or not panels:
        return None
    with styled():
        fig = new_figure(0.6 + 1.5 * len(panels))
        axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
        for ax, (label, values) in zip(axes, panels):
            ax.plot(t_s, values, lw=1, color=SERIES[0])
            ax.set_ylabel(label)
            for i, (t0, t1, _) in enumerate(spans):
                reference(ax.axvspan(t0, t1, color=("#f3c98b" if i % 2 else "#a9cce3"), alpha=0.35, lw=0))
            if throttled_t:
                low = min(v for v in values if v is not None and not math.isnan(v))
                ax.plot(throttled_t, [low] * len(throttled_t), "|", color="#c0392b", ms=8, label="throttled")
        if len(spans) <= 40:
            for t0, t1, name in spans:
                axes[0].annotate(
                    name, ((t0 + t1) / 2, 1.0), xycoords=("data", "axes fraction"), ha="center", va="bottom", fontsize=6
                )
        axes[-1].set_xlabel("time since the first sample (s)")
        if throttled_t:
            legend_below(fig, {"throttled": Line2D([], [], color="#c0392b", marker="|", ls="none", ms=8)})
    return fig
