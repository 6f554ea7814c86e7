"""The prepared GPU session (benchmarks/gpu_session.sh) always comes back: one deadline bounds every
part, a part that started always leaves its tarball (killed from outside by SIGTERM or SIGKILL
included), at most 8 files come back, a failed install is in the log, and each run inside a part
is planned with `--budget` to fit what the part has left.

Most tests run the script with a stand-in for Python (it records its argv, writes into the run's
--out folder and sleeps as told, and answers SIGINT as gpubench does: it keeps what it wrote); the
last one rehearses it with the real gpubench on the CPU and kills it mid-part."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_session.sh"
MAX_FILES_BACK = 8  # the device machine returns at most 8 files

FAKE_PYTHON = """#!{python}
import json, os, signal, sys, time
args = sys.argv[1:]
with open(os.environ["FAKE_ARGV_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
if os.environ.get("FAKE_ENV_LOG"):
    with open(os.environ["FAKE_ENV_LOG"], "a") as log:
        log.write(json.dumps({{"args": args, "history": os.environ.get("GPUBENCH_HISTORY")}}) + "\\n")
with open(os.environ["FAKE_PIDS"], "a") as pids:
    pids.write(f"{{os.getpid()}}\\n")
if args[:2] == ["-m", "pip"]:
    print("ERROR: Could not find a version that satisfies the requirement setuptools>=64 (from versions: none)")
    sys.exit(1)
if args[:1] == ["-c"]:
    print("Fake-GPU")
    sys.exit(0)
out = args[args.index("--out") + 1] if "--out" in args else None
def stop(signum, frame):
    if out:
        open(os.path.join(out, "interrupted"), "w").write("SIGINT")
    sys.exit(130)
signal.signal(signal.SIGINT, stop)
if out:
    os.makedirs(out, exist_ok=True)
    open(os.path.join(out, "started"), "w").write(" ".join(args))
if "run" in args and "--dry-run" not in args:
    time.sleep(float(os.environ.get("FAKE_RUN_S", "0")))
"""


def fake_python(tmp_path: Path) -> Path:
    path = tmp_path / "fake-python"
    path.write_text(FAKE_PYTHON.format(python=sys.executable))
    path.chmod(0o755)
    return path


@pytest.fixture(autouse=True)
def no_stand_in_left(tmp_path):
    """A SIGKILL to the script's group leaves the runs `timeout` put in groups of their own (as on
    the device machine, which is then given back): end the stand-ins the test started."""
    yield
    pids = tmp_path / "pids"
    for pid in pids.read_text().split() if pids.exists() else []:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def start(tmp_path: Path, out: Path, **env: str) -> subprocess.Popen:
    environ = {
        **os.environ,
        "OUT": str(out),
        "PY": str(fake_python(tmp_path)),
        "FAKE_PIDS": str(tmp_path / "pids"),
        "FAKE_ARGV_LOG": str(tmp_path / "argv.jsonl"),
        "GPUBENCH_CACHE_DIR": str(tmp_path / "cache"),
        "TMPDIR": str(tmp_path),
        **env,
    }
    (tmp_path / "cache").mkdir(exist_ok=True)
    (tmp_path / "cache" / "tuning.json").write_text("{}")
    return subprocess.Popen(
        ["bash", str(SCRIPT)],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def calls(tmp_path: Path) -> list[list[str]]:
    path = tmp_path / "argv.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(path: Path, text: str, timeout_s: float = 120.0) -> None:
    """Until ``text`` appears in the file (limits far from normal times: a loaded machine is slow)."""
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never appeared in {path}:\n{path.read_text() if path.exists() else '(none)'}")


def members(tarball: Path) -> list[str]:
    with tarfile.open(tarball) as tar:
        return tar.getnames()


def started_parts(log: str) -> list[str]:
    return [line.split("] ", 1)[1].split(":")[0] for line in log.splitlines() if ": started, limit" in line]


def test_parts_run_in_order_within_one_deadline_and_each_run_gets_a_budget(tmp_path):
    out = tmp_path / "out"
    default = next(line for line in SCRIPT.read_text().splitlines() if line.startswith("PARTS="))
    assert "model" not in default  # named only: after gpu-quick it would never have time
    proc = start(tmp_path, out, DEADLINE_S="300", PARTS="env first dobench kernels rest model")
    assert proc.wait(timeout=240) == 0, proc.stdout.read()
    log = (out / "session.log").read_text()
    assert started_parts(log) == ["env", "first", "dobench", "kernels", "rest", "model"]
    assert "pip install failed" in log and "Could not find a version" in log  # logged, not lost
    pip = [c for c in calls(tmp_path) if c[:2] == ["-m", "pip"]]
    assert pip and "--no-index" in pip[0] and "--disable-pip-version-check" in pip[0]
    starts = [
        (int(line[1:].split()[0]), int(line.split("limit ")[1].split()[0]))
        for line in log.splitlines()
        if ": started, limit" in line
    ]
    limits = [limit for _, limit in starts]
    for at, limit in starts:  # every part's limit is cut from what is left of the one deadline
        assert at + limit <= 300 - 20, (at, limit)
    runs = [c for c in calls(tmp_path) if c[:3] == ["-m", "gpubench.cli", "run"]]
    assert {c[c.index("--scenario") + 1] for c in runs if "--scenario" in c} == {
        "gpu-first",
        "kernels-h200",
        "kernels-h200-flash",
        "gpu-quick",
    }
    # a published model, its --dry-run plan first, then the run itself
    model_runs = [c for c in runs if "--model" in c]
    assert [("--dry-run" in c, c[c.index("--model") + 1]) for c in model_runs] == [
        (True, "gpt-oss-20b"),
        (False, "gpt-oss-20b"),
    ]
    for c in runs:
        budget = c[c.index("--budget") + 1]
        assert budget.endswith("s") and 0 < int(budget[:-1]) <= max(limits), c
        assert "--fill-budget" in c  # the session uses its time to the end
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(
        [
            "session.log",
            "cache.tar.gz",
            "env.tar.gz",
            "first.tar.gz",
            "dobench.tar.gz",
            "kernels.tar.gz",
            "model.tar.gz",
            "rest.tar.gz",
        ]
    )
    assert len(files) <= MAX_FILES_BACK
    assert "./tuning.json" in members(out / "cache.tar.gz")  # the next session starts warm


def test_a_part_that_would_pass_the_deadline_is_cut_to_it_and_the_rest_are_not_started(tmp_path):
    out = tmp_path / "out"
    proc = start(
        tmp_path, out, DEADLINE_S="25", STOP_S="3", KILL_S="2", MIN_PART_S="8", FAKE_RUN_S="1000", PARTS="first dobench"
    )
    assert proc.wait(timeout=240) == 0, proc.stdout.read()
    log = (out / "session.log").read_text()
    assert started_parts(log) == ["first"]
    assert "dobench: not started" in log
    with tarfile.open(out / "first.tar.gz") as tar:
        names = tar.getnames()
        assert "./runs/interrupted" in names  # SIGINT at the part's limit: the run kept what it wrote
        assert "exit 124" in tar.extractfile("./log.txt").read().decode()


@pytest.mark.parametrize("how", ["SIGTERM to the script", "SIGKILL to its process group"])
def test_every_part_that_started_leaves_its_tarball_when_the_call_is_killed_mid_part(tmp_path, how):
    out = tmp_path / "out"
    proc = start(tmp_path, out, FAKE_RUN_S="1000", KILL_S="3")
    wait_for(out / "session.log", "first: started")
    wait_for(tmp_path / "argv.jsonl", "gpu-first")  # the run is in flight
    if how.startswith("SIGTERM"):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=120)
    log = (out / "session.log").read_text()
    started = started_parts(log)
    assert started == ["env", "first"]
    for name in started:
        assert (out / f"{name}.tar.gz").exists(), name
    assert "./log.txt" in members(out / "first.tar.gz")
    assert len(list(out.iterdir())) <= MAX_FILES_BACK
    if how.startswith("SIGTERM"):
        assert "received SIGTERM during first" in log
        assert "./runs/interrupted" in members(out / "first.tar.gz")  # SIGINT passed on, what it wrote kept
        assert (out / "cache.tar.gz").exists()


def run_records(tarball: Path) -> list[dict]:
    """The results.json documents packed in a part's tarball (none while it does not exist)."""
    if not tarball.exists():
        return []
    with tarfile.open(tarball) as tar:
        return [json.load(tar.extractfile(m)) for m in tar.getmembers() if m.name.endswith("/results.json")]


@pytest.mark.e2e
def test_a_rehearsal_on_the_cpu_killed_mid_part_keeps_every_started_part(tmp_path):
    """The real script, the real gpubench, small cases on the CPU (REHEARSE=1), stopped by an outer
    SIGTERM while its second part's run is measuring: both parts' tarballs come back, the first's
    run complete, the second's closed as interrupted (what it measured kept), with the cache."""
    out = tmp_path / "out"
    environ = {
        **os.environ,
        "OUT": str(out),
        "REHEARSE": "1",
        "PY": sys.executable,
        "PARTS": "first kernels",
        "TMPDIR": str(tmp_path),
        "GPUBENCH_CACHE_DIR": str(tmp_path / "cache"),
        "KILL_S": "60",
        "SNAPSHOT_S": "1",
        "HOME": str(tmp_path),
    }
    proc = subprocess.Popen(
        ["bash", str(SCRIPT)],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for(out / "session.log", "kernels: started", timeout_s=600)
        t_end = time.monotonic() + 300
        while not any(r.get("status") == "running" for r in run_records(out / "kernels.tar.gz")):
            assert time.monotonic() < t_end and proc.poll() is None, "the kernels part's run never started"
            time.sleep(0.5)  # its snapshots show the run's record once the run has begun
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=300) == 128 + signal.SIGTERM, proc.stdout.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    log = (out / "session.log").read_text()
    assert started_parts(log) == ["first", "kernels"] and "first: exit 0" in log
    assert [r["status"] for r in run_records(out / "first.tar.gz")] == ["complete"]
    kernels = run_records(out / "kernels.tar.gz")
    assert [r["status"] for r in kernels] == ["interrupted"], kernels  # closed by the SIGINT passed on
    assert sorted(p.name for p in out.iterdir()) == ["cache.tar.gz", "first.tar.gz", "kernels.tar.gz", "session.log"]


@pytest.mark.parametrize("rehearse", [True, False])
def test_a_rehearsal_keeps_its_runs_out_of_the_history_store(tmp_path, rehearse):
    """REHEARSE=1 gives gpubench a history store of the rehearsal's own, in its scratch folder
    (removed at the end): its small CPU runs never land in the caller's store or the default one
    (they did). A real session leaves the store as the caller set it."""
    out, mine = tmp_path / "out", tmp_path / "mine.sqlite"
    env = {
        "PARTS": "first",
        "DEADLINE_S": "300",
        "GPUBENCH_HISTORY": str(mine),
        "FAKE_ENV_LOG": str(tmp_path / "env.jsonl"),
        **({"REHEARSE": "1"} if rehearse else {}),
    }
    proc = start(tmp_path, out, **env)
    assert proc.wait(timeout=240) == 0, proc.stdout.read()
    seen = [json.loads(line) for line in (tmp_path / "env.jsonl").read_text().splitlines()]
    runs = [s["history"] for s in seen if s["args"][:3] == ["-m", "gpubench.cli", "run"]]
    assert runs, seen
    if rehearse:
        assert all(h and h != str(mine) and Path(h).parent.name.startswith("gpu-session.") for h in runs), runs
        assert not Path(runs[0]).parent.exists()  # thrown away with the scratch folder
    else:
        assert set(runs) == {str(mine)}


@pytest.mark.skipif(subprocess.run(["which", "make"], capture_output=True).returncode != 0, reason="no make here")
def test_make_gpu_session_writes_into_the_callers_out_folder():
    """The device machine returns only what lands in its $OUT: `make gpu-session` must write there
    (it used to write into gpu-session-out whatever $OUT said), and elsewhere into gpu-session-out."""

    def dry(env: dict[str, str]) -> str:
        environ = {k: v for k, v in os.environ.items() if k != "OUT"}
        return subprocess.run(
            ["make", "-n", "gpu-session"], cwd=ROOT, env={**environ, **env}, capture_output=True, text=True, check=True
        ).stdout

    assert "OUT=/device/out bash benchmarks/gpu_session.sh" in dry({"OUT": "/device/out"})
    assert "OUT=gpu-session-out bash benchmarks/gpu_session.sh" in dry({})
