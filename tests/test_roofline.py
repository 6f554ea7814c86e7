"""The roofline in the report (issue 28, point 4): every timed variant of a case, peers included,
read against the case's once-counted FLOPs and bytes and the run's measured ceilings; the roof is
min(matmul peak, intensity x copy bandwidth); a run without ceilings, a CPU run and an old run
still render and say what they lack."""

from __future__ import annotations

import copy
import json
import re
from html import unescape

import pytest
from roofline_runs import CEILINGS, PEAK_GBPS, PEAK_TFLOPS, roofline_doc

from gpubench.records.results import RunRecord
from gpubench.reports import charts, drawing, html, roofline
from gpubench.reports.sections import Labels
from gpubench.run import runner

TABLE = re.compile(r'<section id="tech-(\w+)".*?(?:<table class="roofline-table">(.*?)</table>|</section>)', re.S)
ROW = re.compile(r"<tr[^>]*>(.*?)</tr>", re.S)
CELL = re.compile(r"<t[dh][^>]*>(.*?)</t[dh]>", re.S)


def roofline_tables(page: str) -> dict[str, list[list[str]]]:
    """Per technique section, its roofline table's rows as plain cell texts (header first)."""
    out = {}
    for name, table in TABLE.findall(page):
        if table:
            out[name] = [
                [unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in CELL.findall(row)] for row in ROW.findall(table)
            ]
    return out


def section(page: str, name: str) -> str:
    return page.split(f'<section id="tech-{name}"')[1].split("</section>")[0]


def render(tmp_path, doc) -> str:
    (tmp_path / "results.json").write_text(json.dumps(doc))
    return html.render(html.load_run(tmp_path))


def run_readings(doc) -> list[roofline.Reading]:
    run = RunRecord.from_dict(doc)
    labels = Labels(run)
    return roofline.readings(run, list(enumerate(run.cases, 1)), labels.params)


# -- the runner ----------------------------------------------------------------------------------
def test_derive_rates_records_intensity_and_what_the_bandwidth_share_is_of():
    """A variant's metrics carry FLOPs per byte and the basis of its bandwidth share (the measured
    copy, bytes read + written) beside the rates, so results.json says what 100% is."""
    m = runner.derive_rates({"flops": 4e12, "bytes_moved": 2e9}, 0.01, CEILINGS)
    assert m["flops_per_byte"] == pytest.approx(2000.0)
    assert m["tflops"] == pytest.approx(400.0) and m["pct_peak_flops"] == pytest.approx(50.0)
    assert m["gbps"] == pytest.approx(200.0) and m["pct_peak_bandwidth"] == pytest.approx(5.0)
    assert "copy" in m["peak_bandwidth_basis"] and "bytes read + bytes written" in m["peak_bandwidth_basis"]
    bare = runner.derive_rates({"flops": 4e12, "bytes_moved": 2e9}, 0.01, None)
    assert "pct_peak_bandwidth" not in bare and "peak_bandwidth_basis" not in bare and bare["flops_per_byte"] == 2000.0
    assert "flops_per_byte" not in runner.derive_rates({"bytes_moved": 2e9}, 0.01, CEILINGS)


def test_every_timed_variant_of_a_real_run_peers_included_has_rates_from_the_cases_counts(small_run_dir):
    """In a real run, every timed variant of flash_attention and paged_attention (the sdpa peer
    too) records TFLOP/s or GB/s and its share of the calibrated peak, from counts that are the
    same for every variant of the case (each byte and FLOP counted once, whatever the variant does)."""
    doc = json.loads((small_run_dir / "results.json").read_text())
    assert doc["ceilings"]["copy"]["peak_gbps"] > 0  # the run calibrated
    peers_timed = 0
    for case in doc["cases"]:
        if case["technique"] not in ("flash_attention", "paged_attention"):
            continue
        timed = {n: v for n, v in case["variants"].items() if v["samples_s"]}
        counts = {(v["metrics"].get("flops"), v["metrics"]["bytes_moved"]) for v in timed.values()}
        assert len(counts) == 1, (case["id"], counts)
        for name, v in timed.items():
            m = v["metrics"]
            assert m["gbps"] == pytest.approx(m["bytes_moved"] / v["stats"]["median"] / 1e9)
            assert m["pct_peak_bandwidth"] == pytest.approx(100 * m["gbps"] / doc["ceilings"]["copy"]["peak_gbps"])
            if case["technique"] == "flash_attention":
                assert m["pct_peak_flops"] > 0 and m["flops_per_byte"] > 0, name
            peers_timed += v["role"] == "peer"
    assert peers_timed >= 1  # flash_attention's sdpa runs on the CPU


