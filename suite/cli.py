"""Command line: ``gpubench run | profile | report | compare | baseline save | list | env | kv-cache | serve``.

Exit codes: 0 every case passed, 1 some case failed, 2 bad input (one paragraph, no traceback),
74 the disk is full (what finished is kept), 130 interrupted by Ctrl-C and 143 by SIGTERM (what
finished is saved).
"""
from __future__ import annotations

import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import click
import torch
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpubench import env as envmod
from gpubench import estimate, results, runner, scenario as scenariomod, techniques, timing
from gpubench.atomic import DiskFull
from gpubench.errors import BadInput
from gpubench.reports.terminal import case_params, format_speedup, print_summary


def _console(stderr: bool = False) -> Console:
    # Logs (not a terminal, no COLUMNS) get a wide fixed width rather than rich's 80 columns.
    wide = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160
    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=wide)


class _ClosedPipeSafe:
    """stdout that a reader going away (``gpubench compare ... | head -1``) cannot break: once the
    pipe is closed, output is dropped (fd 1 goes to /dev/null, so the final flush at exit succeeds
    too) and the command goes on to its own exit code, instead of click's exit 1 on EPIPE or a run
    cut short mid-case."""

    def __init__(self, stream: Any):
        self._stream = stream
        self.closed_pipe = False

    def write(self, text: str) -> int:
        if not self.closed_pipe:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self.closed_pipe:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._drop()

    def _drop(self) -> None:
        self.closed_pipe = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # not a real file (a test's buffer)
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def disk_full_text(path: str | None, strerror: str | None, what: str) -> str:
    """One paragraph for a full disk: the file it refused, how much room is left there, what was kept."""
    import shutil

    where = Path(path or ".")
    try:
        free = f"; {shutil.disk_usage(where if where.is_dir() else where.parent).free / 2**20:.1f} MiB free there"
    except OSError:
        free = ""
    return f"the disk is full: writing {where} failed ({strerror or 'no space left'}{free}). {what}"


