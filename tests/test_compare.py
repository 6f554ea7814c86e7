"""The regression gate: passes unchanged builds on a noisy machine, catches real slowdowns,
fails on wrong results, refuses apples-to-oranges comparisons."""

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from gpubench.errors import BadInput
from gpubench.gate import compare
from gpubench.measure import timing
from gpubench.records import stats
from gpubench.records.results import RunRecord, role_variant


def test_mann_whitney_matches_the_textbook_value():
    # U = 0 for fully separated groups of 5: z = (12.5 - 0.5) / sqrt(25 * 11 / 12) -> p = 0.0122
    assert stats.mann_whitney_u([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(0.01219, rel=1e-3)
    assert stats.mann_whitney_u([1, 2, 3], [1, 2, 3]) == pytest.approx(1.0)


@pytest.fixture(scope="module")
def machine_noise():
    """Real timing samples of a real workload on this machine (flash attention's baseline at a
    small size): the noise the gate must live with."""
    from gpubench.techniques import flash_attention as fa

    w = fa.build({**fa.TECHNIQUE.defaults(), "seq_len": 128, "heads": 2}, torch.device("cpu"), seed=1)
    policy = timing.Policy(warmup_s=0.05, min_reps=300, max_reps=300, min_time_s=0, max_time_s=30, target_iqr=0)
    # One intra-op thread, as the two-run fixture below: with two threads on two shared vCPUs a
    # neighbour's burst splits the samples into two modes ~2x apart, and a gate fed a 50/50
    # bimodal pool is testing the neighbour, not the statistics.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        samples = timing.measure_interleaved({"x": lambda _: fa.eager(w)}, timing.Clock(torch.device("cpu")), policy)[
            "x"
        ].samples_s
    finally:
        torch.set_num_threads(threads)
    assert len(samples) == 300
    return np.array(samples)


def _gate_trials(pool: np.ndarray, slowdown: float) -> tuple[int, int]:
    """Of 100 trials drawing 100 samples a side from ``pool``: how many A/A comparisons pass, and
    how many comparisons against a ``slowdown``-times slower copy regress."""
    rng = np.random.default_rng(2026)
    a_a_passes = slowdowns_caught = 0
    for trial in range(100):
        base, same, slow = (rng.choice(pool, 100) for _ in range(3))
        a_a_passes += compare.classify(list(base), list(same), compare.DEFAULT_THRESHOLD, seed=trial)[0] != "regressed"
        slowdowns_caught += (
            compare.classify(list(base), list(slow * slowdown), compare.DEFAULT_THRESHOLD, seed=trial)[0] == "regressed"
        )
    return a_a_passes, slowdowns_caught


def test_gate_passes_a_a_comparisons_of_this_machines_live_noise(machine_noise):
    # 100 samples a side: what gpu-quick's policy (max_reps 100) takes when the noise is high. The
    # A/A side is the guarantee a gate must keep whatever the machine is doing: both sides come
    # from the same pool, so however heavy its tail, nothing may regress.
    a_a_passes, _ = _gate_trials(machine_noise, 1.15)
    assert a_a_passes >= 99, a_a_passes


def test_gate_catches_a_15_percent_slowdown_in_recorded_cpu_noise():
    # Detection power depends on how noisy the machine is at the moment (a busy neighbour widens
    # the tail), so it is tested on a pool recorded on this kind of machine when it was quiet
    # (tests/data/cpu_noise.json: IQR ~12% of the median, the slowest call 1.5x the median).
    pool = np.array(json.loads((Path(__file__).parent / "data" / "cpu_noise.json").read_text())["samples_s"])
    a_a_passes, slowdowns_caught = _gate_trials(pool, 1.15)
    assert a_a_passes >= 99, a_a_passes
    assert slowdowns_caught >= 95, slowdowns_caught


def test_a_slowdown_within_the_threshold_or_within_the_noise_is_not_a_regression():
    rng = np.random.default_rng(0)
    base = list(rng.normal(1.0, 0.002, 40))
    assert compare.classify(base, [x * 1.03 for x in base], 0.05)[0] == "unchanged"  # real but small
    noisy = list(rng.lognormal(0, 0.5, 6))
    assert (
        compare.classify(noisy, [x * 1.2 for x in rng.permutation(noisy)], 0.05)[0] == "unchanged"
    )  # too noisy to tell
    assert compare.classify(base, [x * 0.8 for x in base], 0.05)[0] == "improved"


def test_the_gate_s_p_and_its_ci_never_contradict_each_other():
    # issue 34: "-36.5% [-37.5, -35.5], p 0.2 -> improved" and "+20.8% [-18.2, +22.1], p 1": a
    # bootstrap CI beside a Mann-Whitney p. Now both come from one bootstrap: the 95% CI excludes no
    # change exactly when p < 0.05, in every comparison the gate prints.
    verdict, ratio, low, high, p = compare.classify(
        [1.0, 1.01, 1.0, 1.02, 1.01], [0.635, 0.64, 0.64, 0.636, 0.64], 0.05
    )
    assert (verdict, high < 1.0, p < 0.05) == ("improved", True, True), (ratio, low, high, p)
    rng = np.random.default_rng(8)
    for seed in range(200):
        base = list(rng.lognormal(0, 0.3, int(rng.integers(5, 12))))
        cur = list(rng.lognormal(0, 0.3, int(rng.integers(5, 12))) * rng.uniform(0.7, 1.4))
        _, _, low, high, p = compare.classify(base, cur, 0.05, seed=seed)
        assert (low > 1.0 or high < 1.0) == (p < 0.05), (seed, low, high, p)


def test_a_verdict_on_p_alone_rests_on_the_same_bootstrap_s_99_8_percent_ci():
    # verdict_of's second route (the median beyond the threshold, p < P_SIGNIFICANT though the 95% CI
    # reaches inside it): with p from the CI's replicates, that is their 99.8% CI excluding no change.
    pool = np.array(json.loads((Path(__file__).parent / "data" / "cpu_noise.json").read_text())["samples_s"])
    rng = np.random.default_rng(9)
    by_p = 0
    for seed in range(150):
        base, cur = rng.choice(pool, 30), rng.choice(pool, 30) * 1.12
        verdict, ratio, low, high, p = compare.classify(list(base), list(cur), 0.05, seed=seed)
        if verdict == "regressed" and low <= 1.05:
            by_p += 1
            wide, _ = stats.bootstrap_ratio_test(cur, base, level=1 - compare.P_SIGNIFICANT, seed=seed)
            assert p < compare.P_SIGNIFICANT and wide.ci_low > 1.0, (seed, wide, p)
    assert by_p >= 5  # the route is taken, so the property is tested


def _doc(device="CPU: test", scenario="s", entries=None, cases=None, thresholds=None):
    # A whole run says so: a document without a status is read as the record's default, a run
    # still "running", which the gate does not pass.
    return {
        "kind": "gpubench.results",
        "schema_version": 1,
        "run_id": "r",
        "status": "complete",
        "device_label": device,
        "scenario": {"name": scenario, "entries": entries or [{"technique": "t"}], "thresholds": thresholds or {}},
        "cases": cases or [],
    }


def _case(case_id, samples, status="passed", technique="t", optimized_scale=1.0):
    return {
        "id": case_id,
        "technique": technique,
        "status": status,
        "failure": None if status == "passed" else {"message": "optimized optimized: check failed"},
        "variants": {
            "baseline": {"role": "baseline", "samples_s": list(samples)},
            "optimized": {"role": "optimized", "samples_s": [x * optimized_scale for x in samples]},
        },
    }


def test_failed_missing_and_new_cases():
    rng = np.random.default_rng(1)
    s = list(rng.normal(1.0, 0.01, 20))
    base = _doc(cases=[_case("a", s), _case("b", s), _case("c", s)])
    cur = _doc(cases=[_case("a", s), _case("b", s, status="failed"), _case("d", s)])
    result = compare.compare(base, cur)
    verdicts = {c.case_id: c.verdict for c in result.changes}
    assert verdicts == {"a": "unchanged", "b": "failed", "c": "missing", "d": "new"}
    assert [c.verdict for c in result.changes][:2] == ["failed", "missing"]  # bad news first
    assert not result.passed and result.exit_code == 1
    only_missing = compare.compare(base, _doc(cases=[_case("a", s), _case("b", s)]), allow_missing=True)
    assert only_missing.passed


def test_regressions_come_first_largest_slowdown_first():
    rng = np.random.default_rng(3)
    s = list(rng.normal(1.0, 0.005, 25))
    base = _doc(cases=[_case(x, s) for x in "abc"])
    cur = _doc(cases=[_case("a", s, optimized_scale=1.2), _case("b", s), _case("c", s, optimized_scale=1.5)])
    result = compare.compare(base, cur)
    assert [c.case_id for c in result.changes] == ["c", "a", "b"]
    assert [c.verdict for c in result.changes] == ["regressed", "regressed", "unchanged"]
    assert result.changes[0].context.variant == "baseline"


def test_per_technique_thresholds_from_the_scenario_apply():
    rng = np.random.default_rng(4)
    s = list(rng.normal(1.0, 0.005, 25))
    base = _doc(cases=[_case("a", s)])
    cur = _doc(cases=[_case("a", s, optimized_scale=1.2)], thresholds={"t": 0.3})
    result = compare.compare(base, cur)
    assert result.changes[0].verdict == "unchanged" and result.changes[0].threshold == 0.3


def test_different_hardware_or_scenario_is_refused_unless_forced():
    with pytest.raises(BadInput, match="different hardware"):
        compare.compare(_doc(device="NVIDIA H100"), _doc(device="NVIDIA H200"))
    with pytest.raises(BadInput, match="scenario definitions differ"):
        compare.compare(_doc(entries=[{"technique": "t", "params": {"n": [1]}}]), _doc())
    assert compare.compare(_doc(device="NVIDIA H100"), _doc(device="NVIDIA H200"), force=True).forced


def test_threshold_parsing():
    assert compare.parse_threshold("5%") == pytest.approx(0.05)
    assert compare.parse_threshold("0.1") == pytest.approx(0.1)
    for bad in ("-5%", "0", "five"):
        with pytest.raises(BadInput):
            compare.parse_threshold(bad)


def test_pytest_benchmark_json_is_accepted(tmp_path):
    rng = np.random.default_rng(5)
    data = list(rng.normal(1e-3, 1e-5, 20))

    def bench_file(name, scale):
        path = tmp_path / name
        path.write_text(
            json.dumps(
                {
                    "machine_info": {"cpu": {"brand_raw": "Test CPU"}},
                    "benchmarks": [
                        {
                            "name": "test_x",
                            "fullname": "benchmarks/test_b.py::test_x",
                            "group": "flash_attention",
                            "params": None,
                            "stats": {"median": 1e-3, "rounds": 20, "data": [d * scale for d in data]},
                        }
                    ],
                }
            )
        )
        return path

    result = compare.compare(compare.load_any(bench_file("a.json", 1.0)), compare.load_any(bench_file("b.json", 1.4)))
    assert result.changes[0].verdict == "regressed" and result.baseline.device_label == "CPU: Test CPU"


def test_baseline_store_paths_are_per_device_model(tmp_path):
    doc = RunRecord.from_dict(_doc(device="NVIDIA H100 80GB HBM3", scenario="gpu-quick"))
    assert compare.store_path(tmp_path, doc) == tmp_path / "NVIDIA-H100-80GB-HBM3" / "gpu-quick.json"
    with pytest.raises(BadInput, match="no baseline for this device and scenario"):
        compare.find_in_store(tmp_path, doc)


# A few cheap benchmarks of two groups (techniques): every variant of flash_attention's "full" size
# (the Triton kernel skipped, only checked in the interpreter), kv_cache's llama-3.1-8b size.
# Which benchmarks exist and that their sizes are valid is tests/test_registry.py's.
BENCH_SUBSET = "flash_attention-full or kv_cache-llama"


@pytest.mark.e2e
@pytest.mark.timeout(1200)
def test_benchmarks_run_and_their_json_feeds_the_gate(tmp_path):
    # benchmarks/ run under pytest-benchmark, and the JSON they write is read back by the gate.
    # Limits far from the normal ~15 s: a loaded machine is slower, not wrong.
    import os
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "bench.json"
    root = Path(__file__).resolve().parent.parent
    # Under pytest-xdist this process is a worker: a nested pytest that sees its PYTEST_XDIST_*
    # variables turns pytest-benchmark off and writes no JSON.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(root / "benchmarks"),
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            BENCH_SUBSET,
            "--benchmark-min-rounds=3",
            "--benchmark-max-time=0.01",
            "--benchmark-save-data",
            f"--benchmark-json={out}",
            "-o",
            "timeout=900",
        ],
        capture_output=True,
        text=True,
        timeout=1000,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    run = compare.load_any(out)
    assert {c.technique for c in run.cases} == {"flash_attention", "kv_cache"}
    assert all(len(c.variants["benchmark"].samples_s) >= 3 for c in run.cases)
    assert compare.compare(run, run).passed  # a file against itself: nothing changed


