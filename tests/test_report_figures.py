"""Report figures are readable: plain-text tick labels (no mathtext), at least two labels on every
log axis, legends off the data, row labels that leave out what every row shares, and a KV-cache
memory breakdown whose KV shows in every row. Figures are built from small hand-made case dicts
(and, for kv_cache, the technique's own metrics), drawn with Agg; each test takes about a second."""

import itertools
import re

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.transforms import Bbox
from test_kv_cache import _real_case as kv_case  # a kv_cache record with the technique's own metrics

from gpubench.reports import figures
from gpubench.serving.bench import LATENCY_PERCENTILES
from gpubench.serving.bench import PLOTS as SERVING_PLOTS
from gpubench.techniques import flash_attention, kv_cache, speculative_decoding

PLAIN_LABEL = re.compile(r"^-?[0-9]+(\.[0-9]+)?(e[-+][0-9]+)?[kMGT]?$")


def drawn(fig):
    """``fig`` laid out and drawn with Agg; the renderer, for window extents."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def shown_labels(axis) -> list[str]:
    """The tick labels an axis shows after a draw (ticks inside the view, non-empty text)."""
    return [t.get_text() for t in axis.get_majorticklabels() if t.get_visible() and t.get_text()]


def log_axes(fig):
    return [axis for ax in fig.axes if ax.get_visible() for axis in (ax.xaxis, ax.yaxis) if axis.get_scale() == "log"]


# -- hand-made records ---------------------------------------------------------------------------
def spec_case(drafter, k, adaptive=False, temperature=0.0):
    ratio = 1.0 + 0.1 * k + (0.3 if drafter == "ngram" else 0.0)
    metrics = {
        "predicted_speedup": ratio * 1.1,
        "predicted_speedup_with_verify_cost": ratio * 0.8,
        "acceptance_rate": 0.5,
        "mean_accepted_length": 2.0,
        "tokens_per_s": 100 * ratio,
    }
    params = {
        **speculative_decoding.TECHNIQUE.defaults(),
        "drafter": drafter,
        "k": k,
        "adaptive_k": adaptive,
        "temperature": temperature,
    }
    return {
        "technique": "speculative_decoding",
        "params": params,
        "variants": {
            "plain": {"role": "baseline", "metrics": {"tokens_per_s": 100.0}},
            "draft_verify": {"role": "optimized", "metrics": metrics},
        },
        "speedups": {"draft_verify": {"ratio": ratio, "ci_low": ratio * 0.9, "ci_high": ratio * 1.1}},
    }


def spec_cases():
    """The smoke run's speculative sweep: 12 legend entries before the legend was factored."""
    return [spec_case(d, k) for d in ("draft_model", "ngram") for k in (2, 4)] + [
        spec_case("ngram", 4, adaptive=True),
        spec_case("ngram", 4, temperature=1.0),
        spec_case("draft_model", 4, temperature=1.0),
    ]


def flash_case(seq_len, causal):
    tflops = 0.02 * seq_len**0.5
    variants = {
        name: {
            "role": role,
            "metrics": {"tflops": tflops * f},
            "stats": {"median": 1e-3 * seq_len / 128},
            "peak_memory_bytes": 2**20 * seq_len**2 / 1e3 * f,
        }
        for name, role, f in (("eager", "baseline", 1.0), ("torch_tiled", "optimized", 0.6))
    }
    params = {**flash_attention.TECHNIQUE.defaults(), "seq_len": seq_len, "causal": causal}
    return {"technique": "flash_attention", "params": params, "variants": variants}


def serving_case(requests, scale):
    """A serving record whose latency percentiles span less than one decade (1.2-7 ms): a log axis
    with plain powers of ten would label one tick, or none."""
    variants = {}
    for (name, role), f in zip((("static", "baseline"), ("continuous", "optimized")), (1.0, scale)):
        lat = {key: (1.2 + i * 0.7) * f for i, key in enumerate(LATENCY_PERCENTILES)}
        series = {
            "t_s": [0.0, 0.1, 0.2, 0.3],
            "running": [1, 3, 2, 0],
            "kv_utilization": [0.2, 0.5, 0.4, 0.1],
            "ttft_ms": [1.0 * f, 2.0, 3.5, 400.0 * f],
            "e2e_ms": [10.0, 20.0 * f, 31.0],
        }  # TTFT: log x
        variants[name] = {"role": role, "metrics": {"output_tokens_per_s": 900.0 * f, **lat, "series": series}}
    params = {
        "requests": requests,
        "arrival": "poisson:150",
        "prompt_len": "uniform:16:64",
        "output_len": "exp:48:160",
        "max_len": 256,
        "kv_budget_mib": 2.0,
        "block_size": 16,
        "max_batch": 32,
        "min_preemptions": 0,
    }
    return {"technique": "paged_kv_serving", "params": params, "variants": variants}