class _Group(click.Group):
    """Turns BadInput anywhere in a command into a one-paragraph message and exit code 2, and a
    full disk into one with exit code 74; a closed stdout pipe changes neither what a command does
    nor its exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        real = sys.stdout
        sys.stdout = guarded = _ClosedPipeSafe(real)
        try:
            return super().invoke(ctx)
        except BadInput as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(runner.EXIT_BAD_INPUT)
        except DiskFull as exc:
            click.echo("error: " + disk_full_text(exc.filename, exc.strerror, "Nothing else was changed; free some "
                                                  "space and run it again."), err=True)
            ctx.exit(runner.EXIT_DISK_FULL)
        finally:
            guarded.flush()
            sys.stdout = real


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

    def case_finished(self, index: int, case: scenariomod.Case, record: results.CaseRecord) -> None:
        if self.bar is not None:
            self.bar.advance(self.task)
        opt = record.role_variant("optimized")
        line = (f"[{index + 1}/{self.total}] {record.status:<7} {case.technique} "
                f"{self._params(case.technique, record.params)}  {opt or 'optimized'} speedup "
                f"{format_speedup(record.speedups.get(opt))}  "
                f"({record.elapsed_s or 0.0:.1f} s, total {time.perf_counter() - self.t0:.0f} s)")
        if record.status != "passed" and record.failure is not None:
            line += f"\n    {record.failure.message}"
        self.console.print(line, markup=False, soft_wrap=not self.interactive)  # a log line is never wrapped

    def note(self, text: str) -> None:
        """What a running case says (a draft model trained once): above the bar, or a log line."""
        self.console.print(f"note: {text}", markup=False, soft_wrap=not self.interactive)

    def _params(self, technique: str, params: dict[str, Any]) -> str:
        return case_params({"params": params}, self.shown.get(technique))

    def run_finished(self) -> None:
        if self.bar is not None:
            self.bar.stop()


LARGE_RUN_CASES = 2_000  # a plain run past this many cases is announced with its estimated time
DRY_RUN_IDS = 3  # case ids a dry run shows per technique


def _print_dry_run(out: Console, scen: scenariomod.Scenario, counts: dict[str, int], only: list[str] | None,
                   device: str, out_root: Path, repeat_scale: float, workers: int) -> None:
    """The cases a run would measure (a count per technique, the first cases' params that vary) and
    its estimated time."""
    shown = scen.varying(only)
    first: dict[str, list[str]] = {}
    for entry in scen.entries:
        if only and entry.technique not in only:
            continue
        labels = first.setdefault(entry.technique, [])
        labels += [case_params({"params": c.params}, shown[entry.technique]) for c in
                   itertools.islice(scen.entry_cases(entry, repeat_scale), DRY_RUN_IDS - len(labels))]
    width, digits = max(map(len, counts), default=0), len(f"{max(counts.values(), default=0):,}")
    for technique, n in counts.items():
        more = f"; ... ({n - len(first[technique]):,} more)" if n > len(first[technique]) else ""
        out.print(f"  {technique:<{width}} {n:>{digits},} case{'s' if n != 1 else ' '}: "
                  f"{'; '.join(first[technique])}{more}", markup=False, soft_wrap=True)
    guess = estimate.estimate(scen, None, torch.device(device.split("#")[0]), out_root=out_root, only=only,
                              repeat_scale=repeat_scale, workers=workers, history=_case_times(device))
    out.print(f"estimated time: {guess.text()}", markup=False, soft_wrap=True)
    out.print("nothing was run or written (--dry-run)")


def _case_times(device: str) -> "CaseTimes | None":
    """The case-time history of the device model a run on ``device`` would use (None where the
    device cannot be named here, e.g. a Ray cluster's)."""
    from gpubench.devicecache import CaseTimes

    try:
        return CaseTimes(envmod.device_label(torch.device(device.split("#")[0])))
    except (RuntimeError, AssertionError, ValueError):
        return None


def _default_scenario(device_opt: str | None) -> str:
    wants_gpu = device_opt not in (None, "auto") and "cpu" not in device_opt
    return "gpu-quick" if (wants_gpu or (device_opt in (None, "auto") and torch.cuda.is_available())) else "smoke"


@main.command()
@click.option("--scenario", "-s", "scenario_name", metavar="NAME|PATH",
              help="A shipped scenario name (see `gpubench list`) or a YAML file. "
                   "Default: smoke on a CPU machine, gpu-quick on a GPU machine.")
@click.option("--device", "--devices", "devices", metavar="all|cpu|cuda|cuda:N[,...]",
              help="Where the cases run (overrides the scenario's device): one worker process per device, "
                   "cases spread over them; 'all' is every GPU here.")
@click.option("--out", "out_root", default="runs", show_default=True, type=click.Path(file_okay=False),
              help="Parent directory of the run directory <timestamp>-<scenario>/.")
@click.option("--only", metavar="TECH,...", help="Run only these techniques of the scenario.")
@click.option("--repeat-scale", type=float, default=1.0, show_default=True,
              help="Scale repetition counts and times of the measurement policy (e.g. 0.2 for a quick look).")
@click.option("--telemetry-interval", type=float, default=0.05, show_default=True, help="NVML sampling interval, seconds.")
@click.option("--no-calibrate", is_flag=True, help="Skip measuring the device peak (no %-of-peak metrics).")
@click.option("--isolation", type=click.Choice(["process", "none"]), default="process", show_default=True,
              help="process: each device's cases in a worker process that a hang or crash cannot take the run "
                   "down with; none: every case in this process (for a debugger).")
@click.option("--max-parallel", type=int, default=None, help="At most this many workers at once (default: one per device).")
@click.option("--cluster", metavar="ray|ray://HOST:PORT", help="Run each case as a Ray task (pip install 'gpubench[ray]').")
@click.option("--gpu-type", metavar="TYPE", help="With --cluster: Ray's accelerator type the tasks ask for (e.g. H100).")
@click.option("--per-model", is_flag=True, help="Run every case once on each device model among the devices "
              "(a fleet's technique x device matrix); with --cluster, --gpu-type A,B does the same.")
@click.option("--exclusive", is_flag=True, help="Refuse to start (exit 2) when other processes are using a GPU.")
@click.option("--lock-clocks", is_flag=True, help="Lock GPU clocks for the run where permitted (restored at the end).")
@click.option("--dry-run", is_flag=True, help="Validate, list the cases (a count per technique, the first few) and "
              "estimate the run time; run nothing, write nothing.")
@click.option("--profile", is_flag=True, help="After each case is timed, profile every variant (torch.profiler): "
              "traces under RUN/profiles/, a launch/sync/copy breakdown in results.json and the report.")
def run(scenario_name: str | None, devices: str | None, out_root: str, only: str | None, repeat_scale: float,
        telemetry_interval: float, no_calibrate: bool, isolation: str, max_parallel: int | None,
        cluster: str | None, gpu_type: str | None, per_model: bool, exclusive: bool, lock_clocks: bool,
        dry_run: bool, profile: bool) -> None:
    """Run a scenario: check and time every case, write a run directory."""
    from gpubench import supervisor

    if repeat_scale <= 0:
        raise BadInput(f"--repeat-scale: {repeat_scale} is not valid; allowed: a number > 0 (1 = the scenario's policy).")
    if telemetry_interval <= 0:
        raise BadInput(f"--telemetry-interval: {telemetry_interval} is not valid; allowed: seconds > 0.")
    if gpu_type and not cluster:
        raise BadInput("--gpu-type: only with --cluster (Ray's accelerator type); locally give --devices instead.")
    scen = scenariomod.load(scenario_name or _default_scenario(devices))
    if devices is not None:
        device_list = supervisor.resolve_devices(devices, "--devices")
    elif cluster:
        device_list = ["cuda" if scen.device.startswith("cuda") else "cpu"]
    else:
        device_list = supervisor.resolve_devices(scen.device, f"{scen.path}: device")
    options = supervisor.RunOptions(devices=device_list, isolation=isolation, cluster=cluster, gpu_type=gpu_type,
                                    max_parallel=max_parallel, exclusive=exclusive, lock_clocks=lock_clocks,
                                    per_model=per_model, profile=profile)
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
    supervisor.check_options(options)  # refused before anything is printed or created
    out = _console()
    where = f"Ray cluster {cluster}" if cluster else ", ".join(device_list)
    counts = scen.count(only_list)  # a huge sweep is counted, not built
    total = sum(counts.values())
    workers = 1 if cluster or isolation == "none" else min(len(device_list), max_parallel or len(device_list))
    out.print(f"gpubench run{' --dry-run' if dry_run else ''}: scenario [bold]{scen.name}[/] ({scen.path}) on "
              f"{where}" + ("" if isolation == "process" else ", in this process")
              + f": {total:,} case{'s' if total != 1 else ''}", soft_wrap=not out.is_terminal)
    if dry_run:
        _print_dry_run(out, scen, counts, only_list, device_list[0], Path(out_root), repeat_scale, workers)
        return
    if total > LARGE_RUN_CASES:
        guess = estimate.estimate(scen, None, torch.device(device_list[0].split("#")[0]), out_root=Path(out_root),
                                  only=only_list, repeat_scale=repeat_scale, workers=workers,
                                  history=_case_times(device_list[0]))
        out.print(f"[bold yellow]warning[/]: {total:,} cases (more than {LARGE_RUN_CASES:,}); estimated time "
                  f"{escape(guess.text())}. `gpubench run --dry-run` lists them without running; Ctrl-C stops "
                  f"the run and keeps what finished.", soft_wrap=True)
    progress = _CaseProgress(out, scen.varying(only_list))
    with supervisor.sigterm_as_interrupt():  # the run installs its own; this one covers the summary and report
        outcome = supervisor.run_scenario(scen, options, Path(out_root), only=only_list, repeat_scale=repeat_scale,
                                          progress=progress, telemetry_interval_s=telemetry_interval,
                                          calibrate=not no_calibrate)
        try:
            code = _close_run(out, outcome)
        except KeyboardInterrupt as exc:  # stopped while the summary was printed: the run is saved
            code = _interrupted_exit(exc, outcome)
    sys.exit(code)


def _interrupted_exit(exc: KeyboardInterrupt, outcome: runner.RunOutcome) -> int:
    """143 when SIGTERM stopped the run or what came after it, else 130."""
    from gpubench import supervisor

    sigterm = isinstance(exc, supervisor.Terminated) or outcome.record.signal == "SIGTERM"
    return runner.EXIT_TERMINATED if sigterm else runner.EXIT_INTERRUPTED


def _close_run(out: Console, outcome: runner.RunOutcome) -> int:
    """The summary, where the run is, its report; the exit code (the run's, unless the report
    could not be written: 74 on a full disk, 130 / 143 when stopped while writing it)."""
    notes = {name: t.gpu_specific for name, t in techniques.all_techniques().items()}
    print_summary(outcome.doc, out, notes)
    if outcome.record.time_use is not None:
        out.print(outcome.record.time_use.text(), markup=False, soft_wrap=True)
    out.print(f"run directory: {outcome.run_dir}", soft_wrap=True)
    if outcome.record.disk_full:
        click.echo(f"error: {_disk_full_run_text(outcome)}", err=True)
        return runner.EXIT_DISK_FULL
    out.print(f"results: {outcome.run_dir / 'results.json'} (+ results.csv, telemetry.csv, env.json)", soft_wrap=True)
    try:  # the run is on disk already; a report that fails costs the report only
        from gpubench.reports import html as html_report

        t_report = time.perf_counter()
        written = html_report.write_report(outcome.run_dir)
        _remember_report_time(outcome, time.perf_counter() - t_report)
        out.print(f"report: {written.html} (+ {written.markdown.name})", soft_wrap=True)
    except DiskFull as exc:
        click.echo("error: " + disk_full_text(exc.filename, exc.strerror, f"The run itself is saved (results.json); no "
                                              f"report was written: free some space, then `gpubench report "
                                              f"{outcome.run_dir}` writes it."), err=True)
        return runner.EXIT_DISK_FULL
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM while the report was written
        out.print(f"warning: the report was not written ({exc or 'stopped by Ctrl-C'}); the results are saved; "
                  f"`gpubench report {outcome.run_dir}` writes it", markup=False, soft_wrap=True)
        return _interrupted_exit(exc, outcome)
    except Exception as exc:  # noqa: BLE001
        out.print(f"warning: the report could not be written ({type(exc).__name__}: {exc}); "
                  f"the results are saved; try `gpubench report {outcome.run_dir}`", markup=False, soft_wrap=True)
    return outcome.exit_code


def _remember_report_time(outcome: runner.RunOutcome, seconds: float) -> None:
    """The report's share of a run, for the next dry run's estimate (a cache: never fails a run)."""
    from gpubench.devicecache import CaseTimes

    if outcome.record.device_label and outcome.record.cases:
        try:
            CaseTimes(outcome.record.device_label).record_report(seconds, len(outcome.record.cases))
        except OSError:
            pass


def _disk_full_run_text(outcome: runner.RunOutcome) -> str:
    """The full-disk paragraph of a run: where it stopped, what is kept and readable, what next."""
    run = outcome.record
    try:
        kept = len(results.load_results(outcome.run_dir).get("cases") or [])
    except BadInput:
        kept = 0
    planned = run.planned_cases
    done = len(run.cases)
    if run.status == "complete":
        stopped = f"Every one of the {done} cases ran"
    elif planned is None:
        stopped = "The run stopped before any case ran"
    else:
        stopped = f"The run stopped after {done} of {planned} case{'s' if planned != 1 else ''}"
    path, _, strerror = run.disk_full.rpartition(": ")
    return disk_full_text(path, strerror,
                          f"{stopped}; {kept} finished case{'s are' if kept != 1 else ' is'} kept in {outcome.run_dir} "
                          f"(results.json and cases.jsonl, readable as they are), and no report was written. Free "
                          f"some space, then `gpubench report {outcome.run_dir}` renders what was kept; run the "
                          f"scenario again for the rest. Exit code {runner.EXIT_DISK_FULL}.")


# --------------------------------------------------------------------------------------------
@main.command(name="profile")
@click.argument("target", metavar="TECHNIQUE|CASE_ID")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE", help="A param of the case (repeatable).")
@click.option("--scenario", "-s", "scenario_name", metavar="NAME|PATH",
              help="Take the case and its policy from this scenario: the case with id CASE_ID, or the technique's "
                   "first case; --param overrides. Default: the technique's defaults.")
@click.option("--device", default="auto", show_default=True, metavar="auto|cpu|cuda|cuda:N")
@click.option("--out", "out_root", default="runs", show_default=True, type=click.Path(file_okay=False),
              help="Parent directory of the run directory <timestamp>-profile-<technique>/.")
@click.option("--calls", type=click.IntRange(min=1), default=None, help="Calls under the profiler [default: 3].")
@click.option("--repeat-scale", type=click.FloatRange(min=0, min_open=True), default=0.2, show_default=True,
              help="Scale of the timing before the profile.")
def profile_cmd(target: str, params: tuple[str, ...], scenario_name: str | None, device: str, out_root: str,
                calls: int | None, repeat_scale: float) -> None:
    """Profile one case without a full run: check, time briefly, then profile every variant.

    gpubench profile moe_grouping --param tokens=512 [--scenario smoke] [--out DIR] prints the
    breakdown (ops, launches, syncs, copies, peak memory, top ops) and writes the traces and a
    report in a run directory."""
    from gpubench import profiling, supervisor
    from gpubench.reports import html as html_report
    from gpubench.reports.profile_view import case_table

    device_text = supervisor.resolve_devices(device, "--device")[0]
    scen = profiling.one_case_scenario(target, list(params), scenario_name, device_text, calls)
    options = supervisor.RunOptions(devices=[device_text], isolation="none")
    outcome = supervisor.run_scenario(scen, options, Path(out_root), calibrate=False, repeat_scale=repeat_scale)
    out = _console()
    doc = outcome.doc
    for number, case in enumerate(doc["cases"], 1):
        table = case_table(case, number, link_base=f"{outcome.run_dir}/")
        if table is None:
            reason = (case.get("failure") or {}).get("message") or "no variant ran"
            out.print(f"{case['id']}: nothing profiled ({reason})", markup=False)
            continue
        grid = Table(title=f"{case['id']} ({table['calls']} calls per variant)" + (f": {table['why']}" if table["why"] else ""))
        grid.add_column("per call")
        for col in table["columns"]:
            grid.add_column(f"{col['role']} {col['name']}")
        for row in table["rows"]:
            grid.add_row(row["label"], *row["cells"])
        grid.add_row(table["top_title"], *["\n".join(c["top"]) or (c["error"] or "-") for c in table["columns"]])
        out.print(grid)
        for col in table["columns"]:
            out.print(f"trace {col['name']}: {col['trace'] or col['error']}", markup=False, soft_wrap=True)
        for note in table["notes"]:
            out.print(f"note: {note}", markup=False)
        for col in table["columns"]:
            for note in col["notes"]:
                out.print(f"note ({col['name']}): {note}", markup=False)
        out.print(f"syncs counted: {table['sync_counting']}", markup=False)
    try:
        written = html_report.write_report(outcome.run_dir)
        out.print(f"run directory: {outcome.run_dir}; report: {written.html}", markup=False)
    except Exception as exc:  # noqa: BLE001 - the traces are on disk already
        out.print(f"run directory: {outcome.run_dir} (report not written: {type(exc).__name__}: {exc})", markup=False)
    sys.exit(outcome.exit_code)


# --------------------------------------------------------------------------------------------
@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The HTML file to write (default RUN_DIR/report.html); summary.md goes beside it.")
@click.option("--compare", "others", type=click.Path(path_type=Path), multiple=False, default=None,
              metavar="OTHER_RUN_DIR", help="Another run to compare with: per case the change with its CI, "
              "regressions first. Further runs may follow RUN_DIR: then a technique x device matrix of all.")
@click.argument("more", nargs=-1, type=click.Path(path_type=Path))
def report(run_dir: Path, output: Path | None, others: Path | None, more: tuple[Path, ...]) -> None:
    """Write a self-contained HTML report of a run directory, and summary.md (Markdown) beside it.

    gpubench report RUN --compare OTHER: the two runs side by side.
    gpubench report RUN --compare RUN2 RUN3 ...: the technique x device matrix of all the runs."""
    from gpubench.reports import html as html_report

    compare = ([others] if others is not None else []) + list(more)
    if more and others is None:
        raise BadInput("report: give further runs after --compare (gpubench report RUN --compare RUN2 RUN3 ...).")
    written = html_report.write_report(run_dir, output, compare=compare)
    click.echo(f"report: {written.html}")
    click.echo(f"summary: {written.markdown}")


# --------------------------------------------------------------------------------------------
@main.command(name="compare")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path), metavar="[BASELINE] CURRENT")
@click.option("--threshold", default="5%", show_default=True,
              help="Slowdown tolerated before a case can regress (scenario thresholds per technique win).")
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the Markdown summary here (e.g. for $GITHUB_STEP_SUMMARY).")
@click.option("--allow-missing", is_flag=True, help="A case missing from CURRENT does not fail the gate.")
@click.option("--force", is_flag=True, help="Compare runs of different GPU models or scenario definitions anyway "
              "(different definitions: the cases both runs hold; a case only in the baseline does not fail).")