# -- the numbers, by hand -----------------------------------------------------------------------
def test_the_table_matches_a_hand_computation_under_the_runs_ceilings(tmp_path):
    """Each row's rates, shares, share of the roof and bound are what the case's counts, the
    variant's median and the run's ceilings give by hand: peak 800 TFLOP/s and 4,000 GB/s put the
    ridge at 200 FLOPs per byte; case #1 (2 TFLOP, 1 GB: 2,000 FLOPs per byte) is compute-bound
    under a roof of 800 TFLOP/s, case #2 (100 GFLOP, 10 GB: 10 FLOPs per byte) memory-bound under
    10 x 4,000 GB/s = 40 TFLOP/s."""
    tables = roofline_tables(render(tmp_path, roofline_doc()))
    head, *rows = tables["flash_attention"]
    assert head == [
        "variant",
        "FLOPs",
        "bytes",
        "FLOPs / byte",
        "TFLOP/s",
        "GB/s",
        "% of matmul peak",
        "% of copy bandwidth",
        "% of roof",
        "bound",
    ]
    by_case = {}
    for row in rows:
        if len(row) == 1:
            case = row[0].split()[0]
        else:
            by_case[(case, row[0].split()[0])] = row[1:]
    # triton, case #1: 2e12 FLOPs in 10 ms = 200 TFLOP/s (25% of 800, 25% of the roof there);
    # 1e9 bytes in 10 ms = 100 GB/s (2.5% of 4,000)
    assert by_case[("#1", "triton")] == ["2 TFLOP", "1 GB", "2,000", "200", "100", "25.0%", "2.5%", "25.0%", "compute"]
    # sdpa_cudnn (a peer), case #2: 1e11 FLOPs in 4 ms = 25 TFLOP/s, 62.5% of the 40 TFLOP/s roof;
    # 1e10 bytes in 4 ms = 2,500 GB/s, 62.5% of the copy bandwidth
    assert by_case[("#2", "sdpa_cudnn")] == [
        "100 GFLOP",
        "10 GB",
        "10",
        "25",
        "2,500",
        "3.1%",
        "62.5%",
        "62.5%",
        "memory",
    ]
    assert [v for c, v in by_case if c == "#1"] == ["eager", "triton", "sdpa_cudnn", "flash_attn"]  # roles, then peers
    paged_head, _, *paged = tables["paged_attention"]
    assert paged_head == ["variant", "bytes", "GB/s", "% of copy bandwidth"]  # no FLOPs: nothing else to say
    assert [r[0].split()[0] for r in paged] == ["gather", "triton", "sdpa_contiguous"]
    assert paged[2][1:] == ["4 GB", "2,500", "62.5%"]  # 4e9 bytes in 1.6 ms


def test_the_roof_is_min_of_peak_and_intensity_times_bandwidth():
    """The drawn roof is min(matmul peak, intensity x copy bandwidth) wherever it is evaluated,
    its corner at the ridge point; the points sit at (FLOPs / byte, TFLOP/s) of each reading."""
    found = run_readings(roofline_doc())
    [(roof, series)] = roofline.chart_groups(found)
    assert roof.ridge == pytest.approx(200.0)
    fig = charts.roofline(series, roof.peak_tflops, roof.peak_gbps)
    [line] = [a for a in fig.axes[0].lines if a.get_gid() == drawing.REFERENCE and len(a.get_xdata()) == 3]
    for x, y in zip(line.get_xdata(), line.get_ydata()):
        assert y == pytest.approx(min(PEAK_TFLOPS, x * PEAK_GBPS / 1e3))
    assert line.get_xdata()[1] == pytest.approx(200.0)
    assert sorted(series["triton"]) == [(10.0, pytest.approx(20.0), "#2"), (2000.0, pytest.approx(200.0), "#1")]
    assert drawing.mark_data(fig) == 4  # one point set per variant; the roof is not data
    drawing.close(fig)
    for r in found:
        if r.intensity is not None:
            attainable = min(PEAK_TFLOPS, r.intensity * PEAK_GBPS / 1e3)
            assert r.pct_roof == pytest.approx(100 * r.tflops / attainable)
            assert r.bound == ("memory" if r.intensity < 200 else "compute")


