"""The supervisor: ``gpubench run``'s own process. It turns the scenario into jobs, hands them to
an executor, and writes the run directory as records come back (:func:`run_scenario`, the way in
for a run of any size, in this process or not).

Executors (:mod:`gpubench.run.executor` says what they share):

- :class:`gpubench.run.local_workers.LocalWorkers` (the default): one worker process per device,
  reused while healthy, killed and replaced on a timeout or a crash; a fault costs its case only.
- :class:`gpubench.run.in_process.InProcess` (``--isolation none``): every case in this process, as a
  debugger wants it; a hung native call then hangs the run.
- :class:`gpubench.run.cluster.RayCluster` (``--cluster ray``): each case a Ray task.

With ``--budget`` (:mod:`gpubench.run.budget`) the cases run breadth-first and each starts only where
the time left holds it; the others are recorded as not run (``RunRecord.not_run``).

Every finished case is appended to ``cases.jsonl`` (flushed, fsynced) so a run killed mid-way
keeps what finished at a cost per case that does not grow with the run; ``results.json`` is
written at the start (status ``running``) and assembled from the records at the end
(:mod:`gpubench.run.closing`).

SIGTERM stops the run as Ctrl-C does (:mod:`gpubench.run.stopping`). A full disk stops it too (status
``aborted``): the room reserved at the start closes the record, and what finished stays readable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpubench import techniques
from gpubench.errors import BadInput
from gpubench.measure import hygiene
from gpubench.measure.devicecache import CaseTimes
from gpubench.records import notices, results
from gpubench.records.atomic import DiskFull
from gpubench.records.results import RunRecord
from gpubench.run import budget as budgetmod
from gpubench.run import closing, runner
from gpubench.run.cluster import RayCluster
from gpubench.run.estimate import CaseCosts
from gpubench.run.executor import DeviceState, Executor, Sink, failed_record
from gpubench.run.in_process import InProcess
from gpubench.run.local_workers import LocalWorkers
from gpubench.run.outcome import ProgressListener, RunOutcome, Silent

# RunOptions, its checks and the SIGTERM handling are part of this module's interface: the CLI and
# scripts name them through gpubench.run.supervisor, beside run_scenario.
from gpubench.run.run_options import RunOptions, check_hygiene, check_options, resolve_devices  # noqa: F401
from gpubench.run.scenario import Case, Scenario
from gpubench.run.stopping import RunAborted, Terminated, sigterm_as_interrupt, stop_reason
from gpubench.run.worker import Job


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def make_jobs(cases: Sequence[Case], targets: Sequence[str | None], run_dir: Path | None = None) -> list[Job]:
    """One job per case and target device model, case by case (a run reads in case order)."""
    where = None if run_dir is None else str(run_dir)
    # (the ignore: a case's technique was found when its scenario was read)
    return [
        Job(i * len(targets) + t, case, techniques.get(case.technique).source, None, target, where)  # type: ignore[union-attr]
        for i, case in enumerate(cases)
        for t, target in enumerate(targets)
    ]


def profiled(cases: Sequence[Case]) -> list[Case]:
    """``--profile``: the cases with ``policy.profile`` on."""
    return [dataclasses.replace(c, policy=dataclasses.replace(c.policy, profile=True)) for c in cases]


def _targets(options: RunOptions, started: Sequence[DeviceState]) -> list[str | None]:
    if options.cluster and options.gpu_type and "," in options.gpu_type:
        return [t.strip() for t in options.gpu_type.split(",") if t.strip()]
    if options.per_model:
        return list(dict.fromkeys(s.info.label for s in started)) or [None]
    return [None]


def make_executor(
    options: RunOptions, run_dir: results.RunDirectory, *, calibrate: bool, telemetry_interval_s: float
) -> Executor:
    if options.cluster:
        return RayCluster(
            options.cluster,
            options.devices,
            gpu_type=options.gpu_type,
            calibrate=calibrate,
            max_parallel=options.max_parallel,
        )
    if options.isolation == "none":
        return InProcess(options.devices[0], calibrate=calibrate, telemetry_interval_s=telemetry_interval_s)
    return LocalWorkers(
        options.devices,
        run_dir.path / "workers",
        calibrate=calibrate,
        telemetry_interval_s=telemetry_interval_s,
        max_parallel=options.max_parallel,
    )


def run_scenario(
    scenario: Scenario,
    options: RunOptions | None = None,
    out_root: Path | str = "runs",
    *,
    only: list[str] | None = None,
    repeat_scale: float = 1.0,
    progress: ProgressListener | None = None,
    telemetry_interval_s: float = 0.05,
    calibrate: bool = True,
) -> RunOutcome:
    """Run the scenario's cases (``only``: these techniques) as ``options`` say, into a new run
    directory under ``out_root``. BadInput (before anything is created) for options that cannot
    work here; any other fault is recorded in the run, which is always closed."""
    options = options or RunOptions()
    check_options(options)
    progress = progress or Silent()
    budget_from = options.budget_from if options.budget_from is not None else time.monotonic()
    cases = scenario.cases(only=only, repeat_scale=repeat_scale)
    if options.budget_s is not None:  # each technique's first case before any one's second
        cases = budgetmod.breadth_first(cases, scenario.order)
    if options.profile:
        cases = profiled(cases)
    processes = {} if options.cluster else check_hygiene(options.devices, options.exclusive)
    run_dir = results.RunDirectory.create(Path(out_root), scenario.name)
    run = RunRecord(
        run_id=run_dir.path.name,
        device=",".join(options.devices),
        device_label="",
        scenario=scenario.to_dict(),
        env={},
        repeat_scale=repeat_scale,
        only=only,
        started_at=_now(),
        budget_s=options.budget_s,
        registry=techniques,
    )
    try:
        executor = make_executor(options, run_dir, calibrate=calibrate, telemetry_interval_s=telemetry_interval_s)
    except BadInput:
        _remove_if_empty(run_dir.path)  # refused before anything ran: leave no empty run directory
        raise
    with sigterm_as_interrupt() as sigterm:
        sink = Sink(run_dir, progress, sigterm, load_probe=(lambda: None) if options.cluster else None)
        _run(_Run(run, options, executor, sink, cases, processes, out_root=Path(out_root), budget_from=budget_from))
    return RunOutcome(run_dir.path, run)


def _remove_if_empty(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()


@dataclass
class _Run:
    """A run while it goes: its record, how it runs, the cases, the other processes each GPU had
    at the start, the locked clocks, when it began."""

    record: RunRecord
    options: RunOptions
    executor: Executor
    sink: Sink
    cases: list[Case]
    processes: dict[str, Any]
    clocks: dict[str, Any] | None = None
    t_start: float = field(default_factory=time.perf_counter)
    out_root: Path | None = None
    budget_from: float | None = None  # time.monotonic() --budget counts from


def _run(r: _Run) -> None:
    """Start the executor, run the jobs, close the record whatever happened (Ctrl-C, SIGTERM, a
    full disk, a fault in the harness)."""
    run, options, sink = r.record, r.options, r.sink
    clock_lock = hygiene.ClockLock(options.devices if options.lock_clocks and not options.cluster else [])
    r.clocks = clock_lock.state if options.lock_clocks else None
    try:
        with clock_lock:
            try:
                _start_and_run(r)
            finally:
                sink.sigterm.armed = False  # the record is being closed: a SIGTERM now must not cut it
                try:
                    _stop_in_flight(r.executor, sink)
                finally:
                    r.executor.close()
    except KeyboardInterrupt as exc:
        sigterm = isinstance(exc, Terminated) or sink.sigterm.received
        run.status, run.signal = "interrupted", "SIGTERM" if sigterm else "SIGINT"
        run.abort_reason = stop_reason(Terminated() if sigterm else exc) + (
            "" if run.planned_cases is not None else " while the workers were starting: no case ran"
        )
    except DiskFull as exc:
        run.status = "aborted"
        run.abort_reason = f"the disk is full ({exc.strerror}: {exc.filename}); " + (
            "the cases after it were not run" if sink.records else "no case ran"
        )
    except RunAborted as exc:
        run.status, run.abort_reason = "aborted", str(exc)
    except BadInput as exc:  # found once the executor met the device or cluster: exit 2, run kept
        run.status, run.abort_reason = "crashed", str(exc)
        raise
    except Exception as exc:  # noqa: BLE001 - a harness fault: keep what was measured, say so
        run.status = "crashed"
        run.crash = runner.describe(exc)
        run.abort_reason = run.crash.message
    finally:
        _close(r)


def _start_and_run(r: _Run) -> None:
    """Reserve room to close the record, start the devices, write the record's first version, run."""
    run_dir = r.sink.run_dir
    run_dir.reserve()
    started = r.executor.start()
    closing.describe_devices(r.record, started, r.processes, r.clocks)
    if r.options.budget_s is not None:
        r.sink.budget = _budget(r, started)
    jobs = make_jobs(r.cases, _targets(r.options, started), run_dir.path)
    r.record.planned_cases = len(jobs)
    r.sink.progress.run_started(len(jobs))
    run_dir.write_env(r.record.env)
    run_dir.write_results(r.record)
    with notices.listening(r.sink.note):  # in-process cases; a worker's come over its pipe
        r.executor.run(jobs, r.sink)


