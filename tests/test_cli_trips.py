"""The small things a user trips on (issue 35 point 6): one spelling of the output option, a type
name for --threshold, `history add runs/`, a memory cap that does nothing or exceeds the card, a
run started with SIGINT ignored, and a rehearsal that keeps out of the history store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner
from held import held_scenario, stop, wait_for_file
from report_runs import recorded_runs

from gpubench.cli import main
from gpubench.records.policy import memory_cap_note
from gpubench.run import stopping
from gpubench.run.outcome import EXIT_INTERRUPTED


def _invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, list(args), catch_exceptions=False, env=env)


# -- one spelling: -o/--out -------------------------------------------------------------------
@pytest.mark.parametrize("command", [["run"], ["profile"], ["report"], ["history", "html"]])
def test_every_command_that_writes_spells_its_output_option_o_out(command):
    """`run`, `profile`, `report` and `history html` all show -o/--out, and only that spelling."""
    text = _invoke(*command, "--help").output
    assert "-o, --out" in text, text
    assert "--output " not in text and "--output," not in text


def test_reports_old_output_spelling_still_works(tmp_path):
    """Scripts written for `report --output FILE` do not break (a hidden alias of --out)."""
    run_dir = recorded_runs(tmp_path, ("a",), cases=2)[0]
    for flag in ("--output", "--out", "-o"):
        page = tmp_path / f"page{flag.strip('-')}.html"
        result = _invoke("report", str(run_dir), flag, str(page), "--no-history")
        assert result.exit_code == 0, result.output
        assert page.exists() and page.stat().st_size > 0


# -- compare --threshold --------------------------------------------------------------------
def test_threshold_shows_what_it_takes_not_text():
    """--threshold reads `--threshold PERCENT` in the help (it showed TEXT)."""
    line = next(line for line in _invoke("compare", "--help").output.splitlines() if "--threshold" in line)
    assert "PERCENT" in line and "TEXT" not in line


def _commands(group: click.Group, prefix: tuple[str, ...] = ()):
    """Every command under ``group``, looked up as click does (gpubench's are imported lazily)."""
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        yield prefix + (name,), command
        if isinstance(command, click.Group):
            yield from _commands(command, prefix + (name,))


def test_no_option_of_any_command_shows_its_type_as_text():
    """Every option taking a string says what it takes (PERCENT, N|fit, DTYPE, ...), never TEXT."""
    walked = [" ".join(path) for path, _ in _commands(main)]
    assert {"run", "report", "list", "kv-cache", "baseline save", "history html"} <= set(walked), walked
    shown = []
    for path, command in _commands(main):
        ctx = click.Context(command, info_name=" ".join(path))
        for param in command.params:
            record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
            if record and "TEXT" in record[0]:
                shown.append(f"gpubench {' '.join(path)} {record[0]}")
    assert shown == []


# -- history add runs/ ------------------------------------------------------------------------
def test_history_add_takes_a_folder_of_runs_as_the_runs_inside(tmp_path):
    """`history add runs/` adds every run inside (it was refused, without saying "runs/*")."""
    recorded_runs(tmp_path / "runs", ("20260101-a", "20260102-b"), cases=2)
    store = tmp_path / "h.sqlite"
    result = _invoke("history", "add", str(tmp_path / "runs"), "--store", str(store))
    assert result.exit_code == 0, result.output
    added = [line for line in result.output.splitlines() if "rows added" in line]
    assert len(added) == 2, result.output  # in name (timestamp) order
    assert "20260101-a: run run-20260101-a: 4 rows added" in added[0] and "run run-20260102-b:" in added[1]


def test_history_add_of_a_folder_with_no_runs_says_what_to_give(tmp_path):
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(
        main, ["history", "add", str(tmp_path / "empty"), "--store", str(tmp_path / "h.sqlite")]
    )
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "empty" in result.output and "runs/*" in result.output


# -- gpu_memory_gib that does nothing --------------------------------------------------------
def test_a_memory_cap_on_a_cpu_or_above_the_card_is_told():
    """A cap does nothing on a CPU; one above the card caps nothing; one within it needs no note."""
    cpu = memory_cap_note([1_000_000], "cpu")
    assert "1,000,000 GiB does nothing on a cpu device" in cpu
    gpu = memory_cap_note([1_000_000, 24], "cuda", 150_000_000_000, "NVIDIA H200")
    assert "1,000,000 GiB exceeds NVIDIA H200's 140 GiB" in gpu and "24" not in gpu.split("exceeds")[0]
    assert memory_cap_note([24], "cuda", 150_000_000_000) is None
    assert memory_cap_note([0.0], "cpu") is None  # no cap set: nothing to say


def test_a_gpu_run_records_that_a_cap_above_the_card_capped_nothing():
    from gpubench.measure.timing import Policy
    from gpubench.records.results import RunRecord
    from gpubench.run.closing import memory_cap_warning
    from gpubench.run.scenario import Case

    cases = [Case("kv_cache", {}, Policy(gpu_memory_gib=gib), 0) for gib in (1_000_000, 24)]
    run = RunRecord(
        run_id="r",
        device="cuda",
        device_label="NVIDIA H200",
        scenario={},
        env={"gpu": {"total_memory_bytes": 150_000_000_000}},
        devices={"cuda:0": {"type": "cuda"}},
    )
    text = memory_cap_warning(run, cases)
    assert "capped as on a 24 GiB card" in text  # the cap that applies is still described
    assert "1,000,000 GiB exceeds NVIDIA H200's 140 GiB: nothing was capped" in text
    run.devices = {"cpu": {"type": "cpu"}}
    assert "does nothing on a cpu device" in memory_cap_warning(run, cases)


def test_a_cpu_run_with_a_memory_cap_warns_before_it_starts(tmp_path):
    path = tmp_path / "cap.yaml"
    path.write_text(
        "name: cap\ndevice: cpu\npolicy: {gpu_memory_gib: 1000000}\nentries:\n"
        "  - technique: kv_cache\n    params: {layers: 1}\n"
    )
    result = _invoke("run", "--scenario", str(path), "--dry-run")
    assert result.exit_code == 0, result.output
    assert "warning: policy gpu_memory_gib 1,000,000 GiB does nothing on a cpu device" in result.output


# -- SIGINT inherited ignored -----------------------------------------------------------------
def test_sigint_ignored_at_start_is_given_a_handler():
    """A process that inherited SIGINT ignored gets Python's handler back (and only then)."""
    code = (
        "import signal\nfrom gpubench.run import stopping\nassert signal.getsignal(signal.SIGINT) is signal.SIG_IGN\n"
        "print(stopping.sigint_restored(), signal.getsignal(signal.SIGINT) is signal.default_int_handler, "
        "stopping.sigint_restored())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert out.stdout.split() == ["True", "True", "False"], out.stderr
    assert stopping.sigint_restored() is False  # pytest's own handler is left alone


def _background_job() -> None:
    # What a non-interactive shell does to `cmd &`: SIGINT ignored, inherited through exec.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.setsid()


@pytest.mark.e2e
def test_a_run_started_with_sigint_ignored_still_stops_on_sigint(tmp_path):
    """`gpubench run &` from a script, then `kill -INT`: the run stops as on Ctrl-C (exit 130,
    what finished kept); before, the signal was ignored and the run went on."""
    gate = tmp_path / "gate"
    gate.mkdir()
    path = held_scenario(tmp_path, [False, True, True])
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpubench.cli",
            "run",
            "--scenario",
            str(path),
            "-o",
            "runs",
            "--no-calibrate",
            "--no-history",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_background_job,
        env={**os.environ, "HELD_PAIR_DIR": str(gate)},
    )
    try:
        wait_for_file(gate / "started-9", proc)  # the second case is held
        os.kill(proc.pid, signal.SIGINT)  # kill -INT PID
        proc.communicate(timeout=180)
    finally:
        stop(proc)
    assert proc.returncode == EXIT_INTERRUPTED
    doc = json.loads(next((tmp_path / "runs").iterdir()).joinpath("results.json").read_text())
    assert doc["status"] == "interrupted"
    assert [c["status"] for c in doc["cases"]] == ["passed", "interrupted"]
