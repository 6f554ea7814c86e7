"""Each timed variant of a case against the device's measured ceilings: the roofline.

A case's FLOPs and bytes are its problem's, each counted once (``flops`` and ``bytes_moved`` in
every variant's metrics: the technique counts what the problem needs, not what a variant does),
so a variant that reads its inputs four times or recomputes shows it as a lower share of the peak.
The roof is min(matmul peak, intensity x copy bandwidth), both measured at the start of the run
(``ceilings``, of the device the case ran on). Pure: records in, numbers and strings out; the
figure is drawn by :func:`gpubench.reports.charts.roofline`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpubench.measure.machine_load import OVERLOAD_PER_CPU
from gpubench.records.results import CaseRecord, RunRecord

ROLE_ORDER = {"baseline": 0, "optimized": 1}


@dataclass(frozen=True)
class Roof:
    """The measured ceilings a case is read against (None where the run did not measure one, and
    ``missing`` says why)."""

    device: str
    on_cpu: bool
    peak_tflops: float | None
    peak_gbps: float | None
    dtype: str = ""
    missing: str = ""
    matmul_n: int | None = None  # the calibration matmul's size (square, n x n)
    load_1m: float | None = None  # the machine's load while the ceilings were measured (None: not recorded)
    cpus: int | None = None  # the logical CPUs that load was shared by

    @property
    def loaded(self) -> bool:
        """A CPU calibrated under load (beyond :data:`gpubench.measure.machine_load.OVERLOAD_PER_CPU` a core:
        the calibration's own threads count about one): its ceilings are a share of it (a GPU's
        large calibration matmul and copy do not wait on the host's CPUs)."""
        return (
            self.on_cpu
            and self.load_1m is not None
            and self.cpus is not None
            and self.load_1m > OVERLOAD_PER_CPU * self.cpus
        )

    def load_words(self) -> str:
        return f"load {self.load_1m:.1f} on {self.cpus} cores"

    @property
    def complete(self) -> bool:
        return bool(self.peak_tflops and self.peak_gbps)

    @property
    def ridge(self) -> float | None:
        """FLOPs per byte where the two ceilings meet: below it a case is memory-bound."""
        if not self.peak_tflops or not self.peak_gbps:  # (not complete)
            return None
        return self.peak_tflops * 1e3 / self.peak_gbps

    def attainable_tflops(self, intensity: float) -> float | None:
        if not self.peak_tflops or not self.peak_gbps:  # (not complete)
            return None
        return min(self.peak_tflops, intensity * self.peak_gbps / 1e3)

    def bound(self, intensity: float) -> str:
        return "" if self.ridge is None else ("memory" if intensity < self.ridge else "compute")


def roof_of(ceilings: dict[str, Any] | None, device: str, on_cpu: bool) -> Roof:
    """The roof a run's ``ceilings`` record gives (``gpubench.measure.env.calibrate``'s dict)."""
    if not ceilings:
        return Roof(device, on_cpu, None, None, missing="the run was not calibrated (--no-calibrate)")
    if "error" in ceilings:
        return Roof(device, on_cpu, None, None, missing=f"the run's calibration failed ({ceilings['error']})")
    matmul, copy = ceilings.get("matmul") or {}, ceilings.get("copy") or {}
    peak, bandwidth = _positive(matmul.get("peak_tflops")), _positive(copy.get("peak_gbps"))
    gaps = [what for what, value in (("matmul peak", peak), ("copy bandwidth", bandwidth)) if value is None]
    n = matmul.get("n")
    recorded_load = ceilings.get("load")
    load = recorded_load if isinstance(recorded_load, dict) else {}
    cpus = load.get("cpus")
    return Roof(
        device,
        on_cpu,
        peak,
        bandwidth,
        str(matmul.get("dtype") or ""),
        f"the run's calibration recorded no {' or '.join(gaps)}" if gaps else "",
        n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None,
        _positive(load.get("load_1m")),
        cpus if isinstance(cpus, int) and not isinstance(cpus, bool) else None,
    )


def _positive(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    return float(value) if ok else None


def roof_for(run: RunRecord, case: CaseRecord) -> Roof:
    """The ceilings of the device ``case`` ran on (each worker calibrates its own device), else
    the run's."""
    device = case.device
    slot = run.devices.get(str(device.key if device is not None else None)) or {}
    ceilings = slot.get("ceilings") if "ceilings" in slot else run.ceilings
    on_cpu = device.type == "cpu" if device is not None and device.type else run.device == "cpu"
    return roof_of(ceilings, case.device_label or run.device_label or run.device or "?", on_cpu)


@dataclass(frozen=True)
class Reading:
    """One timed variant of one case: the case's counts, the variant's median time, the roof."""

    number: int  # the case's number in the run (the summary table's)
    params: str
    variant: str
    role: str
    flops: float | None
    bytes_moved: float | None
    median_s: float
    roof: Roof

    @property
    def tflops(self) -> float | None:
        return self.flops / self.median_s / 1e12 if self.flops is not None else None

    @property
    def gbps(self) -> float | None:
        return self.bytes_moved / self.median_s / 1e9 if self.bytes_moved is not None else None

    @property
    def intensity(self) -> float | None:
        """FLOPs per byte moved."""
        return self.flops / self.bytes_moved if self.flops is not None and self.bytes_moved else None

    @property
    def pct_peak_flops(self) -> float | None:
        return 100 * self.tflops / self.roof.peak_tflops if self.tflops is not None and self.roof.peak_tflops else None

    @property
    def pct_bandwidth(self) -> float | None:
        return 100 * self.gbps / self.roof.peak_gbps if self.gbps is not None and self.roof.peak_gbps else None

    @property
    def pct_roof(self) -> float | None:
        """The share of what the roof allows at this intensity."""
        if self.intensity is None or self.tflops is None:
            return None
        attainable = self.roof.attainable_tflops(self.intensity)  # None: the roof is not complete
        return 100 * self.tflops / attainable if attainable is not None else None

    @property
    def bound(self) -> str:
        return self.roof.bound(self.intensity) if self.intensity is not None else ""


def variant_order(cases: Sequence[CaseRecord]) -> list[str]:
    """The variants of ``cases`` that were timed: the baseline, the optimized ones, then the peers,
    each in the order the run first recorded it."""
    seen: dict[str, str] = {}
    for case in cases:
        for name, v in case.variants.items():
            if v.median_s and name not in seen:
                seen[name] = v.role
    return sorted(seen, key=lambda n: ROLE_ORDER.get(seen[n], 2))


def readings(
    run: RunRecord, group: Sequence[tuple[int, CaseRecord]], params_of: Callable[[CaseRecord], str]
) -> list[Reading]:
    """Every timed variant with a FLOP or byte count, of every case of ``group`` (number, case)."""
    out = []
    for number, case in group:
        roof = roof_for(run, case)
        for name in variant_order([case]):
            v = case.variants[name]
            flops, moved = _positive(v.metric("flops")), _positive(v.metric("bytes_moved"))
            if v.median_s and (flops is not None or moved is not None):  # (variant_order: timed ones only)
                out.append(Reading(number, params_of(case), name, v.role, flops, moved, float(v.median_s), roof))
    return out


# -- the table ---------------------------------------------------------------------------------
def si(value: float | None, unit: str = "") -> str:
    """``value`` with an SI prefix: 4.19 GFLOP, 1.05 MB, 12.3 (no unit)."""
    if value is None:
        return "-"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".rstrip()


# A share of a measured ceiling above this is not a rate the device can reach (the calibration's
# own run-to-run spread is a few percent): flagged, never printed as if it were one.
ABOVE_CEILING_PCT = 110.0
GPU_PEAK_MATMUL_N = 8192  # gpubench.measure.env.MATMUL_N_GPU (reports read records, never the harness)


def _pct(value: float | None) -> str:
    if value is None:
        return "-"
    text = f"{value:.1f}%" if value >= 1 else f"{value:.2g}%"
    return f"{text} (!)" if value > ABOVE_CEILING_PCT else text


def _num(value: float | None) -> str:
    """Plain notation, three significant digits below 1,000: 0.0000438, 12.3, 2,500 (never 2.5e+03:
    a CPU's TFLOP/s are that small)."""
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if value == 0 or abs(value) >= 1e-3:
        return f"{value:.3g}"
    return f"{value:.{2 - math.floor(math.log10(abs(value)))}f}"


# (key, header) of the table's columns, each a function of a Reading.
COLUMNS: tuple[tuple[str, str, Callable[[Reading], str]], ...] = (
    ("flops", "FLOPs", lambda r: si(r.flops, "FLOP")),
    ("bytes", "bytes", lambda r: si(r.bytes_moved, "B")),
    ("intensity", "FLOPs / byte", lambda r: _num(r.intensity)),
    ("tflops", "TFLOP/s", lambda r: _num(r.tflops)),
    ("gbps", "GB/s", lambda r: _num(r.gbps)),
    ("pct_flops", "% of matmul peak", lambda r: _pct(r.pct_peak_flops)),
    ("pct_bandwidth", "% of copy bandwidth", lambda r: _pct(r.pct_bandwidth)),
    ("pct_roof", "% of roof", lambda r: _pct(r.pct_roof)),
    ("bound", "bound", lambda r: r.bound or "-"),
)


def case_tables(found: Sequence[Reading]) -> dict[str, Any]:
    """The per-case tables: the columns some reading fills, and per case its variants' rows."""
    cells = [{key: text(r) for key, _, text in COLUMNS} for r in found]
    columns = [(key, header) for key, header, _ in COLUMNS if any(c[key] != "-" for c in cells)]
    cases: dict[int, dict[str, Any]] = {}
    for r, c in zip(found, cells):
        case = cases.setdefault(r.number, {"number": r.number, "params": r.params, "rows": []})
        case["rows"].append({"variant": r.variant, "role": r.role, "cells": [c[key] for key, _ in columns]})
    return {"columns": [header for _, header in columns], "cases": list(cases.values())}


def notes(found: Sequence[Reading]) -> list[str]:
    """What a reader must know to read the figure and the tables: a roof that is missing and why,
    ceilings that are a CPU's, variants that counted differently, counts that leave the intensity
    unknown."""
    return _roof_notes(found) + _above_ceilings(found) + _uneven_counts(found) + _no_roofline(found)


def _above_ceilings(found: Sequence[Reading]) -> list[str]:
    """Readings above what the device was measured to do: impossible as rates of its memory or
    matmul units, so something else is being measured (a working set that stayed in cache, which
    the calibration's large copy does not; a count larger than the work done)."""
    over = [
        (r, f"#{r.number} {r.variant} ({', '.join(f'{name} {value:.0f}%' for name, value in shares)})")
        for r in found
        for shares in [
            [
                (name, value)
                for name, value in (
                    ("of copy bandwidth", r.pct_bandwidth),
                    ("of matmul peak", r.pct_peak_flops),
                    ("of the roof", r.pct_roof),
                )
                if value is not None and value > ABOVE_CEILING_PCT
            ]
        ]
        if shares
    ]
    out = []
    busy = [text for r, text in over if r.roof.loaded]
    if busy:  # a ceiling measured on a busy machine is a share of it: the variant beat a low roof
        roofs = {r.roof.device: r.roof for r, _ in over if r.roof.loaded}
        under = "; ".join(f"{roof.device} at {roof.load_words()}" + _peak_words(roof) for roof in roofs.values())
        out.append(
            f"Above the measured ceilings, marked (!): {'; '.join(busy)}. The ceilings were measured while "
            f"the machine was under load ({under}): the calibration got a share of the machine, so the roof "
            "is too low and these shares read high; the readings are not evidence of caching. Calibrate "
            "on a quieter machine for a roof to read them against."
        )
    quiet = [text for r, text in over if not r.roof.loaded]
    if quiet:
        out.append(
            f"Above the measured ceilings, marked (!): {'; '.join(quiet)}. No device beats its own measured "
            "peak: these are not its memory or matmul rates. Likely the data stayed in cache between calls "
            "(a small working set: the calibration copies buffers far larger than any cache), or the "
            "technique counts more FLOPs or bytes than the call does."
        )
    return out


def _peak_words(roof: Roof) -> str:
    return f", matmul peak {_num(roof.peak_tflops)} TFLOP/s" if roof.peak_tflops else ""


def _roof_notes(found: Sequence[Reading]) -> list[str]:
    out = []
    for roof in device_roofs(found).values():
        if roof.missing:
            absolute = (
                ""
                if roof.peak_tflops or roof.peak_gbps
                else ("; the rates are absolute (TFLOP/s, GB/s), with no share of a peak")
            )
            out.append(f"No roof for {roof.device}: {roof.missing}{absolute}.")
        elif roof.on_cpu:
            at = f" (n={roof.matmul_n})" if roof.matmul_n else ""
            out.append(
                f"The ceilings are this CPU's, not a GPU's: a {roof.dtype or 'float32'} matmul{at} and a "
                f"memory copy measured when the run started, on {roof.device}."
            )
        elif roof.matmul_n and roof.matmul_n < GPU_PEAK_MATMUL_N:
            out.append(
                f"The matmul peak of {roof.device} was measured at n={roof.matmul_n} (a quick calibration "
                f"before gpubench measured at n={GPU_PEAK_MATMUL_N}), where a large GPU reaches well under "
                "its peak: every share of that peak reads high."
            )
        if not roof.missing and roof.loaded:
            out.append(
                f"The ceilings of {roof.device} were measured under {roof.load_words()} (more runnable work "
                "than cores): they are a share of the machine, and every share of them reads high."
            )
    return out


def _uneven_counts(found: Sequence[Reading]) -> list[str]:
    counts: dict[int, set[tuple[float | None, float | None]]] = {}
    for r in found:
        counts.setdefault(r.number, set()).add((r.flops, r.bytes_moved))
    uneven = [f"#{n}" for n, seen in counts.items() if len(seen) > 1]
    if not uneven:
        return []
    return [
        f"Case{'s' if len(uneven) > 1 else ''} {', '.join(uneven)}: the variants recorded different FLOP or byte "
        "counts, so they are not read against one problem (the technique counts what each variant does, not "
        "what the case needs)."
    ]


def _no_roofline(found: Sequence[Reading]) -> list[str]:
    if any(r.intensity for r in found):
        return []
    if not any(r.flops for r in found):
        read = (
            "each variant's share of the measured copy bandwidth"
            if any(r.pct_bandwidth for r in found)
            else "each variant's GB/s"
        )
        return [
            "No roofline: this technique counts the bytes a step must move but no FLOPs (a memory-bound "
            f"step); read {read}."
        ]
    if not any(r.bytes_moved for r in found):
        read = "each variant's share of the matmul peak" if any(r.pct_peak_flops for r in found) else "its TFLOP/s"
        return [
            "No roofline: this technique counts FLOPs but not the bytes moved, so its arithmetic intensity is "
            f"unknown; read {read}."
        ]
    return []


def device_roofs(found: Sequence[Reading]) -> dict[str, Roof]:
    """Per device model, the roof of its first case (what its figure draws): several GPUs of one
    model each calibrate, and one figure per model reads better than one per GPU whose ceilings
    differ by a few percent."""
    roofs: dict[str, Roof] = {}
    for r in found:
        roofs.setdefault(r.roof.device, r.roof)
    return roofs


def chart_groups(found: Sequence[Reading]) -> list[tuple[Roof, dict[str, list[tuple[float, float, str]]]]]:
    """What the roofline figure plots, per device model the cases ran on (its roof): per variant,
    its points (intensity, TFLOP/s, the case's number)."""
    roofs = device_roofs(found)
    groups: dict[str, dict[str, list[tuple[float, float, str]]]] = {}
    for r in found:
        if r.intensity is not None and r.tflops is not None:
            points = groups.setdefault(r.roof.device, {}).setdefault(r.variant, [])
            points.append((r.intensity, r.tflops, f"#{r.number}"))
    return [(roofs[device], series) for device, series in groups.items()]
