"""Published claims checked on the run's device (gpubench.records.claims, reports/claims.py): each verdict
follows from the measured CI and the claimed band and nothing else (hand-made cases, no timing),
a case that did not measure what the claim did is never given a verdict, device-independent
claims get one on a CPU, every report and summary.md carry the table (after the summary, the claims
of techniques the run left out folded into one line), every built-in technique declares a claim,
and a technique without claims still works."""

from __future__ import annotations

import copy

import pytest
from markupsafe import escape
from test_report import make_run

from gpubench import techniques
from gpubench.contract import Claim as ContractClaim
from gpubench.contract import Technique
from gpubench.records.claims import Claim, read_case, verdict
from gpubench.reports import html
from gpubench.reports.claims import TITLE, claim_rows, not_in_run_line

H100 = {"key": "cuda:0", "type": "cuda", "index": 0, "label": "NVIDIA H100 80GB HBM3"}
CPU = {"key": "cpu", "type": "cpu", "index": None, "label": "CPU: AMD EPYC (2 logical cores)"}
STEP = Claim(
    "Lab (2026)",
    "https://example.org/paper",
    text="+14.3% per step",
    figure=(1.143, 1.143),
    when={"layers": (">=", 4)},
    device_reason="the win is host syncs",
)


def speedup_case(
    ratio: float,
    low: float,
    high: float,
    device: dict = H100,
    layers: int = 12,
    status: str = "passed",
    technique: str = "packed_metadata",
) -> dict:
    """A timed case: baseline and optimized variants and the optimized speedup with its CI."""
    stats = {"median": 0.01, "ci_low": 0.0099, "ci_high": 0.0101, "n": 10}
    return {
        "id": f"{technique}[layers={layers}]",
        "technique": technique,
        "status": status,
        "params": {"layers": layers, "model": "100m"},
        "device": device,
        "seed": 0,
        "source": "",
        "variants": {
            "per_layer": {"role": "baseline", "status": "ok", "stats": stats, "samples_s": [0.01] * 10, "metrics": {}},
            "cached": {
                "role": "optimized",
                "status": "ok",
                "stats": stats,
                "samples_s": [0.01] * 10,
                "metrics": {"tflops": 500.0},
            },
        },
        "speedups": {"cached": {"ratio": ratio, "ci_low": low, "ci_high": high}},
    }


def utilization_case(base: float, paged: float, device: dict = CPU, max_len: int = 1024) -> dict:
    return {
        "id": f"kv_cache[max_len={max_len}]",
        "technique": "kv_cache",
        "status": "passed",
        "device": device,
        "params": {"block_size": 16, "max_len": max_len},
        "seed": 0,
        "source": "",
        "variants": {
            "contiguous": {"role": "baseline", "status": "ok", "metrics": {"utilization": base}},
            "paged": {"role": "optimized", "status": "ok", "metrics": {"utilization": paged}},
        },
        "speedups": {},
    }


# -- the verdict rule --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "ratio, low, high, expected",
    [
        (1.15, 1.12, 1.18, "holds"),  # the median within 1.143 +- 5%
        (1.00, 0.97, 1.03, "falls short"),  # the CI's upper end below the band
        (1.50, 1.40, 1.60, "exceeds"),  # the CI's lower end above the band
        (1.00, 0.60, 1.90, "inconclusive"),  # a CI wider than the band on both sides supports nothing
        (1.05, 1.00, 1.10, "inconclusive"),  # the CI reaches the band, the median does not
    ],
)
def test_each_verdict_follows_from_the_ci_and_the_claimed_band(ratio, low, high, expected):
    reading = read_case(STEP, speedup_case(ratio, low, high))
    assert reading.verdict == expected, reading
    assert (reading.low, reading.value, reading.high) == (low, ratio, high)


