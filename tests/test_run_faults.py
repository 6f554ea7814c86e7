"""Nothing lost when the machine says no (issue 25 C): a disk that fills mid-run, while the run is
closed or while the report is written; SIGTERM from `timeout`, a CI cancel or a scheduler; bad
options refused before a run directory exists; progress lines a log never wraps; the smaller
messages a new user meets first."""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from held import group_members, held_scenario, stop, wait_for_file, wait_gone
from rich.console import Console

from gpubench.cli import main
from gpubench.records import atomic, results
from gpubench.records.atomic import DiskFull
from gpubench.run import scenario, stopping, supervisor
from gpubench.run.outcome import EXIT_DISK_FULL, EXIT_TERMINATED

PLUGINS = Path(__file__).parent / "plugins"
FAST = "policy: {warmup_s: 0, min_reps: 3, max_reps: 5, min_time_s: 0, max_time_s: 0.2, target_iqr: 1.0, energy_s: 0}"


@pytest.fixture(autouse=True)
def _forget_the_plugin():
    """Scenarios here load tests/plugins/faulty_pair.py into this process: unregister it after each
    test, so tests that count the registered techniques see only the shipped ones."""
    from gpubench import techniques

    yield
    if techniques.get("faulty_pair") is not None:
        techniques.unregister("faulty_pair")


def pair_scenario(tmp_path: Path, n: int, name: str = "pairs", policy: str = FAST) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\n{policy}\nentries:\n  - technique: {PLUGINS / 'faulty_pair.py'}\n"
        f"    params: {{n: {list(range(8, 8 + n))}}}\n"
    )
    return path


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def enospc() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


# -- the writers ------------------------------------------------------------------------------------


