"""Timing: warm-up, interleaved repetitions, adaptive stopping; on a GPU two clocks, device time
(CUDA events, launch work excluded) and wall time (the host's, launch and syncs included), one
call each per repetition (:class:`Clock`); ``perf_counter_ns`` on a CPU, where they are one clock.

Every repetition is timed on its own and the raw samples are kept; statistics are computed
elsewhere (:mod:`gpubench.records.stats`). Variants of a case are interleaved (A B A B ...) so that
drift of the machine (clocks, temperature, other load) hits each equally.

On a GPU, before each repetition a 256 MB buffer is overwritten so no variant profits from data
a previous repetition left in L2 (as triton's ``do_bench`` does); the flush happens outside the
timed region. Optionally a variant is captured once in a CUDA graph and replayed, which removes
launch overhead for launch-bound kernels.
"""

from __future__ import annotations

import contextlib
import functools
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from gpubench.contract import Recorder

# The one phase timer; a case's stages are wall laps of it (no device given).
from gpubench.measure.phase_timer import PhaseTimer
from gpubench.measure.profiling import nvtx_range
from gpubench.records import stats

# The policy is declared where a scenario reads it without torch; named here too, as it always was.
from gpubench.records.policy import POLICY_PARAMS, PROFILE_KEYS, Policy, PolicyParam, policy_problems  # noqa: F401

L2_FLUSH_BYTES = 256 * 1024 * 1024


def release_frames(exc: BaseException) -> BaseException:
    """Drop the local variables of the frames in ``exc``'s traceback (the traceback text stays
    printable). A kept exception otherwise keeps every tensor of the failed call alive, which
    after an out-of-memory error makes the next variants run out of memory too."""
    traceback.clear_frames(exc.__traceback__)
    return exc


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


BASES = ("device", "wall", "host")
OTHER_BASIS = {"device": "wall", "wall": "device"}  # host has no other


