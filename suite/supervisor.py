"""The supervisor: ``gpubench run``'s own process. It turns the scenario into jobs, hands them to
an executor, and writes the run directory as records come back.

Executors:

- :class:`LocalWorkers` (the default): one worker process per device (:mod:`gpubench.worker`),
  started once and reused while healthy. A case that passes ``case_timeout_s`` is stopped even
  inside a native call: the worker is killed (SIGTERM, a short grace, SIGKILL) and the case is
  recorded as a timeout; a worker that dies (segfault, abort, ``os._exit``, a poisoned CUDA
  context) fails only its case, with the signal or exit code and the last lines of its output.
  A fresh worker takes the next case.
- :class:`InProcess` (``--isolation none``): every case in this process, as a debugger wants it;
  a hung native call then hangs the run.
- :class:`gpubench.cluster.RayCluster` (``--cluster ray``): each case a Ray task.

Every finished case is appended to ``cases.jsonl`` (flushed, fsynced) so a run killed mid-way
keeps what finished at a cost per case that does not grow with the run; ``results.json`` is
written at the start (status ``running``) and assembled from the records at the end.

SIGTERM (``timeout``, a CI cancel, a scheduler) stops the run as Ctrl-C does: the workers are
stopped, the running case is recorded ``interrupted`` and the record is closed. A full disk stops
it too (status ``aborted``): the room reserved at the start closes the record, and what finished
stays readable.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import faulthandler
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_any
from pathlib import Path
from typing import Any, Iterator, Protocol, Sequence

# Device counts through NVML where torch can: the supervisor never creates a CUDA context of its own.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

import torch  # noqa: E402

from gpubench import hygiene, notices, results, runner, techniques, worker  # noqa: E402
from gpubench.atomic import DiskFull  # noqa: E402
from gpubench.devicecache import CaseTimes  # noqa: E402
from gpubench.errors import BadInput  # noqa: E402
from gpubench.results import CaseRecord, Failure, RunRecord  # noqa: E402
from gpubench.scenario import Case, Scenario  # noqa: E402
from gpubench.telemetry import TelemetrySampler, TelemetryUnavailable, NvmlSource  # noqa: E402
from gpubench.worker import DeviceInfo, Done, Job, Note, Ready  # noqa: E402

START_TIMEOUT_S = 900.0  # a worker's start: import torch, capture the environment, calibrate
ISOLATIONS = ("process", "none")


def kill_grace_s(timeout_s: float) -> float:
    """How long past ``case_timeout_s`` the supervisor waits before it kills the worker: the
    worker's own alarm stops Python-level hangs at the limit (keeping what was measured); only
    a call that alarm cannot interrupt reaches the kill."""
    return max(2.0, 0.1 * timeout_s)


def resolve_devices(text: str, source: str = "--devices") -> list[str]:
    """``all``, ``cpu``, ``cuda``, ``cuda:N`` or a comma-separated list (a device may repeat: one
    worker each) -> device strings that exist here; BadInput otherwise."""
    allowed = "all, auto, cpu, cuda, cuda:N, or a comma-separated list such as cuda:0,cuda:2 (or cpu,cpu)"
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    out = []
    for item in [t.strip() for t in text.split(",") if t.strip()] or [""]:
        if item == "all":
            out += [f"cuda:{i}" for i in range(count)] or ["cpu"]
        elif item == "auto":
            out.append("cuda:0" if count else "cpu")
        elif item == "cpu":
            out.append("cpu")
        elif item == "cuda" or (item.startswith("cuda:") and item[5:].isdigit()):
            index = int(item[5:]) if ":" in item else 0
            if not count:
                raise BadInput(f"{source}: device {item!r} was asked for, but no CUDA GPU is usable here "
                               f"(torch {torch.__version__}). Allowed: {allowed}; use 'cpu' on this machine.")
            if index >= count:
                raise BadInput(f"{source}: device {item!r} does not exist; this machine has {count} CUDA "
                               f"device(s) (cuda:0..cuda:{count - 1}).")
            out.append(f"cuda:{index}")
        else:
            raise BadInput(f"{source}: {item!r} is not a device; allowed: {allowed}.")
    return out


def slot_keys(devices: Sequence[str]) -> list[str]:
    """A unique name per worker slot: the device, numbered when it repeats (cpu, cpu#1)."""
    seen: dict[str, int] = {}
    keys = []
    for d in devices:
        n = seen.get(d, 0)
        seen[d] = n + 1
        keys.append(d if n == 0 else f"{d}#{n}")
    return keys


@dataclass
class DeviceState:
    """A device the run uses, as its worker reported it at start."""

    info: DeviceInfo
    env: dict[str, Any]
    ceilings: dict[str, Any] | None
    sampler: TelemetrySampler | None = None
    processes: list[dict[str, Any]] | str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**self.info.to_dict(), "ceilings": self.ceilings, "other_processes": self.processes,
                "telemetry": self.sampler.run_summary() if self.sampler is not None else None}


