"""What `gpubench run --model` costs (issue 37 point 4): the generator's own time, and the generated
scenario's run time against what its dry run estimated.

    python benchmarks/model_scenario_cost.py [--model PRESET|config.json] [--repeat 20] [--no-run]

(--model: default the preset smollm2-135m where this build has it, else
examples/tiny-gpt-oss-config.json.)

1. The generator: build_model_scenario, then apart the YAML and the scenario parser after it
   (the techniques' cross-param rules included: the first call imports their modules, torch with
   them, so its maximum is that import), for every shipped preset and the --model, cpu (16 GiB)
   and cuda (80 GiB), each --repeat times in this process; the median and the range.
2. The generated scenario for --model on this CPU: the dry run's estimate with an empty case-time
   history (what a first-time user sees), the measured wall time of `gpubench run --model`, then
   the dry run's estimate again, now from the history the run left. Each in a fresh interpreter,
   as a user types them; every cache in a temporary directory.

Prints the machine's load average before and after (a loaded machine's run is slower: say which).
Writes nothing outside a temporary directory."""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SMALL_PRESET = "smollm2-135m"  # the smallest published preset, where this build ships it
EXAMPLE = HERE.parent / "examples" / "tiny-gpt-oss-config.json"


def default_model() -> str:
    from gpubench.models.config import preset_names

    return SMALL_PRESET if SMALL_PRESET in preset_names() else str(EXAMPLE)


def generator_times(models: list[str], repeat: int) -> None:
    from gpubench.models.config import load_model, preset_names
    from gpubench.run import model_scenario as ms
    from gpubench.run import scenario as scenariomod

    print(
        f"{'model':<26} {'device':<6} {'entries':>7} {'generate ms':>12} {'(min-max)':>13} "
        f"{'yaml+parse ms':>14} {'(min-max)':>13}"
    )
    for spec in [*preset_names(), *models]:
        cfg = load_model(spec)
        for device, memory in (("cpu", 16 * 2**30), ("cuda", 80 * 2**30)):
            built, parsed = [], []
            for _ in range(repeat):
                t0 = time.perf_counter()
                doc = ms.build_model_scenario(cfg, "both", None, None, device, memory, spec=spec)
                t1 = time.perf_counter()
                scenariomod.parse(ms.to_yaml(doc), Path(f"--model {spec}"))
                t2 = time.perf_counter()
                built.append((t1 - t0) * 1e3)
                parsed.append((t2 - t1) * 1e3)
            print(
                f"{Path(spec).name:<26} {device:<6} {len(doc['entries']):>7} {_span(built)} {_span(parsed, 14)}",
                flush=True,
            )


def _span(times: list[float], width: int = 12) -> str:
    return f"{statistics.median(times):>{width}.2f} {f'({min(times):.2f}-{max(times):.2f})':>13}"


def cli(args: list[str], env: dict[str, str], cwd: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "gpubench.cli", *args], env=env, cwd=cwd, capture_output=True, text=True
    )
    seconds = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        sys.exit(f"gpubench {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return seconds, proc.stdout


def estimate_line(out: str) -> str:
    found = re.search(r"^estimated time: (.*)$", out, re.MULTILINE)
    return found.group(1) if found else "(no estimate printed)"


def run_cost(model: str, keep_output: Path | None = None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env = {
            **os.environ,
            "GPUBENCH_CACHE_DIR": str(root / "cache"),
            "GPUBENCH_HISTORY": str(root / "history.sqlite"),
            "COLUMNS": "200",
        }
        spec = str(Path(model).resolve()) if Path(model).exists() else model
        base = ["run", "--model", spec, "--device", "cpu", "-o", str(root / "runs")]
        _, dry = cli([*base, "--dry-run"], env, root)
        cases = re.search(r"on cpu: (\d[\d,]*) cases?", dry)
        print(f"generated scenario: {cases.group(1) if cases else '?'} cases on cpu")
        print(f"estimate, empty history:     {estimate_line(dry)}")
        seconds, out = cli([*base, "--no-history"], env, root)
        if keep_output is not None:  # the run's own output, e.g. for the docs' end-to-end example
            keep_output.write_text(f"$ gpubench {' '.join(['run', '--model', model, '--device', 'cpu'])}\n{out}")
        summary = re.search(r"^(\d+ passed, \d+ failed.*)$", out, re.MULTILINE)
        print(f"measured run (wall, whole command): {seconds:.1f} s ({summary.group(1) if summary else 'no summary'})")
        _, dry_after = cli([*base, "--dry-run"], env, root)
        print(f"estimate, after that run:    {estimate_line(dry_after)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a preset, config.json or checkpoint directory")
    parser.add_argument(
        "--repeat", type=int, default=20, help="generator calls per model and device (the median is printed)"
    )
    parser.add_argument("--no-run", action="store_true", help="time the generator only")
    parser.add_argument("--keep-output", type=Path, default=None, help="write the measured run's output to this file")
    args = parser.parse_args()
    model = args.model or default_model()
    load0 = os.getloadavg()
    print(f"{os.cpu_count()} logical cores; load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} (1, 5, 15 min)")
    generator_times([] if model == SMALL_PRESET else [model], args.repeat)
    if not args.no_run:
        run_cost(model, args.keep_output)
    load1 = os.getloadavg()
    print(f"load average after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")


if __name__ == "__main__":
    main()
