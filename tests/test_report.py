"""The HTML report and summary.md, rendered from a small real run (tests/report_runs.py: every
technique, every figure path, about 10 s) and from hand-made results (a failed case, a single case,
telemetry with throttling, hostile text, a 200-case sweep): what they contain, that every figure
holds data, that results text is escaped, that each technique is read by its own headline figure,
that a large sweep reads as a surface, and the `report` command's exit codes."""

import copy
import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import report_runs
from click.testing import CliRunner
from markupsafe import escape

from gpubench import techniques
from gpubench.cli import main
from gpubench.contract import Headline, Technique
from gpubench.measure.telemetry import SAMPLE_COLUMNS
from gpubench.records.results import CaseRecord, RunRecord, elapsed_text, role_variant
from gpubench.reports import figures, html, markdown, phases, plots, sweep
from gpubench.reports.terminal import format_speedup

FIGURE = re.compile(r"<figure>\s*<figcaption>(.*?)</figcaption>(.*?)</figure>", re.S)
DATA = re.compile(r'<g id="data-\d+">\s*<(path|use|g|defs)\b')
# The small run takes about 10 s on 2 idle cores (25 s more where the speculative pair is not
# cached yet); a test that may be the one to start it gets far more than that on a loaded machine.
REAL_RUN = pytest.mark.timeout(600)


@pytest.fixture(scope="session")
def real_dir(small_run_dir) -> Path:
    """One small real run (report_runs.SCENARIO: every technique on the CPU, short policy), the
    session's (conftest.small_run_dir)."""
    return small_run_dir