def box_rows(n, spread=(0.6, 1.6)):
    """Timing samples whose range (6-16 ms) holds a single power of ten."""
    return [
        (
            f"#{i} layers={i} hidden=64 batch=2 seq_len=64 vocab=256 copy_delay_ms=0.0",
            {
                "one_buffer": [spread[1] * 1e-2 * (1 + 0.02 * j) for j in range(8)],
                "two_buffers": [spread[0] * 1e-2 * (1 + 0.02 * j) for j in range(8)],
            },
        )
        for i in range(1, 6)
    ]


def own_hook_figure():
    """A technique's own hook that makes a log axis the matplotlib way (default formatter: mathtext)
    and fixes its ticks without labels."""
    with figures.styled():
        fig = Figure(figsize=(4, 3))
        ax = fig.add_subplot()
        ax.plot([128, 256, 512, 1024], [1.0, 3.0, 9.0, 27.0])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks([128, 1024])
    return fig


def every_figure():
    """(name, figure) for every figure path: the generic builders and each declared kind."""
    wide = [
        (
            f"#{i} model=m{i}",
            {"baseline": [10 ** (i - 3) * (1 + 0.05 * j) for j in range(6)], "optimized": [2 * 10 ** (i - 3)] * 6},
        )
        for i in range(4)
    ]
    made = {
        "speedup_sweep": figures.speedup_sweep(
            {
                "causal=False": [(64, 0.5, 0.4, 0.6), (77, 0.6, 0.5, 0.7), (100, 0.7, 0.6, 0.8), (512, 0.9, 0.8, 1.0)],
                "causal=True": [(64, 0.4, 0.3, 0.5), (4096, 0.8, 0.7, 0.9)],
            },
            "seq_len",
        ),
        "ratio_points": figures.ratio_points(
            ["#1 a=1 b=2", "#2 a=1 b=3"], [0.5, 40.0], [0.4, 30.0], [0.6, 50.0], "speedup over baseline (x)"
        ),
        "latency_boxes_one_decade": figures.latency_boxes(box_rows(5)),
        "latency_boxes_four_decades": figures.latency_boxes(wide),
        "peak_bars": figures.peak_bars(
            [r[0] for r in box_rows(3)],
            {"% of peak FLOP/s": {"baseline": [10.0, 20.0, 30.0], "optimized": [12.0, 22.0, 39.0]}},
        ),
        "telemetry": figures.telemetry_timeline(
            [0.0, 1.0, 2.0, 3.0], [("power (W)", [100.0, 300.0, 310.0, 120.0])], [(0.5, 2.5, "#1")], [1.0, 2.0]
        ),
        "own_hook": own_hook_figure(),
    }
    flash = [flash_case(n, c) for n in (128, 512, 1024, 4096) for c in (False, True)]
    for plot in flash_attention.TECHNIQUE.plots:
        made[f"flash: {plot.title}"] = figures.declared(plot, flash, flash_attention.TECHNIQUE.defaults())
    for plot in speculative_decoding.TECHNIQUE.plots[:2]:
        made[f"spec: {plot.title}"] = figures.declared(plot, spec_cases(), speculative_decoding.TECHNIQUE.defaults())
    for plot in SERVING_PLOTS:  # bars (percentiles on a log axis), series, CDFs
        made[f"serving: {plot.title}"] = figures.declared(plot, [serving_case(50, 0.5), serving_case(12, 2.0)])
    for plot in SERVING_PLOTS[:2]:
        made[f"serving, one case: {plot.title}"] = figures.declared(plot, [serving_case(50, 0.5)])
    assert all(fig is not None for fig in made.values()), [k for k, f in made.items() if f is None]
    return made


@pytest.fixture(scope="module")
def all_figures():
    return every_figure()


@pytest.fixture(scope="module")
def drawn_figures(all_figures):
    """Every figure of :func:`every_figure` drawn once with Agg, with its renderer: the tests that
    measure a drawn figure (tick labels, legends, extents) read the same draw, as drawing a
    figure again lays it out the same."""
    return {name: (fig, drawn(fig)) for name, fig in all_figures.items()}


# -- 1: plain text --------------------------------------------------------------------------------
def test_no_mathtext_in_any_figures_svg_log_axes_included(all_figures):
    """Every figure path, a technique's own log axes too, reaches the SVG as plain text: no
    ``$\\mathdefault{2^{7}}$``, no ``$`` at all (no label here holds one)."""
    assert any(log_axes(fig) for fig in all_figures.values())
    for name, fig in all_figures.items():
        svg = figures.to_svg(fig)
        assert "mathdefault" not in svg and "$" not in svg and "\\times" not in svg, name
        for axis in log_axes(fig):
            assert all(PLAIN_LABEL.match(t) for t in shown_labels(axis)), (name, shown_labels(axis))


