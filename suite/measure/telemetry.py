"""GPU telemetry: a background thread samples NVML (through nvidia-ml-py, imported as ``pynvml``)
at a fixed interval while the benchmarks run.

Each sample holds power (the instantaneous field where the GPU has it, else NVML's power
reading), the cumulative energy counter, SM and memory clocks, temperature, GPU and memory
utilization, memory used, and the clock-event ("throttle") reasons, both as NVML's raw bitmask
and decoded into names. Every sample is tagged with the case and variant that were running when
it was taken (:meth:`TelemetrySampler.set_tag`), so per-case and per-variant summaries can be
drawn from one stream.

Where there is no NVML (a CPU run, no NVIDIA driver, nvidia-ml-py not installed) the sampler is
*unavailable*: it records the reason, starts no thread, and every method still works, so the
runner does not need to special-case it.

This module is the sampler thread. It talks to a :class:`TelemetrySource`
(:mod:`gpubench.measure.telemetry_source`: the protocol and :class:`NvmlSource`, the real one; tests inject
a fake, which is how the sampler is tested on a CPU); reasons are decoded by
:mod:`gpubench.measure.throttle`; summaries and telemetry.csv's rows are :mod:`gpubench.measure.telemetry_summary`.
The public names of all four stay importable from here. Energy per call, timed against the
counter's steps and checked against the board's power limit, is :mod:`gpubench.measure.energy`; the
sampler keeps every energy read with its host-clock instants (:attr:`TelemetrySampler.energy_log`)
so that long calls are measured over their timed calls themselves.

Units: power in W, energy in mJ (NVML's counter, cumulative since the driver loaded), clocks in
MHz, temperature in degrees C, utilization in %, memory used in MiB (2**20 bytes, as nvidia-smi).
"""

from __future__ import annotations

import functools
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from gpubench.measure.energy import CounterLog
from gpubench.measure.telemetry_source import (
    SOURCE_FIELDS,
    NvmlSource,
    TelemetrySource,
    TelemetryUnavailable,
    nvml_source_for,
    resolve_cuda_index,
)
from gpubench.measure.telemetry_summary import aggregate, case_summary, samples_dataframe
from gpubench.measure.throttle import BENIGN_REASONS, THROTTLE_BITS, decode_throttle_reasons, split_reasons
from gpubench.records.atomic import atomic_write_text
from gpubench.records.results import Telemetry

__all__ = [
    "DEFAULT_INTERVAL_S",
    "SAMPLE_COLUMNS",
    "SOURCE_FIELDS",
    "BENIGN_REASONS",
    "THROTTLE_BITS",
    "NvmlSource",
    "TelemetrySampler",
    "TelemetrySource",
    "TelemetryUnavailable",
    "decode_throttle_reasons",
    "next_tick_index",
    "nvml_source_for",
    "resolve_cuda_index",
    "split_reasons",
]

DEFAULT_INTERVAL_S = 0.05

# Columns of every sample, in CSV order. energy_mj is read by the sampler next to read().
SAMPLE_COLUMNS: tuple[str, ...] = (
    ("t_s", "case", "variant") + SOURCE_FIELDS[:1] + ("energy_mj",) + SOURCE_FIELDS[1:] + ("throttle_reasons",)
)


def next_tick_index(k: int, elapsed_s: float, interval_s: float) -> int:
    """Index of the next tick to run after tick ``k`` when ``elapsed_s`` seconds have passed since
    the sampler started. Ticks lie at ``start + k * interval``, never drifting; ticks whose time has
    already passed are skipped rather than run late in a burst."""
    due = int(math.floor(elapsed_s / interval_s)) + 1
    return max(k + 1, due)


