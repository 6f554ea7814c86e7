"""Figures a person can read at any sweep size (issue 35): a line is named by the params that
tell it apart (never one every line shares or one at its default), an axes carries no more lines
than its palette tells apart (small multiples past that), no figure is taller than a screen, a
heatmap's tick labels never print over each other, and an 864-case kv_cache sweep draws a bounded
number of marks and bytes (counted, not timed: the test does not depend on the machine's speed).
Figures are drawn with Agg from hand-made records; the whole file takes some seconds."""

import itertools
import random
import re

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.transforms import Bbox
from report_runs import KV_SWEEP_AXES, kv_sweep_doc
from test_kv_cache import _real_case as kv_case  # a kv_cache record with the technique's own metrics

from gpubench.contract import Plot
from gpubench.records.results import CaseRecord
from gpubench.reports import charts, drawing, figures, plots, sections, sweep
from gpubench.techniques import flash_attention, kv_cache

SCREEN_PX = 900  # a laptop's window at the report's width: no figure taller


def drawn(fig):
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def overlaps(boxes: list[Bbox]) -> list[tuple[Bbox, Bbox]]:
    return [
        (a, b)
        for a, b in itertools.combinations(boxes, 2)
        if (i := Bbox.intersection(a, b)) is not None and i.width * i.height >= 1.0
    ]


def legend_texts(fig) -> list[str]:
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]


@pytest.fixture(scope="module")
def kv_sweep() -> list[CaseRecord]:
    """864 kv_cache cases: 6 models x 4 KV formats x 3 lengths x 3 block sizes x 4 request counts."""
    case = kv_case("llama-2-7b")
    for v in case["variants"].values():
        v["samples_s"] = [1e-3] * 5
    doc = kv_sweep_doc({"cases": [case], "scenario": {"entries": [{}]}})
    return [CaseRecord.from_dict(c) for c in doc["cases"]]


def flash_speedup_cases() -> list[CaseRecord]:
    """The smoke run's flash_attention cases, shaped as issue 35 found them: 11 lines against
    seq_len, some entries setting block_m / head_dim_v / seq_len_q and the rest at their defaults."""
    defaults = flash_attention.TECHNIQUE.defaults()
    rng = random.Random(35)
    combos = [{"dtype": d, "causal": c} for d in ("float32", "bfloat16", "float16") for c in (False, True)] + [
        {"head_dim_v": 128, "head_dim": 192},
        {"seq_len_q": 64},
        {"block_m": 64, "block_n": 32},
        {"block_m": 32, "block_n": 32},
        {"kv_heads": 1},
    ]
    cases = []
    for combo in combos:
        for n in (128, 256, 512):
            params = {**defaults, "seq_len": n, **combo}
            r = rng.uniform(0.5, 3.0)
            cases.append(
                CaseRecord.from_dict(
                    {
                        "technique": "flash_attention",
                        "params": params,
                        "status": "passed",
                        "variants": {
                            "eager": {"role": "baseline", "stats": {"median": 1e-3}},
                            "triton": {"role": "optimized", "stats": {"median": 1e-3 / r}},
                        },
                        "speedups": {"triton": {"ratio": r, "ci_low": 0.9 * r, "ci_high": 1.1 * r, "n": 10}},
                    }
                )
            )
    return cases


# -- series: named by what varies, no more than a palette tells apart ------------------------------
def test_speedup_lines_are_named_by_varying_params_never_shared_or_default_ones():
    """Issue 35: flash_attention's legend read ``seq_len_q=0 head_dim_v=0 ... block_m=0 block_n=0``.
    A line's label names only params that vary across the figure and are not at the technique's
    default; the line whose every varying param is at its default reads "defaults"."""
    cases = flash_speedup_cases()
    defaults = flash_attention.TECHNIQUE.defaults()
    found = sections.speedup_figure(cases, [""] * len(cases), defaults)
    svg = found["svg"]
    for default_part in ("block_m=0", "block_n=0", "head_dim_v=0", "seq_len_q=0", "batch=", "heads=2"):
        assert default_part not in svg, default_part
    for varying_part in ("block_m=64", "head_dim_v=128", "seq_len_q=64", "dtype=bfloat16"):
        assert varying_part in svg, varying_part
    fig = charts.speedup_sweep(
        {
            ("head_dim=64", "causal=True"): [(1, 1.0, 1.0, 1.0), (2, 1.2, 1.1, 1.3)],
            ("head_dim=64", "causal=False"): [(1, 0.9, 0.8, 1.0), (2, 1.0, 0.9, 1.1)],
        },
        "n",
    )
    assert sorted(legend_texts(fig)) == ["causal=False", "causal=True"]  # head_dim=64: every line's