# -- end to end through the CLI -------------------------------------------------------------

# Two small cases of each kernel technique the gate treats differently: flash_attention and
# paged_attention gated on time, kv_cache on its exact bytes reserved. Fifty samples a variant
# (calls of well under a millisecond), so that a slowdown of the same samples is shown to be
# real (p < 0.002) even when a busy neighbour widens the noise (with 20-30 samples, one case of
# three was under load); about 2 s a run on 2 cores.
GATE_SCENARIO = """
name: gate-test
description: small kernel cases, run twice for the gate
device: cpu
policy: {warmup_s: 0.01, min_reps: 50, max_reps: 50, min_time_s: 0, max_time_s: 2, target_iqr: 0.1,
         case_timeout_s: 300, energy_s: 0}
entries:
  - technique: flash_attention
    params: {batch: 1, heads: 2, seq_len: [64, 128], head_dim: 32, causal: true}
  - technique: kv_cache
    params: {model: [llama-3.1-8b, deepseek-v3], layers: 1, requests: 2, max_len: 64}
  - technique: paged_attention
    params: {batch: 2, heads: 2, kv_heads: 1, head_dim: 64, context_len: 64}
"""


@pytest.fixture(scope="module")
def two_real_runs(tmp_path_factory):
    """Two real runs of GATE_SCENARIO (the same unchanged code), back to back, with one intra-op
    thread (on a 2-core machine two threads make run-to-run drift much larger). What this
    exercises is the gate end to end on real runs, not each technique's timing (each has its
    own tests), so the cases are small."""
    from gpubench.run import scenario, supervisor

    out = tmp_path_factory.mktemp("gate")
    (out / "gate-test.yaml").write_text(GATE_SCENARIO)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        options = supervisor.RunOptions(devices=["cpu"], isolation="none")
        dirs = [
            supervisor.run_scenario(
                scenario.load(str(out / "gate-test.yaml")), options, out / "runs", calibrate=False
            ).run_dir
            for _ in range(2)
        ]
    finally:
        torch.set_num_threads(threads)
    return dirs


