"""What the supervisor and every executor share: the :class:`Executor` protocol (start the
devices, run jobs, say which devices were used, close), a started device's state
(:class:`DeviceState`), where a finished case goes (:class:`Sink`), the record of a case that
never reported back (:func:`failed_record`) and how long past its limit a case may run before its
worker is killed (:func:`kill_grace_s`).

The executors: :class:`gpubench.run.in_process.InProcess` (``--isolation none``),
:class:`gpubench.run.local_workers.LocalWorkers` (the default) and
:class:`gpubench.run.cluster.RayCluster` (``--cluster``).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpubench.measure import machine_load
from gpubench.measure.telemetry import TelemetrySampler
from gpubench.records import results
from gpubench.records.results import CaseRecord, Failure
from gpubench.run import runner
from gpubench.run.outcome import ProgressListener
from gpubench.run.scenario import Case
from gpubench.run.stopping import SigtermAsInterrupt
from gpubench.run.worker import DeviceInfo, Job

if TYPE_CHECKING:
    from gpubench.run.budget import Budget


def kill_grace_s(timeout_s: float) -> float:
    """How long past ``case_timeout_s`` the supervisor waits before it kills the worker: the
    worker's own alarm stops Python-level hangs at the limit (keeping what was measured); only
    a call that alarm cannot interrupt reaches the kill."""
    return max(2.0, 0.1 * timeout_s)


BUDGET_KILL_GRACE_S = 10.0  # past a budget's limit: the alarm's case still assembles its samples' statistics


def job_kill_grace_s(job: Job) -> float:
    """:func:`kill_grace_s` of the job's time limit; at least :data:`BUDGET_KILL_GRACE_S` where the
    run's budget set that limit (a short limit is the budget's end, not a hang guard: the case
    stopped there keeps its samples only if its worker lives to send them)."""
    grace = kill_grace_s(job.limit_s)
    return max(grace, BUDGET_KILL_GRACE_S) if job.budget_limited else grace


@dataclass
class DeviceState:
    """A device the run uses, as its worker reported it at start."""

    info: DeviceInfo
    env: dict[str, Any]
    ceilings: dict[str, Any] | None
    sampler: TelemetrySampler | None = None
    processes: list[dict[str, Any]] | str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.info.to_dict(),
            "ceilings": self.ceilings,
            "other_processes": self.processes,
            "telemetry": self.sampler.run_summary() if self.sampler is not None else None,
        }


class Sink:
    """Where a finished case goes: the run's records (kept by case index), the run log, progress."""

    def __init__(
        self,
        run_dir: results.RunDirectory,
        progress: ProgressListener,
        sigterm: SigtermAsInterrupt | None = None,
        budget: Budget | None = None,
        load_probe: Callable[[], machine_load.Load | None] | None = None,
    ):
        self.run_dir = run_dir
        self.progress = progress
        self.records: dict[int, CaseRecord] = {}
        self.sigterm = sigterm or SigtermAsInterrupt()  # whether SIGTERM stopped the run
        self.budget = budget  # --budget: asked before each case starts
        # the machine's load at a case's start (default machine_load.read; a Ray run's cases run
        # elsewhere: lambda: None, their limits unscaled)
        self.load_probe = load_probe

    def admit(self, job: Job) -> Job | None:
        """The job to start, with its time limit (``time_limit``: case_timeout_s scaled by the
        machine's load now, :mod:`gpubench.measure.machine_load`) and the time its budget leaves it
        (``budget_s``); None where the run's budget cannot hold it (recorded as not run, and
        shown)."""
        job = dataclasses.replace(
            job, time_limit=machine_load.time_limit(job.case.policy.case_timeout_s, self.load_probe)
        )
        if self.budget is None:
            return job
        limit = self.budget.admit(job.case, job.target, job.timeout_s)
        if limit is None:
            skipped = getattr(self.progress, "case_not_run", None)
            if skipped is not None:
                skipped(job.index, job.case, self.budget.not_run[-1])
            return None
        return dataclasses.replace(job, budget_s=limit)

    def started(self, job: Job) -> None:
        self.progress.case_started(job.index, job.case)

    def note(self, text: str) -> None:
        """A case's notice (:mod:`gpubench.records.notices`), for listeners that show them."""
        show = getattr(self.progress, "note", None)
        if show is not None:
            show(text)
        else:
            print(f"gpubench: {text}", file=sys.stderr, flush=True)

    def finished(self, job: Job, record: CaseRecord) -> None:
        """Kept, logged and shown. Once the disk is full, kept in memory only (the run is closing;
        :meth:`RunDirectory.close_on_full_disk` logs what still fits)."""
        self.records[job.index] = record
        if self.budget is not None:
            self.budget.finished(record)
        try:
            if self.run_dir.full is None:
                self.run_dir.append_case(job.index, record)
        finally:
            self.progress.case_finished(job.index, job.case, record)


class Executor(Protocol):
    def start(self) -> list[DeviceState]: ...
    def run(self, jobs: list[Job], sink: Sink) -> None: ...
    def devices(self) -> list[DeviceState]: ...  # every device used so far
    def close(self) -> None: ...


def failed_record(
    case: Case,
    kind: str,
    message: str,
    detail: str = "",
    elapsed_s: float | None = None,
    device: DeviceInfo | None = None,
) -> CaseRecord:
    """The record of a case that failed outside the runner (its worker died or was killed, the run
    stopped, nothing was left to run it on)."""
    record = runner.new_record(case)
    record.status = "interrupted" if kind in ("interrupted", "budget") else "failed"
    record.failure = Failure(kind, message, detail)
    record.elapsed_s = elapsed_s
    record.device = device.record() if device is not None else None
    return record
