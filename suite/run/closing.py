"""The run's record beyond its cases: the devices it used (described at the start, so the first
results.json says where the run is, and again at the close), the warnings a reader must see (other
processes on the GPU, a capped GPU memory), telemetry per case, the case times kept for later
estimates, and the final writes (results.json, results.csv, telemetry.csv), which keep what still
fits when the disk is full.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import pandas as pd

from gpubench.measure.devicecache import CaseTimes
from gpubench.measure.telemetry import SAMPLE_COLUMNS
from gpubench.records import results
from gpubench.records.atomic import DiskFull
from gpubench.records.results import CaseRecord, RunRecord
from gpubench.run.executor import DeviceState
from gpubench.run.scenario import Case


def describe_devices(
    run: RunRecord, states: Sequence[DeviceState], processes: dict[str, Any], clocks: dict[str, Any] | None
) -> None:
    """The devices the run uses, its label and environment (the first device's), the other
    processes each GPU had when the run started (a warning when any did) and the locked clocks."""
    if not states:
        return
    for state in states:
        state.processes = processes.get(state.info.key.split("#")[0])
    labels = list(dict.fromkeys(s.info.label for s in states))
    run.device_label = labels[0] if len(labels) == 1 else " + ".join(labels)
    run.env = dict(states[0].env)
    run.ceilings = states[0].ceilings
    run.devices = {s.info.key: s.to_dict() for s in states}
    busy = {
        k: d["other_processes"]
        for k, d in run.devices.items()
        if isinstance(d["other_processes"], list) and d["other_processes"]
    }
    run.env["gpu_processes"] = {k: d["other_processes"] for k, d in run.devices.items()}
    run.warnings = []
    if busy:
        run.warnings.append(
            "other processes used the GPU when the run started ("
            + "; ".join(
                f"{k}: " + ", ".join(f"{p['name']} (pid {p['pid']})" for p in procs) for k, procs in busy.items()
            )
            + "): they shared the device with the measurements."
        )
    if clocks is not None:
        run.env["locked_clocks"] = clocks
        run.clocks = clocks


def memory_cap_warning(run: RunRecord, cases: Sequence[Case]) -> str | None:
    """What a reader must know of a run whose cases capped the GPU's memory (policy
    gpu_memory_gib): the memory was a smaller card's, approximately; the compute and bandwidth were
    not."""
    from gpubench.records.policy import memory_cap_note
    from gpubench.run.runner import CARD_RESERVED_GIB, CUDA_CONTEXT_GIB, allocator_cap_bytes

    caps = sorted({c.policy.gpu_memory_gib for c in cases if c.policy.gpu_memory_gib > 0})
    if not caps:
        return None
    types = [d.get("type") for d in run.devices.values()]
    total = (run.env.get("gpu") or {}).get("total_memory_bytes")
    label = run.device_label or "the GPU"
    if "cuda" not in types:  # a CPU run: the cap did nothing, and the reader is told so
        return memory_cap_note(caps, next((t for t in types if t), "cpu"))
    note = memory_cap_note(caps, "cuda", total, label)  # caps above the card: nothing capped
    caps = [c for c in caps if not total or c * 2**30 <= total]
    if not caps:
        return note
    of = f" of its {total / 2**30:.0f} GiB" if total else ""
    held = " / ".join(f"{min(allocator_cap_bytes(c), total or 2**62) / 2**30:.1f}" for c in caps)
    return (
        f"GPU memory capped as on a {' / '.join(f'{c:g}' for c in caps)} GiB card (policy gpu_memory_gib): "
        f"torch's caching allocator may hold about {held} GiB{of} (through "
        f"torch.cuda.set_per_process_memory_fraction; the card's size less ~{CARD_RESERVED_GIB:g} GiB such a "
        f"card keeps from a process and ~{CUDA_CONTEXT_GIB:g} GiB for its CUDA context). The cap is "
        f"approximate: it covers the caching allocator only, not the CUDA context or libraries that "
        f"allocate for themselves. Allocations past it fail as on the smaller card, but compute, memory "
        f"bandwidth and caches are still the {label}'s, so times are not a smaller card's."
        + (f" {note}" if note else "")
    )


def attach_telemetry(run: RunRecord, states: Sequence[DeviceState]) -> None:
    """The run's telemetry summary (per device when there are several) and each case's, from the
    sampler of the device it ran on."""
    samplers = {s.info.key: s.sampler for s in states if s.sampler is not None}
    if not samplers:
        return
    first = next(iter(samplers.values()))
    run.telemetry = results.RunTelemetry.from_dict(first.run_summary())
    if len(samplers) > 1:
        run.telemetry.devices = {key: results.RunTelemetry.from_dict(s.run_summary()) for key, s in samplers.items()}
    for record in run.cases:
        key = record.device.key if record.device is not None else None
        sampler = samplers.get(key) if isinstance(key, str) else None
        record.telemetry = sampler.case_summary(record.id) if sampler is not None and sampler.available else None


def remember_case_times(run: RunRecord) -> None:
    """Add the run's case times to this device model's history (``--dry-run`` estimates from it).
    A cache: a home directory that cannot be written costs the next estimate, not this run."""
    if not run.device_label or run.time_use is None or not run.cases:
        return
    try:
        CaseTimes(run.device_label).record(run.cases, run.repeat_scale, run.time_use.wall_s, run.time_use.workers)
    except OSError as exc:
        run.warnings.append(f"the case times could not be kept for later estimates ({exc})")


def write_run(
    run_dir: results.RunDirectory, run: RunRecord, records: dict[int, CaseRecord], states: Sequence[DeviceState]
) -> None:
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
    full = run_dir.full
    run.disk_full = f"{full.filename}: {full.strerror}" if full is not None else "the disk filled"
    run_dir.close_on_full_disk(run, records)
    for write in (lambda: run_dir.write_cases_csv(run), lambda: _write_telemetry(run_dir, states)):
        with contextlib.suppress(DiskFull):
            write()


def _write_telemetry(run_dir: results.RunDirectory, states: Sequence[DeviceState]) -> None:
    frames = [s.sampler.to_dataframe().assign(device=s.info.key) for s in states if s.sampler is not None]
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*SAMPLE_COLUMNS, "device"])
    run_dir.write_text("telemetry.csv", frame.to_csv(index=False))