def _gate(*args):
    from click.testing import CliRunner

    from gpubench.cli import main

    return CliRunner().invoke(main, ["compare", *map(str, args)], catch_exceptions=False)


# Between two runs on this 2-vCPU VM, unchanged code drifts by up to ~20% (measured while writing
# this test: flash_attention cases moved -18% .. +16% with one thread, far more with two), so the
# CPU test uses a 25% threshold; a GPU runner keeps the default 5% (docs/ci.md).
# kv_cache cases are gated on bytes reserved (exact), not on their allocation time.
CPU_THRESHOLD = "25%"


@pytest.mark.e2e
def test_two_real_runs_go_through_the_gate_end_to_end(two_real_runs, tmp_path):
    # Whether two real runs on a shared machine pass depends on what else ran meanwhile (a loaded
    # machine drifted one case +34% here); the gate's false-alarm and detection rates are tested on
    # recorded noise (tests/data/cpu_noise.json). What real runs must show: every case gets a
    # verdict, the exit code follows the verdicts, kv_cache's exact bytes are unchanged, and a run
    # against itself passes.
    md = tmp_path / "gate.md"
    result = _gate(*two_real_runs, "--threshold", CPU_THRESHOLD, "--markdown", md, "--json")
    doc = json.loads(result.output[result.output.index("{") :])
    cases = json.loads((two_real_runs[1] / "results.json").read_text())["cases"]
    verdicts = {c["case_id"]: c["verdict"] for c in doc["changes"]}
    assert set(verdicts) == {c["id"] for c in cases}
    assert set(verdicts.values()) <= {"unchanged", "improved", "regressed", "inconclusive"}
    assert result.exit_code == (1 if "regressed" in verdicts.values() else 0), result.output
    assert all(verdicts[c["id"]] == "unchanged" for c in cases if c["technique"] == "kv_cache")
    assert md.read_text().startswith("## gpubench compare: ")
    same = _gate(two_real_runs[0], two_real_runs[0], "--threshold", CPU_THRESHOLD, "--markdown", md)
    assert same.exit_code == 0 and "PASS" in same.output and md.read_text().startswith("## gpubench compare: ✅")


def test_optimized_samples_scaled_by_2_fail_the_gate(two_real_runs, tmp_path):
    # x2, beyond the 25% CPU threshold by far: the gate's p is the bootstrap's of the CI it prints
    # (issue 34), read from medians. Under load (4 jobs on 2 cores: the samples' log spread 0.8), a
    # x1.3 copy of 50 samples read +30% [+0.2, +67.5], p 0.048 (flash_attention) and p 0.0024
    # (paged_attention): not shown real at p < 0.002 (the Mann-Whitney p before: 0.0056, 5e-5).
    doc = json.loads((two_real_runs[0] / "results.json").read_text())
    slow = copy.deepcopy(doc)
    for case in slow["cases"]:
        for v in case["variants"].values():
            if v["role"] == "optimized":
                v["samples_s"] = [x * 2.0 for x in v["samples_s"]]
    path = tmp_path / "slow.json"
    path.write_text(json.dumps(slow))
    result = _gate(two_real_runs[0], path, "--threshold", CPU_THRESHOLD)
    assert result.exit_code == 1, result.output
    assert "regressed" in result.output


def test_kv_cache_is_gated_on_bytes_not_time(two_real_runs, tmp_path):
    doc = json.loads((two_real_runs[0] / "results.json").read_text())
    grown = copy.deepcopy(doc)
    case = next(c for c in grown["cases"] if c["technique"] == "kv_cache")
    case["variants"][role_variant(case, "optimized")]["samples_s"] = [
        x * 10 for x in case["variants"][role_variant(case, "optimized")]["samples_s"]
    ]
    result = compare.compare(doc, grown)
    change = next(c for c in result.changes if c.case_id == case["id"])
    assert change.verdict == "unchanged" and "bytes_reserved" in change.reason  # time is not its figure
    case["variants"][role_variant(case, "optimized")]["metrics"]["bytes_reserved"] *= 1.5
    change = next(c for c in compare.compare(doc, grown).changes if c.case_id == case["id"])
    assert change.verdict == "regressed" and change.ratio == pytest.approx(1.5)


def test_a_correctness_failure_in_current_fails_the_gate(two_real_runs, tmp_path):
    doc = json.loads((two_real_runs[1] / "results.json").read_text())
    doc["cases"][0]["status"] = "failed"
    doc["cases"][0]["failure"] = {"kind": "check", "message": "optimized optimized: check failed (rel_l2 0.3 > 1e-05)"}
    path = tmp_path / "wrong.json"
    path.write_text(json.dumps(doc))
    result = _gate(two_real_runs[0], path, "--threshold", CPU_THRESHOLD)
    assert result.exit_code == 1 and "failed" in result.output


def test_baseline_store_round_trip(two_real_runs, tmp_path):
    from click.testing import CliRunner

    from gpubench.cli import main

    store = tmp_path / "store"
    saved = CliRunner().invoke(main, ["baseline", "save", str(two_real_runs[0]), "--baseline-dir", str(store)])
    assert saved.exit_code == 0, saved.output
    files = list(store.glob("*/gate-test.json"))
    assert len(files) == 1 and files[0].parent.name.startswith("CPU-")
    # The stored copy is the run itself: the round trip must pass whatever the machine's drift.
    result = _gate("--baseline-store", store, two_real_runs[0], "--threshold", CPU_THRESHOLD)
    assert result.exit_code == 0, result.output
    assert str(files[0]) in result.output  # it said which stored baseline it used


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["/no/such/run"], "compare: give BASELINE and CURRENT"),
        (["/no/such/a", "/no/such/b"], "no such file"),
        (["--threshold", "fast", "x", "y"], None),
    ],
)
def test_gate_bad_input_exits_2(args, fragment, tmp_path):
    result = _gate(*args)
    assert result.exit_code == 2 and "Traceback" not in result.output
    if fragment:
        assert fragment in result.output


