"""The results store: append-only, whole or absent, resumable.

```
OUT/results.jsonl                one finished point a line, every run's (append-only)
OUT/runs/<run-id>/provenance.json   what ran, where, against what; rewritten whole at the end
```
A point is appended only once it is finished, as one write() of one line followed by fsync, so a
run killed mid-way keeps every finished point and loses only the point in flight. A write that
fails (ENOSPC, EIO) is undone by truncating the file back to its length before, so a full disk
leaves no half line; a line torn by a crash of the machine itself (no newline at the end) is
ignored by readers and reported. Runs into the same --out may write at once: appends and the cut
of a torn tail hold the file's lock (flock), so no line is cut or mixed by another run's.
provenance.json is written beside and renamed (fsutil), so it is
always whole. An --out that is not a directory, or a results file that is not a regular file (a
FIFO, a device, a directory; symlinks are followed to what they name), is refused before any
request (`Store.check`), and the file is opened without blocking and judged on the open
descriptor, so a FIFO swapped in later cannot hang the run either.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from ct200_tools.fsutil import fsync_dir, write_atomic
from ct200_tools.untrusted import UntrustedInputError, file_kind, load_json, read_bounded, show

RESULTS: Final = "results.jsonl"
RUNS: Final = "runs"
PROVENANCE: Final = "provenance.json"
#: The most a results file may be when read back (a point is a few KiB: millions of points).
MAX_RESULTS_BYTES: Final = 1 << 30
MAX_PROVENANCE_BYTES: Final = 16 << 20


class StoreError(Exception):
    """The store could not be written (disk full, permissions); what was written before is whole."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


def append_line(path: Path, record: dict[str, object]) -> None:
    """Append one JSON line durably, or leave the file exactly as it was."""
    data = (json.dumps(record, sort_keys=True, allow_nan=False) + "\n").encode()
    fd = _open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        # Another run into the same --out appends too, and a starting one cuts a torn tail: under
        # the file's lock nobody sees this line half written, and an undo cuts only this line.
        fcntl.flock(fd, fcntl.LOCK_EX)
        before = os.fstat(fd).st_size
        try:
            written = os.write(fd, data)
            if written != len(data):  # a short write: the disk filled up under us
                raise OSError(28, os.strerror(28))
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, before)
                os.fsync(fd)
            raise
    finally:
        os.close(fd)


class NotRegular(OSError):
    """The path is there but is no regular file (a FIFO, a device, a directory)."""


def _not_regular(path: Path, mode: int) -> str:
    return f"{show(str(path))} is {file_kind(mode)}, not a regular file"