class TelemetrySampler:
    """Samples a :class:`TelemetrySource` on a daemon thread every ``interval_s`` seconds.

    Ticks are scheduled at ``start + k * interval_s`` (no drift; ticks missed because a read was
    slow are skipped and counted). A read that raises records nothing for that tick and is
    counted in ``run_summary()['read_errors']``; the thread goes on. ``clock`` gives seconds
    (monotonic) and ``sleep(seconds)`` waits between ticks (returning True stops the thread);
    by default it waits on the stop event, so :meth:`stop` returns promptly. Both are for tests.
    """

    def __init__(
        self,
        source: TelemetrySource | None,
        interval_s: float = DEFAULT_INTERVAL_S,
        unavailable_reason: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        sleep: Callable[[float], Any] | None = None,
        tag_reader: Callable[[], tuple[str | None, str | None]] | None = None,
    ):
        if not (interval_s > 0 and math.isfinite(interval_s)):
            raise ValueError(f"interval_s must be a positive number of seconds, got {interval_s!r}")
        self.interval_s = float(interval_s)
        self._reason = unavailable_reason
        if source is None and self._reason is None:
            self._reason = "no telemetry source"
        if self._reason is not None and source is not None:
            source.close()
            source = None
        self._source = source
        self._available = self._reason is None
        self._clock = clock
        self._stop_event = threading.Event()
        self._sleep = sleep if sleep is not None else self._stop_event.wait
        self._lock = threading.Lock()
        self._samples: list[dict[str, Any]] = []
        self._tag: tuple[str | None, str | None] = (None, None)
        # Where the tag comes from when another process runs the cases (a worker's shared tag).
        self._tag_reader = tag_reader
        self._thread: threading.Thread | None = None
        self._t0: float | None = None
        self._read_errors = 0
        self._last_error: str | None = None
        self._skipped_ticks = 0
        self._extra_columns: list[str] = []
        self._energy_log = CounterLog(clock)

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def for_device(cls, device: Any, interval_s: float = DEFAULT_INTERVAL_S) -> TelemetrySampler:
        """A sampler for a torch device (or its string). Never raises for a missing GPU/NVML: the
        sampler is then unavailable, with the reason."""
        text = str(device)
        kind, _, idx = text.partition(":")
        if kind != "cuda":
            return cls(None, interval_s, unavailable_reason=f"device is {kind} (NVML reports NVIDIA GPUs only)")
        try:
            source = nvml_source_for(text)
        except TelemetryUnavailable as e:
            return cls(None, interval_s, unavailable_reason=str(e))
        except Exception as e:  # never let telemetry take a run down
            return cls(None, interval_s, unavailable_reason=f"NVML unavailable: {type(e).__name__}: {e}")
        return cls(source, interval_s)

    # -- state ------------------------------------------------------------------------------
    @property
    def available(self) -> bool:
        """True when a source was opened (stays True after close(): the samples are real)."""
        return self._available

    @property
    def reason(self) -> str | None:
        return self._reason

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def samples(self) -> list[dict[str, Any]]:
        """A copy of the samples so far (each a fresh dict)."""
        with self._lock:
            return [dict(s, throttle_reasons=list(s["throttle_reasons"])) for s in self._samples]

    @property
    def energy_log(self) -> CounterLog | None:
        """The energy counter's reads (each with the host-clock instants around it, on ``clock``)
        while the thread takes them every tick; None when it does not (unavailable, not started,
        stopped): then nothing is read during the timed calls."""
        return self._energy_log if self.running else None

    def set_tag(self, case_id: str | None, variant: str | None) -> None:
        """Tag the samples taken from now on. One attribute store: cheap enough for a hot loop."""
        self._tag = (case_id, variant)

    # -- thread -----------------------------------------------------------------------------
    def start(self) -> None:
        """Start the sampling thread (no thread when unavailable; no second thread if running)."""
        if self._source is None or self.running:
            return
        self._stop_event.clear()
        if self._t0 is None:
            self._t0 = self._clock()
        self._thread = threading.Thread(target=self._loop, name="gpubench-telemetry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it. Safe without start() and when called twice."""
        self._stop_event.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=max(5.0, 20 * self.interval_s))

    def close(self) -> None:
        """Stop, then release the source (NVML). Samples and summaries stay readable."""
        self.stop()
        if self._source is not None:
            try:
                self._source.close()
            except Exception:
                pass
            self._source = None

    def __enter__(self) -> TelemetrySampler:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _loop(self) -> None:
        t0 = self._t0 if self._t0 is not None else self._clock()
        k = int(math.floor((self._clock() - t0) / self.interval_s))  # resume on the grid
        while not self._stop_event.is_set():
            self.sample_once()
            nxt = next_tick_index(k, self._clock() - t0, self.interval_s)
            with self._lock:
                self._skipped_ticks += nxt - k - 1
            k = nxt
            delay = t0 + k * self.interval_s - self._clock()
            if delay > 0 and self._sleep(delay):
                break

    def sample_once(self) -> dict[str, Any] | None:
        """Take one sample now (the thread calls this every tick). Returns the sample, or None
        when unavailable or the read failed (counted)."""
        source = self._source
        if source is None:
            return None
        now = self._clock()
        if self._t0 is None:
            self._t0 = now
        case, variant = self._tag_reader() if self._tag_reader is not None else self._tag
        try:
            values = source.read()
        except Exception as e:
            with self._lock:
                self._read_errors += 1
                self._last_error = f"{type(e).__name__}: {e}"
            return None
        energy = self._energy_log.read(functools.partial(self._energy_of, source))
        sample: dict[str, Any] = {"t_s": now - self._t0, "case": case, "variant": variant}
        for key in SOURCE_FIELDS:
            sample[key] = values.get(key)
        sample["energy_mj"] = energy
        mask = sample.get("throttle_mask")
        sample["throttle_reasons"] = decode_throttle_reasons(mask)
        extras = [k for k in values if k not in sample]
        for key in extras:
            sample[key] = values[key]
        with self._lock:
            for key in extras:
                if key not in self._extra_columns:
                    self._extra_columns.append(key)
            self._samples.append(sample)
        return sample

    def energy_mj(self) -> float | None:
        """The source's cumulative energy counter read now, in mJ (None if unavailable)."""
        source = self._source
        return None if source is None else self._energy_of(source)

    @staticmethod
    def _energy_of(source: TelemetrySource) -> float | None:
        try:
            return source.energy_mj()
        except Exception:
            return None

    def power_limit_w(self) -> float | None:
        """The board's power limit in W from the source (None if unavailable or not reported)."""
        reader = getattr(self._source, "power_limit_w", None)  # optional in a TelemetrySource
        if reader is None:
            return None
        try:
            return reader()
        except Exception:
            return None

    # -- summaries --------------------------------------------------------------------------
    def case_summary(self, case_id: str) -> Telemetry:
        """Aggregates over the samples tagged with ``case_id``, with a ``variants`` breakdown
        (power, SM clock, throttling per variant tag)."""
        return case_summary(self.samples, case_id)

    def run_summary(self) -> dict[str, Any]:
        """Whole-run figures plus status and how sampling went (JSON-safe)."""
        samples = self.samples
        with self._lock:
            read_errors, last_error, skipped = self._read_errors, self._last_error, self._skipped_ticks
        src = self._source
        out: dict[str, Any] = {
            "status": "ok" if self._reason is None else "unavailable",
            "reason": self._reason,
            "interval_s": self.interval_s,
            "read_errors": read_errors,
            "last_read_error": last_error,
            "skipped_ticks": skipped,
        }
        out.update(aggregate(samples))
        info = getattr(src, "info", None)
        if isinstance(info, dict):
            out["device"] = dict(info)
        unsupported = getattr(src, "unsupported", None)
        if unsupported is not None:
            out["unsupported_fields"] = sorted(unsupported)
        return out

    # -- export -----------------------------------------------------------------------------
    def columns(self) -> list[str]:
        with self._lock:
            return list(SAMPLE_COLUMNS) + list(self._extra_columns)

    def to_dataframe(self):
        """One row per sample (telemetry.csv's), in :meth:`columns` order."""
        return samples_dataframe(self.samples, self.columns())

    def write_csv(self, path: str | os.PathLike) -> None:
        """Write the samples as CSV, atomically. With no samples (or no telemetry) the file has the
        header row only, so readers always find the same columns; run_summary() says why."""
        atomic_write_text(path, self.to_dataframe().to_csv(index=False))