def test_a_slowdown_the_control_shows_too_is_inconclusive_not_a_regression():
    rng = np.random.default_rng(6)
    s = list(rng.normal(1.0, 0.005, 25))
    base = _doc(cases=[_case("a", s)])
    both_slow = _case("a", [v * 1.4 for v in s])  # optimized and baseline variants both 40% slower
    result = compare.compare(base, _doc(cases=[both_slow]))
    assert result.changes[0].verdict == "inconclusive" and "machine changed" in result.changes[0].reason
    assert result.passed and not compare.compare(base, _doc(cases=[both_slow]), strict=True).passed
    only_opt = _case("a", s)
    only_opt["variants"][role_variant(only_opt, "optimized")]["samples_s"] = [v * 1.4 for v in s]
    assert compare.compare(base, _doc(cases=[only_opt])).changes[0].verdict == "regressed"


def test_a_stored_schema_1_baseline_is_compared_by_role_with_a_run_whose_variants_are_named():
    # Schema 1 named variants by role; schema 2 by what they run. The gate pairs them by role.
    rng = np.random.default_rng(5)
    s = list(rng.normal(1.0, 0.005, 25))
    old = _doc(cases=[_case("a", s)])
    renamed = {
        "id": "a",
        "technique": "t",
        "status": "passed",
        "failure": None,
        "variants": {
            "eager": {"role": "baseline", "samples_s": list(s)},
            "triton": {"role": "optimized", "samples_s": [x * 1.5 for x in s]},
        },
    }
    new = {**_doc(cases=[renamed]), "schema_version": 2}
    change = compare.compare(old, new).changes[0]
    assert change.verdict == "regressed" and change.ratio == pytest.approx(1.5, rel=0.01)
    assert change.variant == "optimized -> triton" and change.context.variant == "eager"


# -- every branch of the gate's decision (issue 25 A.3: an interrupted case once passed as "no samples")

from gpubench.reports import gate as gate_report  # noqa: E402

# What each verdict does to the gate: fails by default, with --allow-missing, with --strict. A new
# verdict must be added here (the test below checks the table covers compare.ORDER).
FAILS = {  # verdict: (default, --allow-missing, --strict)
    "regressed": (True, True, True),
    "failed": (True, True, True),
    "missing": (True, False, True),
    "no_samples": (True, True, True),
    "inconclusive": (False, False, True),
    "improved": (False, False, False),
    "unchanged": (False, False, False),
    "new": (False, False, False),
}


def _comparison(verdict, **kw):
    meta = compare.Side(run_id="r", device_label="CPU: test")
    return compare.Comparison(
        meta, meta, [compare.Change("a", "t", verdict)], kw.get("allow_missing", False), [], kw.get("strict", False)
    )


@pytest.mark.parametrize("verdict", compare.ORDER)
def test_each_verdict_passes_or_fails_the_gate_as_documented_in_exit_code_headline_and_markdown(verdict):
    assert set(FAILS) == set(compare.ORDER)
    for fails, options in zip(FAILS[verdict], ({}, {"allow_missing": True}, {"strict": True})):
        comp = _comparison(verdict, **options)
        assert comp.exit_code == (1 if fails else 0), (verdict, options)
        assert gate_report.headline(comp).startswith("FAIL" if fails else "PASS"), (verdict, options)
        assert gate_report.to_markdown(comp).startswith(f"## gpubench compare: {'❌' if fails else '✅'}")
        assert comp.to_dict()["passed"] is (not fails)


def _ci(ratio, low, high):
    return stats.RatioCI(ratio, low, high)


@pytest.mark.parametrize(
    "ci,p,expected",
    [
        (_ci(1.20, 1.10, 1.30), 0.5, "regressed"),  # the whole CI beyond +5%
        (_ci(1.20, 1.01, 1.40), 0.001, "regressed"),  # CI reaches in, but p < 0.002 and the median beyond
        (_ci(1.20, 1.01, 1.40), 0.01, "unchanged"),  # beyond, but not shown to be real
        (_ci(1.04, 1.03, 1.05), 1e-9, "unchanged"),  # real, but within the threshold
        (_ci(0.80, 0.75, 0.85), 0.5, "improved"),
        (_ci(0.80, 0.70, 0.97), 0.001, "improved"),
        (_ci(0.80, 0.70, 0.97), 0.01, "unchanged"),
        (_ci(0.96, 0.955, 0.965), 1e-9, "unchanged"),  # 1/1.05 = 0.952: within the threshold
    ],
)
def test_verdict_of_each_branch(ci, p, expected):
    assert compare.verdict_of(ci, p, 0.05) == expected


def _timed(case_id, samples, status="passed", failure=None, opt_samples=None):
    case = _case(case_id, samples, status=status)
    case["failure"] = failure
    if opt_samples is not None:
        case["variants"]["optimized"]["samples_s"] = list(opt_samples)
    return case


SAMPLES = list(np.random.default_rng(7).normal(1.0, 0.005, 25))


@pytest.mark.parametrize(
    "status,message,fragment",
    [
        ("interrupted", "stopped by Ctrl-C", "case interrupted (stopped by Ctrl-C)"),
        ("interrupted", "stopped by SIGTERM", "case interrupted (stopped by SIGTERM)"),
        ("failed", "optimized fails: check failed", "optimized fails: check failed"),
        ("running", None, "case running"),
    ],
)
def test_a_current_case_that_did_not_pass_fails_the_gate_even_with_every_sample(status, message, fragment):
    # An interrupted case keeps the samples it took: they must not make it a pass.
    failure = {"kind": status, "message": message} if message else None
    comp = compare.compare(
        _doc(cases=[_timed("a", SAMPLES)]),
        _doc(cases=[_timed("a", SAMPLES, status=status, failure=failure)]),
        allow_missing=True,
    )
    assert [(c.verdict, c.reason) for c in comp.changes] == [("failed", fragment)]
    assert comp.exit_code == 1 and gate_report.headline(comp).startswith("FAIL: 1 failed")


@pytest.mark.parametrize("status", ["interrupted", "failed"])
def test_a_case_the_baseline_did_not_pass_cannot_be_gated_and_fails(status):
    # Its samples (an interrupted case keeps those it took) are no reference.
    base = _doc(cases=[_timed("a", SAMPLES, status=status, failure={"kind": status, "message": "stopped by Ctrl-C"})])
    comp = compare.compare(base, _doc(cases=[_timed("a", SAMPLES)]))
    change = comp.changes[0]
    assert change.verdict == "no_samples" and change.reason.startswith("in the baseline, ")
    assert "nothing to compare with" in change.reason
    assert comp.exit_code == 1 and gate_report.headline(comp).startswith("FAIL: 1 no samples")


