"""The HTML report and summary.md, rendered from a real run of `smoke` and from hand-made results
(a failed case, a single case, telemetry with throttling, hostile text): what they contain, that
every figure holds data, that results text is escaped, and the `report` command's exit codes."""
import copy
import json
import re
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from markupsafe import escape

from gpubench.results import role_variant
from gpubench import runner, scenario, techniques
from gpubench.cli import main
from gpubench.reports import figures, html, markdown
from gpubench.reports.terminal import format_speedup
from gpubench.telemetry import SAMPLE_COLUMNS

FIGURE = re.compile(r"<figure>\s*<figcaption>(.*?)</figcaption>(.*?)</figure>", re.S)
DATA = re.compile(r'<g id="data-\d+">\s*<(path|use|g|defs)\b')


@pytest.fixture(scope="session")
def smoke_dir(tmp_path_factory) -> Path:
    """One real run of the smoke scenario (every technique, CPU, short policy)."""
    outcome = runner.run_scenario(scenario.load("smoke"), torch.device("cpu"), tmp_path_factory.mktemp("runs"),
                                  repeat_scale=0.2)
    assert outcome.doc["summary"]["failed"] == 0
    return outcome.run_dir


@pytest.fixture(scope="session")
def smoke_report(smoke_dir) -> tuple[dict, str, str]:
    written = html.write_report(smoke_dir)
    doc = json.loads((smoke_dir / "results.json").read_text())
    return doc, written.html.read_text(encoding="utf-8"), written.markdown.read_text(encoding="utf-8")


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


def assert_no_empty_axes(page: str) -> None:
    """Every figure is an SVG with a data element, or a note saying why there is none."""
    for title, body in FIGURE.findall(page):
        if "<svg" in body:
            assert DATA.search(body), title
        else:
            assert 'class="note"' in body, title


# -- a real smoke run --------------------------------------------------------------------------
def test_headline_counts_and_every_case_with_its_speedup(smoke_report):
    doc, page, _ = smoke_report
    n = len(doc["cases"])
    assert f"{n} cases: <span class=\"pass\">{n} passed</span>" in page
    assert "best speedup" in page and "worst speedup" in page
    assert str(escape(doc["device_label"])) in page and "smoke" in page
    for case in doc["cases"]:
        assert f'title="{escape(case["id"])}"' in page
        assert format_speedup(case["speedups"][role_variant(case, "optimized")]) in page


def test_every_technique_has_a_section_with_its_anchor_figure_and_cpu_caveat(smoke_report):
    doc, page, _ = smoke_report
    for name in {c["technique"] for c in doc["cases"]}:
        tech = techniques.get(name)
        assert f'<section id="tech-{name}"' in page
        assert str(escape(tech.anchor)) in page
        assert str(escape(tech.gpu_specific)) in page  # a CPU run says the ratio is not the GPU's


def test_figures_are_inline_svg_with_data(smoke_report):
    doc, page, _ = smoke_report
    found = figures_of(page)
    sweep = [b for t, bodies in found.items() if t.startswith("speedup of optimized") for b in bodies]
    latency = found["time per call, raw samples (box: quartiles, line: median)"]
    timed = {c["technique"] for c in doc["cases"]}  # every smoke technique is timed
    assert len(sweep) == len(latency) == len(timed)  # one of each per technique
    for body in sweep + latency + found["share of the measured device peak"][:1]:  # flash_attention has FLOPs
        assert "<svg" in body and DATA.search(body)
    assert "no % of peak: this technique reports no FLOP or byte counts." in page  # kv_cache counts bytes held
    assert_no_empty_axes(page)
    for external in ("<img", "<link", "<script", " src=", 'href="http', "url(http", "@import"):
        assert external not in page  # nothing to fetch: readable offline


def test_environment_block_and_telemetry_unavailable_on_a_cpu(smoke_report):
    doc, page, _ = smoke_report
    assert "<details><summary>env.json</summary>" in page and doc["env"]["torch"] in page
    assert f"telemetry unavailable: {escape(doc['telemetry']['reason'])}" in page
    assert "<script" not in page


