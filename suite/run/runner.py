"""One case, measured: build the workload once (seeded), run every variant once and check its
output against the reference, time the variants interleaved, derive metrics, and (where NVML has
an energy counter) measure energy per call. A worker process (or the supervisor itself, with
``--isolation none``) calls :func:`run_case` for each case it is given; a run of many cases goes
through :func:`gpubench.run.supervisor.run_scenario`.

A case that raises, runs out of memory or passes its time limit is recorded as failed with the
reason; the run goes on. The time limit here is SIGALRM on the main thread: it stops Python code
and any native call that returns, keeping what was measured; a native call that never returns is
the supervisor's to stop, by killing the worker process (:mod:`gpubench.run.supervisor`).
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpubench import techniques
from gpubench.contract import ROLES, SHAPE_TIME_BASIS, CheckResult, Measured, Recorder, Technique, Variant, Workload
from gpubench.measure import energy, machine_load, profiling, timing
from gpubench.measure.telemetry import TelemetrySampler
from gpubench.records import stats
from gpubench.records.results import CaseRecord, Check, Failure, Speedup, Stats, Timing, VariantRecord
from gpubench.run.scenario import Case


class CaseTimeout(BaseException):
    """Raised inside a case that passed its time limit. A BaseException so that a technique's
    own ``except Exception`` cannot swallow it."""


class BudgetSpent(CaseTimeout):
    """Raised inside a case that ran into the end of the run's ``--budget`` (before its own
    case_timeout_s): the case is interrupted, not failed, and keeps what it measured."""


@contextlib.contextmanager
def deadline(seconds: float, budget: bool = False) -> Iterator[None]:
    """SIGALRM after ``seconds``: :class:`CaseTimeout`, or :class:`BudgetSpent` where the limit is
    the run's budget (``budget``)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum, frame):
        if budget:
            raise BudgetSpent(f"stopped after {seconds:.1f} s: the run's --budget ran out")
        raise CaseTimeout(f"exceeded its time limit of {seconds:g} s (policy.case_timeout_s)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _is_oom(exc: BaseException) -> bool:
    oom_types = tuple(
        t
        for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None), MemoryError)
        if t
    )
    text = str(exc).lower()
    return isinstance(exc, oom_types) or "out of memory" in text or "can't allocate memory" in text


def _free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def timeout_failure(limit: machine_load.TimeLimit, elapsed_s: float, lead: str | None = None) -> Failure:
    """The failure of a case that passed its time limit: ``timed out after 300 s (limit 300 s
    x1.0; machine at load 11.0 on 2 cores, ...)``, the load read now. Kind ``overloaded`` where the
    machine had more runnable work than cores (at the case's start or now): a timeout of the
    run's environment, not a failure of the technique (still a case not measured); else
    ``timeout``. ``lead``: what stopped it, in place of ``timed out after N s``, where not the
    case's own alarm."""
    now = machine_load.read()
    message = f"{lead or f'timed out after {elapsed_s:.0f} s'} ({limit.words(now)})"
    if machine_load.overloaded(limit.load, now):
        return Failure(
            "overloaded",
            f"{message}: the machine was overloaded, so this is a timeout of the run's "
            "environment, not a failure of the technique; rerun it on a quieter machine",
        )
    return Failure("timeout", message)


def describe(exc: BaseException) -> Failure:
    """A failure record: kind (oom, timeout, exception), message and traceback. The frames'
    locals are released (see :func:`timing.release_frames`)."""
    if isinstance(exc, CaseTimeout):
        kind = "timeout"
    elif _is_oom(exc):
        kind = "oom"
    else:
        kind = "exception"
    failure = Failure(
        kind,
        f"{type(exc).__name__}: {exc}",
        "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:],
    )
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


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def unloadable(case: Case, source: str) -> CaseRecord:
    """The record of a case whose technique could not be loaded where it was to run."""
    record = new_record(case)
    record.status = "failed"
    record.failure = Failure("exception", f"technique {case.technique} could not be loaded here from {source!r}")
    return record