@pytest.mark.parametrize("side", ["baseline", "current"])
def test_a_case_without_samples_on_either_side_fails_the_gate(side):
    empty = _timed("a", SAMPLES, opt_samples=[])
    base, cur = (empty, _timed("a", SAMPLES)) if side == "baseline" else (_timed("a", SAMPLES), empty)
    comp = compare.compare(_doc(cases=[base]), _doc(cases=[cur]), allow_missing=True)
    assert (
        comp.changes[0].verdict == "no_samples"
        and f"in the {side if side == 'baseline' else 'current run'}" in comp.changes[0].reason
    )
    assert not comp.passed


def test_a_pytest_benchmark_file_saved_without_its_raw_times_fails_rather_than_passing_ungated(tmp_path):
    path = tmp_path / "b.json"
    path.write_text(
        json.dumps(
            {
                "machine_info": {"cpu": {"brand_raw": "Test CPU"}},
                "benchmarks": [
                    {"name": "t", "fullname": "b.py::t", "group": "g", "stats": {"median": 1e-3, "rounds": 20}}
                ],
            }
        )
    )
    doc = compare.load_any(path)
    comp = compare.compare(doc, doc)
    assert comp.changes[0].verdict == "no_samples" and comp.exit_code == 1


def _gated(value):
    case = _timed("a", SAMPLES)
    case["gate_metric"] = "bytes_reserved"
    if value is not None:
        case["variants"]["optimized"]["metrics"] = {"bytes_reserved": value}
    return case


@pytest.mark.parametrize(
    "before,after,verdict",
    [
        (1000, 1000, "unchanged"),
        (1000, 1200, "regressed"),
        (1000, 800, "improved"),
        (1000, 1040, "unchanged"),  # exact, but within the 5% threshold
        (None, 1000, "no_samples"),
        (1000, None, "no_samples"),
        (0, 1000, "no_samples"),
    ],
)
def test_a_technique_gated_on_its_own_figure_takes_each_branch(before, after, verdict):
    comp = compare.compare(_doc(cases=[_gated(before)]), _doc(cases=[_gated(after)]))
    assert comp.changes[0].verdict == verdict
    assert comp.passed is (verdict in ("unchanged", "improved"))


def test_an_improvement_the_control_shows_too_is_inconclusive():
    both_fast = _case("a", [v * 0.6 for v in SAMPLES])
    comp = compare.compare(_doc(cases=[_case("a", SAMPLES)]), _doc(cases=[both_fast]))
    assert comp.changes[0].verdict == "inconclusive" and comp.passed


def _unfinished(doc, status, planned=53, reason=None):
    doc = {**doc, "status": status, "planned_cases": planned}
    if reason:
        doc["abort_reason"] = reason
    return doc


@pytest.mark.parametrize(
    "status,fragment",
    [
        ("interrupted", "status interrupted (stopped by SIGTERM)"),
        ("running", "still 'running': the process was killed"),
        ("aborted", "status aborted (the disk is full"),
    ],
)
def test_a_current_run_that_never_completed_fails_the_gate_even_with_allow_missing_or_force(status, fragment):
    reason = {"interrupted": "stopped by SIGTERM", "aborted": "the disk is full"}.get(status)
    base = _doc(cases=[_timed(x, SAMPLES) for x in "abc"])
    cur = _unfinished(_doc(cases=[_timed("a", SAMPLES)]), status, planned=3, reason=reason)
    for options in ({}, {"allow_missing": True}, {"allow_missing": True, "force": True}):
        comp = compare.compare(base, cur, **options)
        assert comp.exit_code == 1, options
        assert comp.unfinished == ["current"] and fragment in comp.problems[0]
        assert "1 case recorded of 3 planned" in comp.problems[0]
        assert gate_report.headline(comp).startswith("FAIL: the current run never completed; ")
        assert "fails the gate" in gate_report.to_markdown(comp) and fragment in gate_report.to_markdown(comp)
        missing = [c for c in comp.changes if c.verdict == "missing"]
        assert len(missing) == 2 and all("stopped before it" in c.reason for c in missing)
    assert compare.compare(base, {**cur, "status": "complete"}, allow_missing=True).passed  # the control


def test_a_baseline_that_never_completed_fails_the_gate_unless_forced():
    base = _unfinished(_doc(cases=[_timed("a", SAMPLES)]), "interrupted", planned=2)
    cur = _doc(cases=[_timed("a", SAMPLES), _timed("b", SAMPLES)])
    comp = compare.compare(base, cur)
    assert comp.exit_code == 1 and comp.unfinished == ["baseline"] and "--force" in comp.problems[0]
    assert {c.case_id: c.verdict for c in comp.changes} == {"a": "unchanged", "b": "new"}
    forced = compare.compare(base, cur, force=True)
    assert forced.passed and any("baseline run never completed" in m for m in forced.forced)


def test_the_cli_gate_says_a_killed_current_run_never_completed_with_allow_missing(tmp_path):
    # A run killed mid-way: results.json still 'running', the finished cases in cases.jsonl.
    from gpubench.records import results

    base = tmp_path / "base.json"
    base.write_text(json.dumps({**_doc(cases=[_timed(x, SAMPLES) for x in "abc"]), "status": "complete"}))
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(_unfinished(_doc(), "running", planned=3)))
    (run / results.CASES_LOG).write_text(json.dumps({"index": 0, **_timed("a", SAMPLES)}) + "\n")
    out = _gate(base, run, "--allow-missing")
    assert out.exit_code == 1, out.output
    assert "FAIL: the current run never completed" in out.output and "1 case recorded of 3 planned" in out.output


# -- a case whose baseline variant moved is judged by its optimized/baseline ratio (issue 27)


def _pair_case(base_variant, optimized):
    return {
        "id": "a",
        "technique": "t",
        "status": "passed",
        "failure": None,
        "variants": {
            "baseline": {"role": "baseline", "samples_s": list(base_variant)},
            "optimized": {"role": "optimized", "samples_s": list(optimized)},
        },
    }


def _rounds(rng, n, tail=0.25):
    """Per-round machine factors like this CPU's: most rounds near 1, a quarter 20-40% slow; the two
    variants of a round share it (they were timed back to back)."""
    slow = rng.random(n) < tail
    return np.where(slow, rng.uniform(1.2, 1.4, n), 1.0) * rng.normal(1.0, 0.01, n)


# Five rounds a side (speculative_decoding's smoke policy), fitted so that the gate prints issue 27's
# figures: (baseline variant "plain", optimized variant "draft_verify") samples, seconds.
ISSUE_27_SAMPLES = {
    "baseline_run": ([0.0905, 0.0899, 0.0912, 0.0893, 0.0908], [0.0701, 0.0688, 0.0712, 0.0695, 0.0706]),
    "current_run": ([0.08144, 0.1034, 0.10435, 0.1067, 0.11225], [0.07401, 0.07907, 0.07966, 0.07935, 0.0825]),
}