class Sink:
    """Where a finished case goes: the run's records (kept by case index), the run log, progress."""

    def __init__(self, run_dir: results.RunDirectory, progress: runner.ProgressListener,
                 sigterm: "SigtermAsInterrupt | None" = None):
        self.run_dir = run_dir
        self.progress = progress
        self.records: dict[int, CaseRecord] = {}
        self.sigterm = sigterm or SigtermAsInterrupt()  # whether SIGTERM stopped the run

    def started(self, job: Job) -> None:
        self.progress.case_started(job.index, job.case)

    def note(self, text: str) -> None:
        """A case's notice (:mod:`gpubench.notices`), for listeners that show them."""
        show = getattr(self.progress, "note", None)
        if show is not None:
            show(text)
        else:
            print(f"gpubench: {text}", file=sys.stderr, flush=True)

    def finished(self, job: Job, record: CaseRecord) -> None:
        """Kept, logged and shown. Once the disk is full, kept in memory only (the run is closing;
        :meth:`RunDirectory.close_on_full_disk` logs what still fits)."""
        self.records[job.index] = record
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


class RunAborted(Exception):
    """The run cannot go on (in-process: the CUDA context is unusable)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM: the run stops as on Ctrl-C (a KeyboardInterrupt, so every path that closes the
    record on Ctrl-C closes it on SIGTERM too)."""

    def __init__(self) -> None:
        super().__init__("stopped by SIGTERM")


class SigtermAsInterrupt:
    """While armed, SIGTERM raises :class:`Terminated` in the main thread, once; later ones, and
    any that come while the record is being closed (disarmed), are ignored: the run is ending."""

    def __init__(self) -> None:
        self.armed = True
        self.received = False

    def __call__(self, signum: int, frame: Any) -> None:
        self.received = True
        if self.armed:
            self.armed = False
            raise Terminated()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[SigtermAsInterrupt]:
    """Install :class:`SigtermAsInterrupt` for the block (in the main thread; elsewhere a signal
    handler cannot be set, and SIGTERM keeps its default)."""
    handler = SigtermAsInterrupt()
    if threading.current_thread() is not threading.main_thread():
        yield handler
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield handler
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_reason(exc: BaseException | None) -> str:
    """Why the cases still running were stopped, for their records."""
    if isinstance(exc, Terminated):
        return "stopped by SIGTERM"
    if isinstance(exc, KeyboardInterrupt):
        return "stopped by Ctrl-C"
    if isinstance(exc, DiskFull):
        return f"stopped: the disk is full ({exc.strerror}: {exc.filename})"
    return f"stopped: the run failed ({type(exc).__name__}: {exc})" if exc is not None else "stopped"


def failed_record(case: Case, kind: str, message: str, detail: str = "", elapsed_s: float | None = None,
                  device: DeviceInfo | None = None) -> CaseRecord:
    record = runner.new_record(case)
    record.status = "interrupted" if kind == "interrupted" else "failed"
    record.failure = Failure(kind, message, detail)
    record.elapsed_s = elapsed_s
    record.device = device.to_dict() if device is not None else None
    return record


