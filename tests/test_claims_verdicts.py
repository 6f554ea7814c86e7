"""Every branch of the claims verdict (gpubench.records.claims, reports/claims.py) reached by a test that
fails when the branch is wrong: each (verdict, reason) that ``verdict`` can return, at and just
past every edge of the band widened by its tolerance, for the three bounds; every way a case's
comparable figure is read (a speedup with or without a CI, a metric exact, per call or per time,
complemented with its CI's ends swapped); every reason a case is not comparable; and how the
report's row folds several cases (one verdict, mixed, cases left out, a predicted figure).
The list of verdict branches is read from the source: a new branch without a row here fails."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
from test_claims import CPU, STEP, speedup_case, utilization_case

from gpubench import techniques
from gpubench.records import claims, stats
from gpubench.records.claims import Claim, Reading, read_case, verdict
from gpubench.reports import claims as report_claims

BAND = (1.0, 2.0)  # widened by 10%: 0.9 to 2.2
TOL = 0.1

# (bound, low, value, high) -> (verdict, reason): every branch, each at an edge where a flipped
# comparison (< for <=), a forgotten tolerance or a wrong order of the tests changes the answer.
CASES = [
    # value: a band claim
    (("value", 0.5, 0.8, 0.899), ("falls short", "the CI's upper end is below the claim")),
    (("value", 0.5, 0.8, 0.9), ("inconclusive", "the CI reaches the claim but the median does not")),
    (("value", 2.201, 2.5, 3.0), ("exceeds", "the CI's lower end is above the claim")),
    (("value", 2.2, 2.5, 3.0), ("inconclusive", "the CI reaches the claim but the median does not")),
    # a CI wider than the band on both sides supports nothing, even with the median inside it
    (("value", 0.5, 1.5, 3.0), ("inconclusive", "the CI is wider than the claim's band on both sides")),
    (("value", 0.5, 2.5, 3.0), ("inconclusive", "the CI is wider than the claim's band on both sides")),
    (("value", 0.9, 1.5, 3.0), ("holds", "the median is within the claim")),  # only one side past: not wider
    (("value", 0.5, 1.5, 2.2), ("holds", "the median is within the claim")),
    (("value", 0.85, 0.9, 1.2), ("holds", "the median is within the claim")),  # the median at the widened edge
    (("value", 2.0, 2.2, 2.3), ("holds", "the median is within the claim")),
    (("value", 0.85, 0.899, 1.2), ("inconclusive", "the CI reaches the claim but the median does not")),
    (("value", 1.2, 1.5, 1.8), ("holds", "the median is within the claim")),
    (("value", 1.5, 1.5, 1.5), ("holds", "the median is within the claim")),  # exact
    # at_most: a bound (vLLM's waste under 4%): the whole CI within it, or beyond it
    (("at_most", 1.0, 2.0, 2.2), ("holds", "the whole CI is within the bound")),
    (("at_most", 1.0, 2.0, 2.201), ("inconclusive", "the CI straddles the bound")),
    (("at_most", 2.2, 2.3, 2.4), ("inconclusive", "the CI straddles the bound")),
    (("at_most", 2.201, 2.3, 2.4), ("falls short", "the whole CI is beyond the bound")),
    (("at_most", 0.0, 0.1, 0.2), ("holds", "the whole CI is within the bound")),  # far below: no "exceeds"
    # at_least: the whole CI at or above the band's low end, or below it
    (("at_least", 0.9, 1.0, 1.5), ("holds", "the whole CI is within the bound")),
    (("at_least", 0.899, 1.0, 1.5), ("inconclusive", "the CI straddles the bound")),
    (("at_least", 0.5, 0.8, 0.9), ("inconclusive", "the CI straddles the bound")),
    (("at_least", 0.5, 0.8, 0.899), ("falls short", "the whole CI is below the bound")),
    (("at_least", 5.0, 6.0, 7.0), ("holds", "the whole CI is within the bound")),  # far above: no "exceeds"
]


@pytest.mark.parametrize("args, expected", CASES, ids=[f"{a[0]}-{a[1]}-{a[2]}-{a[3]}" for a, _ in CASES])
def test_each_verdict_branch_at_the_edges_of_the_widened_band(args, expected):
    bound, low, value, high = args
    assert verdict(low, value, high, BAND, bound, TOL) == expected


def _returned_pairs(fn) -> set[tuple[str, str]]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return {
        (node.value.elts[0].value, node.value.elts[1].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple)
    }


def test_every_verdict_the_rule_can_return_is_tested_above():
    """Read from the source: each (verdict, reason) ``verdict`` returns is a row of CASES, so a
    branch added without a test fails here; every verdict is one the report knows."""
    returned = _returned_pairs(verdict)
    assert len(returned) >= 9
    assert returned == {expected for _, expected in CASES}
    assert {v for v, _ in returned} | {"not comparable", "unverified"} == set(claims.VERDICTS)  # read_case's own
    assert set(claims.VERDICTS) <= set(report_claims.VERDICT_CLASS)


def test_a_zero_tolerance_judges_against_the_band_itself():
    assert verdict(1.0, 1.0, 1.0, (1.0, 1.0), "value", 0.0) == ("holds", "the median is within the claim")
    assert (
        verdict(0.99, 1.0, 1.01, (1.0, 1.0), "value", 0.0)[1] == "the CI is wider than the claim's band on both sides"
    )
    assert verdict(1.0, 1.001, 1.01, (1.0, 1.0), "value", 0.0)[0] == "inconclusive"
    assert verdict(0.03, 0.04, 0.04, (0.04, 0.04), "at_most", 0.0)[0] == "holds"
    assert verdict(0.03, 0.04, 0.0401, (0.04, 0.04), "at_most", 0.0)[0] == "inconclusive"


# -- the comparable figure ---------------------------------------------------------------------
WASTE = claims.vllm_kv_waste("utilization")  # at_most 4% (4.2% with its tolerance), 1 - utilization


def _per_call(case: dict, values: list[float]) -> dict:
    case["variants"]["paged"]["recorded"] = [{"utilization": v} for v in values]
    return case


def test_a_complemented_figure_swaps_its_ci_ends():
    """Waste = 1 - utilization: the CI's low end comes from utilization's high end. Utilizations
    measured per call 0.95 to 0.99 give waste 1% to 5%, whose CI straddles 4.2%: inconclusive; with
    the ends not swapped the CI would read [5%, 1%] and, its 'high' end within the bound, hold."""
    calls = [0.95, 0.96, 0.97, 0.98, 0.99]
    ci = stats.summarize(calls)
    reading = read_case(WASTE, _per_call(utilization_case(0.5, 0.97), calls))
    assert reading.low < reading.value < reading.high, reading
    assert reading.low == pytest.approx(1 - ci.ci_high) and reading.high == pytest.approx(1 - ci.ci_low)
    assert reading.value == pytest.approx(0.03) and reading.low < 0.042 < reading.high
    assert (reading.verdict, reading.reason) == ("inconclusive", "the CI straddles the bound")
    calls = [0.88, 0.89, 0.9, 0.91, 0.92]
    beyond = read_case(WASTE, _per_call(utilization_case(0.5, 0.9), calls))
    assert beyond.verdict == "falls short" and beyond.low == pytest.approx(1 - stats.summarize(calls).ci_high)


def test_a_complemented_figure_carried_from_the_timing_ci_swaps_its_ends_too():
    fraction = Claim(
        "Lab",
        "u",
        text="t",
        figure=(0.4, 0.4),
        unit="fraction",
        reads="tflops",
        per_time=True,
        complement=True,
        tolerance=0.0,
    )
    reading = read_case(fraction, speedup_case(1.0, 1.0, 1.0))  # 500 "tflops" at 10 ms, time CI 9.9-10.1 ms
    assert reading.low == pytest.approx(1 - 500 * 0.01 / 0.0099)
    assert reading.high == pytest.approx(1 - 500 * 0.01 / 0.0101) and reading.low < reading.value < reading.high


def test_each_way_of_reading_the_figure():
    # a speedup with its bootstrap CI; without one, unverified (never judged as exact: issue 34); none
    # recorded: not comparable
    assert (read_case(STEP, speedup_case(1.15, 1.1, 1.2)).low, read_case(STEP, speedup_case(1.15, 1.1, 1.2)).high) == (
        1.1,
        1.2,
    )
    no_ci = speedup_case(1.15, 1.1, 1.2)
    no_ci["speedups"]["cached"] = {"ratio": 1.15}
    unjudged = read_case(STEP, no_ci)
    assert (unjudged.low, unjudged.value, unjudged.high, unjudged.verdict) == (None, 1.15, None, "unverified")
    assert unjudged.reason == "no CI recorded"
    no_ratio = speedup_case(1.15, 1.1, 1.2)
    no_ratio["speedups"] = {}
    assert read_case(STEP, no_ratio).reason == "no speedup recorded"
    # a metric: exact (bookkeeping), per call (bootstrap CI over the calls), missing
    metric = Claim("Lab", "u", text="t", figure=(500.0, 500.0), unit="tflops", reads="tflops", device_type="")
    exact = read_case(metric, speedup_case(1.0, 1.0, 1.0))
    assert (exact.low, exact.value, exact.high, exact.verdict) == (500.0, 500.0, 500.0, "holds")
    calls = speedup_case(1.0, 1.0, 1.0)
    calls["variants"]["cached"]["recorded"] = [{"tflops": v} for v in (400.0, 450.0, 500.0, 550.0, 600.0)]
    spread = read_case(metric, calls)
    assert spread.low < 500.0 < spread.high and spread.value == 500.0  # the metric, its CI from the calls
    one_call = speedup_case(1.0, 1.0, 1.0)
    one_call["variants"]["cached"]["recorded"] = [{"tflops": 400.0}]  # one call is no CI, and no verdict
    assert (read_case(metric, one_call).low, read_case(metric, one_call).high, read_case(metric, one_call).verdict) == (
        None,
        None,
        "unverified",
    )
    missing = Claim("Lab", "u", text="t", figure=(1.0, 1.0), reads="nothing", device_type="")
    assert read_case(missing, speedup_case(1.0, 1.0, 1.0)).reason == "optimized recorded no nothing"
    baseline = Claim("Lab", "u", text="t", figure=(1.0, 1.0), reads="tflops", variant="baseline", device_type="")
    assert read_case(baseline, speedup_case(1.0, 1.0, 1.0)).reason == "baseline recorded no tflops"
    # per time without the timing CI to carry
    timed = Claim("Lab", "u", text="t", figure=(500.0, 500.0), unit="tflops", reads="tflops", per_time=True)
    no_stats = speedup_case(1.0, 1.0, 1.0)
    no_stats["variants"]["cached"]["stats"] = {"median": 0.01}
    assert read_case(timed, no_stats).reason == "optimized has no timing CI to carry to tflops"


def test_every_reason_a_case_is_not_comparable():
    assert read_case(STEP, speedup_case(1.15, 1.1, 1.2, status="interrupted")).reason == "the case interrupted"
    unknown = dict(speedup_case(1.15, 1.1, 1.2), device={})
    assert read_case(STEP, unknown).reason == "measured on an unknown device: the win is host syncs"
    assert read_case(STEP, unknown, run_device="cuda:0").verdict == "holds"  # the run's device names it
    mps = read_case(
        Claim("Lab", "u", text="t", figure=(1.0, 1.0)), dict(speedup_case(1.0, 1.0, 1.0), device={"type": "mps"})
    )
    assert mps.reason == "measured on mps"  # no device_reason: the kind alone
    any_device = Claim("Lab", "u", text="t", figure=(1.0, 1.0), device_type="")
    assert read_case(any_device, speedup_case(1.0, 1.0, 1.0, device=CPU)).verdict == "holds"
    case = speedup_case(1.0, 1.0, 1.0, layers=12)
    for op, ok, bad in ((">=", 12, 13), ("<=", 12, 11), ("==", 12, 11), ("!=", 11, 12), ("in", (12, 16), (11,))):
        assert read_case(Claim("Lab", "u", text="t", figure=(1.0, 1.0), when={"layers": (op, ok)}), case).comparable, op
        assert not read_case(
            Claim("Lab", "u", text="t", figure=(1.0, 1.0), when={"layers": (op, bad)}), case
        ).comparable
    shown = read_case(
        Claim("Lab", "u", text="t", figure=(1.0, 1.0), when={"layers": ("in", (4, 8))}), speedup_case(1.0, 1.0, 1.0)
    )
    assert shown.reason == "other sizes: layers=12 (the claim: layers 4 or 8)"
    typed = read_case(
        Claim("Lab", "u", text="t", figure=(1.0, 1.0), when={"model": (">=", 3)}), speedup_case(1.0, 1.0, 1.0)
    )  # a str against an int: not comparable, not a TypeError
    assert typed.reason == "other model: model='100m' (the claim: model >= 3)"
    absent = read_case(
        Claim("Lab", "u", text="t", figure=(1.0, 1.0), when={"rows": (">=", 1, "why")}), speedup_case(1.0, 1.0, 1.0)
    )
    assert absent.reason == "other sizes: rows=None (why)"
    unset = read_case(
        Claim("Lab", "u", text="t", figure=(1.0, 1.0), when={"rows": ("!=", 0)}), speedup_case(1.0, 1.0, 1.0)
    )  # a param the case lacks is never "!= 0"
    assert unset.reason == "other sizes: rows=None (the claim: rows != 0)"


# -- the report's row over several cases -------------------------------------------------------
def _row(claim: Claim, readings: list[Reading] | None) -> dict:
    return report_claims._row("t", claim, readings)


def test_a_row_folds_its_cases_one_verdict_mixed_left_out_and_predicted():
    band = Claim("Lab", "u", text="t", figure=(1.0, 1.0), caveat="a small model")
    one = _row(band, [Reading("a", "holds", "the median is within the claim", 1.02, 1.0, 1.04, (1.0, 1.0))])
    assert (one["verdict"], one["measured"], one["cases"]) == ("holds", "1.02x [1x, 1.04x]", 1)
    assert one["reason"] == "the median is within the claim. Still differs: a small model"
    two = _row(
        band,
        [
            Reading("a", "holds", "the median is within the claim", 1.03, 1.0, 1.04),
            Reading("b", "holds", "the median is within the claim", 0.98, 0.98, 0.98),
        ],
    )
    assert two["measured"] == "0.98x (no CI) to 1.03x [1x, 1.04x] over 2 cases" and two["verdict"] == "holds"
    mixed = _row(
        band,
        [
            Reading("a", "holds", "x", 1.0),
            Reading("b", "falls short", "y", 0.5),
            Reading("c", "falls short", "y", 0.6),
            Reading("d", "not comparable", "measured on a CPU"),
        ],
    )
    assert mixed["verdict"] == "mixed" and mixed["cases"] == 3
    assert mixed["reason"].startswith(
        "falls short in 2, holds in 1 of 3 cases; 1 case not comparable (measured on a CPU)"
    )
    none = _row(
        band,
        [
            Reading("a", "not comparable", "other sizes: n=1 (why)"),
            Reading("b", "not comparable", "other sizes: n=2 (why)"),
        ],
    )
    assert (none["verdict"], none["reason"], none["measured"]) == ("not comparable", "other sizes: n=1, n=2 (why)", "-")
    assert _row(band, None)["reason"] == report_claims.NOT_IN_RUN
    waste = _row(WASTE, [Reading("a", "holds", "r", 0.02, 0.02, 0.02)])
    assert waste["measured"] == "2% (exact)"
    predicted = Claim("Lab", "u", text="t", figure=None, figure_metric="predicted_speedup")
    row = _row(predicted, [Reading("a", "holds", "r", 1.5, 1.4, 1.6, (1.55, 1.55))])
    assert row["measured"] == "1.5x [1.4x, 1.6x] vs predicted 1.55x"


def test_rows_with_a_verdict_come_first_and_each_verdict_has_its_colour():
    doc = {"cases": [speedup_case(1.15, 1.12, 1.18), speedup_case(1.0, 0.97, 1.03, device=CPU)], "device": "cuda:0"}
    rows = report_claims.claim_rows(doc, techniques)
    order = [(r["verdict"] == "not comparable") + (r["reason"] == report_claims.NOT_IN_RUN) for r in rows]
    assert order == sorted(order) and rows[0]["verdict"] == "holds" and rows[0]["verdict_class"] == "pass"
    assert report_claims.VERDICT_CLASS["falls short"] == "fail" and report_claims.VERDICT_CLASS["exceeds"] == "improved"
    assert report_claims.VERDICT_CLASS["inconclusive"] == report_claims.VERDICT_CLASS["not comparable"]
    assert {r["verdict_class"] for r in rows if r["verdict"] == "not comparable"} == {"not-comparable"}


def test_more_reasons_than_shown_are_counted():
    assert report_claims._distinct(["x (1)", "x (2)", "x (3)", "x (4)", "x (2)"]) == "x (1); x (2) (and 2 more reasons)"
    assert report_claims._distinct(["a", "b", "a"]) == "a; b"


@pytest.mark.parametrize("bound", ["value", "at_most", "at_least"])
def test_a_ci_that_is_one_point_at_the_widened_edge_is_inside(bound):
    edge = {"value": 2.2, "at_most": 2.2, "at_least": 0.9}[bound]
    assert verdict(edge, edge, edge, BAND, bound, TOL)[0] == "holds"


def test_a_why_names_the_cases_that_did_not_pass_and_how_many_of_all():
    """9 of 10 cases passed: the why says "1 of 10 cases failed: #4 (...)" beside the verdict of
    the nine, never "the case failed" as if the claim's only case had; with none comparable, the
    count and the names come first; a claim of one case says "its case failed"."""
    band = Claim("Lab", "u", text="t", figure=(1.0, 1.0))
    failed = {"d": ("failed", "#4 (layers=7)"), "e": ("interrupted", "#5 (layers=8)")}
    nine = [Reading(k, "holds", "the median is within the claim", 1.0, 1.0, 1.0) for k in "abcfghij"]
    row = report_claims._row(
        "t",
        band,
        nine
        + [Reading("d", "not comparable", "the case failed"), Reading("e", "not comparable", "the case interrupted")],
        failed,
    )
    assert row["verdict"] == "holds" and row["cases"] == 8
    assert row["reason"] == (
        "the median is within the claim; 1 of 10 cases failed: #4 (layers=7); 1 of 10 cases interrupted: #5 (layers=8)"
    )
    assert "the case failed" not in row["reason"] and "not comparable" not in row["reason"]
    none = report_claims._row(
        "t",
        band,
        [Reading("d", "not comparable", "the case failed"), Reading("x", "not comparable", "other sizes: n=1 (why)")],
        failed,
    )
    assert none["reason"] == "1 of 2 cases failed: #4 (layers=7); other sizes: n=1 (why)"
    one = report_claims._row("t", band, [Reading("d", "not comparable", "the case failed")], failed)
    assert one["reason"] == "its case failed: #4 (layers=7)"


def test_the_claims_table_counts_failed_cases_of_a_real_record():
    """Through claim_rows: the run's own cases, numbered as in the summary table, by the params
    that tell them apart; more than five named are counted."""
    cases = [
        speedup_case(1.15, 1.12, 1.18, layers=n, status="failed" if n in (6, 10) else "passed") for n in range(4, 14)
    ]
    rows = report_claims.claim_rows(
        {
            "cases": cases,
            "device": "cuda:0",
            "scenario": {"entries": [{"technique": "packed_metadata", "params": {"layers": [], "model": "100m"}}]},
        },
        techniques,
    )
    whys = [
        r["reason"] for r in rows if r["technique"] == "packed_metadata" and r["reason"] != report_claims.NOT_IN_RUN
    ]
    assert whys and all("2 of 10 cases failed: #3 (layers=6), #7 (layers=10)" in why for why in whys), whys
    assert not any("the case failed" in why for why in whys)
    many = report_claims._did_not_pass(
        [Reading(str(k), "not comparable") for k in range(7)], {str(k): ("failed", f"#{k}") for k in range(7)}
    )[0]
    assert many == "7 of 7 cases failed: #0, #1, #2, #3, #4 and 2 more"