def test_the_issue_27_case_whose_baseline_variant_moved_as_far_is_inconclusive_not_regressed():
    # issue 27's speculative_decoding k=2: the optimized variant +13.2% [+5.6, +17.7], its baseline
    # variant +15.3% in the same runs, but with a CI reaching below no change (5 heavy-tailed samples),
    # which the old rule required to exclude it: the case escaped as "regressed".
    base, cur = ISSUE_27_SAMPLES["baseline_run"], ISSUE_27_SAMPLES["current_run"]
    change = compare.compare(_doc(cases=[_pair_case(*base)]), _doc(cases=[_pair_case(*cur)])).changes[0]
    assert gate_report._change(change) == "+13.2% [+5.6, +17.7]"
    assert gate_report._context(change) == "+15.3%" and change.context.ci_low < 1.0  # the escape
    assert change.verdict == "inconclusive", change.reason
    assert "baseline variant moved +15.3% too" in change.reason and "optimized/baseline ratio moved" in change.reason


def test_a_regression_of_the_optimized_variant_alone_is_regressed_while_the_baseline_variant_is_steady():
    rng = np.random.default_rng(11)
    base = [1.0 * rng.normal(1, 0.01, 25), rng.normal(1, 0.01, 25)]
    cur = [1.0 * rng.normal(1, 0.01, 25), 1.2 * rng.normal(1, 0.01, 25)]
    change = compare.compare(_doc(cases=[_pair_case(*base)]), _doc(cases=[_pair_case(*cur)])).changes[0]
    assert change.verdict == "regressed" and change.context.relative_ratio is None  # judged on its own


@pytest.mark.parametrize(
    "machine,ratio_change,verdict",
    [
        (1.25, 1.3, "regressed"),
        (0.8, 1 / 1.3, "improved"),
        (1.25, 1.02, "inconclusive"),
        (0.8, 0.98, "inconclusive"),
        # measured A/A on this machine: the baseline variant +35%, the ratio +11% with a clear CI; a
        # machine change moves the ratio too, so it must go beyond half the machine's move to count
        (1.35, 1.113, "inconclusive"),
    ],
)
def test_when_the_baseline_variant_moved_too_the_optimized_baseline_ratio_decides(machine, ratio_change, verdict):
    # The machine ran 25% slower (or faster) in the current run, both variants; on top of that the
    # optimized variant lost or gained ground on the baseline variant by ratio_change. Each round's
    # noise is shared by its two variants, as the interleaved timing makes it.
    rng = np.random.default_rng(12)
    r_base, r_cur = _rounds(rng, 30), _rounds(rng, 30)
    own = lambda: rng.normal(1.0, 0.01, 30)  # each variant's own, unshared noise
    base = [r_base * own(), 0.5 * r_base * own()]
    cur = [machine * r_cur * own(), machine * 0.5 * ratio_change * r_cur * own()]
    change = compare.compare(_doc(cases=[_pair_case(*base)]), _doc(cases=[_pair_case(*cur)])).changes[0]
    assert change.verdict == verdict, change.reason
    assert change.context.relative_ratio == pytest.approx(ratio_change, rel=0.03)
    assert "baseline variant moved" in change.reason


def test_interleaved_rounds_are_resampled_together_so_shared_noise_cancels_in_the_ratio():
    # A/A on a machine whose speed wanders ~15% from round to round, both variants of a round alike:
    # the relative ratio's CI stays within a few percent, where resampling each variant on its own
    # (what unequal sample counts force) spreads it over the wander.
    rng = np.random.default_rng(13)
    r_base, r_cur = np.exp(rng.normal(0, 0.15, 30)), np.exp(rng.normal(0, 0.15, 30))
    own = lambda n: rng.normal(1.0, 0.01, n)  # each variant's own, unshared noise
    opt_base, opt_cur = 0.5 * r_base * own(30), 0.5 * r_cur * own(30)
    paired = stats.relative_ratio_ci(opt_base, r_base, opt_cur, r_cur)
    assert paired.ci_low > 0.97 and paired.ci_high < 1.03
    unpaired = stats.relative_ratio_ci(opt_base[:29], r_base, opt_cur[:29], r_cur)
    assert unpaired.ci_high - unpaired.ci_low > 3 * (paired.ci_high - paired.ci_low)


def test_a_run_with_one_round_under_load_cannot_make_the_ratio_regress():
    # Measured on this machine (A/A, issue 27): under load a run took one round of moe_grouping,
    # both variants ~400x slower; one sample gives the ratio a CI of no width, which is no evidence.
    rng = np.random.default_rng(14)
    r_base = _rounds(rng, 30)
    base = [r_base, 0.5 * r_base]
    cur = [[400.0], [0.5 * 400.0 * 1.36]]  # the optimized/baseline ratio 36% worse, from one round
    change = compare.compare(_doc(cases=[_pair_case(*base)]), _doc(cases=[_pair_case(*cur)])).changes[0]
    # Judged inconclusive before the ratio is read: one sample a side has no CI at all (issue 34).
    assert change.verdict == "inconclusive" and "too few samples to judge: 30 in the baseline, 1 now" in change.reason


def _machine_and_code(machine: float, optimized: float, rounds: int = 30, seed: int = 16):
    """A pair case in two runs of interleaved rounds (each round's noise shared by its two variants):
    in the current run the machine's speed x ``machine`` (both variants) and the optimized variant's
    time x ``optimized`` in all (so its ratio to the baseline variant x optimized / machine)."""
    rng = np.random.default_rng(seed)
    r_base, r_cur = _rounds(rng, rounds), _rounds(rng, rounds)
    own = lambda: rng.normal(1.0, 0.01, rounds)  # each variant's own, unshared noise
    base = [r_base * own(), 0.5 * r_base * own()]
    cur = [machine * r_cur * own(), optimized * 0.5 * r_cur * own()]
    return compare.compare(_doc(cases=[_pair_case(*base)]), _doc(cases=[_pair_case(*cur)])).changes[0]


def test_a_regression_a_faster_machine_hides_is_regressed_by_its_ratio():
    # Issue 34: the baseline variant x0.90, the optimized x0.99 (the ratio +10%): the optimized
    # variant's own time read "unchanged", and the baseline variant's move only ever demoted a verdict.
    change = _machine_and_code(0.90, 0.99)
    assert change.ratio == pytest.approx(0.99, abs=0.03)  # its own time did not move beyond 5%
    assert change.verdict == "regressed", change.reason
    assert change.context.relative_ratio == pytest.approx(1.10, rel=0.03) and change.context.relative_ci_low > 1.05
    assert (
        "optimized/baseline ratio moved +" in change.reason
        and "the ratio decides, not the optimized variant's own" in change.reason
    )
    assert compare.Comparison(compare.Side(), compare.Side(), [change], False, []).exit_code == 1