# -- in this process ---------------------------------------------------------------------------

class InProcess:
    def __init__(self, device_text: str, *, calibrate: bool, telemetry_interval_s: float):
        self.device = torch.device(device_text)
        self.calibrate = calibrate
        self.interval = telemetry_interval_s
        self.state: DeviceState | None = None

    def start(self) -> list[DeviceState]:
        from gpubench import env as envmod

        # A segfault or abort in a case ends this process: Python's stack on stderr says where
        # (the finished cases are in cases.jsonl).
        if not faulthandler.is_enabled():
            with contextlib.suppress(AttributeError, ValueError, OSError):  # a stderr without a file descriptor
                faulthandler.enable(file=sys.stderr, all_threads=False)
        self.device = envmod.use_device(self.device)  # events, streams and allocations default to this GPU
        env = envmod.capture_env(self.device)
        info = DeviceInfo(key=str(self.device), type=self.device.type,
                          index=(env.get("gpu") or {}).get("index"), label=env["device_label"],
                          uuid=(env.get("gpu") or {}).get("uuid"), host=env.get("host", ""))
        ceilings = envmod.run_ceilings(self.device) if self.calibrate else None
        sampler = TelemetrySampler.for_device(self.device, interval_s=self.interval)
        sampler.start()
        self.state = DeviceState(info, env, ceilings, sampler)
        return [self.state]

    def run(self, jobs: list[Job], sink: Sink) -> None:
        from gpubench import timing

        clocks: dict[bool, timing.Clock] = {}
        for n, job in enumerate(jobs):
            sink.started(job)
            flush = job.case.policy.flush_l2
            if flush not in clocks:
                clocks[flush] = timing.Clock(self.device, flush_l2=flush)
            try:
                record = runner.run_case(job.case, self.device, clocks[flush], self.state.sampler, self.state.ceilings,
                                         job.run_dir)
            except runner.CaseInterrupted as stop:
                stop.record.device = self.state.info.to_dict()
                if sink.sigterm.received and stop.record.failure is not None:  # the runner says Ctrl-C
                    stop.record.failure.message = stop_reason(Terminated())
                sink.finished(job, stop.record)
                raise KeyboardInterrupt from None
            record.device = self.state.info.to_dict()
            sink.finished(job, record)
            if record.status == "failed":
                broken = runner.cuda_context_broken(self.device)
                if broken is not None:
                    raise RunAborted(f"the CUDA context is unusable after case {job.case.id} ({broken}); "
                                     f"{len(jobs) - n - 1} later case(s) not run")

    def devices(self) -> list[DeviceState]:
        return [self.state] if self.state is not None else []

    def close(self) -> None:
        if self.state is not None and self.state.sampler is not None:
            self.state.sampler.close()


# -- worker processes --------------------------------------------------------------------------

class WorkerDied(Exception):
    pass