@click.option("--baseline-store", type=click.Path(file_okay=False, path_type=Path),
              help="Pick BASELINE from this store by CURRENT's GPU model and scenario (then give CURRENT only).")
@click.option("--strict", is_flag=True,
              help="Also fail on inconclusive cases (a slowdown the same-run baseline variant shows too).")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
def compare_cmd(paths: tuple[Path, ...], threshold: str, markdown_path: Path | None, allow_missing: bool,
                force: bool, baseline_store: Path | None, strict: bool, as_json: bool) -> None:
    """The regression gate: exit 0 pass, 1 regression or correctness failure, 2 bad input.

    BASELINE and CURRENT are run directories, results.json files or pytest-benchmark JSON files."""
    from gpubench import compare as gate
    from gpubench.reports import gate as gate_report

    expected = 1 if baseline_store else 2
    if len(paths) != expected:
        raise BadInput("compare: give BASELINE and CURRENT (run directories, results.json or pytest-benchmark "
                       "JSON), or --baseline-store DIR and CURRENT alone.")
    current = gate.load_any(paths[-1])
    if baseline_store:
        baseline, stored = gate.load_from_store(baseline_store, current)
        baseline_path = ", ".join(map(str, stored))
    else:
        baseline_path = paths[0]
        baseline = gate.load_any(baseline_path)
    result = gate.compare(baseline, current, threshold=gate.parse_threshold(threshold),
                          allow_missing=allow_missing, force=force, strict=strict)
    if markdown_path is not None:
        from gpubench.atomic import atomic_write_text

        atomic_write_text(markdown_path, gate_report.to_markdown(result))
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        out = _console()
        out.print(f"baseline: {baseline_path}")
        gate_report.print_table(result, out)
        if markdown_path is not None:
            out.print(f"markdown: {markdown_path}")
    sys.exit(result.exit_code)


