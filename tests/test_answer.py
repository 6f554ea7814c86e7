"""The answer table (gpubench.reports.answer): "what should I turn on?" first in the report, the
terminal summary and summary.md. Synthetic runs, so every verdict of the fixed rules is reached
on purpose: a failed check first as a warning, "turn on" ranked by the CI's lower end, a CI
reaching 1 never ranked, too few samples, a GPU-specific win on a CPU, a bookkeeping figure that
needs no CI; the model block's title, notes, sizing and techniques that do not apply; a run
without a model block."""

from __future__ import annotations

import dataclasses
import io
import re
from typing import Any

import pytest
from report_runs import write_run
from rich.console import Console

from gpubench.contract import Headline
from gpubench.records.claims import Claim
from gpubench.records.declarations import TechniqueRecord
from gpubench.reports import answer, html, markdown
from gpubench.reports.answer import GPU_ONLY, NO_GAIN, NOT_MEASURED, SLOWER, TOO_FEW, TURN_ON, WORSE, WRONG

GPU_NOTE = "The win is host syncs a GPU waits on; a CPU has none to save."


def _variant(role: str, median: float, n: int, passed: bool = True, peak: int | None = None, **metrics: Any):
    return {
        "role": role,
        "status": "ok" if passed else "check_failed",
        "samples_s": [median] * n,
        "stats": {"median": median, "n": n},
        "metrics": metrics,
        "peak_memory_bytes": peak,
        "check": {"passed": passed, "error": 3e-7 if passed else 0.4, "tolerance": 1e-5, "metric": "rel_l2"},
    }