def test_plain_numbers_read_as_a_person_writes_them():
    assert [figures.plain_number(v) for v in (128, 1024, 1000, 2500, 1e6, 0.1, 0.25, 5)] == [
        "128",
        "1024",
        "1k",
        "2.5k",
        "1M",
        "0.1",
        "0.25",
        "5",
    ]


@pytest.mark.parametrize(
    "lo,hi,base",
    [
        (1.02, 1.08, 10),
        (0.5, 0.9, 10),
        (6, 16, 10),
        (100, 180, 2),
        (3, 30, 10),
        (1e-3, 1e6, 10),
        (64, 4096, 2),
        (0.8, 1.7, 2),
    ],
)
def test_a_log_axis_shows_at_least_two_plain_labels_over_any_range(lo, hi, base):
    """A view inside one power of the base (1.02-1.08, 6-16) still gets two or more labelled
    ticks, all inside the view; wide views are thinned to at most 8."""
    fig = Figure(figsize=(4, 2))
    ax = fig.add_subplot()
    ax.plot([lo, hi], [1, 2])
    figures.log_axis(ax, "x", base=base)
    ax.set_xlim(lo, hi)
    drawn(fig)
    labels = shown_labels(ax.xaxis)
    assert 2 <= len(labels) <= 8, labels
    assert all(PLAIN_LABEL.match(t) for t in labels), labels


def test_every_log_axis_of_every_figure_has_two_labels_or_more(drawn_figures):
    for name, (fig, _) in drawn_figures.items():
        for axis in log_axes(fig):
            assert len(shown_labels(axis)) >= 2, (name, shown_labels(axis))


# -- 6: legends and labels ------------------------------------------------------------------------
def overlap_px(a: Bbox, b: Bbox) -> float:
    inter = Bbox.intersection(a, b)
    return 0.0 if inter is None else inter.width * inter.height


def test_legends_never_cover_an_axes_data_area(drawn_figures):
    """Each legend's box and each axes' data area (the axes patch) share no pixel: box plots,
    grouped bars, the serving charts, the speculative measured-vs-predicted chart, telemetry."""
    with_legend = 0
    for name, (fig, renderer) in drawn_figures.items():
        legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
        with_legend += bool(legends)
        for legend, ax in itertools.product(legends, [ax for ax in fig.axes if ax.get_visible()]):
            assert overlap_px(legend.get_window_extent(renderer), ax.get_window_extent(renderer)) < 1.0, name
    assert with_legend >= 10


def test_several_figures_on_one_axis_get_a_legend_of_lines_and_one_of_dashes(all_figures):
    """The speculative chart (3 figures x 5 case groups, 15 lines) names each group's colour once
    and each figure's dash once, in words: 8 entries, not 15 keys."""
    fig = all_figures["spec: Measured and predicted speedup against k"]
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert texts[-3:] == ["measured speedup", "predicted speedup", "predicted speedup with verify cost"]
    assert len(texts) == 5 + 3 and all("_" not in t for t in texts[-3:])


def test_row_labels_leave_out_what_every_row_shares_and_wrap():
    rows, note = figures.row_labels(["#1 heads=4 seq_len=128 dtype=float32", "#2 heads=4 seq_len=512 dtype=float32"])
    assert rows == ["#1 seq_len=128", "#2 seq_len=512"] and note == "every row: heads=4 dtype=float32"
    long = "#1 heads=4 kv_heads=2 seq_len=128 head_dim=64 dtype=float32 causal=False block_m=64 block_n=32"
    rows, _ = figures.row_labels([long, long.replace("#1", "#2").replace("128", "512")])
    assert all(len(line) < len(long) / 2 + 8 for r in rows for line in r.split("\n"))
    assert figures.row_labels(["#25 requests=50 arrival=poisson:40"]) == ([""], "#25 requests=50 arrival=poisson:40")


