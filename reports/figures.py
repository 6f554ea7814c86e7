"""Report figures: numbers in, matplotlib figures out, rendered to inline SVG.

Every builder takes plain data (labels, ratios, samples) and returns a Figure, or None when there
is nothing to draw, so the report says so in words instead of showing empty axes. Figures are
made with ``matplotlib.figure.Figure`` directly, never through pyplot: no GUI backend, no global
figure list, nothing left open. :func:`to_svg` renders with matplotlib's SVG writer, which
escapes any text (case labels come from scenario files); mathtext is off, so a ``$`` in a label is
just a character.

:func:`mark_data` gives the artists that carry data (lines with points, bars, collections, images:
not the frame, ticks, grid or reference lines) an SVG id starting with ``data-``; the report uses
its count to refuse empty axes (a technique's own figures included), and a reader or a test can
find the data in the SVG.
"""
from __future__ import annotations

import contextlib
import io
import itertools
import math
import sys
from typing import Any, Iterator, Sequence

import matplotlib
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, NullFormatter

STYLE = {
    "svg.fonttype": "none",  # text stays text: small files, selectable labels
    "svg.hashsalt": "gpubench",  # deterministic ids: the same run gives the same report
    "text.parse_math": False,
    "font.size": 8,
    "axes.titlesize": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
}
COLORS = {"baseline": "#8c8c8c", "optimized": "#1f6fb4"}
SERIES = ("#1f6fb4", "#d9711c", "#2e9b45", "#c0392b", "#7d4fb0", "#8c564b", "#d45ca8", "#17a2b8")
WIDTH_IN = 7.0
_ids = itertools.count(1)
REFERENCE = "reference"  # gid of what is drawn for orientation (the 1x line, case shading), not data


@contextlib.contextmanager
def styled() -> Iterator[None]:
    """The report's matplotlib settings (figures are built and saved inside this)."""
    with matplotlib.rc_context(STYLE):
        yield


