"""One case, measured: build the workload once (seeded), run every variant once and check its
output against the reference, time the variants interleaved, derive metrics, and (where NVML has
an energy counter) measure energy per call. A worker process (or the supervisor itself, with
``--isolation none``) calls :func:`run_case` for each case it is given.

A case that raises, runs out of memory or passes its time limit is recorded as failed with the
reason; the run goes on. The time limit here is SIGALRM on the main thread: it stops Python code
and any native call that returns, keeping what was measured; a native call that never returns is
the supervisor's to stop, by killing the worker process (:mod:`gpubench.supervisor`).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import gc
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import torch

from gpubench import energy, profiling, stats, techniques, timing
from gpubench.contract import ROLES, CheckResult, Measured, Recorder, Technique, Variant, Workload
from gpubench.results import CaseRecord, Failure, RunRecord, VariantRecord
from gpubench.scenario import Case, Scenario
from gpubench.telemetry import TelemetrySampler

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_TERMINATED = 143  # SIGTERM (128 + 15), as a shell reports a process it killed
EXIT_DISK_FULL = 74  # sysexits' EX_IOERR: a file of the run could not be written, the disk being full


class CaseTimeout(BaseException):
    """Raised inside a case that passed its time limit. A BaseException so that a technique's
    own ``except Exception`` cannot swallow it."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    if seconds <= 0 or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum, frame):
        raise CaseTimeout(f"exceeded its time limit of {seconds:g} s (policy.case_timeout_s)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _is_oom(exc: BaseException) -> bool:
    oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                  getattr(torch.cuda, "OutOfMemoryError", None), MemoryError) if t)
    text = str(exc).lower()
    return isinstance(exc, oom_types) or "out of memory" in text or "can't allocate memory" in text