@main.group(name="baseline")
def baseline_group() -> None:
    """Keep stored baselines for the regression gate, one per GPU model and scenario."""


@baseline_group.command(name="save")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--baseline-dir", default="baselines-store", show_default=True,
              type=click.Path(file_okay=False, path_type=Path), help="The store (commit it to the repository).")
@click.option("--name", help="Stored name (default: the run's scenario name).")
def baseline_save(run_dir: Path, baseline_dir: Path, name: str | None) -> None:
    """Store RUN_DIR's results as the baseline for its GPU model: DIR/<GPU>/<scenario>.json (one per
    model for a run over several)."""
    from gpubench import compare as gate
    from gpubench.atomic import atomic_write_text
    from gpubench.results import load_results

    doc = load_results(run_dir)
    if doc.get("status") != "complete" or doc.get("summary", {}).get("failed"):
        raise BadInput(f"{run_dir}: only a complete run with no failed case can be a baseline "
                       f"(status {doc.get('status')!r}, {doc.get('summary', {}).get('failed', '?')} failed).")
    for label in gate.device_labels(doc):  # a run over several device models: one baseline each
        part = gate.for_device(doc, label)
        target = gate.store_path(baseline_dir, part, name)
        try:
            atomic_write_text(target, json.dumps(part, indent=1) + "\n")
        except DiskFull:
            raise  # not bad input: exit 74
        except OSError as exc:
            raise BadInput(f"--baseline-dir {baseline_dir}: cannot write {target} ({exc.strerror or exc}).") from None
        click.echo(f"baseline saved: {target}")