def case(
    technique: str,
    ratio: float,
    low: float | None,
    high: float | None,
    n: int = 8,
    params: dict[str, Any] | None = None,
    passed: bool = True,
    failure: dict[str, str] | None = None,
    device: str = "cuda",
    peaks: tuple[int | None, int | None] = (None, None),
    base_metrics: dict[str, Any] | None = None,
    opt_metrics: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A case record as results.json holds it: the baseline at 1 s, the optimized at 1 / ratio."""
    params = params or {"size": 1}
    return {
        "id": f"{technique}[" + ",".join(f"{k}={v}" for k, v in params.items()) + "]",
        "technique": technique,
        "params": params,
        "seed": 0,
        "status": "passed" if passed and failure is None else "failed",
        "failure": failure if failure is not None else (None if passed else {"kind": "check", "message": "wrong"}),
        "device": {"type": device, "label": "NVIDIA H100" if device == "cuda" else "CPU"},
        "variants": {
            "eager": _variant("baseline", 1.0, n, peak=peaks[0], **(base_metrics or {})),
            "fused": _variant("optimized", 1.0 / ratio, n, passed=passed, peak=peaks[1], **(opt_metrics or {})),
        },
        "speedups": {"fused": {"ratio": ratio, "ci_low": low, "ci_high": high, "n": n}},
    }


def declared(name: str, gpu_specific: str = "", figures: tuple[Headline, ...] = (), claims=()) -> dict[str, Any]:
    return TechniqueRecord(
        name, summary=f"{name}, a toy", gpu_specific=gpu_specific, headline_figures=figures, claims=tuple(claims)
    ).to_dict()


def doc(cases, techniques=None, device="cuda", model=None, entries=None, name="answer-test") -> dict[str, Any]:
    techniques = techniques or {}
    for c in cases:
        techniques.setdefault(c["technique"], declared(c["technique"]))
    scenario: dict[str, Any] = {
        "name": name,
        "entries": entries
        if entries is not None
        else [{"technique": t, "params": {}} for t in dict.fromkeys(c["technique"] for c in cases)],
    }
    if model is not None:
        scenario["model"] = model
    failed = sum(c["status"] != "passed" for c in cases)
    return {
        "kind": "gpubench.results",
        "schema_version": 3,
        "run_id": "answer-run",
        "status": "complete",
        "device": device,
        "device_label": "NVIDIA H100" if device == "cuda" else "CPU",
        "started_at": "2026-12-01T00:00:00+00:00",
        "finished_at": "2026-12-01T00:01:00+00:00",
        "scenario": scenario,
        "telemetry": {"status": "unavailable", "reason": "synthetic"},
        "cases": cases,
        "techniques": techniques,
        "claims_elsewhere": {},
        "summary": {"cases": len(cases), "passed": len(cases) - failed, "failed": failed, "interrupted": 0},
    }


def every_verdict() -> dict[str, Any]:
    """A GPU run with one technique for each verdict (one CPU case for the GPU-only one)."""
    cases = [
        case("steady", 1.5, 1.4, 1.6),  # turn on, lower end 1.4
        case("spiky", 3.0, 0.97, 5.0),  # the best median, but its CI reaches 1: no gain
        case("wrong_fast", 4.0, 3.8, 4.2, passed=False),  # fast and wrong: first, a warning
        case("narrow", 1.3, 1.25, 1.35),  # turn on, lower end 1.25: ranked after steady
        case("slower", 0.7, 0.6, 0.8),
        case("few", 2.0, None, None, n=2),
        case("crashed", 1.0, None, None, failure={"kind": "oom", "message": "CUDA out of memory"}),
        case("syncs", 2.5, 2.4, 2.6, device="cpu"),
    ]
    techniques = {"syncs": declared("syncs", gpu_specific=GPU_NOTE)}
    return doc(cases, techniques)


def verdicts(ans: answer.Answer) -> list[tuple[str, str, int | None]]:
    return [(r.technique, r.verdict, r.rank) for r in ans.rows]


def test_each_verdict_from_its_rule_wrong_first_then_ranked_then_the_rest():
    ans = answer.answer(every_verdict())
    assert verdicts(ans) == [
        ("wrong_fast", WRONG, None),  # before every ranked row, whatever its speed
        ("steady", TURN_ON, 1),  # ranked by the CI's lower end: 1.4 ...
        ("narrow", TURN_ON, 2),  # ... before 1.25
        ("spiky", NO_GAIN, None),
        ("slower", SLOWER, None),
        ("few", TOO_FEW, None),
        ("syncs", GPU_ONLY, None),  # a CPU ratio of a GPU-specific win, though its CI is above 1
        ("crashed", NOT_MEASURED, None),
    ]
    by_name = {r.technique: r for r in ans.rows}
    assert by_name["few"].why.startswith("n=2") and "5 timed calls" in by_name["few"].why
    assert "CUDA out of memory" in by_name["crashed"].why
    assert by_name["steady"].buys == "1.50x [1.40, 1.60]" and by_name["steady"].ranked_on == 1.4
    assert by_name["syncs"].gpu_note == GPU_NOTE


@pytest.mark.parametrize("low, high", [(0.99, 9.0), (1.0, 1.2), (0.5, 1.0)])
def test_a_ci_reaching_one_is_never_ranked_whatever_its_median(low, high):
    ans = answer.answer(doc([case("modest", 1.05, 1.01, 1.1), case("lucky", 5.0, low, high)]))
    assert verdicts(ans) == [("modest", TURN_ON, 1), ("lucky", NO_GAIN, None)]


def test_only_the_optimized_variant_s_failed_check_says_wrong_here():
    """The verdict is on what a user would turn on: a baseline whose check failed fails the case
    (not measured here, with the reason), and does not call the optimized variant wrong."""
    bad_base = case("pair", 2.0, 1.9, 2.1, failure={"kind": "check", "message": "baseline eager: rel_l2 0.3"})
    bad_base["variants"]["eager"].update(status="check_failed")
    row = answer.answer(doc([bad_base])).rows[0]
    assert (row.verdict, row.why) == (NOT_MEASURED, "failed: baseline eager: rel_l2 0.3")
    wrong = case("pair", 2.0, 1.9, 2.1, passed=False)
    assert answer.answer(doc([wrong])).rows[0].verdict == WRONG


def test_too_few_samples_is_never_ranked_even_with_a_ci_recorded():
    """A speedup over fewer than MIN_CI_SAMPLES calls a variant is not ranked, even where a
    (hand-made or older) record carries ends."""
    ans = answer.answer(doc([case("thin", 3.0, 2.5, 3.5, n=3)]))
    assert verdicts(ans) == [("thin", TOO_FEW, None)]
    assert ans.rows[0].buys == "3.00x (n=3)"
    unrecorded = answer.answer(doc([case("bare", 3.0, None, None, n=9)])).rows[0]
    assert (unrecorded.verdict, unrecorded.why) == (TOO_FEW, "n=9, but no CI recorded")


def test_a_bookkeeping_figure_is_ranked_exact_on_any_device_and_a_rate_by_its_time():
    kv = (Headline("utilization", "KV utilization", percent=True, exact=True),)
    rate = (Headline("tokens_per_s", "tokens/s"),)
    cases = [
        case("kv", 1.0, 0.9, 1.1, device="cpu", base_metrics={"utilization": 0.3}, opt_metrics={"utilization": 0.9}),
        case(
            "kv_same", 1.0, 0.9, 1.1, device="cpu", base_metrics={"utilization": 0.5}, opt_metrics={"utilization": 0.5}
        ),
        case(
            "serve", 2.0, 1.5, 2.5, device="cpu", base_metrics={"tokens_per_s": 100}, opt_metrics={"tokens_per_s": 200}
        ),
    ]
    techniques = {
        "kv": declared("kv", gpu_specific=GPU_NOTE, figures=kv),
        "kv_same": declared("kv_same", figures=kv),
        "serve": declared("serve", gpu_specific=GPU_NOTE, figures=rate),
    }
    ans = answer.answer(doc(cases, techniques, device="cpu"))
    assert verdicts(ans) == [("kv", TURN_ON, 1), ("kv_same", NO_GAIN, None), ("serve", GPU_ONLY, None)]
    assert ans.rows[0].buys == "KV utilization 30% -> 90% (3.00x, exact)" and ans.rows[0].ranked_on == 3.0
    # On a GPU the rate is judged, its interval the time's scaled to it: 2x [1.5, 2.5] of tokens/s.
    gpu = [dict(c, device={"type": "cuda", "label": "NVIDIA H100"}) for c in cases[2:]]
    row = answer.answer(doc(gpu, {"serve": techniques["serve"]})).rows[0]
    assert (row.verdict, row.buys) == (TURN_ON, "tokens/s 100 -> 200 (2.00x [1.50, 2.50])")
    worse = case("kv_worse", 1.0, 0.9, 1.1, base_metrics={"utilization": 0.9}, opt_metrics={"utilization": 0.3})
    assert answer.answer(doc([worse], {"kv_worse": declared("kv_worse", figures=kv)})).rows[0].verdict == WORSE


def test_the_built_in_memory_techniques_declare_their_figures_exact():
    """kv_cache's KV utilization and paged_kv_serving's requests that fit are bookkeeping (ranked
    as they stand); continuous_batching's tokens/s is measured over the timed runs (not exact)."""
    from gpubench import techniques

    first = {n: techniques.find(n).headline_figures[0] for n in ("kv_cache", "paged_kv_serving", "continuous_batching")}
    assert first["kv_cache"].exact and first["paged_kv_serving"].exact and not first["continuous_batching"].exact


def test_costs_say_the_memory_change_and_the_check_error_against_its_tolerance():
    cases = [
        case("fused", 1.5, 1.4, 1.6, peaks=(3 * 2**30, 2**30)),
        case("bigger", 1.5, 1.4, 1.6, peaks=(2**30, 2**31)),
    ]
    rows = {r.technique: r for r in answer.answer(doc(cases)).rows}
    assert rows["fused"].memory == "-2 GiB (3 GiB -> 1 GiB)"
    assert rows["bigger"].memory.startswith("+1 GiB (1 GiB -> 2 GiB)")
    assert rows["fused"].error == "rel_l2 3e-07 (tolerance 1e-05)"
    shown = _printed(doc(cases), 200, terminal=False)
    assert "memory -2 GiB (3 GiB -> 1 GiB); check rel_l2 3e-07 (tolerance 1e-05)" in shown
    assert answer.MEMORY_NOTE not in shown
    wrong = answer.answer(doc([case("w", 2.0, 1.9, 2.1, passed=False)])).rows[0]
    assert wrong.error == "FAILED: rel_l2 0.4 (tolerance 1e-05)" and wrong.verdict == WRONG
    exact = case("tokens", 1.5, 1.4, 1.6)
    exact["variants"]["fused"]["check"].update(error=0, tolerance=0, metric="mismatched_tokens")
    assert answer.answer(doc([exact])).rows[0].error == "mismatched_tokens 0 (exact)"
    cpu = answer.answer(doc([case("c", 1.5, 1.4, 1.6, device="cpu")], device="cpu")).rows[0]
    assert cpu.memory == "not measured"


def test_the_claim_column_reads_the_claims_rule_against_the_row_s_case():
    claim = Claim("Someone (2025)", "https://example.org", text="2x faster", figure=(2.0, 2.0), tolerance=0.1)
    cases = [case("claimed", 2.0, 1.9, 2.1, params={"size": 1}), case("claimed", 1.2, 1.1, 1.3, params={"size": 2})]
    ans = answer.answer(doc(cases, {"claimed": declared("claimed", claims=[claim])}))
    texts = {r.params: r.claim_text for r in ans.rows}
    assert texts == {"size=1": "holds: 2x faster", "size=2": "falls short: 2x faster"}
    cpu = answer.answer(
        doc([case("claimed", 2.0, 1.9, 2.1, device="cpu")], {"claimed": declared("claimed", claims=[claim])})
    )
    assert cpu.rows[0].claim_text.startswith("not comparable: measured on a CPU")
    assert answer.answer(doc([case("plain", 2.0, 1.9, 2.1)])).rows[0].claim_text == "no published claim"


MODEL = {
    "name": "gpt-oss-20b",
    "source": "preset gpt-oss-20b",
    "family": "gpt_oss",
    "workload": "train",
    "seq_len": 4096,
    "batch": 1,
    "device": "cuda",
    "summary": "24 layers; GQA 64 q / 8 kv heads x 64; sliding 128 on 12 layers; MoE 32 experts top-4 x 2880",
    "sizing": ["one layer of 24 is measured: the whole model does not fit"],
    "not_applicable": [{"technique": "paged_attention", "reason": "a training workload has no decode"}],
}


def model_run() -> dict[str, Any]:
    """A model run: flash attention for sliding and full layers (a case each, an entry's note
    each), MoE grouping, and a sweep of one technique that a model run still answers case by case."""
    cases = [
        case("flash_attention", 1.2, 1.1, 1.3, params={"seq_len": 4096, "window": 0}),
        case("flash_attention", 2.5, 2.2, 2.8, params={"seq_len": 4096, "window": 128}),
        case("moe_grouping", 1.1, 0.95, 1.3, params={"experts": 32}),
    ]
    entries = [
        {
            "technique": "flash_attention",
            "params": {"seq_len": [4096], "window": [0]},
            "note": "full layers (12 of 24)",
        },
        {
            "technique": "flash_attention",
            "params": {"seq_len": [4096], "window": [128]},
            "note": "sliding layers (12 of 24), window 128",
        },
        {"technique": "moe_grouping", "params": {"experts": [32]}},
    ]
    return doc(cases, model=MODEL, entries=entries)


def test_a_model_run_is_titled_by_its_model_and_each_case_by_its_note():
    ans = answer.answer(model_run())
    assert ans.title == "What to turn on for gpt-oss-20b (gpt_oss): train, seq len 4096, batch 1, on NVIDIA H100"
    assert ans.summary == MODEL["summary"] and ans.source == "preset gpt-oss-20b"
    assert [(r.note, r.verdict, r.rank) for r in ans.rows] == [
        ("sliding layers (12 of 24), window 128", TURN_ON, 1),
        ("full layers (12 of 24)", TURN_ON, 2),
        ("", NO_GAIN, None),
    ]
    assert all(r.params == "" for r in ans.rows)  # the notes tell the cases apart
    assert ans.not_applicable == [("paged_attention", "a training workload has no decode")]
    assert ans.sizing == MODEL["sizing"] and ans.scope == "" and ans.left_out == []


def test_a_run_without_a_model_block_is_titled_by_its_scenario_and_names_its_sweeps():
    sweep = [case("swept", 1.0 + i / 10, 1.0 + i / 20, 1.1 + i / 10, params={"n": i}) for i in range(1, 7)]
    pair = [case("pair", 1.5, 1.4, 1.6, params={"n": 1, "k": 2}), case("pair", 1.1, 0.9, 1.3, params={"n": 2, "k": 2})]
    ans = answer.answer(doc(sweep + pair, device="cuda"))
    assert ans.title == "What to turn on: answer-test on NVIDIA H100"
    assert [(r.label, r.verdict) for r in ans.rows] == [("pair n=1", TURN_ON), ("pair n=2", NO_GAIN)]
    assert ans.left_out == ["swept: 6 cases swept, no one answer at one size (its section reads them)"]
    assert str(answer.MAX_CASES) in ans.scope and ans.not_applicable == [] and ans.summary == ""
    assert answer.answer(doc(sweep)) is None  # sweeps alone: no table (their sections read them)


def test_an_older_run_without_declarations_or_entries_still_gets_its_table():
    old = doc([case("steady", 1.5, 1.4, 1.6)])
    old["schema_version"] = 2
    del old["techniques"], old["claims_elsewhere"]
    old["scenario"] = {"name": "old"}
    ans = answer.answer(old)
    assert verdicts(ans) == [("steady", TURN_ON, 1)]
    assert answer.answer(doc([])) is None  # nothing measured, no model: no table


# -- where it is shown -------------------------------------------------------------------------
@pytest.fixture
def model_report(tmp_path):
    run_dir = write_run(tmp_path / "run", model_run())
    return html.write_report(run_dir, read_history=False)


def test_the_report_opens_with_the_answer_before_everything_else(model_report):
    page = model_report.html.read_text()
    body = page[page.index("<body>") :]
    start = body.index('<section id="answer">')
    for later in (
        '<dl class="head">',
        "<nav>",
        '<section id="summary">',
        '<section id="claims">',
        "tech-flash_attention",
    ):
        assert start < body.index(later), later
    assert body.index("<h1>") < start  # only the page's title comes before it
    section = body[start : body.index("</section>", start)]
    assert "What to turn on for gpt-oss-20b (gpt_oss)" in section
    order = [section.index(t) for t in ("sliding layers (12 of 24)", "full layers (12 of 24)", "moe_grouping")]
    assert order == sorted(order)  # ranked: the sliding layers' 2.2 lower end first
    assert "paged_attention" in section and "a training workload has no decode" in section
    assert "one layer of 24 is measured" in section and MODEL["summary"] in section
    assert '<a href="#answer">' in page  # reached from the page's links


def test_on_a_phone_the_answer_rows_stack_into_labelled_blocks(model_report):
    """The answer is never a table wider than a phone: under 700 px its rows become blocks of
    labelled lines (each cell names its column), so the page does not scroll sideways."""
    page = model_report.html.read_text()
    narrow = page[page.index("@media (max-width: 700px)") :]
    narrow = narrow[: narrow.index("\n  }\n")]
    assert "#answer-table thead { display: none; }" in narrow
    assert re.search(r"#answer-table tr, #answer-table td \{ display: block;", narrow)
    assert "content: attr(data-label)" in narrow
    section = page[page.index('<section id="answer">') :]
    section = section[: section.index("</section>")]
    cells = re.findall(r"<td[^>]*>", section)
    assert cells and all("data-label=" in c for c in cells)


def test_summary_md_opens_with_the_answer(model_report):
    md = model_report.markdown.read_text()
    assert md.startswith("### What to turn on for gpt-oss-20b (gpt_oss)")
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| technique | verdict |")
    assert "1. flash_attention (sliding layers (12 of 24), window 128)" in table[1] and "**turn on**" in table[1]
    assert "- not applicable: paged_attention (a training workload has no decode)" in md
    assert md.index("What to turn on") < md.index("### gpubench:")


def _printed(run: dict[str, Any], width: int, terminal: bool = True) -> str:
    buffer = io.StringIO()
    answer.print_answer(run, Console(file=buffer, force_terminal=terminal, width=width, color_system=None))
    return buffer.getvalue()


@pytest.mark.parametrize("width", [60, 120])
def test_the_terminal_answer_fits_its_width_and_keeps_each_verdict_and_ci_whole(width):
    out = _printed(every_verdict(), width)
    lines = out.splitlines()
    assert lines[0].startswith("What to turn on: answer-test on NVIDIA H100")
    assert all(len(line) <= width for line in lines), max(lines, key=len)
    assert "…" not in out
    for said in (WRONG, TURN_ON, NO_GAIN, SLOWER, TOO_FEW, GPU_ONLY, NOT_MEASURED):
        assert any(said in line for line in lines), (said, out)
    assert any("1.50x [1.40, 1.60]" in line for line in lines)  # a CI never split between lines
    ranked = [out.index(t) for t in ("wrong_fast", "1. steady", "2. narrow", "spiky", "crashed")]
    assert ranked == sorted(ranked)


def test_the_terminal_answer_names_the_model_and_what_does_not_apply():
    out = _printed(model_run(), 80)
    assert out.startswith("What to turn on for gpt-oss-20b (gpt_oss): train, seq len 4096, batch 1")
    words = " ".join(out.split())
    assert "not applicable: paged_attention (a training workload has no decode)" in words
    assert "sizing: one layer of 24 is measured" in words
    assert "1. flash_attention (sliding layers (12 of 24), window 128)" in words


def test_a_log_gets_one_plain_line_per_row():
    """In a log (stdout not a terminal): the header and one whole line per row, in rank order,
    no box drawing and no wrapping, whatever the console's width."""
    lines = _printed(every_verdict(), 60, terminal=False).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("technique "))
    rows = lines[start + 1 : start + 9]
    assert [r.split()[0] for r in rows] == ["wrong_fast", "1.", "2.", "spiky", "slower", "few", "syncs", "crashed"]
    assert all("rel_l2" in r for r in rows) and not set("┃│┏━") & set("".join(lines))
    assert lines[start + 9] == answer.MEMORY_NOTE  # no row measured memory: said once, not per row
    assert not any("memory not measured" in r for r in rows)


