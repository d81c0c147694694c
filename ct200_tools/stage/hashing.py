"""The fast content hash: XXH3-128 when the xxhash package is there, BLAKE2b-128 when it is not.

XXH3 runs at >10 GB/s per core, so hashing inline never limits a copy; BLAKE2b (~1 GB/s per core,
in the standard library) keeps the tool working on a machine without the wheel, at the cost of CPU.
The manifest records which one made it, and verification always uses the manifest's algorithm.
Both release the GIL on large buffers, which is what lets the copy threads hash in parallel.
"""

from __future__ import annotations

import hashlib
from typing import Any, Protocol, cast

XXH3_128 = "xxh3-128"
BLAKE2B_128 = "blake2b-128"
ALGORITHMS = (XXH3_128, BLAKE2B_128)


class Hasher(Protocol):
    def update(self, data: Any, /) -> None: ...

    def hexdigest(self) -> str: ...


def _xxhash() -> Any | None:
    try:
        import xxhash  # noqa: PLC0415 - optional: absent on machines that get no wheels
    except ImportError:
        return None
    return xxhash


def available() -> tuple[str, ...]:
    return ALGORITHMS if _xxhash() is not None else (BLAKE2B_128,)


def default_algorithm() -> str:
    return XXH3_128 if _xxhash() is not None else BLAKE2B_128


def new_hasher(algorithm: str) -> Hasher:
    if algorithm == XXH3_128:
        module = _xxhash()
        if module is None:
            raise LookupError(
                "this manifest was made with xxh3-128 but the xxhash package is not installed"
            )
        return cast(Hasher, module.xxh3_128())
    if algorithm == BLAKE2B_128:
        return hashlib.blake2b(digest_size=16)
    raise LookupError(f"unknown hash algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")
