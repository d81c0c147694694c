"""The probes' only door to the machine: a reader rooted at a directory.

The file reads a staged tree needs (read_regular, listdir, stat, open_binary, lock_holder...)
come from stage/reader.TreeReader, which the stager owns and reads through itself.

Production reads "/"; tests point `root` at a tree of files recorded on real machines and, for
what a tree cannot hold (char devices, open() errors), override `stat_node` and `try_open`.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field

from ct200_tools import serverhttp
from ct200_tools.stage.reader import TreeReader


@dataclass(frozen=True)
class NodeStat:
    is_char: bool
    major: int
    minor: int
    mode: int


@dataclass(frozen=True)
class Ran:
    """A finished command: its exit status and output (decoded, errors replaced)."""

    returncode: int
    stdout: str
    stderr: str


class RunTimeout(OSError):
    """A command or request that did not finish within its deadline (it was killed)."""


@dataclass
class Reader(TreeReader):
    """root (from TreeReader): the directory read as "/"."""

    #: Re-hash staged models instead of comparing sizes (`check --deep`): seconds per GB.
    deep: bool = False
    #: Filled by the probes: "<probe>.<what>" -> reason. One dict per run, so probes running in
    #: parallel each write their own keys.
    unreadable: dict[str, str] = field(default_factory=dict)

    def read_text(self, p: str) -> str:
        return self.path(p).read_text(encoding="utf-8", errors="replace")

    def read_bytes(self, p: str) -> bytes:
        return self.path(p).read_bytes()

    def exists(self, p: str) -> bool:
        return self.path(p).exists()

    def statvfs(self, p: str) -> os.statvfs_result:
        return os.statvfs(self.path(p))

    def stat_node(self, p: str) -> NodeStat | None:
        """lstat a device node; None when absent. Raises OSError for other failures."""
        try:
            st = os.lstat(self.path(p))
        except FileNotFoundError:
            return None
        return NodeStat(
            is_char=stat.S_ISCHR(st.st_mode),
            major=os.major(st.st_rdev),
            minor=os.minor(st.st_rdev),
            mode=stat.S_IMODE(st.st_mode),
        )

    def try_open(self, p: str) -> int:
        """open(O_RDWR) and close at once: 0 or the errno. This is what libcuda does first.

        O_NONBLOCK|O_NOCTTY keep a wrong node (a tty, a fifo) from blocking or grabbing us.
        """
        try:
            fd = os.open(self.path(p), os.O_RDWR | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError as exc:
            return exc.errno or errno.EIO
        os.close(fd)
        return 0

    def first_text(self, *paths: str) -> str | None:
        """The stripped content of the first of these files that is readable and not empty."""
        for p in paths:
            try:
                value = self.read_text(p).strip()
            except OSError:
                continue
            if value:
                return value
        return None

    def readlink(self, p: str) -> str:
        return os.readlink(self.path(p))

    def run(self, argv: list[str], timeout_s: float, env: Mapping[str, str] | None = None) -> Ran:
        """Run a command (an argv list, no shell) with its stdin closed, killed past timeout_s.
        OSError when it cannot start (FileNotFoundError: no such program); RunTimeout when it
        was killed."""
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout_s,
                env=dict(env) if env is not None else None,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise RunTimeout(f"{argv[0]} did not finish within {timeout_s:g} s") from None
        return Ran(
            done.returncode,
            done.stdout.decode(errors="replace"),
            done.stderr.decode(errors="replace"),
        )

    def connect(self, host: str, port: int, timeout_s: float) -> None:
        """Open and close a TCP connection; OSError (ConnectionRefusedError, TimeoutError...)
        when it cannot be made."""
        with socket.create_connection((host, port), timeout=timeout_s):
            pass

    def request(
        self, method: str, url: str, body: bytes | None, timeout_s: float
    ) -> tuple[int, bytes]:
        """One HTTP request through the one client (ct200_tools.httpclient): the status and the
        whole body, all within timeout_s. An OSError when there is no complete answer
        (httpclient.HttpTimeout past the deadline); httpclient.Redirected for a 3xx, which is
        never followed: the answer must come from the port that was asked."""
        return serverhttp.request(method, url, body, timeout_s)

    def note(self, key: str, why: str) -> None:
        self.unreadable.setdefault(key, why)

    def read_or_note(self, p: str, key: str) -> str | None:
        """Read a text file, or record why not and return None."""
        try:
            return self.read_text(p)
        except OSError as exc:
            self.note(key, f"cannot read {p}: {exc.strerror or exc}")
            return None


class SshError(Exception):
    """The host cannot be read over SSH: the message names the host and the fix. Here, not in
    probes/ssh.py, so that --host local and the CLI catch it without importing paramiko."""