def test_more_lines_than_the_palette_tells_apart_become_small_multiples():
    """11 lines on one axes repeated colours; past MAX_SERIES a figure splits into panels sharing
    both axes, each with at most MAX_SERIES lines in distinct colours, one legend for all."""
    cases = flash_speedup_cases()
    fig_dict = sections.speedup_figure(cases, [""] * len(cases), flash_attention.TECHNIQUE.defaults())
    assert fig_dict is not None
    series = {}
    for c in cases:
        key = tuple(f"{k}={c.params[k]}" for k in ("dtype", "causal", "block_m"))
        series.setdefault(key, []).append((c.params["seq_len"], 1.0, 0.9, 1.1))
    series.update(
        {("dtype=x", f"causal={i}", "block_m=1"): [(128, 1.0, 0.9, 1.1), (256, 1.1, 1.0, 1.2)] for i in range(5)}
    )
    fig = charts.speedup_sweep(series, "seq_len")
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert len(shown) > 1
    for ax in shown:
        lines = [container.lines[0] for container in ax.containers]  # an errorbar a line
        assert 0 < len(lines) <= charts.MAX_SERIES
        assert len({(line.get_color(), line.get_marker()) for line in lines}) == len(lines)
        assert ax.get_title()  # which value of the splitting param the panel holds
    assert len(fig.legends) == 1


def test_split_series_uses_a_param_that_divides_the_lines():
    keys = [(f"dtype={d}", f"causal={c}") for d in "abcd" for c in (0, 1)]
    panels = charts.split_series(keys, limit=4)
    assert [title for title, _ in panels] == ["causal=0", "causal=1"]
    assert sorted(i for _, members in panels for i in members) == list(range(8))  # every line drawn once


