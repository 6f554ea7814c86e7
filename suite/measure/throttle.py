"""NVML clock-event ("throttle") reasons: the bitmask decoded into names, and which names say the
GPU ran slower than it could (the others are benign: an idle GPU, clocks someone asked for)."""

from __future__ import annotations

from collections.abc import Iterable

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
