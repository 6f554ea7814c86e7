"""The default executor: one worker process per device slot (:mod:`gpubench.run.worker`), started once
and reused while healthy, each job handed to whichever worker is free.

A case that passes ``case_timeout_s`` is stopped even inside a native call: the worker is killed
(SIGTERM, a short grace, SIGKILL) and the case is recorded as a timeout; a worker that dies
(segfault, abort, ``os._exit``, a poisoned CUDA context) fails only its case, with the signal or
exit code and the last lines of its output. A fresh worker takes the next case.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import signal
import time
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import wait as wait_any
from pathlib import Path
from typing import Any

from gpubench.measure import machine_load
from gpubench.measure.telemetry import NvmlSource, TelemetrySampler, TelemetryUnavailable
from gpubench.run import runner, worker
from gpubench.run.executor import DeviceState, Sink, failed_record, job_kill_grace_s
from gpubench.run.worker import DeviceInfo, Done, Job, Note, Ready

START_TIMEOUT_S = 900.0  # a worker's start: import torch, capture the environment, calibrate


def slot_keys(devices: Sequence[str]) -> list[str]:
    """A unique name per worker slot: the device, numbered when it repeats (cpu, cpu#1)."""
    seen: dict[str, int] = {}
    keys = []
    for d in devices:
        n = seen.get(d, 0)
        seen[d] = n + 1
        keys.append(d if n == 0 else f"{d}#{n}")
    return keys


class WorkerDied(Exception):
    pass


class WorkerSlot:
    """One worker slot: its device, its process (replaced when it dies or is killed), the shared
    tag its telemetry reads, the log its output goes to."""

    def __init__(self, context: Any, key: str, device_text: str, log_dir: Path):
        self.context, self.key, self.device_text = context, key, device_text
        self.log_path = log_dir / f"worker-{key.replace(':', '').replace('#', '-')}.log"
        self.tag = context.Array("c", worker.TAG_BYTES)
        self.process: Any = None
        self.conn: Any = None
        self.job: Job | None = None
        self.started_at = 0.0
        self.deadline = 0.0
        self.log_offset = 0
        self.ready: Ready | None = None

    def spawn(self, calibrate: bool) -> Ready:
        parent, child = self.context.Pipe()
        self.process = self.context.Process(
            target=worker.main,
            name=f"gpubench-worker-{self.key}",
            daemon=True,
            args=(child, self.key, self.device_text, self.tag, str(self.log_path), calibrate),
        )
        self.log_offset = self._log_size()
        self.process.start()
        child.close()
        self.conn = parent
        if not parent.poll(START_TIMEOUT_S):
            self.kill()
            raise WorkerDied(f"the worker for {self.key} did not start within {START_TIMEOUT_S:g} s")
        try:
            self.ready = parent.recv()
        except (EOFError, OSError):
            self.process.join(5)
            raise WorkerDied(
                f"the worker for {self.key} died while starting ({self.exit_text()}); its last "
                f"output:\n{self.log_tail()}"
            ) from None
        return self.ready

    def submit(self, job: Job) -> None:
        self.job = job
        self.log_offset = self._log_size()
        self.started_at = time.monotonic()
        self.deadline = self.started_at + job.limit_s + job_kill_grace_s(job)
        self.conn.send(job)

    def kill(self) -> None:
        if self.process is None:
            return
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(2.0)
            if self.process.is_alive():
                self.process.kill()
        self.process.join(5.0)
        if self.conn is not None:
            self.conn.close()

    def stop(self) -> None:
        """Ask it to finish (between jobs), then make sure it is gone."""
        if self.process is not None and self.process.is_alive() and self.job is None:
            try:
                self.conn.send(None)
                self.process.join(5.0)
            except (OSError, BrokenPipeError):
                pass
        self.kill()

    def exit_text(self) -> str:
        code = self.process.exitcode if self.process is not None else None
        if code is None:
            return "still running"
        if code < 0:
            try:
                return f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exited with code {code}"

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_tail(self, lines: int = 20) -> str:
        """The last lines the worker wrote since its current job (or start) began."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])


class LocalWorkers:
    """One worker process per device slot, jobs handed to whichever is free."""

    def __init__(
        self,
        devices: Sequence[str],
        log_dir: Path,
        *,
        calibrate: bool,
        telemetry_interval_s: float,
        max_parallel: int | None = None,
    ):
        context = mp.get_context("spawn")
        keys = slot_keys(devices)
        slots = max_parallel or len(keys)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.workers = [WorkerSlot(context, key, d, log_dir) for key, d in list(zip(keys, devices))[:slots]]
        self.calibrate = calibrate
        self.interval = telemetry_interval_s
        self.states: dict[str, DeviceState] = {}

    def start(self) -> list[DeviceState]:
        for w in self.workers:
            ready = w.spawn(self.calibrate)
            self.states[w.key] = DeviceState(
                ready.device, ready.env, ready.ceilings, self._sampler(ready.device, w.tag)
            )
        return list(self.states.values())

    def _sampler(self, info: DeviceInfo, tag: Any) -> TelemetrySampler:
        if info.type != "cuda":
            return TelemetrySampler(
                None, self.interval, unavailable_reason=f"device is {info.type} (NVML reports NVIDIA GPUs only)"
            )
        try:  # GPU-only (docs/cuda-paths.md): a worker's sampler on a real GPU (telemetry fakes NVML itself)
            source = NvmlSource(index=None if info.uuid else info.index, uuid=info.uuid)
        except TelemetryUnavailable as exc:
            return TelemetrySampler(None, self.interval, unavailable_reason=str(exc))
        sampler = TelemetrySampler(source, self.interval, tag_reader=lambda: worker.read_tag(tag))
        sampler.start()
        return sampler

    def _replace(self, w: WorkerSlot) -> None:
        w.kill()
        w.job = None
        w.tag.value = b""
        try:
            w.spawn(calibrate=False)
        except WorkerDied as exc:
            w.process = None
            w.ready = None
            print(f"gpubench: worker slot {w.key} is out of service: {exc}", flush=True)

    def run(self, jobs: list[Job], sink: Sink) -> None:
        pending = deque(jobs)
        while True:
            alive = [w for w in self.workers if w.ready is not None]
            if not alive:
                for job in pending:  # nothing left to run them on
                    sink.finished(job, failed_record(job.case, "crash", "no worker could be started to run it"))
                return
            for w in alive:
                if w.job is None:
                    self._hand_out(w, pending, sink)
            busy = [w for w in alive if w.job is not None]
            if not busy:
                for job in pending:  # asked for a device model no live worker has
                    sink.finished(
                        job, failed_record(job.case, "crash", f"no worker on a {job.target} is left to run it")
                    )
                return
            timeout = max(0.0, min(w.deadline for w in busy) - time.monotonic())
            ready = set(wait_any([w.conn for w in busy], timeout))
            for w in busy:
                if w.conn in ready:
                    self._collect(w, sink)
                elif time.monotonic() >= w.deadline:
                    self._time_out(w, sink)

    def _hand_out(self, w: WorkerSlot, pending: deque[Job], sink: Sink) -> None:
        """Start the next pending job this worker's device may run and the run's budget holds;
        the jobs the budget passes over on the way are recorded as not run (by the sink)."""
        label = self.states[w.key].info.label
        while (job := next((j for j in pending if j.target in (None, label)), None)) is not None:
            pending.remove(job)
            admitted = sink.admit(job)
            if admitted is None:
                continue
            job = dataclasses.replace(admitted, ceilings=self.states[w.key].ceilings)
            sink.started(job)
            w.submit(job)
            return

    def _collect(self, w: WorkerSlot, sink: Sink) -> None:
        job = w.job
        assert job is not None  # a busy slot's
        try:
            done: Done | Note = w.conn.recv()
        except (EOFError, OSError):
            w.process.join(5.0)
            message = f"the worker died during the case ({w.exit_text()})"
            sink.finished(
                job,
                failed_record(
                    job.case, "crash", message, w.log_tail(), time.monotonic() - w.started_at, self.states[w.key].info
                ),
            )
            self._replace(w)
            return
        if isinstance(done, Note):  # the case goes on
            sink.note(done.text)
            return
        w.job = None
        sink.finished(job, done.record)
        if done.interrupted:
            raise KeyboardInterrupt
        if done.broken:
            self._replace(w)

    def _time_out(self, w: WorkerSlot, sink: Sink) -> None:
        job = w.job
        assert job is not None  # a busy slot's
        elapsed = time.monotonic() - w.started_at
        w.kill()
        limit = job.limit_s
        if job.budget_limited:  # the run's budget ran out: interrupted, not failed (its samples died with the worker)
            kind, message = (
                "budget",
                (
                    f"stopped (worker killed after {elapsed:.1f} s): the run's --budget ran out "
                    f"{limit:.1f} s into the case, inside a call Python could not interrupt"
                ),
            )
        else:
            failure = runner.timeout_failure(
                job.time_limit or machine_load.TimeLimit(limit),
                elapsed,
                f"timeout (worker killed after {elapsed:.1f} s)",
            )
            kind, message = (
                failure.kind,
                (
                    f"{failure.message}; the case passed its limit inside a call Python "
                    "could not interrupt (native code or a kernel that never returned)"
                ),
            )
        record = failed_record(job.case, kind, message, w.log_tail(), elapsed, self.states[w.key].info)
        record.time_limit = job.time_limit.to_dict() if job.time_limit is not None else None
        sink.finished(job, record)
        self._replace(w)

    def devices(self) -> list[DeviceState]:
        return list(self.states.values())

    def in_flight(self) -> list[tuple[Job, DeviceInfo, float]]:
        """The jobs running now: (job, device, seconds so far)."""
        return [
            (w.job, self.states[w.key].info, time.monotonic() - w.started_at) for w in self.workers if w.job is not None
        ]

    def close(self) -> None:
        for w in self.workers:
            w.stop()
        for state in self.states.values():
            if state.sampler is not None:
                state.sampler.close()
