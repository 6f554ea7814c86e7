"""Report figures: numbers in, matplotlib figures out, rendered to inline SVG.

Every builder takes plain data (labels, ratios, samples) and returns a Figure, or None when there
is nothing to draw, so the report says so in words instead of showing empty axes. Figures are
made with ``matplotlib.figure.Figure`` directly, never through pyplot: no GUI backend, no global
figure list, nothing left open. :func:`to_svg` renders with matplotlib's SVG writer, which
escapes any text (case labels come from scenario files); mathtext is off, so a ``$`` in a label is
just a character.

Readable by construction: every log axis goes through :func:`log_ticks` (plain-number labels such as
"128", "1k", "0.1", at least two of them in view), including those a technique's own hook made,
which :func:`to_svg` passes through it too; legends sit under the axes (:func:`legend_below`),
never on data; row labels of horizontal charts leave out what every row shares and wrap
(:func:`row_labels`), and a single row's label goes above its axes.

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
import re
import sys
import textwrap
from typing import Any, Iterator, Sequence

import matplotlib
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, FuncFormatter, Locator, LogFormatter, MaxNLocator, NullFormatter

from gpubench.reports.terminal import param_text

STYLE = {
    "svg.fonttype": "none",  # text stays text: small files, selectable labels
    "svg.hashsalt": "gpubench",  # deterministic ids: the same run gives the same report
    "text.parse_math": False,
    "axes.formatter.use_mathtext": False,
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
    for ax in fig.axes:  # a technique's own figures too: no log axis reaches the SVG unplain
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() == "log":
                log_ticks(axis)
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


# -- plain text: numbers, log axes, legends, labels ---------------------------------------------
def plain_number(value: float) -> str:
    """A tick label as plain text: "128", "1024", "1k", "2.5M", "0.1" (never mathtext)."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    size = abs(value)
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if size >= scale and float(round(value / scale * 10)) == value / scale * 10:
            return f"{value / scale:g}{suffix}"  # 1k, 2.5k, 10M: exact at one decimal
    if size >= 1 and value == int(value):
        return str(int(value))  # 1024, 65536
    return f"{value:.3g}" if size >= 1e-3 else f"{value:.2g}"


PLAIN = FuncFormatter(lambda v, _: plain_number(v))


