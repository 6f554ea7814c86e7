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


def _params_label(params: dict[str, Any], keys: Sequence[str], defaults: dict[str, Any] | None = None) -> str:
    """``k=v`` for the keys, leaving out those at the technique's default (the lines a label
    tells apart still differ in at least one key that is not)."""
    defaults = defaults or {}
    return ", ".join(f"{k}={params.get(k)}" for k in keys if k not in defaults or params.get(k) != defaults[k])


def _plain_log(ax: Any, which: str, base: float = 2) -> None:
    """A log axis with plain-number tick labels (never mathtext such as 2^7)."""
    (ax.set_xscale if which == "x" else ax.set_yscale)("log", base=base)
    axis = ax.xaxis if which == "x" else ax.yaxis
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _legend_below(fig: Figure, handles: dict[str, Any]) -> None:
    """One legend for the whole figure, under the axes, where it covers no data."""
    if not handles:
        return
    longest = max(len(text) for text in handles)
    ncol = min(len(handles), 1 if longest > 48 else 2 if longest > 30 else 3)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=ncol, fontsize=7,
               bbox_to_anchor=(0.5, 0.0))
    rows = -(-len(handles) // ncol)
    legend_in = 0.15 * rows + 0.2
    fig.set_figheight(fig.get_figheight() + legend_in)  # the axes keep their height
    fig.tight_layout(rect=(0, legend_in / fig.get_figheight(), 1, 1))


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
    with styled():
        fig, axes = _grid(len(drawn), 2.6)
        handles: dict[str, Any] = {}
        for ax, (key, lines) in zip(axes, drawn):
            names = list(dict.fromkeys(n for n, _, _, _ in lines))
            labels = list(dict.fromkeys(label for *_, label in lines))
            for (name, role, y, label), points in sorted(lines.items()):
                points.sort()
                xs, vs, lo, hi = zip(*points)
                if len(plot.ys) > 1:  # several figures: a colour per line label, a dash per figure
                    color = SERIES[labels.index(label) % len(SERIES)]
                    style = LINESTYLES[plot.ys.index(y) % 4]
                elif len(names) > 1:  # several variants: the variant's colour, a dash per label
                    color = COLORS.get(role) or SERIES[(names.index(name) + 2) % len(SERIES)]
                    style = LINESTYLES[labels.index(label) % 4] if len(labels) > 1 else ROLE_STYLE.get(role, ("-",))[0]
                else:
                    color, style = SERIES[labels.index(label) % len(SERIES)], "-"
                text = name + (f" {y}" if len(plot.ys) > 1 else "") + (f" ({label})" if label else "")
                container = ax.errorbar(xs, vs, yerr=_error_bars(vs, lo, hi) if lo != vs or hi != vs else None,
                                        color=color, linestyle=style, marker=ROLE_STYLE.get(role, ("-", "o"))[1],
                                        ms=3.5, capsize=2)
                container.lines[0].set_label(text)
                handles.setdefault(text, container.lines[0])
            if max(p[0] for pts in lines.values() for p in pts) > 8 * max(1e-12, min(p[0] for pts in lines.values() for p in pts)):
                _plain_log(ax, "x")
            if plot.log_y and all(p[1] > 0 for pts in lines.values() for p in pts):
                _plain_log(ax, "y")
            if plot.relative or plot.ys == ("speedup",):
                _reference(ax.axhline(1.0, color="black", lw=0.8, ls=":"))
            ax.set_xlabel(plot.xlabel or plot.x)
            ax.set_ylabel(plot.ylabel)
            if plot.panels:
                ax.set_title(_params_label(dict(zip(plot.panels, key)), plot.panels))
        _legend_below(fig, handles)
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
    with styled():
        fig, axes = _grid(len(bars), 0.9 + 0.25 * max(len(v) for v in bars.values()), cols=1)
        handles: dict[str, Any] = {}
        for ax, (key, rows) in zip(axes, bars.items()):
            ticks = list(dict.fromkeys(r[0] for r in rows))
            names = list(dict.fromkeys(r[1] for r in rows))
            width = 0.8 / len(names)
            for tick, name, role, parts in rows:
                pos = ticks.index(tick) + (names.index(name) - (len(names) - 1) / 2) * width
                left = 0.0
                for y, value, color in zip(plot.ys, parts, itertools.cycle(SERIES)):
                    bar = ax.barh(-pos, value, left=left, height=width * 0.9, color=color,
                                  hatch="//" if role == "baseline" else None, edgecolor="white", label=y)
                    handles.setdefault(y, bar)
                    left += value
                ax.annotate(name, (left, -pos), xytext=(3, 0), textcoords="offset points", va="center", fontsize=6)
            ax.set_yticks([-i for i in range(len(ticks))], [f"{x}={t}" if x else t for t in ticks])
            ax.set_xlabel(plot.ylabel)
            ax.grid(axis="y", visible=False)
            ax.margins(x=0.15)
            if key:
                ax.set_title(key)
        _legend_below(fig, handles)
    return fig


def _per_case_figure(plot: Any, cases: list[dict[str, Any]]) -> Figure | None:
    """``bars``, ``series`` and ``cdf``: a panel per case (the first ``plot.max_cases``)."""
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
    with styled():
        fig, axes = _grid(len(panels), 2.4, cols=1 if plot.kind == "series" else 2)
        handles: dict[str, Any] = {}
        for ax, (title, content) in zip(axes, panels):
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
            if plot.kind == "bars":
                ax.set_xticks(range(len(plot.ys)), [y.removesuffix("_ms") for y in plot.ys], fontsize=6, rotation=30)
                ax.set_ylabel(plot.ylabel)
            elif plot.kind == "series":
                ax.set_xlabel(plot.xlabel or plot.x.split(".")[-1])
                ax.set_ylabel(plot.ylabel)
            else:
                ax.set_xlabel(plot.ylabel)
                ax.set_ylabel("fraction")
            if plot.log_y and plot.kind != "cdf":
                _plain_log(ax, "y", base=10)
            ax.set_title(title, fontsize=8)
        _legend_below(fig, handles)
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
