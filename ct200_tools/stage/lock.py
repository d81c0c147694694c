"""One stage of a target at a time: an flock on a file beside the target.

flock is released by the kernel when the holder dies, kill -9 included, so there is no stale lock to
clean up after a crash; the pid written into the file is only there to name the holder in messages.
The lock file is never deleted: unlinking a lock file lets a third process lock a new inode while
the second still holds the old one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterator

from ct200_tools.stage.errors import LockBusyError


def lock_path_for(target: str) -> str:
    parent, name = os.path.split(os.path.abspath(target))
    return os.path.join(parent, f".{name}.ct200-lock")


@contextlib.contextmanager
def target_lock(target: str, what: str, wait: float = 0.0) -> Iterator[None]:
    """Hold the lock of `target` for the block; wait up to `wait` seconds for another holder."""
    path = lock_path_for(target)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
                if time.monotonic() >= deadline:
                    raise LockBusyError(
                        f"another stage of {what} is running (pid {_holder(fd)}; lock {path})",
                        "wait for it to finish, or pass --wait SECONDS to queue behind it",
                    ) from None
                time.sleep(0.1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the flock


def holder_pid(target: str) -> int | None:
    """The pid holding the lock of target, or None when nobody does (for status displays)."""
    text = held_by(lock_path_for(target))
    if text is None:
        return None
    return int(text) if text.isdigit() else -1


def held_by(path: str) -> str | None:
    """The text of lock file `path` while another process holds its flock (a running stage
    writes its pid there; "" when unreadable); None when nobody holds it or there is no such
    file. Finding it free means holding a shared lock for an instant. The doctor's Reader asks
    through here too."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            try:
                return os.pread(fd, 32, 0).decode(errors="replace").strip()
            except OSError:
                return ""
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _holder(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    except OSError:
        return "unknown"