# --------------------------------------------------------------------------------------------
@main.command(name="list")
@click.argument("modules", nargs=-1, metavar="[MODULE|FILE.py ...]")
def list_(modules: tuple[str, ...]) -> None:
    """Show every technique (params, defaults, variants) and every shipped scenario. Techniques of
    installed packages (entry point group gpubench.techniques) are listed; MODULE or FILE.py adds
    your own (validated as a scenario would)."""
    for spec in modules:
        techniques.load(spec, Path.cwd())
    out = _console()
    for name, reason in techniques.broken().items():
        out.print(f"[bold red]{name}[/] (entry point, not loaded): {reason}", markup=True)
    for name, tech in techniques.all_techniques().items():
        out.print(f"[bold]{name}[/] ({tech.shape}): {tech.summary}")
        if tech.anchor:
            out.print(f"  measured against: {tech.anchor}")
        for claim in tech.claims:  # checked in every report's "published claims on this device"
            out.print(f"  claim: {claim.text} ({claim.source}; {claim.url})", markup=False)
        table = Table(box=None, padding=(0, 2), show_edge=False)
        for col in ("param", "type", "default", "allowed", "meaning"):
            table.add_column(col)
        for p in tech.params:
            table.add_row(p.name, p.type_name, str(p.default), p.allowed(), p.help)
        out.print(table)
        if tech.source and not tech.source.startswith("gpubench.techniques."):
            out.print(f"  from: {tech.source}")
        out.print("  variants: " + ", ".join(f"{v.name} ({v.role})" for v in tech.variants.values()))
        out.print()
    out.print("[bold]scenarios[/] (gpubench run --scenario NAME):")
    for name, path in sorted(scenariomod.shipped_scenarios().items()):
        try:
            scen = scenariomod.load(path)
            out.print(f"  {name:<12} {sum(scen.count().values()):,} cases, device {scen.device}: {scen.description}")
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


