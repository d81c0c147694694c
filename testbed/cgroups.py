"""A cgroup of its own for every machine, so that machines never share one and teardown can find
(and kill) every process a machine left, even after its systemd-nspawn was killed.

With ``--keep-unit --register=no`` systemd-nspawn splits the cgroup it was started in into
``payload`` and ``supervisor``. Started from the root cgroup, two machines would share them; so
each nspawn is moved, before it execs, into ``ct200-testbed/slot-N/NAME`` of the hierarchies
nspawn uses: the cgroup2 one and, on a hybrid host, the v1 ``name=systemd`` one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from testbed.errors import TestbedError


@dataclass(frozen=True)
class Hierarchy:
    mountpoint: Path
    #: "v2" (cgroup2) or "systemd" (the v1 name=systemd hierarchy of a hybrid host).
    kind: str


def hierarchies(mountinfo: str | None = None) -> list[Hierarchy]:
    """The hierarchies systemd-nspawn places a machine in, from /proc/self/mountinfo."""
    text = Path("/proc/self/mountinfo").read_text() if mountinfo is None else mountinfo
    found: list[Hierarchy] = []
    for line in text.splitlines():
        fields = line.split()
        sep = fields.index("-")
        mountpoint, fstype, options = fields[4], fields[sep + 1], fields[sep + 3]
        if fstype == "cgroup2":
            found.append(Hierarchy(Path(mountpoint), "v2"))
        elif fstype == "cgroup" and "name=systemd" in options.split(","):
            found.append(Hierarchy(Path(mountpoint), "systemd"))
    if not found:
        raise TestbedError(
            "no cgroup hierarchy is mounted (neither cgroup2 nor name=systemd)",
            fix="mount cgroup2 on /sys/fs/cgroup (`mount -t cgroup2 none /sys/fs/cgroup`)",
        )
    return found


def nspawn_env(found: list[Hierarchy]) -> dict[str, str]:
    """Give the machines the pure cgroup2 layout that PVE 8 containers have, where the host can.

    On a hybrid host systemd-nspawn would otherwise pick the legacy layout, whose controller
    symlinks fail inside the machine (cpu and cpuacct are separate hierarchies there).
    """
    if any(h.kind == "v2" for h in found):
        return {"SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"}
    return {}


def machine_dirs(found: list[Hierarchy], rel: str, name: str) -> list[Path]:
    return [h.mountpoint / rel / name for h in found]


def slot_dirs(found: list[Hierarchy], rel: str) -> list[Path]:
    return [h.mountpoint / rel for h in found]


def create(dirs: list[Path]) -> None:
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)


def enter(dirs: list[Path]) -> None:
    """Move the calling process into ``dirs`` (runs in the child between fork and exec)."""
    pid = str(os.getpid())
    for d in dirs:
        (d / "cgroup.procs").write_text(pid)


def procs(dirs: list[Path]) -> set[int]:
    """Every process in ``dirs`` and below."""
    pids: set[int] = set()
    for top in dirs:
        if not top.is_dir():
            continue
        for root, _subdirs, _files in os.walk(top):
            with contextlib.suppress(OSError):
                text = (Path(root) / "cgroup.procs").read_text()
                pids.update(int(p) for p in text.split())
    return pids


def kill(dirs: list[Path], timeout: float = 10.0) -> int:
    """SIGKILL everything in ``dirs``; returns how many processes there were."""
    first = procs(dirs)
    deadline = time.monotonic() + timeout
    left = first
    while left:
        for d in dirs:
            with contextlib.suppress(OSError):
                (d / "cgroup.kill").write_text("1")
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
        left = procs(dirs)
        if time.monotonic() > deadline:
            raise TestbedError(
                f"processes {sorted(left)} survived SIGKILL in {', '.join(map(str, dirs))}",
                fix="check them with `ps -o pid,stat,cmd -p PID` (D state: stuck in the kernel)",
            )
    return len(first)


def remove(dirs: list[Path], timeout: float = 5.0) -> None:
    """Remove ``dirs`` and the cgroups nspawn and the machine's systemd made below them."""
    deadline = time.monotonic() + timeout
    for top in dirs:
        while top.is_dir():
            try:
                for root, _subdirs, _files in os.walk(top, topdown=False):
                    Path(root).rmdir()
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise TestbedError(
                        f"cannot remove cgroup {top}: {exc}",
                        fix="a process is still in it: `cat` its cgroup.procs and end it",
                    ) from exc
                time.sleep(0.1)
