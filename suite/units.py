"""Quantities as a person reads them, for every layer: :func:`human_bytes` ("1.5 GiB").

In the base layer (it imports nothing of gpubench) so that a report, a terminal table and the KV
calculator say sizes the same way without the report importing the calculator (60 ms of every
report's start, with the model configs it reads)."""

from __future__ import annotations


def human_bytes(n: float | None) -> str:
    """``n`` bytes in binary units to three significant figures ("512 B", "1.5 GiB"); "-" for None."""
    if n is None:
        return "-"
    sign, n = ("-" if n < 0 else ""), abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.3g} {unit}" if unit != "B" else f"{sign}{n:.0f} B"
        n /= 1024
    return f"{sign}{n:.3g} TiB"
