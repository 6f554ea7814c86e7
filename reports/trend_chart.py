"""A case's trend over the history: one small chart per case, each variant's run medians with
their 95% CI as error bars, runs in order along x (labelled by short commit, linked to the
commit's page when the remote is known), and each change point as a vertical line where the new
level starts, labelled with its magnitude, red for a regression and green for an improvement."""
from __future__ import annotations

import itertools
from typing import Any, Callable, Sequence

from matplotlib.figure import Figure

from gpubench.history.changepoints import CaseHistory
from gpubench.history.store import Point
from gpubench.reports.drawing import (COLORS, SERIES, error_bars, legend_below, plain_number, reference, styled,
                                      time_unit)

WIDTH_IN, HEIGHT_IN = 4.6, 2.3
MAX_LABELS = 12  # commit labels along x before they are thinned
KIND_COLORS = {"regression": "#c0392b", "improvement": "#2e7d32"}
SHORT = 7  # characters of a commit hash on an axis


def run_key(p: Point) -> tuple[str, str]:
    return p.run_id, p.host


def short_commit(commit: str | None) -> str:
    return commit[:SHORT] if commit else "?"


def scale_of(histories: Sequence[CaseHistory]) -> tuple[str, float]:
    """The y axis's unit and scale: time in the unit that suits it, another figure as it is."""
    metric = histories[0].metric
    if metric != "time":
        return metric, 1.0
    unit, scale = time_unit([p.median for h in histories for p in h.points])
    return f"time ({unit})", scale


def _variant_colors(histories: Sequence[CaseHistory], roles: dict[str, str | None]) -> dict[str, str]:
    peers = itertools.cycle(SERIES[1:])
    return {h.variant: COLORS.get(roles.get(h.variant) or "", None) or next(peers) for h in histories}


def trend_figure(histories: Sequence[CaseHistory], runs: Sequence[Point], roles: dict[str, str | None],
                 link: Callable[[str | None], str | None]) -> Figure | None:
    """The chart of one case: ``histories`` (its variants, same metric), ``runs`` (every run any
    of them holds, in order: :func:`gpubench.history.trends.points_by_run`), ``roles`` (variant ->
    role), ``link`` (commit -> its URL or None)."""
    if not runs:
        return None
    x_of = {run_key(p): i for i, p in enumerate(runs)}
    label, scale = scale_of(histories)
    colors = _variant_colors(histories, roles)
    with styled():
        fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN))
        ax = fig.add_subplot()
        handles = {h.variant: _draw_variant(ax, h, x_of, scale, colors[h.variant], several=len(histories) > 1)
                   for h in histories}
        _commit_ticks(ax, runs, link)
        ax.set_ylabel(label)
        ax.set_xlim(-0.6, len(runs) - 0.4)
        fig.tight_layout()
        if len(histories) > 1:
            legend_below(fig, handles)  # under the axes, never on the data (as every report figure)
    return fig


def _draw_variant(ax, h: CaseHistory, x_of: dict[tuple[str, str], int], scale: float, color: str,
                  several: bool) -> Any:
    xs = [x_of[run_key(p)] for p in h.points]
    ys = [p.median / scale for p in h.points]
    lows = [(p.ci_low if p.ci_low is not None else p.median) / scale for p in h.points]
    highs = [(p.ci_high if p.ci_high is not None else p.median) / scale for p in h.points]
    drawn = ax.errorbar(xs, ys, yerr=error_bars(ys, lows, highs), marker="o", ms=3, capsize=2, lw=1, color=color,
                        label=h.variant)
    for change in h.changes:
        x = x_of[run_key(h.points[change.index])] - 0.5
        kind_color = KIND_COLORS[change.kind]
        reference(ax.axvline(x, color=kind_color, lw=1.0, ls="--"))
        text = f"{change.magnitude:+.1%}" + (f" {h.variant}" if several else "")
        ax.annotate(text, (x, 1.0), xycoords=("data", "axes fraction"), xytext=(2, -2), textcoords="offset points",
                    ha="left", va="top", fontsize=6.5, color=kind_color, fontweight="bold")
    return drawn


def _commit_ticks(ax, runs: Sequence[Point], link: Callable[[str | None], str | None]) -> None:
    """x ticks at runs, labelled by short commit (at most :data:`MAX_LABELS`, the last run always
    among them), each label a link to its commit's page when there is one."""
    step = -(-len(runs) // MAX_LABELS)
    shown = sorted({*range(len(runs) - 1, -1, -step)})
    ax.set_xticks(shown, [short_commit(runs[i].commit) for i in shown], rotation=45, ha="right", fontsize=6)
    for i, text in zip(shown, ax.get_xticklabels()):
        text.set_url(link(runs[i].commit))
    ax.grid(axis="x", visible=False)
    ax.yaxis.set_major_formatter(lambda v, _: plain_number(v))
