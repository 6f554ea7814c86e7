import os
import sys
from pathlib import Path

# Tests share a 2-core machine with whatever else runs there. With OpenMP's default spin-waiting a
# parallel region whose thread lost its core keeps its sibling spinning: measured here (2 cores,
# torch 2.13 CPU), smoke's continuous_batching static engine took 4.3 s per run beside one `yes`
# loop, 1.3 s with OMP_WAIT_POLICY=PASSIVE (1.15 s with one thread). Set before torch (and so
# libgomp) loads; worker subprocesses inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# pytest-xdist's workers get COLUMNS=80 from the controller; the commands' output (rich) is then cut
# at 80 columns, while a plain run (no terminal, no COLUMNS) gets the wide fixed width logs get.
# Every test sees the same width whichever way the suite runs.
os.environ.pop("COLUMNS", None)

import pytest
import torch

# Without a GPU, Triton kernels run in Triton's interpreter. It is chosen when a kernel is
# decorated, so this must be set before any module defining a kernel is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).parent))


_SHARED_CACHE = None  # the cache directory the session started with (the user's, or CI's)


@pytest.fixture(autouse=True)
def device_cache(tmp_path_factory, monkeypatch):
    """Tunings, case times (gpubench.measure.devicecache) and the history store go to a directory of each test's own, never
    the user's ~/.cache, and one test's runs never shape another's estimates; worker
    subprocesses inherit it. The speculative pair's trained weights (spec_pair/, ~25 s to train)
    stay shared: that directory links to the session's own cache."""
    global _SHARED_CACHE
    from gpubench.measure.devicecache import cache_root

    if _SHARED_CACHE is None:
        _SHARED_CACHE = cache_root()
    path = tmp_path_factory.mktemp("device-cache")
    (_SHARED_CACHE / "spec_pair").mkdir(parents=True, exist_ok=True)
    (path / "spec_pair").symlink_to(_SHARED_CACHE / "spec_pair", target_is_directory=True)
    monkeypatch.setenv("GPUBENCH_CACHE_DIR", str(path))
    monkeypatch.setenv("GPUBENCH_HISTORY", str(path / "history.sqlite"))  # `gpubench run` adds runs there
    return path


@pytest.fixture(scope="session")
def small_run_dir(tmp_path_factory):
    """One small real run per session (tests/report_runs.py SCENARIO: every technique at a small
    case on the CPU, short policy; ~10 s on 2 idle cores, ~25 s more where the speculative pair is
    not cached yet), shared by every test that only reads a real run: never write into it (copy
    it first, as ``shutil.copytree``)."""
    import report_runs

    return report_runs.small_run(tmp_path_factory.mktemp("small-run"))


@pytest.fixture
def toys():
    """Register the toy techniques (tests/toys.py) for the duration of a test."""
    import toys as toy_module

    from gpubench import techniques

    for name, t in vars(toy_module).items():
        if any(t is toy for toy in toy_module.ALL):  # with its source, so a worker can load it too
            techniques.register(t, f"toys:{name}")
    yield toy_module
    for t in toy_module.ALL:
        techniques.unregister(t.name)


FAST_POLICY = """
policy:
  warmup_s: 0.0
  min_reps: 3
  max_reps: 5
  min_time_s: 0.0
  max_time_s: 0.5
  target_iqr: 1.0
  case_timeout_s: 5
  energy_s: 0
"""


@pytest.fixture
def write_scenario(tmp_path):
    """Write a scenario YAML (a fast policy is added unless the text has one) and return its path."""

    def write(body: str, name: str = "t.yaml", policy: bool = True) -> Path:
        has_policy = any(line.startswith("policy:") for line in body.splitlines())
        text = body if (not policy or has_policy) else body + FAST_POLICY
        path = tmp_path / name
        path.write_text(text)
        return path

    return write


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """No test depends on the machine's load: case time limits stay the policy's, and a timeout is
    a plain ``timeout`` (tests of :mod:`gpubench.measure.machine_load` set the load they need)."""
    from gpubench.measure import machine_load

    monkeypatch.setattr(machine_load, "read", lambda: None)