def test_each_case_is_read_against_the_ceilings_of_the_device_it_ran_on():
    """A case that ran on a second device is read against that device's calibration, not the
    first device's (the run's own ``ceilings``), and the report draws one roofline per model."""
    doc = roofline_doc()
    slow = copy.deepcopy(CEILINGS)
    slow["matmul"]["peak_tflops"], slow["copy"]["peak_gbps"] = 400.0, 2000.0
    doc["cases"][1]["device"] = {"key": "cuda:1", "type": "cuda", "index": 1, "label": "NVIDIA H100"}
    doc["devices"]["cuda:1"] = {**doc["cases"][1]["device"], "ceilings": slow}
    found = run_readings(doc)
    second = next(r for r in found if r.number == 2 and r.variant == "sdpa_cudnn")
    assert second.pct_bandwidth == pytest.approx(125.0)  # 2,500 GB/s of 2,000
    assert second.pct_roof == pytest.approx(125.0)  # 25 TFLOP/s under a roof of 10 x 2,000 GB/s
    assert [roof.device for roof, _ in roofline.chart_groups(found)] == ["NVIDIA H200", "NVIDIA H100"]


def test_variants_that_count_differently_are_flagged():
    """A technique whose variants record different counts for one case (its own traffic rather
    than the problem's) is named in a note: their shares are not of one problem."""
    doc = roofline_doc()
    doc["cases"][1]["variants"]["eager"]["metrics"]["bytes_moved"] = 4e10  # eager counted its score matrix
    notes = roofline.notes(run_readings(doc))
    assert [n for n in notes if n.startswith("Case #2: the variants recorded different")], notes
    assert not [n for n in roofline.notes(run_readings(roofline_doc())) if "different" in n]


# -- what a run lacks --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "ceilings, why",
    [
        (None, "the run was not calibrated (--no-calibrate)"),
        ({"error": "RuntimeError: boom"}, "the run's calibration failed (RuntimeError: boom)"),
    ],
)
def test_a_run_without_ceilings_shows_absolute_rates_and_says_why_there_is_no_roof(tmp_path, ceilings, why):
    """Without a calibration (--no-calibrate, or one that failed) the figure still places each
    variant by its intensity and TFLOP/s, says there is no roof and why, and the table keeps the
    absolute rates with no share of a peak."""
    page = render(tmp_path, roofline_doc(ceilings))
    flash = section(page, "flash_attention")
    assert f"No roof for NVIDIA H200: {why}" in unescape(flash)
    assert "achieved TFLOP/s against arithmetic intensity (no measured ceilings)" in flash
    assert "roofline: each variant" not in flash
    head, *_ = roofline_tables(page)["flash_attention"]
    assert head == ["variant", "FLOPs", "bytes", "FLOPs / byte", "TFLOP/s", "GB/s"]
    assert "read each variant's GB/s" in unescape(section(page, "paged_attention"))


def test_a_calibration_without_a_copy_figure_keeps_the_matmul_share_and_draws_no_roof():
    """A calibration that recorded the matmul peak but no copy bandwidth: no roof and no bound
    (both need the two ceilings), the share of the matmul peak kept, and the note names what is
    missing."""
    doc = roofline_doc({"matmul": CEILINGS["matmul"]})
    found = run_readings(doc)
    triton = next(r for r in found if r.number == 1 and r.variant == "triton")
    assert triton.pct_peak_flops == pytest.approx(25.0)
    assert triton.pct_bandwidth is None and triton.pct_roof is None and triton.bound == ""
    assert roofline.notes(found)[0] == "No roof for NVIDIA H200: the run's calibration recorded no copy bandwidth."


def test_a_cpu_run_says_its_ceilings_are_the_cpus(tmp_path):
    """On a CPU the ceilings are the CPU's own matmul and copy, and the roofline says so."""
    page = render(tmp_path, roofline_doc(device_type="cpu"))
    assert "The ceilings are this CPU's, not a GPU's" in unescape(section(page, "flash_attention"))