def new_record(case: Case) -> CaseRecord:
    tech = techniques.get(case.technique)
    return CaseRecord(
        id=case.id,
        technique=case.technique,
        params=case.params,
        seed=case.seed,
        policy=case.policy.to_dict(),
        source=tech.source if tech is not None else "",
        headline=tech.headline if tech is not None else "",  # type: ignore[attr-defined]  # property
        gate_metric=tech.gate_metric if tech is not None else "",
        started_at=_now(),
    )


class CaseInterrupted(KeyboardInterrupt):
    """Ctrl-C inside a case; carries what the case measured before it (marked interrupted)."""

    def __init__(self, record: CaseRecord):
        super().__init__("stopped by Ctrl-C")
        self.record = record


_memory_capped: set[str] = set()  # the CUDA devices this process has capped (policy.gpu_memory_gib)

# A "gpu_memory_gib: 24" scenario stands for a 24 GB card, and such a card's caching allocator gets
# less than 24 GiB: the card keeps about 1.5 GiB from a process (driver reservations, a display),
# so it offers about 22.5 GiB before the process's CUDA context (issue 33), and that context takes
# about 0.5 GiB more (module images, library handles; more with many Triton kernels loaded). On a
# bigger GPU the context lives outside the cap, so the cap is what is left of the small card after
# both. Approximate: both figures vary with the card, driver and libraries.
CARD_RESERVED_GIB = 1.5
CUDA_CONTEXT_GIB = 0.5


def allocator_cap_bytes(gib: float) -> int:
    """What torch's caching allocator may hold to stand for a card of ``gib`` GiB: the card's size
    less CARD_RESERVED_GIB and CUDA_CONTEXT_GIB (never below half of it, for a tiny ``gib``)."""
    return int(max(gib - CARD_RESERVED_GIB - CUDA_CONTEXT_GIB, gib / 2) * 2**30)


def cap_gpu_memory(device: torch.device, gib: float) -> float | None:
    """Let torch's caching allocator hold at most :func:`allocator_cap_bytes` of ``gib`` on
    ``device``, and never more than this card has free for it now (0: lift a cap set before); the
    fraction of the device's memory that is, or None for no cap. Only the caching allocator is
    capped: the CUDA context and libraries that allocate for themselves are not."""
    key = str(device)
    if gib <= 0:
        if key in _memory_capped:
            torch.cuda.set_per_process_memory_fraction(1.0, device)
            _memory_capped.discard(key)
        return None
    total = torch.cuda.get_device_properties(device).total_memory
    free, _ = torch.cuda.mem_get_info(device)  # this process's context already made: not in ``free``
    usable = free + torch.cuda.memory_reserved(device)  # what the allocator holds is its own to reuse
    fraction = min(1.0, allocator_cap_bytes(gib) / total, usable / total)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    _memory_capped.add(key)
    return fraction


@dataclass
class CaseRun:
    """One case while it is measured: where and how (technique, case, device, clock, telemetry,
    the device's ceilings, the run directory for profiles), the record the stages fill in, the
    phase laps, and the timings, which the timing loop fills as samples are taken so that a case
    cut short (time limit, Ctrl-C, a fault) keeps every sample it took."""

    tech: Technique
    case: Case
    device: torch.device
    clock: timing.Clock
    sampler: TelemetrySampler
    ceilings: dict[str, Any] | None
    run_dir: Path | str | None
    record: CaseRecord
    phases: timing.PhaseTimer = field(default_factory=timing.PhaseTimer)
    timings: dict[str, timing.VariantTiming] = field(default_factory=dict)
    # The perf_counter instant past which timing starts no round (timing.timing_deadline), or None.
    deadline: float | None = None

    def tag(self, what: str | None) -> None:
        """Tell telemetry what runs now (its samples are tagged with it)."""
        self.sampler.set_tag(self.case.id, what)

    def variant(self, name: str) -> VariantRecord:
        return self.record.variants[name]