class _Worker:
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
        self.process = self.context.Process(target=worker.main, name=f"gpubench-worker-{self.key}", daemon=True,
                                            args=(child, self.key, self.device_text, self.tag, str(self.log_path),
                                                  calibrate))
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
            raise WorkerDied(f"the worker for {self.key} died while starting ({self.exit_text()}); its last "
                             f"output:\n{self.log_tail()}") from None
        return self.ready

    def submit(self, job: Job, limit_s: float) -> None:
        self.job = job
        self.log_offset = self._log_size()
        self.started_at = time.monotonic()
        self.deadline = self.started_at + limit_s + kill_grace_s(limit_s)
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

    def __init__(self, devices: Sequence[str], log_dir: Path, *, calibrate: bool, telemetry_interval_s: float,
                 max_parallel: int | None = None):
        context = mp.get_context("spawn")
        keys = slot_keys(devices)
        slots = max_parallel or len(keys)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.workers = [_Worker(context, key, d, log_dir) for key, d in list(zip(keys, devices))[:slots]]
        self.calibrate = calibrate
        self.interval = telemetry_interval_s
        self.states: dict[str, DeviceState] = {}

    def start(self) -> list[DeviceState]:
        for w in self.workers:
            ready = w.spawn(self.calibrate)
            self.states[w.key] = DeviceState(ready.device, ready.env, ready.ceilings,
                                             self._sampler(ready.device, w.tag))
        return list(self.states.values())

    def _sampler(self, info: DeviceInfo, tag: Any) -> TelemetrySampler:
        if info.type != "cuda":
            return TelemetrySampler(None, self.interval, unavailable_reason=f"device is {info.type} "
                                    "(NVML reports NVIDIA GPUs only)")
        try:
            source = NvmlSource(index=None if info.uuid else info.index, uuid=info.uuid)
        except TelemetryUnavailable as exc:
            return TelemetrySampler(None, self.interval, unavailable_reason=str(exc))
        sampler = TelemetrySampler(source, self.interval, tag_reader=lambda: worker.read_tag(tag))
        sampler.start()
        return sampler

    def _replace(self, w: _Worker) -> None:
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
                    label = self.states[w.key].info.label
                    job = next((j for j in pending if j.target in (None, label)), None)
                    if job is None:
                        continue
                    pending.remove(job)
                    job = dataclasses.replace(job, ceilings=self.states[w.key].ceilings)
                    sink.started(job)
                    w.submit(job, job.case.policy.case_timeout_s)
            busy = [w for w in alive if w.job is not None]
            if not busy:
                for job in pending:  # asked for a device model no live worker has
                    sink.finished(job, failed_record(job.case, "crash", f"no worker on a {job.target} is left to run it"))
                return
            timeout = max(0.0, min(w.deadline for w in busy) - time.monotonic())
            ready = set(wait_any([w.conn for w in busy], timeout))
            for w in busy:
                if w.conn in ready:
                    self._collect(w, sink)
                elif time.monotonic() >= w.deadline:
                    self._time_out(w, sink)

    def _collect(self, w: _Worker, sink: Sink) -> None:
        job = w.job
        try:
            done: Done | Note = w.conn.recv()
        except (EOFError, OSError):
            w.process.join(5.0)
            message = f"the worker died during the case ({w.exit_text()})"
            sink.finished(job, failed_record(job.case, "crash", message, w.log_tail(),
                                             time.monotonic() - w.started_at, self.states[w.key].info))
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

    def _time_out(self, w: _Worker, sink: Sink) -> None:
        job = w.job
        elapsed = time.monotonic() - w.started_at
        w.kill()
        limit = job.case.policy.case_timeout_s
        message = (f"timeout (worker killed after {elapsed:.1f} s): the case passed policy.case_timeout_s = "
                   f"{limit:g} s inside a call Python could not interrupt (native code or a kernel that never returned)")
        sink.finished(job, failed_record(job.case, "timeout", message, w.log_tail(), elapsed,
                                         self.states[w.key].info))
        self._replace(w)

    def devices(self) -> list[DeviceState]:
        return list(self.states.values())

    def in_flight(self) -> list[tuple[Job, DeviceInfo, float]]:
        """The jobs running now: (job, device, seconds so far)."""
        return [(w.job, self.states[w.key].info, time.monotonic() - w.started_at)
                for w in self.workers if w.job is not None]

    def close(self) -> None:
        for w in self.workers:
            w.stop()
        for state in self.states.values():
            if state.sampler is not None:
                state.sampler.close()


# -- the run -----------------------------------------------------------------------------------

@dataclass
class RunOptions:
    devices: list[str] = field(default_factory=lambda: ["cpu"])
    isolation: str = "process"
    cluster: str | None = None  # "ray" or "ray://host:port"
    gpu_type: str | None = None  # Ray accelerator type, e.g. H100
    max_parallel: int | None = None
    exclusive: bool = False  # refuse to start when other processes use a GPU
    lock_clocks: bool = False
    per_model: bool = False  # every case once on each device model (a fleet's technique x device matrix)
    profile: bool = False  # --profile: every case's policy.profile on (profiles after timing)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _check_hygiene(devices: Sequence[str], exclusive: bool) -> dict[str, Any]:
    found = {d: hygiene.gpu_processes(d) for d in dict.fromkeys(devices) if d.startswith("cuda")}
    busy = {d: p for d, p in found.items() if isinstance(p, list) and p}
    if exclusive and busy:
        listing = "; ".join(f"{d}: " + ", ".join(f"{p['name']} (pid {p['pid']})" for p in procs)
                            for d, procs in busy.items())
        raise BadInput(f"--exclusive: other processes are using the GPU ({listing}); their work would share the "
                       "device with the measurements. Stop them, or run without --exclusive (the report then warns).")
    return found


