"""Byte sizes as we print them (parsing is the spec's parse_size, so sizes read alike)."""

from __future__ import annotations


def format_size(n: int | float) -> str:
    """Decimal units, matching how disks and `df -H` report and how GB/s rates are quoted."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")
