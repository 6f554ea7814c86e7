"""A worker process: it owns one device, measures the cases the supervisor hands it, and sends
each case's record back. Started with ``spawn``, so it inherits no CUDA state; it ignores Ctrl-C
(the supervisor decides), writes its stdout and stderr to a log file in the run directory (the
supervisor quotes its last lines when the worker dies), and dumps Python's stack on a fatal
signal there too (``faulthandler``).

Messages, worker to supervisor: ``Ready(device, env, ceilings)`` once, then per job any number of
``Note(index, text)`` (what the case says to the user while it runs) and one ``Done(index, record,
broken)``; ``broken`` says the CUDA context is unusable after the case, and the worker exits.
Supervisor to worker: a :class:`Job`, or None to stop.
"""

from __future__ import annotations

import faulthandler
import functools
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from gpubench import techniques
from gpubench.measure import env as envmod
from gpubench.measure import telemetry, timing
from gpubench.measure.energy import CounterLog, CounterReader
from gpubench.measure.machine_load import TimeLimit
from gpubench.records import notices
from gpubench.records.results import Device, json_safe
from gpubench.run import runner
from gpubench.run.scenario import Case

TAG_BYTES = 512


@dataclass(frozen=True)
class DeviceInfo:
    """Which device a record was measured on."""

    key: str  # the worker slot's device, e.g. "cuda:2" or "cpu" ("cpu#1" for a second CPU worker)
    type: str  # cuda or cpu
    index: int | None
    label: str  # the hardware by name, e.g. "NVIDIA H200" or "CPU: AMD EPYC (2 logical cores)"
    uuid: str | None = None
    cpu_affinity: tuple[int, ...] | None = None  # the cores the worker was pinned to (near its GPU)
    host: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "type": self.type,
            "index": self.index,
            "label": self.label,
            "uuid": self.uuid,
            "cpu_affinity": list(self.cpu_affinity) if self.cpu_affinity else None,
            "host": self.host,
        }

    def record(self) -> Device:
        """What a case record keeps of it (:class:`gpubench.records.results.Device`)."""
        return Device(
            self.key,
            self.type,
            self.index,
            self.label,
            self.uuid,
            list(self.cpu_affinity) if self.cpu_affinity else None,
            self.host,
        )


@dataclass(frozen=True)
class Job:
    index: int  # the case's position in the run
    case: Case
    source: str  # where the technique is defined, so a fresh process can load it
    ceilings: dict[str, Any] | None
    target: str | None = None  # run on a device of this model (a label, or Ray's accelerator type)
    run_dir: str | None = None  # the run directory: profiles are written under it (policy.profile)
    budget_s: float | None = None  # --budget: the time left for it, when shorter than its case_timeout_s
    # its case_timeout_s scaled by the machine's load at its start (gpubench.measure.machine_load); None: unscaled
    time_limit: TimeLimit | None = None

    @property
    def timeout_s(self) -> float:
        """The case's own limit: its policy's case_timeout_s, scaled by the load at its start."""
        return self.time_limit.seconds if self.time_limit is not None else self.case.policy.case_timeout_s

    @property
    def limit_s(self) -> float:
        """The seconds the case may take: :attr:`timeout_s`, or less where the run's budget has
        less left."""
        return self.timeout_s if self.budget_s is None else min(self.timeout_s, self.budget_s)

    @property
    def budget_limited(self) -> bool:
        return self.budget_s is not None and self.budget_s < self.timeout_s


@dataclass
class Ready:
    device: DeviceInfo
    env: dict[str, Any]
    ceilings: dict[str, Any] | None
    pid: int = field(default_factory=os.getpid)


@dataclass
class Note:
    """A notice from inside a case (:mod:`gpubench.records.notices`), sent while the case runs."""

    index: int
    text: str


@dataclass
class Done:
    index: int
    record: Any  # a CaseRecord
    broken: str | None = None  # the CUDA context is unusable (the worker exits after sending)
    interrupted: bool = False  # Ctrl-C was raised inside the case (the run stops)


class SharedTag:
    """The case and variant running now, in shared memory, so the supervisor's telemetry thread
    tags its samples with what this worker is doing. ``energy_mj`` reads the device's energy
    counter in this process (NVML is not tied to a process), ``power_limit_w`` the board's power
    limit, ``energy_log`` the counter's reads taken throughout by a thread of this process (the
    supervisor's sampler is in another). What ``run_case`` needs of telemetry: ``set_tag``,
    ``energy_mj`` (and, to check energy figures, ``power_limit_w``; to measure long calls over
    their timed calls, ``energy_log``)."""

    def __init__(self, buffer: Any, energy: Any = None, interval_s: float = telemetry.DEFAULT_INTERVAL_S):
        self._buffer = buffer
        self._energy = energy
        self._reader = CounterReader(self.energy_mj, interval_s) if energy is not None else None

    @property
    def energy_log(self) -> CounterLog | None:
        """The counter's reads, every ``interval_s`` from the first ask on (the runner asks before
        timing a case that measures energy); None where there is no counter to read."""
        if self._reader is None or self.energy_mj() is None:
            return None
        self._reader.start()
        return self._reader.log

    def close(self) -> None:
        """Stop reading the counter (the source is its owner's to close)."""
        if self._reader is not None:
            self._reader.stop()

    def set_tag(self, case_id: str | None, variant: str | None) -> None:
        text = "" if case_id is None else f"{case_id}\t{variant or ''}"
        self._buffer.value = text.encode()[: TAG_BYTES - 1]

    def energy_mj(self) -> float | None:
        try:
            return None if self._energy is None else self._energy.energy_mj()
        except Exception:  # noqa: BLE001 - energy is optional
            return None

    def power_limit_w(self) -> float | None:
        try:
            return None if self._energy is None else self._energy.power_limit_w()
        except Exception:  # noqa: BLE001 - without it, energy figures go unchecked
            return None


