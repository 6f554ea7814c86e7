"""Cases as Ray tasks (``gpubench run --cluster ray`` or ``ray://HOST:PORT``): each case a task
asking for one GPU (one CPU on a CPU-only cluster), optionally of one accelerator type; its record
comes back to this process, which writes the run directory as a local run does.

Ray retries a task whose worker died (three times by default): here ``max_retries=0``, so a
crashing case fails once. A task that passes ``case_timeout_s`` (plus the kill grace) is
cancelled with ``force=True``, which kills its worker process. Ray is an optional extra:
``pip install 'gpubench[ray]'``.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from typing import Any

import torch

from gpubench.errors import BadInput
from gpubench.measure import env as envmod
from gpubench.records.results import CaseRecord
from gpubench.run.executor import DeviceState, failed_record, job_kill_grace_s
from gpubench.run.run_options import check_address, ray_module
from gpubench.run.worker import DeviceInfo, Job, run_job

_WORKER_STATE: dict[str, Any] = {}  # inside a Ray worker process: its device, env and ceilings


def _measure_remote(job: Job, device_type: str, calibrate: bool) -> tuple[CaseRecord, dict[str, Any]]:
    """Runs inside a Ray worker: measure one case on the device Ray assigned (cuda:0 is the GPU
    it made visible), reusing this process's environment capture and calibration."""
    device = torch.device("cuda:0" if device_type == "cuda" else "cpu")
    if not _WORKER_STATE:
        envmod.use_device(device)
        env = envmod.capture_env(device)
        gpu = env.get("gpu") or {}
        key = (
            f"{socket.gethostname()}:{gpu.get('uuid') or device}"
            if device.type == "cuda"
            else f"{socket.gethostname()}:cpu:{os.getpid()}"
        )
        info = DeviceInfo(
            key=key,
            type=device.type,
            index=gpu.get("index"),
            label=env["device_label"],
            uuid=gpu.get("uuid"),
            host=env.get("host", ""),
        )
        ceilings = envmod.run_ceilings(device) if calibrate else None
        _WORKER_STATE.update(info=info, env=env, ceilings=ceilings, clocks={})

    class _NoTelemetry:
        def set_tag(self, case_id: Any, variant: Any) -> None:
            pass

        def energy_mj(self) -> None:
            return None

    state = _WORKER_STATE
    record, _ = run_job(job, device, state["clocks"], _NoTelemetry(), state["ceilings"], state["info"])
    return record, {"info": state["info"], "env": state["env"], "ceilings": state["ceilings"]}


class RayCluster:
    """The executor for ``--cluster``: ``ray`` starts a local Ray instance (or joins the one
    RAY_ADDRESS names), ``ray://HOST:PORT`` connects to an existing cluster."""

    def __init__(
        self,
        address: str,
        devices: Sequence[str],
        *,
        gpu_type: str | None = None,
        calibrate: bool = True,
        max_parallel: int | None = None,
    ):
        check_address(address)
        self.ray = ray_module()
        self.address = None if address == "ray" else address
        self.device_type = "cuda" if any(d.startswith("cuda") for d in devices) else "cpu"
        self.gpu_type = gpu_type
        self.calibrate = calibrate
        self.max_parallel = max_parallel
        self.discovered: dict[str, Any] = {}
        self._started_here = False

    def start(self) -> list[Any]:
        ray = self.ray
        if not ray.is_initialized():
            ray.init(
                address=self.address,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
                ignore_reinit_error=True,
            )
            self._started_here = True
        resources = ray.cluster_resources()
        # GPU-only (docs/cuda-paths.md): a Ray cluster with GPUs; the CPU cluster test runs the rest
        if self.device_type == "cuda" and not resources.get("GPU"):
            raise BadInput(
                f"--cluster {self.address or 'ray'}: the cluster has no GPU (resources: "
                f"{ {k: v for k, v in resources.items() if not k.startswith('node:')} }); "
                "use --device cpu for a CPU-only cluster."
            )
        return []

    def _slots(self) -> int:
        resources = self.ray.cluster_resources()
        slots = int(resources.get("GPU" if self.device_type == "cuda" else "CPU", 1))
        return max(1, min(slots, self.max_parallel or slots))

    def run(self, jobs: list[Job], sink: Any) -> None:
        ray = self.ray
        options: dict[str, Any] = {"max_retries": 0, "retry_exceptions": False}
        if self.device_type == "cuda":  # GPU-only: Ray places the task on a GPU
            options["num_gpus"] = 1
            if self.gpu_type and "," not in self.gpu_type:
                options["accelerator_type"] = self.gpu_type
        else:
            options["num_cpus"] = 1
        remote = ray.remote(**options)(_measure_remote)
        pending = list(jobs)
        running: dict[Any, tuple[Job, float]] = {}
        slots = self._slots()
        while pending or running:
            while pending and len(running) < slots:
                job = sink.admit(pending.pop(0))
                if job is None:  # the run's budget cannot hold it
                    continue
                sink.started(job)
                task = remote.options(accelerator_type=job.target) if job.target else remote
                running[task.remote(job, self.device_type, self.calibrate)] = (job, time.monotonic())
            if not running:
                break
            deadline = min(start + job.limit_s + job_kill_grace_s(job) for job, start in running.values())
            ready, _ = ray.wait(list(running), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            for ref in ready:
                job, start = running.pop(ref)
                try:
                    record, state = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:  # the harness itself raised in the task
                    record = failed_record(
                        job.case,
                        "exception",
                        f"the Ray task raised: {exc.cause!r}",
                        str(exc)[-4000:],
                        time.monotonic() - start,
                    )
                except ray.exceptions.RayError as exc:  # the worker process died: segfault, os._exit, OOM kill
                    record = failed_record(
                        job.case,
                        "crash",
                        f"the Ray worker died during the case ({type(exc).__name__})",
                        str(exc)[-4000:],
                        time.monotonic() - start,
                    )
                else:
                    self.discovered.setdefault(state["info"].key, state)
                sink.finished(job, record)
                if record.status == "interrupted" and (record.failure is None or record.failure.kind != "budget"):
                    raise KeyboardInterrupt  # Ctrl-C inside the task (a case the budget stopped goes on)
            now = time.monotonic()
            for ref, (job, start) in list(running.items()):
                limit = job.limit_s
                if now - start >= limit + job_kill_grace_s(job):
                    ray.cancel(ref, force=True)
                    running.pop(ref)
                    what = (
                        "the run's --budget ran out"
                        if job.budget_limited
                        else f"the case passed policy.case_timeout_s = {limit:g} s"
                    )
                    sink.finished(
                        job,
                        failed_record(
                            job.case,
                            "budget" if job.budget_limited else "timeout",
                            f"{'stopped' if job.budget_limited else 'timeout'} (Ray task cancelled, its worker killed, "
                            f"after {now - start:.1f} s): {what}",
                            elapsed_s=now - start,
                        ),
                    )

    def devices(self) -> list[DeviceState]:
        return [DeviceState(s["info"], s["env"], s["ceilings"]) for s in self.discovered.values()]

    def close(self) -> None:
        if self._started_here and self.ray.is_initialized():
            self.ray.shutdown()