def run_case(
    case: Case,
    device: torch.device,
    clock: timing.Clock,
    sampler: TelemetrySampler,
    ceilings: dict[str, Any] | None,
    run_dir: Path | str | None = None,
    budget_s: float | None = None,
    time_limit: machine_load.TimeLimit | None = None,
) -> CaseRecord:
    """Measure one case. Never raises, except :class:`CaseInterrupted` on Ctrl-C (with the
    partial record). ``run_dir``: where profiles are written (``policy.profile``); without it,
    nothing is profiled. ``time_limit``: the case's limit (its ``case_timeout_s`` scaled by the
    machine's load at its start, :mod:`gpubench.measure.machine_load`; default read here), kept in the
    record; a case that passes it fails as ``timeout``, or ``overloaded`` on an overloaded
    machine. ``budget_s``: the time the run's ``--budget`` has left for it; where it is shorter
    than the limit and runs out, the case is interrupted (failure kind ``budget``) and keeps the
    samples it took."""
    tech = techniques.get(case.technique)
    assert tech is not None
    limit = time_limit or machine_load.time_limit(case.policy.case_timeout_s)
    run = CaseRun(tech, case, device, clock, sampler, ceilings, run_dir, new_record(case))
    run.record.time_limit = limit.to_dict()
    t0 = time.perf_counter()
    if device.type == "cuda":  # GPU-only (docs/cuda-paths.md): run_case needs a CUDA clock; the cap is faked
        cap_gpu_memory(device, case.policy.gpu_memory_gib)
    interrupted = False
    by_budget = budget_s is not None and budget_s < limit.seconds
    seconds = budget_s if budget_s is not None and by_budget else limit.seconds
    run.deadline = timing.timing_deadline(t0, seconds)
    try:
        with deadline(seconds, by_budget), profiling.nvtx_range(case.id, device):
            _measure(run)
    except BudgetSpent as exc:
        run.record.status = "interrupted"
        run.record.failure = Failure("budget", f"{exc}; the samples it took are kept")
        timing.release_frames(exc)
    except KeyboardInterrupt:
        run.record.status = "interrupted"
        run.record.failure = Failure("interrupted", "stopped by Ctrl-C")
        interrupted = True
    except CaseTimeout as exc:
        failure = timeout_failure(limit, time.perf_counter() - t0)
        failure.traceback = describe(exc).traceback  # where the case was when the alarm went off
        run.record.failure = failure
    except BaseException as exc:  # noqa: BLE001 - a failing case never takes the run down
        run.record.failure = describe(exc)
    finally:
        _assemble(run, t0)
    # Outside the except block, so the failed call's frames (and tensors) are gone by now.
    if device.type == "cuda" or run.record.failure is not None:
        _free_memory(device)
    if interrupted:
        raise CaseInterrupted(run.record)
    return run.record


def _measure(run: CaseRun) -> None:
    """The case's stages in order, each handing the next what it produced."""
    runnable = _plan_variants(run)
    workload = _build(run)
    outputs = _check(run, workload, runnable)
    calls = _time(run, workload, outputs)
    _derive(run, workload, outputs, calls)


def _plan_variants(run: CaseRun) -> list[Variant]:
    """A record per variant the case asks for, in role order: skipped with its reason where it
    cannot run here, marked checked-only where it runs but is never timed. The variants to run."""
    tech, device = run.tech, run.device
    cast = tech.cast(device, run.case.params)
    wanted = (
        tech.resolve(run.case.variants, device, run.case.params)
        if run.case.variants is not None
        else list(tech.variants)
    )
    names = sorted(wanted, key=lambda n: ROLES.index(cast[n][0]))
    for name in names:
        role, reason = cast[name]
        vrec = run.record.variants[name] = VariantRecord(role=role, description=tech.variants[name].description)
        if reason:
            vrec.status, vrec.reason = "skipped", reason
        elif (note := tech.variants[name].checked_only_reason(device)) is not None:  # checked, never timed
            vrec.reason, vrec.timing = note, Timing(method="none", not_timed=note)
    return [tech.variants[n] for n in names if run.variant(n).status != "skipped"]


def _build(run: CaseRun) -> Workload:
    """Stage 1: the case's seeded inputs, which every variant receives."""
    run.tag("build")
    run.phases.enter("build")
    build = run.tech.build_fn
    assert build is not None  # a registered technique has one (contract.problems refuses it otherwise)
    return build(run.case.params, run.device, run.case.seed)


