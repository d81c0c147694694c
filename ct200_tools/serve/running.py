"""Whether a server's process runs what its files say now (issue 33: the tools described the
unit file, not the process; a port changed in the unit while the process still listened on the
old one read as serving on the new one).

A running server is on an older configuration when systemd has not read its changed unit
(NeedDaemonReload=yes), or when its unit, EnvironmentFile or config file was written after its
main process started (the process read them at its start, never since). The fix is the restart
that applies them, which `ansible-playbook ... site.yml` also does.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from ct200_tools.serve.systemd import Systemd, SystemdError
from ct200_tools.systemctl import show_blocks

PROPERTIES: Final = (
    "Id",
    "ActiveState",
    "MainPID",
    "NeedDaemonReload",
    "FragmentPath",
    "ExecMainStartTimestampMonotonic",
)
#: File times are whole seconds on some filesystems, the start time microseconds: a file written
#: in the same second as the start is not "after" it.
SLACK_S: Final = 1.0


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


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
        out[unit] = judge(unit, block, files[unit], boot_s, mtime)
    return out


def judge(
    unit: str,
    block: Mapping[str, str],
    extra: Sequence[str],
    boot_s: float,
    mtime: Callable[[str], float | None],
) -> Running:
    """One unit from its `systemctl show` block (PROPERTIES), the time the machine booted
    (epoch seconds) and the files' modification times (None: absent)."""
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
    return Running(unit, tuple(reasons), reload)