@pytest.fixture(scope="session")
def real_report(real_dir, tmp_path_factory) -> tuple[dict, str, str, Path, Any]:
    """The whole report of the real run, written once per session by the `report` command to a
    file elsewhere (the shared run directory stays as it was): the results, the page, summary.md,
    the page's path and the command's result. Every test that only reads this report shares it."""
    out = tmp_path_factory.mktemp("real-report") / "elsewhere" / "r.html"
    result = CliRunner().invoke(main, ["report", str(real_dir), "-o", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    doc = json.loads((real_dir / "results.json").read_text())
    return doc, out.read_text(encoding="utf-8"), out.with_name("summary.md").read_text(encoding="utf-8"), out, result


def with_only(doc: dict, *technique_names: str) -> dict:
    """A copy of ``doc`` holding only the cases of ``technique_names`` (its summary counted
    again): a test of what the report does with some cases renders only those techniques'
    sections and figures, not every technique's."""
    kept = copy.deepcopy(doc)
    kept["cases"] = [c for c in kept["cases"] if c["technique"] in technique_names]
    assert kept["cases"], technique_names
    failed = sum(c["status"] == "failed" for c in kept["cases"])
    kept["summary"] = {
        **kept["summary"],
        "cases": len(kept["cases"]),
        "passed": len(kept["cases"]) - failed,
        "failed": failed,
    }
    return kept


def make_run(root: Path, doc: dict, telemetry_rows: list[dict] | None = None, env: bool = True) -> Path:
    """A run directory holding ``doc`` (and a telemetry.csv of ``telemetry_rows``)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "results.json").write_text(json.dumps(doc))
    if env:
        (root / "env.json").write_text(json.dumps(doc.get("env") or {}))
    if telemetry_rows is not None:
        import pandas as pd

        pd.DataFrame(telemetry_rows, columns=list(SAMPLE_COLUMNS)).to_csv(root / "telemetry.csv", index=False)
    return root


def figures_of(page: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for title, body in FIGURE.findall(page):
        found.setdefault(title, []).append(body)
    return found


# What an empty figure frame used to say: the report now leaves such a figure out.
EMPTY_FRAME = (
    "no data for this figure",
    "no % of peak",
    "no speedup to show",
    "no timing samples",
    "no surface",
    "no case has timings in both runs",
)


def assert_no_empty_axes(page: str) -> None:
    """Every figure is an SVG with a data element, or says that it failed to draw; a figure with
    nothing to show is left out, frame and all."""
    for title, body in FIGURE.findall(page):
        if "<svg" in body:
            assert DATA.search(body), title
        else:
            assert 'class="note"' in body and "failed" in body, title
    assert not [text for text in EMPTY_FRAME if text in page]


# -- a real smoke run --------------------------------------------------------------------------
@REAL_RUN
def test_headline_counts_and_every_case_with_its_speedup(real_report):
    doc, page, *_ = real_report
    n = len(doc["cases"])
    assert f"{n} cases: <span class=\"pass\">{n} passed</span>" in page
    assert "best speedup" in page and "worst speedup" in page
    assert str(escape(doc["device_label"])) in page and "report-test" in page
    for case in doc["cases"]:
        assert f'title="{escape(case["id"])}"' in page
        assert format_speedup(case["speedups"][role_variant(case, "optimized")]) in page


@REAL_RUN
def test_every_technique_has_a_section_with_its_anchor_figure_and_cpu_caveat(real_report):
    doc, page, *_ = real_report
    for name in {c["technique"] for c in doc["cases"]}:
        tech = techniques.get(name)
        assert f'<section id="tech-{name}"' in page
        assert str(escape(tech.anchor)) in page
        assert str(escape(tech.gpu_specific)) in page  # a CPU run says the ratio is not the GPU's


@REAL_RUN
def test_figures_are_inline_svg_with_data(real_report):
    doc, page, *_ = real_report
    found = figures_of(page)
    sweep = [b for t, bodies in found.items() if t.startswith("speedup of optimized") for b in bodies]
    latency = found["time per call, raw samples (box: quartiles, line: median)"]
    timed = {c["technique"] for c in doc["cases"]}  # every smoke technique is timed
    assert len(sweep) == len(latency) == len(timed)  # one of each per technique
    for body in sweep + latency + found["share of the measured device peak"][:1]:  # flash_attention has FLOPs
        assert "<svg" in body and DATA.search(body)
    kv = page.split('<section id="tech-kv_cache"')[1].split("</section>")[0]
    assert "share of the measured device peak" not in kv  # kv_cache counts no FLOPs or bytes moved: no frame
    assert_no_empty_axes(page)
    for external in ("<img", "<link", "<script", " src=", 'href="http', "url(http", "@import"):
        assert external not in page  # nothing to fetch: readable offline


@REAL_RUN
def test_environment_block_and_telemetry_unavailable_on_a_cpu(real_report):
    doc, page, *_ = real_report
    assert "<details><summary>env.json</summary>" in page and doc["env"]["torch"] in page
    assert f"telemetry unavailable: {escape(doc['telemetry']['reason'])}" in page
    assert "<script" not in page


@REAL_RUN
def test_summary_md_has_the_headline_and_the_table_under_60_kb(real_report):
    doc, _, md, *_ = real_report
    assert len(md.encode()) < 60_000
    assert f"**{len(doc['cases'])} cases: {len(doc['cases'])} passed, 0 failed**" in md
    assert "| # | technique | case | baseline | optimized | speedup [95% CI] |" in md
    table = [line for line in md.splitlines() if re.match(r"\| \d+ \|", line)]
    assert len(table) == len(doc["cases"])


@REAL_RUN
def test_every_description_is_shown_whole(real_report):
    """Each technique's summary as a sentence and each variant's recorded description in full
    (never a first line or a fragment), the baseline and optimized variants first."""
    doc, page, *_ = real_report
    for name in {c["technique"] for c in doc["cases"]}:
        section = page.split(f'<section id="tech-{name}"')[1].split("</section>")[0]
        summary = " ".join(techniques.get(name).summary.split())
        assert f"<p>{escape(summary.rstrip('.'))}.</p>" in section
        items = re.findall(r"<li>(baseline|optimized|peer) <code>(\w+)</code>: (.*?)</li>", section)
        assert [role for role, _, _ in items[:2]] == ["baseline", "optimized"]
        for _role, variant, shown in items:
            recorded = next(
                c["variants"][variant] for c in doc["cases"] if c["technique"] == name and variant in c["variants"]
            )
            assert shown == escape(recorded["description"]) and recorded["description"], (name, variant)


def test_a_variant_is_described_by_the_whole_first_paragraph_of_its_docstring():
    tech = Technique("described", summary="s", shape="kernel", params=[])

    @tech.variant("eager", role="baseline")
    def eager(w):
        """Materialize the scores, then a float32 softmax and a matmul with V, as the eager path
        of Hugging Face does it (the first paragraph wraps over two lines).

        Details no reader of the report needs."""

    assert tech.variants["eager"].description == (
        "Materialize the scores, then a float32 softmax and a matmul with V, as the eager path of "
        "Hugging Face does it (the first paragraph wraps over two lines)."
    )
    with pytest.raises(TypeError, match="headline_figures"):
        Technique("bad", summary="s", shape="kernel", params=[], headline_figures=("utilization",))


@REAL_RUN
def test_each_technique_is_read_by_its_own_figure_and_best_worst_only_by_time(real_report):
    """kv_cache is read by KV utilization and the serving pairs by output tokens/s, never by a
    speedup; best and worst speedup range only over the techniques read by time (the headline of
    the run with kv_cache and flash_attention edited to be the worst and best of all); the page's
    header and summary.md give each technique the line the headline gives it (the session's
    report of the run as it ran: the same rendering of the headline, no second page drawn)."""
    real, page, md, *_ = real_report
    doc = copy.deepcopy(real)
    kv = next(c for c in doc["cases"] if c["technique"] == "kv_cache")
    flash = next(c for c in doc["cases"] if c["technique"] == "flash_attention")
    for case, ratio in ((kv, 0.01), (flash, 50.0)):  # the worst and best of all if they counted
        case["speedups"][role_variant(case, "optimized")].update(ratio=ratio, ci_low=ratio * 0.9, ci_high=ratio * 1.1)
    head = html.headline(doc)
    assert head["best"].startswith("50.00x (flash_attention") and "kv_cache" not in head["worst"]
    assert set(head["not_by_time"]) == {"kv_cache", "continuous_batching", "paged_kv_serving"}
    lines = {t["name"]: t["text"] for t in head["techniques"]}
    assert list(lines) == list(dict.fromkeys(c["technique"] for c in doc["cases"]))
    utilization = [
        100 * c["variants"][role_variant(c, role)]["metrics"]["utilization"]
        for c in doc["cases"]
        if c["technique"] == "kv_cache"
        for role in ("baseline", "optimized")
    ]
    assert lines["kv_cache"].startswith(f"KV utilization {min(utilization[0::2]):.0f}%")
    assert lines["kv_cache"].split(" -> ")[1].startswith(f"{min(utilization[1::2]):.0f}%")
    assert "speedup" not in lines["kv_cache"] and "0.01x" not in lines["kv_cache"]
    assert lines["continuous_batching"].startswith("output tokens/s ")
    assert (
        lines["paged_kv_serving"].startswith("max concurrent requests ")
        and "output tokens/s" in lines["paged_kv_serving"]
    )
    assert lines["flash_attention"].startswith("speedup ") and "to 50.00x over 4 cases" in lines["flash_attention"]
    shown = {t["name"]: t["text"] for t in html.headline(real)["techniques"]}
    assert shown.keys() == lines.keys() and shown["kv_cache"] == lines["kv_cache"]  # the edits were speedups only
    header = page.split("<nav>")[0]
    for name, text in shown.items():
        assert f'<a href="#tech-{name}">{name}</a>: {html._arrows(text)}</li>' in header  # each "->" unbreakable
    assert f"- **kv_cache**: {markdown.cell(shown['kv_cache'])}" in md and "not kv_cache" in md


def _metric_case(before: float, after: float, status: str = "passed", key: str = "utilization") -> CaseRecord:
    return CaseRecord.from_dict(
        {
            "status": status,
            "variants": {
                "contiguous": {"role": "baseline", "metrics": {key: before}},
                "paged": {"role": "optimized", "metrics": {key: after}},
            },
        }
    )


def test_a_technique_line_gives_its_figure_baseline_to_optimized():
    utilization = (Headline("utilization", "KV utilization", percent=True),)
    assert sweep.technique_line([_metric_case(0.42, 0.98)], utilization) == "KV utilization 42% -> 98%"
    several = [_metric_case(0.42, 0.98), _metric_case(0.75, 0.96), _metric_case(0.9, 0.1, status="failed")]
    assert sweep.technique_line(several, utilization) == "KV utilization 42%–75% -> 96%–98% (better in 2 of 2 cases)"
    ttft = (Headline("ttft_ms", "median TTFT (ms)", higher_is_better=False),)
    assert (
        sweep.technique_line([_metric_case(40.0, 20.0, key="ttft_ms")], ttft)
        == "median TTFT (ms) 40 -> 20 (2.00x better)"
    )
    assert sweep.technique_line([_metric_case(2000.0, 2500.0, key="ttft_ms")], ttft).endswith("(1.25x worse)")
    assert sweep.technique_line([_metric_case(0.4, 0.9)], ttft) == "median TTFT (ms): not recorded"


# -- hand-made edge cases ----------------------------------------------------------------------
@REAL_RUN
def test_a_failed_case_is_red_with_its_escaped_reason(real_dir, tmp_path):
    """The run's first case failed, among the other cases of its technique (flash_attention)."""
    doc = json.loads((real_dir / "results.json").read_text())
    doc = with_only(doc, doc["cases"][0]["technique"])
    case = doc["cases"][0]
    case["status"] = "failed"
    case["failure"] = {"kind": "exception", "message": "RuntimeError: <b>kernel</b> | launch failed", "traceback": ""}
    for v in case["variants"].values():
        v.update(samples_s=[], stats=None)
    case["speedups"] = {}
    doc["summary"].update(passed=doc["summary"]["passed"] - 1, failed=1)
    page_path = html.write_report(make_run(tmp_path / "run", doc)).html
    page = page_path.read_text()
    row = re.search(r'<tr id="case-1" class="(\w+)".*?</tr>', page, re.S)
    assert row.group(1) == "failed"
    assert "RuntimeError: &lt;b&gt;kernel&lt;/b&gt; | launch failed" in row.group(0)
    assert "<b>kernel" not in page
    assert '<span class="fail">1 failed</span>' in page
    assert_no_empty_axes(page)
    md = (tmp_path / "run" / "summary.md").read_text()
    assert "**FAILED**: RuntimeError: &lt;b>kernel&lt;/b> \\| launch failed" in md


@REAL_RUN
def test_a_single_case_run_draws_points_not_empty_sweeps(real_dir, tmp_path):
    doc = json.loads((real_dir / "results.json").read_text())
    kv_cache = next(i for i, c in enumerate(doc["cases"]) if c["technique"] == "kv_cache")
    for keep in (0, kv_cache):  # a flash_attention case, a kv_cache case
        one = copy.deepcopy(doc)
        one["cases"] = [doc["cases"][keep]]
        page = html.render(html.load_run(make_run(tmp_path / str(keep), one)))
        found = figures_of(page)
        assert DATA.search(found["speedup of optimized over baseline (95% CI)"][0])
        assert '1 case: <span class="pass">1 passed</span>' in page
        assert_no_empty_axes(page)


@REAL_RUN
def test_a_case_without_timings_shows_no_empty_figure_and_says_so_once(real_dir, tmp_path):
    doc = json.loads((real_dir / "results.json").read_text())
    case = doc["cases"][0]
    case.update(status="failed", speedups={}, failure={"kind": "oom", "message": "out of memory", "traceback": ""})
    for v in case["variants"].values():
        v.update(samples_s=[], stats=None, metrics={})
    doc["cases"] = [case]
    page = html.render(html.load_run(make_run(tmp_path / "run", doc)))
    assert "<svg" not in page and "<figure>" not in page
    section = page.split(f'<section id="tech-{case["technique"]}"')[1].split("</section>")[0]
    assert section.count("No figure: its case failed (why: the summary table).") == 1
    assert_no_empty_axes(page)


@REAL_RUN
def test_results_text_is_escaped_everywhere(real_dir, tmp_path):
    """Hostile text in the scenario, in a technique's name, a case id and params (drawn in its
    figures' labels too), beside the real cases of the run's last technique."""
    doc = json.loads((real_dir / "results.json").read_text())
    doc = with_only(doc, doc["cases"][-1]["technique"])
    doc["scenario"]["description"] = "<script>alert(1)</script>"
    doc["scenario"]["name"] = "<img src=x onerror=alert(2)>"
    case = copy.deepcopy(doc["cases"][-1])
    case.update(
        technique="<i>gone</i>",
        id="<i>gone</i>[p=<script>alert(3)</script>]",
        params={"p": "<script>alert(3)</script>", "q": "$x^2$ | 50%"},
    )
    doc["cases"].append(case)
    page = html.write_report(make_run(tmp_path / "run", doc)).html.read_text()
    assert "<script" not in page and "<img" not in page and "<i>gone" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;script&gt;alert(3)" in page
    assert "this gpubench does not know it" in page  # an unknown technique still renders
    assert_no_empty_axes(page)
    md = (tmp_path / "run" / "summary.md").read_text()
    assert "<script" not in md and "<img" not in md and "\\| 50%" in md


def _telemetry_rows(doc: dict, throttle_every: int) -> list[dict]:
    rows, t = [], 0.0
    for case in doc["cases"]:
        for k in range(8):
            rows.append(
                {
                    "t_s": t,
                    "case": case["id"],
                    "variant": "optimized",
                    "power_w": 300 + k,
                    "energy_mj": 1000 * t,
                    "sm_clock_mhz": 1980 - 10 * k,
                    "mem_clock_mhz": 2619,
                    "temp_c": 60 + k,
                    "util_gpu_pct": 99,
                    "util_mem_pct": 40,
                    "mem_used_mb": 5000 + k,
                    "throttle_mask": 0x20 if k % throttle_every == 0 else 0,
                    "throttle_reasons": "sw_thermal_slowdown" if k % throttle_every == 0 else "",
                }
            )
            t += 0.05
    return rows


@REAL_RUN
def test_telemetry_is_plotted_and_a_throttled_run_is_flagged_at_the_top(real_dir, tmp_path):
    """Telemetry of the run's first three cases (one technique's), the third throttled."""
    doc = json.loads((real_dir / "results.json").read_text())
    doc = with_only(doc, doc["cases"][0]["technique"])
    doc["cases"] = doc["cases"][:3]
    assert len(doc["cases"]) == 3
    doc["telemetry"] = {
        "status": "ok",
        "reason": None,
        "interval_s": 0.05,
        "n_samples": 8 * len(doc["cases"]),
        "throttled": True,
        "throttled_fraction": 0.25,
        "throttle_reasons": ["sw_thermal_slowdown"],
        "benign_reasons": ["gpu_idle"],
    }
    doc["cases"][2]["telemetry"] = {"throttled": True, "throttle_reasons": ["sw_thermal_slowdown"]}
    page = html.render(html.load_run(make_run(tmp_path / "run", doc, _telemetry_rows(doc, 4))))
    header = page.split("<nav>")[0]
    assert "the GPU throttled during the run (sw_thermal_slowdown, 25% of samples)" in header
    assert "Throttle reasons that fired: sw_thermal_slowdown." in page and "gpu_idle" in page
    assert f"#3 {escape(doc['cases'][2]['technique'])}" in page.split('id="telemetry"')[1]
    body = next(b for t, bodies in figures_of(page).items() if t.startswith("telemetry over the run") for b in bodies)
    for panel in ("power (W)", "SM clock (MHz)", "temperature (C)", "memory used (MiB)"):
        assert panel in body
    assert len(DATA.findall(body)) == 8  # per panel: its series and the throttled samples


@REAL_RUN
def test_missing_telemetry_file_is_said_not_plotted(real_dir, tmp_path):
    doc = json.loads((real_dir / "results.json").read_text())
    doc = with_only(doc, doc["cases"][0]["technique"])
    doc["telemetry"] = {"status": "ok", "reason": None, "interval_s": 0.05, "throttled": False}
    page = html.render(html.load_run(make_run(tmp_path / "run", doc, env=False)))
    assert "telemetry unavailable: telemetry.csv is missing from the run directory" in page
    assert "no env.json in the run directory" not in page  # env falls back to results.json's copy


def test_a_technique_adds_its_own_figures_and_a_failing_hook_costs_only_its_figures(toys, tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    def own(cases):
        fig = Figure()
        fig.add_subplot().bar([1, 2], [len(cases), 1])
        return [("toy figure from its hook", fig)]

    doc = {
        "kind": "gpubench.results",
        "schema_version": 1,
        "run_id": "r",
        "status": "complete",
        "device": "cpu",
        "scenario": {"name": "toy", "entries": []},
        "cases": [],
        "summary": {},
    }
    doc["cases"] = [
        {
            "id": "toy_kernel[n=1]",
            "technique": "toy_kernel",
            "params": {"n": 1},
            "status": "passed",
            "variants": {},
            "speedups": {},
        }
    ]
    run = html.load_run(make_run(tmp_path / "run", doc), techniques)
    monkeypatch.setattr(toys.KERNEL, "figures_fn", own)
    page = html.render(run)
    assert "<figcaption>toy figure from its hook</figcaption>" in page
    assert DATA.search(figures_of(page)["toy figure from its hook"][0])
    monkeypatch.setattr(toys.KERNEL, "figures_fn", lambda cases: 1 / 0)
    page = html.render(run)
    assert "the technique&#39;s figure hook failed: ZeroDivisionError" in page and "</html>" in page


def test_declared_plots_are_drawn_from_results_and_a_failing_one_costs_only_itself(toys, tmp_path, monkeypatch):
    from gpubench.contract import Plot

    def case(n):
        return {
            "id": f"toy_kernel[n={n}]",
            "technique": "toy_kernel",
            "params": {"n": n, "mode": "ok"},
            "status": "passed",
            "speedups": {},
            "variants": {
                "baseline": {"role": "baseline", "metrics": {"gbps": n / 10}},
                "optimized": {"role": "optimized", "metrics": {"gbps": n / 5}},
            },
        }

    doc = {
        "kind": "gpubench.results",
        "schema_version": 2,
        "run_id": "r",
        "status": "complete",
        "device": "cpu",
        "scenario": {"name": "toy", "entries": []},
        "cases": [case(8), case(64)],
        "summary": {},
    }
    run = html.load_run(make_run(tmp_path / "run", doc), techniques)
    monkeypatch.setattr(
        toys.KERNEL,
        "plots",
        [Plot("GB/s against n", y="gbps", x="n", ylabel="GB/s"), Plot("nothing recorded", y="absent", x="n")],
    )
    page = html.render(run)
    assert DATA.search(figures_of(page)["GB/s against n"][0])
    assert "nothing recorded" not in page  # a declared plot with no data in the run is left out, frame and title
    assert_no_empty_axes(page)

    def broken(plot, cases, defaults=None):
        raise KeyError("boom")

    monkeypatch.setattr(plots, "declared", broken)
    page = html.render(run)
    assert "the figure failed: KeyError" in page and "</html>" in page


def test_figure_builders_return_none_without_data():
    assert figures.speedup_sweep({}, "x") is None
    assert figures.ratio_points([], [], [], [], "x") is None
    assert figures.latency_boxes([("a", {"baseline": []})]) is None
    assert figures.peak_bars(["a"], {"% peak": {"baseline": [None]}}) is None
    assert figures.telemetry_timeline([0.0, 1.0], [("power", [float("nan")] * 2)], [], []) is None


def test_summary_md_stays_under_60_kb_and_escapes_cells():
    row = {
        "number": 1,
        "technique": "t",
        "params": "p=" + "x" * 300,
        "baseline": "1 ms",
        "optimized": "1 ms",
        "speedup": "1.00x",
        "headline": "",
        "check": "pass",
        "memory": "-",
        "energy": "-",
        "status": "passed",
        "failed": False,
        "reason": "",
    }
    head = {
        "scenario": "a|b",
        "device": "cpu",
        "date": "d",
        "run_id": "r",
        "cases": 2000,
        "passed": 2000,
        "failed": 0,
        "best": "-",
        "worst": "-",
        "warnings": [],
    }
    md = markdown.render_summary(head, [dict(row, number=i) for i in range(2000)])
    assert len(md.encode()) < 60_000
    assert "more cases left out to keep this summary under 60 KB" in md and "a\\|b" in md


# -- a large sweep -----------------------------------------------------------------------------
def test_the_sweep_surface_has_one_cell_per_case_at_its_params():
    """The heatmap: the param with the most values across (seq_len), a row per combination of
    the others, each cell the case's speedup (log2) at its own params, a failed case grey."""
    doc = report_runs.sweep_doc()
    cases = doc["cases"]
    failed = cases[7]
    failed.update(status="failed", speedups={})
    fig = sweep.surface([CaseRecord.from_dict(c) for c in cases], ())
    ax = fig.axes[0]
    grid = ax.collections[0].get_array().reshape(8, 25)
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(n) for n in report_runs.SWEEP_LENGTHS]
    rows = [t.get_text() for t in ax.get_yticklabels()]
    assert len(rows) == 8 == len(set(rows))
    assert int(grid.mask.sum()) == 1 and grid.count() == 199
    for case in cases[::17]:
        ratio = case["speedups"].get("torch_tiled", {}).get("ratio")
        row = next(
            i
            for i, label in enumerate(rows)
            if all(f"{k}=" in label and html.case_params(case, {k}) in label for k in ("causal", "dtype", "kv_heads"))
        )
        col = report_runs.SWEEP_LENGTHS.index(case["params"]["seq_len"])
        if ratio is None:
            assert grid.mask[row, col]
        else:
            assert grid[row, col] == pytest.approx(math.log2(ratio))
    assert "fail" in [t.get_text() for t in ax.texts]
    figures.close(fig)


def test_a_200_case_sweep_reads_as_a_surface_with_best_and_worst_first(tmp_path):
    """A 200-case flash_attention sweep: one folded row in the summary table, the surface and the
    best and worst cases first in its section, every case's row and the raw-sample box plot in
    collapsed sections, and a page of sane size."""
    doc = report_runs.sweep_doc()
    page = html.write_report(report_runs.write_run(tmp_path / "run", doc)).html.read_text()
    assert len(page.encode()) < 3_000_000
    summary = page.split('<table id="summary-table">')[1].split("</table>")[0]
    assert summary.count("<tr") == 2 and "200 cases, a sweep: speedup" in summary  # header and the folded row
    section = page.split('<section id="tech-flash_attention"')[1].split("</section>")[0]
    shown, collapsed = section.split('<details class="per-case">', 1)
    assert DATA.search(figures_of(shown)[sweep.surface_title(())][0])
    ratios = sorted((c["speedups"]["torch_tiled"]["ratio"], n) for n, c in enumerate(doc["cases"], 1))
    best = shown.split("5 best cases of 200")[1].split("</table>")[0]
    worst = shown.split("5 worst cases of 200")[1].split("</table>")[0]
    assert re.findall(r'href="#case-(\d+)"', best) == [str(n) for _, n in ratios[::-1][:5]]
    assert re.findall(r'href="#case-(\d+)"', worst) == [str(n) for _, n in ratios[:5]]
    assert shown.index("5 best cases") < shown.index("speedup of optimized over baseline (95% CI) vs seq_len")
    assert "time per call, raw samples" not in shown and "time per call, raw samples" in collapsed
    for case in doc["cases"]:  # every case's row, in the collapsed section
        assert f'title="{escape(case["id"])}"' in collapsed and f'title="{escape(case["id"])}"' not in summary
    outside_details = re.sub(r"<details.*?</details>", "", page, flags=re.S)
    assert len(outside_details.encode()) < 600_000  # the figures a reader sees first stay small


def test_a_sweep_at_the_threshold_keeps_its_rows_and_figures_in_view(tmp_path):
    doc = report_runs.sweep_doc()
    doc["cases"] = doc["cases"][: sweep.LARGE]
    page = html.render(html.load_run(report_runs.write_run(tmp_path / "run", doc)))
    assert '<details class="per-case">' not in page and "a sweep:" not in page
    assert "time per call, raw samples" in page.split("<details>")[0]


# -- comparison --------------------------------------------------------------------------------
@REAL_RUN
def test_compare_lists_regressions_first_and_cases_of_one_run_apart(real_dir, tmp_path):
    """Two runs of flash_attention's and kv_cache's cases (one read by time, one by its own figure):
    one case slower, one faster, one only in the other run."""
    before = with_only(json.loads((real_dir / "results.json").read_text()), "flash_attention", "kv_cache")
    assert len(before["cases"]) >= 5
    steady = [1e-3 * (1 + 0.01 * i) for i in range(10)]  # the same samples in both runs: unchanged
    for case in before["cases"]:
        case["variants"][role_variant(case, "optimized")]["samples_s"] = steady
    other = make_run(tmp_path / "before", before)
    doc = copy.deepcopy(before)
    slower, faster = doc["cases"][1], doc["cases"][3]
    slower["variants"][role_variant(slower, "optimized")]["samples_s"] = [3 * x for x in steady]
    faster["variants"][role_variant(faster, "optimized")]["samples_s"] = [0.2 * x for x in steady]
    dropped = doc["cases"].pop()
    current = make_run(tmp_path / "now", doc)
    page = html.write_report(current, compare=other).html.read_text()
    table = page.split('<table id="compare-table">')[1].split("</table>")[0]
    rows = re.findall(r"<tr[^>]*><td>(.*?)</td>\s*<td class=\"(\w+)\">", table, re.S)
    assert [r[1] for r in rows] == ["regressed"] + ["unchanged"] * (len(doc["cases"]) - 2) + ["improved"]
    labels = {r["id"]: f"{r['technique']} {r['params']}" for r in html.summary_rows(before)}
    assert rows[0][0] == labels[slower["id"]]
    first = table.split("<tbody>")[1].split("</tr>")[0]
    assert "+200.0% [" in first and "+0.0% [" in first  # optimized 3x slower; its baseline variant unchanged
    only = page.split("case(s) only in the other run")[1].split("</ul>")[0]
    assert str(escape(labels[dropped["id"]])) in only
    assert DATA.search(figures_of(page)["change per case (95% CI)"][0])
    md = (current / "summary.md").read_text()
    assert "Compared with run" in md and "1 regressed" in md and "1 improved" in md


# -- command line ------------------------------------------------------------------------------
@REAL_RUN
def test_report_command_writes_html_and_summary_and_exits_0(real_report):
    """The session's report is the command's (real_report): it exits 0, writes the page where -o
    says and summary.md beside it, and says where."""
    _, page, md, out, result = real_report
    assert result.exit_code == 0, result.output
    assert out.exists() and (out.parent / "summary.md").exists() and page and md
    assert f"report: {out}" in result.output


@pytest.mark.parametrize("broken", ["missing", "corrupt"])
def test_report_command_exits_2_on_a_missing_or_corrupt_results_file(tmp_path, broken):
    run_dir = tmp_path / "run"
    if broken == "corrupt":
        run_dir.mkdir()
        (run_dir / "results.json").write_text('{"kind": "gpubench.results", "cases": [')
    result = CliRunner().invoke(main, ["report", str(run_dir)], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and f"error: {run_dir}" in result.output


def test_run_writes_the_report_and_a_report_failure_keeps_the_run(toys, write_scenario, tmp_path, monkeypatch):
    """`run` writes the report of the run it made; a report that fails costs a warning, never the
    run. In this process (--isolation none): the supervisor writes the report whatever the isolation."""
    path = write_scenario("name: ok\nentries:\n  - technique: toy_kernel\n")
    result = CliRunner().invoke(
        main,
        ["run", "--scenario", str(path), "--out", str(tmp_path / "a"), "--no-calibrate", "--isolation", "none"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    report_line = result.output.strip().splitlines()[-1]
    assert report_line.startswith("report: ") and report_line.endswith("report.html (+ summary.md)")
    assert Path(report_line.split()[1]).exists()

    def broken(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(html, "write_report", broken)
    result = CliRunner().invoke(
        main,
        ["run", "--scenario", str(path), "--out", str(tmp_path / "b"), "--no-calibrate", "--isolation", "none"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert "warning: the report could not be written (RuntimeError: disk on fire)" in result.output
    run_dir = next((tmp_path / "b").iterdir())
    assert (run_dir / "results.json").exists() and not (run_dir / "report.html").exists()


# -- where the wall time went (phases_s) ------------------------------------------------------------
PHASED = {
    "build": 1.0,
    "check": 0.5,
    "warmup": 0.2,
    "timing": 3.0,
    "metrics": 0.1,
    "energy": 0.4,
    "profile": 0.0,
    "stats": 0.05,
    "timed": 2.5,
    "other": 0.25,
}


def test_a_case_s_wall_time_breaks_down_into_parts_that_add_up_to_it():
    found = phases.breakdown(CaseRecord.from_dict({"elapsed_s": 5.5, "phases_s": PHASED}))
    parts = dict(found.parts)
    assert [k for k, _ in found.parts] == [
        "build",
        "check",
        "warmup",
        "timed",
        "loop",
        "metrics",
        "energy",
        "profile",
        "stats",
        "other",
    ]  # "timing" split into timed + the loop
    assert (parts["timed"], parts["loop"], found.timed_s) == (2.5, 0.5, 2.5)
    assert sum(parts.values()) == pytest.approx(found.elapsed_s) == pytest.approx(5.5)
    text = phases.breakdown_text(found)
    assert (
        text.startswith("5.5 s: build 1.0 s, check 500 ms,") and "timed calls 2.5 s (45%), timing loop 500 ms" in text
    )
    assert "profile" not in text  # a phase that took no time is not listed
    # "other" left out of the record: what the phases leave of elapsed_s; a phase the report does not
    # know by name: shown under its own
    record = {k: v for k, v in PHASED.items() if k != "other"} | {"compile": 0.3}
    parts = dict(phases.breakdown(CaseRecord.from_dict({"elapsed_s": 6.0, "phases_s": record})).parts)
    assert parts["compile"] == 0.3 and parts["other"] == pytest.approx(6.0 - 5.25 - 0.3)
    for old in ({"elapsed_s": 1.0}, {"elapsed_s": 1.0, "phases_s": None}, {"elapsed_s": 1.0, "phases_s": {}}):
        assert phases.breakdown(CaseRecord.from_dict(old)) is None  # a record of an older run has no breakdown


def test_the_run_s_share_is_its_closing_line_or_the_cases_timed_calls_over_their_wall_time():
    from gpubench.records.results import TimeUse

    cases = [
        {"elapsed_s": 4.0, "phases_s": {"timing": 2.0, "timed": 1.0, "other": 3.0}},
        {"elapsed_s": 6.0, "phases_s": {"timing": 3.5, "timed": 3.0, "other": 2.5}},
        {"elapsed_s": 90.0},
    ]  # no phases recorded: not counted on either side
    assert (
        phases.run_text(RunRecord.from_dict({"cases": cases}))
        == "timed calls were 40% of the cases' wall time (4.0 s of 10.0 s)"
    )
    use = TimeUse(
        wall_s=20.0, workers=1, cases_s=10.0, phases_s={"timing": 5.5, "timed": 4.0, "other": 5.5}, timed_share=0.2
    )
    assert (
        phases.run_text(RunRecord.from_dict({"cases": cases, "time_use": dataclasses.asdict(use)})) == use.text()
    )  # as `run` printed it
    assert phases.run_text(RunRecord.from_dict({"cases": [{"elapsed_s": 1.0}]})) is None
    assert phases.run_text(RunRecord.from_dict({})) is None


@pytest.fixture(scope="session")
def h200_shaped(real_dir, tmp_path_factory) -> tuple[dict, str, str]:
    """report_runs.h200_shaped_doc's report and summary.md."""
    doc = report_runs.h200_shaped_doc(real_dir)
    written = html.write_report(
        report_runs.write_run(tmp_path_factory.mktemp("h200") / "run", doc), registry=techniques
    )
    return doc, written.html.read_text(encoding="utf-8"), written.markdown.read_text(encoding="utf-8")


@REAL_RUN
def test_the_report_says_where_the_wall_time_went_and_an_older_run_says_nothing_of_it(h200_shaped, tmp_path):
    doc, page, md = h200_shaped
    timed = sum(c["phases_s"]["timed"] for c in doc["cases"])
    wall = sum(c["elapsed_s"] for c in doc["cases"])
    line = (
        f"timed calls were {phases.percent(timed / wall)} of the cases' wall time "
        f"({elapsed_text(timed)} of {elapsed_text(wall)})"
    )
    assert f'<dd id="timed-share">{escape(line)};' in page and f"{line[0].upper()}{line[1:]}." in md
    for name in {c["technique"] for c in doc["cases"]}:
        section = page.split(f'<section id="tech-{name}"')[1].split("</section>")[0]
        details = section.split('<details class="phases">')[1].split("</details>")[0]
        numbers = [n for n, c in enumerate(doc["cases"], 1) if c["technique"] == name]
        assert re.findall(r'href="#case-(\d+)"', details) == [str(n) for n in numbers]  # a line per case
        for bar in re.findall(r'<div class="bar">(.*?)</div>', details):  # the parts fill the case's bar
            assert sum(map(float, re.findall(r"width: ([\d.]+)%", bar))) == pytest.approx(100, abs=0.1)
    old = with_only(doc, "combined_training")  # one technique's cases, as an older run recorded them
    for case in old["cases"]:
        del case["phases_s"]
    written = html.write_report(make_run(tmp_path / "old", old))
    old_page, old_md = written.html.read_text(), written.markdown.read_text()
    assert "timed calls" not in old_page and "timed calls" not in old_md.lower()
    assert 'class="phases"' not in old_page


@REAL_RUN
def test_a_reviewer_reads_the_summary_first_every_column_and_no_empty_figure(h200_shaped):
    """Issue 24's H200 report: the summary table before the claims, the claims of techniques the
    run left out in one line, peak memory and energy columns present, no empty figure frame."""
    doc, page, md = h200_shaped
    assert page.index('<section id="summary">') < page.index('<section id="claims">')
    head = page.split('<table id="summary-table">')[1].split("</thead>")[0]
    assert "peak memory base / opt" in head and "energy per call base / opt" in head
    step = next(r for r in html.summary_rows(doc) if r["technique"] == "combined_training")
    assert step["energy"] == "80.3 J / 47.7 J"  # the H200's 80,291 mJ per training step, in J
    assert '<span class="nw">80.3 J</span> / <span class="nw">47.7 J</span>' in page  # may wrap at the "/"
    folded = re.search(r'<details id="claims-not-in-run">\s*<summary>(.*?)</summary>', page).group(1)
    assert folded.startswith("9 published claims not judged by this run (their techniques did not run): ")
    table = page.split('<table id="claims-table">')[1].split("</table>")[0]
    assert "not in this run" not in table and table.count("<tr>") == 1 + 5  # the four techniques' 5 claims
    assert_no_empty_axes(page)


@REAL_RUN
def test_case_labels_leave_out_params_left_off_and_still_tell_every_case_apart(real_report):
    doc, *_ = real_report
    rows = html.summary_rows(doc)
    labels = [f"{r['technique']} {r['params']}" for r in rows]
    assert len(set(labels)) == len(labels)  # every case its own label
    flash = [(r["params"], c["params"]) for r, c in zip(rows, doc["cases"]) if c["technique"] == "flash_attention"]
    assert all("causal=False" not in label and "block_m=0" not in label for label, _ in flash)  # off: said by nothing
    assert all(("causal=True" in label) == params["causal"] for label, params in flash)
    assert all(f"seq_len={params['seq_len']}" in label for label, params in flash)


@REAL_RUN
def test_the_params_table_shows_the_values_this_run_took(real_report):
    """Each technique's params table says what the run's cases set, per param (flash_attention's
    seq_len took 32 and 64 in the report-test scenario): never an object's text, and the same page
    from one process to the next."""
    _, page, *_ = real_report
    assert "built-in method" not in page and " object at 0x" not in page
    section = page.split('<section id="tech-flash_attention"')[1].split("</section>")[0]
    assert "<tr><td><code>seq_len</code></td><td>32, 64</td>" in section


# -- figures from too few samples (issue 34) ------------------------------------------------------
def _timed_case(index: int, ratio: float, n: int) -> dict[str, Any]:
    """A passed case whose optimized variant is ``ratio`` times faster, ``n`` timed calls a variant,
    written as today's runner writes it (no interval under MIN_CI_SAMPLES)."""
    from gpubench.records import stats

    base, opt = [0.01 * (1 + 0.01 * i) for i in range(n)], [0.01 / ratio * (1 + 0.01 * i) for i in range(n)]
    return {
        "id": f"pair[i={index}]",
        "technique": "pair",
        "params": {"i": index},
        "seed": 0,
        "policy": {"min_reps": n},
        "status": "passed",
        "variants": {
            "slow": {"role": "baseline", "status": "ok", "samples_s": base, "stats": stats.summarize(base).to_dict()},
            "fast": {"role": "optimized", "status": "ok", "samples_s": opt, "stats": stats.summarize(opt).to_dict()},
        },
        "speedups": {"fast": stats.bootstrap_ratio_ci(base, opt).to_dict()},
    }


def _timed_run(cases: list[dict[str, Any]], repeat_scale: float = 1.0) -> RunRecord:
    return RunRecord.from_dict(
        {
            "kind": "gpubench.results",
            "schema_version": 3,
            "run_id": "r",
            "device": "cpu",
            "device_label": "CPU",
            "status": "complete",
            "repeat_scale": repeat_scale,
            "scenario": {"name": "s"},
            "env": {},
            "cases": cases,
        }
    )


def test_a_speedup_from_one_sample_prints_its_count_and_no_interval():
    """Issue 34: 0.37x [0.37, 0.37] from one timed call a variant."""
    case = CaseRecord.from_dict(_timed_case(0, 0.37, 1))
    assert format_speedup(case.speedup("fast")) == "0.37x (n=1)"
    assert format_speedup(CaseRecord.from_dict(_timed_case(0, 2.0, 8)).speedup("fast")).startswith("2.00x [")


def test_the_headline_counts_a_case_of_too_few_samples_apart_never_as_best_or_worst():
    """Seven cases, one of them 37x from one timed call (issue 34's --repeat-scale 0.3 figure): the
    technique's line ranges over the six with a CI and names the seventh apart; best speedup is
    not the 37x."""
    run = _timed_run([_timed_case(i, 1.1 + 0.1 * i, 8) for i in range(6)] + [_timed_case(6, 37.22, 1)])
    line = sweep.technique_line(run.cases, ())
    assert line.startswith("speedup 1.10x to 1.60x over 6 cases") and "1 case too few samples (n=1, below 5)" in line
    head = html.headline(run)
    assert head["best"].startswith("1.60x") and head["too_few_samples"].startswith("1 case too few samples")
    assert "(not counted: 1 case too few samples (n=1, below 5); no CI)" in "\n".join(markdown._headline(head))
    every = _timed_run([_timed_case(i, 1.5 + i, 2) for i in range(3)])
    assert (
        sweep.technique_line(every.cases, ()) == "speedup 1.50x to 3.50x, no CI: 3 cases too few samples (n=2, below 5)"
    )
    assert html.headline(every)["best"] == "-"  # no best without a CI


def test_better_in_x_of_y_leaves_out_cases_of_too_few_samples():
    """A technique read by its own figure: 'better in 7 of 7' must not count a case whose timed
    calls were too few (its figure rests on one call)."""
    cases = [_timed_case(i, 1.5, 8 if i < 6 else 1) for i in range(7)]
    for case in cases:
        case["variants"]["slow"]["metrics"] = {"tokens_per_s": 100.0}
        case["variants"]["fast"]["metrics"] = {"tokens_per_s": 150.0}
    run = _timed_run(cases)
    line = sweep.technique_line(run.cases, (Headline("tokens_per_s", "tokens/s"),))
    assert "better in 6 of 6 cases; 1 case too few samples (n=1, below 5)" in line


def test_the_terminal_says_why_speedups_have_no_ci_at_a_small_repeat_scale():
    """--repeat-scale 0.3 makes min_reps round(1.5) = 2: the summary says so, not a bare n=2."""
    from gpubench.reports.terminal import few_samples_lines, summary_lines

    run = _timed_run([_timed_case(0, 2.0, 2)], repeat_scale=0.3)
    assert "2.00x (n=2)" in "\n".join(summary_lines(run))
    notes = few_samples_lines(run)
    assert notes[0].startswith("samples: 1 speedup rests on fewer than 5 timed calls a variant (n=2, below 5)")
    assert notes[1] == "samples: min_reps is 2 in this run (--repeat-scale 0.3); a CI needs 5 timed calls a variant"
    assert few_samples_lines(_timed_run([_timed_case(0, 2.0, 8)])) == []


def test_an_under_sampled_variant_is_named_with_its_reason():
    from gpubench.reports.sections import variant_rows
    from gpubench.reports.terminal import few_samples_lines

    doc = _timed_case(0, 2.0, 1)
    doc["variants"]["fast"]["under_sampled"] = "1 of min_reps 5 timed calls: time cap (max_time_s = 10 s) reached"
    doc["policy"] = {"min_reps": 5}
    run = _timed_run([doc])
    assert "time cap (max_time_s = 10 s)" in few_samples_lines(run)[-1]
    row = next(r for r in variant_rows(run.cases[0], 1) if r["variant"] == "fast")
    assert row["ci"] == "none (n=1)" and "under-sampled: 1 of min_reps 5" in row["reason"]


# -- a page read in a minute (issue 35) ----------------------------------------------------------------
def test_a_wall_time_reads_as_a_duration_never_in_exponent_notation():
    assert [elapsed_text(s) for s in (0.35, 4.19, 59.9, 2312.0, 3725.0, 90000.0)] == [
        "350 ms",
        "4.2 s",
        "59.9 s",
        "38 min 32 s",
        "1 h 2 min",
        "1 day 1 h",
    ]
    from gpubench.records.results import TimeUse

    line = TimeUse(
        wall_s=2312.0, workers=1, cases_s=2300.0, phases_s={"timed": 1200.0, "build": 70.0}, timed_share=0.52
    ).text()
    assert (
        line
        == ("timed calls were 52% of wall time (20 min of 38 min 32 s; the cases took 38 min 20 s: build 1 min 10 s)")
        and "e+" not in line
    )


@REAL_RUN
def test_a_killed_run_says_how_many_planned_cases_never_ran_in_red_and_its_wall_time_as_far_as_known(
    real_dir, tmp_path
):
    """After kill -9 a run directory holds results.json as the run began it ("running", no finish
    time, no cases) and cases.jsonl with the cases that finished: the counts say "8 of 13 planned
    not run" (red, beside passed and failed), and so does summary.md; the wall time is what is
    known, from the start to the end of the last case recorded ("at least ..."), never "-"; a run
    that reached what it planned, or never recorded its plan, says nothing of it."""
    doc = json.loads((real_dir / "results.json").read_text())
    cases = doc.pop("cases")[:5]
    for number, case in enumerate(cases):  # the last one ends 38 min 32 s after the run's start
        case.update(started_at=f"2026-01-01T10:{10 * number:02d}:00+00:00", elapsed_s=92.0 if number == 4 else 5.0)
    doc.update(
        cases=[],
        status="running",
        planned_cases=13,
        not_run=[],
        started_at="2026-01-01T10:00:00+00:00",
        finished_at=None,
    )
    doc.pop("summary", None)
    run_dir = report_runs.write_run(tmp_path / "killed", doc)
    (run_dir / "cases.jsonl").write_text("".join(json.dumps({"index": i, **c}) + "\n" for i, c in enumerate(cases)))
    written = html.write_report(run_dir, read_history=False)
    page, md = written.html.read_text(encoding="utf-8"), written.markdown.read_text(encoding="utf-8")
    counts = page.split('<dd id="counts">')[1].split("</dd>")[0]
    assert (
        '<span class="fail" id="not-started">8 of 13 planned not run (the run never finished: killed, or '
        'still going)</span>'
    ) in counts
    assert (
        "**5 cases: 5 passed, 0 failed, 8 of 13 planned not run (the run never finished: killed, or still going)**"
        in md
    )
    assert "(wall time at least 41 min 32 s, to its last case recorded)" in page
    assert "(wall time -)" not in page
    for planned in (5, None):  # all it planned ran; an older record without a plan
        assert html.headline({**doc, "cases": cases, "planned_cases": planned})["not_started"] == 0
    finished = {**doc, "cases": cases, "status": "complete", "finished_at": "2026-01-01T10:38:32+00:00"}
    assert html.headline(finished)["duration"] == "38 min 32 s"  # a finish time is the figure itself


def test_a_run_with_no_finish_time_reads_its_wall_time_from_its_last_case_or_says_it_is_unknown():
    """A killed run's wall time runs from its start to the end of its last case recorded, whichever
    case that is (cases finish out of order across workers; an old record without an offset is
    read as UTC); with no case, or no start, it is unknown: never a guess, never "-"."""
    from gpubench.records.results import RunRecord

    run = RunRecord.from_dict(
        {
            "run_id": "r",
            "device": "cpu",
            "device_label": "cpu",
            "scenario": {},
            "env": {},
            "status": "running",
            "started_at": "2026-01-01T10:00:00+00:00",
            "cases": [
                {
                    "id": "t a=1",
                    "technique": "t",
                    "status": "passed",
                    "started_at": "2026-01-01T10:00:50",
                    "elapsed_s": 20.0,
                },
                {
                    "id": "t a=2",
                    "technique": "t",
                    "status": "passed",
                    "started_at": "2026-01-01T10:00:30+00:00",
                    "elapsed_s": 4.0,
                },
            ],
        }
    )
    assert run.wall_time_text() == "at least 1 min 10 s, to its last case recorded"
    assert (
        RunRecord.from_dict({**run.to_dict(), "cases": []}).wall_time_text()
        == "unknown (no finish time, no case recorded)"
    )
    assert RunRecord.from_dict({**run.to_dict(), "started_at": ""}).wall_time_text() == "unknown (no finish time)"
    done = RunRecord.from_dict({**run.to_dict(), "status": "complete", "finished_at": "2026-01-01T10:00:04.2+00:00"})
    assert done.wall_time_text() == "4.2 s"


@REAL_RUN
def test_a_summary_cell_breaks_between_a_variant_and_its_time_never_inside_the_time(real_report):
    """At 1300 px a squeezed summary table showed "eager 40.3 / ms": the baseline and optimized
    cells may break only between the variant's name and its time, each kept whole."""
    page = real_report[1]
    table = page.split('<table id="summary-table">')[1].split("</table>")[0]
    cells = re.findall(r'<td class="num named">(.*?)</td>', table)
    assert cells
    for cell in cells:
        assert re.fullmatch(r'<span class="nw">[^<\s]+</span>( <span class="nw">[^<]+</span>)?', cell), cell


def test_an_arrow_in_a_headline_never_breaks_between_its_two_characters():
    """On a phone "max concurrent requests 8 -> 32" wrapped as "8 -" / "> 32": every "->" the page
    prints from a headline is one unbreakable piece, and the text around it stays escaped."""
    out = str(html._arrows("KV <b> 8 -> 32; 21% -> 92%"))
    assert out == 'KV &lt;b&gt; 8 <span class="nw">-&gt;</span> 32; 21% <span class="nw">-&gt;</span> 92%'


def test_summary_md_leaves_out_a_headline_column_no_case_fills():
    row = {
        "number": 1,
        "technique": "t",
        "params": "n=1",
        "baseline": "a 1 ms",
        "optimized": "b 1 ms",
        "speedup": "1.00x",
        "headline": "",
        "why": "",
        "check": "pass",
        "memory": "-",
        "energy": "-",
        "failed": False,
        "status": "passed",
        "reason": "",
    }
    head = {
        "scenario": "s",
        "device": "d",
        "date": "-",
        "run_id": "r",
        "cases": 1,
        "passed": 1,
        "failed": 0,
        "best": "-",
        "worst": "-",
    }
    assert "| headline |" not in markdown.render_summary(head, [row])
    assert "| headline |" in markdown.render_summary(head, [{**row, "headline": "kv 1 -> 2"}])


@REAL_RUN
def test_a_technique_section_opens_with_its_answer_and_folds_the_rest(real_report):
    """Each section: its sentence, one figure, a compact table of its cases by what varies (no
    more columns than it fills); every other figure, the roofline, what each variant runs, each
    param and every variant of every case in collapsed <details> (folded, not deleted)."""
    doc, page, *_ = real_report
    for name in {c["technique"] for c in doc["cases"]}:
        section = page.split(f'<section id="tech-{name}"')[1].split("</section>")[0]
        fold = section.find("<details")
        head, rest = section[:fold], section[fold:]
        assert head.count("<figure>") <= 1, name  # one figure opens the section
        assert '<table class="compact">' in head, name
        compact = head.split('<table class="compact">')[1].split("</table>")[0]
        assert compact.count('<tr class=') == sum(c["technique"] == name for c in doc["cases"])
        assert "<th>baseline</th>" not in compact  # compact: the case, its figure, its check
        assert "<figure>" in head or "No figure" in head, name
        assert "every variant of every case" in rest and "what each variant runs" in rest
        assert "<figure>" not in rest.split("</details>")[-1]  # nothing unfolded after the first fold
    flash = page.split('<section id="tech-flash_attention"')[1].split("</section>")[0]
    assert 'class="more-figures"' in flash and 'class="roofline-block"' in flash
    assert flash.split("<details")[0].count("<figcaption>speedup of optimized over baseline") == 1


def test_a_tiny_speedup_keeps_its_digits_rather_than_printing_zero():
    """A ratio under 0.1 (a busy machine's 0.004x) prints to two significant digits, CI ends too:
    two decimals would show 0.00x, a figure that reads as broken, not as slow."""
    from gpubench.reports.terminal import format_speedup, ratio_text

    assert ratio_text(0.0043) == "0.0043" and ratio_text(1.234) == "1.23" and ratio_text(0.5) == "0.50"
    text = format_speedup({"ratio": 0.0043, "ci_low": 0.0011, "ci_high": 287.0, "n": 30})
    assert text == "0.0043x [0.0011, 287.00]", text
    assert "0.00x" not in format_speedup({"ratio": 0.004, "n": 2})