def test_a_run_of_schema_1_renders_its_roofline(tmp_path):
    """A version-1 run (variants named by their role, no device records) still gets its table
    and roofline, from the run's ceilings."""
    doc = roofline_doc()
    doc.update(schema_version=1, devices={})
    for case in doc["cases"]:
        case.pop("device")
        variants = case["variants"]
        base, opt = (next(n for n, v in variants.items() if v["role"] == r) for r in ("baseline", "optimized"))
        case["variants"] = {"baseline": variants[base], "optimized": variants[opt]}
        case["speedups"] = {"optimized": case["speedups"][opt]}
        for v in case["variants"].values():
            del v["role"]
    page = render(tmp_path, doc)
    rows = roofline_tables(page)["flash_attention"]
    assert [
        "optimized optimized",
        "2 TFLOP",
        "1 GB",
        "2,000",
        "200",
        "100",
        "25.0%",
        "2.5%",
        "25.0%",
        "compute",
    ] in rows
    assert "roofline: each variant of each case under the measured ceilings" in section(page, "flash_attention")


def test_an_old_sweep_that_counted_flops_only_says_why_it_has_no_roofline(tmp_path):
    """The 200-case schema-2 sweep counted FLOPs but no bytes and ran without ceilings: no
    roofline, a note that says why, and its table folded (a sweep)."""
    import report_runs

    page = render(tmp_path, report_runs.sweep_doc())
    flash = unescape(section(page, "flash_attention"))
    assert "counts FLOPs but not the bytes moved" in flash and "read its TFLOP/s" in flash
    assert '<details class="roofline-cases">' in flash  # folded, not open
    head, *rows = roofline_tables(page)["flash_attention"]
    assert head == ["variant", "FLOPs", "TFLOP/s"]
    assert sum(len(r) == 1 for r in rows) == 200


def test_the_peak_figure_shows_every_timed_variant_peers_included(tmp_path):
    """The share-of-peak bars hold every timed variant of the case, not only the baseline and the
    optimized one: the peers on the same case are beside them."""
    page = render(tmp_path, roofline_doc())
    figure = (
        section(page, "paged_attention").split("<figcaption>share of the measured device peak")[1].split("</figure>")[0]
    )
    for name in ("gather", "triton", "sdpa_contiguous"):
        assert name in figure


def test_nine_variants_on_one_roofline_are_told_apart():
    """A GPU flash_attention case has nine timed variants (eager, triton, torch_tiled, sdpa and
    its four pinned backends, flash_attn): more than the palette's colours, so each variant's
    points differ from every other's in colour or marker."""
    names = [
        "eager",
        "triton",
        "torch_tiled",
        "sdpa",
        "sdpa_flash",
        "sdpa_efficient",
        "sdpa_cudnn",
        "sdpa_math",
        "flash_attn",
    ]
    series = {name: [(100.0, 10.0 + k, "#1")] for k, name in enumerate(names)}
    colors = {name: charts.variant_color(name, k) for k, name in enumerate(names)}
    fig = charts.roofline(series, PEAK_TFLOPS, PEAK_GBPS, colors=colors)
    looks = {(tuple(c.get_facecolor()[0]), c.get_paths()[0].vertices.tobytes()) for c in fig.axes[0].collections}
    drawing.close(fig)
    assert len(looks) == len(names)


def test_a_rate_above_the_measured_ceilings_is_flagged_not_printed_as_a_rate():
    """2.5x the measured copy bandwidth is no DRAM rate (a working set left in cache, or a count
    too large): the cell is marked and a note names the case and variant; a run within its
    ceilings gets neither."""
    doc = roofline_doc()
    doc["cases"][2]["variants"]["triton"]["stats"]["median"] = 4e9 / 10000e9  # 10,000 GB/s, the ceiling 4,000
    found = run_readings(doc)
    (note,) = [n for n in roofline.notes(found) if n.startswith("Above the measured ceilings")]
    assert "#3 triton (of copy bandwidth 250%)" in note
    row = next(
        r
        for c in roofline.case_tables(found)["cases"]
        if c["number"] == 3
        for r in c["rows"]
        if r["variant"] == "triton"
    )
    assert "250.0% (!)" in row["cells"]
    assert not [n for n in roofline.notes(run_readings(roofline_doc())) if "Above the measured" in n]


