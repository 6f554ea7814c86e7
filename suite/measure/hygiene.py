"""Measurement hygiene on a GPU node, through NVML, from the supervisor (no CUDA context of its
own): which other processes use each GPU before a run, and locking GPU clocks for the run, always
restored at the end (even when a worker crashed)."""

from __future__ import annotations

import atexit
import os
from collections.abc import Collection
from typing import Any

from gpubench.measure import telemetry


def _source(device_text: str) -> telemetry.NvmlSource:
    _, _, idx = device_text.partition(":")
    index, uuid = telemetry.resolve_cuda_index(int(idx or 0), os.environ.get("CUDA_VISIBLE_DEVICES"))
    return telemetry.NvmlSource(index=index, uuid=uuid)


def gpu_processes(device_text: str, ours: Collection[int] = frozenset()) -> list[dict[str, Any]] | str:
    """Other processes holding a context on the GPU (pid, name, memory), or why they cannot be
    listed (a CPU device, no NVML)."""
    if not device_text.startswith("cuda"):
        return "not a GPU"
    try:
        source = _source(device_text)
    except Exception as exc:  # noqa: BLE001 - no NVML: say so
        return f"NVML unavailable: {exc}"
    import pynvml

    found: dict[int, dict[str, Any]] = {}
    try:
        for query in (pynvml.nvmlDeviceGetComputeRunningProcesses, pynvml.nvmlDeviceGetGraphicsRunningProcesses):
            try:
                for p in query(source.handle):
                    if p.pid in ours or p.pid == os.getpid():
                        continue
                    used = getattr(p, "usedGpuMemory", None)
                    found[p.pid] = {
                        "pid": p.pid,
                        "name": _process_name(p.pid),
                        "used_memory_mib": None if not isinstance(used, int) else used / 2**20,
                    }
            except pynvml.NVMLError:
                continue
    finally:
        source.close()
    return list(found.values())


def _process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return "?"  # another container's process: NVML sees it, /proc does not


class ClockLock:
    """``--lock-clocks``: lock each GPU's SM clock at its default application clock (sustainable,
    so the run is not at the mercy of boost) where NVML permits it, record what was locked or why
    not, and reset the lock when the run ends, whatever happened to the workers."""

    def __init__(self, device_texts: list[str]):
        self.devices = [d for d in dict.fromkeys(device_texts) if d.startswith("cuda")]
        self.state: dict[str, dict[str, Any]] = {}
        self._locked: list[str] = []

    def __enter__(self) -> ClockLock:
        if not self.devices:
            self.state["cpu"] = {"locked": False, "reason": "no GPU in this run: nothing to lock"}
        for device in self.devices:
            self.state[device] = self._lock(device)
        atexit.register(self.restore)
        return self

    def _lock(self, device: str) -> dict[str, Any]:
        try:
            source = _source(device)
        except Exception as exc:  # noqa: BLE001
            return {"locked": False, "reason": f"NVML unavailable: {exc}"}
        import pynvml

        try:
            mhz = pynvml.nvmlDeviceGetDefaultApplicationsClock(source.handle, pynvml.NVML_CLOCK_SM)
            pynvml.nvmlDeviceSetGpuLockedClocks(source.handle, mhz, mhz)
            self._locked.append(device)
            return {"locked": True, "sm_clock_mhz": mhz}
        except pynvml.NVMLError as exc:
            reason = str(exc)
            if isinstance(exc, getattr(pynvml, "NVMLError_NoPermission", ())):
                reason += " (locking clocks needs root or nvidia-smi's permission)"
            return {"locked": False, "reason": reason}
        finally:
            source.close()

    def restore(self) -> None:
        while self._locked:
            device = self._locked.pop()
            try:
                source = _source(device)
                import pynvml

                try:
                    pynvml.nvmlDeviceResetGpuLockedClocks(source.handle)
                    self.state[device]["restored"] = True
                finally:
                    source.close()
            except Exception as exc:  # noqa: BLE001 - say it, the run's results stand
                self.state[device]["restored"] = f"failed: {exc}"

    def __exit__(self, *exc: Any) -> None:
        self.restore()
        atexit.unregister(self.restore)