def test_the_answer_goes_through_the_run_s_own_record_fields():
    """Every row holds plain strings and numbers (what jinja2 and Markdown print): no record leaks."""
    for row in answer.answer(every_verdict()).rows:
        for f in dataclasses.fields(row):
            value = getattr(row, f.name)
            assert value is None or isinstance(value, (str, int, float, list)), (f.name, value)


def test_render_summary_without_an_answer_is_as_before():
    head = html.headline(doc([case("steady", 1.5, 1.4, 1.6)]))
    assert markdown.render_summary(head, []).startswith("### gpubench:")


def test_a_terminal_wide_enough_gets_the_table_with_its_verdicts_in_rank_order():
    out = _printed(every_verdict(), 250)
    assert "┃ technique" in out and all(len(line) <= 250 for line in out.splitlines())
    ranked = [out.index(t) for t in ("wrong_fast", "1. steady", "2. narrow", "spiky", "crashed")]
    assert ranked == sorted(ranked)


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_in_a_browser_at_phone_width_the_answer_never_scrolls_the_page(model_report, tmp_path):
    """At 390 px (a phone), in headless Chromium: the page with the answer first is no wider than
    the viewport, as loaded and with every collapsed section open."""
    from test_report_browser import PHONE, needs_chromium, probe

    needs_chromium()
    result, console_errors = probe(model_report.html, tmp_path, PHONE)
    assert not result["errors"] and not console_errors, (result["errors"], console_errors)
    for state in ("closed", "opened"):
        seen = result[state]
        assert seen["scroll_width"] <= PHONE and seen["wide"] == [], (state, seen["scroll_width"], seen["wide"][:10])


