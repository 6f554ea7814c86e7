"""Command line: ``gpubench run | list | env``.

Exit codes: 0 every case passed, 1 some case failed, 2 bad input (one paragraph, no traceback),
130 interrupted (what finished is saved).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpubench import env as envmod
from gpubench import runner, scenario as scenariomod, techniques, timing
from gpubench.errors import BadInput
from gpubench.reports.terminal import case_params, format_speedup, print_summary, shown_params


def _console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 160)


class _Group(click.Group):
    """Turns BadInput anywhere in a command into a one-paragraph message and exit code 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BadInput as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(runner.EXIT_BAD_INPUT)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gpubench")
def main() -> None:
    """gpubench: what LLM training and inference optimizations are worth on this machine."""


# --------------------------------------------------------------------------------------------
class _CaseProgress:
    """A progress bar on a terminal (case i/n, technique, params, elapsed); one line per case
    otherwise (CI logs)."""

    def __init__(self, console: Console, shown: dict[str, set[str]]):
        self.console = console
        self.shown = shown
        self.interactive = console.is_terminal
        self.bar: Progress | None = None
        self.task = None
        self.t0 = time.perf_counter()

    def run_started(self, total: int) -> None:
        self.total = total
        if self.interactive:
            self.bar = Progress(TextColumn("case"), MofNCompleteColumn(), BarColumn(),
                                TextColumn("{task.description}"), TimeElapsedColumn(), console=self.console)
            self.bar.start()
            self.task = self.bar.add_task("calibrating", total=total)

    def case_started(self, index: int, case: scenariomod.Case) -> None:
        self.case_t0 = time.perf_counter()
        if self.bar is not None:
            self.bar.update(self.task, description=f"{case.technique} {self._params(case.technique, case.params)}")

    def case_finished(self, index: int, case: scenariomod.Case, record: dict[str, Any]) -> None:
        if self.bar is not None:
            self.bar.advance(self.task)
        opt = next((n for n, v in record["variants"].items() if v.get("role") == "optimized"), None)
        line = (f"[{index + 1}/{self.total}] {record['status']:<7} {case.technique} "
                f"{self._params(case.technique, record['params'])}  speedup {format_speedup(record['speedups'].get(opt))}  "
                f"({record['elapsed_s']:.1f} s, total {time.perf_counter() - self.t0:.0f} s)")
        if record["status"] != "passed" and record.get("failure"):
            line += f"\n    {record['failure']['message']}"
        self.console.print(line, markup=False)

    def _params(self, technique: str, params: dict[str, Any]) -> str:
        return case_params({"params": params}, self.shown.get(technique))

    def run_finished(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _default_scenario(device_opt: str | None) -> str:
    wants_gpu = device_opt not in (None, "auto") and device_opt != "cpu"
    return "gpu-quick" if (wants_gpu or (device_opt in (None, "auto") and torch.cuda.is_available())) else "smoke"


@main.command()
@click.option("--scenario", "-s", "scenario_name", metavar="NAME|PATH",
              help="A shipped scenario name (see `gpubench list`) or a YAML file. "
                   "Default: smoke on a CPU machine, gpu-quick on a GPU machine.")
@click.option("--device", metavar="auto|cpu|cuda|cuda:N", help="Overrides the scenario's device.")
@click.option("--out", "out_root", default="runs", show_default=True, type=click.Path(file_okay=False),
              help="Parent directory of the run directory <timestamp>-<scenario>/.")
@click.option("--only", metavar="TECH,...", help="Run only these techniques of the scenario.")
@click.option("--repeat-scale", type=float, default=1.0, show_default=True,
              help="Scale repetition counts and times of the measurement policy (e.g. 0.2 for a quick look).")
@click.option("--telemetry-interval", type=float, default=0.05, show_default=True, help="NVML sampling interval, seconds.")
@click.option("--no-calibrate", is_flag=True, help="Skip measuring the device peak (no %-of-peak metrics).")
def run(scenario_name: str | None, device: str | None, out_root: str, only: str | None,
        repeat_scale: float, telemetry_interval: float, no_calibrate: bool) -> None:
    """Run a scenario: check and time every case, write a run directory."""
    if repeat_scale <= 0:
        raise BadInput(f"--repeat-scale: {repeat_scale} is not valid; allowed: a number > 0 (1 = the scenario's policy).")
    if telemetry_interval <= 0:
        raise BadInput(f"--telemetry-interval: {telemetry_interval} is not valid; allowed: seconds > 0.")
    scen = scenariomod.load(scenario_name or _default_scenario(device))
    if device is not None:
        dev = envmod.resolve_device(device, "--device")
    else:
        dev = envmod.resolve_device(scen.device, f"{scen.path}: device")
    only_list = None
    if only:
        only_list = [t.strip() for t in only.split(",") if t.strip()]
        in_scenario = sorted({e.technique for e in scen.entries})
        for name in only_list:
            if techniques.get(name) is None:
                raise BadInput(f"--only: {name!r} is not a registered technique; allowed: "
                               f"{', '.join(techniques.all_techniques())}.")
            if name not in in_scenario:
                raise BadInput(f"--only: scenario {scen.name} ({scen.path}) has no entry for {name!r}; "
                               f"its techniques: {', '.join(in_scenario)}.")
    out = _console()
    out.print(f"gpubench run: scenario [bold]{scen.name}[/] ({scen.path}) on {envmod.device_label(dev)}")
    cases = scen.cases(only=only_list)
    swept: dict[str, set[str]] = {}
    for entry in scen.entries:
        swept.setdefault(entry.technique, set()).update(entry.grid)
    shown = {t: shown_params([c.params for c in cases if c.technique == t], keys) for t, keys in swept.items()}
    progress = _CaseProgress(out, shown)
    outcome = runner.run_scenario(scen, dev, Path(out_root), only=only_list, repeat_scale=repeat_scale,
                                  progress=progress, telemetry_interval_s=telemetry_interval,
                                  calibrate=not no_calibrate)
    notes = {name: t.gpu_specific for name, t in techniques.all_techniques().items()}
    print_summary(outcome.doc, out, notes)
    out.print(f"run directory: {outcome.run_dir}")
    out.print(f"results: {outcome.run_dir / 'results.json'} (+ results.csv, telemetry.csv, env.json)")
    sys.exit(outcome.exit_code)


# --------------------------------------------------------------------------------------------
@main.command(name="list")
def list_() -> None:
    """Show every technique (params, defaults, variants) and every shipped scenario."""
    out = _console()
    for name, tech in techniques.all_techniques().items():
        out.print(f"[bold]{name}[/] ({tech.shape}): {tech.summary}")
        if tech.anchor:
            out.print(f"  measured against: {tech.anchor}")
        table = Table(box=None, padding=(0, 2), show_edge=False)
        for col in ("param", "type", "default", "allowed", "meaning"):
            table.add_column(col)
        for p in tech.params:
            table.add_row(p.name, p.type_name, str(p.default), p.allowed(), p.help)
        out.print(table)
        out.print("  variants: " + ", ".join(f"{v.name} ({v.role})" for v in tech.variants.values()))
        out.print()
    out.print("[bold]scenarios[/] (gpubench run --scenario NAME):")
    for name, path in sorted(scenariomod.shipped_scenarios().items()):
        try:
            scen = scenariomod.load(path)
            out.print(f"  {name:<12} {len(scen.cases())} cases, device {scen.device}: {scen.description}")
        except BadInput as exc:
            out.print(f"  {name:<12} [red]invalid[/]: {exc}")


# --------------------------------------------------------------------------------------------
@main.command(name="env")
@click.option("--device", default="auto", show_default=True, metavar="auto|cpu|cuda|cuda:N")
@click.option("--calibrate", is_flag=True, help="Measure matmul FLOP/s and copy bandwidth (takes a few seconds).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def env_(device: str, calibrate: bool, as_json: bool) -> None:
    """Show the environment, the harness's per-repetition overhead and (with --calibrate) the
    device's measured ceilings."""
    dev = envmod.resolve_device(device)
    info = envmod.capture_env(dev)
    info["harness_overhead_us"] = timing.harness_overhead_s(dev) * 1e6
    if calibrate:
        info["ceilings"] = envmod.calibrate(dev)
    if as_json:
        click.echo(json.dumps(info, indent=2, default=str))
        return
    out = _console()
    table = Table(box=None, show_header=False, padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    gpu = info.get("gpu") or {}
    rows = [
        ("device", f"{info['device']} ({info['device_label']})"),
        ("gpu", f"{gpu.get('name')} cc {gpu.get('compute_capability')}, driver {gpu.get('driver_version')}, "
                f"{(gpu.get('total_memory_bytes') or 0) / 2**30:.0f} GiB" if gpu else "none"),
        ("torch", f"{info['torch']} (CUDA {info['torch_cuda'] or 'none'})"),
        ("triton", info["triton"] or "not installed"),
        ("python", info["python"]),
        ("cpu", f"{info['cpu']['model']}, {info['cpu']['logical_cores']} logical cores, "
                f"torch threads {info['cpu']['torch_threads']}"),
        ("host", f"{info['host']} ({info['platform']})"),
        ("git", f"{info['git']['commit'] or 'not a git checkout'}" + (" (dirty)" if info["git"]["dirty"] else "")),
        ("harness overhead", f"{info['harness_overhead_us']:.2f} us per repetition "
                             f"({'CUDA events' if dev.type == 'cuda' else 'perf_counter_ns'}, median of a no-op)"),
    ]
    if calibrate:
        c = info["ceilings"]
        rows.append(("matmul peak", f"{c['matmul']['peak_tflops']:.3g} TFLOP/s {c['matmul']['dtype']} "
                                    f"(n={c['matmul']['n']}; median {c['matmul']['median_tflops']:.3g})"))
        rows.append(("copy bandwidth", f"{c['copy']['peak_gbps']:.4g} GB/s read+write "
                                       f"(median {c['copy']['median_gbps']:.4g})"))
        for key in ("h2d", "d2h"):
            if key in c:
                rows.append((key, f"{c[key]['peak_gbps']:.4g} GB/s pinned"))
    for k, v in rows:
        table.add_row(k, str(v))
    out.print(table)


if __name__ == "__main__":  # pragma: no cover
    main()
