"""How a run's cost grows with its number of cases: N cases of a pair that costs nothing, through
the supervisor and one worker process. Prints seconds per 100 cases at the start and the end, the
bytes of the run directory and the supervisor's peak memory.

    python benchmarks/run_scale.py 1000 10000
"""

from __future__ import annotations

import resource
import sys
import tempfile
import time
from pathlib import Path

from gpubench.run import scenario, supervisor

POLICY = "{warmup_s: 0, min_reps: 1, max_reps: 1, min_time_s: 0, max_time_s: 1, target_iqr: 1.0, energy_s: 0}"


class Clock:
    def __init__(self):
        self.times: list[float] = []

    def run_started(self, total):
        pass

    def case_started(self, index, case):
        pass

    def run_finished(self):
        pass

    def case_finished(self, index, case, record):
        self.times.append(time.monotonic())


def measure(n: int, root: Path) -> dict[str, float]:
    path = root / f"scale-{n}.yaml"
    path.write_text(
        f"name: scale-{n}\npolicy: {POLICY}\nentries:\n"
        f"  - technique: {Path(__file__).with_name('tiny_pair.py')}\n"
        f"    params: {{i: {list(range(n))}}}\n"
    )
    clock = Clock()
    t0 = time.monotonic()
    outcome = supervisor.run_scenario(
        scenario.load(path), supervisor.RunOptions(devices=["cpu"]), root / "runs", progress=clock, calibrate=False
    )
    total = time.monotonic() - t0
    assert outcome.record.summary["passed"] == n
    size = sum(p.stat().st_size for p in outcome.run_dir.rglob("*") if p.is_file())
    return {
        "cases": n,
        "total_s": total,
        "first_100_s": clock.times[99] - clock.times[0],
        "last_100_s": clock.times[-1] - clock.times[-101],
        "run_dir_mb": size / 1e6,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        for n in map(int, sys.argv[1:] or ["1000"]):
            m = measure(n, Path(tmp))
            print(
                f"{m['cases']:>6} cases: {m['total_s']:.1f} s in all, first 100 cases {m['first_100_s']:.2f} s, "
                f"last 100 {m['last_100_s']:.2f} s, run directory {m['run_dir_mb']:.1f} MB, "
                f"supervisor peak RSS {m['peak_rss_mb']:.0f} MB",
                flush=True,
            )
