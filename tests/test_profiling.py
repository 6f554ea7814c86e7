"""Profiles (gpubench.measure.profiling): the profiler's counts agree with what the techniques count
themselves, traces are written and load, profiling never touches the timed repetitions, NVTX
ranges name case, variant and repetition, and the report shows the breakdown."""

import gzip
import json
import os

import pytest
import torch
from click.testing import CliRunner
from inprocess import run_in_process

from gpubench.cli import main
from gpubench.errors import BadInput
from gpubench.measure import profiling, timing
from gpubench.reports import html as html_report
from gpubench.run import scenario

FAST = "policy: {warmup_s: 0, min_reps: 3, max_reps: 3, min_time_s: 0, max_time_s: 0.5, target_iqr: 1.0, energy_s: 0}\n"
LAYERS = 3
PAIRS = f"""\
name: profiled
entries:
  - technique: moe_grouping
    params: {{experts: 6, top_k: 2, hidden: 16, expert_dim: 16, tokens: 40, dtype: float32}}
    policy: {{profile: true, profile_calls: 2}}
  - technique: packed_metadata
    params: {{model: tiny, layers: {LAYERS}, rows: 1, seq_len: 64, mean_doc_len: 16, dtype: float32, backend: sdpa}}
    policy: {{profile: true, profile_calls: 2}}
{FAST}"""


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory):
    """One small run of both pairs with profiles (about 10 s on 2 loaded cores)."""
    root = tmp_path_factory.mktemp("profiled")
    path = root / "pairs.yaml"
    path.write_text(PAIRS)
    outcome = run_in_process(scenario.load(path), torch.device("cpu"), root / "runs", calibrate=False)
    return outcome.run_dir, {c["technique"]: c for c in outcome.doc["cases"]}


def test_moe_grouping_profiler_sync_count_matches_the_techniques_own_count(profiled_run):
    _, cases = profiled_run
    case = cases["moe_grouping"]
    assert case["status"] == "passed"
    for name in ("where_loop", "sort_group"):
        v = case["variants"][name]
        assert v["profile"]["syncs_per_call"] == v["metrics"]["syncs_per_step"], (name, v["profile"]["sync_ops"])
    base, opt = (case["variants"][n]["profile"] for n in ("where_loop", "sort_group"))
    assert base["syncs_per_call"] > opt["syncs_per_call"] == 1
    assert base["sync_ops"]["aten::nonzero"] == base["syncs_per_call"] - 1  # one torch.where per expert hit


def test_packed_metadata_builds_metadata_once_per_step_cached_and_once_per_layer_otherwise(profiled_run):
    run_dir, cases = profiled_run
    case = cases["packed_metadata"]
    per_layer, cached = (case["variants"][n]["profile"] for n in ("per_layer", "cached"))
    # max_seqlen's .item(): one per build
    assert per_layer["sync_ops"] == {"aten::_local_scalar_dense": LAYERS}
    assert cached["sync_ops"] == {"aten::_local_scalar_dense": 1}
    assert per_layer["syncs_per_call"] == case["variants"]["per_layer"]["metrics"]["host_syncs_per_step"]

    def position_id_builds(profile):  # position_ids_of's running maximum, as the trace holds it
        events = profiling.load_trace(run_dir / profile["trace"])["traceEvents"]
        return sum(e.get("name") == "aten::_cummax_helper" for e in events) / profile["calls"]

    assert position_id_builds(per_layer) == LAYERS + 1  # RoPE's positions, then every layer
    assert position_id_builds(cached) == 1


def test_traces_are_gzipped_chrome_json_under_profiles(profiled_run):
    run_dir, cases = profiled_run
    for case in cases.values():
        for name, v in case["variants"].items():
            if v["status"] == "skipped":
                continue
            rel = v["profile"]["trace"]
            assert rel == f"profiles/{profiling.safe_name(case['id'])}/{name}.json.gz"
            raw = (run_dir / rel).read_bytes()
            assert raw[:2] == b"\x1f\x8b"  # gzip
            doc = json.loads(gzip.decompress(raw))
            calls = [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith(profiling.CALL_RANGE)]
            assert len(calls) == v["profile"]["calls"] == 2


def test_summary_has_every_figure_and_says_why_a_cpu_has_no_launches(profiled_run):
    _, cases = profiled_run
    p = cases["moe_grouping"]["variants"]["sort_group"]["profile"]
    assert p["time_basis"] == "cpu" and p["kernel_launches_per_call"] is None
    assert any("kernel launches" in n for n in p["notes"])
    assert 0 < len(p["top_ops"]) <= profiling.TOP_OPS
    assert abs(sum(op["share"] for op in p["top_ops"])) <= 1.0 + 1e-6
    assert p["ops_per_call"] > 0 and p["peak_memory_bytes"] > 0
    assert set(p["copies_per_call"]) == {"h2h"}


def test_report_shows_what_changed_with_trace_links_and_why(profiled_run, tmp_path):
    run_dir, _ = profiled_run
    written = html_report.write_report(run_dir)
    text = written.html.read_text()
    assert "What changed: profiles" in text
    assert 'href="profiles/moe_grouping' in text  # relative to report.html, beside the traces
    assert "why: syncs" in text
    assert "why: syncs" in written.markdown.read_text()
    elsewhere = html_report.write_report(run_dir, tmp_path / "r" / "report.html")  # -o: links reach back
    up = os.path.relpath(run_dir, elsewhere.html.parent)
    assert f'href="{up}/profiles/moe_grouping' in elsewhere.html.read_text()