def _budget(r: _Run, started: Sequence[DeviceState]) -> budgetmod.Budget:
    """The run's budget, counted from the command's start, its estimates from this device model's
    case-time history (a Ray cluster's devices are not known before its tasks run: the allowances)."""
    device = r.options.devices[0].split("#")[0]
    label = started[0].info.label if started else None
    costs = CaseCosts(
        torch.device("cuda" if device.startswith("cuda") else "cpu"),
        history=CaseTimes(label) if label else None,
        out_root=r.out_root,
        repeat_scale=r.record.repeat_scale,
    )
    assert r.options.budget_s is not None  # called for a run with a budget only
    return budgetmod.Budget(r.options.budget_s, costs, started_at=r.budget_from, fill=r.options.fill_budget)


def _stop_in_flight(executor: Executor, sink: Sink) -> None:
    """The cases running when the run stopped, recorded as interrupted with the reason (called
    while the exception that stopped it, if any, propagates)."""
    why = stop_reason(sys.exc_info()[1])
    for job, info, elapsed in executor.in_flight() if isinstance(executor, LocalWorkers) else []:
        with contextlib.suppress(DiskFull):  # kept in memory; run_dir.full says the disk is full
            sink.finished(job, failed_record(job.case, "interrupted", why, elapsed_s=elapsed, device=info))


def _close(r: _Run) -> None:
    """The record, finished whatever stopped the run, and written."""
    run, sink = r.record, r.sink
    sink.sigterm.armed = False
    if run.status == "running":
        run.status = "complete"
    run.finished_at = _now()
    run.cases = [sink.records[i] for i in sorted(sink.records)]
    run.not_run = list(sink.budget.not_run) if sink.budget is not None else []
    states = r.executor.devices()
    closing.describe_devices(run, states, r.processes, r.clocks)
    cap = closing.memory_cap_warning(run, r.cases)
    if cap:
        run.warnings.append(cap)
    closing.attach_telemetry(run, states)
    run.time_use = results.TimeUse.of(run.cases, time.perf_counter() - r.t_start, max(1, len(run.devices)))
    closing.remember_case_times(run)
    if r.options.cluster:
        run.telemetry = results.RunTelemetry.from_dict(
            {
                "status": "unavailable",
                "reason": "the cases ran as Ray tasks: telemetry is not sampled on the cluster's nodes",
            }
        )
    closing.write_run(sink.run_dir, run, sink.records, states)
    sink.progress.run_finished()