class Clock:
    """Times one call: ``perf_counter_ns`` on the CPU; on a GPU one of two clocks, each with the L2
    flushed before the call and the flush outside what is counted.

    - ``device`` time: the flush is enqueued, the start event is recorded right after it on the
      same stream with no host sync in between, then the call and the end event; the figure is
      the time between the events. The start event waits behind the flush (~80 us for 256 MB on
      an H100) while the host launches the call, so the Python launch work (autotuner dispatch,
      descriptors, device queries) is hidden unless it outlasts the flush (as
      ``triton.testing.do_bench``). Each such call says whether its launch took longer than the
      flush ran (:attr:`launch_outlasted_flush`: then part of the launch may be in the sample).
      Without a flush (``flush_l2: false``) nothing holds the start event back: device time then
      includes the launch.
    - ``wall`` time: the flush is enqueued and waited for (host sync), then the host clock starts,
      just before the call is launched, and stops after the end event (recorded after the call)
      has been synchronized: Python launch work, the call's own host syncs and the final sync's
      latency are in the figure; the flush is not.

    One call cannot give both exactly: wall time needs an idle GPU when the host clock starts (else
    it waits for the flush), device time needs the start event held behind the flush while the
    launch runs. The timing loop makes one call per clock (:func:`measure_interleaved`), except for
    a call so long that the flush is a negligible part of it (:meth:`time_both`: a serving trace,
    a training step), where doubling the calls would buy nothing. On the CPU both clocks are one:
    ``host``.
    """

    def __init__(self, device: torch.device, flush_l2: bool = True):
        self.device = device
        self.method = "cuda_event" if device.type == "cuda" else "perf_counter_ns"
        self._flush_buffer = None
        if device.type == "cuda" and flush_l2:
            self._flush_buffer = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device)
        # Seconds the last flush ran on the GPU (from the last device-time call); None: not known.
        self.flush_s: float | None = None
        if device.type == "cuda":
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)
            if self._flush_buffer is not None:
                self._flush_begin = torch.cuda.Event(enable_timing=True)
        # After a device-time call with the flush: whether the host's launch of the call took
        # longer than the flush ran on the GPU, so the start event may have fired before the
        # launch was done and the sample may hold some launch work. None: not known.
        self.launch_outlasted_flush: bool | None = None

    @property
    def flushes_l2(self) -> bool:
        return self._flush_buffer is not None

    @property
    def one_clock(self) -> bool:
        """True on the CPU: device and wall time are the same perf_counter figure."""
        return self.device.type != "cuda"

    def basis(self, wanted: str) -> str:
        """The clock a call asked to be timed on ``wanted`` (device or wall) gets here: on the
        CPU, ``host`` whatever was asked (and ``host`` is refused on a GPU)."""
        if wanted not in BASES or (wanted == "host" and not self.one_clock):
            raise ValueError(f"time basis must be 'device' or 'wall', not {wanted!r}")
        return "host" if self.one_clock else wanted

    def method_of(self, basis: str) -> str:
        """How a figure on ``basis`` is taken (the record's ``timing.method``)."""
        return "cuda_event" if basis == "device" and not self.one_clock else "perf_counter_ns"

    def time_call(self, fn: Callable[[], Any], basis: str = "device") -> float:
        """Seconds taken by ``fn()`` on ``basis`` (``device`` or ``wall``; the CPU has one clock)."""
        basis = self.basis(basis)
        if basis == "host":
            t0 = time.perf_counter_ns()
            fn()
            return (time.perf_counter_ns() - t0) * 1e-9
        if basis == "device":
            self.launch_outlasted_flush = None
            h0 = time.perf_counter_ns()  # the host's side of the race: flush enqueued to call launched
            if self._flush_buffer is not None:
                self._flush_begin.record()
                self._flush_buffer.zero_()
            self._start.record()  # queued behind the flush: no host sync in between
            fn()
            h1 = time.perf_counter_ns()
            self._end.record()
            self._end.synchronize()
            if self._flush_buffer is not None:
                # The GPU was idle (the last call was synchronized), so the flush began as it was
                # enqueued; counting the host from before that flags a launch a little early.
                self.flush_s = self._flush_begin.elapsed_time(self._start) * 1e-3
                self.launch_outlasted_flush = (h1 - h0) * 1e-9 > self.flush_s
            return self._start.elapsed_time(self._end) * 1e-3
        if self._flush_buffer is not None:
            self._flush_buffer.zero_()
            torch.cuda.synchronize(self.device)  # the flush is done before the host clock starts
        t0 = time.perf_counter_ns()
        fn()
        self._end.record()
        self._end.synchronize()
        return (time.perf_counter_ns() - t0) * 1e-9

    def shares_one_call(self, headline_s: float) -> bool:
        """Whether a call whose headline sample took ``headline_s`` may give both clocks in one call
        (:meth:`time_both`): on a GPU, once the flush's duration is known, where the flush is at most
        :data:`ONE_CALL_FLUSH_SHARE` of the call (or there is no flush)."""
        if self.one_clock:
            return False
        if self._flush_buffer is None:
            return True
        return self.flush_s is not None and self.flush_s <= ONE_CALL_FLUSH_SHARE * headline_s

    def time_both(self, fn: Callable[[], Any]) -> tuple[float, float]:
        """(device, wall) seconds of one call of ``fn()`` on a GPU. Device time as :meth:`time_call`
        takes it (the start event queued behind the flush, no host sync); wall time from just
        before the launch to after the end event's synchronize, with no host sync after the flush
        either, so it may include up to the flush's own duration (the call's first kernel, or its
        first host sync, waits behind the flush): use only where that is negligible
        (:meth:`shares_one_call`)."""
        self.launch_outlasted_flush = None
        h0 = time.perf_counter_ns()
        if self._flush_buffer is not None:
            self._flush_begin.record()
            self._flush_buffer.zero_()
        self._start.record()  # queued behind the flush: no host sync in between
        t0 = time.perf_counter_ns()
        fn()
        h1 = time.perf_counter_ns()
        self._end.record()
        self._end.synchronize()
        t1 = time.perf_counter_ns()
        if self._flush_buffer is not None:
            self.flush_s = self._flush_begin.elapsed_time(self._start) * 1e-3
            self.launch_outlasted_flush = (h1 - h0) * 1e-9 > self.flush_s
        return self._start.elapsed_time(self._end) * 1e-3, (t1 - t0) * 1e-9


