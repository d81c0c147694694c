"""Byte sizes as people write them ("64G", "1.5TiB") and as we print them."""

from __future__ import annotations

import re

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Bytes from "64G", "512M", "1.5T", "4096" (binary multiples, as tmpfs's size= reads them)."""
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must not be negative: {text}")
        return text
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"not a size: {text!r} (examples: 64G, 512M, 1.5T, 4096)")
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit.upper()])


def format_size(n: int | float) -> str:
    """Decimal units, matching how disks and `df -H` report and how GB/s rates are quoted."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")