def test_an_append_the_full_disk_cuts_short_is_taken_back_whole(tmp_path, monkeypatch):
    log = tmp_path / "cases.jsonl"
    atomic.append_line(log, '{"index": 0}\n')
    real_write = os.write

    def half_then_full(fd, data):
        if len(data) > 4:
            return real_write(fd, bytes(data[: len(data) // 2]))  # a short write, then the disk is full
        raise enospc()

    monkeypatch.setattr(atomic.os, "write", half_then_full)
    with pytest.raises(DiskFull) as caught:
        atomic.append_line(log, '{"index": 1, "id": "a long record"}\n')
    assert caught.value.filename == str(log)
    assert log.read_text() == '{"index": 0}\n'  # the half line was cut back off
    monkeypatch.setattr(atomic.os, "write", real_write)
    atomic.append_line(log, '{"index": 2}\n')
    assert [json.loads(x)["index"] for x in log.read_text().splitlines()] == [0, 2]


def test_an_append_after_a_line_a_killed_process_tore_starts_a_line_of_its_own(tmp_path):
    log = tmp_path / "cases.jsonl"
    log.write_text('{"index": 0, "id": "a", "status": "passed"}\n{"index": 1, "id": "b", "sta')
    atomic.append_line(log, json.dumps({"index": 2, "id": "c", "status": "passed"}) + "\n")
    assert [c["id"] for c in results.read_cases_log(log)] == ["a", "c"]  # the torn one left out, c kept


def test_an_atomic_write_on_a_full_disk_raises_disk_full_and_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    atomic.atomic_write_json(path, {"status": "running"})

    def full(*args):
        raise enospc()

    monkeypatch.setattr(atomic.os, "fsync", full)
    with pytest.raises(DiskFull):
        atomic.atomic_write_json(path, {"status": "complete"})
    assert json.loads(path.read_text()) == {"status": "running"}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no temporary file left


class FillingDisk:
    """The run directory's writes as on a disk that fills after ``room`` appends to the run log:
    from then on every write fails with ENOSPC, until the run frees its reserve."""

    def __init__(self, monkeypatch, room: int, fill_at_close: bool = False):
        self.room, self.full, self.fill_at_close, self.freed = room, False, fill_at_close, False
        for name in ("append_line", "atomic_write_chunks", "atomic_write_text", "atomic_write_json"):
            monkeypatch.setattr(results, name, self._guard(getattr(results, name), name == "append_line"))
        release = results.RunDirectory.release

        def freed(run_dir):
            self.full, self.freed = False, True
            release(run_dir)

        monkeypatch.setattr(results.RunDirectory, "release", freed)

    def _guard(self, write, is_append: bool):
        def guarded(path, *args):
            if is_append and not self.fill_at_close and not self.freed:
                self.room -= 1
                self.full = self.full or self.room < 0
            if self.full:
                raise DiskFull(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            return write(path, *args)

        return guarded


@pytest.mark.parametrize("isolation", ["process", "none"])
def test_a_disk_that_fills_mid_run_stops_it_keeps_what_finished_and_the_run_renders(tmp_path, monkeypatch, isolation):
    FillingDisk(monkeypatch, room=3)
    outcome = supervisor.run_scenario(
        scenario.load(pair_scenario(tmp_path, 8)),
        supervisor.RunOptions(devices=["cpu"], isolation=isolation),
        tmp_path / "runs",
        calibrate=False,
    )
    run = outcome.record
    assert outcome.exit_code == EXIT_DISK_FULL == 74
    assert run.status == "aborted" and "the disk is full" in run.abort_reason
    assert run.disk_full.endswith(f"{results.CASES_LOG}: {os.strerror(errno.ENOSPC)}")
    assert run.planned_cases == 8 and len(run.cases) == 4  # the fourth finished, but its append failed
    doc = results.load_results(outcome.run_dir)  # parseable, and says what happened
    assert doc["status"] == "aborted" and doc["disk_full"] == run.disk_full
    # What finished is kept, the case the full disk refused included (the reserve made room).
    assert [c["params"]["n"] for c in doc["cases"]] == [8, 9, 10, 11]
    assert all(c["status"] == "passed" for c in doc["cases"])
    logged = results.read_cases_log(outcome.run_dir / results.CASES_LOG)
    assert len(logged) == 4 and not (outcome.run_dir / results.RESERVE).exists()
    report = invoke("report", outcome.run_dir)
    assert report.exit_code == 0, report.output
    assert "the disk is full" in (outcome.run_dir / "report.html").read_text()


def test_a_disk_that_fills_as_a_complete_run_is_closed_keeps_every_case_readable(tmp_path, monkeypatch):
    disk = FillingDisk(monkeypatch, room=0, fill_at_close=True)
    real = results.RunDirectory.write_results
    calls = []

    def fill_on_the_last(run_dir, doc):
        calls.append(1)
        if len(calls) == 2:  # the closing write: the disk is full now
            disk.full = True
        return real(run_dir, doc)

    monkeypatch.setattr(results.RunDirectory, "write_results", fill_on_the_last)
    outcome = supervisor.run_scenario(
        scenario.load(pair_scenario(tmp_path, 3)),
        supervisor.RunOptions(devices=["cpu"], isolation="none"),
        tmp_path / "runs",
        calibrate=False,
    )
    assert outcome.record.status == "complete" and outcome.exit_code == EXIT_DISK_FULL
    doc = results.load_results(outcome.run_dir)
    assert doc["status"] == "complete" and doc["disk_full"] and len(doc["cases"]) == 3


def test_the_cli_says_a_full_disk_in_one_paragraph_and_exits_74(tmp_path, monkeypatch):
    FillingDisk(monkeypatch, room=2)
    result = invoke(
        "run",
        "--scenario",
        pair_scenario(tmp_path, 5),
        "--out",
        tmp_path / "runs",
        "--no-calibrate",
        "--isolation",
        "none",
    )
    assert result.exit_code == 74, result.output
    assert "Traceback" not in result.output
    error = next(line for line in result.output.splitlines() if line.startswith("error: "))
    assert "error: the disk is full: writing " in error and "cases.jsonl failed (No space left on device" in error
    assert "The run stopped after 3 of 5 cases; 3 finished cases are kept in " in error
    assert "`gpubench report " in error and "Exit code 74." in error
    assert "run aborted: the disk is full" in result.output


def test_a_full_disk_when_the_report_is_written_is_exit_74_not_a_warning(tmp_path, monkeypatch):
    from gpubench.reports import html

    def full(path, text):
        raise DiskFull(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(html, "atomic_write_text", full)
    result = invoke(
        "run",
        "--scenario",
        pair_scenario(tmp_path, 2),
        "--out",
        tmp_path / "runs",
        "--no-calibrate",
        "--isolation",
        "none",
    )
    assert result.exit_code == 74, result.output
    run_dir = next((tmp_path / "runs").iterdir())
    assert "error: the disk is full: writing " in result.output and "report.html failed" in result.output
    assert f"gpubench report {run_dir}" in result.output and not (run_dir / "report.html").exists()
    assert results.load_results(run_dir)["status"] == "complete"  # the run itself is saved
    again = invoke("report", run_dir)  # the report command on the same full disk: the same paragraph
    assert again.exit_code == 74 and "error: the disk is full" in again.output
    assert "Traceback" not in result.output + again.output


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"mount is not permitted here: {done.stderr.decode().strip()}")


@pytest.mark.e2e
def test_a_real_full_disk_mid_run_exits_74_and_what_finished_renders_elsewhere(tmp_path):
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, "420k")  # the reserve (256 KiB), then room for some 30 of the 60 records
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpubench.cli",
                "run",
                "--scenario",
                str(pair_scenario(tmp_path, 60)),
                "--out",
                str(disk / "runs"),
                "--no-calibrate",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 74, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr and proc.stderr.startswith("error: the disk is full: writing ")
        run_dir = next((disk / "runs").iterdir())
        doc = results.load_results(run_dir)
        assert doc["status"] == "aborted" and 0 < len(doc["cases"]) < 60
        for line in (run_dir / results.CASES_LOG).read_text().splitlines():
            json.loads(line)  # no cut record
        on_full = invoke("report", run_dir)  # in this process: the same full disk, no second interpreter to start
        assert on_full.exit_code == 74 and "error: the disk is full" in on_full.output
        copy = shutil.copytree(run_dir, tmp_path / "copy")  # as after freeing space
    finally:
        subprocess.run(["umount", str(disk)])
    report = invoke("report", copy)
    assert report.exit_code == 0, report.output
    assert "the disk is full" in (copy / "report.html").read_text()


# -- SIGTERM ----------------------------------------------------------------------------------------


def _own_group() -> None:
    os.setsid()


@pytest.mark.e2e
@pytest.mark.parametrize("how,isolation", [("group", "process"), ("supervisor", "process"), ("group", "none")])
def test_sigterm_stops_the_run_as_ctrl_c_does_then_exits_143(tmp_path, how, isolation):
    # `timeout` and a CI cancel signal the whole process group; a scheduler may signal only the
    # process it started (then the supervisor stops its workers). The signal comes while the second
    # case is surely in flight: it waits for the test (tests/plugins/held_pair.py).
    gate = tmp_path / "gate"
    gate.mkdir()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpubench.cli",
            "run",
            "--scenario",
            str(held_scenario(tmp_path, [False, True, True])),
            "--out",
            "runs",
            "--no-calibrate",
            "--isolation",
            isolation,
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_own_group,
        env={**os.environ, "HELD_PAIR_DIR": str(gate)},
    )
    try:
        wait_for_file(gate / "started-9", proc)
        (os.killpg if how == "group" else os.kill)(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
    finally:
        stop(proc)
    assert proc.returncode == EXIT_TERMINATED == 143, out[-2000:] + err[-2000:]
    assert "leaked semaphore" not in err and "Traceback" not in err, err
    run_dir = next((tmp_path / "runs").iterdir())
    doc = results.load_results(run_dir)
    assert doc["status"] == "interrupted" and doc["signal"] == "SIGTERM" and doc["abort_reason"] == "stopped by SIGTERM"
    # What finished is kept, the case in flight is interrupted, the one after it never starts.
    assert [c["status"] for c in doc["cases"]] == ["passed", "interrupted"]
    assert doc["cases"][-1]["failure"]["message"] == "stopped by SIGTERM"
    assert (run_dir / "report.html").exists() and (run_dir / "summary.md").exists()
    assert "run interrupted: stopped by SIGTERM" in out
    left = wait_gone(group_members(proc.pid))  # a worker of a run it signalled alone, too
    assert not left, left  # no worker outlives the run


def test_a_sigterm_while_the_record_is_closed_is_ignored_and_one_in_the_run_raises_once():
    handler = stopping.SigtermAsInterrupt()
    with pytest.raises(stopping.Terminated):
        handler(signal.SIGTERM, None)
    handler(signal.SIGTERM, None)  # the second: the run is closing already
    assert handler.received and not handler.armed
    assert isinstance(stopping.Terminated(), KeyboardInterrupt)  # every Ctrl-C path closes the run on it too


# -- refused before anything is created -------------------------------------------------------------


def test_an_unknown_cluster_exits_2_before_a_run_directory_exists(tmp_path):
    result = invoke("run", "--cluster", "slurm", "--out", tmp_path / "runs", "--scenario", pair_scenario(tmp_path, 1))
    assert result.exit_code == 2 and "--cluster: 'slurm' is not valid" in result.output
    assert "gpubench run:" not in result.output  # refused before the run's first line
    assert not (tmp_path / "runs").exists()


def test_kv_cache_exits_1_when_vllm_would_refuse_to_start_even_with_allow_long():
    args = ["kv-cache", "--model", "llama-3.1-8b", "--gpu-memory", "80", "--max-len", "2000000000", "--allow-long"]
    text = invoke(*args)
    assert text.exit_code == 1 and "vLLM would refuse to start: one request of --max-len 2,000,000,000" in text.output
    as_json = invoke(*args, "--json")
    assert as_json.exit_code == 1 and json.loads(as_json.stdout)["fits"] is True  # the batch fits; vLLM will not start
    assert "vLLM would refuse to start" in as_json.stderr
    fits = invoke("kv-cache", "--model", "llama-3.1-8b", "--gpu-memory", "80", "--max-len", "131072")
    assert fits.exit_code == 0 and "refuse" not in fits.output


# -- what a log shows -------------------------------------------------------------------------------


def test_progress_lines_in_a_log_are_never_wrapped():
    from gpubench.cli import _CaseProgress
    from gpubench.records.results import CaseRecord, Failure

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=False, width=60, color_system=None)
    progress = _CaseProgress(console, {"pair": {"label"}})
    progress.run_started(1)
    params = {"label": "x" * 120}
    case = scenario.Case(technique="pair", params=params, policy=None, seed=0)  # type: ignore[arg-type]
    record = CaseRecord(
        id=case.id,
        technique="pair",
        params=params,
        seed=0,
        policy={},
        status="failed",
        failure=Failure("exception", "RuntimeError: " + "y" * 150),
        elapsed_s=1.0,
    )
    progress.case_finished(0, case, record)
    lines = buffer.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("[1/1] failed  pair label=" + "x" * 120)
    assert lines[1] == "    RuntimeError: " + "y" * 150


def test_a_run_stopped_while_its_workers_started_names_its_device_and_says_no_case_finished():
    from gpubench.reports.terminal import print_summary

    buffer = io.StringIO()
    doc = {
        "scenario": {"name": "smoke"},
        "device": "cpu",
        "device_label": "",
        "cases": [],
        "status": "interrupted",
        "summary": {"passed": 0, "failed": 0, "interrupted": 0},
        "abort_reason": "stopped by Ctrl-C while the workers were starting: no case ran",
    }
    print_summary(doc, Console(file=buffer, force_terminal=False, width=80, color_system=None))
    text = buffer.getvalue()
    assert text.startswith("smoke on cpu: no case finished\n") and "smoke on :" not in text
    assert "run interrupted: stopped by Ctrl-C while the workers were starting: no case ran" in text


# -- the smaller messages ---------------------------------------------------------------------------


def test_a_directory_given_as_a_scenario_or_a_technique_file_is_named_a_directory(tmp_path):
    (tmp_path / "mine.yaml").write_text("name: x\nentries: []\n")
    as_scenario = invoke("run", "--scenario", tmp_path, "--dry-run")
    assert as_scenario.exit_code == 2 and "is a directory, not a scenario file" in as_scenario.output
    assert "mine.yaml" in as_scenario.output and "no such file" not in as_scenario.output
    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\nentries:\n  - technique: {PLUGINS}/\n")
    as_technique = invoke("run", "--scenario", path, "--dry-run")
    assert as_technique.exit_code == 2 and "is a directory, not a .py file" in as_technique.output


def test_a_plug_in_that_raises_at_import_is_named_with_its_file_and_line(tmp_path):
    plugin = tmp_path / "boom_pair.py"
    plugin.write_text(
        "import torch\n\n\ndef sizes():\n    raise ValueError('the size table is empty')\n\n\nSIZES = sizes()\n"
    )
    path = tmp_path / "s.yaml"
    path.write_text("name: s\nentries:\n  - technique: boom_pair.py\n")
    result = invoke("run", "--scenario", path, "--dry-run")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert (
        f"technique 'boom_pair.py': importing it failed: ValueError: the size table is empty at {plugin}:5 (in sizes)"
    ) in result.output
    assert "not an importable module" not in result.output


def test_a_param_of_the_wrong_type_reads_as_english(toys, write_scenario):
    path = write_scenario("name: t\nentries:\n  - technique: toy_kernel\n    params: {n: [eight]}\n")
    result = invoke("run", "--scenario", path, "--dry-run")
    assert result.exit_code == 2 and "'eight' is not an int" in result.output


@pytest.mark.e2e
def test_a_segfault_with_isolation_none_leaves_pythons_stack_on_stderr(tmp_path):
    path = tmp_path / "seg.yaml"
    path.write_text(
        f"name: seg\n{FAST}\nentries:\n  - technique: {PLUGINS / 'faulty_pair.py'}\n"
        f"    params: {{mode: [ok, segfault]}}\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpubench.cli",
            "run",
            "--scenario",
            str(path),
            "--out",
            str(tmp_path / "runs"),
            "--no-calibrate",
            "--isolation",
            "none",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGSEGV
    assert "Segmentation fault" in proc.stderr and "faulty_pair.py" in proc.stderr and " in fails" in proc.stderr
    run_dir = next((tmp_path / "runs").iterdir())
    assert [c["params"]["mode"] for c in results.load_results(run_dir)["cases"]] == ["ok"]  # what finished is kept