def read_tag(buffer: Any) -> tuple[str | None, str | None]:
    text = buffer.value.decode(errors="replace")
    if not text:
        return None, None
    case_id, _, variant = text.partition("\t")
    return case_id, variant or None


def _redirect_output(log_path: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    faulthandler.enable(file=sys.stderr, all_threads=True)


def _core_list(cores: Sequence[int]) -> str:
    """``0-15,32-47``: sorted cores as ranges."""
    runs: list[list[int]] = []
    for c in sorted(cores):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def choose_affinity(near: Sequence[int], current: Sequence[int]) -> tuple[tuple[int, ...] | None, str]:
    """The cores to pin to, of those NVML says are ``near`` the GPU and the process may use now
    (``current``), or None to stay unpinned; with the line that says which and why."""
    usable = tuple(sorted(set(near) & set(current)))
    of = f"{len(usable)} of the process's {len(current)} cores"
    if not usable:
        return None, (
            f"not pinned to CPU cores: NVML's affinity for this GPU ({_core_list(near) or 'none'}) "
            f"holds none of the process's cores ({_core_list(current)})"
        )
    if 2 * len(usable) < len(current):
        return None, (
            f"not pinned to CPU cores: NVML's affinity for this GPU ({_core_list(usable)}) leaves {of}, "
            f"fewer than half; the host-side work (Python, launches, data) would lose more than "
            f"nearness to the GPU gains"
        )
    return usable, f"pinned to CPU cores {_core_list(usable)} (NVML's affinity for this GPU; {of})"


def _pin_near(handle: Any) -> tuple[int, ...] | None:
    """Pin this process to the CPU cores NVML says are nearest the GPU (:func:`choose_affinity`),
    saying so in the worker's log; None where it does not."""
    try:
        import pynvml

        current = tuple(sorted(os.sched_getaffinity(0)))
        words = pynvml.nvmlDeviceGetCpuAffinity(handle, ((os.cpu_count() or 1) + 63) // 64)
    except Exception:  # noqa: BLE001 - no NVML, no affinity API: run unpinned
        return None
    near = tuple(w * 64 + b for w, mask in enumerate(words) for b in range(64) if mask >> b & 1)
    cores, line = choose_affinity(near, current)
    print(f"gpubench: {line}", flush=True)  # stdout is the worker's log
    if cores is not None:
        try:
            os.sched_setaffinity(0, cores)
        except OSError as exc:
            print(f"gpubench: pinning failed ({exc}); running unpinned", flush=True)
            return None
    return cores


def identify(key: str, device: Any, env: dict[str, Any], energy_source: Any) -> DeviceInfo:
    gpu = env.get("gpu") or {}
    affinity = _pin_near(energy_source.handle) if energy_source is not None else None
    return DeviceInfo(
        key=key,
        type=device.type,
        index=gpu.get("index"),
        label=env["device_label"],
        uuid=gpu.get("uuid"),
        cpu_affinity=affinity,
        host=env.get("host", ""),
    )


def run_job(
    job: Job, device: Any, clocks: dict[bool, Any], probe: Any, ceilings: dict[str, Any] | None, info: DeviceInfo
) -> tuple[Any, bool]:
    """Measure one job where it is to run (a worker process, a Ray task): (its record, whether
    Ctrl-C was raised inside it). The technique is loaded from the job's source if need be."""
    flush = job.case.policy.flush_l2
    if flush not in clocks:
        clocks[flush] = timing.Clock(device, flush_l2=flush)
    interrupted = False
    if techniques.find(job.case.technique, job.source) is None:
        record = runner.unloadable(job.case, job.source)
    else:
        try:
            record = runner.run_case(
                job.case,
                device,
                clocks[flush],
                probe,
                job.ceilings or ceilings,
                job.run_dir,
                budget_s=job.budget_s,
                time_limit=job.time_limit,
            )
        except runner.CaseInterrupted as stop:
            record, interrupted = stop.record, True
    record.device = info.record()
    for variant in record.variants.values():  # what crosses a process boundary must pickle
        variant.metrics = json_safe(variant.metrics)
    return record, interrupted


def _send_note(conn: Connection, index: int, text: str) -> None:
    print(f"gpubench: {text}", flush=True)  # in the worker's log too
    conn.send(Note(index, text))


def main(conn: Connection, key: str, device_text: str, tag_buffer: Any, log_path: str, calibrate: bool) -> None:
    """The worker's life: start, report ready, measure jobs until told to stop or the context breaks."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _redirect_output(log_path)
    device = envmod.use_device(device_text)
    energy = None
    if device.type == "cuda":
        try:
            energy = telemetry.nvml_source_for(device)
        except Exception:  # noqa: BLE001 - no NVML: no energy figures
            energy = None
    env = envmod.capture_env(device)
    info = identify(key, device, env, energy)
    ceilings = envmod.run_ceilings(device) if calibrate else None
    conn.send(Ready(info, env, ceilings))
    probe = SharedTag(tag_buffer, energy)
    clocks: dict[bool, Any] = {}
    while True:
        try:
            job = conn.recv()
        except EOFError:  # the supervisor is gone
            break
        if job is None:
            break
        with notices.listening(functools.partial(_send_note, conn, job.index)):
            record, interrupted = run_job(job, device, clocks, probe, ceilings, info)
        broken = runner.cuda_context_broken(device) if record.status == "failed" else None
        conn.send(Done(job.index, record, broken, interrupted))
        if broken or interrupted:
            break
    probe.close()
    if energy is not None:
        energy.close()
