"""How long gpubench takes to answer the commands that only read or refuse (issue 35 point 5):
`--help`, a bad option, a misspelt scenario name, a scenario with an unknown param, `list`,
`history`, `compare` and `report` of a small run (its figures read back from the figure cache, as
after `gpubench run`, and drawn into an empty one), each in a fresh interpreter, as a user types them; beside them `python -c pass` (the interpreter
alone) and `python -c "import torch"` (what every command paid before).

    python benchmarks/cli_startup.py [--repeat 5]

Prints the median and the range of the wall time of each, the machine's load average before and
after (a busy machine's start-up is several times a quiet one's: say which), and whether each
command imported torch. Writes nothing outside a temporary directory."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROBE = (
    "import json, sys\nfrom gpubench.cli import main\nsys.argv = ['gpubench', *json.loads(sys.argv[1])]\n"
    "try:\n    main()\nexcept SystemExit:\n    pass\n"
    "sys.stderr.write('\\nTORCH=%d\\n' % ('torch' in sys.modules))\n"
)


def _runs(root: Path) -> list[Path]:
    """Two small runs of schema 3 (four flash_attention cases each, declarations recorded)."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    from report_runs import recorded_runs

    return recorded_runs(root)


def _time(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, bool | None]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    marker = [line for line in proc.stderr.splitlines() if line.startswith("TORCH=")]
    return seconds, (marker[-1] == "TORCH=1") if marker else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of each command (the median is printed)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        a, b = _runs(root)
        bad = root / "bad.yaml"  # refused for an unknown param: read from the catalogue, no torch
        bad.write_text("name: bad\nentries:\n  - technique: kv_cache\n    params: {no_such: 1}\n")
        # The figure cache in the temporary directory: warmed by the first `report A` (as `gpubench
        # run` warms it with the report it writes), so the medians are of reports whose figures are
        # read back; "figures drawn" starts from an empty cache (a report of a run made elsewhere).
        env = {
            **os.environ,
            "GPUBENCH_HISTORY": str(root / "history.sqlite"),
            "GPUBENCH_CACHE_DIR": str(root / "figures"),
        }
        subprocess.run(
            [sys.executable, "-m", "gpubench.cli", "history", "add", str(a), str(b)],
            env=env,
            cwd=root,
            capture_output=True,
            check=True,
        )
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "python -c 'import torch'": [sys.executable, "-c", "import torch"],
        }
        for label, cli in (
            ("--help", ["--help"]),
            ("run --no-such-option", ["run", "--no-such-option"]),
            ("run --scenario smokee", ["run", "--scenario", "smokee"]),
            ("history", ["history"]),
            ("compare A B", ["compare", str(a), str(b)]),
            ("report A --no-history", ["report", str(a), "--no-history"]),
            ("report A (history read)", ["report", str(a)]),
            ("list", ["list"]),
            ("run --scenario bad.yaml (param)", ["run", "--scenario", str(bad)]),
        ):
            commands[f"gpubench {label}"] = [sys.executable, "-c", PROBE, json.dumps(cli)]
        commands["gpubench report A --no-history (figures drawn)"] = commands["gpubench report A --no-history"]
        cold = "gpubench report A --no-history (figures drawn)"  # each time in an empty cache
        subprocess.run(commands["gpubench report A --no-history"], env=env, cwd=root, capture_output=True, check=True)
        if not any(p.read_text().startswith("<svg") for p in (root / "figures" / "figures").glob("*.svg")):
            sys.exit("the warm-up report kept no figure: the cached rows would time drawing")
        load0 = os.getloadavg()
        print(
            f"{os.cpu_count()} logical cores; load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} (1, 5, 15 min)"
        )
        print(
            "bytecode: "
            + (
                "not written (PYTHONDONTWRITEBYTECODE is set): each start compiles gpubench's modules from source"
                if os.environ.get("PYTHONDONTWRITEBYTECODE")
                else "written (Python's default): compiled once, read back after"
            )
        )
        print(f"{'command':<48} {'median s':>9} {'min s':>7} {'max s':>7}  torch")
        for label, argv in commands.items():
            times, torch_seen = [], None
            for _ in range(args.repeat):
                empty = {"GPUBENCH_CACHE_DIR": tempfile.mkdtemp(dir=root)} if label == cold else {}
                seconds, torch_seen = _time(argv, {**env, **empty}, root)
                times.append(seconds)
            seen = "-" if torch_seen is None else ("imported" if torch_seen else "no")
            print(
                f"{label:<48} {statistics.median(times):>9.2f} {min(times):>7.2f} {max(times):>7.2f}  {seen}",
                flush=True,
            )
        load1 = os.getloadavg()
        print(f"load average after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")


if __name__ == "__main__":
    main()
