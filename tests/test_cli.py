"""The command line: exit codes (0 pass, 1 failure, 2 bad input) and one-paragraph errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from gpubench.cli import main
from gpubench.records.results import role_variant


def invoke(*args, cwd=None):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result


def assert_bad_input(result, *fragments):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in result.output, result.output


def test_list_shows_techniques_params_defaults_and_scenarios():
    result = invoke("list")
    assert result.exit_code == 0
    out = result.output
    assert "flash_attention" in out and "head_dim" in out and "one of [32, 64, 96, 128, 192, 256]" in out
    assert "eager (baseline)" in out and "triton (optimized)" in out and "torch_tiled (optimized)" in out
    assert "smoke" in out and "gpu-quick" in out


def test_malformed_scenario_exits_2_with_file_line_and_key(write_scenario):
    path = write_scenario("name: x\nentries:\n  - technique: flash_attention\n    params: {head_dim: 80}\n")
    assert_bad_input(invoke("run", "--scenario", str(path)), f"{path}:4: flash_attention.head_dim: 80 is not one of")


def test_unknown_technique_in_only_exits_2():
    assert_bad_input(
        invoke("run", "--scenario", "smoke", "--only", "warp_drive"),
        "--only: 'warp_drive' is not a registered technique; allowed: ",
    )


def test_missing_scenario_exits_2():
    assert_bad_input(invoke("run", "--scenario", "/no/such/file.yaml"), "no such file", "shipped scenarios: ")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_cuda_asked_on_a_machine_without_it_exits_2():
    assert_bad_input(
        invoke("run", "--scenario", "smoke", "--device", "cuda"),
        "device 'cuda' was asked for, but no CUDA GPU is usable here",
        "Allowed: all, auto, cpu, cuda, cuda:N",
    )
    assert_bad_input(invoke("run", "--scenario", "gpu-quick"), "gpu-quick.yaml: device")


def test_unwritable_out_directory_exits_2(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert_bad_input(
        invoke("run", "--scenario", "smoke", "--out", str(blocker / "runs")),
        f"--out {blocker / 'runs'}: cannot create the run directory there",
    )


def test_bad_repeat_scale_exits_2():
    assert_bad_input(invoke("run", "--repeat-scale", "0"), "--repeat-scale: 0.0 is not valid")


def test_run_exit_codes_follow_case_outcomes(toys, write_scenario, tmp_path):
    # In this process (--isolation none): the exit code follows the outcomes whichever runs the
    # cases; worker processes have their own tests (test_supervisor.py, test_run_faults.py).
    ok = write_scenario("name: ok\nentries:\n  - technique: toy_kernel\n", name="ok.yaml")
    result = invoke(
        "run", "--scenario", str(ok), "--out", str(tmp_path / "runs"), "--no-calibrate", "--isolation", "none"
    )
    assert result.exit_code == 0, result.output
    assert "1 passed, 0 failed" in result.output and "run directory:" in result.output
    bad = write_scenario(
        "name: bad\nentries:\n  - technique: toy_kernel\n    params: {mode: [ok, optimized_wrong]}\n", name="bad.yaml"
    )
    result = invoke(
        "run", "--scenario", str(bad), "--out", str(tmp_path / "runs"), "--no-calibrate", "--isolation", "none"
    )
    assert result.exit_code == 1, result.output
    assert "1 passed, 1 failed" in result.output and "check failed" in result.output


def test_env_states_the_harness_overhead():
    result = invoke("env", "--json")
    assert result.exit_code == 0
    info = json.loads(result.output)
    assert 0 < info["harness_overhead_us"] < 100
    assert info["torch"] == torch.__version__ and "cpu" in info


@pytest.mark.e2e
@pytest.mark.timeout(1200)
def test_smoke_scenario_runs_from_any_directory_with_the_installed_command(tmp_path):
    # The console script, run outside the checkout: the shipped scenarios must be inside the package.
    # One cheap technique of it (kv_cache: allocations, no Triton interpreter), briefly, in its
    # worker process as a default run: what this protects is packaging and the run's outputs, not
    # speed; the limit is ~50x its normal 10 s so a loaded machine cannot fail it.
    exe = Path(sys.executable).with_name("gpubench")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "gpubench.cli"]
    proc = subprocess.run(
        cmd + ["run", "--scenario", "smoke", "--device", "cpu", "--only", "kv_cache", "--repeat-scale", "0.2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = next((tmp_path / "runs").iterdir())
    doc = json.loads((run_dir / "results.json").read_text())
    assert doc["status"] == "complete" and doc["summary"]["failed"] == 0 and doc["scenario"]["name"] == "smoke"
    kv = [c for c in doc["cases"] if c["technique"] == "kv_cache"]
    assert kv and len(kv) == len(doc["cases"])
    assert all(c["variants"][role_variant(c, "optimized")]["check"]["passed"] for c in kv)
    assert (run_dir / "report.html").is_file() and f"report: runs/{run_dir.name}/report.html" in proc.stdout
    assert "kv_cache" in proc.stdout and "passed" in proc.stdout


def test_calibration_measures_positive_ceilings_on_this_device():
    from gpubench.measure import env

    c = env.calibrate(torch.device("cpu"), quick=True)
    assert c["matmul"]["dtype"] == "float32" and c["matmul"]["peak_tflops"] > 0
    assert c["matmul"]["peak_tflops"] >= c["matmul"]["median_tflops"]
    assert c["copy"]["peak_gbps"] > 0 and c["harness_overhead_us"] > 0
