"""A case's history in a table cell: a hand-written inline SVG polyline of its figure run by run
(matplotlib per case would cost a figure per row), this run's point highlighted.

Only numbers go into the SVG's geometry; the one text, its tooltip, goes through
:func:`html.escape`, so nothing a results file holds reaches the markup unescaped.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from gpubench.reports.figure_style import COLORS, plain_number
from gpubench.reports.terminal import format_seconds

WIDTH_PX, HEIGHT_PX, PAD_PX = 96, 22, 3
CURRENT = "#d9711c"  # this run: the colour no line of the report uses for a variant


def figure_text(value: float, metric: str) -> str:
    """``value`` of ``metric`` as the report writes it: a time, or the plain number of a gate metric."""
    return format_seconds(value) if metric == "time" else f"{plain_number(value)} {metric}"


def coordinates(values: Sequence[float]) -> list[tuple[float, float]]:
    """(x, y) of each value in the cell's box: runs evenly spaced left to right, higher values
    higher up (a flat line sits in the middle)."""
    low, high = min(values), max(values)
    span_x = (WIDTH_PX - 2 * PAD_PX) / max(1, len(values) - 1)
    span_y = HEIGHT_PX - 2 * PAD_PX
    return [
        (PAD_PX + i * span_x, HEIGHT_PX / 2 if high == low else PAD_PX + (high - v) / (high - low) * span_y)
        for i, v in enumerate(values)
    ]


def sparkline_svg(values: Sequence[float], current: int, metric: str) -> str:
    """The SVG of ``values`` (run order) with point ``current`` (this run) marked."""
    xy = coordinates(values)
    points = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
    cx, cy = xy[current]
    tooltip = (
        f"{len(values)} runs on this device model: this run {figure_text(values[current], metric)}; "
        f"lowest {figure_text(min(values), metric)}, highest {figure_text(max(values), metric)}"
    )
    return (
        f'<svg class="sparkline" width="{WIDTH_PX}" height="{HEIGHT_PX}" viewBox="0 0 {WIDTH_PX} {HEIGHT_PX}" '
        f'role="img" aria-label="{html.escape(tooltip)}"><title>{html.escape(tooltip)}</title>'
        f'<polyline points="{points}" fill="none" stroke="{COLORS["optimized"]}" stroke-width="1.2"/>'
        f'<circle class="current" cx="{cx:.1f}" cy="{cy:.1f}" r="2.6" fill="{CURRENT}"/></svg>'
    )