def _open_regular(path: Path, flags: int) -> int:
    """A descriptor of the regular file `path`, opened without blocking (a FIFO opens at once
    or fails instead of waiting for a reader) and judged by fstat on that descriptor."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # a FIFO without a reader, a socket
            raise
        raise NotRegular(errno.ENXIO, _not_regular(path, os.stat(path).st_mode)) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegular(errno.EINVAL, _not_regular(path, mode))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


@dataclass
class Lines:
    records: list[dict[str, object]] = field(default_factory=list)
    #: A last line without its newline: a write torn by a crash; ignored.
    torn: bool = False


def read_lines(path: Path) -> Lines:
    """Every point of a results file; a line that is not a JSON object is an error naming it."""
    fix = f"{path} is written only by ct200-bench; restore it, or move it away to start afresh"
    out = Lines()
    if not path.exists():
        return out
    data = read_bounded(path, "the results file", MAX_RESULTS_BYTES, fix)
    lines = data.split(b"\n")
    if lines and lines[-1] != b"":
        out.torn = True
    for number, raw in enumerate(lines[:-1], 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError):
            record = None
        if not isinstance(record, dict):
            raise UntrustedInputError(
                f"the results file {show(str(path))}, line {number}, is not a JSON object", fix
            )
        out.records.append(record)
    return out


class Store:
    """One output directory: its results file and its runs."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.results = self.root / RESULTS
        self._held: list[int] = []

    def check(self) -> None:
        """Refuse, before any request, an --out that is no directory and a results file or runs
        directory of the wrong kind: a FIFO would hang the first write, a device eat it."""
        for path, want_dir in ((self.root, True), (self.root / RUNS, True), (self.results, False)):
            try:
                mode = os.stat(path).st_mode
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise self._error(exc, show(str(path))) from None
            if stat.S_ISDIR(mode) if want_dir else stat.S_ISREG(mode):
                continue
            wanted = "a directory" if want_dir else "a regular file"
            kind = "a file" if stat.S_ISREG(mode) else file_kind(mode)
            raise StoreError(
                f"cannot write results: {show(str(path))} is {kind}, not {wanted}",
                "pass as --out a directory you can write (it is created if missing), whose "
                f"{RESULTS} is a regular file ct200-bench wrote, or move that path away",
            )

    def run_dir(self, run_id: str) -> Path:
        return self.root / RUNS / run_id

    def start(self, run_id: str, provenance: dict[str, object]) -> None:
        """A new run's directory, claimed (claim) before its provenance makes it resumable."""
        try:
            self.run_dir(run_id).mkdir(parents=True, exist_ok=True)
            fsync_dir(str(self.root / RUNS))
            self.claim(run_id)
            self.write_provenance(run_id, provenance)
        except OSError as exc:
            raise self._error(exc, "the run's provenance") from None

    def claim(self, run_id: str) -> None:
        """This process writes run `run_id` until release(): another process resuming it while
        it runs is refused, where it would measure the remaining points a second time. The lock
        is the run directory's own (flock), so a run killed outright leaves none behind."""
        try:
            fd = os.open(self.run_dir(run_id), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise self._error(exc, "the run's directory") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreError(
                f"run {show(run_id)} in {show(str(self.root))} is still running in another "
                "process: a second writer would measure its remaining points again",
                "let that run finish, or stop it (Ctrl-C) and run --resume again; or run "
                "without --resume to start a new run into this --out",
            ) from None
        self._held.append(fd)

    def release(self) -> None:
        """The runs this process claimed are free for a --resume."""
        while self._held:
            os.close(self._held.pop())

    def write_provenance(self, run_id: str, provenance: dict[str, object]) -> None:
        try:
            text = json.dumps(provenance, indent=1, sort_keys=True, allow_nan=False) + "\n"
            write_atomic(str(self.run_dir(run_id) / PROVENANCE), text)
        except OSError as exc:
            raise self._error(exc, "the run's provenance") from None

    def repair_tail(self) -> int:
        """Cut a torn last line (a crash of the machine mid-write) so the next point starts a
        line of its own; returns the bytes cut (0 when the file ends with a newline)."""
        try:
            fd = _open_regular(self.results, os.O_RDWR)
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise self._error(exc, "the results file") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # a line another run is writing is not torn
            size = os.fstat(fd).st_size
            keep = size
            while keep > 0:
                step = min(keep, 1 << 16)
                block = os.pread(fd, step, keep - step)
                newline = block.rfind(b"\n")
                if newline >= 0:
                    keep = keep - step + newline + 1
                    break
                keep -= step
            if keep != size:
                os.ftruncate(fd, keep)
                os.fsync(fd)
            return size - keep
        except OSError as exc:
            raise self._error(exc, "the results file") from None
        finally:
            os.close(fd)

    def add_point(self, record: dict[str, object]) -> None:
        try:
            append_line(self.results, record)
        except OSError as exc:
            raise self._error(exc, "a finished point") from None

    def _error(self, exc: OSError, what: str) -> StoreError:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            fix = "free space on that filesystem or pass another --out"
        else:
            fix = "pass as --out a directory you can write (it is created if missing)"
        return StoreError(
            f"cannot write {what} under {show(str(self.root))}: {show(exc.strerror or exc)}",
            f"{fix}; the points written before are whole, and --resume continues from them",
        )

    def provenance(self, run_id: str) -> dict[str, object]:
        path = self.run_dir(run_id) / PROVENANCE
        data = load_json(
            path, "the run's provenance", MAX_PROVENANCE_BYTES, "it is written by ct200-bench"
        )
        if not isinstance(data, dict):
            raise UntrustedInputError(
                f"{show(str(path))} is not a JSON object", "it is written by ct200-bench"
            )
        return data

    def runs(self) -> Iterator[str]:
        base = self.root / RUNS
        if base.is_dir():
            yield from sorted(p.name for p in base.iterdir() if (p / PROVENANCE).is_file())

    def points(self, run_id: str | None = None) -> list[dict[str, object]]:
        records = read_lines(self.results).records
        return [r for r in records if run_id is None or r.get("run_id") == run_id]

    def last_run(self) -> str | None:
        runs = list(self.runs())
        return runs[-1] if runs else None