def test_gpubench_run_prints_the_answer_before_the_summary(tmp_path):
    """The terminal summary's first block: `gpubench run` prints the answer, then the summary."""
    from test_cli_output import FAST, ROOT, invoke

    from gpubench import techniques

    path = tmp_path / "answered.yaml"
    path.write_text(
        f"name: answered\n{FAST}entries:\n  - technique: {ROOT / 'benchmarks' / 'tiny_pair.py'}\n    params: {{}}\n"
    )
    known = "tiny_pair" in techniques.registered()
    try:
        result = invoke("run", "--scenario", path, "--out", tmp_path / "runs", "--no-calibrate", "--isolation", "none")
    finally:  # the plug-in file registered itself: later tests list the registry
        if not known:
            techniques.unregister("tiny_pair")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    answer_at = next(i for i, line in enumerate(lines) if line.startswith("What to turn on: answered on "))
    summary_at = next(i for i, line in enumerate(lines) if line.startswith("answered on "))
    assert answer_at < summary_at
    assert any(line.startswith("tiny_pair") for line in lines[answer_at:summary_at])


def test_the_model_block_s_text_is_escaped_in_the_page_and_in_markdown(tmp_path):
    """The model block is read from results.json (input): its name, summary, notes and reasons
    reach the page escaped, and a Markdown cell neither breaks the table nor carries a tag."""
    run = model_run()
    run["scenario"]["model"] = {
        **MODEL,
        "name": "<script>alert(1)</script>",
        "not_applicable": [{"technique": "paged_attention", "reason": "a | pipe <b>and</b> a tag"}],
    }
    run["scenario"]["entries"][1]["note"] = "sliding <i>layers</i>"
    written = html.write_report(write_run(tmp_path / "run", run), read_history=False)
    page = written.html.read_text()
    section = page[page.index('<section id="answer">') :]
    section = section[: section.index("</section>")]
    assert "<script>" not in section and "&lt;script&gt;" in section
    assert "<i>layers</i>" not in section and "<b>and</b>" not in section
    md = written.markdown.read_text()
    assert "<script>" not in md and "&lt;script>" in md
    assert "a \\| pipe &lt;b>and&lt;/b> a tag" in md