# --------------------------------------------------------------------------------------------
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str, option: str, default_unit: str = "b") -> int:
    """'80' (in ``default_unit``), '80GiB', '141GB', '13.5G' -> bytes; BadInput otherwise."""
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = (m.group(2) or default_unit).lower() if m else None
    if not m or unit not in _UNITS:
        raise BadInput(f"{option}: {text!r} is not a size; allowed: a number with an optional unit "
                       f"(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. 80GiB.")
    return int(float(m.group(1)) * _UNITS[unit])


@main.command(name="kv-cache")
@click.option("--model", "-m", metavar="PRESET", help="A built-in preset (see --list).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="A Hugging Face config.json.")
@click.option("--list", "list_presets", is_flag=True, help="List the presets and exit.")
@click.option("--seq-len", default=4096, show_default=True, type=int, help="Tokens per sequence.")
@click.option("--batch", default="fit", show_default=True, help="Sequences, or 'fit' for as many as fit.")
@click.option("--kv-dtype", default="bf16", show_default=True,
              help="fp32, bf16, fp16, fp8, int8, int4, mxfp4, nvfp4 (scale overheads are shown).")
@click.option("--block-size", default=None, type=int,
              help="Tokens per paged block. Default: vLLM's on CUDA, 16; 64 for MLA models (DeepSeek-V2/V3), "
                   "which vLLM's FlashMLA backend forces (its CUTLASS MLA backend, on Blackwell: 128).")
@click.option("--tp", default=1, show_default=True, type=int, help="Tensor-parallel GPUs.")
@click.option("--gpu-memory", metavar="SIZE", help="Per GPU, e.g. 80GiB (a bare number is GiB). Default: this GPU's, else 80GiB.")
@click.option("--utilization", default=0.9, show_default=True, type=float, help="Fraction of GPU memory the engine may use.")
@click.option("--weight-bytes", metavar="SIZE", help="Whole-model weight storage; default: from the config's parameter count.")
@click.option("--weight-dtype", help="Weight dtype for that count (default: the checkpoint's, quantization included).")
@click.option("--max-len", type=int, help="The longest a sequence may be, as vLLM's --max-model-len: what contiguous "
              "allocation reserves and what vLLM's start-up concurrency is for (default: the model's max positions).")
@click.option("--allow-long", is_flag=True, help="Allow --seq-len / --max-len beyond the model's "
              "max_position_embeddings (as vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN=1).")
@click.option("--max-num-batched-tokens", type=int, default=None,
              help="vLLM's prefill chunk, for its start-up max concurrency with sliding-window layers. Default: "
                   "vllm serve's, 8192 on a GPU of >= 70 GiB other than an A100, else 2048.")
@click.option("--overhead", metavar="SIZE", default="0", help="Other memory per GPU (activations, CUDA graphs), e.g. 4GiB.")
@click.option("--disable-hybrid-kv-cache-manager", "no_hybrid", is_flag=True,
              help="As vLLM's flag: every layer keeps every token (sliding and chunked layers included).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def kv_cache(model, config_path, list_presets, seq_len, batch, kv_dtype, block_size, tp, gpu_memory,
             utilization, weight_bytes, weight_dtype, max_len, allow_long, max_num_batched_tokens, overhead,
             no_hybrid, as_json) -> None:
    """KV-cache memory per token, per sequence and per GPU; how many sequences fit.

    Exit codes: 0 it fits; 1 it does not fit (the weights on one GPU, a single sequence, the
    requested --batch, or one request of --max-len, which vLLM refuses to start with: a result,
    stated with what to try); 2 bad input (an invalid option or config,
    a length beyond the model's positions without --allow-long)."""
    from gpubench import kvmath
    from gpubench.models import config as model_config
    from gpubench.models import params as model_params
    from gpubench.reports import kv_table

    if list_presets:
        _list_presets(as_json)
        return
    if (model is None) == (config_path is None):
        raise BadInput("kv-cache: give exactly one of --model PRESET or --config path/to/config.json "
                       f"(presets: {', '.join(model_config.preset_names())}).")
    cfg = model_config.load_preset(model) if model else model_config.load_config_file(config_path)
    kv_fmt = kvmath.kv_format(kv_dtype)
    if batch == "fit":
        n_batch = None
    else:
        try:
            n_batch = int(batch)
        except ValueError:
            raise BadInput(f"--batch: {batch!r} is not valid; allowed: a positive integer or 'fit'.") from None
    device_name = ""
    if gpu_memory is not None:
        gpu_bytes = parse_size(gpu_memory, "--gpu-memory", default_unit="gib")
        memory_note = ""
    elif torch.cuda.is_available():
        gpu_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        device_name = torch.cuda.get_device_name()
        memory_note = f" ({device_name})"
    else:
        gpu_bytes, memory_note = 80 * 2**30, " (assumed: no GPU here; pass --gpu-memory)"
    if weight_dtype is not None and model_params.normalize_dtype(weight_dtype) not in model_config.DTYPE_BYTES:
        raise BadInput(f"--weight-dtype: {weight_dtype!r} is not supported; allowed: "
                       f"{', '.join(model_config.DTYPE_BYTES)} (and aliases fp32, fp16, bf16).")
    if weight_bytes is not None:
        wb, wnote = parse_size(weight_bytes, "--weight-bytes"), "given (--weight-bytes)"
    else:
        computed = model_params.weight_bytes(cfg, weight_dtype)
        wb, wnote = computed.bytes, computed.note
    plan = kvmath.plan(cfg, seq_len=seq_len, batch=n_batch, kv_dtype=kv_fmt.name, block_size=block_size, tp=tp,
                       gpu_memory_bytes=gpu_bytes, utilization=utilization, weight_bytes=wb,
                       weight_note=wnote, max_len=max_len, allow_long=allow_long,
                       max_num_batched_tokens=max_num_batched_tokens, device_name=device_name,
                       overhead_bytes=parse_size(overhead, "--overhead", default_unit="gib"),
                       kv_scales_in_weights=weight_bytes is not None, hybrid=not no_hybrid)
    if as_json:
        click.echo(json.dumps({**plan.to_dict(), "gpu_memory_note": memory_note.strip(" ()")}, indent=2))
    else:
        out = _console()
        if memory_note:
            out.print(f"GPU memory {gpu_bytes / 2**30:.0f} GiB{memory_note}")
        kv_table.render(plan, out)
    refused = _vllm_refuses(plan)
    if not plan.fits or refused:  # a result, not bad input: exit 1 (see the docstring)
        if as_json:
            click.echo(plan.fit_problem or refused, err=True)
        elif refused:
            _console().print(refused, style="bold red", markup=False, soft_wrap=True)
        sys.exit(1)


def _vllm_refuses(plan: Any) -> str:
    """Why vLLM would not start with this plan although the batch fits (one request of --max-len
    needs more KV than there is: its start-up check), or ''."""
    if not plan.fits or plan.free_bytes < 0 or plan.vllm_max_concurrency >= 1:
        return ""
    from gpubench.kvmath import human_bytes

    return (f"vLLM would refuse to start: one request of --max-len {plan.max_len:,} tokens needs "
            f"{human_bytes(plan.vllm_bytes_per_request)} of KV, and {human_bytes(max(0, plan.free_bytes))} is free for "
            f"KV per GPU; lower --max-len (vLLM's --max-model-len) or add GPUs (--tp).")


def _list_presets(as_json: bool) -> None:
    from gpubench.models import config as model_config
    from gpubench.models import params as model_params

    rows = []
    for name in model_config.preset_names():
        raw = model_config.preset_raw(name)
        cfg = model_config.from_dict(raw, name, f"preset {name}")
        rows.append({"preset": name, "model_type": cfg.model_type, "attention": cfg.attention,
                     "layers": cfg.num_layers, "kv_heads": cfg.num_kv_heads if not cfg.mla else None,
                     "head_dim": cfg.head_dim if not cfg.mla else cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim,
                     "sliding_layers": cfg.sliding_layers,
                     "params": model_params.count_parameters(cfg).total,
                     "published_params": raw.get("_published_params"), "source": raw.get("_source")})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="presets (published configs)", title_justify="left")
    for col in ("preset", "type", "attention", "layers", "KV heads", "KV vector", "sliding layers",
                "params (counted)", "published"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["preset"], r["model_type"], r["attention"], str(r["layers"]), str(r["kv_heads"] or "-"),
                      str(r["head_dim"]), str(r["sliding_layers"]), f"{r['params'] / 1e9:.2f}B",
                      f"{r['published_params'] / 1e9:.2f}B" if r["published_params"] else "-")
    _console().print(table)



