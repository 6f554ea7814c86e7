"""A case's trend over the history: one small chart per case, each variant's run medians with
their 95% CI as error bars in a panel of its own (its own y scale, so a slow variant never
squashes a fast one's step flat), runs in order along x (every run labelled by short commit, and
by its number among its commit's runs where a commit has several, each label linked to the
commit's page when the remote is known), and each change point as a vertical line where the new
level starts, labelled with its magnitude (labels close together stacked, never on each other),
red for a regression and green for an improvement."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gpubench.gate.history.changepoints import CaseHistory
from gpubench.gate.history.store import Point
from gpubench.reports.figure_style import COLORS, SERIES, error_bars, plain_number, reference, time_unit

if TYPE_CHECKING:
    from matplotlib.figure import Figure

WIDTH_IN, HEIGHT_IN = 4.6, 2.3
PANEL_IN = 1.5  # the height of each variant's panel where a case has several
LABEL_PT = 9.0  # the room along x a run's (vertical) commit label takes
MAX_WIDTH_IN = 14.0  # the widest a chart grows to label every run; past it labels are thinned
LABEL_FONT_PT = 6.5
MAX_LABELS = int((MAX_WIDTH_IN - 1.0) * 72 / LABEL_PT)  # commit labels along x before they are thinned
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


def run_labels(runs: Sequence[Point]) -> list[str]:
    """Each run's x label: its short commit, and ``#k`` (its number among that commit's runs, in
    order) where the commit has several runs, so no two runs read the same."""
    counts: dict[str, int] = {}
    for p in runs:
        counts[short_commit(p.commit)] = counts.get(short_commit(p.commit), 0) + 1
    seen: dict[str, int] = {}
    labels = []
    for p in runs:
        short = short_commit(p.commit)
        seen[short] = seen.get(short, 0) + 1
        labels.append(f"{short} #{seen[short]}" if counts[short] > 1 else short)
    return labels


def figure_width(runs: int) -> float:
    """Wide enough that every run's label has :data:`LABEL_PT` of x to itself, up to :data:`MAX_WIDTH_IN`."""
    return min(MAX_WIDTH_IN, max(WIDTH_IN, 1.0 + runs * LABEL_PT / 72))


def trend_figure(
    histories: Sequence[CaseHistory],
    runs: Sequence[Point],
    roles: dict[str, str | None],
    link: Callable[[str | None], str | None],
) -> Figure | None:
    """The chart of one case: ``histories`` (its variants, same metric), ``runs`` (every run any
    of them holds, in order: :func:`gpubench.gate.history.trends.points_by_run`), ``roles`` (variant ->
    role), ``link`` (commit -> its URL or None). Several variants: a panel each, one above the
    other, x shared, each with its own y scale."""
    from matplotlib.figure import Figure

    from gpubench.reports.drawing import styled

    if not runs:
        return None
    x_of = {run_key(p): i for i, p in enumerate(runs)}
    colors = _variant_colors(histories, roles)
    several = len(histories) > 1
    with styled():
        width = figure_width(len(runs))
        fig = Figure(figsize=(width, PANEL_IN * len(histories) + 0.8 if several else HEIGHT_IN))
        axes = fig.subplots(len(histories), 1, sharex=True, squeeze=False)[:, 0]
        for ax, h in zip(axes, histories):
            label, scale = scale_of([h])
            _draw_variant(ax, h, x_of, scale, colors[h.variant], several=several, width_in=width, runs=len(runs))
            ax.set_ylabel(label)
            if several:
                ax.set_title(h.variant, loc="left", fontsize=7, color=colors[h.variant])
            ax.set_xlim(-0.6, len(runs) - 0.4)
            ax.yaxis.set_major_formatter(lambda v, _: plain_number(v))
        _commit_ticks(axes[-1], runs, link)
        for ax in axes[:-1]:
            ax.tick_params(axis="x", labelbottom=False)
            ax.grid(axis="x", visible=False)
        fig.tight_layout()
    return fig


def _draw_variant(
    ax,
    h: CaseHistory,
    x_of: dict[tuple[str, str], int],
    scale: float,
    color: str,
    several: bool,
    width_in: float = WIDTH_IN,
    runs: int = 1,
) -> Any:
    xs = [x_of[run_key(p)] for p in h.points]
    ys = [p.median / scale for p in h.points]
    lows = [(p.ci_low if p.ci_low is not None else p.median) / scale for p in h.points]
    highs = [(p.ci_high if p.ci_high is not None else p.median) / scale for p in h.points]
    drawn = ax.errorbar(
        xs, ys, yerr=error_bars(ys, lows, highs), marker="o", ms=3, capsize=2, lw=1, color=color, label=h.variant
    )
    run_pt = max(1e-9, (width_in - 1.0) * 72 / max(1, runs))  # x room a run has on the axis, roughly
    rows: list[list[tuple[float, float]]] = []  # per row of labels: (x, right end) of each, in runs
    for change in h.changes:
        x = x_of[run_key(h.points[change.index])] - 0.5
        kind_color = KIND_COLORS[change.kind]
        reference(ax.axvline(x, color=kind_color, lw=1.0, ls="--"))
        text = f"{change.magnitude:+.1%}" + (f" {h.variant}" if several else "")
        end = x + (len(text) * LABEL_FONT_PT * 0.62 + 4) / run_pt  # a label runs right of its line
        row = next((i for i, taken in enumerate(rows) if all(end < a or x > b for a, b in taken)), len(rows))
        if row == len(rows):
            rows.append([])
        rows[row].append((x, end))
        ax.annotate(
            text,
            (x, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(2, -2 - row * (LABEL_FONT_PT + 2)),
            textcoords="offset points",
            ha="left",
            va="top",
            fontsize=LABEL_FONT_PT,
            color=kind_color,
            fontweight="bold",
        )
    if rows:  # room above the data for the rows of labels, so they sit over no point
        low, high = ax.get_ylim()
        ax.set_ylim(low, high + (high - low) * 0.14 * len(rows))
    return drawn


def _commit_ticks(ax, runs: Sequence[Point], link: Callable[[str | None], str | None]) -> None:
    """x ticks at runs, each labelled (:func:`run_labels`; past :data:`MAX_LABELS` runs thinned,
    the last run always among them), each label a link to its commit's page when there is one."""
    step = -(-len(runs) // MAX_LABELS)
    shown = sorted({*range(len(runs) - 1, -1, -step)})
    labels = run_labels(runs)
    ax.set_xticks(shown, [labels[i] for i in shown], rotation=90, fontsize=6)
    for i, text in zip(shown, ax.get_xticklabels()):
        text.set_url(link(runs[i].commit))
    ax.grid(axis="x", visible=False)
