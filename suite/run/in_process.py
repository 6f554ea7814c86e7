"""The executor for ``--isolation none``: every case in the supervisor's own process, as a debugger
wants it. Nothing isolates a case: a hung native call hangs the run, a segfault ends it (Python's
stack then goes to stderr; the finished cases are in cases.jsonl), and a case that leaves the CUDA
context unusable aborts the run (:class:`gpubench.run.stopping.RunAborted`).
"""

from __future__ import annotations

import contextlib
import faulthandler
import sys

import torch

from gpubench.measure import env as envmod
from gpubench.measure import timing
from gpubench.measure.telemetry import TelemetrySampler
from gpubench.run import runner
from gpubench.run.executor import DeviceState, Sink
from gpubench.run.stopping import RunAborted, Terminated, stop_reason
from gpubench.run.worker import DeviceInfo, Job


class InProcess:
    def __init__(self, device_text: str, *, calibrate: bool, telemetry_interval_s: float):
        self.device = torch.device(device_text)
        self.calibrate = calibrate
        self.interval = telemetry_interval_s
        self.state: DeviceState | None = None

    def start(self) -> list[DeviceState]:
        # A segfault or abort in a case ends this process: Python's stack on stderr says where
        # (the finished cases are in cases.jsonl).
        if not faulthandler.is_enabled():
            with contextlib.suppress(AttributeError, ValueError, OSError):  # a stderr without a file descriptor
                faulthandler.enable(file=sys.stderr, all_threads=False)
        self.device = envmod.use_device(self.device)  # events, streams and allocations default to this GPU
        env = envmod.capture_env(self.device)
        info = DeviceInfo(
            key=str(self.device),
            type=self.device.type,
            index=(env.get("gpu") or {}).get("index"),
            label=env["device_label"],
            uuid=(env.get("gpu") or {}).get("uuid"),
            host=env.get("host", ""),
        )
        ceilings = envmod.run_ceilings(self.device) if self.calibrate else None
        sampler = TelemetrySampler.for_device(self.device, interval_s=self.interval)
        sampler.start()
        self.state = DeviceState(info, env, ceilings, sampler)
        return [self.state]

    def run(self, jobs: list[Job], sink: Sink) -> None:
        clocks: dict[bool, timing.Clock] = {}
        state = self.state
        assert state is not None and state.sampler is not None  # start() ran
        for n, queued in enumerate(jobs):
            job = sink.admit(queued)
            if job is None:  # the run's budget cannot hold it
                continue
            sink.started(job)
            flush = job.case.policy.flush_l2
            if flush not in clocks:
                clocks[flush] = timing.Clock(self.device, flush_l2=flush)
            try:
                record = runner.run_case(
                    job.case,
                    self.device,
                    clocks[flush],
                    state.sampler,
                    state.ceilings,
                    job.run_dir,
                    budget_s=job.budget_s,
                    time_limit=job.time_limit,
                )
            except runner.CaseInterrupted as stop:
                stop.record.device = state.info.record()
                if sink.sigterm.received and stop.record.failure is not None:  # the runner says Ctrl-C
                    stop.record.failure.message = stop_reason(Terminated())
                sink.finished(job, stop.record)
                raise KeyboardInterrupt from None
            record.device = state.info.record()
            sink.finished(job, record)
            if record.status == "failed":
                broken = runner.cuda_context_broken(self.device)
                if broken is not None:
                    raise RunAborted(
                        f"the CUDA context is unusable after case {job.case.id} ({broken}); "
                        f"{len(jobs) - n - 1} later case(s) not run"
                    )

    def devices(self) -> list[DeviceState]:
        return [self.state] if self.state is not None else []

    def close(self) -> None:
        if self.state is not None and self.state.sampler is not None:
            self.state.sampler.close()
