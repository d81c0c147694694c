"""Byte sizes as the spec writes them: binary units, as tmpfs's size= option reads them.

A size here means the same as in the mount that uses it, so 1200G is 1200 GiB. No imports from
the rest of the package: ct200-stage's --reserve parses sizes with the same function.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Final

_SIZE_RE: Final = re.compile(r"([0-9]{1,30}(?:\.[0-9]{1,30})?)\s*([kmgtpe]?)(i?b?)", re.IGNORECASE)
_SHIFTS: Final = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40, "p": 50, "e": 60}
#: What every size error quotes, so a reader sees the accepted forms once.
FORMS: Final = (
    "write e.g. 1200G, 1200GiB, 512M, 1.5T or 4096B (bytes); K/M/G/T are binary, as for tmpfs"
)


class NoUnitError(ValueError):
    """A size without a unit where one is required: 1200 would silently mean 1200 bytes."""

    def __init__(self, number: str) -> None:
        self.number = number
        super().__init__(f"{number} has no unit, so it would mean {number} bytes")


def parse_size(value: str | int, *, unit_required: bool = False) -> int:
    """Bytes from a size as tmpfs takes it: 1200G, 512M, 1.5T, 64GiB, 100B, 4096 or an int.

    K/M/G/T/P/E are powers of 1024; "GB" is refused as ambiguous. Fractions round up to a byte.
    With unit_required, a bare number other than 0 (an int, or a string without K..E or B) is
    refused with NoUnitError: in a spec, `size: 1200` is a slip for 1200G far more often than a
    wish for 1200 bytes. Raises ValueError, with the accepted forms, on anything else.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"a size is a string like 1200G or an integer, not {type(value).__name__}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        if value >= 10**30:  # str() would refuse ints of thousands of digits
            raise ValueError(f"a number of {value.bit_length()} bits is too large for a size")
        if unit_required and value:
            raise NoUnitError(str(value))
        return value
    match = _SIZE_RE.fullmatch(value.strip())
    unit, suffix = (match.group(2).lower(), match.group(3).lower()) if match else ("", "")
    if match is None or (suffix in ("i", "ib") and not unit) or (suffix == "b" and unit):
        shown = value if len(value) <= 40 else value[:37] + "..."
        reason = (
            f"{unit.upper()}B is ambiguous (powers of 1000 or 1024?)" if match else "not a size"
        )
        raise ValueError(f"{shown!r}: {reason}; {FORMS}")
    size = math.ceil(Fraction(match.group(1)) * (1 << _SHIFTS[unit]))
    if unit_required and size and not (unit or suffix):
        raise NoUnitError(match.group(1))
    return size


def format_size(size: int) -> str | int:
    """The exact size in the largest binary unit that divides it (1200G, 4096B); 0 stays 0.

    parse_size(format_size(n), unit_required=True) == n for every n >= 0.
    """
    if size == 0:
        return 0
    for unit in ("E", "P", "T", "G", "M", "K"):
        shift = _SHIFTS[unit.lower()]
        if size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return f"{size}B"