def test_a_case_that_did_not_measure_what_the_claim_did_is_not_comparable_with_the_reason():
    on_cpu = read_case(STEP, speedup_case(1.15, 1.12, 1.18, device=CPU))
    assert on_cpu.verdict == "not comparable" and on_cpu.reason == "measured on a CPU: the win is host syncs"
    small = read_case(STEP, speedup_case(1.15, 1.12, 1.18, layers=2))
    assert small.verdict == "not comparable" and "other sizes: layers=2" in small.reason
    tiny_model = dict(speedup_case(1.2, 1.1, 1.3), params={"model": "tiny"})
    tiny = read_case(techniques.get("packed_metadata").claims[0], tiny_model)
    assert tiny.reason == "other model: model='tiny' (the claim: model 100m or 1b)"
    a100 = Claim("Lab", "u", text="t", figure=(156.0, 228.0), unit="tflops", reads="tflops", gpus=("A100",))
    other_gpu = read_case(a100, speedup_case(1.0, 1.0, 1.0))
    assert other_gpu.verdict == "not comparable" and "other GPU: NVIDIA H100" in other_gpu.reason
    failed = read_case(STEP, speedup_case(1.15, 1.12, 1.18, status="failed"))
    assert failed.verdict == "not comparable" and failed.value is None  # never a figure from a failed case
    never = Claim("Lab", "u", text="t", figure=(2.0, 4.0), not_measured="this pair times a kernel")
    assert read_case(never, speedup_case(3.0, 2.9, 3.1)).reason == "this pair times a kernel"


def test_a_bookkeeping_bound_gets_a_real_verdict_on_a_cpu():
    waste = techniques.get("kv_cache").claims[0]  # vLLM: under 4% of KV memory wasted
    assert waste.device_type == "" and waste.bound == "at_most"
    holds = read_case(waste, utilization_case(0.5, 0.98))
    assert holds.verdict == "holds" and holds.value == pytest.approx(0.02) and holds.low == holds.high
    assert read_case(waste, utilization_case(0.5, 0.90)).verdict == "falls short"
    assert read_case(waste, utilization_case(0.5, 0.98, max_len=64)).verdict == "not comparable"
    assert verdict(0.03, 0.04, 0.05, (0.04, 0.04), "at_most") == ("inconclusive", "the CI straddles the bound")


def test_a_throughput_metric_carries_the_timing_ci_and_a_predicted_figure_comes_from_the_case():
    peak = Claim("Lab", "u", text="t", figure=(740.0, 740.0), unit="tflops", reads="tflops", per_time=True)
    reading = read_case(peak, speedup_case(1.0, 1.0, 1.0))  # 500 TFLOP/s at 10 ms, time CI 9.9-10.1 ms
    assert reading.verdict == "falls short"
    assert reading.low == pytest.approx(500 * 0.01 / 0.0101) and reading.high == pytest.approx(500 * 0.01 / 0.0099)
    formula = Claim("Lab", "u", text="t", figure=None, figure_metric="predicted_speedup", tolerance=0.1)
    case = speedup_case(1.5, 1.4, 1.6)
    case["variants"]["cached"]["metrics"]["predicted_speedup"] = 1.55
    assert read_case(formula, case).verdict == "holds" and read_case(formula, case).claimed == (1.55, 1.55)
    del case["variants"]["cached"]["metrics"]["predicted_speedup"]
    assert read_case(formula, case).verdict == "not comparable"


def test_a_malformed_claim_is_refused_when_declared():
    for bad in (
        {"unit": "furlongs"},
        {"bound": "around"},
        {"figure": (4.0, 2.0)},
        {"figure_metric": "x"},
        {"when": {"n": ("~", 1)}},
    ):
        with pytest.raises(ValueError):
            Claim("Lab", "u", **{"text": "t", "figure": (1.0, 1.0), **bad})


# -- techniques and the contract ---------------------------------------------------------------
def test_every_built_in_technique_declares_a_claim_with_its_source():
    builtin = {n: t for n, t in techniques.all_techniques().items() if t.source.startswith("gpubench.techniques.")}
    assert builtin  # the registry loaded, or the loop below proves nothing
    for name, tech in builtin.items():
        assert tech.claims, name
        for claim in tech.claims:
            assert claim.source and claim.url.startswith("https://") and claim.text and claim.conditions, (name, claim)


def test_a_technique_without_claims_still_works_and_claim_is_part_of_the_contract():
    plain = Technique("no_claims", summary="s", shape="kernel", params=[])
    assert plain.claims == () and ContractClaim is Claim
    with pytest.raises(TypeError):
        Technique("t", summary="s", shape="kernel", params=[], claims=["+15%"])
    plain.variant("a", role="baseline")(lambda w: 0)
    plain.variant("b", role="optimized")(lambda w: 0)
    plain.check(lambda r, o: None)
    plain.build(lambda p, d, s: None)
    techniques.register(plain, "tests")
    try:
        rows = claim_rows(
            {"cases": [dict(speedup_case(1.2, 1.1, 1.3), technique="no_claims", id="no_claims[]")]}, techniques
        )
    finally:
        techniques.unregister("no_claims")
    assert all(r["technique"] != "no_claims" for r in rows)