def test_the_mirror_a_gain_a_slower_machine_hides_is_improved_by_its_ratio():
    change = _machine_and_code(1.12, 1.0)
    assert change.verdict == "improved", change.reason
    assert change.context.relative_ratio == pytest.approx(1 / 1.12, rel=0.03)


def test_a_slowdown_the_machine_more_than_explains_is_improved_when_the_ratio_clearly_says_so():
    # the machine 30% slower, the optimized variant 15%: the ratio -11.5%, beyond the threshold and
    # moved against the machine (before: inconclusive, the ratio only consulted to demote)
    change = _machine_and_code(1.30, 1.15)
    assert change.ratio > 1.05 and change.verdict == "improved", change.reason


@pytest.mark.parametrize("machine", [0.90, 1.0, 1.10, 1.35])
def test_a_machine_that_moved_both_variants_alike_is_never_regressed_or_improved(machine):
    assert _machine_and_code(machine, machine).verdict in ("unchanged", "inconclusive")


def test_a_ratio_move_within_half_the_machine_s_move_raises_nothing():
    # the machine 35% slower, the ratio +8% its way: within what half its move does to unchanged code
    assert _machine_and_code(1.35, 1.35 * 1.08).verdict == "inconclusive"


def test_a_ratio_read_from_too_few_samples_raises_nothing():
    # 4 rounds a run (a loaded machine's time cap): fewer than MIN_SAMPLES_FOR_RATIO, no raise (and,
    # under stats.MIN_CI_SAMPLES, no verdict at all: inconclusive, never regressed or improved)
    change = _machine_and_code(0.90, 0.99, rounds=compare.MIN_SAMPLES_FOR_RATIO - 1)
    assert change.verdict == "inconclusive" and "too few samples" in change.reason
    assert change.context is None or change.context.relative_ratio is None


