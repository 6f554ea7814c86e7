"""Runs stopped at a moment the test chooses: scenarios of tests/plugins/held_pair.py, whose held
cases wait until the test lets them go, and the waits a test makes on what it can see (a file
appearing, a process gone) with limits far from their normal times."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

PLUGIN = Path(__file__).parent / "plugins" / "held_pair.py"
FAST = "policy: {warmup_s: 0, min_reps: 3, max_reps: 5, min_time_s: 0, max_time_s: 0.2, target_iqr: 1.0, energy_s: 0}"


def held_scenario(tmp_path: Path, holds: list[bool], name: str = "held") -> Path:
    """A case per entry of ``holds`` (n = 8, 9, ...), held where it says True. The gate is
    HELD_PAIR_DIR, which the run's processes must inherit; without it nothing is held."""
    entries = "".join(
        f"  - technique: {PLUGIN}\n    params: {{n: {8 + i}, held: {str(h).lower()}}}\n" for i, h in enumerate(holds)
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\n{FAST}\nentries:\n{entries}")
    return path


def wait_for_file(path: Path, proc: subprocess.Popen, limit_s: float = 600.0) -> Path:
    """Wait until ``path`` exists (a held case has started), while ``proc`` runs."""
    end = time.monotonic() + limit_s
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, f"{path.name} did not appear in {limit_s:g} s"
        time.sleep(0.05)
    return path


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie is dead, only not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pids: list[int], limit_s: float = 60.0) -> list[int]:
    """The processes among ``pids`` still alive after up to ``limit_s`` (none, normally at once)."""
    end = time.monotonic() + limit_s
    while True:
        left = [pid for pid in pids if alive(pid)]
        if not left or time.monotonic() >= end:
            return left
        time.sleep(0.05)


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(stat.parent.name))
    return members


def stop(proc: subprocess.Popen) -> None:
    """Kill a run the test left behind (a failed assertion), with its process group."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate(timeout=60)