# -- the table in the report -------------------------------------------------------------------
def results_doc(cases: list[dict]) -> dict:
    return {
        "kind": "gpubench.results",
        "schema_version": 2,
        "run_id": "claims-test",
        "status": "complete",
        "device": "cuda:0",
        "device_label": "NVIDIA H100 80GB HBM3",
        "scenario": {"name": "claims-test"},
        "started_at": "2026-12-04T10:00:00+00:00",
        "finished_at": "2026-12-04T10:01:00+00:00",
        "cases": cases,
        "summary": {"cases": len(cases), "passed": len(cases), "failed": 0},
        "telemetry": {"status": "unavailable", "reason": "hand-made"},
        "env": {},
    }


def test_every_report_and_summary_md_carry_the_claims_table(tmp_path):
    doc = results_doc([speedup_case(1.15, 1.12, 1.18), utilization_case(0.5, 0.98, device=H100)])
    written = html.write_report(make_run(tmp_path / "run", doc), registry=techniques)
    page, md = written.html.read_text(encoding="utf-8"), written.markdown.read_text(encoding="utf-8")
    rows = {(r["technique"], r["claim"]): r for r in claim_rows(doc, techniques)}
    step = rows["packed_metadata", techniques.get("packed_metadata").claims[0].text]
    assert step["verdict"] == "holds" and step["measured"] == "1.15x [1.12x, 1.18x]"
    waste = rows["kv_cache", "under 4% of KV memory wasted with paged blocks"]
    assert waste["verdict"] == "holds" and waste["measured"].startswith("2% (exact)")
    assert rows["moe_grouping", techniques.get("moe_grouping").claims[0].text]["reason"] == "not in this run"
    assert TITLE in page and 'id="claims-table"' in page and f"**{TITLE}**" in md
    for row in rows.values():  # every declared claim, its source, its verdict
        assert str(escape(row["claim"])) in page and str(escape(row["source"])) in page
    assert "| packed_metadata | +14.3% per training step (read as 1.143x) |" in md
    assert "| 1.143x | 1.15x [1.12x, 1.18x] | **holds** |" in md
    # The claims of techniques the run left out: one line (the rows themselves in a closed <details>)
    left_out = [r for r in rows.values() if r["reason"] == "not in this run"]
    line = not_in_run_line(list(rows.values()))
    assert len(left_out) >= 5 and line.startswith(f"{len(left_out)} published claims not judged by this run")
    assert "moe_grouping" in line and "packed_metadata" not in line and "kv_cache" not in line
    assert "not in this run" not in md and f"_{line}._" in md
    table = page.split('<table id="claims-table">')[1].split("</table>")[0]
    assert "not in this run" not in table and table.count("<tr>") == 1 + len(rows) - len(left_out)
    assert f'<details id="claims-not-in-run">\n    <summary>{escape(line)}</summary>' in page
    assert md.index("| # | technique |") < md.index(TITLE) and page.index('id="summary"') < page.index('id="claims"')
    verdicts = [r["verdict"] for r in claim_rows(doc, techniques)]
    assert verdicts[:2] == ["holds", "holds"] and set(verdicts[2:]) == {"not comparable"}  # judged first
    assert 'href="http' not in page  # sources are shown, not linked: the report fetches nothing


def test_a_run_with_none_of_the_techniques_lists_every_claim_as_not_in_this_run(tmp_path):
    doc = results_doc([])
    written = html.write_report(make_run(tmp_path / "run", copy.deepcopy(doc)), registry=techniques)
    md, page = written.markdown.read_text(encoding="utf-8"), written.html.read_text(encoding="utf-8")
    rows = claim_rows(doc, techniques)
    declared = sum(len(t.claims) for t in techniques.all_techniques().values())
    assert len(rows) >= declared and {r["verdict"] for r in rows} == {"not comparable"}
    assert {r["reason"] for r in rows} == {"not in this run"}
    assert any(r["technique"] == "combined_training" and "25%" in r["claim"] for r in rows)
    assert f"_{len(rows)} published claims not judged by this run (their techniques did not run): " in md
    assert "| technique | claim |" not in md  # no table of rows that say nothing
    assert 'id="claims-table"' not in page and f"<summary>{len(rows)} published claims not judged" in page


