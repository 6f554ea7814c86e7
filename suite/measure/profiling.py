"""Profiles: *why* a variant is faster. After a case is timed (and its energy measured), each
variant that ran makes a few more calls under ``torch.profiler`` (CPU activity, and CUDA activity
on a GPU; memory on, shapes off); the Chrome trace is saved gzipped (Perfetto and chrome://tracing
open ``.json.gz``) and a summary goes into the variant's record: top ops by self time, ops, kernel
launches, host-device synchronizations and copies per call, peak memory. Nothing here runs during
the timed repetitions. Also the NVTX ranges (``nsys``) the runner puts around cases, variants and
repetitions on CUDA.

What is counted, per call (each call is bracketed by a ``gpubench::profile_call#i`` range; the
reset before it and the device drain after it are outside that range):

- ops: outermost ``aten::`` ops (an op called inside another is part of it), the backward's included;
- kernel launches (GPU): CUDA runtime/driver launch calls (:data:`LAUNCH_CALLS`). A CPU has none: null;
- syncs: on a GPU the runtime calls that make the host wait (:data:`SYNC_CALLS`); ``sync_ops`` names
  the op each came from. On a CPU nothing waits, so the ops that *would* wait on a GPU are counted
  (:data:`WOULD_SYNC_OPS`, the outermost one of a nest) plus ``Tensor.tolist()`` (no aten op on a
  CPU; marked here with a ``gpubench::host_read`` range); reads that are no device sync on a GPU
  either (:data:`HOST_ONLY_READS`: one_hot's CPU-only checks, the CPU grouped GEMM's offsets, the
  optimizer's host-side step counters) are left out;
- copies (GPU): the device's memcpy records of the trace, by direction, with their bytes. On a CPU
  every copy is host to host and the profiler records no sizes without ``record_shapes`` (which
  slows every op): ``aten::copy_`` calls are counted, bytes null;
- peak memory: the most allocated during the calls above what was allocated before them (CUDA's
  allocator on a GPU; on a CPU the running sum of the trace's allocation records within a call).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import re
import shutil
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpubench.records.results import Profile, TopOp

PROFILES_DIR = "profiles"
TOP_OPS = 8
CALL_RANGE = "gpubench::profile_call#"
DRAIN_RANGE = "gpubench::drain"
HOST_READ_RANGE = "gpubench::host_read"
OUR_RANGES = (CALL_RANGE, DRAIN_RANGE, HOST_READ_RANGE)  # the ranges this module puts around calls and reads
LAUNCH_CALLS = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cudaLaunchCooperativeKernel",
        "cudaLaunchCooperativeKernelMultiDevice",
        "cudaGraphLaunch",
        "hipLaunchKernel",
        "hipExtLaunchKernel",
        "hipModuleLaunchKernel",
    }
)
SYNC_CALLS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaMemcpy",
        "cudaMemcpy2D",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "hipStreamSynchronize",
        "hipDeviceSynchronize",
        "hipMemcpy",
    }
)
EVENT_WAIT_CALLS = frozenset({"cudaEventSynchronize", "cuEventSynchronize", "hipEventSynchronize"})
# aten ops that read a device value on the host (a sync on CUDA): a scalar, or an output size
# that depends on the data.
WOULD_SYNC_OPS = frozenset(
    {
        "aten::_local_scalar_dense",
        "aten::nonzero",
        "aten::masked_select",
        "aten::bincount",
        "aten::_unique2",
        "aten::unique_consecutive",
        "aten::unique_dim",
        "aten::equal",
    }
)
# Host reads a CPU run makes that are no device sync on a GPU, by the range they happen in (prefix).
HOST_ONLY_READS = {
    "aten::one_hot": "its value checks (CUDA skips them to avoid a sync)",
    "aten::_grouped_mm": "torch's CPU grouped GEMM loops over the offsets on the host (CUDA's reads them on the device)",
    "Optimizer.step#": "the optimizer's step counters (host tensors unless capturable)",
}
COPY_DIRECTIONS = {"HtoD": "h2d", "DtoH": "d2h", "DtoD": "d2d", "HtoH": "h2h", "PtoP": "d2d"}


# -- NVTX ------------------------------------------------------------------------------------


def nvtx_enabled(device: torch.device) -> bool:
    """NVTX ranges are pushed on CUDA devices only (elsewhere they would be no-ops anyway)."""
    return device.type == "cuda"


@contextlib.contextmanager
def nvtx_range(name: str, device: torch.device) -> Iterator[None]:
    """An NVTX range (``nsys`` shows it on the timeline); nothing on a CPU. A push costs about a
    microsecond of host time: the runner keeps it outside the timed region."""
    if not nvtx_enabled(device):
        yield
        return
    torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        torch.cuda.nvtx.range_pop()


# -- where the traces go ---------------------------------------------------------------------


def safe_name(case_id: str, limit: int = 120) -> str:
    """A case id as one file or directory name: characters other than letters, digits and
    ``._,=+-`` become ``_``; a long id is cut and a hash of the whole id keeps it unique."""
    safe = re.sub(r"[^A-Za-z0-9._,=+-]+", "_", case_id).strip("._") or "case"
    if len(safe) > limit:
        safe = safe[:limit] + "-" + hashlib.sha1(case_id.encode()).hexdigest()[:10]
    return safe


def trace_relpath(case_id: str, variant: str) -> str:
    """Where a variant's trace lies, relative to the run directory."""
    return f"{PROFILES_DIR}/{safe_name(case_id)}/{safe_name(variant)}.json.gz"


