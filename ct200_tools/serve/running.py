"""Whether a server's process runs what its files say now (issue 33: the tools described the
unit file, not the process; a port changed in the unit while the process still listened on the
old one read as serving on the new one).

A running server is on an older configuration when systemd has not read its changed unit
(NeedDaemonReload=yes), when its unit, EnvironmentFile or config file was written after its
main process started (the process read them at its start, never since), or when the main
process's command line is not its unit's ExecStart= (a unit file put back with an older time,
`cp -p`). The fix is the restart that applies them, which `ansible-playbook ... site.yml` also
does.

The command line is compared only where it can be told: the kernel's argv of the main process
ends with the unit's ExecStart= words (an interpreter a script's #! names comes first), or its
program is the unit's with other words. A process that exec'd another program or rewrote its
title (Python engines' setproctitle), or a unit with drop-ins (which may replace ExecStart=), is
not judged by it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from ct200_tools.serve.engines import exec_start as parse_exec_start
from ct200_tools.serve.systemd import Systemd, SystemdError
from ct200_tools.systemctl import show_blocks
from ct200_tools.untrusted import show

PROPERTIES: Final = (
    "Id",
    "ActiveState",
    "MainPID",
    "NeedDaemonReload",
    "FragmentPath",
    "ExecMainStartTimestampMonotonic",
    "DropInPaths",
)
#: File times are whole seconds on some filesystems, the start time microseconds: a file written
#: in the same second as the start is not "after" it.
SLACK_S: Final = 1.0


#: A command line longer than this is not read (a real one is a few KB).
CMDLINE_MAX = 1 << 20
UNIT_MAX = 1 << 20


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _read(path: str | os.PathLike[str], limit: int) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError:
        return None
    return data if len(data) <= limit else None


def proc_cmdline(
    pid: int, root: Callable[[str], str | os.PathLike[str]] = lambda p: p
) -> list[str] | None:
    """/proc/PID/cmdline as words; None when it cannot be read (gone, not ours to read)."""
    data = _read(root(f"/proc/{pid}/cmdline"), CMDLINE_MAX)
    if not data:
        return None
    return [w.decode("utf-8", "replace") for w in data.rstrip(b"\0").split(b"\0")]


def unit_exec_start(path: str | os.PathLike[str]) -> list[str] | None:
    """The argv of the unit file's ExecStart= (engines.exec_start); None when unreadable."""
    data = _read(path, UNIT_MAX)
    return parse_exec_start(data.decode("utf-8", "replace")) if data else None


def argv_difference(process: Sequence[str], unit: Sequence[str]) -> str | None:
    """How the process's argv differs from the unit's ExecStart= words, in a few words; None
    when they agree or when it cannot be told (see the module's note)."""
    if not process or not unit:
        return None
    n = len(unit)
    if len(process) >= n and list(process[-n:]) == list(unit):
        return None  # the same, or the same after the interpreter of a #! script
    if os.path.basename(process[0]) != os.path.basename(unit[0]) and unit[0] not in process:
        return None  # another program (exec'd, or a rewritten title): not ours to judge
    start = process.index(unit[0]) if unit[0] in process else 0
    ran = list(process[start:])
    for i, (a, b) in enumerate(zip(ran, unit, strict=False)):
        if a != b:
            return f"word {i} is `{show(a)}` where the unit has `{show(b)}`"
    shorter, longer = (ran, unit) if len(ran) < len(unit) else (unit, ran)
    extra = longer[len(shorter)]
    return (
        f"the unit adds `{show(extra)}` at word {len(shorter)}"
        if longer is unit
        else f"the process has `{show(extra)}` at word {len(shorter)}, which the unit does not"
    )


@dataclass(frozen=True)
class Running:
    """One unit: why its process runs an older configuration (empty: it runs the current one,
    or it does not run, or it could not be told)."""

    unit: str
    reasons: tuple[str, ...] = ()
    reload: bool = False

    @property
    def stale(self) -> bool:
        return bool(self.reasons)

    @property
    def fix(self) -> str:
        restart = f"systemctl restart {self.unit}"
        return f"`systemctl daemon-reload && {restart}`" if self.reload else f"`{restart}`"

    def describe(self) -> str:
        return (
            f"{self.unit} is running an older configuration: {'; '.join(self.reasons)}; "
            f"apply it with {self.fix} (or run site.yml, which restarts it)"
        )


def read(
    systemd: Systemd,
    files: Mapping[str, Sequence[str]],
    monotonic: Callable[[], float] = time.monotonic,
    mtime: Callable[[str], float | None] = _mtime,
    now: Callable[[], float] = time.time,
    cmdline: Callable[[int], list[str] | None] = proc_cmdline,
    exec_start: Callable[[str], list[str] | None] = unit_exec_start,
) -> dict[str, Running]:
    """``files``: unit -> the files its process reads at start besides the unit file (its
    EnvironmentFile, config). Units that do not run, or whose start is unknown, are current."""
    units = list(files)
    if not units:
        return {}
    try:
        text = systemd.show_text(units, PROPERTIES)
        # CLOCK_MONOTONIC, the clock of systemd's *TimestampMonotonic (not /proc/uptime, which
        # lxcfs makes the container's own in a PVE container).
        boot_s = now() - monotonic()
    except (SystemdError, OSError, ValueError):
        return {u: Running(u) for u in units}
    blocks = show_blocks(text, units)
    out: dict[str, Running] = {}
    for unit in units:
        block = blocks.get(unit, {})
        out[unit] = judge(unit, block, files[unit], boot_s, mtime, cmdline, exec_start)
    return out


def judge(
    unit: str,
    block: Mapping[str, str],
    extra: Sequence[str],
    boot_s: float,
    mtime: Callable[[str], float | None],
    cmdline: Callable[[int], list[str] | None] = lambda pid: None,
    exec_start: Callable[[str], list[str] | None] = lambda path: None,
) -> Running:
    """One unit from its `systemctl show` block (PROPERTIES), the time the machine booted
    (epoch seconds), the files' modification times (None: absent), the main process's argv
    and the unit file's ExecStart= words (None: cannot be read, not judged)."""
    if block.get("ActiveState") not in ("active", "activating", "reloading") or block.get(
        "MainPID", "0"
    ) in ("", "0"):
        return Running(unit)
    reasons: list[str] = []
    reload = block.get("NeedDaemonReload") == "yes"
    if reload:
        reasons.append("its unit file changed on disk and systemd has not read it")
    try:
        started = boot_s + int(block.get("ExecMainStartTimestampMonotonic", "0")) / 1e6
    except ValueError:
        started = 0.0
    if started > boot_s:
        fragment = block.get("FragmentPath", "")
        for path in [p for p in (fragment, *extra) if p]:
            written = mtime(path)
            if written is not None and written > started + SLACK_S:
                reasons.append(
                    f"{path} was written {written - started:.0f} s after the process started"
                )
    fragment = block.get("FragmentPath", "")
    pid = block.get("MainPID", "0")
    # One reason is enough to restart; a drop-in may set another ExecStart= than the fragment's.
    if fragment and pid.isdigit() and not reasons and not block.get("DropInPaths", "").strip():
        differs = argv_difference(cmdline(int(pid)) or [], exec_start(fragment) or [])
        if differs:
            reasons.append(f"its process's command line is not its unit's ExecStart=: {differs}")
    return Running(unit, tuple(reasons), reload)
