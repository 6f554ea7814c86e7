"""The runner: correctness checked in every run, failures isolated, nothing measured lost."""

import json

import pytest
import torch
from inprocess import run_in_process

from gpubench.records import results
from gpubench.run import outcome as outcomes
from gpubench.run import runner, scenario


def run(write_scenario, tmp_path, body, **kw):
    scen = scenario.load(write_scenario(body))
    return run_in_process(scen, torch.device("cpu"), tmp_path / "runs", calibrate=False, **kw)


def by_mode(doc):
    return {c["params"].get("mode"): c for c in doc["cases"]}


FAILURES = """\
name: failures
entries:
  - technique: toy_kernel
    params:
      n: 16
      mode: [optimized_raises, build_raises, oom]
  - technique: toy_kernel
    params: {n: 16, mode: hang}
    policy: {case_timeout_s: 0.5}
  - technique: toy_kernel
    params:
      n: 16
      mode: [ok, peer_raises, metrics_raises, optimized_wrong, baseline_raises]
policy: {warmup_s: 0, min_reps: 5, max_reps: 6, min_time_s: 0, max_time_s: 0.5, target_iqr: 1.0, case_timeout_s: 300, energy_s: 0}
"""


def test_failing_cases_are_recorded_with_their_reason_and_the_run_goes_on(toys, write_scenario, tmp_path):
    outcome = run(write_scenario, tmp_path, FAILURES)
    doc = outcome.doc
    cases = by_mode(doc)
    assert doc["status"] == "complete" and len(doc["cases"]) == 9
    assert outcome.exit_code == outcomes.EXIT_FAILED

    raised = cases["optimized_raises"]
    assert raised["status"] == "failed" and "kernel launch failed" in raised["failure"]["message"]
    assert raised["variants"]["baseline"]["stats"]["n"] >= 3  # the baseline was still timed

    assert cases["build_raises"]["failure"]["kind"] == "exception"
    assert "cannot build this workload" in cases["build_raises"]["failure"]["message"]

    oom = cases["oom"]
    assert oom["status"] == "failed" and oom["variants"]["optimized"]["error"]["kind"] == "oom"

    hang = cases["hang"]
    assert hang["status"] == "failed" and hang["failure"]["kind"] == "timeout"
    assert hang["elapsed_s"] < 60  # stopped at its 0.5 s limit, not left to run forever

    wrong = cases["optimized_wrong"]
    assert wrong["status"] == "failed" and wrong["failure"]["kind"] == "check"
    assert wrong["variants"]["optimized"]["check"]["passed"] is False
    assert wrong["variants"]["optimized"]["check"]["error"] > 1e-6  # the error figure is kept
    assert wrong["variants"]["optimized"]["samples_s"]  # a wrong result is still timed

    # A peer that cannot run this shape does not fail the case; a broken metric neither.
    assert cases["peer_raises"]["status"] == "passed"
    assert cases["peer_raises"]["variants"]["peer"]["status"] == "error"
    assert cases["metrics_raises"]["status"] == "passed"
    assert "bad metric" in cases["metrics_raises"]["variants"]["optimized"]["metrics"]["metrics_error"]

    # Without a baseline nothing was compared: the optimized output must not look verified.
    no_base = cases["baseline_raises"]
    assert no_base["status"] == "failed" and no_base["failure"]["kind"] == "variant"
    assert no_base["variants"]["optimized"]["status"] == "unchecked"
    assert no_base["variants"]["optimized"]["check"] is None

    # The case after all those failures measured normally.
    ok = cases["ok"]
    assert ok["status"] == "passed" and ok["speedups"]["optimized"]["ci_low"] <= ok["speedups"]["optimized"]["ratio"]