def test_summary_md_has_the_headline_and_the_table_under_60_kb(smoke_report):
    doc, _, md = smoke_report
    assert len(md.encode()) < 60_000
    assert f"**{len(doc['cases'])} cases: {len(doc['cases'])} passed, 0 failed**" in md
    assert "| # | technique | case | baseline | optimized | speedup [95% CI] |" in md
    table = [line for line in md.splitlines() if re.match(r"\| \d+ \|", line)]
    assert len(table) == len(doc["cases"])


# -- hand-made edge cases ----------------------------------------------------------------------
def test_a_failed_case_is_red_with_its_escaped_reason(smoke_dir, tmp_path):
    doc = json.loads((smoke_dir / "results.json").read_text())
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


def test_a_single_case_run_draws_points_not_empty_sweeps(smoke_dir, tmp_path):
    doc = json.loads((smoke_dir / "results.json").read_text())
    for keep in (0, len(doc["cases"]) - 1):  # a flash_attention case, a kv_cache case
        one = copy.deepcopy(doc)
        one["cases"] = [doc["cases"][keep]]
        page = html.render(html.load_run(make_run(tmp_path / str(keep), one)))
        found = figures_of(page)
        assert DATA.search(found["speedup of optimized over baseline (95% CI)"][0])
        assert '1 case: <span class="pass">1 passed</span>' in page
        assert_no_empty_axes(page)


def test_a_case_without_timings_gets_notes_instead_of_figures(smoke_dir, tmp_path):
    doc = json.loads((smoke_dir / "results.json").read_text())
    case = doc["cases"][0]
    case.update(status="failed", speedups={}, failure={"kind": "oom", "message": "out of memory", "traceback": ""})
    for v in case["variants"].values():
        v.update(samples_s=[], stats=None, metrics={})
    doc["cases"] = [case]
    page = html.render(html.load_run(make_run(tmp_path / "run", doc)))
    assert "<svg" not in page
    assert "no speedup to show" in page and "no timing samples" in page and "no % of peak" in page


def test_results_text_is_escaped_everywhere(smoke_dir, tmp_path):
    doc = json.loads((smoke_dir / "results.json").read_text())
    doc["scenario"]["description"] = "<script>alert(1)</script>"
    doc["scenario"]["name"] = "<img src=x onerror=alert(2)>"
    case = copy.deepcopy(doc["cases"][-1])
    case.update(technique="<i>gone</i>", id="<i>gone</i>[p=<script>alert(3)</script>]",
                params={"p": "<script>alert(3)</script>", "q": "$x^2$ | 50%"})
    doc["cases"].append(case)
    page = html.write_report(make_run(tmp_path / "run", doc)).html.read_text()
    assert "<script" not in page and "<img" not in page and "<i>gone" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;script&gt;alert(3)" in page
    assert "is not registered in this gpubench" in page  # an unknown technique still renders
    assert_no_empty_axes(page)
    md = (tmp_path / "run" / "summary.md").read_text()
    assert "<script" not in md and "<img" not in md and "\\| 50%" in md


def _telemetry_rows(doc: dict, throttle_every: int) -> list[dict]:
    rows, t = [], 0.0
    for case in doc["cases"]:
        for k in range(8):
            rows.append({"t_s": t, "case": case["id"], "variant": "optimized", "power_w": 300 + k,
                         "energy_mj": 1000 * t, "sm_clock_mhz": 1980 - 10 * k, "mem_clock_mhz": 2619,
                         "temp_c": 60 + k, "util_gpu_pct": 99, "util_mem_pct": 40, "mem_used_mb": 5000 + k,
                         "throttle_mask": 0x20 if k % throttle_every == 0 else 0,
                         "throttle_reasons": "sw_thermal_slowdown" if k % throttle_every == 0 else ""})
            t += 0.05
    return rows


def test_telemetry_is_plotted_and_a_throttled_run_is_flagged_at_the_top(smoke_dir, tmp_path):
    doc = json.loads((smoke_dir / "results.json").read_text())
    doc["telemetry"] = {"status": "ok", "reason": None, "interval_s": 0.05, "n_samples": 8 * len(doc["cases"]),
                        "throttled": True, "throttled_fraction": 0.25, "throttle_reasons": ["sw_thermal_slowdown"],
                        "benign_reasons": ["gpu_idle"]}
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