# The largest share of a call the L2 flush may be for one call to give both clocks (Clock.time_both):
# its wall time is then off by at most this much, well inside a wall-clock sample's own spread.
ONE_CALL_FLUSH_SHARE = 0.01


def _replayed(replay: Callable[[], Any]) -> Callable[[Recorder], Any]:
    """A variant's call (a Recorder, unused) that replays its captured graph."""
    return lambda recorder: replay()


def capture_cuda_graph(fn: Callable[[], Any], device: torch.device, pool: Any = None) -> Callable[[], Any]:
    """Capture ``fn`` in a CUDA graph and return its replay. Raises if capture is impossible.
    Graphs given the same ``pool`` share memory: safe here because replays never overlap and
    their outputs are discarded."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):  # warm-up on a side stream, as capture requires
        for _ in range(3):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        fn()
    synchronize(device)
    return graph.replay


@dataclass
class VariantTiming:
    name: str
    samples_s: list[float] = field(default_factory=list)  # the headline clock's (``basis``), one per repetition
    records: list[dict[str, Any]] = field(default_factory=list)  # what each timed call recorded
    error: BaseException | None = None  # the exception that stopped this variant, if any
    cuda_graph: str = "off"  # "off", "on", or "failed: <reason>"
    # Each timed headline call's (start, end) on measure_interleaved's host_clock, read outside the
    # timed region: from before the L2 flush to after the device is synchronized (energy over the calls).
    host_bounds: list[tuple[float, float]] = field(default_factory=list)
    basis: str = "host"  # the clock of samples_s: device, wall, or host (the CPU's one clock)
    # The other clock's samples (wall beside device, device beside wall), one per repetition, in
    # the same rounds; empty where there is one clock (CPU). A repetition cut short between its two
    # calls leaves this list one shorter.
    other_s: list[float] = field(default_factory=list)
    # Device-time samples whose launch outlasted the L2 flush (Clock.launch_outlasted_flush): they
    # may hold some launch work. None where not known (a CPU, no flush, no device-time call).
    launch_outlasted_flush: int | None = None
    # Repetitions whose two clocks came from one call (a long call: Clock.time_both), not two.
    shared_calls: int = 0
    # Why timing stopped before min_reps samples (the time cap, the case's deadline); None when it
    # did not. Such a variant's figures have no confidence interval (gpubench.records.stats.MIN_CI_SAMPLES).
    under_sampled: str | None = None

    @property
    def other_basis(self) -> str | None:
        return OTHER_BASIS.get(self.basis)

    @property
    def n(self) -> int:
        return len(self.samples_s)

    def settled(self, policy: Policy) -> bool:
        # The spread of fewer than three samples says nothing; keep measuring (max_reps and
        # max_time_s still bound the loop).
        if self.n < max(policy.min_reps, 3) or sum(self.samples_s) < policy.min_time_s:
            return False
        median = stats.median(self.samples_s)
        return median > 0 and stats.iqr(self.samples_s) / median <= policy.target_iqr


def measure_interleaved(
    calls: dict[str, Callable[[Recorder], Any]],
    clock: Clock,
    policy: Policy,
    reset: Callable[[], None] | None = None,
    on_switch: Callable[[str | None], None] | None = None,
    timings: dict[str, VariantTiming] | None = None,
    nvtx_case: str | None = None,
    phases: PhaseTimer | None = None,
    host_clock: Callable[[], float] = time.monotonic,
    basis: str = "device",
    other_clock: bool = True,
    deadline: float | None = None,
) -> dict[str, VariantTiming]:
    """Warm up each call, then time them in rounds (A B A B ...) until every one has at least
    ``min_reps`` samples and ``min_time_s`` of measured time and an IQR/median at or below
    ``target_iqr``; or ``max_reps`` is reached; or ``max_time_s`` of wall time has passed.

    The time cap and ``min_reps`` (a loaded machine, slow calls): with a ``deadline`` (an instant
    on ``time.perf_counter``: the runner's is :func:`timing_deadline`, a share of the case's time
    limit), timing goes on past ``max_time_s`` until every variant still timed has ``min_reps``
    samples, but past ``max_time_s`` it starts no round that the last one's duration says would
    end past the deadline; without one, ``max_time_s`` ends the loop as it always did. Before
    ``max_time_s`` the deadline changes nothing (a cap longer than the case's limit is the
    scenario's to fix; the case's own alarm still stops it).
    A variant left with fewer than ``min_reps`` samples is marked :attr:`VariantTiming.under_sampled`
    with the reason; its figures then carry no confidence interval (:mod:`gpubench.records.stats`).

    Each call gets a fresh :class:`Recorder`; what the timed calls record is kept beside their
    samples (warm-up calls' is dropped). A call that raises is dropped from the rotation with its
    exception kept; the others go on. Pass ``timings`` to have samples land in a caller-owned dict
    as they are taken (so nothing measured is lost if the caller is interrupted). On CUDA each
    repetition is inside NVTX ranges ``<nvtx_case>/<variant>`` and ``<variant>#<rep>`` (``#w<n>``
    for warm-up calls), pushed outside the timed region. ``phases`` gets the laps ``warmup`` (graph
    capture and warm-up calls) and ``timing`` (the timed rounds, resets and L2 flushes included).
    ``host_clock`` times each timed headline call's bounds (``VariantTiming.host_bounds``), outside
    the timed region: the energy counter's reads are matched to the calls on it.

    ``basis`` is the headline clock on a GPU (``device`` or ``wall``: :class:`Clock`); its samples
    are ``samples_s``, which the stopping rule reads. On a GPU every timed repetition is two calls,
    one per clock, the headline's first (each with its own reset and flush); the other clock's
    samples are ``other_s``; ``other_clock=False`` leaves it out (one call per repetition: for
    figures read on one clock only, such as the device's ceilings). On the CPU there is one clock
    (``host``) and one call.
    """
    timings = {} if timings is None else timings
    loop = _Interleaving(calls, clock, timings, basis, other_clock, reset, on_switch, nvtx_case, host_clock)
    if phases is not None:
        phases.enter("warmup")
    if policy.cuda_graph and clock.device.type == "cuda":
        loop.capture_graphs()
    loop.warm_up(policy.warmup_s)
    if phases is not None:
        phases.enter("timing")
    stopped_by = loop.time_rounds(policy, deadline)
    loop.mark_under_sampled(policy.min_reps, stopped_by)
    return timings


class _Interleaving:
    """The state of one :func:`measure_interleaved`: the calls (graph replays in place of eager calls
    once captured), the variants still in the rotation, and the steps it takes in order: capture,
    warm-up, timed rounds, under-sampled marks. A variant that raises leaves the rotation with its
    exception kept in its :class:`VariantTiming`."""

    def __init__(
        self,
        calls: dict[str, Callable[[Recorder], Any]],
        clock: Clock,
        timings: dict[str, VariantTiming],
        basis: str,
        other_clock: bool,
        reset: Callable[[], None] | None,
        on_switch: Callable[[str | None], None] | None,
        nvtx_case: str | None,
        host_clock: Callable[[], float],
    ):
        self.clock = clock
        self.device = clock.device
        self.timings = timings
        self.headline = clock.basis(basis)
        self.other = OTHER_BASIS.get(self.headline) if other_clock else None
        for name in calls:
            timings.setdefault(name, VariantTiming(name, basis=self.headline))
        self.reset = reset
        self.on_switch = on_switch
        self.nvtx_case = nvtx_case
        self.host_clock = host_clock
        self.calls = dict(calls)  # graph replays replace eager calls here only, not in the caller's dict
        self.active = list(self.calls)
        self.warmups = dict.fromkeys(self.calls, 0)

    def tag(self, name: str | None) -> None:
        if self.on_switch is not None:
            self.on_switch(name)

    def drop(self, name: str, exc: Exception) -> None:
        """``name`` raised: keep its exception (frames released) and take it out of the rotation."""
        self.timings[name].error = release_frames(exc)
        self.active.remove(name)

    def capture_graphs(self) -> None:
        """Each variant captured once in a CUDA graph (one memory pool), its replay timed in place of
        the eager call; a variant that cannot be captured (or is reset before every call) is timed
        eagerly, the reason kept in its ``cuda_graph``."""
        pool = torch.cuda.graph_pool_handle()
        for name in list(self.active):
            if self.reset is not None:
                self.timings[name].cuda_graph = "failed: stateful workload (reset before every call)"
                continue
            try:
                replay = capture_cuda_graph(functools.partial(self.calls[name], Recorder()), self.device, pool)
                self.calls[name] = _replayed(replay)
                self.timings[name].cuda_graph = "on"
            except Exception as exc:  # noqa: BLE001 - graph capture is best-effort: time eagerly
                self.timings[name].cuda_graph = f"failed: {type(exc).__name__}: {exc}"
                release_frames(exc)
                synchronize(self.device)

    def warm_up(self, warmup_s: float) -> None:
        """Each variant on its own until ``warmup_s`` has passed (at least one call)."""
        for name in list(self.active):
            try:
                t_end = time.perf_counter() + warmup_s
                while True:
                    self.one(name, timed=False)
                    if time.perf_counter() >= t_end:
                        break
            except Exception as exc:  # noqa: BLE001 - recorded, the other variants go on
                self.drop(name, exc)
        self.tag(None)

    def time_rounds(self, policy: Policy, deadline: float | None) -> str:
        """Rounds of one timed repetition per active variant until the stopping rule
        (:func:`measure_interleaved`) ends them; why the time cap or the deadline stopped them, or ""."""
        timings = self.timings
        t_start = time.perf_counter()
        while self.active:
            round_start = time.perf_counter()
            for name in list(self.active):
                try:
                    self.one(name, timed=True)
                except Exception as exc:  # noqa: BLE001
                    self.drop(name, exc)
            self.tag(None)
            if not self.active:
                break
            reps = [timings[n].n for n in self.active]
            if min(reps) >= policy.max_reps:
                break
            now = time.perf_counter()
            if now - t_start >= policy.max_time_s:  # the time cap; past it only to reach min_reps, by the deadline
                if deadline is None or min(reps) >= policy.min_reps:
                    return f"time cap (max_time_s = {policy.max_time_s:g} s) reached at {now - t_start:.1f} s"
                if now + (now - round_start) > deadline:
                    return f"the case's time limit left no room for another round ({now - t_start:.1f} s of timing)"
            if all(timings[n].settled(policy) for n in self.active):
                break
        return ""

    def mark_under_sampled(self, min_reps: int, stopped_by: str) -> None:
        """Variants still timed with fewer than ``min_reps`` samples, marked with why timing stopped."""
        for name in self.active:
            if self.timings[name].n < min_reps:
                self.timings[
                    name
                ].under_sampled = (
                    f"{self.timings[name].n} of min_reps {min_reps} timed calls: {stopped_by or 'timing stopped'}"
                )

    def one(self, name: str, timed: bool) -> float:
        """One repetition of ``name`` (a warm-up call unless ``timed``): on a GPU with the other clock,
        a second call of its own, or one call giving both where the flush is a negligible share of it."""
        t = self.timings[name]
        rep = f"{t.n}" if timed else f"w{self.warmups[name]}"
        self.warmups[name] += not timed
        if timed and self.other is not None and t.samples_s and self.clock.shares_one_call(min(t.samples_s)):
            # A long call: the flush is a negligible part of it, so one call gives both clocks
            # (a second call per repetition would double a serving trace's time for nothing).
            (device_s, wall_s), recorder, bounds = self.timed_once(name, rep, "both", timed)
            seconds, other_s = (device_s, wall_s) if self.headline == "device" else (wall_s, device_s)
            t.other_s.append(other_s)
            t.shared_calls += 1
        else:
            seconds, recorder, bounds = self.timed_once(name, rep, self.headline, timed)
            if timed and self.other is not None:  # the other clock: a call of its own
                t.other_s.append(self.timed_once(name, f"{rep}:{self.other}", self.other, timed)[0])
        if timed:
            t.samples_s.append(seconds)
            t.records.append(recorder.values)
            t.host_bounds.append(bounds)
        return seconds

    def timed_once(self, name: str, rep: str, on: str, timed: bool) -> tuple[Any, Recorder, tuple[float, float]]:
        """One call on clock ``on`` (``both``: :meth:`Clock.time_both`, a (device, wall) pair)."""
        if self.reset is not None:
            self.reset()
            synchronize(self.device)
        self.tag(name)
        recorder = Recorder()
        call = self.calls[name]
        label = f"{self.nvtx_case}/{name}" if self.nvtx_case else name
        with nvtx_range(label, self.device), nvtx_range(f"{name}#{rep}", self.device):
            started = self.host_clock()
            figure = (
                self.clock.time_both(lambda: call(recorder))
                if on == "both"
                else self.clock.time_call(lambda: call(recorder), on)
            )
            ended = self.host_clock()
        exposed = getattr(self.clock, "launch_outlasted_flush", None) if on in ("device", "both") else None
        if timed and exposed is not None:
            self.timings[name].launch_outlasted_flush = (self.timings[name].launch_outlasted_flush or 0) + exposed
        return figure, recorder, (started, ended)


# The share of a case's time limit, from the case's start, that timing may run to when the time cap
# (max_time_s) comes before min_reps: the rest is left for metrics, energy and profiles.
TIMING_DEADLINE_SHARE = 0.8


def timing_deadline(case_started: float, limit_s: float) -> float:
    """The instant (``time.perf_counter``) past which a case's timing starts no round, min_reps
    or not: :data:`TIMING_DEADLINE_SHARE` of its time limit ``limit_s`` after ``case_started``."""
    return case_started + TIMING_DEADLINE_SHARE * limit_s


def harness_overhead_s(device: torch.device, reps: int = 2000) -> float:
    """Median time the harness reports for a call that does nothing: its per-repetition
    overhead (without the L2 flush, which happens outside the timed region), on the device clock
    (on a GPU the wall clock adds the end event's synchronize)."""
    clock = Clock(device, flush_l2=False)

    def noop() -> None:
        return None

    for _ in range(50):
        clock.time_call(noop)
    samples = [clock.time_call(noop) for _ in range(reps if device.type != "cuda" else reps // 4)]
    return stats.summarize(samples).median


@contextlib.contextmanager
def count_cuda_syncs(active: bool) -> Iterator[dict[str, int | None]]:
    """Counts the synchronizing CUDA operations run inside the block (``torch.cuda``'s sync debug
    mode, its warnings captured): ``box["n"]`` after the block, None when not active."""
    box: dict[str, int | None] = {"n": None}
    if not active:
        yield box
        return
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield box
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    box["n"] = sum("synchroniz" in str(c.message) for c in caught)