# --------------------------------------------------------------------------------------------
@main.command(name="serve")
@click.option("--model", "-m", default="tiny", show_default=True,
              help="A built-in size (tiny, small, 100m, 1b; seeded random weights) or a local Hugging Face "
                   "Llama-style checkpoint directory (needs transformers: pip install 'gpubench[hf]').")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "bfloat16", "float16", "float64"]))
@click.option("--device", default="auto", show_default=True, metavar="auto|cpu|cuda|cuda:N")
@click.option("--trace", "trace_file", type=click.Path(dir_okay=False),
              help="JSONL trace: {arrival_s, prompt_len | prompt, output_len} per line (else a synthetic one).")
@click.option("--requests", default=50, show_default=True, type=int, help="Synthetic trace: requests.")
@click.option("--arrival", default="poisson:40", show_default=True, help="Synthetic trace: poisson:RATE, gamma:RATE:BURSTINESS or all.")
@click.option("--prompt-len", default="uniform:16:64", show_default=True, help="Synthetic trace: fixed:N, uniform:LO:HI, exp:MEAN:CAP, lognormal:MEAN:SIGMA:CAP.")
@click.option("--output-len", default="exp:48:160", show_default=True, help="Synthetic trace: as --prompt-len.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the weights and the synthetic trace.")
@click.option("--engine", "engines", multiple=True, default=["static+contiguous", "continuous+paged"], show_default=True,
              help="SCHEDULER+KV, repeatable: static|continuous + contiguous|paged.")