def make_jobs(cases: Sequence[Case], targets: Sequence[str | None], run_dir: Path | None = None) -> list[Job]:
    """One job per case and target device model, case by case (a run reads in case order)."""
    where = None if run_dir is None else str(run_dir)
    return [Job(i * len(targets) + t, case, techniques.get(case.technique).source, None, target, where)
            for i, case in enumerate(cases) for t, target in enumerate(targets)]


def profiled(cases: Sequence[Case]) -> list[Case]:
    """``--profile``: the cases with ``policy.profile`` on."""
    return [dataclasses.replace(c, policy=dataclasses.replace(c.policy, profile=True)) for c in cases]


def _targets(options: RunOptions, started: Sequence[DeviceState]) -> list[str | None]:
    if options.cluster and options.gpu_type and "," in options.gpu_type:
        return [t.strip() for t in options.gpu_type.split(",") if t.strip()]
    if options.per_model:
        return list(dict.fromkeys(s.info.label for s in started)) or [None]
    return [None]


def check_options(options: RunOptions) -> None:
    """Bad combinations, refused before anything is created."""
    if options.isolation not in ISOLATIONS:
        raise BadInput(f"--isolation: {options.isolation!r} is not valid; allowed: {', '.join(ISOLATIONS)}.")
    if options.isolation == "none" and len(options.devices) > 1 and not options.cluster:
        raise BadInput("--isolation none runs every case in this process, on one device; give one device "
                       f"(got {', '.join(options.devices)}) or use worker processes (--isolation process).")
    if options.max_parallel is not None and options.max_parallel < 1:
        raise BadInput(f"--max-parallel: {options.max_parallel} is not valid; allowed: an integer >= 1.")
    if options.cluster:
        from gpubench.cluster import check_address, ray_module

        check_address(options.cluster)
        ray_module()


def make_executor(options: RunOptions, run_dir: results.RunDirectory, *, calibrate: bool,
                  telemetry_interval_s: float) -> Executor:
    if options.cluster:
        from gpubench.cluster import RayCluster

        return RayCluster(options.cluster, options.devices, gpu_type=options.gpu_type, calibrate=calibrate,
                          max_parallel=options.max_parallel)
    if options.isolation == "none":
        return InProcess(options.devices[0], calibrate=calibrate, telemetry_interval_s=telemetry_interval_s)
    return LocalWorkers(options.devices, run_dir.path / "workers", calibrate=calibrate,
                        telemetry_interval_s=telemetry_interval_s, max_parallel=options.max_parallel)


def run_scenario(scenario: Scenario, options: RunOptions | None = None, out_root: Path | str = "runs", *,
                 only: list[str] | None = None, repeat_scale: float = 1.0,
                 progress: runner.ProgressListener | None = None, telemetry_interval_s: float = 0.05,
                 calibrate: bool = True) -> runner.RunOutcome:
    options = options or RunOptions()
    check_options(options)
    progress = progress or runner.Silent()
    cases = scenario.cases(only=only, repeat_scale=repeat_scale)
    if options.profile:
        cases = profiled(cases)
    processes = {} if options.cluster else _check_hygiene(options.devices, options.exclusive)
    run_dir = results.RunDirectory.create(Path(out_root), scenario.name)
    run = RunRecord(run_id=run_dir.path.name, device=",".join(options.devices), device_label="",
                    scenario=scenario.to_dict(), env={}, repeat_scale=repeat_scale, only=only, started_at=_now())
    try:
        executor = make_executor(options, run_dir, calibrate=calibrate, telemetry_interval_s=telemetry_interval_s)
    except BadInput:
        _remove_if_empty(run_dir.path)  # refused before anything ran: leave no empty run directory
        raise
    with sigterm_as_interrupt() as sigterm:
        sink = Sink(run_dir, progress, sigterm)
        _run(run, options, executor, sink, cases, processes, progress)
    return runner.RunOutcome(run_dir.path, run)