def _check(run: CaseRun, workload: Workload, runnable: list[Variant]) -> dict[str, Any]:
    """Stage 2: one checked call per variant (also its first warm-up call), each output compared
    with the reference. The outputs, by variant, of the variants that ran."""
    run.phases.enter("check")
    outputs: dict[str, Any] = {}
    for v in runnable:
        vrec = run.variant(v.name)
        run.tag(v.name)
        try:
            with profiling.nvtx_range(f"{run.case.id}/{v.name}", run.device):
                outputs[v.name], vrec.peak_memory_bytes = _call_once(v, workload, run.device)
            vrec.status = "ok"
        except Exception as exc:  # noqa: BLE001 - recorded per variant
            failure = describe(exc)
            vrec.fail("error", failure)
            if failure.kind == "oom":
                _free_memory(run.device)
    reference, to_check = _reference(run, workload, outputs)
    check_fn = run.tech.check_fn
    assert check_fn is not None  # a registered technique has one (contract.problems refuses it otherwise)
    for name in to_check:
        try:
            result = check_fn(reference, outputs[name])
        except Exception as exc:  # noqa: BLE001 - a check that cannot compare is a failed check
            result = CheckResult(False, None, None, "error", f"check raised {describe(exc).message}")
        run.variant(name).check = Check(result.passed, result.error, result.tolerance, result.metric, result.detail)
        if not result.passed:
            run.variant(name).status = "check_failed"
    return outputs


def _reference(run: CaseRun, workload: Workload, outputs: dict[str, Any]) -> tuple[Any, list[str]]:
    """What the outputs are checked against (the technique's own reference, else the baseline's
    output) and the variants to check against it."""
    base = run.record.role_variant("baseline")
    if run.tech.reference_fn is not None:
        run.tag("reference")
        return run.tech.reference_fn(workload), list(outputs)
    if base in outputs:
        run.variant(base).check = Check(True, 0.0, None, "reference", "the baseline is the reference")
        return outputs[base], [n for n in outputs if n != base]
    for name in outputs:  # ran, but nothing to compare with
        run.variant(name).status = "unchecked"
        run.variant(name).reason = f"no reference: baseline {base} did not run"
    return None, []


Calls = dict[str, Callable[[Recorder], Any]]


def _time(run: CaseRun, workload: Workload, outputs: dict[str, Any]) -> Calls:
    """Stage 3: warm-up, then timed rounds interleaved (A B A B ...), of every variant that ran
    and is timed (a wrong result is still timed; its check fails the case). The calls timed; the
    samples are in ``run.timings``."""
    calls: Calls = {
        n: functools.partial(run.tech.variants[n].call, workload) for n in outputs if run.variant(n).timing is None
    }
    timing.measure_interleaved(
        calls,
        run.clock,
        run.case.policy,
        reset=workload.reset,
        on_switch=run.tag,
        timings=run.timings,
        nvtx_case=run.case.id,
        phases=run.phases,
        deadline=run.deadline,
        host_clock=_host_clock(run.sampler) if run.case.policy.energy_s > 0 else time.monotonic,
        basis=getattr(run.tech, "time_basis", "") or SHAPE_TIME_BASIS.get(run.tech.shape, "device"),
    )
    return calls


def _energy_log(sampler: Any) -> energy.CounterLog | None:
    """Where the energy counter is being read throughout, with host-clock instants (the telemetry
    sampler's thread, a worker's counter reader); None where it is not (a probe without one)."""
    return getattr(sampler, "energy_log", None)


def _host_clock(sampler: Any) -> Callable[[], float]:
    """The clock the timed calls' bounds and the energy window are read on: the energy log's."""
    log = _energy_log(sampler)
    return log.clock if log is not None else time.perf_counter


def _derive(run: CaseRun, workload: Workload, outputs: dict[str, Any], calls: Calls) -> None:
    """Stage 4: what the timed calls leave to record and what follows them, never touching their
    samples: the timings and metrics from the median time, energy per call, profiles."""
    run.phases.enter("metrics")
    _record_timings(run)
    _record_metrics(run, workload, outputs)
    outputs.clear()  # the checked calls' outputs are no longer needed: free them before energy
    run.phases.enter("energy")
    _record_energy(run, workload, calls)
    run.phases.enter("profile")
    _record_profiles(run, workload, calls)