@pytest.mark.parametrize("builder", ["ratio_points", "latency_boxes"])
def test_a_single_case_chart_gives_its_width_to_the_data_and_its_label_above(builder):
    """One serving case: the label goes above the axes, so the data area spans most of the figure
    (the label took half of it)."""
    label = (
        "#25 requests=50 arrival=poisson:40 prompt_len=uniform:16:64 output_len=exp:48:160 "
        "kv_budget_mib=2.0 max_batch=16 kv=contiguous"
    )
    fig = (
        figures.ratio_points([label], [1.02], [1.01], [1.03], "speedup")
        if builder == "ratio_points"
        else figures.latency_boxes([(label, {"static": [1.09, 1.1], "continuous": [1.11, 1.12]})])
    )
    renderer = drawn(fig)
    ax = fig.axes[0]
    assert ax.get_window_extent(renderer).width > 0.8 * fig.get_tightbbox(renderer).width * fig.dpi
    assert "requests=50" in ax.get_title(loc="left") and shown_labels(ax.yaxis) == []


def test_many_param_row_labels_take_at_most_about_a_third_of_the_width():
    rows = [
        (
            f"#{i} heads=4 kv_heads={k} seq_len={n} head_dim=64 dtype=float32 causal={c} block_m=0 block_n=0",
            {"eager": [1e-3 * n / 128] * 5, "torch_tiled": [2e-3 * n / 128] * 5},
        )
        for i, (k, n, c) in enumerate(itertools.product((2, 4), (128, 512), (False, True)), 1)
    ]
    fig = figures.latency_boxes(rows)
    renderer = drawn(fig)
    ax = fig.axes[0]
    label_width = ax.get_window_extent(renderer).x0 - ax.get_tightbbox(renderer).x0
    assert label_width < 0.4 * fig.get_figwidth() * fig.dpi


def test_explicit_x_ticks_never_print_over_each_other(drawn_figures, all_figures):
    """Swept values close on the axis (64, 77, 100 beside 512) keep only ticks that fit; an integer
    param swept over 2 and 4 is labelled 2 and 4, not 2.00, 2.25, ..."""
    for name, (fig, renderer) in drawn_figures.items():
        for ax in fig.axes:
            boxes = [
                t.get_window_extent(renderer)
                for t in ax.xaxis.get_majorticklabels()
                if t.get_visible() and t.get_text()
            ]
            assert all(overlap_px(a, b) < 1.0 for a, b in itertools.combinations(boxes, 2)), name
    spec = all_figures["spec: Acceptance rate against k"]
    assert shown_labels(spec.axes[0].xaxis) == ["2", "4"]
    percentiles = all_figures["serving: TTFT, TPOT and ITL percentiles (ms)"].axes[0]
    assert shown_labels(percentiles.xaxis)[:2] == ["p50\nTTFT", "p90\nTTFT"]  # level, in words, 9 in a panel
    assert all(t.get_rotation() == 0 for t in percentiles.xaxis.get_majorticklabels())


# -- 5: the KV-cache memory breakdown ---------------------------------------------------------------
def test_kv_breakdown_shows_kv_in_every_row_deepseek_v3_included():
    """DeepSeek-V3 (627 GiB of weights) beside Llama-3.1-8B on the reference 80 GiB GPU: every
    row is one GPU (the same width), weights never squash the others, and each bar's KV
    (holding tokens + reserved but empty) is at least 5% of its row; the legend is in words."""
    cases = [kv_case("deepseek-v3"), kv_case("llama-3.1-8b")]
    plot = kv_cache.TECHNIQUE.plots[1]
    fig = figures.declared(plot, cases, kv_cache.TECHNIQUE.defaults())
    ax = fig.axes[0]
    rows: dict[float, list] = {}
    for patch in ax.patches:
        rows.setdefault(round(patch.get_y(), 6), []).append(patch)
    assert len(rows) == 4  # 2 cases x 2 allocators
    for segments in rows.values():
        weights, holding, empty, free = sorted(segments, key=lambda p: p.get_x())
        total = sum(p.get_width() for p in segments)
        assert total == pytest.approx(80.0)
        assert (holding.get_width() + empty.get_width()) / total >= 0.05
        assert weights.get_width() <= 0.8 * total
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert texts == ["weights per GPU", "KV holding tokens", "KV reserved but empty", "free"]
    deepseek = cases[0]["variants"]["paged"]["metrics"]
    assert (
        deepseek["gpus"] == 16
        and deepseek["sequences_per_gpu"] > cases[0]["variants"]["contiguous"]["metrics"]["sequences_per_gpu"]
    )


def test_human_names_of_plotted_keys():
    assert [
        figures.human(k)
        for k in (
            "weights_per_gpu_gib",
            "kv_holding_tokens_gib",
            "free_gib",
            "median_ttft_ms",
            "output_tokens_per_s",
            "speedup",
            "series.e2e_ms",
            "build_ms",
        )
    ] == [
        "weights per GPU",
        "KV holding tokens",
        "free",
        "median TTFT",
        "output tokens/s",
        "measured speedup",
        "end-to-end",
        "build",
    ]
