"""The supervisor and its worker processes: a hung native call, a segfault, an exit or an exception
each cost one case, never the run; several workers give the same results as one; a run killed
mid-way keeps what finished; Ctrl-C stops the workers and keeps what finished."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from held import held_scenario, stop, wait_for_file, wait_gone
from inprocess import run_in_process

from gpubench import techniques
from gpubench.cli import main
from gpubench.errors import BadInput
from gpubench.measure import hygiene
from gpubench.records import results
from gpubench.run import local_workers, run_options, scenario, supervisor
from gpubench.run.executor import kill_grace_s
from gpubench.run.outcome import EXIT_FAILED, EXIT_INTERRUPTED

PLUGINS = Path(__file__).parent / "plugins"
FAST = "policy: {warmup_s: 0, min_reps: 3, max_reps: 5, min_time_s: 0, max_time_s: 0.5, target_iqr: 1.0, energy_s: 0}"


@pytest.fixture(autouse=True)
def _forget_the_plugins():
    """The runs here load tests/plugins' techniques into this process: unregister them after each
    test, so a later test file in this process sees only the shipped ones."""
    yield
    for name in ("faulty_pair", "held_pair"):
        techniques.unregister(name)


def faulty_scenario(tmp_path: Path, modes: list[str], timeout_s: float = 2.0) -> Path:
    """One entry per mode, in order: only the modes that mean to hang get the short ``timeout_s``;
    every other case gets a limit far from its normal second, so a loaded machine cannot time it out."""
    path = tmp_path / "faults.yaml"
    entries = "".join(
        f"  - technique: {PLUGINS / 'faulty_pair.py'}\n"
        f"    params: {{mode: {mode}}}\n"
        f"    policy: {{case_timeout_s: {timeout_s if 'hang' in mode else 300}}}\n"
        for mode in modes
    )
    path.write_text(f"name: faults\n{FAST}\nentries:\n{entries}")
    return path


class OnDiskAfterEachCase:
    """After every finished case, the run directory must hold it: results read back, in order."""

    def __init__(self):
        self.run_dir: Path | None = None
        self.seen: list[int] = []

    def run_started(self, total):
        pass

    def case_started(self, index, case):
        pass

    def run_finished(self):
        pass

    def case_finished(self, index, case, record):
        run_dir = next(p for p in self.out.iterdir() if p.is_dir())
        self.seen.append(len(results.load_results(run_dir)["cases"]))


@pytest.mark.e2e
def test_each_fault_costs_its_case_only_and_every_healthy_case_after_it_passes(tmp_path):
    modes = ["ok", "native_hang", "ok", "segfault", "ok", "exit", "ok", "raise", "ok"]
    spy = OnDiskAfterEachCase()
    spy.out = tmp_path / "runs"
    outcome = supervisor.run_scenario(
        scenario.load(faulty_scenario(tmp_path, modes)),
        supervisor.RunOptions(devices=["cpu"]),
        spy.out,
        progress=spy,
        calibrate=False,
    )
    doc = outcome.doc
    cases = doc["cases"]
    assert [c["params"]["mode"] for c in cases] == modes and doc["status"] == "complete"
    assert outcome.exit_code == EXIT_FAILED
    assert spy.seen == list(range(1, len(modes) + 1))  # results readable after every case
    assert all(c["status"] == "passed" for c in cases if c["params"]["mode"] == "ok")
    by_mode = {c["params"]["mode"]: c for c in cases}

    hang = by_mode["native_hang"]["failure"]
    assert hang["kind"] == "timeout" and "worker killed after" in hang["message"]
    assert by_mode["native_hang"]["elapsed_s"] < 2.0 + kill_grace_s(2.0) + 60  # not forever

    segv = by_mode["segfault"]["failure"]
    assert segv["kind"] == "crash" and "SIGSEGV" in segv["message"]
    assert "Segmentation fault" in segv["traceback"]  # the worker's own last words (faulthandler)

    gone = by_mode["exit"]["failure"]
    assert gone["kind"] == "crash" and "exited with code 3" in gone["message"]

    raised = by_mode["raise"]
    assert raised["failure"]["kind"] == "variant" and "kernel launch failed" in raised["failure"]["message"]
    assert raised["variants"]["loop"]["samples_s"]  # the baseline was still measured

    assert all(c["device"]["key"] == "cpu" for c in cases)
    logs = list((outcome.run_dir / "workers").iterdir())
    assert [p.name for p in logs] == ["worker-cpu.log"]


class FinishOrder:
    """A progress listener: the order the cases finish in. Once case ``release_after`` has
    finished, it lets the held cases go (tests/plugins/held_pair.py)."""

    def __init__(self, gate: Path, release_after: int):
        self.gate, self.release_after = gate, release_after
        self.order: list[int] = []

    def run_started(self, total):
        pass

    def case_started(self, index, case):
        pass

    def run_finished(self):
        pass

    def case_finished(self, index, case, record):
        self.order.append(index)
        if index == self.release_after:
            (self.gate / "release").touch()


@pytest.mark.e2e
def test_two_cpu_workers_give_the_same_cases_and_checks_as_one(tmp_path, monkeypatch):
    """The first case is held until the second has finished, so the two workers finish out of case
    order; the run still reads in case order, with the checks one process running every case gives
    (the same runner, in this process: a worker to start costs seconds, and a fault common to every
    worker run would show here too), and both workers took cases."""
    scen = scenario.load(held_scenario(tmp_path, [True, False, False, False]))
    one = run_in_process(scen, "cpu", tmp_path / "one", calibrate=False).doc  # no HELD_PAIR_DIR: nothing is held
    gate = tmp_path / "gate"
    gate.mkdir()
    monkeypatch.setenv("HELD_PAIR_DIR", str(gate))  # the workers inherit it
    finished = FinishOrder(gate, release_after=1)
    two = supervisor.run_scenario(
        scen, supervisor.RunOptions(devices=["cpu", "cpu"]), tmp_path / "two", progress=finished, calibrate=False
    ).doc
    assert finished.order[0] == 1 and sorted(finished.order) == [0, 1, 2, 3]  # out of order, each once
    assert [c["id"] for c in two["cases"]] == [c["id"] for c in one["cases"]]  # case order, not finish order
    assert len(one["cases"]) == 4 and all(c["status"] == "passed" for c in one["cases"] + two["cases"])
    for a, b in zip(one["cases"], two["cases"]):
        for name, v in a["variants"].items():
            assert (v["check"] or {}).get("error") == (b["variants"][name]["check"] or {}).get("error")
    assert [c["device"]["key"] for c in two["cases"][:2]] == ["cpu", "cpu#1"]  # both workers took cases
    assert set(two["devices"]) == {"cpu", "cpu#1"}


def _as_if_in_a_terminal() -> None:
    # A shell that starts a job in the background (as CI scripts may) makes it ignore SIGINT, and
    # the ignore is inherited: undo it, as a terminal's foreground job has it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.setsid()


def _cli(*args: str, cwd: Path, gate: Path) -> subprocess.Popen:
    """``gpubench run ...`` as a terminal starts it, its held cases waiting at ``gate``."""
    return subprocess.Popen(
        [sys.executable, "-m", "gpubench.cli", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_if_in_a_terminal,
        env={**os.environ, "HELD_PAIR_DIR": str(gate)},
    )


def _gate(tmp_path: Path) -> Path:
    gate = tmp_path / "gate"
    gate.mkdir()
    return gate


@pytest.mark.e2e
def test_ctrl_c_stops_the_workers_and_keeps_what_finished(tmp_path):
    gate = _gate(tmp_path)
    path = held_scenario(tmp_path, [False, True, True])
    proc = _cli("run", "--scenario", str(path), "--out", "runs", "--no-calibrate", cwd=tmp_path, gate=gate)
    try:
        started = wait_for_file(gate / "started-9", proc)  # the second case is in flight
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole process group
        proc.communicate(timeout=120)
    finally:
        stop(proc)
    assert proc.returncode == EXIT_INTERRUPTED
    doc = results.load_results(next((tmp_path / "runs").iterdir()))
    assert doc["status"] == "interrupted"
    # What finished is kept, the case in flight is interrupted, the one after it never starts.
    assert [c["status"] for c in doc["cases"]] == ["passed", "interrupted"]
    worker = int(started.read_text())  # the held case ran in the worker
    assert worker != proc.pid and not wait_gone([worker])  # no worker outlives its supervisor


@pytest.mark.e2e
def test_a_run_killed_mid_way_keeps_its_finished_cases_and_reports(tmp_path):
    gate = _gate(tmp_path)
    path = held_scenario(tmp_path, [False, False, True, True])
    proc = _cli("run", "--scenario", str(path), "--out", "runs", "--no-calibrate", cwd=tmp_path, gate=gate)
    try:
        wait_for_file(gate / "started-10", proc)  # two cases finished, the third in flight
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        stop(proc)
    run_dir = next((tmp_path / "runs").iterdir())
    doc = results.load_results(run_dir)
    assert doc["status"] == "running" and len(doc["cases"]) == 2  # assembled from cases.jsonl
    assert all(c["status"] == "passed" for c in doc["cases"])
    report = CliRunner().invoke(main, ["report", str(run_dir)], catch_exceptions=False)
    assert report.exit_code == 0, report.output
    assert "run running" in (run_dir / "report.html").read_text()  # the headline says it did not finish


def test_a_torn_last_line_of_the_run_log_is_left_out(tmp_path):
    run_dir = results.RunDirectory(tmp_path)
    (tmp_path / "results.json").write_text(
        json.dumps({"kind": "gpubench.results", "schema_version": 2, "status": "running", "cases": []})
    )
    with open(run_dir.cases_log, "w") as f:
        f.write(json.dumps({"index": 1, "id": "b", "status": "passed"}) + "\n")
        f.write(json.dumps({"index": 0, "id": "a", "status": "failed"}) + "\n")
        f.write('{"index": 2, "id": "c", "sta')
    doc = results.load_results(tmp_path)
    assert [c["id"] for c in doc["cases"]] == ["a", "b"] and doc["summary"]["failed"] == 1


def test_device_lists_resolve_and_bad_ones_are_bad_input():
    assert supervisor.resolve_devices("cpu,cpu") == ["cpu", "cpu"]
    assert local_workers.slot_keys(["cpu", "cpu", "cuda:1"]) == ["cpu", "cpu#1", "cuda:1"]
    assert supervisor.resolve_devices("auto") == (["cuda:0"] if torch.cuda.is_available() else ["cpu"])
    for bad, expected in (("tpu", "not a device"), ("cpu,npu:0", "not a device")):
        with pytest.raises(BadInput, match=expected):
            supervisor.resolve_devices(bad)
    if not torch.cuda.is_available():
        with pytest.raises(BadInput, match="no CUDA GPU is usable here"):
            supervisor.resolve_devices("cuda:0,cuda:1")


def test_the_kill_comes_only_after_the_workers_own_alarm_had_its_chance():
    assert kill_grace_s(1.0) == 2.0 and kill_grace_s(300.0) == 30.0


def test_isolation_none_takes_one_device(tmp_path):
    with pytest.raises(BadInput, match="one device"):
        supervisor.check_options(supervisor.RunOptions(devices=["cpu", "cpu"], isolation="none"))


def test_exclusive_refuses_to_start_when_another_process_holds_the_gpu(monkeypatch):
    monkeypatch.setattr(
        hygiene, "gpu_processes", lambda device: [{"pid": 4242, "name": "python3", "used_memory_mib": 900.0}]
    )
    with pytest.raises(
        BadInput, match=r"--exclusive: other processes are using the GPU \(cuda:0: python3 \(pid 4242\)\)"
    ):
        run_options.check_hygiene(["cuda:0"], exclusive=True)
    assert run_options.check_hygiene(["cuda:0"], exclusive=False)["cuda:0"][0]["pid"] == 4242


def test_hygiene_says_why_on_a_machine_without_a_gpu():
    assert hygiene.gpu_processes("cpu") == "not a GPU"
    with hygiene.ClockLock([]) as lock:
        assert lock.state == {"cpu": {"locked": False, "reason": "no GPU in this run: nothing to lock"}}


@pytest.mark.e2e
def test_on_a_local_ray_cluster_a_crashing_case_fails_once_and_the_others_pass(tmp_path, monkeypatch):
    import ray  # the test extra installs it: CI runs this on a local 2-CPU Ray instance

    calls = tmp_path / "calls.log"
    monkeypatch.setenv("FAULTY_PAIR_LOG", str(calls))  # Ray's workers inherit the driver's environment
    modes = ["ok", "segfault", "ok", "native_hang", "ok"]
    options = supervisor.RunOptions(devices=["cpu"], cluster="ray")
    outcome = supervisor.run_scenario(
        scenario.load(faulty_scenario(tmp_path, modes, timeout_s=3.0)), options, tmp_path / "runs", calibrate=False
    )
    assert not ray.is_initialized()  # the instance it started is shut down
    doc = outcome.doc
    cases = doc["cases"]
    assert [c["params"]["mode"] for c in cases] == modes and outcome.exit_code == EXIT_FAILED
    assert [c["status"] for c in cases] == ["passed", "failed", "passed", "failed", "passed"]
    assert cases[1]["failure"]["kind"] == "crash" and "Ray worker died" in cases[1]["failure"]["message"]
    assert cases[3]["failure"]["kind"] == "timeout" and "cancelled" in cases[3]["failure"]["message"]
    # Ray would retry a task whose worker died three times: the crashing call ran once.
    assert calls.read_text().splitlines().count("segfault") == 1
    assert all(c["device"]["type"] == "cpu" for c in cases if c["status"] == "passed")
    assert doc["telemetry"]["status"] == "unavailable" and "Ray" in doc["telemetry"]["reason"]
