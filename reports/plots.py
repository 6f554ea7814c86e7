"""The figures a technique declares (:class:`gpubench.contract.Plot`), drawn from the run's case
records: line, stacked, bars, series and cdf (see the Plot docstring for what each draws). The
declaration comes from the run (what the technique declared when it ran), never from its code."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpubench.contract import Plot
from gpubench.records.results import CaseRecord, Speedup
from gpubench.reports.figure_style import (
    COLORS,
    MAX_HEIGHT_IN,
    ROW_LABEL_IN,
    SERIES,
    WIDTH_IN,
    error_bars,
    legend_below,
    reference,
    spread_pick,
    text_lines,
    wrap,
)
from gpubench.reports.terminal import param_text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROLE_STYLE = {"baseline": ("--", "s"), "optimized": ("-", "o"), "peer": (":", "^")}
LINESTYLES = ("-", "--", ":", "-.")


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def read_value(case: CaseRecord, name: str | None, key: str) -> Any:
    """What ``key`` names for variant ``name`` of a case record: ``time`` (median seconds),
    ``peak_memory`` (bytes), ``speedup`` (over the baseline: a dict with ratio and CI), else a
    metric (a dotted key reads into a nested metric, e.g. ``series.t_s``)."""
    record = case.variant(name)
    if record is None or name is None:  # (no record without a name)
        return None
    if key == "time":
        return record.median_s
    if key == "peak_memory":
        return record.peak_memory_bytes
    if key == "speedup":
        return case.speedups.get(name)
    value: Any = record.metrics
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _scalar(case: CaseRecord, name: str, key: str, plot: Plot) -> tuple[float, float, float] | None:
    """(value, low, high) of one point, scaled; low == high == value unless it has a CI."""
    raw = read_value(case, name, key)
    if isinstance(raw, Speedup):  # a speedup with its CI
        r, lo, hi = _number(raw.ratio), _number(raw.ci_low), _number(raw.ci_high)
        return None if r is None else (r, lo if lo is not None else r, hi if hi is not None else r)
    value = _number(raw)
    if value is None:
        return None
    if plot.relative:
        base = _number(read_value(case, case.role_variant("baseline"), key))
        if base is None or value <= 0 or name == case.role_variant("baseline"):
            return None
        value = base / value
    else:
        value *= plot.scale
    return value, value, value


def _chosen(case: CaseRecord, plot: Plot) -> list[tuple[str, str]]:
    """(variant name, role) of the variants the plot draws, roles resolved per case."""
    out = []
    for want in plot.variants:
        name = case.role_variant(want) if want in ROLE_STYLE else want
        record = case.variant(name)
        if name is not None and record is not None and (name, record.role) not in out:
            out.append((name, record.role or "peer"))
    return out


def _sort_key(values: tuple) -> tuple:
    """Numbers in numeric order, anything else by its text, None last."""
    return tuple((v is None, isinstance(v, str), v if isinstance(v, (int, float)) else 0, str(v)) for v in values)


def _varying(cases: list[CaseRecord], exclude: Sequence[str]) -> list[str]:
    keys = list(dict.fromkeys(k for c in cases for k in c.params))
    return [k for k in keys if k not in exclude and len({repr(c.params.get(k)) for c in cases}) > 1]


def _splitting(cases: list[CaseRecord], x: str, exclude: Sequence[str]) -> list[str]:
    """Params that split the cases into lines: those taking several values at one x, or changing
    along x in a way not tied to it (text values, or numbers that go up and down again). A number
    that only moves with x (gpu-quick's batch = 16k tokens / seq_len) stays on one line."""
    out = []
    for k in _varying(cases, (x, *exclude)):
        at_x: dict[Any, set[str]] = {}
        for c in cases:
            at_x.setdefault(c.params.get(x), set()).add(repr(c.params.get(k)))
        if any(len(v) > 1 for v in at_x.values()):
            out.append(k)
            continue
        along = [
            next(iter(c.params.get(k) for c in cases if c.params.get(x) == xv))
            for xv in sorted(at_x, key=lambda v: _sort_key((v,)))
        ]
        numbers = [_number(v) for v in along]
        numeric = all(v is not None for v in numbers)
        steps = [b - a for a, b in zip(numbers, numbers[1:]) if a is not None and b is not None] if numeric else []
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
        key = key[: -len("_per_s")] + "/s"
    else:
        key = next((key[: -len(u)] for u in UNIT_SUFFIXES if key.endswith(u) and len(key) > len(u)), key)
    return " ".join(ACRONYMS.get(word, word) for word in key.split("_"))


def _params_label(params: Mapping[str, Any], keys: Sequence[str], defaults: dict[str, Any] | None = None) -> str:
    """``k=v`` for the keys, leaving out those at the technique's default (the lines a label
    tells apart still differ in at least one key that is not)."""
    defaults = defaults or {}
    return ", ".join(param_text(params, k) for k in keys if k not in defaults or params.get(k) != defaults[k])


def _grid(n: int, row_in: float, cols: int = 2) -> tuple[Figure, list[Any]]:
    from gpubench.reports.drawing import new_figure

    cols = min(cols, n)
    rows = -(-n // cols)
    fig = new_figure(row_in * rows + 0.6)
    axes = list(fig.subplots(rows, cols, squeeze=False).flat)
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def _line_figure(plot: Plot, cases: list[CaseRecord], defaults: dict[str, Any]) -> Figure | None:
    from matplotlib.lines import Line2D

    from gpubench.reports.drawing import log_axis, styled, ticks_at

    x_key = plot.x
    if x_key is None:  # (contract.Plot: a line names its x; without one no case would be drawn)
        return None
    cases = [c for c in cases if x_key in c.params]
    panels: dict[tuple, list[CaseRecord]] = {}
    for c in cases:
        panels.setdefault(tuple(c.params.get(p) for p in plot.panels), []).append(c)
    drawn: list[tuple[tuple, dict[tuple[str, str, str, str], list[tuple[float, float, float, float]]]]] = []
    for key, members in sorted(panels.items(), key=lambda kv: _sort_key(kv[0])):
        split = _splitting(members, x_key, plot.panels)
        lines: dict[tuple[str, str, str, str], list[tuple[float, float, float, float]]] = {}
        for c in members:
            x = _number(c.params.get(x_key))
            for name, role in _chosen(c, plot):
                for y in plot.ys:
                    point = _scalar(c, name, y, plot)
                    if x is not None and point is not None:
                        lines.setdefault((name, role, y, _params_label(c.params, split, defaults)), []).append(
                            (x, *point)
                        )
        if any(len(points) > 1 for points in lines.values()):
            drawn.append((key, lines))
    if not drawn:
        return None
    fits = 2 * max(1, int((MAX_HEIGHT_IN - 2.0) / 2.75))  # two a row, beside titles and the legend
    left_out = (
        ""
        if len(drawn) <= fits
        else (f"{fits} of {len(drawn)} panels drawn, evenly spread (every case: the tables below)")
    )
    drawn = [drawn[i] for i in spread_pick(len(drawn), fits)]
    cols = min(2, len(drawn))
    titles = [
        wrap(_params_label(dict(zip(plot.panels, key)), plot.panels), WIDTH_IN / cols - 0.6, 9) if plot.panels else ""
        for key, _ in drawn
    ]
    with styled():
        fig, axes = _grid(len(drawn), 2.6 + 0.15 * (max(text_lines(t) for t in titles) - 1))
        handles: dict[str, Any] = {}
        styles: dict[str, Any] = {}  # several figures on one axis: the legend names each dash once
        for ax, (_, lines), title in zip(axes, drawn, titles):
            names = list(dict.fromkeys(n for n, _, _, _ in lines))
            labels = list(dict.fromkeys(label for *_, label in lines))
            keys = list(dict.fromkeys((n, label) for n, _, _, label in lines))
            for (name, role, y, label), points in sorted(lines.items()):
                points.sort()
                xs, vs, lo, hi = zip(*points)
                marker = ROLE_STYLE.get(role, ("-", "o"))[1]
                style: Any  # (a dash name: matplotlib's stubs want its Literal)
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
                container = ax.errorbar(
                    xs,
                    vs,
                    yerr=error_bars(vs, lo, hi) if lo != vs or hi != vs else None,
                    color=color,
                    linestyle=style,
                    marker=marker,
                    ms=3.5,
                    capsize=2,
                )
                container.lines[0].set_label(text)
                if len(plot.ys) == 1:
                    handles.setdefault(text, container.lines[0])
            all_xs = [p[0] for pts in lines.values() for p in pts]
            if max(all_xs) > 8 * max(1e-12, min(all_xs)):
                log_axis(ax, "x", base=2)
            ticks_at(ax, all_xs)
            if plot.log_y and all(p[1] > 0 for pts in lines.values() for p in pts):
                log_axis(ax, "y", base=2)
            if plot.relative or plot.ys == ("speedup",):
                reference(ax.axhline(1.0, color="black", lw=0.8, ls=":"))
            ax.set_xlabel(plot.xlabel or plot.x)
            ax.set_ylabel(plot.ylabel)
            if title:
                ax.set_title(title)
        if left_out:
            fig.suptitle(left_out, x=0.02, ha="left", fontsize=7)
        if len(handles) == 1 and styles:  # one line per figure: the dashes say it all
            handles = {}
        legend_below(fig, {**handles, **{human(y): styles[y] for y in plot.ys if y in styles}})
    return fig


def _case_label(case: CaseRecord, keys: Sequence[str]) -> str:
    return _params_label(case.params, keys) or case.technique


def _fit_screen(
    bars: dict[str, list[tuple[str, str, str, list[float]]]], row_in: float
) -> tuple[dict[str, list[tuple[str, str, str, list[float]]]], str]:
    """Of a stacked figure's panels and their bar groups, as many as fit a screen
    (:data:`MAX_HEIGHT_IN`), evenly spread in run order, and a sentence saying what was left out
    ("" when nothing was): an 864-case sweep draws a readable sample, not a 41,000 px column."""
    group_in = row_in * max(len({r[1] for r in rows}) for rows in bars.values())  # one tick: a bar a variant
    keys = list(bars)
    panels = [keys[i] for i in spread_pick(len(keys), max(1, int((MAX_HEIGHT_IN - 0.6) / (0.9 + 2 * group_in))))]
    per_panel = max(2, int(((MAX_HEIGHT_IN - 0.6) / len(panels) - 0.9) / group_in))
    kept: dict[str, list[tuple[str, str, str, list[float]]]] = {}
    for key in panels:
        ticks = list(dict.fromkeys(r[0] for r in bars[key]))
        chosen = {ticks[i] for i in spread_pick(len(ticks), per_panel)}
        kept[key] = [r for r in bars[key] if r[0] in chosen]
    total = sum(len({r[0] for r in rows}) for rows in bars.values())
    drawn = sum(len({r[0] for r in rows}) for rows in kept.values())
    if drawn == total:
        return kept, ""
    return kept, (
        f"{drawn} of {total} bar groups drawn, evenly spread in run order, so the figure fits a "
        f"screen; every case's figures are in the tables below"
    )


def _stacked_figure(plot: Plot, cases: list[CaseRecord], defaults: dict[str, Any]) -> Figure | None:
    """Stacked bars of the metrics in ``plot.y``: per x value (or per case), a bar per variant."""
    from matplotlib.patches import Patch

    from gpubench.reports.drawing import styled

    x = plot.x
    groups: dict[str, list[CaseRecord]] = {}
    label_keys = _varying(cases, (x,) if x else ())
    for c in cases:
        key = _params_label(c.params, label_keys, defaults) if x else ""
        groups.setdefault(key, []).append(c)
    bars: dict[str, list[tuple[str, str, str, list[float]]]] = {}
    for key, members in groups.items():
        for c in sorted(members, key=lambda c: _sort_key((c.params.get(x),)) if x else ()):
            tick = str(c.params.get(x)) if x else _case_label(c, label_keys)
            for name, role in _chosen(c, plot):
                scalars = [_scalar(c, name, y, plot) for y in plot.ys]
                found = [s[0] for s in scalars if s is not None]
                if len(found) == len(scalars):
                    bars.setdefault(key, []).append((tick, name, role, found))
    bars = {k: v for k, v in bars.items() if v}
    if not bars:
        return None
    shown = {r[0]: wrap(f"{x}={r[0]}" if x else r[0], ROW_LABEL_IN, 8) for rows in bars.values() for r in rows}
    row_in = max(0.25, 0.13 * max(text_lines(t) for t in shown.values()) / max(1, len(_chosen(cases[0], plot))))
    bars, left_out = _fit_screen(bars, row_in)
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
                    ax.barh(
                        -pos,
                        value,
                        left=left,
                        height=width * 0.9,
                        color=color,
                        hatch="//" if role == "baseline" else None,
                        edgecolor="white",
                        label=y,
                    )
                    handles.setdefault(human(y), Patch(facecolor=color))
                    left += value
                ax.annotate(name, (left, -pos), xytext=(3, 0), textcoords="offset points", va="center", fontsize=6)
            ax.set_yticks([-i for i in range(len(ticks))], [shown[t] for t in ticks])
            ax.set_xlabel(plot.ylabel)
            ax.grid(axis="y", visible=False)
            ax.margins(x=0.15)
            if key:
                ax.set_title(wrap(key, WIDTH_IN - 0.6, 9))
        if left_out:
            fig.suptitle(wrap(left_out, WIDTH_IN - 0.4, 7), x=0.02, ha="left", fontsize=7)
        legend_below(fig, handles)
    return fig


def _per_case_figure(plot: Plot, cases: list[CaseRecord]) -> Figure | None:
    """``bars``, ``series`` and ``cdf``: a panel per case (the first ``plot.max_cases``), titled by
    the params that vary (all of them: a panel's title names its case alone)."""
    from gpubench.reports.drawing import log_axis, styled

    label_keys = _varying(cases, ())
    panels = []
    for c in cases[: plot.max_cases]:
        content: list[tuple[str, str, Any]] = []  # (name, role, the bars' values or (xs, ys))
        for name, role in _chosen(c, plot):
            if plot.kind == "bars":
                values = [_scalar(c, name, y, plot) for y in plot.ys]
                if any(v is not None for v in values):
                    content.append((name, role, [v[0] if v else math.nan for v in values]))
                continue
            ys = read_value(c, name, plot.ys[0])
            xs = read_value(c, name, plot.x) if plot.kind == "series" and plot.x is not None else None
            if isinstance(ys, list) and ys and (plot.kind == "cdf" or isinstance(xs, list)):
                content.append((name, role, (xs, ys)))
        if content:
            panels.append((_case_label(c, label_keys), content))
    if not panels:
        return None
    cols = 1 if plot.kind == "series" else min(2, len(panels))
    titles = [wrap(title, WIDTH_IN / cols - 0.6, 8) for title, _ in panels]
    with styled():
        fig, axes = _grid(len(panels), 2.4 + 0.13 * (max(text_lines(t) for t in titles) - 1), cols=cols)
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
                    (artist,) = ax.plot(
                        xs[: len(vals)], vals, color=color, linestyle=style, lw=1, drawstyle="steps-post", label=name
                    )
                else:
                    values = sorted(v * plot.scale for v in data[1] if _number(v) is not None)
                    (artist,) = ax.plot(
                        values,
                        [(i + 1) / len(values) for i in range(len(values))],
                        color=color,
                        linestyle=style,
                        drawstyle="steps-post",
                        label=name,
                    )
                handles.setdefault(name, artist)
            if plot.kind == "bars":  # a name per bar group: one line, else a word a line (median as
                # p50), else upright
                slot_pt = (WIDTH_IN / cols - 0.8) / len(plot.ys) * 72
                fits = lambda names: all(
                    len(line) * 6 * 0.67 <= slot_pt  # noqa: B023 - called in this iteration only
                    for n in names
                    for line in n.split("\n")
                )
                names = [human(y) for y in plot.ys]
                for shorter in (lambda n: n.replace(" ", "\n"), lambda n: re.sub(r"\bmedian\b", "p50", n)):
                    if not fits(names):
                        names = [shorter(n) for n in names]
                ax.set_xticks(range(len(plot.ys)), names, fontsize=6, rotation=0 if fits(names) else 90)
                ax.set_ylabel(plot.ylabel)
            elif plot.kind == "series":
                ax.set_xlabel(plot.xlabel or (plot.x or "").split(".")[-1])
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


def declared(
    plot: Plot, cases: Sequence[CaseRecord | Mapping[str, Any]], defaults: dict[str, Any] | None = None
) -> Figure | None:
    """The figure a technique declared (:class:`gpubench.contract.Plot`) drawn from its case
    records (as a results document holds them, or read back), or None when the run holds nothing
    to draw. ``defaults``: the technique's param defaults, left out of line labels."""
    records = [c if isinstance(c, CaseRecord) else CaseRecord.from_dict(c) for c in cases]
    if plot.kind == "line":
        return _line_figure(plot, records, defaults or {})
    if plot.kind == "stacked":
        return _stacked_figure(plot, records, defaults or {})
    return _per_case_figure(plot, records)
