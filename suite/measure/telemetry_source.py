"""What a telemetry source is (:class:`TelemetrySource`: one read per tick, a cumulative energy
counter) and the real one, :class:`NvmlSource`, over NVML (nvidia-ml-py, imported as ``pynvml``),
with the mapping from a CUDA device to its NVML GPU (torch's UUID, else CUDA_VISIBLE_DEVICES).

Tests inject a fake source (or a fake ``pynvml``): that is how the sampler is tested on a CPU.
Units: power in W, energy in mJ, clocks in MHz, temperature in degrees C, utilization in %, memory
used in MiB (2**20 bytes, as nvidia-smi).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

# Fields a source's read() returns (any may be None where the GPU does not support it).
SOURCE_FIELDS: tuple[str, ...] = (
    "power_w",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "temp_c",
    "util_gpu_pct",
    "util_mem_pct",
    "mem_used_mb",
    "throttle_mask",
)


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

    def close(self) -> None: ...


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
                import pynvml  # nvidia-ml-py
            except ImportError as e:
                raise TelemetryUnavailable("nvidia-ml-py not installed") from e
            nvml = pynvml
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
        for key, fn in (
            ("name", "nvmlDeviceGetName"),
            ("uuid", "nvmlDeviceGetUUID"),
            ("nvml_index", "nvmlDeviceGetIndex"),
        ):
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
            (
                ("util_gpu_pct", "util_mem_pct"),
                lambda: (lambda u: (u.gpu, u.memory))(nv.nvmlDeviceGetUtilizationRates(h)),
            ),
            (("mem_used_mb",), lambda: nv.nvmlDeviceGetMemoryInfo(h).used / 2**20),
        ]
        reasons = self._reasons_fn
        if reasons is not None:
            readers.append((("throttle_mask",), lambda: int(reasons(h))))
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
        raise TelemetryUnavailable(f"cuda:{cuda_index} is not among CUDA_VISIBLE_DEVICES={visible_devices!r}")
    entry = entries[cuda_index]
    try:
        return int(entry), None
    except ValueError:
        return None, entry


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
