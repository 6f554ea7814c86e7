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

The sampling logic talks to a :class:`TelemetrySource`; :class:`NvmlSource` is the real one and
tests inject a fake, which is how the sampler is tested on a CPU. Energy per call, timed against
the counter's steps and checked against the board's power limit, is :mod:`gpubench.energy`.

Units: power in W, energy in mJ (NVML's counter, cumulative since the driver loaded), clocks in
MHz, temperature in degrees C, utilization in %, memory used in MiB (2**20 bytes, as nvidia-smi).
"""
from __future__ import annotations

import math
import os
import threading
import time
from typing import Any, Callable, Iterable, Protocol, runtime_checkable

from gpubench.atomic import atomic_write_text

DEFAULT_INTERVAL_S = 0.05

# Fields a source's read() returns (any may be None where the GPU does not support it).
SOURCE_FIELDS: tuple[str, ...] = (
    "power_w", "sm_clock_mhz", "mem_clock_mhz", "temp_c", "util_gpu_pct", "util_mem_pct",
    "mem_used_mb", "throttle_mask",
)
# Columns of every sample, in CSV order. energy_mj is read by the sampler next to read().
SAMPLE_COLUMNS: tuple[str, ...] = (
    ("t_s", "case", "variant") + SOURCE_FIELDS[:1] + ("energy_mj",) + SOURCE_FIELDS[1:]
    + ("throttle_reasons",)
)
_INT_COLUMNS = ("sm_clock_mhz", "mem_clock_mhz", "temp_c", "util_gpu_pct", "util_mem_pct", "throttle_mask")

# NVML clock-event reason bits (nvmlClocksEventReason*, formerly nvmlClocksThrottleReason*).
# The values are part of NVML's ABI; they are spelled out so decoding works without pynvml.
THROTTLE_BITS: dict[int, str] = {
    0x0001: "gpu_idle",
    0x0002: "applications_clocks_setting",
    0x0004: "sw_power_cap",
    0x0008: "hw_slowdown",
    0x0010: "sync_boost",
    0x0020: "sw_thermal_slowdown",
    0x0040: "hw_thermal_slowdown",
    0x0080: "hw_power_brake",
    0x0100: "display_clocks_setting",
    0x0200: "board_limit",
    0x0400: "reliability",
}
# Reasons that say nothing bad about a measurement: an idle GPU, clocks the user or the display
# asked for. Everything else means the GPU ran slower than it could.
BENIGN_REASONS: frozenset[str] = frozenset({"gpu_idle", "applications_clocks_setting", "display_clocks_setting"})


def decode_throttle_reasons(mask: int | None) -> list[str]:
    """Names of the bits set in an NVML clock-event bitmask, lowest bit first. Unknown bits
    become ``unknown_0x...``; ``None`` (not supported) gives an empty list."""
    if mask is None:
        return []
    mask = int(mask)
    names = []
    bit = 1
    while bit <= mask:
        if mask & bit:
            names.append(THROTTLE_BITS.get(bit, f"unknown_{bit:#x}"))
        bit <<= 1
    return names


def split_reasons(names: Iterable[str]) -> tuple[list[str], list[str]]:
    """(harmful, benign) reason names, each sorted and without duplicates."""
    names = set(names)
    return sorted(names - BENIGN_REASONS), sorted(names & BENIGN_REASONS)


def next_tick_index(k: int, elapsed_s: float, interval_s: float) -> int:
    """Index of the next tick to run after tick ``k`` when ``elapsed_s`` seconds have passed since
    the sampler started. Ticks lie at ``start + k * interval``, never drifting; ticks whose time has
    already passed are skipped rather than run late in a burst."""
    due = int(math.floor(elapsed_s / interval_s)) + 1
    return max(k + 1, due)


class TelemetryUnavailable(Exception):
    """Telemetry cannot be read on this machine; the message says why."""


@runtime_checkable
class TelemetrySource(Protocol):
    def read(self) -> dict[str, Any]:
        """One sample: the keys of :data:`SOURCE_FIELDS`, any of which may be None."""
        ...

    def energy_mj(self) -> float | None:
        """Cumulative energy counter in mJ, None if unsupported. A source may also offer
        ``power_limit_w()`` (the board's limit in W, or None): energy figures are checked against it."""
        ...

    def close(self) -> None:
        ...


# --------------------------------------------------------------------------------------------
# NVML source
# --------------------------------------------------------------------------------------------

_NVML_SUCCESS = 0
_NVML_ERROR_NOT_SUPPORTED = 3
_NVML_ERROR_FUNCTION_NOT_FOUND = 13


def _nvml_value(nv: Any, field: Any) -> float | None:
    """The number in an nvmlFieldValue_t, read through the union member its valueType names."""
    member = {
        getattr(nv, "NVML_VALUE_TYPE_DOUBLE", 0): "dVal",
        getattr(nv, "NVML_VALUE_TYPE_UNSIGNED_INT", 1): "uiVal",
        getattr(nv, "NVML_VALUE_TYPE_UNSIGNED_LONG", 2): "ulVal",
        getattr(nv, "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", 3): "ullVal",
        getattr(nv, "NVML_VALUE_TYPE_SIGNED_LONG_LONG", 4): "sllVal",
        getattr(nv, "NVML_VALUE_TYPE_SIGNED_INT", 5): "siVal",
        getattr(nv, "NVML_VALUE_TYPE_UNSIGNED_SHORT", 6): "usVal",
    }.get(int(field.valueType))
    if member is None:
        return None
    return float(getattr(field.value, member))


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, (bytes, bytearray)) else str(value)


class NvmlSource:
    """A :class:`TelemetrySource` over NVML for one GPU.

    The GPU is found by ``uuid`` when given (a full NVML UUID such as ``GPU-...`` or ``MIG-...``,
    or a unique prefix of one, as CUDA_VISIBLE_DEVICES allows), else by NVML ``index``. Raises
    :class:`TelemetryUnavailable` when nvidia-ml-py is missing, NVML does not initialize, or the GPU
    is not found. A field the GPU does not support is reported as None and not asked for again.
    ``nvml`` replaces the ``pynvml`` module (tests).
    """

    def __init__(self, index: int | None = 0, uuid: str | None = None, *, nvml: Any = None):
        if nvml is None:
            try:
                import pynvml as nvml  # nvidia-ml-py
            except ImportError as e:
                raise TelemetryUnavailable("nvidia-ml-py not installed") from e
        self._nv = nvml
        try:
            nvml.nvmlInit()
        except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            raise TelemetryUnavailable(f"NVML unavailable: {e}") from e
        self._open = True
        self.info: dict[str, Any] = {}
        self.unsupported: set[str] = set()
        self.field_errors = 0
        try:
            self._handle = self._find(index, uuid)
            self._probe()
        except TelemetryUnavailable:
            self.close()
            raise
        except Exception as e:
            self.close()
            raise TelemetryUnavailable(f"NVML unavailable: {e}") from e

    # -- setup ------------------------------------------------------------------------------
    def _find(self, index: int | None, uuid: str | None) -> Any:
        nv = self._nv
        handle, problems = None, []
        if uuid:
            try:
                handle = nv.nvmlDeviceGetHandleByUUID(uuid)
                self.info["matched_by"] = "uuid"
            except nv.NVMLError as e:
                handle = self._find_uuid_prefix(uuid)
                if handle is None:
                    problems.append(f"no GPU with UUID {uuid} ({e})")
                else:
                    self.info["matched_by"] = "uuid_prefix"
        if handle is None and index is not None:
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(int(index))
                self.info["matched_by"] = "index"
            except nv.NVMLError as e:
                problems.append(f"no GPU at NVML index {index} ({e})")
        if handle is None:
            raise TelemetryUnavailable("NVML: " + ("; ".join(problems) or "no GPU named"))
        # Power, clocks and temperature belong to the whole GPU; read them from the parent of a
        # MIG instance (its own handle answers NOT_SUPPORTED for most of them).
        self.info["mig"] = False
        is_mig = getattr(nv, "nvmlDeviceIsMigDeviceHandle", None)
        if is_mig is not None:
            try:
                flag = is_mig(handle)
                if int(getattr(flag, "value", flag)):
                    handle = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
                    self.info["mig"] = True
            except nv.NVMLError:
                pass
        for key, fn in (("name", "nvmlDeviceGetName"), ("uuid", "nvmlDeviceGetUUID"), ("nvml_index", "nvmlDeviceGetIndex")):
            try:
                value = getattr(nv, fn)(handle)
                self.info[key] = value if key == "nvml_index" else _text(value)
            except Exception:
                self.info[key] = None
        return handle

    def _find_uuid_prefix(self, prefix: str) -> Any:
        nv = self._nv
        try:
            matches = []
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                if _text(nv.nvmlDeviceGetUUID(h)).startswith(prefix):
                    matches.append(h)
            return matches[0] if len(matches) == 1 else None
        except Exception:
            return None

    def _probe(self) -> None:
        """Decide once how power and clock-event reasons are read on this GPU/driver."""
        nv = self._nv
        self._power_field = None
        fid = getattr(nv, "NVML_FI_DEV_POWER_INSTANT", None)
        if fid is not None:
            try:
                v = nv.nvmlDeviceGetFieldValues(self._handle, [fid])[0]
                if int(v.nvmlReturn) == _NVML_SUCCESS and _nvml_value(nv, v) is not None:
                    self._power_field = fid
            except Exception:
                pass
        self.info["power_source"] = "instant" if self._power_field is not None else "power_usage"
        self._reasons_fn = None
        for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn = getattr(nv, name, None)
            if fn is None:
                continue
            try:
                fn(self._handle)
            except nv.NVMLError as e:
                if self._permanent(e):
                    continue  # an older driver lacks the newer entry point
            self._reasons_fn = fn
            break
        self._fields = self._readers()

    @staticmethod
    def _permanent(e: Exception) -> bool:
        code = getattr(e, "value", None)
        return code in (_NVML_ERROR_NOT_SUPPORTED, _NVML_ERROR_FUNCTION_NOT_FOUND)

    # -- reading ----------------------------------------------------------------------------
    def _power_w(self) -> float | None:
        nv = self._nv
        if self._power_field is not None:
            v = nv.nvmlDeviceGetFieldValues(self._handle, [self._power_field])[0]
            if int(v.nvmlReturn) == _NVML_SUCCESS:
                mw = _nvml_value(nv, v)
                if mw is not None:
                    return mw / 1000.0
        return nv.nvmlDeviceGetPowerUsage(self._handle) / 1000.0

    def _readers(self) -> list[tuple[tuple[str, ...], Callable[[], Any]]]:
        nv, h = self._nv, self._handle
        readers: list[tuple[tuple[str, ...], Callable[[], Any]]] = [
            (("power_w",), self._power_w),
            (("sm_clock_mhz",), lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            (("mem_clock_mhz",), lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
            (("temp_c",), lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            (("util_gpu_pct", "util_mem_pct"), lambda: (lambda u: (u.gpu, u.memory))(nv.nvmlDeviceGetUtilizationRates(h))),
            (("mem_used_mb",), lambda: nv.nvmlDeviceGetMemoryInfo(h).used / 2**20),
        ]
        if self._reasons_fn is not None:
            readers.append((("throttle_mask",), lambda: int(self._reasons_fn(h))))
        else:
            self.unsupported.add("throttle_mask")
        return readers

    def read(self) -> dict[str, Any]:
        """One sample. A field that fails is None for this tick (and never asked again if the GPU
        does not support it); if every field fails, the first error is raised."""
        nv = self._nv
        out: dict[str, Any] = {k: None for k in SOURCE_FIELDS}
        tried, failures = 0, []
        for keys, fn in self._fields:
            if keys[0] in self.unsupported:
                continue
            tried += 1
            try:
                value = fn()
            except nv.NVMLError as e:
                if self._permanent(e):
                    self.unsupported.update(keys)
                else:
                    self.field_errors += 1
                    failures.append(e)
                continue
            values = value if len(keys) > 1 else (value,)
            out.update(zip(keys, values))
        if failures and len(failures) == tried:
            raise failures[0]
        return out

    def energy_mj(self) -> float | None:
        if not self._open or "energy_mj" in self.unsupported:
            return None
        try:
            return float(self._nv.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except self._nv.NVMLError as e:
            if self._permanent(e):
                self.unsupported.add("energy_mj")
            return None

    def power_limit_w(self) -> float | None:
        """The board's power limit in W: the enforced limit (what the power limiter holds the
        average to, after any cap set on the board), else the power-management limit; None where
        NVML answers neither. Read each time: an administrator may change it during a run."""
        if not self._open:
            return None
        for name in ("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit"):
            fn = getattr(self._nv, name, None)
            if fn is None:
                continue
            try:
                milliwatts = fn(self._handle)
            except self._nv.NVMLError:
                continue
            if milliwatts:
                return float(milliwatts) / 1000.0
        return None

    @property
    def handle(self) -> Any:
        """The NVML device handle (for one-off queries such as env capture)."""
        return self._handle

    def close(self) -> None:
        if self._open:
            self._open = False
            try:
                self._nv.nvmlShutdown()
            except Exception:
                pass


def resolve_cuda_index(cuda_index: int, visible_devices: str | None) -> tuple[int | None, str | None]:
    """Map CUDA device ``cuda_index`` to an NVML target, through CUDA_VISIBLE_DEVICES when set:
    ``(nvml_index, None)`` for a list of integers, ``(None, uuid)`` for UUID entries.
    Raises :class:`TelemetryUnavailable` when the index is past the end of the list."""
    if visible_devices is None or not visible_devices.strip():
        return cuda_index, None
    entries = [e.strip() for e in visible_devices.split(",") if e.strip()]
    if not 0 <= cuda_index < len(entries):
        raise TelemetryUnavailable(
            f"cuda:{cuda_index} is not among CUDA_VISIBLE_DEVICES={visible_devices!r}")
    entry = entries[cuda_index]
    try:
        return int(entry), None
    except ValueError:
        return None, entry


# --------------------------------------------------------------------------------------------
# Sampler
# --------------------------------------------------------------------------------------------

def _clean(values: Iterable[Any]) -> list[float]:
    out = []
    for v in values:
        if v is None:
            continue
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            out.append(f)
    return out


def _mean(values: Iterable[Any]) -> float | None:
    v = _clean(values)
    return sum(v) / len(v) if v else None


def _max(values: Iterable[Any]) -> float | None:
    v = _clean(values)
    return max(v) if v else None


def _min(values: Iterable[Any]) -> float | None:
    v = _clean(values)
    return min(v) if v else None


def _aggregate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Figures over a list of samples (all JSON-safe: None where there is nothing to aggregate)."""
    col = lambda k: [s.get(k) for s in samples]  # noqa: E731
    reasons: set[str] = set()
    n_throttled = 0
    for s in samples:
        names = s.get("throttle_reasons") or []
        reasons.update(names)
        if any(n not in BENIGN_REASONS for n in names):
            n_throttled += 1
    harmful, benign = split_reasons(reasons)
    energy = _clean(col("energy_mj"))
    t = _clean(col("t_s"))
    return {
        "n_samples": len(samples),
        "duration_s": (max(t) - min(t)) if t else None,
        "power_w_mean": _mean(col("power_w")),
        "power_w_max": _max(col("power_w")),
        # Energy seen between the first and last sample (a sampled estimate; the runner's
        # per-variant energy reads the counter around the calls themselves).
        "energy_j_sampled": ((energy[-1] - energy[0]) / 1000.0) if len(energy) >= 2 else None,
        "temp_c_max": _max(col("temp_c")),
        "sm_clock_mhz_min": _min(col("sm_clock_mhz")),
        "sm_clock_mhz_mean": _mean(col("sm_clock_mhz")),
        "mem_clock_mhz_min": _min(col("mem_clock_mhz")),
        "mem_used_mb_max": _max(col("mem_used_mb")),
        "util_gpu_pct_mean": _mean(col("util_gpu_pct")),
        "throttled": bool(harmful),
        "throttled_fraction": (n_throttled / len(samples)) if samples else None,
        "throttle_reasons": harmful,
        "benign_reasons": benign,
    }


class TelemetrySampler:
    """Samples a :class:`TelemetrySource` on a daemon thread every ``interval_s`` seconds.

    Ticks are scheduled at ``start + k * interval_s`` (no drift; ticks missed because a read was
    slow are skipped and counted). A read that raises records nothing for that tick and is
    counted in ``run_summary()['read_errors']``; the thread goes on. ``clock`` gives seconds
    (monotonic) and ``sleep(seconds)`` waits between ticks (returning True stops the thread);
    by default it waits on the stop event, so :meth:`stop` returns promptly. Both are for tests.
    """

    def __init__(self, source: TelemetrySource | None, interval_s: float = DEFAULT_INTERVAL_S,
                 unavailable_reason: str | None = None, clock: Callable[[], float] = time.monotonic,
                 *, sleep: Callable[[float], Any] | None = None,
                 tag_reader: Callable[[], tuple[str | None, str | None]] | None = None):
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

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def for_device(cls, device: Any, interval_s: float = DEFAULT_INTERVAL_S) -> "TelemetrySampler":
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

    def __enter__(self) -> "TelemetrySampler":
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
        try:
            energy = source.energy_mj()
        except Exception:
            energy = None
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
        if source is None:
            return None
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
    def case_summary(self, case_id: str) -> dict[str, Any]:
        """Aggregates over the samples tagged with ``case_id``, with a ``variants`` breakdown
        (power, SM clock, throttling per variant tag)."""
        samples = [s for s in self.samples if s["case"] == case_id]
        out = _aggregate(samples)
        by_variant: dict[str, list[dict[str, Any]]] = {}
        for s in samples:
            by_variant.setdefault(str(s["variant"]), []).append(s)
        out["variants"] = {
            name: {k: agg[k] for k in ("n_samples", "power_w_mean", "power_w_max", "sm_clock_mhz_mean",
                                        "temp_c_max", "throttled", "throttle_reasons")}
            for name, group in by_variant.items()
            for agg in (_aggregate(group),)
        }
        return out

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
        out.update(_aggregate(samples))
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
        """One row per sample; ``throttle_reasons`` joined with ``|``. Integer columns use pandas'
        nullable Int64 so unsupported readings stay empty instead of turning floats."""
        import pandas as pd

        columns = self.columns()
        rows = [dict(s, throttle_reasons="|".join(s["throttle_reasons"])) for s in self.samples]
        df = pd.DataFrame(rows, columns=columns)
        for c in _INT_COLUMNS:
            try:
                df[c] = df[c].astype("Int64")
            except (TypeError, ValueError):
                pass  # a source that reports fractional values keeps floats
        return df

    def write_csv(self, path: str | os.PathLike) -> None:
        """Write the samples as CSV, atomically. With no samples (or no telemetry) the file has the
        header row only, so readers always find the same columns; run_summary() says why."""
        atomic_write_text(path, self.to_dataframe().to_csv(index=False))


def nvml_source_for(device: Any) -> NvmlSource:
    """The :class:`NvmlSource` of a CUDA torch device (``cuda`` or ``cuda:N``); raises
    :class:`TelemetryUnavailable` when NVML or the GPU cannot be had."""
    try:
        import pynvml  # noqa: F401
    except ImportError as e:
        raise TelemetryUnavailable("nvidia-ml-py not installed") from e
    _, _, idx = str(device).partition(":")
    cuda_index = int(idx) if idx else _current_cuda_index()
    torch_uuid = _torch_gpu_uuid(cuda_index)
    if torch_uuid is not None:
        # CUDA's own name for the device beats any index mapping (CUDA orders devices
        # fastest-first by default, NVML by PCI bus).
        try:
            return NvmlSource(index=None, uuid=torch_uuid)
        except TelemetryUnavailable:
            pass
    index, uuid = resolve_cuda_index(cuda_index, os.environ.get("CUDA_VISIBLE_DEVICES"))
    return NvmlSource(index=index, uuid=uuid)


def _current_cuda_index() -> int:
    try:
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.current_device())
    except Exception:
        pass
    return 0


def _torch_gpu_uuid(cuda_index: int) -> str | None:
    """NVML-style UUID (``GPU-...``) of CUDA device ``cuda_index`` as torch sees it, or None."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        uuid = getattr(torch.cuda.get_device_properties(cuda_index), "uuid", None)
        if uuid is None:
            return None
        text = str(uuid)
        if not text or text.startswith(("GPU-", "MIG-")):
            return text or None
        return "GPU-" + text
    except Exception:
        return None