@click.option("--kv-budget", default="2MiB", show_default=True, metavar="SIZE", help="KV-cache memory of every engine.")
@click.option("--max-len", default=256, show_default=True, type=int, help="Longest request (prompt + output).")
@click.option("--max-batch", default=16, show_default=True, type=int, help="Most requests decoding at once.")
@click.option("--block-size", default=16, show_default=True, type=click.Choice(["8", "16", "32"]))
@click.option("--batch-timeout-ms", default=50.0, show_default=True, type=float, help="Static batching's wait for a full batch.")
@click.option("--temperature", default=0.0, show_default=True, type=float, help="0: greedy; > 0: sampled.")
@click.option("--no-wait", is_flag=True, help="Every request at time 0 (offline throughput) instead of at its arrival time.")
@click.option("--slo-ttft-ms", default=1000.0, show_default=True, type=float, help="Goodput: TTFT target.")
@click.option("--slo-tpot-ms", default=100.0, show_default=True, type=float, help="Goodput: TPOT target.")
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as JSON.")
def serve(model, dtype, device, trace_file, requests, arrival, prompt_len, output_len, seed, engines, kv_budget,
          max_len, max_batch, block_size, batch_timeout_ms, temperature, no_wait, slo_ttft_ms, slo_tpot_ms, as_json):
    """Serve a request trace through one or more engines and print vLLM-style serving metrics
    (throughput, TTFT / TPOT / ITL / end-to-end percentiles, goodput, KV utilization, concurrency)."""
    from gpubench.models.llama import model_from
    from gpubench.serving.bench import DTYPES
    from gpubench.serving.config import KV_LAYOUTS, SCHEDULERS, EngineConfig
    from gpubench.serving.engine import Engine
    from gpubench.serving.metrics import serving_metrics
    from gpubench.serving.traces import TraceSpec, generate, parse_arrival, parse_length

    pairs = []
    for text in engines:
        scheduler, _, kv = text.partition("+")
        if scheduler not in SCHEDULERS or kv not in KV_LAYOUTS:
            raise BadInput(f"--engine: {text!r} is not valid; allowed: SCHEDULER+KV with SCHEDULER one of "
                           f"{list(SCHEDULERS)} and KV one of {list(KV_LAYOUTS)}, e.g. continuous+paged.")
        pairs.append((scheduler, kv))
    for option, value, parse in (("--arrival", arrival, parse_arrival), ("--prompt-len", prompt_len, parse_length),
                                 ("--output-len", output_len, parse_length)):
        try:
            parse(value)
        except ValueError as exc:
            raise BadInput(f"{option}: {exc}.") from None
    for option, value in (("--requests", requests), ("--max-len", max_len), ("--max-batch", max_batch)):
        if value < 1:
            raise BadInput(f"{option}: {value} is not valid; allowed: an integer >= 1.")
    dev = envmod.resolve_device(device)
    weights = model_from(model, seed, DTYPES[dtype], dev)
    reqs = generate(TraceSpec(requests, arrival, prompt_len, output_len, weights.config.vocab_size, trace_file), seed + 1)
    longest = max(r.prompt_len + r.output_len for r in reqs)
    if longest > max_len:
        raise BadInput(f"--max-len: {max_len} is below the trace's longest request ({longest} tokens, prompt + "
                       f"output); allowed: a value >= {longest}.")
    budget = parse_size(kv_budget, "--kv-budget", default_unit="mib")
    results_by_engine = {}
    for scheduler, kv in pairs:
        cfg = EngineConfig(scheduler=scheduler, kv=kv, kv_budget_bytes=budget, block_size=int(block_size),
                           max_len=max_len, max_batch=max_batch, batch_timeout_s=batch_timeout_ms / 1e3,
                           temperature=temperature, wait=not no_wait)
        try:
            run = Engine(weights, cfg).run(reqs)
        except ValueError as exc:  # a budget that holds no slab / block
            raise BadInput(f"--kv-budget: {exc}; allowed: a larger size.") from None
        m = serving_metrics(run, slo_ttft_ms, slo_tpot_ms)
        m["accounting_problems"] = run.accounting_problems
        results_by_engine[f"{scheduler}+{kv}"] = m
    if as_json:
        click.echo(json.dumps({"model": model, "params": weights.config.num_params(), "device": str(dev),
                               "engines": results_by_engine}, indent=2))
        return
    out = _console()
    table = Table(title=f"{len(reqs)} requests, model {model} ({weights.config.num_params() / 1e6:.1f}M params, "
                        f"{dtype}) on {envmod.device_label(dev)}, KV budget {budget / 2**20:.1f} MiB"
                        + (", all at once" if no_wait else ""), title_justify="left")
    table.add_column("metric")
    for name in results_by_engine:
        table.add_column(name, justify="right")
    rows = [("output tokens/s", "output_tokens_per_s", "{:.0f}"), ("requests/s", "request_throughput", "{:.2f}"),
            ("goodput requests/s", "goodput_requests_per_s", "{:.2f}")]
    rows += [(f"{stat} {name.upper()} ms", f"{stat}_{name}_ms", "{:.1f}")
             for name in ("ttft", "tpot", "itl", "e2e") for stat in ("median", "p99")]
    rows += [("KV utilization (live/reserved)", "kv_utilization", "{:.1%}"), ("max concurrency", "max_concurrency", "{}"),
             ("preemptions", "preemptions", "{}"), ("duration s", "duration_s", "{:.2f}")]
    for label, key, fmt in rows:
        table.add_row(label, *[("-" if m.get(key) is None else fmt.format(m[key])) for m in results_by_engine.values()])
    out.print(table)
    for name, m in results_by_engine.items():
        if m["accounting_problems"]:
            out.print(f"[bold red]{name}: KV accounting problems: {'; '.join(m['accounting_problems'][:3])}[/]")


if __name__ == "__main__":  # pragma: no cover - after every command is defined
    main()