def load_trace(path: str | Path) -> dict[str, Any]:
    """A saved trace (gzipped Chrome trace JSON)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


# -- profiling one variant -------------------------------------------------------------------


class _HostReads(torch.overrides.TorchFunctionMode):
    """Marks ``Tensor.tolist()`` with a profiler range: on a CPU it calls no aten op, so the
    profiler would not see the host read it is on a GPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.tolist:
            with torch.profiler.record_function(f"{HOST_READ_RANGE}(tolist)"):
                return func(*args, **kwargs)
        return func(*args, **kwargs)


def profile_variant(
    call: Callable[[], Any],
    device: torch.device,
    calls: int,
    run_dir: Path | str,
    case_id: str,
    variant: str,
    reset: Callable[[], None] | None = None,
) -> Profile:
    """Profile ``call`` (one warm-up call, then ``calls`` calls under the profiler), save its trace
    under ``run_dir`` and return the summary. Never raises an ``Exception``: a failure is
    returned as a :class:`Profile` holding its ``error`` alone."""
    rel = trace_relpath(case_id, variant)
    try:
        return _profile(call, device, calls, Path(run_dir), rel, reset)
    except Exception as exc:  # noqa: BLE001 - a failed profile never fails the case
        traceback.clear_frames(exc.__traceback__)
        return Profile.failed(f"{type(exc).__name__}: {exc}")


def _drain(device: torch.device) -> None:
    if device.type == "cuda":  # GPU-only (docs/cuda-paths.md): CUDA's profiler activity needs a GPU
        torch.cuda.synchronize(device)