def test_a_gpu_peak_measured_at_a_small_matmul_says_its_shares_read_high(tmp_path):
    """Issue 33: a quick calibration at n=4096 leaves a large GPU well under its peak, so every share
    of that peak reads high. A run that recorded such an n says so; one at the size gpubench now
    measures (gpubench.measure.env.MATMUL_N_GPU) says nothing, and the header shows the n either way."""
    from gpubench.measure import env

    assert roofline.GPU_PEAK_MATMUL_N == env.MATMUL_N_GPU
    old = roofline_doc({**CEILINGS, "matmul": {**CEILINGS["matmul"], "n": 4096}})
    (note,) = [n for n in roofline.notes(run_readings(old)) if "n=4096" in n]
    assert note.startswith("The matmul peak of NVIDIA H200 was measured at n=4096") and "reads high" in note
    assert not [n for n in roofline.notes(run_readings(roofline_doc())) if "measured at n=" in n]
    assert "matmul (n=8192)" in render(tmp_path, roofline_doc())


# -- ceilings measured on a busy machine (issue 34, point 2) ---------------------------------------
def test_a_calibration_records_the_load_it_ran_under(monkeypatch):
    """The calibration keeps the machine's load (1-minute average before and after, the higher of
    the two as load_1m) and its CPUs; the environment record keeps the load at capture. Faked
    load: 9.5 then 11.25 on 2 cores."""
    import torch

    from gpubench.measure import env, machine_load

    loads = iter([machine_load.Load(9.5, 2), machine_load.Load(11.25, 2)])
    monkeypatch.setattr(machine_load, "read", lambda: next(loads))
    ceilings = env.calibrate(torch.device("cpu"), quick=True)
    assert ceilings["load"] == {"load_1m": 11.25, "cpus": 2, "load_1m_before": 9.5, "load_1m_after": 11.25}
    monkeypatch.setattr(machine_load, "read", lambda: machine_load.Load(3.0, 2))
    assert env.capture_env(torch.device("cpu"))["cpu"]["load_1m"] == 3.0
    assert env.calibration_load(None, None) is None


def test_a_variant_above_a_roof_measured_under_load_is_said_to_be_the_loads_not_the_caches():
    """Issue 34: a CPU's ceilings measured at load 8-13 made variants read 237-329% of the roof,
    with a note blaming caches. Under a recorded load above the core count the note says the roof
    was measured under load (naming it and the peak), never caches; the same readings under a
    calibration on a quiet machine keep the cache note; a roof measured under load says so even
    when nothing exceeds it. A GPU's ceilings are not the host CPUs' to blame."""
    cpu = "CPU: test (2 logical cores)"
    busy = {**CEILINGS, "load": {"load_1m": 11.0, "cpus": 2, "load_1m_before": 10.2, "load_1m_after": 11.0}}
    doc = roofline_doc(busy, device_type="cpu")
    doc["cases"][2]["variants"]["triton"]["stats"]["median"] = 4e9 / 10000e9  # 250% of the copy bandwidth
    notes = roofline.notes(run_readings(doc))
    (note,) = [n for n in notes if n.startswith("Above the measured ceilings")]
    assert "#3 triton (of copy bandwidth 250%)" in note
    assert (
        f"measured while the machine was under load ({cpu} at load 11.0 on 2 cores, matmul peak 800 TFLOP/s)" in note
        and "cache" not in note
    )
    assert any(n.startswith(f"The ceilings of {cpu} were measured under load 11.0 on 2 cores") for n in notes)
    assert not [n for n in roofline.notes(run_readings(roofline_doc(busy, device_type="cpu"))) if n.startswith("Above")]

    for quiet in (
        roofline_doc({**CEILINGS, "load": {"load_1m": 1.5, "cpus": 2}}, device_type="cpu"),
        roofline_doc(busy),
    ):  # a GPU's roof, the host busy
        quiet["cases"][2]["variants"]["triton"]["stats"]["median"] = 4e9 / 10000e9
        notes = roofline.notes(run_readings(quiet))
        (note,) = [n for n in notes if n.startswith("Above the measured ceilings")]
        assert "stayed in cache" in note and "under load" not in note
        assert not [n for n in notes if "measured under load" in n]