def test_every_variant_is_checked_against_the_baseline_in_a_passing_run(toys, write_scenario, tmp_path):
    doc = run(write_scenario, tmp_path, "name: ok\nentries:\n  - technique: toy_kernel\n    params: {n: 32}\n").doc
    case = doc["cases"][0]
    v = case["variants"]
    assert case["status"] == "passed"
    assert v["baseline"]["check"]["metric"] == "reference"
    assert v["optimized"]["check"]["passed"] and v["optimized"]["check"]["error"] <= 1e-6
    assert v["peer"]["check"]["passed"]
    assert v["elsewhere"]["status"] == "skipped" and "lacks" in v["elsewhere"]["reason"]
    assert not v["elsewhere"]["samples_s"]
    assert v["optimized"]["metrics"]["tflops"] > 0 and v["optimized"]["metrics"]["gbps"] > 0
    assert set(case["speedups"]) == {"optimized", "peer"}


def test_the_four_contract_shapes_run_and_check(toys, write_scenario, tmp_path):
    body = (
        "name: shapes\nentries:\n"
        "  - technique: toy_kernel\n"
        "  - technique: toy_train_step\n"
        "  - technique: toy_serving\n"
        "  - technique: toy_generation\n    params: {tokens: [5, 30]}\n"
    )
    doc = run(write_scenario, tmp_path, body).doc
    status = {c["id"]: c["status"] for c in doc["cases"]}
    assert all(s == "passed" for s in status.values()), doc["cases"]
    serve = next(c for c in doc["cases"] if c["technique"] == "toy_serving")
    # serving-run metrics come from the engine's own per-request latencies
    assert serve["variants"]["optimized"]["metrics"]["p50_latency_s"] > 0
    gen = next(c for c in doc["cases"] if c["technique"] == "toy_generation")
    assert gen["variants"]["optimized"]["check"]["metric"] == "mismatched_tokens"


def test_training_step_state_is_reset_before_every_call(toys, write_scenario, tmp_path, monkeypatch):
    # Without reset the optimized variant would start from the weights the baseline left, and its
    # output (loss, new weights) would differ: the passing check depends on reset being called.
    doc = run(write_scenario, tmp_path, "name: t\nentries:\n  - technique: toy_train_step\n").doc
    assert doc["cases"][0]["status"] == "passed"
    monkeypatch.setattr(toys.TRAIN, "build_fn", _without_reset(toys.TRAIN.build_fn))
    doc = run(write_scenario, tmp_path, "name: t\nentries:\n  - technique: toy_train_step\n").doc
    assert doc["cases"][0]["status"] == "failed"


def _without_reset(build):
    def build_no_reset(params, device, seed):
        w = build(params, device, seed)
        w.reset = None
        return w

    return build_no_reset


def test_ctrl_c_saves_what_finished(toys, write_scenario, tmp_path):
    body = "name: stop\nentries:\n  - technique: toy_kernel\n    params: {mode: [ok, interrupt, ok]}\n"
    outcome = run(write_scenario, tmp_path, body)
    assert outcome.exit_code == outcomes.EXIT_INTERRUPTED
    on_disk = json.loads((outcome.run_dir / "results.json").read_text())
    assert on_disk["status"] == "interrupted"
    assert [c["status"] for c in on_disk["cases"]] == ["passed", "interrupted"]
    assert on_disk["cases"][0]["variants"]["optimized"]["samples_s"]


def test_results_are_on_disk_after_every_case(toys, write_scenario, tmp_path):
    seen = []

    class Spy:
        def run_started(self, total):
            pass

        def case_started(self, index, case):
            pass

        def run_finished(self):
            pass

        def case_finished(self, index, case, record):
            run_dir = next((tmp_path / "runs").iterdir())
            seen.append(len(results.load_results(run_dir)["cases"]))  # results.json + the run log

    run(
        write_scenario,
        tmp_path,
        "name: t\nentries:\n  - technique: toy_kernel\n    params: {n: [4, 8, 16]}\n",
        progress=Spy(),
    )
    assert seen == [1, 2, 3]


