"""``gpubench run`` (a scenario through the supervisor, its progress, summary and report),
``gpubench profile`` (one case under the profiler) and ``gpubench report`` (a run's HTML report)."""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from gpubench import techniques
from gpubench.cli.console import disk_full_text, make_console
from gpubench.errors import BadInput
from gpubench.records import results
from gpubench.records.atomic import DiskFull
from gpubench.records.model_origin import ModelOrigin
from gpubench.records.policy import CAP_NOTE_START, memory_cap_note
from gpubench.reports.terminal import case_params, fit_fields, format_speedup, print_summary, wrap_words
from gpubench.run import scenario as scenariomod
from gpubench.run import stopping
from gpubench.run.outcome import EXIT_DISK_FULL, EXIT_INTERRUPTED, EXIT_OVERLOADED, EXIT_TERMINATED, RunOutcome

if TYPE_CHECKING:
    from gpubench.measure.devicecache import CaseTimes
    from gpubench.run.estimate import Estimate
    from gpubench.run.run_options import RunOptions

# torch (through env, estimate and run_options) is imported inside the functions that need it, so
# that `gpubench --help`, a bad option and `gpubench report` start at once (issue 35).


class _CaseProgress:
    """A progress bar on a terminal (case i/n, technique, params, elapsed); one line per case
    otherwise (CI logs)."""

    def __init__(self, console: Console, shown: dict[str, set[str]]):
        self.console = console
        self.shown = shown
        self.interactive = console.is_terminal
        self.bar: Progress | None = None
        self.task = TaskID(0)  # the bar's task, set with it (read only while self.bar is set)
        self.t0 = time.perf_counter()

    def run_started(self, total: int) -> None:
        self.total = total
        if self.interactive:
            # transient: stopped (the run's end, Ctrl-C, SIGTERM) the bar is erased, not left stale
            self.bar = Progress(
                TextColumn("case"),
                MofNCompleteColumn(),
                BarColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
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
        fields = [
            f"[{index + 1}/{self.total}] {record.status:<7} {case.technique} "
            f"{self._params(case.technique, record.params)}",
            f"{opt or 'optimized'} speedup {format_speedup(record.speedups.get(opt) if opt is not None else None)}",
            f"({record.elapsed_s or 0.0:.1f} s, total {time.perf_counter() - self.t0:.0f} s)",
        ]
        reason = record.failure.message if record.status != "passed" and record.failure is not None else ""
        if not self.interactive:  # a log line is never wrapped
            self.console.print("  ".join(fields) + (f"\n    {reason}" if reason else ""), markup=False, soft_wrap=True)
            return
        # a terminal's lines break between fields (a CI stays whole), a reason between words
        lines = fit_fields(fields, self.console.width)
        if reason:
            lines += ["    " + line for line in wrap_words(reason, self.console.width - 4, "")]
        self.console.print("\n".join(lines), markup=False, soft_wrap=True)

    def case_not_run(self, index: int, case: scenariomod.Case, skipped: results.NotRunCase) -> None:
        """A case the run's budget passed over: a line (and the bar moves on)."""
        from gpubench.run import estimate

        if self.bar is not None:
            self.bar.advance(self.task)
        self.console.print(
            f"[{index + 1}/{self.total}] not run {case.technique} {self._params(case.technique, case.params)}"
            f"  budget: would need {skipped.need_text()}; {estimate.duration_text(skipped.left_s or 0.0)} "
            "left",
            markup=False,
            soft_wrap=not self.interactive,
        )

    def note(self, text: str) -> None:
        """What a running case says (a draft model trained once): above the bar, or a log line."""
        self.console.print(f"note: {text}", markup=False, soft_wrap=not self.interactive)

    def _params(self, technique: str, params: dict[str, Any]) -> str:
        return case_params({"params": params}, self.shown.get(technique))

    def run_finished(self) -> None:
        """Stop (and erase) the bar; called again after an interrupted run, it does nothing."""
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


LARGE_RUN_CASES = 2_000  # a plain run past this many cases is announced with its estimated time
DRY_RUN_IDS = 3  # case ids a dry run shows per technique


def _print_dry_run(
    out: Console,
    scen: scenariomod.Scenario,
    counts: dict[str, int],
    only: list[str] | None,
    device: str,
    out_root: Path,
    repeat_scale: float,
    workers: int,
    budget_s: float | None = None,
    fill: bool = False,
) -> None:
    """The cases a run would measure (a count per technique, the first cases' params that vary),
    its estimated time, and with a budget the plan (:func:`_print_budget_plan`)."""

    shown = scen.varying(only)
    first: dict[str, list[str]] = {}
    for entry in scen.entries:
        if only and entry.technique not in only:
            continue
        labels = first.setdefault(entry.technique, [])
        labels += [
            case_params({"params": c.params}, shown[entry.technique])
            for c in itertools.islice(scen.entry_cases(entry, repeat_scale), DRY_RUN_IDS - len(labels))
        ]
    width, digits = max(map(len, counts), default=0), len(f"{max(counts.values(), default=0):,}")
    for technique, n in counts.items():
        more = f"; ... ({n - len(first[technique]):,} more)" if n > len(first[technique]) else ""
        out.print(
            f"  {technique:<{width}} {n:>{digits},} case{'s' if n != 1 else ' '}: {'; '.join(first[technique])}{more}",
            markup=False,
            soft_wrap=not out.is_terminal,
        )
    guess = _estimate(scen, only, device, out_root, repeat_scale, workers)
    out.print(f"estimated time: {guess.text()}", markup=False, soft_wrap=not out.is_terminal)
    if budget_s is not None:
        _print_budget_plan(out, scen, only, device, out_root, repeat_scale, workers, budget_s, fill)
    out.print("nothing was run or written (--dry-run)")


PLAN_LINES = 200  # cases a dry run's budget plan lists; the rest are counted


def _print_budget_plan(
    out: Console,
    scen: scenariomod.Scenario,
    only: list[str] | None,
    device: str,
    out_root: Path,
    repeat_scale: float,
    workers: int,
    budget_s: float,
    fill: bool = False,
) -> None:
    """``--dry-run --budget``: the cases in the order they would run, each with its estimate and
    when it would start, or why it would not run; then what would run and what would not."""
    import torch

    from gpubench.run import budget as budgetmod
    from gpubench.run import estimate

    costs = estimate.CaseCosts(
        torch.device(device.split("#")[0]), history=_case_times(device), out_root=out_root, repeat_scale=repeat_scale
    )
    cases = budgetmod.breadth_first(scen.cases(only, repeat_scale), scen.order)
    steps = budgetmod.plan(cases, costs, budget_s, workers, fill)
    shown = scen.varying(only)
    order = (
        f"techniques in the scenario's order ({', '.join(scen.order)} first)"
        if scen.order
        else "techniques as they first appear"
    )
    out.print(
        f"plan for --budget {estimate.duration_text(budget_s)}{' (--fill-budget: a case starts while the time left holds what it takes at least)' if fill else ''}: breadth-first ({order}); start-up "
        f"{estimate.duration_text(costs.startup_s())}" + (f", {workers} workers" if workers > 1 else ""),
        markup=False,
        soft_wrap=not out.is_terminal,
    )
    for n, step in enumerate(steps[:PLAN_LINES], 1):
        label = f"{step.case.technique} {case_params({'params': step.case.params}, shown.get(step.case.technique))}"
        guess = step.estimate
        figure = f"{guess.text()}, counted as {estimate.duration_text(guess.plan_s)}"
        if step.start_s is None:
            out.print(
                f"  {n:>4}. not run: budget  {label}  ({figure}; {estimate.duration_text(max(0.0, step.left_s))} "
                "left then)",
                markup=False,
                soft_wrap=not out.is_terminal,
            )
        else:
            out.print(
                f"  {n:>4}. at {estimate.duration_text(step.start_s):>6}  {label}  ({figure})",
                markup=False,
                soft_wrap=not out.is_terminal,
            )
    if len(steps) > PLAN_LINES:
        out.print(f"  ... ({len(steps) - PLAN_LINES:,} more)", markup=False)
    skipped = [budgetmod.not_run(s.case, s.estimate, s.left_s) for s in steps if s.start_s is None]
    ran = len(steps) - len(skipped)
    out.print(
        f"would run {ran} of {len(steps)} cases" + (f"; {results.not_run_text(skipped)}" if skipped else ""),
        markup=False,
        soft_wrap=not out.is_terminal,
    )


def _estimate(
    scen: scenariomod.Scenario, only: list[str] | None, device: str, out_root: Path, repeat_scale: float, workers: int
) -> Estimate:
    """The run's estimated time on ``device``, from this device model's recorded case times where
    there are (a dry run's and a large run's warning say the same figure)."""
    import torch  # past the checks of the input: a bad option or scenario is refused without it

    from gpubench.run import estimate

    return estimate.estimate(
        scen,
        None,
        torch.device(device.split("#")[0]),
        out_root=out_root,
        only=only,
        repeat_scale=repeat_scale,
        workers=workers,
        history=_case_times(device),
    )


def _case_times(device: str) -> CaseTimes | None:
    """The case-time history of the device model a run on ``device`` would use (None where the
    device cannot be named here, e.g. a Ray cluster's)."""
    import torch

    from gpubench.measure import env as envmod
    from gpubench.measure.devicecache import CaseTimes

    try:
        return CaseTimes(envmod.device_label(torch.device(device.split("#")[0])))
    except (RuntimeError, AssertionError, ValueError):
        return None


def _default_scenario(device_opt: str | None) -> str:
    import torch

    wants_gpu = device_opt not in (None, "auto") and "cpu" not in device_opt
    return "gpu-quick" if (wants_gpu or (device_opt in (None, "auto") and torch.cuda.is_available())) else "smoke"


@click.command()
@click.option(
    "--scenario",
    "-s",
    "scenario_name",
    metavar="NAME|PATH",
    help="A shipped scenario name (see `gpubench list`) or a YAML file. "
    "Default: smoke on a CPU machine, gpu-quick on a GPU machine.",
)
@click.option(
    "--device",
    "--devices",
    "devices",
    metavar="all|cpu|cuda|cuda:N[,...]",
    help="Where the cases run (overrides the scenario's device): one worker process per device, "
    "cases spread over them; 'all' is every GPU here.",
)
@click.option(
    "-o",
    "--out",
    "out_root",
    default="runs",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Parent directory of the run directory <timestamp>-<scenario>/.",
)
@click.option("--only", metavar="TECH,...", help="Run only these techniques of the scenario.")
@click.option(
    "--repeat-scale",
    type=float,
    default=1.0,
    show_default=True,
    help="Scale repetition counts and times of the measurement policy (e.g. 0.2 for a quick look).",
)
@click.option(
    "--telemetry-interval", type=float, default=0.05, show_default=True, help="NVML sampling interval, seconds."
)
@click.option("--no-calibrate", is_flag=True, help="Skip measuring the device peak (no %-of-peak metrics).")
@click.option(
    "--isolation",
    type=click.Choice(["process", "none"]),
    default="process",
    show_default=True,
    help="process: each device's cases in a worker process that a hang or crash cannot take the run "
    "down with; none: every case in this process (for a debugger).",
)
@click.option(
    "--max-parallel", type=int, default=None, help="At most this many workers at once (default: one per device)."
)
@click.option(
    "--cluster", metavar="ray|ray://HOST:PORT", help="Run each case as a Ray task (pip install 'gpubench[ray]')."
)
@click.option(
    "--gpu-type", metavar="TYPE", help="With --cluster: Ray's accelerator type the tasks ask for (e.g. H100)."
)
@click.option(
    "--per-model",
    is_flag=True,
    help="Run every case once on each device model among the devices "
    "(a fleet's technique x device matrix); with --cluster, --gpu-type A,B does the same.",
)
@click.option("--exclusive", is_flag=True, help="Refuse to start (exit 2) when other processes are using a GPU.")
@click.option("--lock-clocks", is_flag=True, help="Lock GPU clocks for the run where permitted (restored at the end).")
@click.option(
    "--budget",
    "budget_text",
    metavar="DURATION",
    help="Plan the run to fit this wall time, start-up "
    "and report included (540, 540s, 9m, 1h30m): cases run breadth-first over techniques (the scenario's "
    "order first), a case starts only if the time left holds its estimate, the others are recorded as "
    "not run: budget. With --dry-run, shows the plan.",
)
@click.option(
    "--fill-budget",
    is_flag=True,
    help="With --budget: start a case while the time left holds what it "
    "takes at least, not its conservative estimate, so the budget is used to its end (the last case may "
    "be stopped at the budget, keeping what it measured).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Validate, list the cases (a count per technique, the first few) and "
    "estimate the run time; run nothing, write nothing.",
)
@click.option(
    "--profile",
    is_flag=True,
    help="After each case is timed, profile every variant (torch.profiler): "
    "traces under RUN/profiles/, a launch/sync/copy breakdown in results.json and the report.",
)
@click.option("--no-history", is_flag=True, help="Do not add the run to the history store.")
@click.option(
    "--store",
    "history_store",
    metavar="PATH|URL",
    default=None,
    help="The history store the run is added "
    "to (see `gpubench history add --help`; default $GPUBENCH_HISTORY, else ~/.local/share/gpubench/history.sqlite).",
)
@click.option(
    "--model",
    "model_spec",
    metavar="PRESET|config.json|DIR",
    help="Instead of --scenario: build the scenario from a model (a preset of `gpubench kv-cache --list`, "
    "a Hugging Face config.json or checkpoint directory): every technique that applies, at the model's "
    "shapes, sized to the device; see docs/model-runs.md.",
)
@click.option(
    "--workload",
    default=None,
    metavar="train|serve|both",
    help="With --model: the training techniques, the serving ones, or both [default: both].",
)
@click.option(
    "--seq-len", type=int, default=None, help="With --model: tokens per sequence [default: see docs/model-runs.md]."
)
@click.option(
    "--batch", type=int, default=None, help="With --model: sequences per step [default: 4 on cuda, 1 on cpu]."
)
@click.option(
    "--draft",
    metavar="DIR|early:N",
    help="With --model DIR (a checkpoint with weights): speculative decoding's draft model as well as the n-gram drafter.",
)
@click.option(
    "--ignore-field",
    "ignore_fields",
    multiple=True,
    metavar="NAME",
    help="With --model: a config.json field the reader may leave unread (repeatable).",
)
@click.option(
    "--emit-scenario",
    "emit_path",
    metavar="FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    help="With --model: write the generated scenario as YAML (edit it, run it with --scenario FILE) and exit.",
)
def run(
    scenario_name: str | None,
    devices: str | None,
    out_root: str,
    only: str | None,
    repeat_scale: float,
    telemetry_interval: float,
    no_calibrate: bool,
    isolation: str,
    max_parallel: int | None,
    cluster: str | None,
    gpu_type: str | None,
    per_model: bool,
    exclusive: bool,
    lock_clocks: bool,
    dry_run: bool,
    profile: bool,
    no_history: bool,
    history_store: str | None,
    budget_text: str | None,
    fill_budget: bool,
    model_spec: str | None = None,
    workload: str | None = None,
    seq_len: int | None = None,
    batch: int | None = None,
    draft: str | None = None,
    ignore_fields: tuple[str, ...] = (),
    emit_path: Path | None = None,
) -> None:
    """Run a scenario: check and time every case, write a run directory and add it to the history store.

    With --model instead of --scenario, the scenario is built from a model's config (see
    docs/model-runs.md); --dry-run shows it, --emit-scenario FILE writes it."""
    from gpubench.run.budget import parse_duration

    budget_from = time.monotonic()  # the budget counts the whole command
    stopping.sigint_restored()  # `gpubench run &` from a script: SIGINT inherited ignored, Ctrl-C still stops it
    budget_s = parse_duration(budget_text) if budget_text is not None else None
    _check_run_flags(repeat_scale, telemetry_interval, gpu_type, cluster)
    model_flags = {
        "--workload": workload is not None,
        "--seq-len": seq_len is not None,
        "--batch": batch is not None,
        "--draft": draft is not None,
        "--ignore-field": bool(ignore_fields),
        "--emit-scenario": emit_path is not None,
    }
    generated: str | None = None  # the generated scenario's YAML (--model)
    if model_spec is not None:
        if scenario_name is not None:
            raise BadInput(
                f"--scenario {scenario_name} and --model {model_spec}: give one of them (--model builds the "
                "scenario from the model; --emit-scenario FILE writes it for --scenario FILE)."
            )
        scen, generated = _model_scenario(
            model_spec, workload or "both", seq_len, batch, draft, ignore_fields, devices, cluster
        )
    else:
        given = [flag for flag, on in model_flags.items() if on]
        if given:
            raise BadInput(
                f"{', '.join(given)}: only with --model (a scenario built from a model); with --scenario "
                "the scenario file sets the shapes."
            )
        scen = scenariomod.load(scenario_name or _default_scenario(devices))
    if emit_path is not None:
        assert generated is not None  # (--emit-scenario is refused above without --model)
        _emit_scenario(emit_path, generated, scen)
        return
    from gpubench.run import run_options  # torch: past the scenario's name and keys

    device_list = _run_devices(devices, cluster, scen)
    options = run_options.RunOptions(
        devices=device_list,
        isolation=isolation,
        cluster=cluster,
        gpu_type=gpu_type,
        max_parallel=max_parallel,
        exclusive=exclusive,
        lock_clocks=lock_clocks,
        per_model=per_model,
        profile=profile,
        budget_s=budget_s,
        budget_from=budget_from,
        fill_budget=fill_budget,
    )
    only_list = _only_techniques(only, scen)
    run_options.check_options(options)  # refused before anything is printed or created
    out = make_console()
    counts = scen.count(only_list)  # a huge sweep is counted, not built
    total = sum(counts.values())
    workers = 1 if cluster or isolation == "none" else min(len(device_list), max_parallel or len(device_list))
    if generated is not None and dry_run:
        out.print(generated.rstrip(), markup=False, soft_wrap=True)
    _print_run_start(out, scen, device_list, only_list, total, cluster, isolation, dry_run)
    if scen.model is not None:
        _print_model_block(out, scen.model)
    if dry_run:
        _print_dry_run(
            out, scen, counts, only_list, device_list[0], Path(out_root), repeat_scale, workers, budget_s, fill_budget
        )
        return
    if total > LARGE_RUN_CASES and budget_s is None:
        _warn_large_run(out, scen, total, device_list[0], Path(out_root), only_list, repeat_scale, workers)
    sys.exit(
        _run_and_close(
            out,
            scen,
            options,
            Path(out_root),
            only_list,
            repeat_scale,
            telemetry_interval,
            not no_calibrate,
            None if no_history else history_store or "",
        )
    )


def _model_scenario(
    spec: str,
    workload: str,
    seq_len: int | None,
    batch: int | None,
    draft: str | None,
    ignore_fields: tuple[str, ...],
    devices: str | None,
    cluster: str | None,
) -> tuple[scenariomod.Scenario, str]:
    """The scenario ``gpubench run --model`` builds (validated as a scenario file is) and its YAML.
    Bad input (an unknown model, workload, size or draft) is refused before torch is imported."""
    import inspect

    from gpubench.models import config as model_config
    from gpubench.run import model_scenario

    model_scenario.check_request(workload, seq_len, batch)
    if ignore_fields and "ignore_fields" not in inspect.signature(model_config.load_model).parameters:
        raise BadInput("--ignore-field: this build's config reader reads every field; it takes no --ignore-field.")
    commas = [name for name in ignore_fields if "," in name or not name.strip()]
    if commas:
        raise BadInput(
            f"--ignore-field {commas[0]!r}: not a field name; give one config.json field per flag "
            "(repeat --ignore-field for more), without commas."
        )
    kwargs = {"ignore_fields": tuple(ignore_fields)} if ignore_fields else {}
    cfg = model_config.load_model(spec, **kwargs)
    model_scenario.check_draft(spec, workload, draft, cfg.num_layers)
    device, memory = _model_device(devices, cluster)
    doc = model_scenario.build_model_scenario(
        cfg, workload, seq_len, batch, device, memory, draft, spec=spec, ignore_fields=tuple(ignore_fields)
    )
    command = " ".join(
        ["gpubench run --model", spec, "--workload", workload]
        + ([f"--seq-len {seq_len}"] if seq_len is not None else [])
        + ([f"--batch {batch}"] if batch is not None else [])
        + ([f"--draft {draft}"] if draft is not None else [])
        + [f"--ignore-field {name}" for name in ignore_fields]
    )
    header = (
        f"Generated by `{command}` for {device} ({memory / 2**30:.1f} GiB).\n"
        "An ordinary scenario: edit it, then `gpubench run --scenario THIS_FILE` measures its cases."
    )
    text = model_scenario.to_yaml(doc, header)
    try:
        scen = scenariomod.parse(text, Path(f"--model {spec}"))
    except BadInput as exc:
        raise BadInput(
            f"--model {spec}: the generated scenario is not valid (a gpubench bug, please report it; "
            f"--emit-scenario FILE writes it for a look): {exc}"
        ) from None
    return scen, text


def _model_device(devices: str | None, cluster: str | None) -> tuple[str, int]:
    """The kind of device a --model scenario is sized for ("cuda" or "cpu") and its memory in
    bytes: the GPU's total memory, or the machine's available memory."""
    import torch

    from gpubench.run import run_options

    if cluster and devices is None:
        raise BadInput(
            "--model with --cluster: the cluster's GPU memory is not known here; build the scenario on a "
            "machine with that GPU (--emit-scenario FILE), then run --scenario FILE --cluster ..."
        )
    first = run_options.resolve_devices(devices or "auto", "--devices")[0]
    if first.startswith("cuda"):
        index = torch.device(first).index or 0
        return "cuda", int(torch.cuda.get_device_properties(index).total_memory)
    return "cpu", _available_memory()


def _available_memory() -> int:
    """The machine's available memory in bytes (Linux: MemAvailable; else the physical memory)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import os

    return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def _emit_scenario(path: Path, text: str, scen: scenariomod.Scenario) -> None:
    """--emit-scenario FILE: the generated scenario written (BadInput when it cannot be)."""
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"--emit-scenario {path}: cannot write the scenario ({exc.strerror or exc}).") from None
    total = sum(scen.count().values())
    click.echo(
        f"scenario written: {path} ({total} case{'s' if total != 1 else ''} of "
        f"{len({e.technique for e in scen.entries})} techniques); run it with gpubench run --scenario {path}"
    )


def _print_model_block(out: Console, raw: dict[str, Any]) -> None:
    """A --model scenario's model line, its sizing and the techniques left out with their reason."""
    model = ModelOrigin.from_dict(raw) or ModelOrigin()
    soft = not out.is_terminal
    out.print(f"model {model.name or '?'}: {model.summary}", markup=False, soft_wrap=soft)
    for line in model.sizing:
        out.print(f"  sizing: {line}", markup=False, soft_wrap=soft)
    for item in model.not_applicable:
        out.print(f"  not measured: {item.technique}: {item.reason}", markup=False, soft_wrap=soft)


def _check_run_flags(repeat_scale: float, telemetry_interval: float, gpu_type: str | None, cluster: str | None) -> None:
    """The flags refused on their own, before the scenario is read."""
    if repeat_scale <= 0:
        raise BadInput(
            f"--repeat-scale: {repeat_scale} is not valid; allowed: a number > 0 (1 = the scenario's policy)."
        )
    if telemetry_interval <= 0:
        raise BadInput(f"--telemetry-interval: {telemetry_interval} is not valid; allowed: seconds > 0.")
    if gpu_type and not cluster:
        raise BadInput("--gpu-type: only with --cluster (Ray's accelerator type); locally give --devices instead.")


def _run_devices(devices: str | None, cluster: str | None, scen: scenariomod.Scenario) -> list[str]:
    """Where the cases run: --devices, else the kind of device a cluster's tasks ask for, else the
    scenario's device."""
    from gpubench.run import run_options

    if devices is not None:
        return run_options.resolve_devices(devices, "--devices")
    if cluster:
        return ["cuda" if scen.device.startswith("cuda") else "cpu"]
    return run_options.resolve_devices(scen.device, f"{scen.path}: device")


def _only_techniques(only: str | None, scen: scenariomod.Scenario) -> list[str] | None:
    """--only's techniques (None: all of the scenario's); BadInput for one not registered or not in the scenario."""
    if not only:
        return None
    only_list = [t.strip() for t in only.split(",") if t.strip()]
    in_scenario = sorted({e.technique for e in scen.entries})
    for name in only_list:
        if techniques.get(name) is None:
            raise BadInput(
                f"--only: {name!r} is not a registered technique; allowed: {', '.join(techniques.all_techniques())}."
            )
        if name not in in_scenario:
            origin = ModelOrigin.from_dict(scen.model)
            why = origin.reason_left_out(name) if origin is not None else None
            raise BadInput(
                f"--only: scenario {scen.name} ({scen.path}) has no entry for {name!r}"
                + (f" (not applicable to this model: {why})" if why else "")
                + f"; its techniques: {', '.join(in_scenario)}."
            )
    return only_list


def _print_run_start(
    out: Console,
    scen: scenariomod.Scenario,
    device_list: list[str],
    only_list: list[str] | None,
    total: int,
    cluster: str | None,
    isolation: str,
    dry_run: bool,
) -> None:
    """The run's first line (scenario, where, how many cases) and, on a CPU, a memory cap it cannot apply."""
    where = f"Ray cluster {cluster}" if cluster else ", ".join(device_list)
    out.print(
        f"gpubench run{' --dry-run' if dry_run else ''}: scenario [bold]{scen.name}[/] ({scen.path}) on "
        f"{where}"
        + ("" if isolation == "process" else ", in this process")
        + f": {total:,} case{'s' if total != 1 else ''}",
        soft_wrap=not out.is_terminal,
    )
    if not cluster and not any(d.startswith("cuda") for d in device_list):  # a GPU's size is told at the end
        note = memory_cap_note(
            [e.policy.gpu_memory_gib for e in scen.entries if not only_list or e.technique in only_list], "cpu"
        )
        if note:
            out.print(f"warning: {note}", markup=False, soft_wrap=True)


def _warn_large_run(
    out: Console,
    scen: scenariomod.Scenario,
    total: int,
    device: str,
    out_root: Path,
    only_list: list[str] | None,
    repeat_scale: float,
    workers: int,
) -> None:
    """A run of more than LARGE_RUN_CASES cases without a budget: its estimated time, and how to list or stop it."""

    guess = _estimate(scen, only_list, device, out_root, repeat_scale, workers)
    out.print(
        f"[bold yellow]warning[/]: {total:,} cases (more than {LARGE_RUN_CASES:,}); estimated time "
        f"{escape(guess.text())}. `gpubench run --dry-run` lists them without running; Ctrl-C stops "
        f"the run and keeps what finished.",
        soft_wrap=not out.is_terminal,
    )


def _run_and_close(
    out: Console,
    scen: scenariomod.Scenario,
    options: RunOptions,
    out_root: Path,
    only_list: list[str] | None,
    repeat_scale: float,
    telemetry_interval: float,
    calibrate: bool,
    history_store: str | None,
) -> int:
    """The run through the supervisor, its progress shown, then its summary, history and report
    (:func:`_close_run`); the exit code."""
    from gpubench.run import supervisor

    progress = _CaseProgress(out, scen.varying(only_list))
    with stopping.sigterm_as_interrupt():  # the run installs its own; this one covers the summary and report
        try:
            outcome = supervisor.run_scenario(
                scen,
                options,
                out_root,
                only=only_list,
                repeat_scale=repeat_scale,
                progress=progress,
                telemetry_interval_s=telemetry_interval,
                calibrate=calibrate,
            )
        finally:  # whatever stopped the run, no bar is left drawn above what comes next
            progress.run_finished()
        try:
            return _close_run(out, outcome, history_store)
        except KeyboardInterrupt as exc:  # stopped while the summary was printed: the run is saved
            return _interrupted_exit(exc, outcome)


def _interrupted_exit(exc: KeyboardInterrupt, outcome: RunOutcome) -> int:
    """143 when SIGTERM stopped the run or what came after it, else 130."""
    sigterm = isinstance(exc, stopping.Terminated) or outcome.record.signal == "SIGTERM"
    return EXIT_TERMINATED if sigterm else EXIT_INTERRUPTED


def _close_run(out: Console, outcome: RunOutcome, history_store: str | None = None) -> int:
    """The summary, where the run is, the run added to the history store (``history_store``: its
    --store, "" for the default one, None for --no-history), its report; the exit code (the run's,
    unless the report could not be written: 74 on a full disk, 130 / 143 when stopped while writing it)."""
    from gpubench.reports.answer import (
        UNAVAILABLE,
        print_answer,
    )  # (matplotlib, through the sweep's figures: not at start-up)
    from gpubench.run import estimate

    notes = {name: t.gpu_specific for name, t in techniques.all_techniques().items()}
    try:  # the answer first: what to turn on, ranked; a fault in it costs the table, never the run
        print_answer(outcome.record, out)
    except Exception as exc:  # noqa: BLE001 - the summary, the history and the report still follow
        out.print(f"{UNAVAILABLE}: {type(exc).__name__}: {exc}", markup=False)
    print_summary(outcome.doc, out, notes)
    if outcome.record.time_use is not None:
        out.print(outcome.record.time_use.text(), markup=False, soft_wrap=not out.is_terminal)
    if outcome.record.not_run:
        out.print(
            f"{results.not_run_text(outcome.record.not_run)}; the budget was "
            f"{estimate.duration_text(outcome.record.budget_s or 0.0)} (--budget)",
            markup=False,
            soft_wrap=not out.is_terminal,
        )
    for warning in outcome.record.warnings:  # a memory cap above the GPU's size: it capped nothing
        at = warning.find(CAP_NOTE_START + " ")
        if at >= 0 and outcome.record.devices and any(d.get("type") == "cuda" for d in outcome.record.devices.values()):
            out.print(f"warning: {warning[at:]}", markup=False, soft_wrap=not out.is_terminal)
    out.print(f"run directory: {outcome.run_dir}", soft_wrap=True)
    if history_store is not None:  # complete or not; a store that fails costs a warning line, never the run
        from gpubench.cli.history import append_run

        out.print(append_run(outcome.record, outcome.run_dir, history_store or None), markup=False, soft_wrap=True)
    if outcome.record.disk_full:
        click.echo(f"error: {_disk_full_run_text(outcome)}", err=True)
        return EXIT_DISK_FULL
    out.print(f"results: {outcome.run_dir / 'results.json'} (+ results.csv, telemetry.csv, env.json)", soft_wrap=True)
    try:  # the run is on disk already; a report that fails costs the report only
        from gpubench.reports import html as html_report

        t_report = time.perf_counter()
        written = html_report.write_report(
            outcome.run_dir,
            history_store=history_store or None,
            read_history=history_store is not None,
            registry=techniques,
        )
        _remember_report_time(outcome, time.perf_counter() - t_report)
        out.print(f"report: {written.html} (+ {written.markdown.name})", soft_wrap=True)
    except DiskFull as exc:
        click.echo(
            "error: "
            + disk_full_text(
                exc.filename,
                exc.strerror,
                f"The run itself is saved (results.json); no "
                f"report was written: free some space, then `gpubench report "
                f"{outcome.run_dir}` writes it.",
            ),
            err=True,
        )
        return EXIT_DISK_FULL
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM while the report was written
        out.print(
            f"warning: the report was not written ({exc or 'stopped by Ctrl-C'}); the results are saved; "
            f"`gpubench report {outcome.run_dir}` writes it",
            markup=False,
            soft_wrap=not out.is_terminal,
        )
        return _interrupted_exit(exc, outcome)
    except Exception as exc:  # noqa: BLE001
        out.print(
            f"warning: the report could not be written ({type(exc).__name__}: {exc}); "
            f"the results are saved; try `gpubench report {outcome.run_dir}`",
            markup=False,
            soft_wrap=not out.is_terminal,
        )
    if outcome.exit_code == EXIT_OVERLOADED:
        late = sum(c.status == "failed" for c in outcome.record.cases)
        out.print(
            f"{late} case(s) timed out on an overloaded machine (more runnable work than cores), a timeout "
            f"of the run's environment, not a failure of a technique; they were not measured: rerun them "
            f"(--only) on a quieter machine. Exit code {EXIT_OVERLOADED}.",
            markup=False,
            soft_wrap=not out.is_terminal,
        )
    return outcome.exit_code


def _remember_report_time(outcome: RunOutcome, seconds: float) -> None:
    """The report's share of a run, for the next dry run's estimate (a cache: never fails a run)."""
    from gpubench.measure.devicecache import CaseTimes

    if outcome.record.device_label and outcome.record.cases:
        try:
            CaseTimes(outcome.record.device_label).record_report(seconds, len(outcome.record.cases))
        except OSError:
            pass


def _disk_full_run_text(outcome: RunOutcome) -> str:
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
    path, _, strerror = (run.disk_full or "").rpartition(": ")  # (set: the run stopped on a full disk)
    return disk_full_text(
        path,
        strerror,
        f"{stopped}; {kept} finished case{'s are' if kept != 1 else ' is'} kept in {outcome.run_dir} "
        f"(results.json and cases.jsonl, readable as they are), and no report was written. Free "
        f"some space, then `gpubench report {outcome.run_dir}` renders what was kept; run the "
        f"scenario again for the rest. Exit code {EXIT_DISK_FULL}.",
    )


@click.command(name="profile")
@click.argument("target", metavar="TECHNIQUE|CASE_ID")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE", help="A param of the case (repeatable).")
@click.option(
    "--scenario",
    "-s",
    "scenario_name",
    metavar="NAME|PATH",
    help="Take the case and its policy from this scenario: the case with id CASE_ID, or the technique's "
    "first case; --param overrides. Default: the technique's defaults.",
)
@click.option("--device", default="auto", show_default=True, metavar="auto|cpu|cuda|cuda:N")
@click.option(
    "-o",
    "--out",
    "out_root",
    default="runs",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Parent directory of the run directory <timestamp>-profile-<technique>/.",
)
@click.option("--calls", type=click.IntRange(min=1), default=None, help="Calls under the profiler [default: 3].")
@click.option(
    "--repeat-scale",
    type=click.FloatRange(min=0, min_open=True),
    default=0.2,
    show_default=True,
    help="Scale of the timing before the profile.",
)
def profile_cmd(
    target: str,
    params: tuple[str, ...],
    scenario_name: str | None,
    device: str,
    out_root: str,
    calls: int | None,
    repeat_scale: float,
) -> None:
    """Profile one case without a full run: check, time briefly, then profile every variant.

    gpubench profile moe_grouping --param tokens=512 [--scenario smoke] [--out DIR] prints the
    breakdown (ops, launches, syncs, copies, peak memory, top ops) and writes the traces and a
    report in a run directory."""
    from gpubench.reports import html as html_report
    from gpubench.reports.profile_view import case_table, print_case
    from gpubench.run import run_options, supervisor

    stopping.sigint_restored()

    device_text = run_options.resolve_devices(device, "--device")[0]
    scen = scenariomod.one_case_scenario(target, list(params), scenario_name, device_text, calls)
    options = run_options.RunOptions(devices=[device_text], isolation="none")
    outcome = supervisor.run_scenario(scen, options, Path(out_root), calibrate=False, repeat_scale=repeat_scale)
    out = make_console()
    for number, case in enumerate(outcome.record.cases, 1):
        table = case_table(case, number, link_base=f"{outcome.run_dir}/")
        if table is None:
            reason = (case.failure.message if case.failure is not None else "") or "no variant ran"
            out.print(f"{case.id}: nothing profiled ({reason})", markup=False, soft_wrap=not out.is_terminal)
            continue
        print_case(table, out)
        for col in table["columns"]:
            out.print(f"trace {col['name']}: {col['trace'] or col['error']}", markup=False, soft_wrap=True)
        for note in table["notes"]:
            out.print(f"note: {note}", markup=False, soft_wrap=not out.is_terminal)
        for col in table["columns"]:
            for note in col["notes"]:
                out.print(f"note ({col['name']}): {note}", markup=False, soft_wrap=not out.is_terminal)
        out.print(f"syncs counted: {table['sync_counting']}", markup=False, soft_wrap=not out.is_terminal)
    try:
        written = html_report.write_report(outcome.run_dir, registry=techniques)
        out.print(
            f"run directory: {outcome.run_dir}; report: {written.html}", markup=False, soft_wrap=not out.is_terminal
        )
    except Exception as exc:  # noqa: BLE001 - the traces are on disk already
        out.print(f"run directory: {outcome.run_dir} (report not written: {type(exc).__name__}: {exc})", markup=False)
    sys.exit(outcome.exit_code)
