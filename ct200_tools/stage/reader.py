"""Reading a staged tree's files: the file side of the doctor's Reader, owned by the stager.

The doctor's probes read the machine through probes/base.Reader, which extends this class;
`ct200-stage status` reads through this one directly. So the stager owns how a staged tree is
read, and nothing in the stage package imports the doctor's probes or checks.

Production reads "/"; tests point `root` at a tree of their own.
"""

from __future__ import annotations

import errno
import io
import os
from dataclasses import dataclass
from pathlib import Path

from ct200_tools.stage.lock import held_by
from ct200_tools.untrusted import UntrustedInputError, read_bounded


@dataclass
class TreeReader:
    root: Path = Path("/")

    def path(self, p: str) -> Path:
        return self.root / p.lstrip("/")

    def read_regular(self, p: str, max_bytes: int) -> bytes:
        """A file written by someone else (a marker, a manifest): a regular file of at most
        max_bytes, read by untrusted.read_bounded, so a FIFO or a device there is refused at once
        instead of hanging the probe. Refusals are OSError (FileNotFoundError when absent) with
        the reason as strerror, as any other unreadable file."""
        try:
            return read_bounded(self.path(p), "file", max_bytes, "")
        except UntrustedInputError as exc:
            if exc.problem == "missing":
                raise FileNotFoundError(errno.ENOENT, "no such file", p) from None
            raise OSError(errno.EINVAL, exc.reason, p) from None

    def listdir(self, p: str) -> list[str]:
        return sorted(os.listdir(self.path(p)))

    def stat(self, p: str) -> os.stat_result:
        """stat(), following symlinks."""
        return os.stat(self.path(p))

    def lstat(self, p: str) -> os.stat_result:
        return os.lstat(self.path(p))

    def is_dir(self, p: str) -> bool:
        return self.path(p).is_dir()

    def is_file(self, p: str) -> bool:
        return self.path(p).is_file()

    def open_binary(self, p: str) -> io.FileIO:
        """Unbuffered, read-only: for reading large files in chunks (readinto a reused buffer)."""
        return io.FileIO(self.path(p), "r")

    def lock_holder(self, p: str) -> str | None:
        """The text of lock file p while another process holds an flock on it (a running stage
        writes its pid there); None when nobody holds it or there is no such file. Finding it
        free means holding a shared lock for an instant, as ct200-stage's own status does."""
        return held_by(str(self.path(p)))