def test_run_directory_holds_every_file(toys, write_scenario, tmp_path):
    outcome = run(write_scenario, tmp_path, "name: files\nentries:\n  - technique: toy_kernel\n")
    names = {p.name for p in outcome.run_dir.iterdir()}
    assert {"results.json", "results.csv", "telemetry.csv", "env.json"} <= names
    assert outcome.run_dir.name.endswith("-files")
    doc = json.loads((outcome.run_dir / "results.json").read_text())
    assert doc["schema_version"] == 3 and doc["telemetry"]["status"] == "unavailable"
    assert "cpu" in doc["telemetry"]["reason"]
    assert doc["env"]["torch"] == torch.__version__


def test_derived_rates_use_the_measured_peak():
    ceilings = {"matmul": {"peak_tflops": 2.0, "dtype": "bfloat16"}, "copy": {"peak_gbps": 100.0}}
    m = runner.derive_rates({"flops": 1e12, "bytes_moved": 5e9, "tokens_per_s": 3}, 1.0, ceilings)
    assert m["tflops"] == pytest.approx(1.0) and m["pct_peak_flops"] == pytest.approx(50.0)
    assert m["peak_flops_basis"] == "bfloat16 matmul, measured"  # % of which peak, stated
    assert m["gbps"] == pytest.approx(5.0) and m["pct_peak_bandwidth"] == pytest.approx(5.0)
    assert "pct_peak_flops" not in runner.derive_rates({"flops": 1.0}, 1.0, None)


def test_a_harness_fault_marks_the_run_crashed_and_keeps_finished_cases(toys, write_scenario, tmp_path, monkeypatch):
    real = runner.run_case
    calls = []

    def second_call_breaks(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("harness bug")
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "run_case", second_call_breaks)
    outcome = run(
        write_scenario, tmp_path, "name: t\nentries:\n  - technique: toy_kernel\n    params: {n: [4, 8, 16]}\n"
    )
    on_disk = json.loads((outcome.run_dir / "results.json").read_text())
    assert on_disk["status"] == "crashed" and "harness bug" in on_disk["abort_reason"]
    assert on_disk["cases"][0]["status"] == "passed"
    assert outcome.exit_code == outcomes.EXIT_FAILED


def test_a_broken_cuda_context_stops_the_run_with_the_reason(toys, write_scenario, tmp_path, monkeypatch):
    # On a GPU an illegal memory access poisons the context; every later case would fail the
    # same way. Simulated here: the probe after a failed case reports the context broken.
    monkeypatch.setattr(runner, "cuda_context_broken", lambda device: "CUDA error: an illegal memory access")
    body = "name: t\nentries:\n  - technique: toy_kernel\n    params: {mode: [ok, optimized_raises, ok, ok]}\n"
    outcome = run(write_scenario, tmp_path, body)
    assert outcome.doc["status"] == "aborted" and len(outcome.doc["cases"]) == 2
    assert (
        "illegal memory access" in outcome.doc["abort_reason"]
        and "2 later case(s) not run" in outcome.doc["abort_reason"]
    )
    assert outcome.exit_code == outcomes.EXIT_FAILED


def test_metrics_see_what_the_timed_calls_recorded_never_the_checked_warm_up_or_energy_calls(
    toys, write_scenario, tmp_path, monkeypatch
):
    # Call 1 of each variant is the checked call, call 2 the only warm-up call (warmup_s 0), calls
    # 3-6 are timed; a fake energy counter makes the runner add energy calls after the metrics.
    from gpubench.measure.telemetry import TelemetrySampler

    ticks = iter(range(10**6))
    monkeypatch.setattr(TelemetrySampler, "energy_mj", lambda self: float(next(ticks)))
    body = (
        "name: rec\nentries:\n  - technique: toy_recorded\n"
        "policy: {warmup_s: 0, min_reps: 4, max_reps: 4, min_time_s: 0, target_iqr: 1.0, energy_s: 0.01}\n"
    )
    case = run(write_scenario, tmp_path, body).doc["cases"][0]
    for name in ("counted_a", "counted_b"):
        v = case["variants"][name]
        assert v["energy_mj_per_call"] is not None  # the energy calls did happen
        assert v["metrics"]["timed_calls"] == [3, 4, 5, 6]
        assert v["metrics"]["median_call"] == 4.5
        assert [r["call"] for r in v["recorded"]] == [3, 4, 5, 6]  # kept in results.json too