def test_missing_telemetry_file_is_said_not_plotted(smoke_dir, tmp_path):
    doc = json.loads((smoke_dir / "results.json").read_text())
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

    doc = {"kind": "gpubench.results", "schema_version": 1, "run_id": "r", "status": "complete", "device": "cpu",
           "scenario": {"name": "toy", "entries": []}, "cases": [], "summary": {}}
    doc["cases"] = [{"id": "toy_kernel[n=1]", "technique": "toy_kernel", "params": {"n": 1}, "status": "passed",
                     "variants": {}, "speedups": {}}]
    run = html.load_run(make_run(tmp_path / "run", doc))
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
        return {"id": f"toy_kernel[n={n}]", "technique": "toy_kernel", "params": {"n": n, "mode": "ok"},
                "status": "passed", "speedups": {},
                "variants": {"baseline": {"role": "baseline", "metrics": {"gbps": n / 10}},
                             "optimized": {"role": "optimized", "metrics": {"gbps": n / 5}}}}

    doc = {"kind": "gpubench.results", "schema_version": 2, "run_id": "r", "status": "complete", "device": "cpu",
           "scenario": {"name": "toy", "entries": []}, "cases": [case(8), case(64)], "summary": {}}
    run = html.load_run(make_run(tmp_path / "run", doc))
    monkeypatch.setattr(toys.KERNEL, "plots", [Plot("GB/s against n", y="gbps", x="n", ylabel="GB/s"),
                                               Plot("nothing recorded", y="absent", x="n")])
    page = html.render(run)
    assert DATA.search(figures_of(page)["GB/s against n"][0])
    assert "no data for this figure in this run." in figures_of(page)["nothing recorded"][0]

    def broken(plot, cases, defaults=None):
        raise KeyError("boom")

    monkeypatch.setattr(figures, "declared", broken)
    page = html.render(run)
    assert "the figure failed: KeyError" in page and "</html>" in page


def test_figure_builders_return_none_without_data():
    assert figures.speedup_sweep({}, "x") is None
    assert figures.ratio_points([], [], [], [], "x") is None
    assert figures.latency_boxes([("a", {"baseline": []})]) is None
    assert figures.peak_bars(["a"], {"% peak": {"baseline": [None]}}) is None
    assert figures.telemetry_timeline([0.0, 1.0], [("power", [float("nan")] * 2)], [], []) is None


def test_summary_md_stays_under_60_kb_and_escapes_cells():
    row = {"number": 1, "technique": "t", "params": "p=" + "x" * 300, "baseline": "1 ms", "optimized": "1 ms",
           "speedup": "1.00x", "headline": "", "check": "pass", "memory": "-", "energy": "-", "status": "passed",
           "failed": False, "reason": ""}
    head = {"scenario": "a|b", "device": "cpu", "date": "d", "run_id": "r", "cases": 2000, "passed": 2000,
            "failed": 0, "best": "-", "worst": "-", "warnings": []}
    md = markdown.render_summary(head, [dict(row, number=i) for i in range(2000)])
    assert len(md.encode()) < 60_000
    assert "more cases left out to keep this summary under 60 KB" in md and "a\\|b" in md


# -- comparison --------------------------------------------------------------------------------
def test_compare_lists_regressions_first_and_cases_of_one_run_apart(smoke_dir, tmp_path):
    before = json.loads((smoke_dir / "results.json").read_text())
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
def test_report_command_writes_html_and_summary_and_exits_0(smoke_dir, tmp_path):
    out = tmp_path / "elsewhere" / "r.html"
    result = CliRunner().invoke(main, ["report", str(smoke_dir), "-o", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert out.exists() and (out.parent / "summary.md").exists()
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
    path = write_scenario("name: ok\nentries:\n  - technique: toy_kernel\n")
    result = CliRunner().invoke(main, ["run", "--scenario", str(path), "--out", str(tmp_path / "a"), "--no-calibrate"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report_line = result.output.strip().splitlines()[-1]
    assert report_line.startswith("report: ") and report_line.endswith("report.html (+ summary.md)")
    assert Path(report_line.split()[1]).exists()

    def broken(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(html, "write_report", broken)
    result = CliRunner().invoke(main, ["run", "--scenario", str(path), "--out", str(tmp_path / "b"), "--no-calibrate"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "warning: the report could not be written (RuntimeError: disk on fire)" in result.output
    run_dir = next((tmp_path / "b").iterdir())
    assert (run_dir / "results.json").exists() and not (run_dir / "report.html").exists()