def _free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def describe(exc: BaseException) -> Failure:
    """A failure record: kind (oom, timeout, exception), message and traceback. The frames'
    locals are released (see :func:`timing.release_frames`)."""
    if isinstance(exc, CaseTimeout):
        kind = "timeout"
    elif _is_oom(exc):
        kind = "oom"
    else:
        kind = "exception"
    failure = Failure(kind, f"{type(exc).__name__}: {exc}",
                      "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:])
    timing.release_frames(exc)
    return failure


def cuda_context_broken(device: torch.device) -> str | None:
    """After a failure on a GPU: None if the CUDA context still works, else the error. Errors
    such as an illegal memory access are sticky: every later call would fail the same way."""
    if device.type != "cuda":
        return None
    try:
        torch.cuda.synchronize(device)
        torch.empty(1, device=device).add_(1)
        torch.cuda.synchronize(device)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    return None


class ProgressListener(Protocol):
    """What a run tells its caller as it goes. ``note`` (optional: a listener without it has notices
    printed to stderr) is what a case says while it runs (:mod:`gpubench.notices`)."""

    def run_started(self, total: int) -> None: ...
    def case_started(self, index: int, case: Case) -> None: ...
    def case_finished(self, index: int, case: Case, record: CaseRecord) -> None: ...
    def run_finished(self) -> None: ...


class Silent:
    def run_started(self, total: int) -> None: pass
    def case_started(self, index: int, case: Case) -> None: pass
    def case_finished(self, index: int, case: Case, record: CaseRecord) -> None: pass
    def note(self, text: str) -> None: pass
    def run_finished(self) -> None: pass


@dataclass
class RunOutcome:
    run_dir: Path
    record: RunRecord

    @property
    def doc(self) -> dict[str, Any]:
        """The run as results.json holds it."""
        return self.record.to_dict()

    @property
    def exit_code(self) -> int:
        if self.record.disk_full:
            return EXIT_DISK_FULL
        if self.record.status == "interrupted":
            return EXIT_TERMINATED if self.record.signal == "SIGTERM" else EXIT_INTERRUPTED
        if self.record.status != "complete":  # aborted or crashed: not every case ran
            return EXIT_FAILED
        return EXIT_OK if self.record.summary["failed"] == 0 else EXIT_FAILED


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def run_scenario(scenario: Scenario, device: torch.device, out_root: Path | str = "runs", *,
                 only: list[str] | None = None, repeat_scale: float = 1.0,
                 progress: ProgressListener | None = None, telemetry_interval_s: float = 0.05,
                 calibrate: bool = True) -> RunOutcome:
    """Every case in this process, on ``device`` (``--isolation none``); see
    :func:`gpubench.supervisor.run_scenario` for worker processes."""
    from gpubench import supervisor

    options = supervisor.RunOptions(devices=[str(device)], isolation="none")
    return supervisor.run_scenario(scenario, options, out_root, only=only, repeat_scale=repeat_scale,
                                   progress=progress, telemetry_interval_s=telemetry_interval_s,
                                   calibrate=calibrate)


def unloadable(case: Case, source: str) -> CaseRecord:
    """The record of a case whose technique could not be loaded where it was to run."""
    record = new_record(case)
    record.status = "failed"
    record.failure = Failure("exception", f"technique {case.technique} could not be loaded here from {source!r}")
    return record


def new_record(case: Case) -> CaseRecord:
    tech = techniques.get(case.technique)
    return CaseRecord(id=case.id, technique=case.technique, params=case.params, seed=case.seed,
                      policy=case.policy.to_dict(), source=tech.source if tech is not None else "",
                      headline=tech.headline if tech is not None else "",
                      gate_metric=tech.gate_metric if tech is not None else "", started_at=_now())


class CaseInterrupted(KeyboardInterrupt):
    """Ctrl-C inside a case; carries what the case measured before it (marked interrupted)."""

    def __init__(self, record: CaseRecord):
        super().__init__("stopped by Ctrl-C")
        self.record = record


_memory_capped: set[str] = set()  # the CUDA devices this process has capped (policy.gpu_memory_gib)


def cap_gpu_memory(device: torch.device, gib: float) -> float | None:
    """Let this process allocate at most ``gib`` GiB on ``device`` (0: lift a cap set before);
    the fraction of the device's memory that is, or None for no cap."""
    key = str(device)
    if gib <= 0:
        if key in _memory_capped:
            torch.cuda.set_per_process_memory_fraction(1.0, device)
            _memory_capped.discard(key)
        return None
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = min(1.0, gib * 2**30 / total)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    _memory_capped.add(key)
    return fraction


def run_case(case: Case, device: torch.device, clock: timing.Clock, sampler: TelemetrySampler,
             ceilings: dict[str, Any] | None, run_dir: Path | str | None = None) -> CaseRecord:
    """Measure one case. Never raises, except :class:`CaseInterrupted` on Ctrl-C (with the
    partial record). ``run_dir``: where profiles are written (``policy.profile``); without it,
    nothing is profiled."""
    tech = techniques.get(case.technique)
    assert tech is not None
    record = new_record(case)
    t0 = time.perf_counter()
    if device.type == "cuda":
        cap_gpu_memory(device, case.policy.gpu_memory_gib)
    timings: dict[str, timing.VariantTiming] = {}
    phases = timing.PhaseTimer()
    interrupted = False
    try:
        with deadline(case.policy.case_timeout_s), profiling.nvtx_range(case.id, device):
            _measure_case(tech, case, device, clock, sampler, ceilings, record, timings, run_dir, phases)
    except KeyboardInterrupt:
        record.status = "interrupted"
        record.failure = Failure("interrupted", "stopped by Ctrl-C")
        interrupted = True
    except BaseException as exc:  # noqa: BLE001 - a failing case never takes the run down
        record.failure = describe(exc)
    finally:
        sampler.set_tag(None, None)
        phases.enter("stats")
        # Whatever was measured before a failure is kept.
        for name, t in timings.items():
            vrec = record.variants[name]
            if len(vrec.samples_s) != t.n:
                _store_samples(vrec, t)
        _store_speedups(record)
        record.elapsed_s = time.perf_counter() - t0
        record.phases_s = phase_seconds(phases.stop(), record.elapsed_s, timings)
        if record.status == "running":
            record.status = _case_status(record)
    # Outside the except block, so the failed call's frames (and tensors) are gone by now.
    if device.type == "cuda" or record.failure is not None:
        _free_memory(device)
    if interrupted:
        raise CaseInterrupted(record)
    return record


def _measure_case(tech: Technique, case: Case, device: torch.device, clock: timing.Clock,
                  sampler: TelemetrySampler, ceilings: dict[str, Any] | None, record: CaseRecord,
                  timings: dict[str, timing.VariantTiming], run_dir: Path | str | None = None,
                  phases: timing.PhaseTimer | None = None) -> None:
    phases = phases or timing.PhaseTimer()
    cast = tech.cast(device)
    wanted = tech.resolve(case.variants, device) if case.variants is not None else list(tech.variants)
    names = sorted(wanted, key=lambda n: ROLES.index(cast[n][0]))
    for name in names:
        role, reason = cast[name]
        record.variants[name] = VariantRecord(role=role, description=tech.variants[name].description)
        if reason:
            record.variants[name].status, record.variants[name].reason = "skipped", reason
        elif (note := tech.variants[name].checked_only_reason(device)) is not None:  # checked, never timed
            record.variants[name].reason, record.variants[name].timing = note, {"method": "none", "not_timed": note}
    runnable = [tech.variants[n] for n in names if record.variants[n].status != "skipped"]

    sampler.set_tag(case.id, "build")
    phases.enter("build")
    workload = tech.build_fn(case.params, device, case.seed)
    phases.enter("check")

    # 1. One checked call per variant (also the first warm-up call).
    outputs: dict[str, Any] = {}
    for v in runnable:
        vrec = record.variants[v.name]
        sampler.set_tag(case.id, v.name)
        try:
            with profiling.nvtx_range(f"{case.id}/{v.name}", device):
                outputs[v.name], vrec.peak_memory_bytes = _call_once(v, workload, device)
            vrec.status = "ok"
        except Exception as exc:  # noqa: BLE001 - recorded per variant
            failure = describe(exc)
            vrec.fail("error", failure)
            if failure.kind == "oom":
                _free_memory(device)

    base = record.role_variant("baseline")
    if tech.reference_fn is not None:
        sampler.set_tag(case.id, "reference")
        reference = tech.reference_fn(workload)
        to_check = list(outputs)
    elif base in outputs:
        reference = outputs[base]
        to_check = [n for n in outputs if n != base]
        record.variants[base].check = {"passed": True, "error": 0.0, "tolerance": None,
                                       "metric": "reference", "detail": "the baseline is the reference"}
    else:
        reference, to_check = None, []
        for name in outputs:  # ran, but nothing to compare with
            record.variants[name].status = "unchecked"
            record.variants[name].reason = f"no reference: baseline {base} did not run"
    for name in to_check:
        try:
            result = tech.check_fn(reference, outputs[name])
        except Exception as exc:  # noqa: BLE001 - a check that cannot compare is a failed check
            result = CheckResult(False, None, None, "error", f"check raised {describe(exc).message}")
        record.variants[name].check = result.to_dict()
        if not result.passed:
            record.variants[name].status = "check_failed"
    del reference

    # 2. Timing, interleaved, of every variant that ran (a wrong result is still timed, and the
    #    case is failed by its check).
    calls = {n: functools.partial(tech.variants[n].call, workload) for n in outputs
             if record.variants[n].timing is None}
    timing.measure_interleaved(calls, clock, case.policy, reset=workload.reset,
                               on_switch=lambda n: sampler.set_tag(case.id, n), timings=timings, nvtx_case=case.id,
                               phases=phases)
    phases.enter("metrics")
    for name, t in timings.items():
        vrec = record.variants[name]
        vrec.timing = {"method": clock.method, "l2_flush": clock.flushes_l2, "cuda_graph": t.cuda_graph}
        if t.error is not None:
            vrec.fail("error", describe(t.error), "during timing: ")
        _store_samples(vrec, t)

    # 3. Metrics from the median time, what the timed calls recorded, and the checked call's output.
    for name, t in timings.items():
        vrec = record.variants[name]
        if not t.samples_s:
            continue
        measured = Measured(name, list(t.samples_s), stats.median(t.samples_s), outputs.get(name), device,
                            records=list(t.records))
        try:
            metrics = dict(tech.metrics_fn(workload, measured)) if tech.metrics_fn else {}
        except Exception as exc:  # noqa: BLE001 - the timing stands; the metric is marked broken
            metrics = {"metrics_error": describe(exc).message}
        vrec.metrics = derive_rates(metrics, measured.median_s, ceilings)
    outputs.clear()

    phases.enter("energy")
    # 4. Energy per call, where the GPU has an energy counter (not interleaved: the counter
    #    advances in steps, so each variant runs alone for several of them; gpubench.energy).
    if sampler.energy_mj() is not None and case.policy.energy_s > 0:
        for name, call in calls.items():
            vrec = record.variants[name]
            if vrec.status in ("ok", "check_failed"):
                sampler.set_tag(case.id, f"{name}:energy")
                try:
                    with profiling.nvtx_range(f"{case.id}/{name}", device):
                        vrec.energy = _energy_per_call(call, workload, device, sampler, case.policy.energy_s)
                    vrec.energy_mj_per_call, vrec.energy_error = vrec.energy.mj_per_call, vrec.energy.error
                except Exception as exc:  # noqa: BLE001 - the timing and check stand
                    vrec.energy_error = describe(exc).message

    phases.enter("profile")
    # 5. Profiles (policy.profile), last: after every timed and energy call, so they cannot touch
    #    the samples. A failed profile is recorded as {"error": ...} and fails nothing.
    if case.policy.profile and run_dir is not None:
        for name, call in calls.items():
            vrec = record.variants[name]
            if vrec.status in ("ok", "check_failed", "unchecked"):
                sampler.set_tag(case.id, f"{name}:profile")
                with profiling.nvtx_range(f"{case.id}/{name}", device):
                    vrec.profile = profiling.profile_variant(functools.partial(call, Recorder()), device,
                                                             case.policy.profile_calls, run_dir, case.id, name,
                                                             reset=workload.reset)


PHASES = ("build", "check", "warmup", "timing", "metrics", "energy", "profile", "stats")


def phase_seconds(laps: dict[str, float], elapsed_s: float, timings: dict[str, timing.VariantTiming]) -> dict[str, float]:
    """A case's phase laps in :data:`PHASES` order (0 for a phase it never reached), ``timed``
    (the timed calls' own samples, part of ``timing``) and ``other`` (elapsed less the phases)."""
    out = {name: laps.get(name, 0.0) for name in PHASES}
    out["timed"] = sum(sum(t.samples_s) for t in timings.values())
    out["other"] = max(0.0, elapsed_s - sum(out[name] for name in PHASES))
    return out


def _call_once(variant: Variant, workload: Workload, device: torch.device) -> tuple[Any, int | None]:
    if workload.reset is not None:
        workload.reset()
    if device.type == "cuda":
        timing.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        out = variant.call(workload)
        timing.synchronize(device)
        return out, torch.cuda.max_memory_allocated(device) - before
    return variant.call(workload), None


def _energy_per_call(call: Callable[[Recorder], Any], workload: Workload, device: torch.device,
                     sampler: TelemetrySampler, seconds: float) -> energy.EnergyMeasurement:
    def one_call() -> None:
        if workload.reset is not None:
            workload.reset()
        call(Recorder())

    limit = getattr(sampler, "power_limit_w", None)  # a probe without it: the figure is not checked
    return energy.measure_energy_per_call(one_call, sampler.energy_mj, time.perf_counter, min_window_s=seconds,
                                          power_limit_w=limit() if limit is not None else None,
                                          sync=lambda: timing.synchronize(device))


def derive_rates(metrics: dict[str, Any], median_s: float, ceilings: dict[str, Any] | None) -> dict[str, Any]:
    """Add TFLOP/s, GB/s and % of the measured device peak to a technique's ``flops`` and
    ``bytes_moved`` counts."""
    out = dict(metrics)
    matmul = (ceilings or {}).get("matmul", {})
    peak_flops = matmul.get("peak_tflops")
    peak_bw = (ceilings or {}).get("copy", {}).get("peak_gbps")
    if isinstance(out.get("flops"), (int, float)) and median_s > 0:
        out["tflops"] = out["flops"] / median_s / 1e12
        if peak_flops:
            out["pct_peak_flops"] = 100.0 * out["tflops"] / peak_flops
            out["peak_flops_basis"] = f"{matmul.get('dtype')} matmul, measured"
    if isinstance(out.get("bytes_moved"), (int, float)) and median_s > 0:
        out["gbps"] = out["bytes_moved"] / median_s / 1e9
        if peak_bw:
            out["pct_peak_bandwidth"] = 100.0 * out["gbps"] / peak_bw
    return out


def _store_samples(vrec: VariantRecord, t: timing.VariantTiming) -> None:
    vrec.samples_s = list(t.samples_s)
    vrec.stats = stats.summarize(t.samples_s).to_dict() if t.samples_s else None
    vrec.recorded = [{k: v for k, v in r.items() if isinstance(v, (int, float, bool))} for r in t.records]
    if not any(vrec.recorded):
        vrec.recorded = []


def _store_speedups(record: CaseRecord) -> None:
    variants = record.variants
    base = record.role_variant("baseline")
    if base is None or not variants[base].samples_s:
        return
    for name, v in variants.items():
        if name != base and v.samples_s:
            try:
                record.speedups[name] = stats.bootstrap_ratio_ci(variants[base].samples_s, v.samples_s).to_dict()
            except ValueError as exc:  # e.g. a median of 0 s: below the clock's resolution
                record.speedups[name] = {"ratio": None, "ci_low": None, "ci_high": None, "error": str(exc)}


def _case_status(record: CaseRecord) -> str:
    if record.failure is not None:
        return "failed"
    problems: list[str] = []
    only_checks = True
    for role in ("baseline", "optimized"):
        name = record.role_variant(role)
        if name is None:
            continue  # excluded by the scenario's variants list (baseline is always kept)
        v = record.variants[name]
        if v.status == "check_failed":
            problems.append(_check_problem(role, name, v.check))
        elif v.status != "ok":
            only_checks = False
            problems.append(f"{role} {name}: {v.status}" + (f" ({v.reason})" if v.reason else ""))
    for name, v in record.variants.items():
        if v.role == "peer" and v.status == "check_failed":
            problems.append(_check_problem("peer", name, v.check))
    if problems:
        record.failure = Failure("check" if only_checks else "variant", "; ".join(problems))
        return "failed"
    return "passed"


def _check_problem(role: str, name: str, check: dict[str, Any]) -> str:
    text = f"{role} {name}: check failed"
    if check.get("error") is not None:
        text += f" ({check['metric']} {check['error']:.3g}"
        text += f" > tolerance {check['tolerance']:.3g})" if check.get("tolerance") is not None else ")"
    if check.get("detail"):
        text += f": {check['detail']}"
    return text