def _profile(
    call: Callable[[], Any], device: torch.device, calls: int, run_dir: Path, rel: str, reset: Callable[[], None] | None
) -> Profile:
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if reset is not None:
        reset()
    call()  # warm-up: lazy initialization stays out of the profile
    _drain(device)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    host_reads = contextlib.nullcontext() if cuda else _HostReads()
    with profile(activities=activities, record_shapes=False, profile_memory=True, with_stack=False) as prof:
        for i in range(calls):
            if reset is not None:
                reset()
            _drain(device)
            with record_function(f"{CALL_RANGE}{i}"), host_reads:
                call()
            with record_function(DRAIN_RANGE):
                _drain(device)
    peak = torch.cuda.max_memory_allocated(device) - before if cuda else None
    path = run_dir / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = path.with_name(path.name[: -len(".gz")] + f".{os.getpid()}.tmp")
    try:
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(path, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        trace = json.loads(raw.read_text(encoding="utf-8"))
    finally:
        raw.unlink(missing_ok=True)
    summary = summarize(prof.events(), calls, cuda, trace)
    if cuda:
        summary.peak_memory_bytes = peak
        summary.peak_memory_basis = "torch.cuda.max_memory_allocated over the calls, above what was allocated before"
    summary.trace = rel
    return summary


# -- reading the events ----------------------------------------------------------------------


def _windows(events: list[Any]) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """The calls' time ranges (host side) and each call through its drain (device side), in us."""
    calls = sorted((e.time_range.start, e.time_range.end) for e in events if e.name.startswith(CALL_RANGE))
    drains = sorted((e.time_range.start, e.time_range.end) for e in events if e.name == DRAIN_RANGE)
    device = [(start, next((d_end for d_start, d_end in drains if d_start >= end), end)) for start, end in calls]
    return calls, device


def _inside(t: float, windows: list[tuple[float, float]]) -> bool:
    return any(start <= t <= end for start, end in windows)


def _in_call(event: Any, windows: list[tuple[float, float]]) -> bool:
    """A host event of a profiled call: under a call range; else (the backward's thread, runtime
    calls the profiler links to no range) wholly inside a call's time range, since the runtime's
    clock is not exactly the ranges' and the drain's wait begins right after a call ends."""
    for parent in _ancestors(event):
        if parent.name.startswith(CALL_RANGE):
            return True
        if parent.name == DRAIN_RANGE:
            return False
    return any(start <= event.time_range.start and event.time_range.end <= end for start, end in windows)


def _ancestors(event: Any) -> Iterator[Any]:
    parent = event.cpu_parent
    while parent is not None:
        yield parent
        parent = parent.cpu_parent


def _is_device(event: Any) -> bool:
    return getattr(event.device_type, "name", str(event.device_type)).upper() in ("CUDA", "PRIVATEUSE1", "HIP", "XPU")


def _per_call(total: float, calls: int) -> float | int:
    value = total / calls
    return int(value) if float(value).is_integer() else round(value, 3)


def summarize(events: list[Any], calls: int, cuda: bool, trace: dict[str, Any] | None = None) -> Profile:
    """The per-call summary of a profile's events (see the module docstring)."""
    events = list(events)
    host_windows, device_windows = _windows(events)
    host = [
        e
        for e in events
        if not _is_device(e)
        and e.name != "[memory]"
        and not e.name.startswith(OUR_RANGES)
        and _in_call(e, host_windows)
    ]
    notes: list[str] = []
    top = _top_ops(events, host, device_windows, calls, cuda)
    aten = [e for e in host if e.name.startswith("aten::")]
    outermost = [e for e in aten if not any(p.name.startswith("aten::") for p in _ancestors(e))]
    if cuda:
        syncs = _gpu_syncs(host, calls)
    else:
        notes.append("no kernel launches on a CPU")
        syncs = _cpu_syncs(events, host_windows, calls, notes)

    summary = Profile(
        calls=calls,
        time_basis="device" if cuda else "cpu",
        top_ops=top,
        ops_per_call=_per_call(len(outermost), calls),
        kernel_launches_per_call=syncs.launches,
        syncs_per_call=_per_call(sum(syncs.ops.values()), calls),
        sync_ops={name: _per_call(n, calls) for name, n in sorted(syncs.ops.items())},
        sync_counting=syncs.counting,
        event_waits_per_call=None if syncs.waits is None else _per_call(syncs.waits, calls),
        copies_per_call=_gpu_copies(trace, calls) if cuda else _cpu_copies(outermost, calls),
        peak_memory_bytes=None if cuda else _cpu_peak(trace),
        peak_memory_basis=None
        if cuda
        else "the trace's CPU allocation records during each call, above what was allocated when it began",
        notes=notes,
    )
    if not cuda:
        notes.append("copies on a CPU are host to host: aten::copy_ calls counted, bytes not recorded")
    return summary


def _top_ops(
    events: list[Any], host: list[Any], device_windows: list[tuple[float, float]], calls: int, cuda: bool
) -> list[TopOp]:
    """The :data:`TOP_OPS` ops of the most self time per call: the device time of kernels inside the
    calls' device windows on a GPU, the self CPU time of the calls' host events on a CPU."""
    self_us: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    if cuda:
        for e in events:
            if _is_device(e) and not e.name.startswith(OUR_RANGES) and _inside(e.time_range.start, device_windows):
                self_us[e.name] += e.time_range.elapsed_us()
                counts[e.name] += 1
    else:
        for e in host:
            self_us[e.name] += e.self_cpu_time_total
            counts[e.name] += 1
    total_us = sum(self_us.values()) or 1.0
    return [
        TopOp(name, round(us / calls, 3), round(us / total_us, 4), _per_call(counts[name], calls))
        for name, us in self_us.most_common(TOP_OPS)
    ]


@dataclass
class _Syncs:
    """What a profile counted of launches and waits: kernel launches per call (None on a CPU), the
    syncs by the op that made them, event waits (None on a CPU), and how they were counted."""

    launches: float | int | None
    ops: Counter[str]
    waits: int | None
    counting: str


def _gpu_syncs(host: list[Any], calls: int) -> _Syncs:
    """On a GPU: launch calls, the runtime calls that made the host wait (each under the op that
    made it), and event synchronizations counted apart."""
    launches = _per_call(sum(e.name in LAUNCH_CALLS for e in host), calls)
    sync_ops: Counter[str] = Counter()
    waits = 0
    for e in host:
        if e.name in EVENT_WAIT_CALLS:
            waits += 1
        elif e.name in SYNC_CALLS:
            op = next((p.name for p in _ancestors(e) if p.name.startswith("aten::")), None)
            sync_ops[f"{op} ({e.name})" if op else e.name] += 1
    counting = (
        "host waits made by the CUDA runtime: "
        + ", ".join(sorted(SYNC_CALLS & {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy"}))
        + " (each under the op that made it); "
        "cudaEventSynchronize counted apart (event_waits_per_call)"
    )
    return _Syncs(launches, sync_ops, waits, counting)


def _cpu_syncs(events: list[Any], host_windows: list[tuple[float, float]], calls: int, notes: list[str]) -> _Syncs:
    """On a CPU, where nothing waits: the ops that would sync on a GPU (the outermost of a nest) and
    ``Tensor.tolist()``; host reads that are no sync on a GPU either get a line in ``notes``."""
    sync_ops: Counter[str] = Counter()
    host_only: Counter[str] = Counter()
    for e in events:  # tolist's range is one of ours, not among the host ops
        read = e.name in WOULD_SYNC_OPS or e.name.startswith(HOST_READ_RANGE)
        if not read or _is_device(e) or not _in_call(e, host_windows):
            continue
        chain = [p.name for p in _ancestors(e)]
        if any(name in WOULD_SYNC_OPS for name in chain):
            continue  # counted at the outermost op of the nest
        where = next((prefix for prefix in HOST_ONLY_READS for name in chain if name.startswith(prefix)), None)
        if where is not None:
            host_only[where] += 1
        else:
            sync_ops["Tensor.tolist" if e.name.startswith(HOST_READ_RANGE) else e.name] += 1
    counting = (
        "a CPU does not wait: counted are the ops that would sync on a GPU ("
        + ", ".join(sorted(WOULD_SYNC_OPS))
        + ", the outermost of a nest) and Tensor.tolist()"
    )
    for prefix, n in sorted(host_only.items()):
        notes.append(
            f"{_per_call(n, calls)} host read(s) per call inside {prefix} not counted as syncs: "
            f"{HOST_ONLY_READS[prefix]}"
        )
    return _Syncs(None, sync_ops, None, counting)


def _cpu_copies(outermost: list[Any], calls: int) -> dict[str, Any]:
    n = sum(e.name in ("aten::copy_", "aten::to", "aten::_to_copy") for e in outermost)
    return {"h2h": {"count": _per_call(n, calls), "bytes": None}}


def _trace_windows(items: list[dict[str, Any]], through_drain: bool) -> list[tuple[float, float]]:
    """The calls' windows in the trace's own clock: each call, or each call through its drain."""
    calls = sorted(
        (e["ts"], e["ts"] + e.get("dur", 0))
        for e in items
        if str(e.get("name", "")).startswith(CALL_RANGE) and "ts" in e
    )
    if not through_drain:
        return calls
    drain_ends = sorted(e["ts"] + e.get("dur", 0) for e in items if e.get("name") == DRAIN_RANGE and "ts" in e)
    return [(start, next((d for d in drain_ends if d >= end), end)) for start, end in calls]


def _gpu_copies(trace: dict[str, Any] | None, calls: int) -> dict[str, Any]:
    """Device memcpy records of the trace inside the calls' windows, by direction, with bytes."""
    items = (trace or {}).get("traceEvents", [])
    windows = _trace_windows(items, through_drain=True)
    totals: dict[str, list[float]] = {}
    for e in items:
        if e.get("cat") != "gpu_memcpy" or not _inside(e.get("ts", -1), windows):
            continue
        match = re.search(r"\b(HtoD|DtoH|DtoD|HtoH|PtoP)\b", str(e.get("name", "")))
        direction = COPY_DIRECTIONS.get(match.group(1), "other") if match else "other"
        count_bytes = totals.setdefault(direction, [0, 0])
        count_bytes[0] += 1
        count_bytes[1] += (e.get("args") or {}).get("bytes", 0)
    return {d: {"count": _per_call(c, calls), "bytes": _per_call(b, calls)} for d, (c, b) in sorted(totals.items())}


def _cpu_peak(trace: dict[str, Any] | None) -> int | None:
    """The most CPU memory allocated at once inside a call, above what was allocated when it
    began: the running sum of the trace's allocation records (``[memory]``, device type 0)."""
    items = (trace or {}).get("traceEvents", [])
    memory = sorted(
        (e["ts"], (e.get("args") or {}).get("Bytes", 0))
        for e in items
        if e.get("name") == "[memory]" and (e.get("args") or {}).get("Device Type") == 0
    )
    if not memory:
        return None
    peak = 0
    for start, end in _trace_windows(items, through_drain=False):
        level = 0
        for t, delta in memory:
            if start <= t <= end:
                level += delta
                peak = max(peak, level)
    return int(peak)
