"""The run's records and its directory (schema documented in docs/results.md).

:class:`RunRecord`, :class:`CaseRecord` and :class:`VariantRecord` are what the runner fills;
``to_dict`` gives the results.json form that ``compare`` and ``report`` read.
``runs/<timestamp>-<scenario>/`` holds ``results.json`` (everything, raw samples included),
``results.csv`` (one row per case x variant), ``telemetry.csv`` and ``env.json``. Every write is
atomic: a crash leaves the last complete file. A full disk (:class:`gpubench.records.atomic.DiskFull`)
stops the run, and :meth:`RunDirectory.close_on_full_disk` keeps what can still be kept.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import re
import statistics
from collections.abc import ItemsView, Iterator, KeysView, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from gpubench.errors import BadInput
from gpubench.records import stats as _stats
from gpubench.records.atomic import (
    DiskFull,
    append_line,
    as_disk_full,
    atomic_write_chunks,
    atomic_write_json,
    atomic_write_text,
    disk_full,
)
from gpubench.records.declarations import (
    Declarations,
    Registry,
    TechniqueRecord,
    declare,
    legacy_claims_elsewhere,
    legacy_record,
)
from gpubench.records.energy import EnergyMeasurement
from gpubench.records.model_origin import ModelOrigin

if TYPE_CHECKING:  # pandas is imported where a frame is made: the CLI starts without it
    import pandas as pd

# 2: variants are named by what they run (their role is a field), side data recorded per timed
# call (``recorded``), the technique's ``source``. 3: the run records the declarations of its
# techniques (``techniques``) and the claims of those it left out (``claims_elsewhere``), so a
# report needs no technique code. Versions 1 and 2 are still read (upgraded on read).
SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
CASES_LOG = "cases.jsonl"
RESERVE = ".gpubench-reserve"  # room set aside at the start to close the record if the disk fills
RESERVE_BYTES = 256 * 1024


# What older records' timing.method says of their clock (VariantRecord.basis).
LEGACY_BASIS = {"perf_counter_ns": "host", "cuda_event": "cuda_event_legacy"}
OTHER_BASIS = {"device": "wall", "wall": "device"}
# What each clock is, as the report and the terminal say it (gpubench.measure.timing.Clock measures them).
BASIS_TEXT = {
    "device": "device time: CUDA events, launch work excluded",
    "wall": "wall time: host launch and syncs included",
    "host": "one clock: perf_counter on the host; on a CPU device and wall time are the same figure",
    "cuda_event_legacy": "the older CUDA clock: events started after a host sync (launch work included, "
    "the final sync not), neither device nor wall time",
}
# The share of wall time outside device time (launch work, host syncs) at which the report shows
# the other clock's figure beside the headline's.
MATERIAL_SHARE = 0.10


def _fields(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``data`` that are fields of ``cls``: a file of a newer minor version may carry
    keys this version does not know, and they are ignored, never a crash."""
    known = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in known}


def _typed(cls: Any, data: Any) -> Any:
    """``cls.from_dict(data)`` for a dict, None for None (an optional record)."""
    return cls.from_dict(data) if isinstance(data, Mapping) else None


# -- the figures of a record, typed to the leaves --------------------------------------------------
# Each is read and written through one from_dict / to_dict and the file keeps its schema: a writer's
# object gives its fields in the order declared (a field marked OMIT_NONE left out while None, as the
# writer always left it out), then ``extra`` (keys of an open dict: a newer minor version's, a
# technique's); one read from a file gives back the keys it was read with, in their order, so a
# record read and written again is the same document.
OMIT_NONE = {"omit_none": True}
_F = TypeVar("_F", bound="Figures")