def _record_timings(run: CaseRun) -> None:
    for name, t in run.timings.items():
        vrec = run.variant(name)
        vrec.timing = Timing(
            method=run.clock.method_of(t.basis),
            l2_flush=run.clock.flushes_l2,
            cuda_graph=t.cuda_graph,
            # of the device-time samples (a GPU, the flush on); None: not recorded
            launch_outlasted_flush=t.launch_outlasted_flush,
            # repetitions timed on both clocks in one call (long calls)
            both_clocks_one_call=t.shared_calls or None,
        )
        vrec.under_sampled = t.under_sampled
        if t.error is not None:
            vrec.fail("error", describe(t.error), "during timing: ")
        _store_samples(vrec, t)


def _record_metrics(run: CaseRun, workload: Workload, outputs: dict[str, Any]) -> None:
    """Metrics from the median time, what the timed calls recorded, and the checked call's output."""
    for name, t in run.timings.items():
        if not t.samples_s:
            continue
        measured = Measured(
            name, list(t.samples_s), stats.median(t.samples_s), outputs.get(name), run.device, records=list(t.records)
        )
        try:
            metrics = dict(run.tech.metrics_fn(workload, measured)) if run.tech.metrics_fn else {}
        except Exception as exc:  # noqa: BLE001 - the timing stands; the metric is marked broken
            metrics = {"metrics_error": describe(exc).message}
        run.variant(name).metrics = derive_rates(metrics, measured.median_s, run.ceilings)


def _record_energy(run: CaseRun, workload: Workload, calls: Calls) -> None:
    """Energy per call, where the GPU has an energy counter (gpubench.measure.energy). A variant whose
    calls outlast several of the counter's refreshes is measured over its timed calls, from the
    counter's reads the sampler took throughout (no call of its own); any other runs alone for
    a window of several refreshes (not interleaved: the counter advances in steps)."""
    if run.sampler.energy_mj() is None or run.case.policy.energy_s <= 0:
        return
    log = _energy_log(run.sampler)
    bounds = [b for t in run.timings.values() for b in t.host_bounds]
    readings = log.readings(min(b[0] for b in bounds), max(b[1] for b in bounds)) if log and bounds else []
    period = energy.counter_period_s(readings)
    limit = getattr(run.sampler, "power_limit_w", None)  # a probe without it: the figure is not checked
    for name, call in calls.items():
        vrec = run.variant(name)
        if vrec.status not in ("ok", "check_failed"):
            continue
        timed = run.timings.get(name)
        try:
            if (
                log is not None
                and timed is not None
                and timed.host_bounds
                and energy.calls_are_long(stats.median([end - start for start, end in timed.host_bounds]), period)
            ):
                vrec.energy = energy.measure_over_calls(
                    readings, timed.host_bounds, power_limit_w=limit() if limit is not None else None
                )
            else:
                run.tag(f"{name}:energy")
                with profiling.nvtx_range(f"{run.case.id}/{name}", run.device):
                    vrec.energy = _energy_per_call(call, workload, run.device, run.sampler, run.case.policy.energy_s)
            vrec.energy_mj_per_call, vrec.energy_error = vrec.energy.mj_per_call, vrec.energy.error
        except Exception as exc:  # noqa: BLE001 - the timing and check stand
            vrec.energy_error = describe(exc).message


def _record_profiles(run: CaseRun, workload: Workload, calls: Calls) -> None:
    """Profiles (policy.profile), last: after every timed and energy call, so they cannot touch
    the samples. A failed profile is recorded as {"error": ...} and fails nothing."""
    policy = run.case.policy
    if not policy.profile or run.run_dir is None:
        return
    for name, call in calls.items():
        vrec = run.variant(name)
        if vrec.status in ("ok", "check_failed", "unchecked"):
            run.tag(f"{name}:profile")
            with profiling.nvtx_range(f"{run.case.id}/{name}", run.device):
                vrec.profile = profiling.profile_variant(
                    functools.partial(call, Recorder()),
                    run.device,
                    policy.profile_calls,
                    run.run_dir,
                    run.case.id,
                    name,
                    reset=workload.reset,
                )