class PlainLogLocator(Locator):
    """Major ticks of a log axis, at least two in view: the powers of the base when two or more
    fall in the view (thinned to at most 8), else 1-2-5 steps (1, 2, 5, 10, 20, ...), else evenly
    spaced round numbers (a view narrower than 2x)."""

    def __init__(self, base: float = 10) -> None:
        self.base = base

    def __call__(self) -> list[float]:
        return self.tick_values(*self.axis.get_view_interval())

    def tick_values(self, vmin: float, vmax: float) -> list[float]:
        lo, hi = sorted((vmin, vmax))
        if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= 0:
            return []
        lo = max(lo, hi * 1e-12)
        inside = lambda vs: sorted({v for v in vs if lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9)})  # noqa: E731
        first, last = math.floor(math.log(lo, self.base)) - 1, math.ceil(math.log(hi, self.base)) + 1
        powers = inside(self.base ** k for k in range(first, last + 1))
        if len(powers) >= 2:
            step = -(-len(powers) // 8)
            return powers[::step]
        decades = range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
        steps = inside(m * 10.0 ** k for k in decades for m in (1, 2, 5))
        if len(steps) >= 2:
            return steps
        even = inside(v for v in MaxNLocator(nbins=4, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi) if v > 0)
        return even if len(even) >= 2 else [lo, hi]


def log_ticks(axis: Any) -> None:
    """The one way a log axis is labelled: :class:`PlainLogLocator` (unless the figure fixed its
    ticks), plain-number labels, unlabelled minor ticks. Idempotent."""
    base = getattr(axis.get_transform(), "base", 10)
    if not isinstance(axis.get_major_locator(), (PlainLogLocator, FixedLocator)):
        axis.set_major_locator(PlainLogLocator(base))
    if isinstance(axis.get_major_formatter(), LogFormatter):  # its labels are mathtext (2^7, 10^3)
        axis.set_major_formatter(PLAIN)
    if isinstance(axis.get_minor_formatter(), LogFormatter):
        axis.set_minor_formatter(NullFormatter())


def log_axis(ax: Any, which: str, base: float = 10) -> None:
    """Make ``which`` ("x" or "y") of ``ax`` a log axis with plain labels (:func:`log_ticks`)."""
    (ax.set_xscale if which == "x" else ax.set_yscale)("log", base=base)
    log_ticks(ax.xaxis if which == "x" else ax.yaxis)


def _log_x_if_spread(ax: Any, values: Sequence[float]) -> None:
    """A log x scale when the values span more than 8x."""
    positive = [v for v in values if v > 0]
    if len(positive) == len(values) and positive and max(positive) / min(positive) > 8:
        log_axis(ax, "x")


def _spaced(values: Sequence[float], log: bool, gap: float = 0.07) -> list[float]:
    """Of sorted ``values``, those at least ``gap`` of the axis span apart (the last one always
    kept), so explicit tick labels do not print over each other (64, 77, 100 on a 0-512 axis)."""
    pos = [math.log(v) if log else v for v in values]
    span = (max(pos) - min(pos)) or 1.0
    kept: list[int] = []
    for i in range(len(values)):
        if not kept or (pos[i] - pos[kept[-1]]) / span >= gap:
            kept.append(i)
        elif i == len(values) - 1:
            kept[-1] = i  # the last value is kept; the one too close before it goes
    return [values[i] for i in kept]


def ticks_at(ax: Any, xs: Sequence[float]) -> None:
    """x ticks at the swept values when there are few (12 or fewer), spaced so none overlap:
    a param swept over 2 and 4 reads 2, 4, not 2.00, 2.25, ..."""
    xs = sorted(set(xs))
    if 1 <= len(xs) <= 12:
        kept = _spaced(xs, ax.xaxis.get_scale() == "log")
        ax.set_xticks(kept, [plain_number(x) for x in kept])
        ax.xaxis.set_minor_formatter(NullFormatter())


def legend_below(fig: Figure, handles: dict[str, Any]) -> None:
    """One legend for the whole figure, under the axes, where it covers no data; the figure grows
    by the legend's height, so the axes keep theirs."""
    if not handles:
        return
    longest = max(len(text) for text in handles)  # columns: as many as fit the width at 7 pt
    ncol = max(1, min(len(handles), 4, int(WIDTH_IN * 72 / ((longest + 6) * 7 * 0.6))))
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=ncol, fontsize=7,
               bbox_to_anchor=(0.5, 0.0))
    rows = -(-len(handles) // ncol)
    legend_in = 0.15 * rows + 0.2
    fig.set_figheight(fig.get_figheight() + legend_in)
    fig.tight_layout(rect=(0, legend_in / fig.get_figheight(), 1, 1))


def wrap(text: str, width_in: float, fontsize: float = 8) -> str:
    """``text`` broken into lines that fit ``width_in`` inches at ``fontsize`` points."""
    chars = max(12, int(width_in * 72 / (fontsize * 0.6)))
    return "\n".join(textwrap.wrap(text, chars, break_on_hyphens=False)) or text


_PARAM_START = re.compile(r" (?=[^\s=]+=)")  # a space before the next k=v (values may hold spaces)
ROW_LABEL_IN = 2.6  # the widest a row label may be (of the figure's 7 in) before it wraps


def row_labels(labels: Sequence[str]) -> tuple[list[str], str]:
    """Row labels for a horizontal chart: each ``k=v`` every row shares is left out (and returned,
    to be said once above the axes), the rest wrapped to :data:`ROW_LABEL_IN`. One row: no row
    label; the whole label is the note above."""
    if len(labels) == 1:
        return [""], labels[0]
    parts = [_PARAM_START.split(label) for label in labels]
    shared = [p for p in parts[0] if "=" in p and all(p in other for other in parts[1:])]
    rows = [" ".join(p for p in ps if p not in shared) for ps in parts]
    return [wrap(r, ROW_LABEL_IN, 8) for r in rows], (("every row: " + " ".join(shared)) if shared else "")


def label_rows(ax: Any, ys: Sequence[float], rows: Sequence[str], note: str) -> None:
    """Put :func:`row_labels`' rows at ``ys`` and its note above ``ax`` (left-aligned); a single
    row has no row label and no tick, so the data take the figure's width."""
    ax.set_yticks(ys, rows)
    if rows == [""]:
        ax.tick_params(axis="y", left=False)
    if note:
        ax.set_title(wrap(note, WIDTH_IN - 0.4, 7), loc="left", fontsize=7)


def _lines(text: str) -> int:
    return text.count("\n") + 1


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
        handles = {}
        for color, (label, points) in zip(itertools.cycle(SERIES), series.items()):
            x, y, lo, hi = zip(*points)
            handles[label] = ax.errorbar(x, y, yerr=_error_bars(y, lo, hi), marker="o", ms=4, capsize=3,
                                         color=color, label=label or None)
        _reference(ax.axhline(1.0, color="black", lw=0.8, ls="--"))
        xs = sorted({p[0] for pts in series.values() for p in pts})
        _log_x_if_spread(ax, xs)
        ticks_at(ax, xs)
        ax.set_xlabel(x_label)
        ax.set_ylabel("speedup over baseline (x)")
        if len(series) > 1 or next(iter(series)):
            legend_below(fig, handles)
    return fig


def ratio_points(labels: Sequence[str], ratios: Sequence[float], lows: Sequence[float],
                 highs: Sequence[float], x_label: str, colors: Sequence[str] | None = None) -> Figure | None:
    """One row per label: a ratio with its CI as a horizontal bar, a dashed line at 1 (no change).
    Used where there is no numeric sweep (a single case, categorical params) and for comparisons."""
    if not labels:
        return None
    n = len(labels)
    rows, note = row_labels(labels)
    lines = max(_lines(r) for r in rows)
    with styled():
        fig = _new_figure(0.9 + 0.14 * _lines(note) * bool(note) + (0.16 + 0.12 * lines) * n)
        ax = fig.add_subplot()
        ys = list(range(n))[::-1]
        for i, (y, r, lo, hi) in enumerate(zip(ys, ratios, lows, highs)):
            ax.errorbar([r], [y], xerr=_error_bars([r], [lo], [hi]), fmt="o", ms=4, capsize=3,
                        color=(colors[i] if colors else SERIES[0]))
        _reference(ax.axvline(1.0, color="black", lw=0.8, ls="--"))
        label_rows(ax, ys, rows, note)
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
    shown, note = row_labels([label for label, _ in rows])
    row_in = max(0.22 * step, 0.13 * max(_lines(r) for r in shown) + 0.1)
    handles: dict[str, Any] = {}
    with styled():
        fig = _new_figure(0.7 + 0.14 * _lines(note) * bool(note) + row_in * len(rows))
        ax = fig.add_subplot()
        for k, variant in enumerate(variants):
            data = [[x / scale for x in groups[variant]] for _, groups in rows if variant in groups]
            pos = [-(i * step + k) for i, (_, groups) in enumerate(rows) if variant in groups]
            color = COLORS.get(variant, SERIES[(k + 2) % len(SERIES)])
            style = dict(positions=pos, widths=0.7, patch_artist=True, manage_ticks=False,
                         boxprops={"facecolor": color, "alpha": 0.6},
                         flierprops={"markersize": 2, "markeredgecolor": color}, medianprops={"color": "black"})
            _horizontal_boxplot(ax, data, style)
            handles[variant] = Patch(facecolor=color, alpha=0.6)
        label_rows(ax, [-(i * step + (len(variants) - 1) / 2) for i in range(len(rows))], shown, note)
        ax.set_ylim(-(len(rows) - 1) * step - len(variants) + 0.2, 0.8)
        _log_x_if_spread(ax, [x / scale for _, g in rows for s in g.values() for x in s])
        ax.set_xlabel(f"time per call ({unit})")
        ax.grid(axis="y", visible=False)
        legend_below(fig, handles)
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
    shown, note = row_labels(labels)
    row_in = max(0.2 * (len(variants) + 1), 0.13 * max(_lines(r) for r in shown) + 0.1)
    with styled():
        fig = _new_figure(0.7 + 0.14 * _lines(note) * bool(note) + row_in * len(labels))
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
        label_rows(axes[0], [-i for i in range(len(labels))], shown, "")
        if note:
            fig.suptitle(wrap(note, WIDTH_IN - 0.4, 7), x=0.02, ha="left", fontsize=7)
        handles = {}
        for ax in axes:
            for bar in ax.containers:
                handles.setdefault(bar.get_label(), bar)
        legend_below(fig, handles)
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
        axes[-1].set_xlabel("time since the first sample (s)")
        if throttled_t:
            legend_below(fig, {"throttled": Line2D([], [], color="#c0392b", marker="|", ls="none", ms=8)})
    return fig


# -- figures a technique declares (gpubench.contract.Plot) -------------------------------------
ROLE_STYLE = {"baseline": ("--", "s"), "optimized": ("-", "o"), "peer": (":", "^")}
LINESTYLES = ("-", "--", ":", "-.")


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def read_value(case: dict[str, Any], name: str, key: str) -> Any:
    """What ``key`` names for variant ``name`` of a case record: ``time`` (median seconds),
    ``peak_memory`` (bytes), ``speedup`` (over the baseline: a dict with ratio and CI), else a
    metric (a dotted key reads into a nested metric, e.g. ``series.t_s``)."""
    record = (case.get("variants") or {}).get(name) or {}
    if key == "time":
        return (record.get("stats") or {}).get("median")
    if key == "peak_memory":
        return record.get("peak_memory_bytes")
    if key == "speedup":
        return (case.get("speedups") or {}).get(name)
    value: Any = record.get("metrics") or {}
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _scalar(case: dict[str, Any], name: str, key: str, plot: Any) -> tuple[float, float, float] | None:
    """(value, low, high) of one point, scaled; low == high == value unless it has a CI."""
    raw = read_value(case, name, key)
    if isinstance(raw, dict):  # a speedup with its CI
        r, lo, hi = (_number(raw.get(k)) for k in ("ratio", "ci_low", "ci_high"))
        return None if r is None else (r, lo if lo is not None else r, hi if hi is not None else r)
    value = _number(raw)
    if value is None:
        return None
    if plot.relative:
        base = _number(read_value(case, _role_name(case, "baseline") or "", key))
        if base is None or value <= 0 or name == _role_name(case, "baseline"):
            return None
        value = base / value
    else:
        value *= plot.scale
    return value, value, value


def _role_name(case: dict[str, Any], role: str) -> str | None:
    return next((n for n, v in (case.get("variants") or {}).items() if v.get("role") == role), None)


def _chosen(case: dict[str, Any], plot: Any) -> list[tuple[str, str]]:
    """(variant name, role) of the variants the plot draws, roles resolved per case."""
    out = []
    for want in plot.variants:
        name = _role_name(case, want) if want in ROLE_STYLE else want
        record = (case.get("variants") or {}).get(name) if name else None
        if record is not None and (name, record.get("role")) not in out:
            out.append((name, record.get("role", "peer")))
    return out


def _sort_key(values: tuple) -> tuple:
    """Numbers in numeric order, anything else by its text, None last."""
    return tuple((v is None, isinstance(v, str), v if isinstance(v, (int, float)) else 0, str(v)) for v in values)


def _varying(cases: list[dict[str, Any]], exclude: Sequence[str]) -> list[str]:
    keys = list(dict.fromkeys(k for c in cases for k in (c.get("params") or {})))
    return [k for k in keys if k not in exclude and len({repr(c["params"].get(k)) for c in cases}) > 1]


def _splitting(cases: list[dict[str, Any]], x: str, exclude: Sequence[str]) -> list[str]:
    """Params that split the cases into lines: those taking several values at one x, or changing
    along x in a way not tied to it (text values, or numbers that go up and down again). A number
    that only moves with x (gpu-quick's batch = 16k tokens / seq_len) stays on one line."""
    out = []
    for k in _varying(cases, (x, *exclude)):
        at_x: dict[Any, set[str]] = {}
        for c in cases:
            at_x.setdefault(c["params"].get(x), set()).add(repr(c["params"].get(k)))
        if any(len(v) > 1 for v in at_x.values()):
            out.append(k)
            continue
        along = [next(iter(c["params"].get(k) for c in cases if c["params"].get(x) == xv))
                 for xv in sorted(at_x, key=lambda v: _sort_key((v,)))]
        numeric = all(_number(v) is not None for v in along)
        steps = [b - a for a, b in zip(along, along[1:])] if numeric else []
        if not numeric or not (all(d >= 0 for d in steps) or all(d <= 0 for d in steps)):
            out.append(k)
    return out


SPECIAL_NAMES = {"speedup": "measured speedup", "time": "time", "peak_memory": "peak memory"}
ACRONYMS = {"kv": "KV", "gpu": "GPU", "ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "end-to-end"}
UNIT_SUFFIXES = ("_gib", "_mib", "_kib", "_bytes", "_ms", "_us", "_s", "_pct")


def human(key: str) -> str:
    """What a legend or tick says for a plotted key: words, not the metric's name (the axis label
    carries the unit): ``weights_per_gpu_gib`` -> "weights per GPU", ``median_ttft_ms`` ->
    "median TTFT", ``output_tokens_per_s`` -> "output tokens/s", ``speedup`` -> "measured speedup"."""
    key = key.split(".")[-1]
    if key in SPECIAL_NAMES:
        return SPECIAL_NAMES[key]
    if key.endswith("_per_s"):
        key = key[:-len("_per_s")] + "/s"
    else:
        key = next((key[:-len(u)] for u in UNIT_SUFFIXES if key.endswith(u) and len(key) > len(u)), key)
    return " ".join(ACRONYMS.get(word, word) for word in key.split("_"))


def _params_label(params: dict[str, Any], keys: Sequence[str], defaults: dict[str, Any] | None = None) -> str:
    """``k=v`` for the keys, leaving out those at the technique's default (the lines a label
    tells apart still differ in at least one key that is not)."""
    defaults = defaults or {}
    return ", ".join(param_text(params, k) for k in keys if k not in defaults or params.get(k) != defaults[k])


def _grid(n: int, row_in: float, cols: int = 2) -> tuple[Figure, list[Any]]:
    cols = min(cols, n)
    rows = -(-n // cols)
    fig = _new_figure(row_in * rows + 0.6)
    axes = list(fig.subplots(rows, cols, squeeze=False).flat)
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def _line_figure(plot: Any, cases: list[dict[str, Any]], defaults: dict[str, Any]) -> Figure | None:
    cases = [c for c in cases if plot.x in (c.get("params") or {})]
    panels: dict[tuple, list[dict[str, Any]]] = {}
    for c in cases:
        panels.setdefault(tuple(c["params"].get(p) for p in plot.panels), []).append(c)
    drawn: list[tuple[tuple, dict[tuple[str, str, str, str], list[tuple[float, float, float, float]]]]] = []
    for key, members in sorted(panels.items(), key=lambda kv: _sort_key(kv[0])):
        split = _splitting(members, plot.x, plot.panels)
        lines: dict[tuple[str, str, str, str], list[tuple[float, float, float, float]]] = {}
        for c in members:
            x = _number(c["params"].get(plot.x))
            for name, role in _chosen(c, plot):
                for y in plot.ys:
                    point = _scalar(c, name, y, plot)
                    if x is not None and point is not None:
                        lines.setdefault((name, role, y, _params_label(c["params"], split, defaults)), []).append((x, *point))
        if any(len(points) > 1 for points in lines.values()):
            drawn.append((key, lines))
    if not drawn:
        return None
    cols = min(2, len(drawn))
    titles = [wrap(_params_label(dict(zip(plot.panels, key)), plot.panels), WIDTH_IN / cols - 0.6, 9)
              if plot.panels else "" for key, _ in drawn]
    with styled():
        fig, axes = _grid(len(drawn), 2.6 + 0.15 * (max(_lines(t) for t in titles) - 1))
        handles: dict[str, Any] = {}
        styles: dict[str, Any] = {}  # several figures on one axis: the legend names each dash once
        for ax, (key, lines), title in zip(axes, drawn, titles):
            names = list(dict.fromkeys(n for n, _, _, _ in lines))
            labels = list(dict.fromkeys(label for *_, label in lines))
            keys = list(dict.fromkeys((n, label) for n, _, _, label in lines))
            for (name, role, y, label), points in sorted(lines.items()):
                points.sort()
                xs, vs, lo, hi = zip(*points)
                marker = ROLE_STYLE.get(role, ("-", "o"))[1]
                if len(plot.ys) > 1:  # several figures: a colour per line (variant, label), a dash per figure
                    color = SERIES[keys.index((name, label)) % len(SERIES)]
                    style = LINESTYLES[plot.ys.index(y) % 4]
                    line_text = name + (f" ({label})" if label else "")
                    handles.setdefault(line_text, Line2D([], [], color=color, marker=marker, ms=3.5))
                    styles[y] = Line2D([], [], color="#444444", linestyle=style)
                elif len(names) > 1:  # several variants: the variant's colour, a dash per label
                    color = COLORS.get(role) or SERIES[(names.index(name) + 2) % len(SERIES)]
                    style = LINESTYLES[labels.index(label) % 4] if len(labels) > 1 else ROLE_STYLE.get(role, ("-",))[0]
                else:
                    color, style = SERIES[labels.index(label) % len(SERIES)], "-"
                text = name + (f" {y}" if len(plot.ys) > 1 else "") + (f" ({label})" if label else "")
                container = ax.errorbar(xs, vs, yerr=_error_bars(vs, lo, hi) if lo != vs or hi != vs else None,
                                        color=color, linestyle=style, marker=marker, ms=3.5, capsize=2)
                container.lines[0].set_label(text)
                if len(plot.ys) == 1:
                    handles.setdefault(text, container.lines[0])
            xs = [p[0] for pts in lines.values() for p in pts]
            if max(xs) > 8 * max(1e-12, min(xs)):
                log_axis(ax, "x", base=2)
            ticks_at(ax, xs)
            if plot.log_y and all(p[1] > 0 for pts in lines.values() for p in pts):
                log_axis(ax, "y", base=2)
            if plot.relative or plot.ys == ("speedup",):
                _reference(ax.axhline(1.0, color="black", lw=0.8, ls=":"))
            ax.set_xlabel(plot.xlabel or plot.x)
            ax.set_ylabel(plot.ylabel)
            if title:
                ax.set_title(title)
        if len(handles) == 1 and styles:  # one line per figure: the dashes say it all
            handles = {}
        legend_below(fig, {**handles, **{human(y): styles[y] for y in plot.ys if y in styles}})
    return fig


def _case_label(case: dict[str, Any], keys: Sequence[str]) -> str:
    return _params_label(case.get("params") or {}, keys) or case.get("technique", "")


def _stacked_figure(plot: Any, cases: list[dict[str, Any]], defaults: dict[str, Any]) -> Figure | None:
    """Stacked bars of the metrics in ``plot.y``: per x value (or per case), a bar per variant."""
    x = plot.x
    groups: dict[str, list[dict[str, Any]]] = {}
    label_keys = _varying(cases, (x,) if x else ())
    for c in cases:
        key = _params_label(c.get("params") or {}, label_keys, defaults) if x else ""
        groups.setdefault(key, []).append(c)
    bars: dict[str, list[tuple[str, str, str, list[float]]]] = {}
    for key, members in groups.items():
        for c in sorted(members, key=lambda c: _sort_key((c["params"].get(x),)) if x else ()):
            tick = str(c["params"].get(x)) if x else _case_label(c, label_keys)
            for name, role in _chosen(c, plot):
                parts = [_scalar(c, name, y, plot) for y in plot.ys]
                if all(p is not None for p in parts):
                    bars.setdefault(key, []).append((tick, name, role, [p[0] for p in parts]))
    bars = {k: v for k, v in bars.items() if v}
    if not bars:
        return None
    shown = {r[0]: wrap(f"{x}={r[0]}" if x else r[0], ROW_LABEL_IN, 8) for rows in bars.values() for r in rows}
    row_in = max(0.25, 0.13 * max(_lines(t) for t in shown.values()) / max(1, len(_chosen(cases[0], plot))))
    with styled():
        fig, axes = _grid(len(bars), 0.9 + row_in * max(len(v) for v in bars.values()), cols=1)
        handles: dict[str, Any] = {}
        for ax, (key, rows) in zip(axes, bars.items()):
            ticks = list(dict.fromkeys(r[0] for r in rows))
            names = list(dict.fromkeys(r[1] for r in rows))
            width = 0.8 / len(names)
            for tick, name, role, parts in rows:
                pos = ticks.index(tick) + (names.index(name) - (len(names) - 1) / 2) * width
                left = 0.0
                for y, value, color in zip(plot.ys, parts, itertools.cycle(SERIES)):
                    ax.barh(-pos, value, left=left, height=width * 0.9, color=color,
                            hatch="//" if role == "baseline" else None, edgecolor="white", label=y)
                    handles.setdefault(human(y), Patch(facecolor=color))
                    left += value
                ax.annotate(name, (left, -pos), xytext=(3, 0), textcoords="offset points", va="center", fontsize=6)
            ax.set_yticks([-i for i in range(len(ticks))], [shown[t] for t in ticks])
            ax.set_xlabel(plot.ylabel)
            ax.grid(axis="y", visible=False)
            ax.margins(x=0.15)
            if key:
                ax.set_title(wrap(key, WIDTH_IN - 0.6, 9))
        legend_below(fig, handles)
    return fig


def _per_case_figure(plot: Any, cases: list[dict[str, Any]]) -> Figure | None:
    """``bars``, ``series`` and ``cdf``: a panel per case (the first ``plot.max_cases``), titled by
    the params that vary (all of them: a panel's title names its case alone)."""
    label_keys = _varying(cases, ())
    panels = []
    for c in cases[:plot.max_cases]:
        content = []
        for name, role in _chosen(c, plot):
            if plot.kind == "bars":
                values = [_scalar(c, name, y, plot) for y in plot.ys]
                if any(v is not None for v in values):
                    content.append((name, role, [v[0] if v else math.nan for v in values]))
                continue
            ys = read_value(c, name, plot.ys[0])
            xs = read_value(c, name, plot.x) if plot.kind == "series" else None
            if isinstance(ys, list) and ys and (plot.kind == "cdf" or isinstance(xs, list)):
                content.append((name, role, (xs, ys)))
        if content:
            panels.append((_case_label(c, label_keys), content))
    if not panels:
        return None
    cols = 1 if plot.kind == "series" else min(2, len(panels))
    titles = [wrap(title, WIDTH_IN / cols - 0.6, 8) for title, _ in panels]
    with styled():
        fig, axes = _grid(len(panels), 2.4 + 0.13 * (max(_lines(t) for t in titles) - 1), cols=cols)
        handles: dict[str, Any] = {}
        for ax, (_, content), title in zip(axes, panels, titles):
            for k, (name, role, data) in enumerate(content):
                color = COLORS.get(role, SERIES[(k + 2) % len(SERIES)])
                style = ROLE_STYLE.get(role, ("-", "o"))[0]
                if plot.kind == "bars":
                    width = 0.8 / len(content)
                    pos = [i + (k - (len(content) - 1) / 2) * width for i in range(len(plot.ys))]
                    artist = ax.bar(pos, data, width=width, color=color, label=name)
                elif plot.kind == "series":
                    xs, ys = data
                    vals = [math.nan if v is None else v * plot.scale for v in ys]
                    (artist,) = ax.plot(xs[:len(vals)], vals, color=color, linestyle=style, lw=1,
                                        drawstyle="steps-post", label=name)
                else:
                    values = sorted(v * plot.scale for v in data[1] if _number(v) is not None)
                    (artist,) = ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], color=color,
                                        linestyle=style, drawstyle="steps-post", label=name)
                handles.setdefault(name, artist)
            if plot.kind == "bars":  # a name per bar group: one line, else a word a line (median as
                # p50), else upright
                slot_pt = (WIDTH_IN / cols - 0.8) / len(plot.ys) * 72
                fits = lambda names: all(len(line) * 6 * 0.67 <= slot_pt  # noqa: E731
                                         for n in names for line in n.split("\n"))
                names = [human(y) for y in plot.ys]
                for shorter in (lambda n: n.replace(" ", "\n"), lambda n: re.sub(r"\bmedian\b", "p50", n)):
                    if not fits(names):
                        names = [shorter(n) for n in names]
                ax.set_xticks(range(len(plot.ys)), names, fontsize=6, rotation=0 if fits(names) else 90)
                ax.set_ylabel(plot.ylabel)
            elif plot.kind == "series":
                ax.set_xlabel(plot.xlabel or plot.x.split(".")[-1])
                ax.set_ylabel(plot.ylabel)
            else:
                ax.set_xlabel(plot.ylabel)
                ax.set_ylabel("fraction")
            if plot.log_y and plot.kind != "cdf":
                log_axis(ax, "y")
            spread = [x for line in ax.get_lines() for x in line.get_xdata()] if plot.kind == "cdf" else []
            if spread and min(spread) > 0 and max(spread) > 30 * min(spread):
                log_axis(ax, "x")  # 3 ms beside 1 s: both distributions readable
            ax.set_title(title, fontsize=8)
        legend_below(fig, handles)
    return fig


def declared(plot: Any, cases: list[dict[str, Any]], defaults: dict[str, Any] | None = None) -> Figure | None:
    """The figure a technique declared (:class:`gpubench.contract.Plot`) drawn from its case
    records, or None when the run holds nothing to draw. ``defaults``: the technique's param
    defaults, left out of line labels."""
    if plot.kind == "line":
        return _line_figure(plot, cases, defaults or {})
    if plot.kind == "stacked":
        return _stacked_figure(plot, cases, defaults or {})
    return _per_case_figure(plot, cases)