# -- heights: no figure taller than a screen ---------------------------------------------------------
def test_no_figure_of_an_864_case_sweep_is_taller_than_a_screen(kv_sweep):
    """The memory breakdown was 41,700 px tall, opening with ~1,400 px of empty frame: every
    figure of a large sweep (declared, surface, per-case boxes and bars, speedup) now fits a
    screen, and one that leaves cases out says how many it drew."""
    labels = [f"#{i} " + " ".join(f"{k}={c.params[k]}" for k in KV_SWEEP_AXES) for i, c in enumerate(kv_sweep, 1)]
    made = {
        plot.title: plots.declared(plot, kv_sweep, kv_cache.TECHNIQUE.defaults()) for plot in kv_cache.TECHNIQUE.plots
    }
    made["surface"] = sweep.surface(kv_sweep, kv_cache.TECHNIQUE.headline_figures)
    made["latency"] = figures.latency_boxes(
        [
            (label, {"contiguous": c.variants["contiguous"].samples_s, "paged": c.variants["paged"].samples_s})
            for label, c in zip(labels, kv_sweep)
        ]
    )
    made["peak"] = figures.peak_bars(labels, {"% of peak": {"paged": [1.0] * len(labels)}})
    made["ratios"] = figures.ratio_points(labels, [1.0] * len(labels), [0.9] * len(labels), [1.1] * len(labels), "x")
    made["speedup"] = charts.speedup_sweep(
        {
            tuple(f"{k}={c.params[k]}" for k in KV_SWEEP_AXES if k != "max_len"): [(c.params["max_len"], 1.0, 0.9, 1.1)]
            for c in kv_sweep
        },
        "max_len",
    )
    for name, fig in made.items():
        texts = " ".join(t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text")))
        svg = drawing.to_svg(fig)
        assert drawing.svg_height_px(svg) <= SCREEN_PX, name
        assert len(svg) < 400_000, name  # was 9.3 MB for the page: drawing every case of every figure
        if name not in ("surface",) and "bytes" not in name:
            assert re.search(r"\d+ of \d+ (cases|panels|rows|bar groups) drawn", texts), name  # says what it left out


def test_a_short_figure_keeps_its_natural_height():
    """Bounding the height never stretches a small figure: two rows stay two rows' tall."""
    fig = figures.ratio_points(["#1 a=1", "#2 a=2"], [1.0, 2.0], [0.9, 1.8], [1.1, 2.2], "x")
    assert drawing.svg_height_px(drawing.to_svg(fig)) < 300


# -- the heatmap: labels apart ----------------------------------------------------------------------
def test_heatmap_tick_labels_never_overlap(kv_sweep):
    """The sweep's heatmap printed its x labels over each other: drawn with Agg, no two visible
    tick labels on either axis share a pixel, and every column and row is still labelled
    (thinned labels are the exception, not the rule, at this size)."""
    fig = sweep.surface(kv_sweep, kv_cache.TECHNIQUE.headline_figures)
    renderer = drawn(fig)
    ax = fig.axes[0]
    for axis in (ax.xaxis, ax.yaxis):
        boxes = [t.get_window_extent(renderer) for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
        assert len(boxes) >= 6
        assert not overlaps(boxes)
    assert fig.get_figwidth() == drawing.WIDTH_IN  # drawn at the report's width: text at its size


def test_heatmap_with_crowded_columns_thins_its_labels():
    """Sixty columns of long values: labels are thinned (every k-th kept) until none overlaps."""
    cases = [
        CaseRecord.from_dict(
            {
                "technique": "t",
                "params": {"x": f"value-number-{i:03d}", "y": y},
                "status": "passed",
                "variants": {
                    "b": {"role": "baseline", "stats": {"median": 1.0}},
                    "o": {"role": "optimized", "stats": {"median": 0.5}},
                },
                "speedups": {"o": {"ratio": 2.0, "ci_low": 1.9, "ci_high": 2.1, "n": 10}},
            }
        )
        for i in range(60)
        for y in (1, 2)
    ]
    fig = sweep.surface(cases, ())
    renderer = drawn(fig)
    ax = fig.axes[0]
    boxes = [t.get_window_extent(renderer) for t in ax.xaxis.get_ticklabels() if t.get_visible() and t.get_text()]
    assert 2 <= len(boxes) < 60
    assert not overlaps(boxes)


# -- a large sweep: bounded work --------------------------------------------------------------------
def test_an_864_case_sweep_draws_a_bounded_number_of_marks(kv_sweep):
    """Rendering time went to drawing every case of every figure (6,912 stacked bars, 1,728 boxes):
    counted, not timed, each figure of the 864-case sweep draws at most a screen's worth of marks."""
    breakdown = plots.declared(kv_cache.TECHNIQUE.plots[1], kv_sweep, kv_cache.TECHNIQUE.defaults())
    assert len(breakdown.axes[0].patches) <= 4 * 2 * 40  # metrics x variants x rows that fit
    boxes = figures.latency_boxes([(f"#{i}", {"a": [1.0, 2.0], "b": [1.5, 2.5]}) for i in range(864)])
    assert len(boxes.axes[0].patches) <= 2 * 60


def test_a_declared_line_figure_with_many_panels_draws_a_screens_worth_and_says_so(kv_sweep):
    """A line plot with a panel per value of two params (24 panels here) draws as many as fit a
    screen, evenly spread, and says how many of how many."""
    plot = Plot("bytes against max_len", y="bytes_reserved", x="max_len", panels=("model", "kv_dtype"))
    fig = plots.declared(plot, kv_sweep, kv_cache.TECHNIQUE.defaults())
    assert sum(ax.get_visible() for ax in fig.axes) < 24
    assert "of 24 panels drawn" in fig.get_suptitle()
    assert drawing.svg_height_px(drawing.to_svg(fig)) <= SCREEN_PX


def test_an_864_case_sweeps_report_holds_few_small_figures_none_taller_than_a_screen(tmp_path):
    """The whole page (issue 35: 9.3 MB, 46.5 s, a 41,700 px figure): counted, not timed, the
    report of an 864-case kv_cache sweep holds a handful of figures, each at most a screen tall,
    well under a megabyte of SVG together (7.6 MB before)."""
    from report_runs import sweep_doc, write_run

    from gpubench.reports import html

    case = kv_case("llama-2-7b")
    for v in case["variants"].values():
        v["samples_s"] = [1e-3] * 5
    header = {k: v for k, v in sweep_doc().items() if k not in ("cases", "scenario", "summary", "run_id")}
    doc = kv_sweep_doc({**header, "cases": [case], "scenario": {"name": "kv", "entries": [{}]}})
    page = html.write_report(write_run(tmp_path / "run", doc), read_history=False).html.read_text()
    svgs = re.findall(r"<svg\b.*?</svg>", page, re.S)
    assert 3 <= len(svgs) <= 8
    assert sum(map(len, svgs)) < 1_000_000
    assert max(drawing.svg_height_px(svg) for svg in svgs) <= SCREEN_PX
