"""Environment capture and device ceilings.

``capture_env`` records what a result depends on (GPU, driver, CUDA, library versions, CPU,
host, the checkout's git commit, clocks at start). ``calibrate`` measures the device's matmul
rate and copy bandwidth with the same harness that times the techniques, so metrics can be
stated as a % of the *measured* peak rather than a datasheet figure.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

import gpubench
from gpubench.errors import BadInput
from gpubench.measure import machine_load, telemetry, timing
from gpubench.records import stats


def cuda_device(device: str | int | torch.device) -> torch.device:
    """The indexed CUDA device meant by ``cuda``, ``cuda:N``, ``N`` or a torch.device of either
    form (``cuda`` alone means the current device). torch's per-device calls
    (``torch.cuda.set_device`` above all) reject a ``cuda`` without an index, so every CUDA
    entry point passes its device through here first."""
    if isinstance(device, int):
        return torch.device("cuda", device)
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"{device} is not a CUDA device")
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())


def use_device(device: str | torch.device) -> torch.device:
    """Make ``device`` the current CUDA device (events, streams and allocations default to it)
    when it is one, and return it with its index; a CPU device is returned as it is."""
    device = torch.device(device)
    if device.type != "cuda":
        return device
    device = cuda_device(device)
    torch.cuda.set_device(device)
    return device


def resolve_device(requested: str, source: str = "--device") -> torch.device:
    """Turn ``auto|cpu|cuda|cuda:N`` into a device that exists here (a CUDA one always with its
    index), or raise BadInput."""
    allowed = "auto, cpu, cuda or cuda:N"
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cpu":
        return torch.device("cpu")
    if requested == "cuda" or (requested.startswith("cuda:") and requested[5:].isdigit()):
        if not torch.cuda.is_available():
            build = f"torch {torch.__version__}" + (
                f" built for CUDA {torch.version.cuda}" if torch.version.cuda else " built without CUDA"
            )
            raise BadInput(
                f"{source}: device {requested!r} was asked for, but no CUDA GPU is usable here "
                f"({build}; torch.cuda.is_available() is False). Allowed: {allowed}; use 'cpu' or "
                f"'auto' on this machine."
            )
        index = int(requested[5:]) if ":" in requested else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise BadInput(
                f"{source}: device {requested!r} does not exist; this machine has "
                f"{torch.cuda.device_count()} CUDA device(s) (cuda:0..cuda:{torch.cuda.device_count() - 1})."
            )
        return torch.device("cuda", index)
    raise BadInput(f"{source}: {requested!r} is not a device; allowed: {allowed}.")


def device_label(device: torch.device) -> str:
    """A short name for the hardware a number was measured on."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU: {_cpu_model()} ({os.cpu_count()} logical cores)"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    root = Path(gpubench.__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _branch() -> str | None:
    """The checkout's branch: CI's name for it (a CI checkout is often a detached HEAD), else git's;
    None when there is none (detached, not a checkout)."""
    for var in ("GITHUB_HEAD_REF", "GITHUB_REF_NAME", "CI_COMMIT_REF_NAME", "BUILDKITE_BRANCH"):
        if os.environ.get(var):
            return os.environ[var]
    return _git("symbolic-ref", "--short", "-q", "HEAD") or None


def _nvml_info(device: torch.device) -> dict[str, Any]:
    """Driver, clocks, temperature and power limit of ``device`` at this moment, from NVML (the
    GPU is matched by its UUID, so CUDA_VISIBLE_DEVICES and device ordering cannot mislead)."""
    try:
        source = telemetry.nvml_source_for(device)
    except Exception as exc:  # noqa: BLE001 - any NVML failure means "no NVML info"
        return {"nvml": f"unavailable: {exc}"}
    import pynvml  # GPU-only (docs/cuda-paths.md): the fields below need NVML's handle of a real GPU

    handle = source.handle
    info: dict[str, Any] = {"nvml": "ok", "uuid": source.info.get("uuid")}
    fields = {
        "driver_version": lambda: pynvml.nvmlSystemGetDriverVersion(),
        "sm_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "mem_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
        "max_sm_clock_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "max_mem_clock_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM),
        "temperature_c": lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
        "power_limit_w": lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0,
        "persistence_mode": lambda: bool(pynvml.nvmlDeviceGetPersistenceMode(handle)),
    }
    try:
        for key, read in fields.items():
            try:
                value = read()
                info[key] = value.decode() if isinstance(value, bytes) else value
            except Exception:  # noqa: BLE001 - a field this GPU does not report
                info[key] = None
    finally:
        source.close()
    return info


def _load_now() -> float | None:
    load = machine_load.read()
    return round(load.load_1m, 2) if load is not None else None