@dataclass
class Figures:
    """The base of a record's typed figures: ``extra`` holds the keys no field names (never
    dropped, never a crash); ``read_keys`` the key order of the dict it was read from (None: built by
    a writer)."""

    extra: dict[str, Any] = field(default_factory=dict, kw_only=True)
    read_keys: tuple[str, ...] | None = field(default=None, kw_only=True, repr=False, compare=False)

    @classmethod
    def typed_fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in ("extra", "read_keys"))

    @classmethod
    def _field_values(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        """The typed values of the fields ``data`` holds (a subclass converts nested ones)."""
        return dict(data)

    @classmethod
    def from_dict(cls: type[_F], data: Mapping[str, Any]) -> _F:
        names = cls.typed_fields()
        known = cls._field_values({k: v for k, v in data.items() if k in names})
        return cls(
            **known, extra={str(k): v for k, v in data.items() if k not in names}, read_keys=tuple(str(k) for k in data)
        )

    def _value(self, name: str) -> Any:
        value = getattr(self, name)
        if isinstance(value, Figures):
            return value.to_dict()
        if isinstance(value, list):
            return [v.to_dict() if isinstance(v, Figures) else v for v in value]
        if isinstance(value, dict):
            return {k: v.to_dict() if isinstance(v, Figures) else v for k, v in value.items()}
        return value

    def to_dict(self) -> dict[str, Any]:
        names = self.typed_fields()
        if self.read_keys is None:
            omit = {f.name for f in dataclasses.fields(self) if f.metadata.get("omit_none")}
            order = [n for n in names if not (n in omit and getattr(self, n) is None)] + list(self.extra)
        else:  # as read, then what was set since
            order = list(self.read_keys)
            order += [n for n in names if n not in self.read_keys and getattr(self, n) != _default(self, n)]
            order += [k for k in self.extra if k not in order]
        return {k: self._value(k) if k in names else self.extra[k] for k in order if k in names or k in self.extra}

    # Reads by key, for scripts and plug-ins written against the dicts these were (gpubench's own
    # readers read the fields).
    def get(self, key: str, default: Any = None) -> Any:
        """``default`` where the dict this stands for has no ``key`` (a typed field a file left out)."""
        if key not in self:
            return default
        return getattr(self, key) if key in self.typed_fields() else self.extra[key]

    def keys(self) -> KeysView[str]:
        return self.to_dict().keys()

    def items(self) -> ItemsView[str, Any]:
        return self.to_dict().items()

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __getitem__(self, key: str) -> Any:
        if key in self.typed_fields():
            return getattr(self, key)
        return self.extra[key]

    def __contains__(self, key: object) -> bool:
        return key in self.to_dict()


def _default(obj: Any, name: str) -> Any:
    """The default of dataclass field ``name`` of ``obj`` (a field without one: None)."""
    f = next(f for f in dataclasses.fields(obj) if f.name == name)
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def _number(value: Any) -> float | None:
    """A figure that is a number (never a bool), else None."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass
class Check(Figures):
    """A variant's output checked against the reference (gpubench.checks.CheckResult as recorded)."""

    passed: bool | None = None
    error: float | None = None  # the error figure (relative L2 error, a count of mismatches)
    tolerance: float | None = None  # None for exact comparisons
    metric: str = ""  # what ``error`` measures (rel_l2, mismatched_tokens, reference)
    detail: str = ""


@dataclass
class Stats(Figures):
    """A variant's samples summarized (gpubench.records.stats.SampleStats as recorded): the median's 95%
    bootstrap CI is None under MIN_CI_SAMPLES samples. A pytest-benchmark run holds median and n only."""

    n: int | None = None
    median: float | None = None
    mean: float | None = None
    std: float | None = None
    min: float | None = None
    max: float | None = None
    q25: float | None = None
    q75: float | None = None
    iqr: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    iqr_over_median: float | None = None


@dataclass
class Timing(Figures):
    """How a variant was timed: ``method`` (perf_counter_ns, cuda_event, none: checked only,
    ``not_timed`` says why), the L2 flush, CUDA graphs ("off", "on", "failed: ..."), whether a
    launch outlasted the flush, the repetitions timed on both clocks in one call."""

    method: str = ""
    l2_flush: bool | None = field(default=None, metadata=OMIT_NONE)
    cuda_graph: str | None = field(default=None, metadata=OMIT_NONE)
    launch_outlasted_flush: Any = field(default=None, metadata=OMIT_NONE)
    both_clocks_one_call: int | None = field(default=None, metadata=OMIT_NONE)
    not_timed: str | None = field(default=None, metadata=OMIT_NONE)


@dataclass
class TopOp(Figures):
    """One of a profile's top ops: self time per call, its share of all, how often per call."""

    name: str = ""
    self_us_per_call: float | None = None
    share: float | None = None
    count_per_call: float | None = None


@dataclass
class Profile(Figures):
    """A variant's profile (gpubench.measure.profiling's per-call summary), or ``error`` alone where
    profiling failed (which fails nothing)."""

    calls: int | None = None
    time_basis: str | None = None  # device or cpu
    top_ops: list[TopOp] = field(default_factory=list)
    ops_per_call: float | None = None
    kernel_launches_per_call: float | None = None  # None on a CPU
    syncs_per_call: float | None = None
    sync_ops: dict[str, float] = field(default_factory=dict)
    sync_counting: str = ""
    event_waits_per_call: float | None = None
    copies_per_call: dict[str, Any] = field(default_factory=dict)  # by direction (h2d, d2h, ...): open
    peak_memory_bytes: int | None = None
    peak_memory_basis: str | None = None
    notes: list[str] = field(default_factory=list)
    trace: str | None = field(default=None, metadata=OMIT_NONE)  # the trace file, relative to the run
    error: str | None = field(default=None, metadata=OMIT_NONE)

    @classmethod
    def failed(cls, error: str) -> Profile:
        return cls(error=error, read_keys=("error",))

    @classmethod
    def _field_values(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(data)
        if "top_ops" in out:
            out["top_ops"] = [TopOp.from_dict(o) for o in out["top_ops"] or [] if isinstance(o, Mapping)]
        for key, empty in (("sync_ops", {}), ("copies_per_call", {}), ("notes", [])):
            if key in out and out[key] is None:
                out[key] = empty
        return out


@dataclass
class Speedup(Figures):
    """A variant's speedup over the baseline (median ratio, its 95% CI: None from fewer than
    MIN_CI_SAMPLES samples a side, ``n`` the fewer), or why there is none (``error``)."""

    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    n: int | None = None
    error: str | None = field(default=None, metadata=OMIT_NONE)

    @classmethod
    def failed(cls, error: str) -> Speedup:
        return cls(error=error, read_keys=("ratio", "ci_low", "ci_high", "error"))

    @property
    def has_ratio(self) -> bool:
        return _number(self.ratio) is not None

    @property
    def has_interval(self) -> bool:
        return _number(self.ci_low) is not None and _number(self.ci_high) is not None


@dataclass
class VariantTelemetry(Figures):
    """A variant's share of its case's telemetry samples."""

    n_samples: int | None = None
    power_w_mean: float | None = None
    power_w_max: float | None = None
    sm_clock_mhz_mean: float | None = None
    temp_c_max: float | None = None
    throttled: bool | None = None
    throttle_reasons: list[str] = field(default_factory=list)


@dataclass
class Telemetry(Figures):
    """A case's telemetry (gpubench.measure.telemetry_summary.case_summary): NVML figures over its
    samples, ``variants`` per variant tag. None where there was none."""

    n_samples: int | None = None
    duration_s: float | None = None
    power_w_mean: float | None = None
    power_w_max: float | None = None
    energy_j_sampled: float | None = None
    temp_c_max: float | None = None
    sm_clock_mhz_min: float | None = None
    sm_clock_mhz_mean: float | None = None
    mem_clock_mhz_min: float | None = None
    mem_used_mb_max: float | None = None
    util_gpu_pct_mean: float | None = None
    throttled: bool | None = None
    throttled_fraction: float | None = None
    throttle_reasons: list[str] = field(default_factory=list)
    benign_reasons: list[str] = field(default_factory=list)
    variants: dict[str, VariantTelemetry] = field(default_factory=dict)

    @classmethod
    def _field_values(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(data)
        if "variants" in out:  # a mapping of variant -> figures; anything else (a hand-edited file) reads as none
            variants = out["variants"]
            out["variants"] = {
                str(n): VariantTelemetry.from_dict(v)
                for n, v in (variants.items() if isinstance(variants, Mapping) else ())
                if isinstance(v, Mapping)
            }
        for key in ("throttle_reasons", "benign_reasons"):
            if key in out and out[key] is None:
                out[key] = []
        return out


@dataclass
class RunTelemetry(Telemetry):
    """The run's telemetry (gpubench.measure.telemetry.TelemetrySampler.run_summary): whether
    it was sampled (``status`` "ok" or "unavailable", with the ``reason``), how sampling went, the
    whole run's NVML figures, and, for a run over several devices, each one's own by worker slot
    (``devices``). None where the run recorded none."""

    status: str | None = None
    reason: str | None = None
    interval_s: float | None = None
    read_errors: int | None = None
    last_read_error: str | None = None
    skipped_ticks: int | None = None
    device: dict[str, Any] | None = None  # what NVML says of the GPU sampled
    unsupported_fields: list[str] = field(default_factory=list)
    devices: dict[str, RunTelemetry] = field(default_factory=dict)

    @property
    def available(self) -> bool:
        return self.status == "ok"

    @classmethod
    def _field_values(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        out = super()._field_values(data)
        if "devices" in out:  # slot -> that device's summary; anything else reads as none
            devices = out["devices"]
            out["devices"] = {
                str(k): RunTelemetry.from_dict(v)
                for k, v in (devices.items() if isinstance(devices, Mapping) else ())
                if isinstance(v, Mapping)
            }
        if "unsupported_fields" in out and out["unsupported_fields"] is None:
            out["unsupported_fields"] = []
        return out


@dataclass
class Device(Figures):
    """The device a case ran on (gpubench.run.worker.DeviceInfo as recorded)."""

    key: str = ""  # the worker slot's device: cuda:2, cpu, cpu#1
    type: str = ""  # cuda or cpu
    index: int | None = None
    label: str = ""  # the hardware by name
    uuid: str | None = None
    cpu_affinity: list[int] | None = None
    host: str = ""


@dataclass
class Failure:
    kind: str  # exception, oom, timeout, overloaded (a timeout on an overloaded machine), check, variant, interrupted
    message: str
    traceback: str = ""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Failure:
        return cls(**{"kind": "", "message": "", **_fields(cls, data)})


@dataclass
class VariantRecord:
    role: str  # the role it played on this device: baseline, optimized, peer
    description: str = ""
    status: str = "pending"  # ok, check_failed, error, skipped, unchecked
    reason: str | None = None
    error: Failure | None = None
    check: Check | None = None
    samples_s: list[float] = field(default_factory=list)
    stats: Stats | None = None
    timing: Timing | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    recorded: list[dict[str, Any]] = field(default_factory=list)  # numbers a call recorded, per timed call
    peak_memory_bytes: int | None = None
    energy_mj_per_call: float | None = None  # = energy.mj_per_call: None where not measured or flagged
    energy_error: str | None = None  # why there is no figure (a flag, a counter that did not advance, a raise)
    energy: EnergyMeasurement | None = None  # the window behind the figure (None in older runs)
    profile: Profile | None = None  # policy.profile: gpubench.measure.profiling's summary, or its error
    # The clock samples_s (and stats, speedups, the gate) is on: "device" (CUDA events, launch work
    # excluded), "wall" (the host's, launch and syncs included) or "host" (a CPU: one clock, both
    # the same figure). Empty in older records: read ``basis``.
    time_basis: str = ""
    # The other clock's samples on a GPU (wall beside device, device beside wall), a call each in
    # the same rounds; empty on a CPU (one clock) and in older records.
    other_samples_s: list[float] = field(default_factory=list)
    # Why timing stopped before the policy's min_reps (gpubench.measure.timing.measure_interleaved): its
    # figures have no confidence interval. None where it did not, and in older records.
    under_sampled: str | None = None

    def fail(self, status: str, failure: Failure, prefix: str = "") -> None:
        self.status, self.reason, self.error = status, prefix + failure.message, failure

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VariantRecord:
        fields = _fields(cls, data)
        return cls(
            **{
                "role": "",
                **fields,
                "error": _typed(Failure, fields.get("error")),
                "energy": _typed(EnergyMeasurement, fields.get("energy")),
                "metrics": fields.get("metrics") or {},
                "recorded": fields.get("recorded") or [],
                "stats": _typed(Stats, _upgraded_stats(fields.get("stats"))),
                "check": _typed(Check, fields.get("check")),
                "timing": _typed(Timing, fields.get("timing")),
                "profile": _typed(Profile, fields.get("profile")),
                "samples_s": fields.get("samples_s") or [],
                "other_samples_s": fields.get("other_samples_s") or [],
            }
        )

    @property
    def basis(self) -> str:
        """The clock of ``samples_s``: ``time_basis``; for a record older than it, ``host`` where it
        was timed by perf_counter (a CPU: the same clock as now), ``cuda_event_legacy`` where by CUDA
        events started after a host sync (launch work included, the final sync not: neither of
        today's clocks), "" where the record does not say (pytest-benchmark, made by hand)."""
        if self.time_basis:
            return self.time_basis
        return LEGACY_BASIS.get(str(self.timing.method if self.timing else None), "")

    @property
    def other_basis(self) -> str | None:
        """The clock of ``other_samples_s``, where the record holds any."""
        return OTHER_BASIS.get(self.basis) if self.other_samples_s else None

    @property
    def other_median_s(self) -> float | None:
        return statistics.median(self.other_samples_s) if self.other_samples_s else None

    @property
    def launch_share(self) -> float | None:
        """The share of the median wall time not in the median device time (launch work, host
        syncs), where the record holds both clocks: what device time leaves out."""
        wall, device = self.samples_on("wall"), self.samples_on("device")
        if not wall or not device:
            return None
        median_wall = statistics.median(wall)
        return (median_wall - statistics.median(device)) / median_wall if median_wall > 0 else None

    def samples_on(self, basis: str) -> list[float] | None:
        """The samples on clock ``basis`` where the record holds them, else None. A CPU's one
        clock (``host``) is device and wall time both."""
        if basis == self.basis or (self.basis == "host" and basis in OTHER_BASIS):
            return list(self.samples_s)
        if basis == self.other_basis:
            return list(self.other_samples_s)
        return None

    @property
    def median_s(self) -> float | None:
        return self.stats.median if self.stats else None

    @property
    def passed_check(self) -> bool | None:
        return self.check.passed if self.check else None

    def to_dict(self) -> dict[str, Any]:
        """The variant as results.json holds it (its figures through their own to_dict)."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def metric(self, key: str) -> Any:
        return self.metrics.get(key)


@dataclass
class CaseRecord:
    id: str
    technique: str
    params: dict[str, Any]
    seed: int
    policy: dict[str, Any]
    source: str = ""  # the technique's module or file, for readers in another process
    headline: str = ""
    gate_metric: str = ""
    status: str = "running"  # passed, failed, interrupted
    failure: Failure | None = None
    started_at: str = ""
    elapsed_s: float | None = None
    variants: dict[str, VariantRecord] = field(default_factory=dict)
    speedups: dict[str, Speedup] = field(default_factory=dict)
    telemetry: Telemetry | None = None
    device: Device | None = None  # the device it ran on: key, type, index, label, uuid, host
    # Where elapsed_s went, in seconds: build, check (first calls, reference, checks), warmup,
    # timing (the timed rounds' wall time), timed (the timed calls' own samples: part of timing),
    # metrics, energy, profile, other (elapsed_s less the rest). None for records of older runs.
    phases_s: dict[str, float] | None = None
    # The case's time limit: limit_s, case_timeout_s, scale and the machine's load at its start
    # (gpubench.measure.machine_load.TimeLimit.to_dict); None for records of older runs
    time_limit: dict[str, Any] | None = None

    def role_variant(self, role: str) -> str | None:
        return next((n for n, v in self.variants.items() if v.role == role), None)

    def variant(self, name: str | None) -> VariantRecord | None:
        return self.variants.get(name) if name else None

    def speedup(self, name: str | None) -> Speedup | None:
        """Variant ``name``'s speedup over the baseline (ratio, ci_low, ci_high, n) where it has a
        ratio; ``ci_low`` and ``ci_high`` are None where it rests on fewer than
        :data:`gpubench.records.stats.MIN_CI_SAMPLES` samples a side (``n``: the fewer): a figure to show
        with its count, never one to judge by (:func:`has_interval`)."""
        figure = self.speedups.get(name) if name else None
        return figure if figure is not None and figure.has_ratio else None

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def device_label(self) -> str:
        """The hardware it ran on by name ("" when the record does not say: the run's then)."""
        return str(self.device.label or "") if self.device else ""

    def to_dict(self) -> dict[str, Any]:
        """The case as results.json holds it (its figures through their own to_dict)."""
        out = {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}
        out["variants"] = {n: v.to_dict() for n, v in self.variants.items()}
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CaseRecord:
        fields = _fields(cls, data)
        variants = {
            str(n): VariantRecord.from_dict(_upgraded_variant(n, v))
            for n, v in (fields.get("variants") or {}).items()
            if isinstance(v, Mapping)
        }
        return cls(
            **{
                "id": "?",
                "technique": "?",
                "params": {},
                "seed": 0,
                "policy": {},
                **fields,
                "params": fields.get("params") or {},
                "policy": fields.get("policy") or {},
                "failure": _typed(Failure, fields.get("failure")),
                "variants": variants,
                "telemetry": _typed(Telemetry, fields.get("telemetry")),
                "device": _typed(Device, fields.get("device")),
                "speedups": {
                    n: Speedup.from_dict(f)
                    for n, f in _upgraded_speedups(fields.get("speedups") or {}, variants).items()
                    if isinstance(f, Mapping)
                },
            }
        )


def has_interval(figure: Speedup | Stats | Mapping[str, Any] | None) -> bool:
    """Whether a speedup or stats figure carries a confidence interval (both ends numbers): one
    from fewer than :data:`gpubench.records.stats.MIN_CI_SAMPLES` samples has none."""
    if figure is None:
        return False
    if isinstance(figure, (Speedup, Stats)):
        return _number(figure.ci_low) is not None and _number(figure.ci_high) is not None
    return bool(figure) and all(_number(figure.get(k)) is not None for k in ("ci_low", "ci_high"))


_ATOMS = frozenset({str, int, float, bool, type(None)})


def _plain(value: Any) -> Any:
    """A record's field as results.json holds it: typed figures through their to_dict, other
    dataclasses field by field (as ``dataclasses.asdict``, without its deep copy of every
    number: a report reads every case this way several times), containers copied."""
    if isinstance(value, Figures):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if all(type(v) in _ATOMS for v in value):  # samples, per-call numbers: a copy as it is
            return type(value)(value)
        return type(value)(_plain(v) for v in value)
    return value


def _fewest(*variants: VariantRecord | None) -> int | None:
    found = [len(v.samples_s) or (v.stats.n if v.stats else None) for v in variants if v is not None]
    counts = [c for c in found if isinstance(c, int)]
    return min(counts) if counts and len(counts) == len(variants) else None


def _upgraded_speedups(speedups: Mapping[str, Any], variants: Mapping[str, VariantRecord]) -> dict[str, Any]:
    """Speedups as today's writer gives them: with ``n``, the fewer samples of the variant and the
    baseline; an interval from fewer than MIN_CI_SAMPLES samples (older gpubench wrote one, of no
    width at n=1) is dropped."""
    base = next((v for v in variants.values() if v.role == "baseline"), None)
    out: dict[str, Any] = {}
    for name, figure in speedups.items():
        if isinstance(figure, Mapping):
            figure = dict(figure)
            if figure.get("n") is None:
                n = _fewest(base, variants.get(str(name)))
                if n is not None:
                    figure["n"] = n
            if isinstance(figure.get("n"), int) and not _stats.has_interval(figure["n"]):
                figure["ci_low"] = figure["ci_high"] = None
        out[str(name)] = figure
    return out


def _upgraded_stats(figures: Any) -> Any:
    """A variant's stats without an interval from fewer than MIN_CI_SAMPLES samples (older
    gpubench wrote the median twice at n=1)."""
    if isinstance(figures, Mapping) and isinstance(figures.get("n"), int) and not _stats.has_interval(figures["n"]):
        return {**figures, "ci_low": None, "ci_high": None}
    return figures


def _upgraded_variant(name: str, record: Mapping[str, Any]) -> Mapping[str, Any]:
    """Version 1 named a variant by its role; a record without ``role`` takes its name's."""
    return record if record.get("role") else {**record, "role": name}


@dataclass
class NotRunCase:
    """A case the run planned and never started, and why: ``reason`` "budget" (``--budget``: the
    time left could not hold it). ``estimate_s`` is what the budget counted for it (conservative),
    ``low_s`` what it takes at least, ``basis`` what they rest on (history, earlier, technique,
    policy: :class:`gpubench.run.estimate.CaseEstimate`), ``left_s`` the budget left when it was
    passed over. Neither passed nor failed: the gate lists it as missing, the history store never
    records it."""

    id: str
    technique: str
    params: dict[str, Any] = field(default_factory=dict)
    reason: str = "budget"
    estimate_s: float | None = None
    low_s: float | None = None
    basis: str = ""
    left_s: float | None = None
    target: str | None = None  # the device model it was to run on (--per-model), if one
    status: str = "not_run"

    @property
    def lower_bound(self) -> bool:
        return self.basis in ("technique", "policy")

    def need_text(self) -> str:
        """What it would have needed: ``about 40 s``, or ``at least 2.0 s, counted as 8.0 s``."""
        return need_text([self])

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NotRunCase:
        fields = _fields(cls, data)
        return cls(**{"id": "?", "technique": "?", **fields, "params": fields.get("params") or {}})


def duration_text(seconds: float) -> str:
    """A duration as a person reads it: 8 s, 3 min, 1.5 h, 4 days; under 10 s to a tenth."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 72 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:,.0f} days"


def elapsed_text(seconds: float) -> str:
    """A wall time as a person reads it, to the second: 350 ms, 4.2 s, 38 min 32 s, 2 h 5 min,
    3 days 4 h (never ``2.31e+03 s``)."""
    if seconds < 1:
        return f"{seconds * 1000:.3g} ms" if seconds > 0 else "0 s"
    if seconds < 59.95:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} day{'s' if days != 1 else ''}" + (f" {hours} h" if hours else "")
    if hours:
        return f"{hours} h" + (f" {minutes} min" if minutes else "")
    return f"{minutes} min" + (f" {secs} s" if secs else "")


def _moment(iso: str | None) -> _dt.datetime | None:
    """An ISO time as an aware datetime (one without an offset read as UTC); None if unreadable."""
    try:
        moment = _dt.datetime.fromisoformat(iso or "")
    except (TypeError, ValueError):
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=_dt.timezone.utc)


def _seconds(start: _dt.datetime, end: _dt.datetime) -> float:
    return (end - start).total_seconds()


def need_text(cases: list[NotRunCase]) -> str:
    """What ``cases`` would have needed together: ``about 2 min`` where each one's figure is its
    own measured time, else ``at least 40 s, counted as 2 min`` (the budget's conservative count)."""
    counted = sum(c.estimate_s or 0.0 for c in cases)
    if not any(c.lower_bound for c in cases):
        return f"about {duration_text(counted)}"
    low = sum((c.low_s if c.low_s is not None else c.estimate_s) or 0.0 for c in cases)
    if low < 0.05:  # a policy with no warm-up bounds nothing from below
        return f"{duration_text(counted)} by the budget's count, no time of its own measured"
    return f"at least {duration_text(low)}, counted as {duration_text(counted)}"


def not_run_text(cases: list[NotRunCase]) -> str:
    """``3 cases not run: budget (would have needed about 2 min)``; "" for none."""
    by_reason: dict[str, list[NotRunCase]] = {}
    for case in cases:
        by_reason.setdefault(case.reason, []).append(case)
    return "; ".join(
        f"{len(group)} case{'s' if len(group) != 1 else ''} not run: {reason} (would have needed {need_text(group)})"
        for reason, group in by_reason.items()
    )


@dataclass
class TimeUse:
    """Where a run's wall time went: the run's own wall clock (worker start-up, calibration and
    writing the results included), the workers that shared it, and its cases' phases summed
    (:data:`gpubench.run.runner.PHASES`, ``timed`` and ``other``)."""

    wall_s: float
    workers: int
    cases_s: float  # the cases' own elapsed_s, summed
    phases_s: dict[str, float]
    timed_share: float  # timed calls / (wall_s x workers): what a run spends on what it reports

    @classmethod
    def of(cls, cases: list[CaseRecord], wall_s: float, workers: int) -> TimeUse:
        phases: dict[str, float] = {}
        for case in cases:
            for name, seconds in (case.phases_s or {}).items():
                phases[name] = phases.get(name, 0.0) + seconds
        capacity = max(wall_s, 1e-9) * max(workers, 1)
        return cls(
            wall_s,
            max(workers, 1),
            sum(c.elapsed_s or 0.0 for c in cases),
            phases,
            min(1.0, phases.get("timed", 0.0) / capacity),
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TimeUse:
        return cls(
            **{"wall_s": 0.0, "workers": 1, "cases_s": 0.0, "phases_s": {}, "timed_share": 0.0, **_fields(cls, data)}
        )

    def text(self) -> str:
        """The run's closing line."""

        def took(seconds: float) -> str:  # 12.3 s; 38 min 32 s from a minute on
            return f"{seconds:.1f} s" if seconds < 59.95 else elapsed_text(seconds)

        spent = ", ".join(
            f"{name} {took(seconds)}" for name, seconds in self.phases_s.items() if name != "timed" and seconds >= 0.05
        )
        workers = f" x {self.workers} workers" if self.workers > 1 else ""
        return (
            f"timed calls were {self.timed_share:.0%} of wall time ({took(self.phases_s.get('timed', 0.0))} "
            f"of {took(self.wall_s)}{workers}; the cases took {took(self.cases_s)}" + (f": {spent})" if spent else ")")
        )


@dataclass
class RunRecord:
    run_id: str
    device: str
    device_label: str
    scenario: dict[str, Any]
    env: dict[str, Any]
    repeat_scale: float = 1.0
    only: list[str] | None = None
    status: str = "running"  # complete, interrupted, aborted, crashed
    planned_cases: int | None = None  # the jobs the run set out to measure (None before they are made)
    signal: str | None = None  # SIGINT (Ctrl-C) or SIGTERM: what interrupted the run
    disk_full: str | None = None  # the write that failed when the disk filled ("PATH: No space left on device")
    started_at: str = ""
    finished_at: str | None = None
    ceilings: dict[str, Any] | None = None
    telemetry: RunTelemetry | None = None
    cases: list[CaseRecord] = field(default_factory=list)
    devices: dict[str, dict[str, Any]] = field(default_factory=dict)  # every device used, by worker slot
    warnings: list[str] = field(default_factory=list)  # what the reader must know first (busy GPUs)
    clocks: dict[str, Any] | None = None  # --lock-clocks: what was locked, or why not
    abort_reason: str | None = None
    crash: Failure | None = None
    time_use: TimeUse | None = None  # where the run's wall time went (None in older runs)
    budget_s: float | None = None  # --budget: the wall time the run was planned to fit (None: no budget)
    not_run: list[NotRunCase] = field(default_factory=list)  # planned, never started (--budget); [] in older runs
    # The declarations of the run's techniques and the claims of those it left out, recorded
    # by the run's process (:meth:`declare`); empty in runs of versions 1 and 2.
    declarations: Declarations = field(default_factory=Declarations)
    schema_version: int = SCHEMA_VERSION  # of the file it was read from (the writer's: the newest)
    # Where a reader got the record (never written): the tool that wrote the file, gpubench or
    # pytest-benchmark (:mod:`gpubench.records.pytest_benchmark`), and the file, when the reader says.
    source: str = "gpubench"
    path: str | None = None
    # The technique registry its holder passed in (never written): how :meth:`declare` records the
    # run's techniques, an old run (schema 1, 2) is read by today's declarations and a technique's
    # own figure function is found. None: the record is data only (this module never imports it).
    registry: Registry | None = field(default=None, repr=False, compare=False)

    @property
    def summary(self) -> dict[str, int]:
        statuses = [c.status for c in self.cases]
        return {
            "cases": len(statuses),
            "passed": statuses.count("passed"),
            "failed": statuses.count("failed"),
            "interrupted": statuses.count("interrupted"),
            "not_run": len(self.not_run),
        }

    def wall_time_text(self) -> str:
        """The run's wall time as a person reads it (:func:`elapsed_text`), start to finish. A run
        with no finish time (killed: ``kill -9``, a lost machine) says what is known, from its start
        to the end of the last case it recorded: ``at least 31.4 s, to its last case recorded``;
        "unknown" where it recorded no case, or no start."""
        start, end = _moment(self.started_at), _moment(self.finished_at)
        if start is not None and end is not None:
            return elapsed_text(_seconds(start, end)) if end >= start else "unknown (it finished before it started)"
        ends = [
            _seconds(start, at) + (c.elapsed_s or 0.0)
            for c in self.cases
            for at in [_moment(c.started_at)]
            if start is not None and at is not None
        ]
        if not ends or max(ends) < 0:
            return "unknown (no finish time" + (", no case recorded)" if not self.cases else ")")
        return f"at least {elapsed_text(max(ends))}, to its last case recorded"

    # -- what the gate reads -----------------------------------------------------------------
    @property
    def scenario_name(self) -> str | None:
        return self.scenario.get("name")

    @property
    def scenario_entries(self) -> list[dict[str, Any]] | None:
        """The scenario's entries as the run recorded them (None for a run of no scenario file)."""
        return self.scenario.get("entries")

    @property
    def thresholds(self) -> dict[str, float]:
        """The scenario's gate threshold per technique (a slowdown fraction), where it sets one."""
        return {str(k): float(v) for k, v in (self.scenario.get("thresholds") or {}).items()}

    @property
    def model_origin(self) -> ModelOrigin | None:
        """The model a ``gpubench run --model`` scenario was generated from (its ``model:`` block,
        typed); None for any other run."""
        return ModelOrigin.from_dict(self.scenario.get("model"))

    def device_of(self, case: CaseRecord) -> str:
        """The hardware a case ran on by name: its own record's (a run over several device
        models), else the run's; "?" when neither says."""
        return case.device_label or self.device_label or "?"

    def device_labels(self) -> list[str]:
        """The device models its cases ran on, in case order (the run's own label without cases)."""
        return list(dict.fromkeys(self.device_of(c) for c in self.cases)) or [self.device_label or "?"]

    # -- declarations ------------------------------------------------------------------------
    def declare(self, registry: Registry | None = None) -> None:
        """Record the declarations of the techniques of its cases and scenario entries that it
        does not hold yet, through ``registry`` (else its own :attr:`registry`; neither: nothing
        to record by): the run's process, where a plug-in is importable."""
        registry = registry or self.registry
        if registry is None:
            return
        wanted = {
            e.get("technique"): ""
            for e in self.scenario.get("entries") or []
            if e.get("technique") and (not self.only or e.get("technique") in self.only)
        }
        wanted.update({c.technique: c.source for c in self.cases})
        declare(self.declarations, wanted, registry)

    @property
    def recorded_declarations(self) -> bool:
        """Whether the file recorded its techniques' declarations (schema 3 on): older runs did not."""
        return self.schema_version >= 3

    def technique(self, name: str) -> TechniqueRecord | None:
        """What the report reads technique ``name`` by: the run's own record of it; for a run of
        schema 1 or 2 only, today's declarations from the :attr:`registry` its holder passed in
        (the fallback for old runs). None: unknown."""
        if self.recorded_declarations:
            return self.declarations.techniques.get(name)
        found = self.declarations.techniques.get(name)
        if found is None:
            source = next((c.source for c in self.cases if c.technique == name), "")
            found = legacy_record(self.registry, name, source)
            if found is not None:
                self.declarations.techniques[name] = found
        return found

    def claims_elsewhere(self) -> dict[str, tuple[Any, ...]]:
        """The published claims of techniques this run left out (the registry's, for an old run)."""
        if self.recorded_declarations:  # and the techniques it planned but ran no case of (a run cut short)
            ran = {c.technique for c in self.cases}
            planned = {n: t.claims for n, t in self.declarations.techniques.items() if n not in ran and t.claims}
            return {**self.declarations.claims_elsewhere, **planned}
        legacy: dict[str, tuple[Any, ...]] = legacy_claims_elsewhere(
            self.registry, list(dict.fromkeys(c.technique for c in self.cases))
        )
        return legacy

    # -- the file ----------------------------------------------------------------------------
    def to_dict(self, cases: bool = True) -> dict[str, Any]:
        from gpubench import __version__

        skip = ("cases", "declarations", "schema_version", "source", "path", "registry")
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skip}
        fields = {
            k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) and not isinstance(v, (type, Figures)) else v
            for k, v in fields.items()
        }
        fields["not_run"] = [dataclasses.asdict(c) for c in self.not_run]
        declared, elsewhere = self.declarations.to_dicts()
        doc = {
            "schema_version": self.schema_version,
            "kind": "gpubench.results",
            "gpubench_version": __version__,
            **json_safe(fields),
            "techniques": json_safe(declared),
            "claims_elsewhere": json_safe(elsewhere),
            "cases": [],
            "summary": self.summary,
        }
        for key in ("abort_reason", "crash", "clocks", "signal", "disk_full", "budget_s"):
            if doc[key] is None:
                del doc[key]
        if not self.recorded_declarations:
            del doc["techniques"], doc["claims_elsewhere"]
        if cases:
            doc["cases"] = [c.to_dict() for c in self.cases]
        return doc

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], registry: Registry | None = None) -> RunRecord:
        """The record a results document was written from (:func:`load_run` reads the file;
        this takes a document already read, of any readable version), holding ``registry``
        (the caller's, for an old run's declarations and figure functions) where given."""
        fields = {k: v for k, v in _fields(cls, data).items() if k != "registry"}
        return cls(
            **{
                "run_id": "",
                "device": "",
                "device_label": "",
                "scenario": {},
                "env": {},
                **fields,
                "scenario": fields.get("scenario") or {},
                "env": fields.get("env") or {},
                "cases": [CaseRecord.from_dict(c) for c in data.get("cases") or [] if isinstance(c, Mapping)],
                "devices": fields.get("devices") or {},
                "warnings": fields.get("warnings") or [],
                "crash": _typed(Failure, fields.get("crash")),
                "telemetry": _typed(RunTelemetry, fields.get("telemetry")),
                "time_use": _typed(TimeUse, fields.get("time_use")),
                "not_run": [NotRunCase.from_dict(c) for c in fields.get("not_run") or [] if isinstance(c, Mapping)],
                "declarations": Declarations.from_dicts(data.get("techniques"), data.get("claims_elsewhere")),
                # A document without a version (made by hand) recorded no declarations either.
                "schema_version": data.get("schema_version") or READABLE_VERSIONS[0],
                "registry": registry,
            }
        )

    def json_chunks(self) -> Iterator[str]:
        """results.json piece by piece, one case at a time (a run of 10,000 cases is never held
        as one document). The techniques' declarations are recorded first (:meth:`declare`)."""
        if self.recorded_declarations:
            self.declare()
        head = json.dumps(self.to_dict(cases=False), indent=2, allow_nan=False, default=str)
        before, after = head.split('"cases": []', 1)
        yield before + '"cases": ['
        for n, case in enumerate(self.cases):
            yield ("," if n else "") + "\n" + json.dumps(json_safe(case.to_dict()), allow_nan=False, default=str)
        yield "\n  ]" + after + "\n"


def json_safe(value: Any) -> Any:
    """Replace NaN/inf by None (JSON has no such numbers) and tuples by lists, recursively; a
    record's typed figures as their dicts."""
    if isinstance(value, Figures):
        return json_safe(value.to_dict())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


class RunDirectory:
    """The run's files. Every write that fails on a full disk records it (``full``) and raises
    :class:`DiskFull`; the supervisor then stops the run and calls :meth:`close_on_full_disk`."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.full: DiskFull | None = None  # the first write the full disk refused
        self.logged: set[int] = set()  # the case indices cases.jsonl holds

    @classmethod
    def create(cls, out_root: Path, scenario_name: str, now: _dt.datetime | None = None) -> RunDirectory:
        stamp = (now or _dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", scenario_name)
        try:
            out_root.mkdir(parents=True, exist_ok=True)
            for suffix in [""] + [f"-{i}" for i in range(1, 1000)]:
                path = out_root / f"{stamp}-{safe}{suffix}"
                try:
                    path.mkdir()
                    return cls(path)
                except FileExistsError:
                    continue
        except OSError as exc:
            raise BadInput(
                f"--out {out_root}: cannot create the run directory there ({exc.strerror or exc}); "
                f"give a writable directory."
            ) from None
        raise BadInput(f"{out_root}: cannot create a new run directory for {scenario_name}")

    @property
    def results_json(self) -> Path:
        return self.path / "results.json"

    def _writing(self, write: Any, *args: Any) -> None:
        try:
            write(*args)
        except DiskFull as exc:
            self.full = self.full or exc
            raise

    def reserve(self) -> None:
        """Set aside room (random bytes: a compressing file system cannot shrink them) that
        :meth:`close_on_full_disk` frees to write the run's last record."""
        try:
            with open(self.path / RESERVE, "wb") as f:
                f.write(os.urandom(RESERVE_BYTES))
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            if not disk_full(exc):
                raise
            self.release()
            self.full = self.full or as_disk_full(exc, self.path / RESERVE)
            raise self.full from None

    def release(self) -> None:
        try:
            (self.path / RESERVE).unlink()
        except FileNotFoundError:
            pass

    def write_env(self, env: dict[str, Any]) -> None:
        self._writing(atomic_write_json, self.path / "env.json", json_safe(env))

    def write_results(self, doc: dict[str, Any] | RunRecord) -> None:
        if isinstance(doc, RunRecord):
            self._writing(atomic_write_chunks, self.results_json, doc.json_chunks())
        else:
            self._writing(atomic_write_json, self.results_json, json_safe(doc))

    def close_on_full_disk(self, run: RunRecord, records: dict[int, CaseRecord]) -> list[str]:
        """After the disk filled: free the reserve, then keep what still fits, most needed first:
        results.json without its cases (the run's status, why it stopped; a reader takes the cases
        from cases.jsonl), the finished cases the log lacks (each whole or not at all), then
        results.json whole. Returns what could not be written."""
        self.release()
        lost = []
        try:
            self._writing(atomic_write_chunks, self.results_json, dataclasses.replace(run, cases=[]).json_chunks())
        except DiskFull:
            lost.append("results.json (it still says 'running'; the cases are in cases.jsonl)")
        for index in sorted(set(records) - self.logged):
            try:
                self.append_case(index, records[index])
            except DiskFull:
                lost.append(f"case {records[index].id} ({records[index].status})")
        try:
            self.write_results(run)
        except DiskFull:
            pass  # the record without its cases is there, and the log holds them
        return lost

    @property
    def cases_log(self) -> Path:
        return self.path / CASES_LOG

    def append_case(self, index: int, record: CaseRecord) -> None:
        """One finished case, appended to the run log (a line of JSON, flushed and fsynced): what a
        reader of an unfinished run gets, at a cost that does not grow with the run."""
        line = json.dumps(json_safe({"index": index, **record.to_dict()}), allow_nan=False) + "\n"
        self._writing(append_line, self.cases_log, line)
        self.logged.add(index)

    def write_cases_csv(self, doc: dict[str, Any] | RunRecord) -> None:
        if isinstance(doc, RunRecord):  # case by case, never the whole run as one document
            doc = {"run_id": doc.run_id, "cases": (json_safe(c.to_dict()) for c in doc.cases)}
        self._writing(atomic_write_text, self.path / "results.csv", cases_frame(doc).to_csv(index=False))

    def write_text(self, name: str, text: str) -> None:
        """Another file of the run (telemetry.csv)."""
        self._writing(atomic_write_text, self.path / name, text)


def role_variant(case: dict[str, Any], role: str) -> str | None:
    """The name of a case record's variant with this role (baseline, optimized), if any."""
    return next((n for n, v in (case.get("variants") or {}).items() if v.get("role") == role), None)


def cases_frame(doc: Mapping[str, Any]) -> pd.DataFrame:
    """One row per case x variant: params as ``p_<name>``, metrics as ``m_<name>``. ``doc``'s
    cases are case records or their dicts (read as the records they hold)."""
    import pandas as pd

    rows = []
    for raw in doc.get("cases", []):
        case = raw if isinstance(raw, CaseRecord) else CaseRecord.from_dict(raw)
        for name, v in case.variants.items():
            s = v.stats or Stats()
            check = v.check or Check()
            speed = case.speedups.get(name) or Speedup()
            row = {
                "run_id": doc.get("run_id"),
                "case_id": case.id,
                "technique": case.technique,
                "case_status": case.status,
                "variant": name,
                "role": v.role,
                "variant_status": v.status,
                "reason": v.reason,
                "n": s.n,
                "median_ms": _ms(s.median),
                "iqr_ms": _ms(s.iqr),
                "ci_low_ms": _ms(s.ci_low),
                "ci_high_ms": _ms(s.ci_high),
                "min_ms": _ms(s.min),
                "time_basis": v.basis or None,
                "other_median_ms": _ms(v.other_median_s),
                "speedup": speed.ratio,
                "speedup_ci_low": speed.ci_low,
                "speedup_ci_high": speed.ci_high,
                "check_passed": check.passed if v.check else None,
                "check_metric": check.metric if v.check else None,
                "check_error": check.error,
                "check_tolerance": check.tolerance,
                "peak_memory_bytes": v.peak_memory_bytes,
                "energy_mj_per_call": v.energy_mj_per_call,
                "energy_uncertainty_mj": v.energy.uncertainty_mj if v.energy else None,
                # window or timed_calls (gpubench.measure.energy); an older run's measurement was a window
                "energy_method": v.energy.method if v.energy else None,
            }
            row.update({f"p_{k}": val for k, val in case.params.items()})
            row.update(
                {
                    f"m_{k}": val
                    for k, val in v.metrics.items()
                    if isinstance(val, (int, float, str, bool)) or val is None
                }
            )
            rows.append(row)
    return pd.DataFrame(rows)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def read_document(path: str | Path) -> dict[str, Any]:
    """The one reader of a results file: a run directory or its results.json, checked (kind,
    readable schema version) and with the cases of its run log where the file lacks them. Raises
    :class:`BadInput` (exit 2) naming the file when it is missing, corrupt or of another version."""
    path = Path(path)
    file = path / "results.json" if path.is_dir() else path
    if not file.exists():
        what = "run directory has no results.json" if path.is_dir() else "no such file"
        raise BadInput(f"{file}: {what}; give a run directory (runs/<timestamp>-<scenario>/) or its results.json.")
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInput(
            f"{file}: not a readable results file ({exc}); it may be truncated or not a gpubench result."
        ) from None
    if not isinstance(doc, dict) or doc.get("kind") != "gpubench.results":
        raise BadInput(f"{file}: not a gpubench results file (key 'kind' should be 'gpubench.results').")
    version = doc.get("schema_version")
    if version not in READABLE_VERSIONS:
        raise BadInput(
            f"{file}: schema_version is {version!r}; this gpubench reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}."
        )
    # Killed mid-way (status running) or stopped by a full disk (results.json without its
    # cases): the run log holds what finished.
    if doc.get("status") != "complete" or not doc.get("cases"):
        logged = read_cases_log(file.parent / CASES_LOG)
        if len(logged) > len(doc.get("cases") or []):
            doc["cases"] = logged
            statuses = [c.get("status") for c in logged]
            doc["summary"] = {
                "cases": len(logged),
                "passed": statuses.count("passed"),
                "failed": statuses.count("failed"),
                "interrupted": statuses.count("interrupted"),
                "not_run": len(doc.get("not_run") or []),
            }
    return doc


def load_run(path: str | Path, registry: Registry | None = None) -> RunRecord:
    """A run directory or results.json read back into the records that wrote it (versions 1
    and 2 upgraded on read), holding ``registry`` where the caller gives one
    (:attr:`RunRecord.registry`); :class:`BadInput` as :func:`read_document` says."""
    return RunRecord.from_dict(read_document(path), registry)


def load_results(path: str | Path) -> dict[str, Any]:
    """The results document as a dict (for scripts; readers in gpubench take :func:`load_run`'s
    records); the same reader as :func:`load_run`."""
    return read_document(path)


def as_run(doc: RunRecord | Mapping[str, Any], registry: Registry | None = None) -> RunRecord:
    """A reader's run: the record itself, or one read from a results document already loaded
    (holding ``registry`` where given: :attr:`RunRecord.registry`)."""
    if isinstance(doc, RunRecord):
        if registry is not None and doc.registry is None:
            doc.registry = registry
        return doc
    return RunRecord.from_dict(doc, registry)


def read_cases_log(path: Path) -> list[dict[str, Any]]:
    """The cases of a run log in case order; a line cut short by a crash is left out."""
    cases: dict[int, dict[str, Any]] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    for line in lines:
        try:
            case = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(case, dict) and isinstance(case.get("index"), int):
            cases[case.pop("index")] = case
    return [cases[i] for i in sorted(cases)]