def to_svg(fig: Any) -> str:
    """``fig`` as an ``<svg>`` element (no XML prolog), then closed if pyplot holds it."""
    buf = io.StringIO()
    with styled():
        # No metadata block: no date (the same run gives the same SVG), nothing but the drawing.
        fig.savefig(buf, format="svg", bbox_inches="tight",
                    metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def close(fig: Any) -> None:
    """Release ``fig`` from pyplot's figure list, where a technique's own hook put it there."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.close(fig)


def mark_data(fig: Any) -> int:
    """Give every data artist of ``fig`` an SVG id ``data-N``; return how many there are."""
    count = 0
    for ax in fig.axes:
        for artist in [*ax.lines, *ax.patches, *ax.collections, *ax.images]:
            if artist.get_gid() == REFERENCE:
                continue
            if isinstance(artist, Line2D) and len(artist.get_xdata()) == 0:
                continue  # a legend proxy
            if isinstance(artist, PathCollection) and len(artist.get_offsets()) == 0:
                continue
            if artist.get_gid() is None:
                artist.set_gid(f"data-{next(_ids)}")
            count += 1
    return count


def _reference(artist: Any) -> None:
    artist.set_gid(REFERENCE)


def time_unit(seconds: Sequence[float]) -> tuple[str, float]:
    """The unit (name, seconds per unit) that suits the typical value of ``seconds``."""
    typical = sorted(seconds)[len(seconds) // 2] if seconds else 1.0
    for name, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if typical >= scale:
            return name, scale
    return "ns", 1e-9


def _new_figure(height_in: float) -> Figure:
    return Figure(figsize=(WIDTH_IN, max(1.8, height_in)))


def _log_x_if_spread(ax: Any, values: Sequence[float]) -> None:
    """A log x scale when the values span more than 8x (tick labels as plain numbers: mathtext
    is off)."""
    positive = [v for v in values if v > 0]
    if len(positive) == len(values) and positive and max(positive) / min(positive) > 8:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())


def _error_bars(values: Sequence[float], lows: Sequence[float], highs: Sequence[float]) -> list[list[float]]:
    """Distances below and above each value (never negative: a CI may not contain its point)."""
    return [[max(0.0, v - lo) for v, lo in zip(values, lows)], [max(0.0, hi - v) for v, hi in zip(values, highs)]]


# --------------------------------------------------------------------------------------------
def speedup_sweep(series: dict[str, list[tuple[float, float, float, float]]], x_label: str) -> Figure | None:
    """Speedup (with CI bars) against a swept numeric parameter; one line per ``series`` label,
    each point ``(x, ratio, ci_low, ci_high)``."""
    series = {k: sorted(v) for k, v in series.items() if v}
    if not series:
        return None
    with styled():
        fig = _new_figure(3.0 + 0.15 * len(series))
        ax = fig.add_subplot()
        for color, (label, points) in zip(itertools.cycle(SERIES), series.items()):
            x, y, lo, hi = zip(*points)
            ax.errorbar(x, y, yerr=_error_bars(y, lo, hi), marker="o", ms=4, capsize=3, color=color,
                        label=label or None)
        _reference(ax.axhline(1.0, color="black", lw=0.8, ls="--"))
        xs = sorted({p[0] for pts in series.values() for p in pts})
        _log_x_if_spread(ax, xs)
        if len(xs) <= 12:
            ax.set_xticks(xs, [f"{x:g}" for x in xs])
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(x_label)
        ax.set_ylabel("speedup over baseline (x)")
        if len(series) > 1 or next(iter(series)):
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), fontsize=7)
    return fig


def ratio_points(labels: Sequence[str], ratios: Sequence[float], lows: Sequence[float],
                 highs: Sequence[float], x_label: str, colors: Sequence[str] | None = None) -> Figure | None:
    """One row per label: a ratio with its CI as a horizontal bar, a dashed line at 1 (no change).
    Used where there is no numeric sweep (a single case, categorical params) and for comparisons."""
    if not labels:
        return None
    n = len(labels)
    with styled():
        fig = _new_figure(0.9 + 0.28 * n)
        ax = fig.add_subplot()
        ys = list(range(n))[::-1]
        for i, (y, r, lo, hi) in enumerate(zip(ys, ratios, lows, highs)):
            ax.errorbar([r], [y], xerr=_error_bars([r], [lo], [hi]), fmt="o", ms=4, capsize=3,
                        color=(colors[i] if colors else SERIES[0]))
        _reference(ax.axvline(1.0, color="black", lw=0.8, ls="--"))
        ax.set_yticks(ys, labels)
        ax.set_ylim(-0.7, n - 0.3)
        _log_x_if_spread(ax, list(lows) + list(highs))
        ax.set_xlabel(x_label)
        ax.grid(axis="y", visible=False)
    return fig


def latency_boxes(rows: Sequence[tuple[str, dict[str, Sequence[float]]]]) -> Figure | None:
    """Box plots of the raw timing samples: per row (a case), one box per variant."""
    rows = [(label, {v: s for v, s in groups.items() if s}) for label, groups in rows]
    rows = [(label, groups) for label, groups in rows if groups]
    if not rows:
        return None
    variants = list(dict.fromkeys(v for _, groups in rows for v in groups))
    unit, scale = time_unit([x for _, g in rows for s in g.values() for x in s])
    step = len(variants) + 1
    with styled():
        fig = _new_figure(0.9 + 0.22 * len(rows) * step)
        ax = fig.add_subplot()
        for k, variant in enumerate(variants):
            data = [[x / scale for x in groups[variant]] for _, groups in rows if variant in groups]
            pos = [-(i * step + k) for i, (_, groups) in enumerate(rows) if variant in groups]
            color = COLORS.get(variant, SERIES[(k + 2) % len(SERIES)])
            style = dict(positions=pos, widths=0.7, patch_artist=True, manage_ticks=False,
                         boxprops={"facecolor": color, "alpha": 0.6},
                         flierprops={"markersize": 2, "markeredgecolor": color}, medianprops={"color": "black"})
            _horizontal_boxplot(ax, data, style)
            ax.plot([], [], color=color, lw=6, alpha=0.6, label=variant)
        ax.set_yticks([-(i * step + (len(variants) - 1) / 2) for i in range(len(rows))], [r[0] for r in rows])
        _log_x_if_spread(ax, [x for _, g in rows for s in g.values() for x in s])
        ax.set_xlabel(f"time per call ({unit})")
        ax.grid(axis="y", visible=False)
        ax.legend(loc="lower right", fontsize=7)
    return fig


def _horizontal_boxplot(ax: Any, data: list[list[float]], style: dict[str, Any]) -> dict[str, Any]:
    try:  # matplotlib >= 3.10 names the orientation; older ones take vert=False
        return ax.boxplot(data, orientation="horizontal", **style)
    except TypeError:
        return ax.boxplot(data, vert=False, **style)


def peak_bars(labels: Sequence[str], panels: dict[str, dict[str, Sequence[float | None]]]) -> Figure | None:
    """Grouped horizontal bars, one panel per metric (e.g. % of peak FLOP/s, % of peak
    bandwidth): per label, one bar per variant; None values are left out."""
    panels = {title: {v: vals for v, vals in by_variant.items() if any(x is not None for x in vals)}
              for title, by_variant in panels.items()}
    panels = {title: by_variant for title, by_variant in panels.items() if by_variant}
    if not labels or not panels:
        return None
    variants = list(dict.fromkeys(v for by_variant in panels.values() for v in by_variant))
    height = 0.8 / len(variants)
    with styled():
        fig = _new_figure(0.9 + 0.2 * len(labels) * (len(variants) + 1))
        axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
        for ax, (title, by_variant) in zip(axes, panels.items()):
            for k, variant in enumerate(variants):
                if variant not in by_variant:
                    continue
                offset = ((len(variants) - 1) / 2 - k) * height
                points = [(-i + offset, x) for i, x in enumerate(by_variant[variant]) if x is not None]
                ax.barh([p[0] for p in points], [p[1] for p in points], height=height, label=variant,
                        color=COLORS.get(variant, SERIES[(k + 2) % len(SERIES)]))
            ax.set_xlabel(title)
            ax.grid(axis="y", visible=False)
        axes[0].set_yticks([-i for i in range(len(labels))], labels)
        axes[-1].legend(loc="lower right", fontsize=7)
    return fig


def telemetry_timeline(t_s: Sequence[float], panels: Sequence[tuple[str, Sequence[float]]],
                       spans: Sequence[tuple[float, float, str]], throttled_t: Sequence[float]) -> Figure | None:
    """Stacked time series (power, clocks, temperature, memory) sharing the time axis; each case's
    time span shaded and numbered; samples with a harmful throttle reason marked in red."""
    panels = [(label, values) for label, values in panels
              if any(v is not None and not math.isnan(v) for v in values)]
    if not t_s or not panels:
        return None
    with styled():
        fig = _new_figure(0.6 + 1.5 * len(panels))
        axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
        for ax, (label, values) in zip(axes, panels):
            ax.plot(t_s, values, lw=1, color=SERIES[0])
            ax.set_ylabel(label)
            for i, (t0, t1, _) in enumerate(spans):
                _reference(ax.axvspan(t0, t1, color=("#f3c98b" if i % 2 else "#a9cce3"), alpha=0.35, lw=0))
            if throttled_t:
                low = min(v for v in values if v is not None and not math.isnan(v))
                ax.plot(throttled_t, [low] * len(throttled_t), "|", color="#c0392b", ms=8,
                        label="throttled")
        if len(spans) <= 40:
            for t0, t1, name in spans:
                axes[0].annotate(name, ((t0 + t1) / 2, 1.0), xycoords=("data", "axes fraction"),
                                 ha="center", va="bottom", fontsize=6)
        if throttled_t:
            axes[0].legend(loc="lower right", fontsize=7)
        axes[-1].set_xlabel("time since the first sample (s)")
    return fig