def capture_env(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "captured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "gpubench_version": gpubench.__version__,
        "device": str(device),
        "device_label": device_label(device),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": _version("triton"),
        "numpy": _version("numpy"),
        "nvidia_ml_py": _version("nvidia-ml-py"),
        "cpu": {
            "model": _cpu_model(),
            "logical_cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "load_1m": _load_now(),
        },  # the 1-minute load average at capture (None: none here)
        "git": {
            "commit": _git("rev-parse", "HEAD"),
            "branch": _branch(),
            "dirty": bool(_git("status", "--porcelain")) if _git("rev-parse", "HEAD") else None,
        },
        "env_vars": {
            k: os.environ[k]
            for k in (
                "CUDA_VISIBLE_DEVICES",
                "TRITON_INTERPRET",
                "OMP_NUM_THREADS",
                "OMP_WAIT_POLICY",
                "GOMP_SPINCOUNT",
            )
            if k in os.environ
        },
    }
    try:
        env["memory_total_bytes"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        env["memory_total_bytes"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["gpu"] = {
            "name": props.name,
            "index": device.index if device.index is not None else torch.cuda.current_device(),
            "total_memory_bytes": props.total_memory,
            "multiprocessors": props.multi_processor_count,
            "compute_capability": f"{props.major}.{props.minor}",
            "cudnn": torch.backends.cudnn.version(),
            **_nvml_info(device),
        }
    else:
        env["gpu"] = None
    return env


MATMUL_N_GPU = 8192  # the calibration's square bf16 matmul on a GPU, quick or not


def _randn(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(1234)
    return torch.randn(shape, generator=g).to(device=device, dtype=dtype)


def calibrate(device: torch.device, quick: bool = False) -> dict[str, Any]:
    """Measure the device's ceilings: dense matmul FLOP/s (bf16 on a GPU, fp32 on a CPU), memory
    copy bandwidth (bytes read + written), host<->device bandwidth on a GPU, and the harness's
    per-repetition overhead; with them the machine's load while they were measured (``load``:
    the 1-minute load average before and after, and the logical CPUs; None where the platform has
    none): ceilings measured on a busy machine are a share of it, and the roofline says so."""
    device = use_device(device)  # the harness's events record on the current device
    load_before = machine_load.read()
    on_gpu = device.type == "cuda"
    policy = timing.Policy(
        warmup_s=0.1,
        min_reps=5,
        max_reps=30 if quick else 100,
        min_time_s=0.2 if quick else 1.0,
        max_time_s=2.0 if quick else 8.0,
        target_iqr=0.02,
        flush_l2=False,
    )
    clock = timing.Clock(device, flush_l2=False)

    def best_rate(fn, work: float) -> tuple[float, float]:
        samples = timing.measure_interleaved({"x": lambda _: fn()}, clock, policy)["x"]
        if samples.error is not None:
            raise samples.error
        # The ceiling is what the device *can* do: use the fastest repetition, and report the
        # median beside it.
        return work / min(samples.samples_s), work / stats.median(samples.samples_s)

    out: dict[str, Any] = {"device": str(device), "device_label": device_label(device), "quick": quick}
    # A GPU's matmul peak needs a large problem even in a quick calibration: at n = 4096 an H200
    # reaches well under it, which inflates every "% of peak" (and can trip the roofline's
    # above-ceiling rule). The n used is recorded with the figure.
    n = MATMUL_N_GPU if on_gpu else (1024 if quick else 2048)
    dtype = torch.bfloat16 if on_gpu else torch.float32
    a, b = _randn((n, n), dtype, device), _randn((n, n), dtype, device)
    c = torch.empty((n, n), dtype=dtype, device=device)
    peak, typical = best_rate(lambda: torch.matmul(a, b, out=c), 2.0 * n**3)  # noqa: F821 - runs before the del
    out["matmul"] = {
        "dtype": str(dtype).replace("torch.", ""),
        "n": n,
        "peak_tflops": peak / 1e12,
        "median_tflops": typical / 1e12,
    }
    del a, b, c

    nbytes = (1 << 30 if not quick else 256 << 20) if on_gpu else (64 << 20)
    src = _randn((nbytes // 4,), torch.float32, device)
    dst = torch.empty_like(src)
    peak, typical = best_rate(lambda: dst.copy_(src), 2.0 * nbytes)  # noqa: F821 - runs before the del
    out["copy"] = {
        "bytes": nbytes,
        "peak_gbps": peak / 1e9,
        "median_gbps": typical / 1e9,
        "counts": "bytes read + bytes written",
    }
    del src, dst
    if on_gpu:  # GPU-only (docs/cuda-paths.md): pinned memory and real copies; the GPU session calibrates
        host = _randn((nbytes // 4,), torch.float32, torch.device("cpu")).pin_memory()
        dev = torch.empty(host.shape, dtype=host.dtype, device=device)
        peak, typical = best_rate(lambda: dev.copy_(host, non_blocking=True), float(nbytes))
        out["h2d"] = {"bytes": nbytes, "peak_gbps": peak / 1e9, "median_gbps": typical / 1e9, "pinned": True}
        peak, typical = best_rate(lambda: host.copy_(dev, non_blocking=True), float(nbytes))
        out["d2h"] = {"bytes": nbytes, "peak_gbps": peak / 1e9, "median_gbps": typical / 1e9, "pinned": True}
        del host, dev
        torch.cuda.empty_cache()
    out["harness_overhead_us"] = timing.harness_overhead_s(device) * 1e6
    out["load"] = calibration_load(load_before, machine_load.read())
    return out


def calibration_load(before: machine_load.Load | None, after: machine_load.Load | None) -> dict[str, Any] | None:
    """The load a calibration ran under: the 1-minute average before and after it, the logical
    CPUs, and ``load_1m``, the higher of the two (what the roofline reads)."""
    loads = [x for x in (before, after) if x is not None]
    if not loads:
        return None
    return {
        "load_1m": round(max(x.load_1m for x in loads), 2),
        "cpus": loads[-1].cpus,
        "load_1m_before": round(before.load_1m, 2) if before is not None else None,
        "load_1m_after": round(after.load_1m, 2) if after is not None else None,
    }


def run_ceilings(device: torch.device) -> dict[str, Any]:
    """The quick calibration a run starts with, or ``{"error": ...}``: a failed calibration costs
    the metrics their % of peak, nothing else."""
    try:
        return calibrate(device, quick=True)
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {exc}"}