def test_the_phase_record_says_where_a_cases_time_went_and_stops_where_the_case_did(toys, write_scenario, tmp_path):
    # Every stage of run_case laps its phase: a case that ran through has each one (in PHASES order,
    # then the timed calls' own seconds and the rest); a case whose build raised reached none after it.
    body = (
        "name: phases\nentries:\n  - technique: toy_kernel\n    params: {n: 16, mode: [ok, build_raises]}\n"
        "policy: {warmup_s: 0, min_reps: 3, max_reps: 4, min_time_s: 0, max_time_s: 0.5, target_iqr: 1.0, "
        "energy_s: 0}\n"
    )
    cases = by_mode(run(write_scenario, tmp_path, body).doc)
    for mode, reached in (("ok", runner.PHASES), ("build_raises", ("build", "stats"))):
        case = cases[mode]
        phases = case["phases_s"]
        assert list(phases) == [*runner.PHASES, "timed", "other"], mode
        assert all(phases[p] > 0 for p in reached) and all(phases[p] == 0 for p in runner.PHASES if p not in reached), (
            mode,
            phases,
        )
        assert sum(phases[p] for p in runner.PHASES) + phases["other"] == pytest.approx(case["elapsed_s"], rel=1e-9)
    ok = cases["ok"]
    assert 0 < ok["phases_s"]["timed"] <= ok["phases_s"]["timing"]
    assert ok["phases_s"]["timed"] == pytest.approx(sum(sum(v["samples_s"]) for v in ok["variants"].values()))
    assert cases["build_raises"]["phases_s"]["timed"] == 0


CAPPED_AT_ONCE = """\
name: capped
entries:
  - technique: toy_kernel
    params: {n: 16}
policy: {warmup_s: 0, min_reps: 5, max_reps: 50, min_time_s: 0, max_time_s: 0.000001, target_iqr: 0.0,
         case_timeout_s: 300, energy_s: 0}
"""


def test_a_time_cap_before_min_reps_keeps_timing_to_min_reps_within_the_case_limit(toys, write_scenario, tmp_path):
    """Issue 34: under load max_time_s ended timing after one call a variant, and the speedup
    printed as a CI of no width. The runner gives timing a deadline (a share of case_timeout_s,
    300 s here, far from a toy's microseconds): every variant reaches min_reps, none under-sampled,
    and the speedup has its CI."""
    outcome = run(write_scenario, tmp_path, CAPPED_AT_ONCE)
    case = results.load_run(outcome.run_dir).cases[0]
    assert all(len(v.samples_s) == 5 and v.under_sampled is None for v in case.variants.values() if v.samples_s)
    assert results.has_interval(case.speedup(case.role_variant("optimized")))


def test_the_runner_passes_timing_a_deadline_within_the_case_limit(toys, monkeypatch):
    from planted import _NoTelemetry

    from gpubench.measure import timing
    from gpubench.run.scenario import Case

    seen = {}
    real = timing.measure_interleaved

    def spy(*args, **kwargs):
        seen["deadline"], seen["at"] = kwargs.get("deadline"), timing.time.perf_counter()
        return real(*args, **kwargs)

    monkeypatch.setattr(timing, "measure_interleaved", spy)
    policy = timing.Policy(warmup_s=0.0, min_reps=2, max_reps=2, min_time_s=0.0, case_timeout_s=100.0, energy_s=0.0)
    cpu = torch.device("cpu")
    runner.run_case(
        Case("toy_kernel", {"n": 16, "mode": "ok"}, policy, 0),
        cpu,
        timing.Clock(cpu, flush_l2=False),
        _NoTelemetry(),
        None,
    )
    # from the case's start (before timing), TIMING_DEADLINE_SHARE of its 100 s: never past the limit
    assert seen["at"] < seen["deadline"] <= seen["at"] + timing.TIMING_DEADLINE_SHARE * 100.0
