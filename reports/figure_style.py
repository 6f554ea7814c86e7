"""What every report figure shares that needs no matplotlib: the colours, the sizes (a figure
no taller than a screen), plain-number labels, row labels that leave out what every row shares
and wrap, legends sized to fit.

:mod:`gpubench.reports.drawing` adds what does need matplotlib (the style, SVG output, log axes);
the chart modules import it only where they draw, so a report whose figures are all in the
figure cache (:mod:`gpubench.reports.figure_cache`) imports no matplotlib (0.7 s of a report's
start on a quiet machine).
"""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Sequence
from typing import Any

COLORS = {"baseline": "#8c8c8c", "optimized": "#1f6fb4"}
SERIES = ("#1f6fb4", "#d9711c", "#2e9b45", "#c0392b", "#7d4fb0", "#8c564b", "#d45ca8", "#17a2b8")
WIDTH_IN = 7.0
# A screen: the report shows a figure at its natural size (1 in = 96 CSS px), so 9 in is ~860 px,
# what a 900 px window shows at once. A figure is drawn no taller; where its rows would not fit,
# the chart shows fewer (saying which) or splits into panels.
MAX_HEIGHT_IN = 9.0
CSS_PX_PER_IN = 96
REFERENCE = "reference"  # gid of what is drawn for orientation (the 1x line, case shading), not data


def variant_color(variant: str, k: int) -> str:
    """The colour of the ``k``-th variant of a figure: the same in every figure that lists the
    variants in the same order."""
    return COLORS.get(variant, SERIES[(k + 2) % len(SERIES)])


def reference(artist: Any) -> None:
    artist.set_gid(REFERENCE)


def time_unit(seconds: Sequence[float]) -> tuple[str, float]:
    """The unit (name, seconds per unit) that suits the typical value of ``seconds``."""
    typical = sorted(seconds)[len(seconds) // 2] if seconds else 1.0
    for name, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if typical >= scale:
            return name, scale
    return "ns", 1e-9


def rows_that_fit(row_in: float, fixed_in: float = 1.2) -> int:
    """How many rows of ``row_in`` inches fit a figure of :data:`MAX_HEIGHT_IN` beside
    ``fixed_in`` inches of axes, titles and legend."""
    return max(2, int((MAX_HEIGHT_IN - fixed_in) / max(row_in, 1e-3)))


def spread_pick(n: int, k: int) -> list[int]:
    """``k`` of ``range(n)``, evenly spread, first and last included (all of them when n <= k)."""
    if n <= k:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)}) if k > 1 else [0]


def svg_height_px(svg: str) -> float:
    """The CSS pixel height at which the report shows ``svg`` (matplotlib writes it in points)."""
    found = re.search(r'<svg[^>]*\bheight="([\d.]+)(pt|px)?"', svg)
    if not found:
        raise ValueError("an SVG without a height")
    value = float(found.group(1))
    return value * CSS_PX_PER_IN / 72 if found.group(2) in (None, "pt") else value


def thin_ticks(ax: Any, which: str, fontsize: float, rotated: bool = False, gap_pt: float = 2.0) -> int:
    """Hide tick labels of ``which`` ("x" or "y") so none overlaps the next: every k-th kept,
    k from the labels' sizes at ``fontsize`` against the axes' length per tick (estimated from
    the text, with no drawing: the test checks the drawn boxes). Returns k."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    labels = [t for t in axis.get_ticklabels() if t.get_text()]
    if len(labels) < 2:
        return 1
    fig = ax.get_figure()
    box = ax.get_position()
    length_pt = (box.width * fig.get_figwidth() if which == "x" else box.height * fig.get_figheight()) * 72
    per_tick = length_pt / len(labels)
    along_text = (which == "x") != rotated  # the label's extent along the axis is its text width
    if along_text:
        need = max(max(len(line) for line in t.get_text().split("\n")) for t in labels) * fontsize * 0.62
    else:
        need = max(t.get_text().count("\n") + 1 for t in labels) * fontsize * 1.25
    k = max(1, math.ceil((need + gap_pt) / per_tick))
    if k > 1:
        for i, t in enumerate(labels):
            t.set_visible(i % k == 0)
    return k


# -- plain text: numbers, labels, legends -------------------------------------------------------
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


def legend_columns(texts: Sequence[str]) -> int:
    """Legend columns: as many as fit the width at 7 pt (at most 4)."""
    longest = max(len(text) for text in texts)
    return max(1, min(len(texts), 4, int(WIDTH_IN * 72 / ((longest + 6) * 7 * 0.6))))


def legend_height_in(texts: Sequence[str]) -> float:
    """The height :func:`legend_below` adds to a figure for a legend of ``texts``."""
    return 0.15 * -(-len(texts) // legend_columns(texts)) + 0.2 if texts else 0.0


def legend_below(fig: Any, handles: dict[str, Any]) -> None:
    """One legend for the whole figure, under the axes, where it covers no data; the figure grows
    by the legend's height, so the axes keep theirs."""
    if not handles:
        return
    ncol = legend_columns(list(handles))
    fig.legend(
        list(handles.values()), list(handles), loc="lower center", ncol=ncol, fontsize=7, bbox_to_anchor=(0.5, 0.0)
    )
    legend_in = legend_height_in(list(handles))
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


def text_lines(text: str) -> int:
    return text.count("\n") + 1


def error_bars(values: Sequence[float], lows: Sequence[float], highs: Sequence[float]) -> list[list[float]]:
    """Distances below and above each value (never negative: a CI may not contain its point)."""
    return [[max(0.0, v - lo) for v, lo in zip(values, lows)], [max(0.0, hi - v) for v, hi in zip(values, highs)]]
