"""Progress for people at a terminal: one line, redrawn a few times a second, on stderr."""

from __future__ import annotations

import threading
import time
from typing import Protocol, TextIO

from ct200_tools.stage.sizes import format_size


class ProgressSink(Protocol):
    def start(self, label: str, total: int) -> None: ...

    def advance(self, n: int) -> None: ...

    def finish(self) -> None: ...


class NullProgress:
    def start(self, label: str, total: int) -> None:
        pass

    def advance(self, n: int) -> None:
        pass

    def finish(self) -> None:
        pass


class TtyProgress:
    def __init__(self, stream: TextIO, interval: float = 0.25) -> None:
        self.stream = stream
        self.interval = interval
        self._lock = threading.Lock()
        self._done = 0
        self._total = 0
        self._label = ""
        self._t0 = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, label: str, total: int) -> None:
        self.finish()
        self._label, self._total, self._done = label, total, 0
        self._t0 = time.monotonic()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="progress", daemon=True)
        self._thread.start()

    def advance(self, n: int) -> None:
        with self._lock:
            self._done += n

    def finish(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._draw()
        self.stream.write("\n")
        self.stream.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._draw()

    def _draw(self) -> None:
        with self._lock:
            done = self._done
        elapsed = max(time.monotonic() - self._t0, 1e-6)
        rate = done / elapsed
        pct = 100.0 * done / self._total if self._total else 100.0
        eta = (self._total - done) / rate if rate > 0 else 0.0
        self.stream.write(
            f"\r{self._label}: {format_size(done)} / {format_size(self._total)} ({pct:5.1f}%) "
            f"{format_size(rate)}/s, {eta:.0f} s left  "
        )
        self.stream.flush()