VERDICT_CHECK_ORDER = [WRONG, NOT_MEASURED, GPU_ONLY, TOO_FEW, TURN_ON, NO_GAIN, SLOWER]


def test_the_verdict_rules_apply_in_the_order_docs_report_md_states():
    """docs/report.md's verdict table reads "the first that applies": its rows are in the order
    answer.verdict checks them, shown by cases that meet two rules at once (a failed CPU case of a
    GPU-specific technique is not measured; a GPU-specific CPU case with too few samples is GPU-only)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "report.md").read_text()
    table = text[text.index("| verdict | when |") :].split("\n\n")[0]
    rows = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
    assert rows == VERDICT_CHECK_ORDER
    gpu = {"syncs": declared("syncs", gpu_specific=GPU_NOTE)}
    failed = case("syncs", 2.5, 2.4, 2.6, device="cpu", failure={"kind": "timeout", "message": "too long"})
    few = case("syncs", 2.5, None, None, n=2, device="cpu")
    wrong_cpu = case("syncs", 2.5, 2.4, 2.6, device="cpu", passed=False)
    got = [answer.answer(doc([c], dict(gpu), device="cpu")).rows[0].verdict for c in (wrong_cpu, failed, few)]
    assert got == [WRONG, NOT_MEASURED, GPU_ONLY]


@pytest.mark.parametrize("broken", ["answer", "markdown_lines"])
def test_a_fault_in_the_answer_costs_its_section_never_the_report(tmp_path, monkeypatch, caplog, broken):
    """A bug in building the answer (or drawing summary.md's table) loses only the answer: the
    page and summary.md are written with "answer table unavailable: <error>" in its place (logged),
    and every section after it."""

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(answer, broken, boom)
    run_dir = write_run(tmp_path / "run", model_run())
    written = html.write_report(run_dir, read_history=False)
    page, summary = written.html.read_text(), written.markdown.read_text()
    unavailable = "answer table unavailable: RuntimeError: boom"
    assert unavailable in summary and "| technique" in summary
    if broken == "answer":
        assert unavailable in page and 'id="summary"' in page
    assert unavailable in caplog.text