def _assemble(run: CaseRun, t0: float) -> None:
    """Stage 5, whatever happened before: the samples taken (a case cut short keeps them), the
    speedups, the elapsed time and its phases, the status."""
    record = run.record
    run.sampler.set_tag(None, None)
    run.phases.enter("stats")
    for name, t in run.timings.items():
        vrec = record.variants[name]
        if len(vrec.samples_s) != t.n:
            _store_samples(vrec, t)
    _store_speedups(record)
    record.elapsed_s = time.perf_counter() - t0
    record.phases_s = phase_seconds(run.phases.stop(), record.elapsed_s, run.timings)
    if record.status == "running":
        record.status = _case_status(record)


PHASES = ("build", "check", "warmup", "timing", "metrics", "energy", "profile", "stats")


def phase_seconds(
    laps: dict[str, float], elapsed_s: float, timings: dict[str, timing.VariantTiming]
) -> dict[str, float]:
    """A case's phase laps in :data:`PHASES` order (0 for a phase it never reached), ``timed``
    (the timed calls' own samples on both clocks, part of ``timing``) and ``other`` (elapsed less the phases)."""
    out = {name: laps.get(name, 0.0) for name in PHASES}
    out["timed"] = sum(sum(t.samples_s) + sum(t.other_s) for t in timings.values())
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


def _energy_per_call(
    call: Callable[[Recorder], Any], workload: Workload, device: torch.device, sampler: TelemetrySampler, seconds: float
) -> energy.EnergyMeasurement:
    def one_call() -> None:
        if workload.reset is not None:
            workload.reset()
        call(Recorder())

    limit = getattr(sampler, "power_limit_w", None)  # a probe without it: the figure is not checked
    return energy.measure_energy_per_call(
        one_call,
        sampler.energy_mj,
        _host_clock(sampler),
        min_window_s=seconds,
        power_limit_w=limit() if limit is not None else None,
        sync=lambda: timing.synchronize(device),
    )


def derive_rates(metrics: dict[str, Any], median_s: float, ceilings: dict[str, Any] | None) -> dict[str, Any]:
    """Add TFLOP/s, GB/s, % of the measured device peak and FLOPs per byte to a technique's
    ``flops`` and ``bytes_moved`` counts. Applied to every timed variant, peers included: the
    counts are the case's problem (each byte and FLOP counted once), so a variant that moves more
    than the problem needs shows it as a lower share of the peak."""
    out = dict(metrics)
    matmul = (ceilings or {}).get("matmul") or {}
    copy = (ceilings or {}).get("copy") or {}
    peak_flops, peak_bw = matmul.get("peak_tflops"), copy.get("peak_gbps")
    flops, moved = _count(out, "flops"), _count(out, "bytes_moved")
    if flops is not None and median_s > 0:
        out["tflops"] = flops / median_s / 1e12
        if peak_flops:
            out["pct_peak_flops"] = 100.0 * out["tflops"] / peak_flops
            out["peak_flops_basis"] = f"{matmul.get('dtype')} matmul, measured"
    if moved is not None and median_s > 0:
        out["gbps"] = moved / median_s / 1e9
        if peak_bw:
            out["pct_peak_bandwidth"] = 100.0 * out["gbps"] / peak_bw
            out["peak_bandwidth_basis"] = f"copy ({copy.get('counts', 'bytes read + bytes written')}), measured"
    if flops is not None and moved:
        out["flops_per_byte"] = flops / moved
    return out


def _count(metrics: dict[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _store_samples(vrec: VariantRecord, t: timing.VariantTiming) -> None:
    vrec.samples_s, vrec.time_basis, vrec.other_samples_s = list(t.samples_s), t.basis, list(t.other_s)
    vrec.stats = Stats(**stats.summarize(t.samples_s).to_dict()) if t.samples_s else None
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
                record.speedups[name] = Speedup(
                    **stats.bootstrap_ratio_ci(variants[base].samples_s, v.samples_s).to_dict()
                )
            except ValueError as exc:  # e.g. a median of 0 s: below the clock's resolution
                record.speedups[name] = Speedup.failed(str(exc))


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


def _check_problem(role: str, name: str, check: Check | None) -> str:
    text = f"{role} {name}: check failed"
    if check is None:  # (a failed check records its Check: never so)
        return text
    if check.error is not None:
        text += f" ({check.metric} {check.error:.3g}"
        text += f" > tolerance {check.tolerance:.3g})" if check.tolerance is not None else ")"
    if check.detail:
        text += f": {check.detail}"
    return text