def _remove_if_empty(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()


def _run(run: RunRecord, options: RunOptions, executor: Executor, sink: Sink, cases: list[Case],
         processes: dict[str, Any], progress: runner.ProgressListener) -> None:
    """Start the executor, run the jobs, close the record whatever happened (Ctrl-C, SIGTERM, a
    full disk, a fault in the harness)."""
    run_dir = sink.run_dir
    clock_lock = hygiene.ClockLock(options.devices if options.lock_clocks and not options.cluster else [])
    clocks = clock_lock.state if options.lock_clocks else None
    t_start = time.perf_counter()
    try:
        with clock_lock:
            try:
                run_dir.reserve()
                started = executor.start()
                _describe_devices(run, started, processes, clocks)
                jobs = make_jobs(cases, _targets(options, started), run_dir.path)
                run.planned_cases = len(jobs)
                progress.run_started(len(jobs))
                run_dir.write_env(run.env)
                run_dir.write_results(run)
                with notices.listening(sink.note):  # in-process cases; a worker's come over its pipe
                    executor.run(jobs, sink)
            finally:
                sink.sigterm.armed = False  # the record is being closed: a SIGTERM now must not cut it
                try:
                    why = stop_reason(sys.exc_info()[1])
                    for job, info, elapsed in (executor.in_flight() if isinstance(executor, LocalWorkers) else []):
                        with contextlib.suppress(DiskFull):  # kept in memory; run_dir.full says the disk is full
                            sink.finished(job, failed_record(job.case, "interrupted", why, elapsed_s=elapsed,
                                                             device=info))
                finally:
                    executor.close()
    except KeyboardInterrupt as exc:
        sigterm = isinstance(exc, Terminated) or sink.sigterm.received
        run.status, run.signal = "interrupted", "SIGTERM" if sigterm else "SIGINT"
        run.abort_reason = stop_reason(Terminated() if sigterm else exc) + (
            "" if run.planned_cases is not None else " while the workers were starting: no case ran")
    except DiskFull as exc:
        run.status = "aborted"
        run.abort_reason = f"the disk is full ({exc.strerror}: {exc.filename}); " + (
            "the cases after it were not run" if sink.records else "no case ran")
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
        sink.sigterm.armed = False
        if run.status == "running":
            run.status = "complete"
        run.finished_at = _now()
        run.cases = [sink.records[i] for i in sorted(sink.records)]
        states = executor.devices()
        _describe_devices(run, states, processes, clocks)
        cap = memory_cap_warning(run, cases)
        if cap:
            run.warnings.append(cap)
        _attach_telemetry(run, states)
        run.time_use = results.TimeUse.of(run.cases, time.perf_counter() - t_start, max(1, len(run.devices)))
        _remember_case_times(run)
        if options.cluster:
            run.telemetry = {"status": "unavailable", "reason": "the cases ran as Ray tasks: telemetry is not "
                             "sampled on the cluster's nodes"}
        _write_run(run_dir, run, sink.records, states)
        progress.run_finished()


def _write_run(run_dir: results.RunDirectory, run: RunRecord, records: dict[int, CaseRecord],
               states: Sequence[DeviceState]) -> None:
    """results.json, results.csv and telemetry.csv. On a full disk (before or now), what still
    fits is kept (:meth:`RunDirectory.close_on_full_disk`) and ``run.disk_full`` says which write
    the disk refused."""
    run_dir.release()
    if run_dir.full is None:
        try:
            run_dir.write_results(run)
            run_dir.write_cases_csv(run)
            _write_telemetry(run_dir, states)
            return
        except DiskFull:
            pass
    run.disk_full = f"{run_dir.full.filename}: {run_dir.full.strerror}"
    run_dir.close_on_full_disk(run, records)
    for write in (lambda: run_dir.write_cases_csv(run), lambda: _write_telemetry(run_dir, states)):
        with contextlib.suppress(DiskFull):
            write()


def memory_cap_warning(run: RunRecord, cases: Sequence[Case]) -> str | None:
    """What a reader must know of a run whose cases capped the GPU's memory (policy
    gpu_memory_gib): the memory was a smaller card's, the compute and bandwidth were not."""
    caps = sorted({c.policy.gpu_memory_gib for c in cases if c.policy.gpu_memory_gib > 0})
    if not caps or not any(d.get("type") == "cuda" for d in run.devices.values()):
        return None
    total = (run.env.get("gpu") or {}).get("total_memory_bytes")
    label = run.device_label or "the GPU"
    of = f" of its {total / 2**30:.0f} GiB" if total else ""
    return (f"GPU memory capped at {' / '.join(f'{c:g}' for c in caps)} GiB{of} (policy gpu_memory_gib, through "
            f"torch.cuda.set_per_process_memory_fraction): allocations past the cap fail as on a card of that "
            f"size, but compute, memory bandwidth and caches are still the {label}'s, so times are not a "
            f"smaller card's.")


def _remember_case_times(run: RunRecord) -> None:
    """Add the run's case times to this device model's history (``--dry-run`` estimates from it).
    A cache: a home directory that cannot be written costs the next estimate, not this run."""
    if not run.device_label or run.time_use is None or not run.cases:
        return
    try:
        CaseTimes(run.device_label).record(run.cases, run.repeat_scale, run.time_use.wall_s, run.time_use.workers)
    except OSError as exc:
        run.warnings.append(f"the case times could not be kept for later estimates ({exc})")


def _describe_devices(run: RunRecord, states: Sequence[DeviceState], processes: dict[str, Any],
                      clocks: dict[str, Any] | None) -> None:
    if not states:
        return
    for state in states:
        state.processes = processes.get(state.info.key.split("#")[0])
    labels = list(dict.fromkeys(s.info.label for s in states))
    run.device_label = labels[0] if len(labels) == 1 else " + ".join(labels)
    run.env = dict(states[0].env)
    run.ceilings = states[0].ceilings
    run.devices = {s.info.key: s.to_dict() for s in states}
    busy = {k: d["other_processes"] for k, d in run.devices.items() if isinstance(d["other_processes"], list)
            and d["other_processes"]}
    run.env["gpu_processes"] = {k: d["other_processes"] for k, d in run.devices.items()}
    run.warnings = []
    if busy:
        run.warnings.append("other processes used the GPU when the run started (" + "; ".join(
            f"{k}: " + ", ".join(f"{p['name']} (pid {p['pid']})" for p in procs) for k, procs in busy.items())
            + "): they shared the device with the measurements.")
    if clocks is not None:
        run.env["locked_clocks"] = clocks
        run.clocks = clocks


def _attach_telemetry(run: RunRecord, states: Sequence[DeviceState]) -> None:
    samplers = {s.info.key: s.sampler for s in states if s.sampler is not None}
    if not samplers:
        return
    first = next(iter(samplers.values()))
    run.telemetry = first.run_summary()
    if len(samplers) > 1:
        run.telemetry["devices"] = {key: s.run_summary() for key, s in samplers.items()}
    for record in run.cases:
        key = (record.device or {}).get("key")
        sampler = samplers.get(key)
        record.telemetry = sampler.case_summary(record.id) if sampler is not None and sampler.available else None


def _write_telemetry(run_dir: results.RunDirectory, states: Sequence[DeviceState]) -> None:
    import pandas as pd

    from gpubench.telemetry import SAMPLE_COLUMNS

    frames = [s.sampler.to_dataframe().assign(device=s.info.key) for s in states if s.sampler is not None]
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*SAMPLE_COLUMNS, "device"])
    run_dir.write_text("telemetry.csv", frame.to_csv(index=False))
