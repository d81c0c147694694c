"""Where each stage thread's wall time goes (the `ct200-threadtime` contender; issue 22).

Installed in the benchmark's own child process before it stages, never in ct200-stage itself:
it wraps the system calls the copy engine makes (preadv, pwrite, posix_fadvise DONTNEED) and its
hasher's update, and adds up per thread how long each took. What is left of a thread's busy span
(its first call to its last) is "other": waits for the per-file write lock, the interpreter, the
journal. Read time includes waiting for the disk and the copy out of the page cache; write time
the copy into the tmpfs and its page allocations. A thread that waits for the GIL after a call
counts that wait in the call, so the shares are of wall time, not CPU.

Wrapping the calls, not the engine's own functions, keeps this working whatever the engine's
inner structure; a wrapper costs about a microsecond per 1 MiB read, well under 0.1% of it.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

PARTS = ("read", "hash", "write", "drop")


class _Clock:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.threads: list[dict[str, float]] = []
        self.local = threading.local()

    def mine(self) -> dict[str, float]:
        row: dict[str, float] | None = getattr(self.local, "row", None)
        if row is None:
            row = dict.fromkeys(PARTS, 0.0) | {"first": 0.0, "last": 0.0}
            self.local.row = row
            with self.lock:
                self.threads.append(row)
        return row

    def timed(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                t1 = time.perf_counter()
                row = self.mine()
                row[part] += t1 - t0
                row["first"] = row["first"] or t0
                row["last"] = t1

        return wrapper

    def summary(self) -> dict[str, object]:
        # The copy's threads: the main thread's one call (the lock file's pwrite) is not one.
        busy = [r for r in self.threads if r["read"]]
        span = sum(r["last"] - r["first"] for r in busy)
        seconds = {p: sum(r[p] for r in busy) for p in PARTS}
        seconds["other"] = max(0.0, span - sum(seconds.values()))
        return {
            "threads": len(busy),
            "thread_seconds": round(span, 3),
            "seconds": {k: round(v, 3) for k, v in seconds.items()},
            "share": {k: round(v / span, 3) if span else 0.0 for k, v in seconds.items()},
        }


def install(out: str) -> None:
    """Time the engine's calls in this process; write the summary as JSON to `out` at exit."""
    from ct200_tools.stage import engine  # noqa: PLC0415 - patched before anything stages

    clock = _Clock()
    os.preadv = clock.timed("read", os.preadv)
    os.pwrite = clock.timed("write", os.pwrite)
    fadvise = os.posix_fadvise
    timed_drop = clock.timed("drop", fadvise)

    def posix_fadvise(fd: int, offset: int, length: int, advice: int) -> None:
        (timed_drop if advice == os.POSIX_FADV_DONTNEED else fadvise)(fd, offset, length, advice)

    os.posix_fadvise = posix_fadvise
    new_hasher = engine.new_hasher

    class _Timed:
        def __init__(self, inner: Any) -> None:
            self.inner = inner
            self.update = clock.timed("hash", inner.update)

        def hexdigest(self) -> str:
            return str(self.inner.hexdigest())

    engine.new_hasher = lambda algorithm: _Timed(new_hasher(algorithm))  # type: ignore[assignment]

    def write() -> None:
        with open(out, "w", encoding="utf-8") as fh:
            json.dump(clock.summary(), fh)

    atexit.register(write)