def _load_script(name):
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_false_alarm_count_compares_each_run_with_the_one_before_it(tmp_path, capsys):
    rng = np.random.default_rng(15)
    runs = []
    for i, scale in enumerate([1.0, 1.0, 1.3]):  # the third run's optimized variant really 30% slower
        r = _rounds(rng, 30)
        path = tmp_path / f"run{i}.json"
        path.write_text(json.dumps(_doc(cases=[_pair_case(r, 0.5 * scale * r)])))
        runs.append(str(path))
    script = _load_script("gate_false_alarms")
    assert script.main(runs + ["--json", str(tmp_path / "out.json")]) == 0
    out = json.loads((tmp_path / "out.json").read_text())
    assert [row["passed"] for row in out["pairs"]] == [True, False] and out["totals"]["regressed"] == 1
    assert "the gate failed 1 of 2 pairs" in capsys.readouterr().out
    assert script.main(runs[:1]) == 2 and script.main([runs[0], str(tmp_path / "none")]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_the_gate_table_shows_a_bracketed_case_id_as_text_not_markup():
    """A case id such as "kv_cache[model=...]" or a pytest-benchmark name "test_x[full-eager]" starts
    like a rich tag: the table prints it whole."""
    import io

    from rich.console import Console

    from gpubench.gate.compare import Change, Comparison
    from gpubench.reports import gate as gate_report

    changes = [
        Change("kv_cache[model=llama-3.1-8b]", "kv_cache", "unchanged", "paged", 1e-3, 1e-3, 1.0, 0.99, 1.01),
        Change(
            "test_bench_techniques.py::test_technique[flash_attention-full-eager]",
            "flash_attention",
            "unchanged",
            None,
            1e-3,
            1e-3,
            1.0,
            0.99,
            1.01,
        ),
    ]
    out = io.StringIO()
    side = compare.Side(run_id="r", scenario="s", device_label="CPU")
    gate_report.print_table(
        Comparison(side, side, changes, allow_missing=False, forced=[]), Console(file=out, width=300)
    )
    assert "kv_cache[model=llama-3.1-8b]" in out.getvalue()
    assert "test_technique[flash_attention-full-eager]" in out.getvalue()


# -- the gate reads typed records, from either source (issue 26, point 2)


def _bench_json(path, data, **extra):
    path.write_text(
        json.dumps(
            {
                "machine_info": {"node": "bench-host", "cpu": {"brand_raw": "Test CPU"}},
                "commit_info": {"id": "abc123", "branch": "main", "dirty": False},
                "datetime": "2026-12-05T01:00:00",
                "benchmarks": [
                    {
                        "name": "test_x[k=2]",
                        "fullname": "b.py::test_x[k=2]",
                        "group": "g",
                        "params": {"k": 2},
                        "stats": {"median": float(np.median(data)), "rounds": len(data), "data": list(data)},
                    }
                ],
                **extra,
            }
        )
    )
    return path


def test_pytest_benchmark_json_is_read_into_a_run_record_with_its_samples_device_and_commit(tmp_path):
    """pytest-benchmark JSON becomes the records a gpubench run is read into: each benchmark a passed
    case with its raw times as the optimized variant's samples, the machine's CPU as the device, the
    file's commit, host and time in the run."""
    from gpubench.records.results import CaseRecord, VariantRecord

    data = list(np.random.default_rng(20).normal(1e-3, 1e-5, 12))
    run = compare.load_any(_bench_json(tmp_path / "0001_x.json", data))
    assert isinstance(run, RunRecord) and run.source == "pytest-benchmark" and run.status == "complete"
    assert (
        run.device_label == "CPU: Test CPU"
        and run.run_id.startswith("0001_x-")
        and run.path == str(tmp_path / "0001_x.json")
    )
    assert run.env["host"] == "bench-host" and run.env["git"] == {"commit": "abc123", "branch": "main", "dirty": False}
    assert run.started_at == "2026-12-05T01:00:00"
    (case,) = run.cases
    assert isinstance(case, CaseRecord) and (case.id, case.technique, case.params, case.passed) == (
        "b.py::test_x[k=2]",
        "g",
        {"k": 2},
        True,
    )
    variant = case.variant(case.role_variant("optimized"))
    assert isinstance(variant, VariantRecord) and variant.samples_s == data and variant.median_s == np.median(data)


def test_the_gate_compares_records_of_either_source_as_it_compares_their_documents(tmp_path):
    """compare takes RunRecords (what load_any gives for a results.json and for pytest-benchmark
    JSON) and gives the verdicts and figures it gives for the same runs as documents, with the
    JSON keys ``compare --json`` has always had (a CI parses them)."""
    rng = np.random.default_rng(21)
    s = list(rng.normal(1.0, 0.005, 25))
    base_doc = _doc(cases=[_case("a", s), _case("b", s)])
    cur_doc = _doc(cases=[_case("a", s, optimized_scale=1.3), _case("b", s)])
    (tmp_path / "base.json").write_text(json.dumps(base_doc))
    (tmp_path / "cur.json").write_text(json.dumps(cur_doc))
    base, cur = compare.load_any(tmp_path / "base.json"), compare.load_any(tmp_path / "cur.json")
    assert isinstance(base, RunRecord) and isinstance(cur, RunRecord)
    typed, documents = compare.compare(base, cur), compare.compare(base_doc, cur_doc)
    assert [c.to_dict() for c in typed.changes] == [c.to_dict() for c in documents.changes]
    assert {c.case_id: c.verdict for c in typed.changes} == {"a": "regressed", "b": "unchanged"}
    assert set(typed.to_dict()) == {
        "passed",
        "baseline",
        "current",
        "counts",
        "forced",
        "strict",
        "problems",
        "unfinished",
        "changes",
    }
    assert typed.to_dict()["current"] == {
        "run_id": "r",
        "scenario": "s",
        "device_label": "CPU: test",
        "source": "gpubench",
        "path": None,
    }
    change = typed.to_dict()["changes"][0]
    assert set(change) == {
        "case_id",
        "technique",
        "verdict",
        "variant",
        "baseline_median_s",
        "current_median_s",
        "ratio",
        "ci_low",
        "ci_high",
        "p_value",
        "threshold",
        "reason",
        "context",
        "device",
        "time_basis",
        "n",
    }  # the clock, the fewer samples (keys are added, never taken away)
    assert set(change["context"]) == {"variant", "ratio", "ci_low", "ci_high"}  # not judged by the ratio
    both_slow = compare.compare(base, _doc(cases=[_case("a", [x * 1.4 for x in s]), _case("b", s)]))
    assert set(both_slow.to_dict()["changes"][0]["context"]) == {
        "variant",
        "ratio",
        "ci_low",
        "ci_high",
        "relative_ratio",
        "relative_ci_low",
        "relative_ci_high",
    }
    data = list(rng.normal(1e-3, 1e-5, 20))
    bench = compare.compare(
        compare.load_any(_bench_json(tmp_path / "a.json", data)),
        compare.load_any(_bench_json(tmp_path / "b.json", [x * 1.4 for x in data])),
    )
    assert [(c.case_id, c.verdict) for c in bench.changes] == [("b.py::test_x[k=2]", "regressed")]
    assert bench.to_dict()["baseline"]["source"] == "pytest-benchmark"


@pytest.mark.parametrize("command", ["compare", "baseline"])
def test_a_results_file_of_another_schema_version_is_refused_with_exit_2_naming_the_file(tmp_path, command):
    """A results.json of a schema version this gpubench does not read gets the one-paragraph error
    (the file, its version, the versions read), exit 2, no traceback: from compare and baseline save."""
    from click.testing import CliRunner

    from gpubench.cli import main

    good = tmp_path / "good.json"
    good.write_text(json.dumps(_doc(cases=[_case("a", SAMPLES)])))
    future = tmp_path / "future" / "results.json"
    future.parent.mkdir()
    future.write_text(json.dumps({**_doc(cases=[_case("a", SAMPLES)]), "schema_version": 99}))
    args = (
        ["compare", str(good), str(future.parent)]
        if command == "compare"
        else ["baseline", "save", str(future.parent), "--baseline-dir", str(tmp_path / "store")]
    )
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert str(future) in result.output and "schema_version is 99" in result.output
    assert "reads versions 1, 2, 3" in result.output
    assert not (tmp_path / "store").exists()


def test_baseline_save_stores_the_run_as_read_and_the_gate_reads_it_back_as_the_same_records(tmp_path):
    """baseline save writes the record it read (typed): the stored file read back holds the same
    cases, samples and verdict-relevant fields, so the run against its own stored copy passes."""
    from click.testing import CliRunner

    from gpubench.cli import main

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cases = [_case("a", SAMPLES), {**_gated(1000), "id": "kv"}]
    (run_dir / "results.json").write_text(json.dumps({**_doc(cases=cases), "schema_version": 2}))
    saved = CliRunner().invoke(main, ["baseline", "save", str(run_dir), "--baseline-dir", str(tmp_path / "store")])
    assert saved.exit_code == 0, saved.output
    run = compare.load_any(run_dir)
    stored = compare.load_any(tmp_path / "store" / "CPU-test" / "s.json")
    assert stored.schema_version == 2 and stored.cases == run.cases and stored.scenario == run.scenario
    assert compare.compare(stored, run).passed


@pytest.mark.parametrize("breaks", ["scenario as text", "variants as a list"])
def test_a_results_file_with_a_value_of_the_wrong_type_is_exit_2_not_a_regression(tmp_path, breaks):
    """A file that parses but holds a scenario as text or variants as a list failed deep in the
    gate with a traceback and exit 1, which CI reads as a regression; it is bad input naming it."""
    from click.testing import CliRunner

    from gpubench.cli import main

    good = _doc(
        cases=[
            {
                "id": "t[n=1]",
                "technique": "t",
                "status": "passed",
                "params": {},
                "variants": {"fused": {"role": "optimized", "status": "ok", "samples_s": [1.0, 1.1, 0.9]}},
            }
        ]
    )
    bad = json.loads(json.dumps(good))
    if breaks == "scenario as text":
        bad["scenario"] = "s"
    else:
        bad["cases"][0]["variants"] = [1, 2]
    (tmp_path / "good.json").write_text(json.dumps(good))
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    out = CliRunner().invoke(main, ["compare", str(tmp_path / "good.json"), str(tmp_path / "bad.json")])
    assert out.exit_code == 2 and "bad.json" in out.output and "wrong type" in out.output
    assert "Traceback" not in out.output


# -- too few samples (issue 34) ------------------------------------------------------------------------
@pytest.mark.parametrize("base_n, cur_n", [(1, 1), (30, 1), (1, 30), (30, 4)])
def test_a_side_with_fewer_than_min_ci_samples_is_inconclusive_never_regressed(base_n, cur_n):
    """Three times slower from one timed call (or four) is no measurement: the gate says
    inconclusive, naming both counts, with the ratio and no CI; it passes unless --strict."""
    rng = np.random.default_rng(3)
    base = _doc(cases=[_case("a", list(rng.normal(1.0, 0.01, base_n)))])
    cur = _doc(cases=[_case("a", list(rng.normal(1.0, 0.01, cur_n)), optimized_scale=3.0)])
    result = compare.compare(base, cur)
    change = result.changes[0]
    assert change.verdict == "inconclusive" and change.ratio == pytest.approx(3.0, rel=0.05)
    assert change.ci_low is None and change.ci_high is None and change.p_value is None
    assert change.n == min(base_n, cur_n)
    assert f"too few samples to judge: {base_n} in the baseline, {cur_n} now" in change.reason
    assert result.passed and not compare.compare(base, cur, strict=True).passed


def test_the_gate_prints_the_count_where_it_has_no_ci():
    import re

    from gpubench.reports import gate

    rng = np.random.default_rng(3)
    comp = compare.compare(
        _doc(cases=[_case("a", list(rng.normal(1.0, 0.01, 20)))]), _doc(cases=[_case("a", [1.0], optimized_scale=3.0)])
    )
    assert re.search(r"\| \+200\.\d% \(n=1\) \|", gate.to_markdown(comp))