def test_gpu_quick_on_an_h200_reaches_every_claim_a_gpu_can_check():
    """The claims' size thresholds against the scenario made for them: each claim has a comparable
    gpu-quick case on an H200, except FA2's (an A100's figure), vLLM's prior-systems figure (a real
    trace) and paged_attention's (a kernel cannot show serving throughput)."""
    from gpubench.run import scenario

    h200 = dict(H100, label="NVIDIA H200")
    comparable: dict[tuple[str, str], bool] = {}
    for c in scenario.load("gpu-quick").cases():
        case = dict(speedup_case(1.2, 1.1, 1.3, device=h200), technique=c.technique, params=c.params)
        case["variants"]["cached"]["metrics"].update(predicted_speedup=1.5, utilization=0.97, kv_utilization=0.97)
        for claim in techniques.get(c.technique).claims:
            key = (c.technique, claim.text)
            comparable[key] = comparable.get(key, False) or read_case(claim, case).comparable
    unreachable = {key for key, ok in comparable.items() if not ok}
    assert {t for t, _ in unreachable} == {"flash_attention", "paged_kv_serving", "paged_attention"}, unreachable
    assert len(unreachable) == 3 and len(comparable) >= 12


# -- too few samples (issue 34) ------------------------------------------------------------------------
def _one_sample(case: dict) -> dict:
    """The case as an older gpubench wrote it from one timed call a variant: an interval of no width."""
    for variant in case["variants"].values():
        variant["samples_s"], variant["stats"] = [0.01], {"median": 0.01, "ci_low": 0.01, "ci_high": 0.01, "n": 1}
    case["speedups"]["cached"] = {"ratio": 1.15, "ci_low": 1.15, "ci_high": 1.15}
    return case


def test_a_claim_is_never_verified_on_a_speedup_from_one_sample():
    """1.15x from one call a variant sits inside the claim's band: before issue 34 it 'held'."""
    reading = read_case(STEP, _one_sample(speedup_case(1.15, 1.15, 1.15)))
    assert (reading.verdict, reading.reason) == ("unverified", "too few samples (n=1; a CI needs 5)")
    assert (reading.value, reading.low, reading.high, reading.n) == (1.15, None, None, 1)


def test_the_claims_table_says_unverified_with_the_count():
    doc = results_doc([_one_sample(speedup_case(1.15, 1.15, 1.15))])
    row = next(r for r in claim_rows(doc, techniques) if r["technique"] == "packed_metadata" and r["cases"])
    assert row["verdict"] == "unverified" and row["measured"] == "1.15x (n=1)"
    assert row["reason"].startswith("too few samples (n=1") and row["verdict_class"] == "not-comparable"


def test_a_figure_carried_from_a_time_of_too_few_samples_is_unverified():
    tflops = Claim("Lab", "u", text="t", figure=(500.0, 500.0), unit="tflops", reads="tflops", per_time=True)
    case = speedup_case(1.0, 1.0, 1.0)
    case["variants"]["cached"]["stats"] = {"median": 0.01, "ci_low": None, "ci_high": None, "n": 3}
    reading = read_case(tflops, case)
    assert reading.verdict == "unverified" and reading.n == 3 and reading.value == 500.0


def test_a_per_call_figure_recorded_by_one_timed_call_verifies_no_claim():
    """Review of issue 34: a figure each call records, read from one call, was taken as exact (a CI
    of no width) and judged; one call cannot say whether it varies, so the claim is unverified."""
    waste = Claim(
        "Lab", "u", text="t", figure=(0.204, 0.382), unit="fraction", reads="kv_utilization", variant="optimized"
    )
    case = speedup_case(1.0, 1.0, 1.0)
    case["variants"]["cached"]["metrics"]["kv_utilization"] = 0.30
    case["variants"]["cached"]["recorded"] = [{"kv_utilization": 0.30}]
    reading = read_case(waste, case)
    assert reading.verdict == "unverified" and reading.n == 1, reading
    case["variants"]["cached"]["recorded"] = [{"kv_utilization": 0.30}] * 6  # the same every call: exact
    assert read_case(waste, case).verdict != "unverified"
