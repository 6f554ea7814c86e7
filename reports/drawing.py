"""Drawing helpers every report figure shares: the style, SVG output, plain-number log axes,
legends under the axes, wrapped row labels.

Figures are made with ``matplotlib.figure.Figure`` directly, never through pyplot: no GUI
backend, no global figure list, nothing left open. :func:`to_svg` renders with matplotlib's SVG
writer, which escapes any text (case labels come from scenario files); mathtext is off, so a ``$``
in a label is just a character.

Readable by construction: every log axis goes through :func:`log_ticks` (plain-number labels such as
"128", "1k", "0.1", at least two of them in view), including those a technique's own hook made,
which :func:`to_svg` passes through it too; legends sit under the axes (:func:`legend_below`),
never on data; row labels of horizontal charts leave out what every row shares and wrap
(:func:`row_labels`), and a single row's label goes above its axes.

:func:`mark_data` gives the artists that carry data (lines with points, bars, collections, images:
not the frame, ticks, grid or reference lines) an SVG id starting with ``data-``; the report uses
its count to refuse empty axes (a technique's own figures included), and a reader or a test can
find the data in the SVG.

What needs no matplotlib (colours, sizes, plain numbers, row labels, legend sizes) is in
:mod:`gpubench.reports.figure_style`, re-exported here; only this module imports matplotlib at
its top, and the chart modules import it where they draw.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import math
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, Locator, LogFormatter, MaxNLocator, NullFormatter

from gpubench.reports.figure_style import (  # noqa: F401 - re-exported: drawing.X is what figures have used
    COLORS,
    CSS_PX_PER_IN,
    MAX_HEIGHT_IN,
    REFERENCE,
    ROW_LABEL_IN,
    SERIES,
    WIDTH_IN,
    _spaced,
    error_bars,
    label_rows,
    legend_below,
    legend_columns,
    legend_height_in,
    plain_number,
    reference,
    row_labels,
    rows_that_fit,
    spread_pick,
    svg_height_px,
    text_lines,
    thin_ticks,
    time_unit,
    variant_color,
    wrap,
)

_ids = itertools.count(1)
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


@contextlib.contextmanager
def styled() -> Iterator[None]:
    """The report's matplotlib settings (figures are built and saved inside this): the defaults of
    matplotlib and the user's matplotlibrc, then :data:`STYLE`; never what some code (a technique's
    module, a notebook) set in this process, so a figure is the same in any process (the figure
    cache keeps it). Everything is restored on leaving."""
    with matplotlib.rc_context():
        matplotlib.rc_file_defaults()
        # type: ignore: matplotlib's stubs want each key as one of its rc names' Literals; STYLE's
        # are such names (matplotlib checks them at run time), written as plain strings.
        matplotlib.rcParams.update(STYLE)  # type: ignore[arg-type]
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
        fig.savefig(
            buf,
            format="svg",
            bbox_inches="tight",
            metadata={"Date": None, "Creator": None, "Format": None, "Type": None},
        )
    close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


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
            if isinstance(artist, Line2D) and np.size(artist.get_xdata()) == 0:
                continue  # a legend proxy
            if isinstance(artist, PathCollection) and np.size(artist.get_offsets()) == 0:
                continue
            if artist.get_gid() is None:
                artist.set_gid(f"data-{next(_ids)}")
            count += 1
    return count


def new_figure(height_in: float) -> Figure:
    """A figure of the report's width, ``height_in`` tall within [1.8, :data:`MAX_HEIGHT_IN`]."""
    return Figure(figsize=(WIDTH_IN, min(MAX_HEIGHT_IN, max(1.8, height_in))))


# -- log axes, explicit ticks ------------------------------------------------------------------


PLAIN = FuncFormatter(lambda v, _: plain_number(v))


class PlainLogLocator(Locator):
    """Major ticks of a log axis, at least two in view: the powers of the base when two or more
    fall in the view (thinned to at most 8), else 1-2-5 steps (1, 2, 5, 10, 20, ...), else evenly
    spaced round numbers (a view narrower than 2x)."""

    def __init__(self, base: float = 10) -> None:
        self.base = base

    def __call__(self) -> list[float]:
        if self.axis is None:  # (matplotlib calls a locator once it is set on an axis)
            return []
        return self.tick_values(*self.axis.get_view_interval())

    def tick_values(self, vmin: float, vmax: float) -> list[float]:
        lo, hi = sorted((vmin, vmax))
        if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= 0:
            return []
        lo = max(lo, hi * 1e-12)
        inside = lambda vs: sorted({v for v in vs if lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9)})
        first, last = math.floor(math.log(lo, self.base)) - 1, math.ceil(math.log(hi, self.base)) + 1
        powers = inside(self.base**k for k in range(first, last + 1))
        if len(powers) >= 2:
            step = -(-len(powers) // 8)
            return powers[::step]
        decades = range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
        steps = inside(m * 10.0**k for k in decades for m in (1, 2, 5))
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


def log_x_if_spread(ax: Any, values: Sequence[float]) -> None:
    """A log x scale when the values span more than 8x."""
    positive = [v for v in values if v > 0]
    if len(positive) == len(values) and positive and max(positive) / min(positive) > 8:
        log_axis(ax, "x")


def ticks_at(ax: Any, xs: Sequence[float]) -> None:
    """x ticks at the swept values when there are few (12 or fewer), spaced so none overlap:
    a param swept over 2 and 4 reads 2, 4, not 2.00, 2.25, ..."""
    xs = sorted(set(xs))
    if 1 <= len(xs) <= 12:
        kept = _spaced(xs, ax.xaxis.get_scale() == "log")
        ax.set_xticks(kept, [plain_number(x) for x in kept])
        ax.xaxis.set_minor_formatter(NullFormatter())