def test_samples_are_all_taken_before_the_first_profiling_call(toys, write_scenario, tmp_path, monkeypatch):
    events = []
    real_time_call, real_profile = timing.Clock.time_call, profiling.profile_variant

    def timed(self, fn, *args, **kwargs):
        events.append("timed")
        return real_time_call(self, fn, *args, **kwargs)

    def profiled(*args, **kwargs):
        events.append("profile")
        return real_profile(*args, **kwargs)

    monkeypatch.setattr(timing.Clock, "time_call", timed)
    monkeypatch.setattr(profiling, "profile_variant", profiled)
    body = (
        "name: order\nentries:\n  - technique: toy_kernel\n    params: {n: 64}\npolicy: {profile: true, "
        "warmup_s: 0, min_reps: 3, max_reps: 3, min_time_s: 0, target_iqr: 1.0, energy_s: 0}\n"
    )
    doc = run_in_process(
        scenario.load(write_scenario(body)), torch.device("cpu"), tmp_path / "runs", calibrate=False
    ).doc
    ran = [v for v in doc["cases"][0]["variants"].values() if v["status"] != "skipped"]
    assert events.count("profile") == len(ran) >= 2
    assert "timed" not in events[events.index("profile") :]  # no repetition after profiling began
    assert all(len(v["samples_s"]) == 3 and "error" not in v["profile"] for v in ran)


def test_a_failing_profile_is_recorded_and_the_case_still_passes(toys, write_scenario, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("profiler unavailable")

    monkeypatch.setattr(profiling, "_profile", broken)
    body = "name: broken\nentries:\n  - technique: toy_kernel\n    params: {n: 16}\n    policy: {profile: true}\n"
    case = run_in_process(
        scenario.load(write_scenario(body)), torch.device("cpu"), tmp_path / "runs", calibrate=False
    ).doc["cases"][0]
    assert case["status"] == "passed"
    assert case["variants"]["optimized"]["profile"] == {"error": "RuntimeError: profiler unavailable"}


def test_nvtx_ranges_name_the_case_each_variant_and_each_repetition(toys, write_scenario, tmp_path, monkeypatch):
    pushed, depth = [], []
    monkeypatch.setattr(profiling, "nvtx_enabled", lambda device: True)
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: (pushed.append(name), depth.append(1)))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: depth.pop())
    body = "name: nvtx\nentries:\n  - technique: toy_kernel\n    params: {n: 16}\n"
    case = run_in_process(
        scenario.load(write_scenario(body)), torch.device("cpu"), tmp_path / "runs", calibrate=False
    ).doc["cases"][0]
    cid = case["id"]
    assert pushed[0] == cid and not depth  # every range pushed was popped
    for name, v in case["variants"].items():
        if v["status"] == "skipped":
            continue
        assert f"{cid}/{name}" in pushed
        assert [f"{name}#{i}" for i in range(len(v["samples_s"]))] == [
            p for p in pushed if p.startswith(f"{name}#") and "#w" not in p
        ]


def test_nvtx_is_not_touched_on_a_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: pytest.fail("pushed on a CPU"))
    with profiling.nvtx_range("x", torch.device("cpu")):
        pass


def test_profile_policy_keys_are_validated_and_absent_from_the_definition_by_default(toys, write_scenario):
    with pytest.raises(BadInput) as info:
        scenario.load(
            write_scenario("name: p\nentries:\n  - technique: toy_kernel\n    policy: {profile: yes please}\n")
        )
    assert "toy_kernel.policy.profile" in str(info.value) and "true or false" in str(info.value)
    with pytest.raises(BadInput) as info:
        scenario.load(write_scenario("name: p\npolicy: {profile_calls: 0}\nentries:\n  - technique: toy_kernel\n"))
    assert "policy.profile_calls" in str(info.value)
    assert "profile" not in timing.Policy().to_dict()  # runs from before profiles compare unchanged
    assert timing.Policy(profile=True).to_dict()["profile"] is True


def test_safe_name_keeps_case_ids_apart_and_short():
    long_a, long_b = "t[" + "x=1," * 100 + "a=1]", "t[" + "x=1," * 100 + "a=2]"
    assert profiling.safe_name("moe[experts=8,tokens=64]") == "moe_experts=8,tokens=64"
    assert profiling.safe_name(long_a) != profiling.safe_name(long_b)
    assert len(profiling.safe_name(long_a)) < 140 and "/" not in profiling.safe_name("a/../b")


def test_profile_command_prints_the_breakdown_and_writes_the_traces(toys, tmp_path):
    result = CliRunner().invoke(
        main, ["profile", "toy_kernel", "--param", "n=64", "--out", str(tmp_path), "--calls", "2"]
    )
    assert result.exit_code == 0, result.output
    assert "host syncs per call" in result.output and "ops per call" in result.output
    traces = list(tmp_path.glob("*-profile-toy_kernel/profiles/*/*.json.gz"))
    assert {t.name for t in traces} >= {"baseline.json.gz", "optimized.json.gz"}


def test_profile_command_refuses_bad_input_with_exit_2(toys, tmp_path):
    bad_param = CliRunner().invoke(main, ["profile", "toy_kernel", "--param", "n", "--out", str(tmp_path)])
    assert bad_param.exit_code == 2 and "--param" in bad_param.output and "KEY=VALUE" in bad_param.output
    unknown = CliRunner().invoke(main, ["profile", "no_such_pair", "--out", str(tmp_path)])
    assert unknown.exit_code == 2 and "not a registered technique" in unknown.output
    out_of_range = CliRunner().invoke(main, ["profile", "toy_kernel", "--param", "n=0", "--out", str(tmp_path)])
    assert out_of_range.exit_code == 2 and "toy_kernel.n" in out_of_range.output
