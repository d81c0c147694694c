"""Unit state from `systemctl show`: one call for every server unit, with a deadline.

No D-Bus library: systemctl is on every systemd machine and its `show` output is a stable
KEY=VALUE format (one block per unit, blank line between blocks, in the order asked).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping, Sequence

from ct200_tools.doctor.probes.base import Reader
from ct200_tools.facts import UnitFacts
from ct200_tools.serve import running
from ct200_tools.systemctl import show_argv, show_blocks

#: The properties the server checks read, in `systemctl show -p` form.
PROPERTIES = (
    "Id",
    "LoadState",
    "ActiveState",
    "SubState",
    "Result",
    "NRestarts",
    "MainPID",
    "ExecMainStatus",
    "ControlGroup",
    # Whether the process runs what its files say (ct200_tools.serve.running).
    "NeedDaemonReload",
    "FragmentPath",
    "ExecMainStartTimestampMonotonic",
    "DropInPaths",
)
SHOW_TIMEOUT_S = 3.0
#: Lines of a unit's journal kept for one that is not active (the engine's last words).
JOURNAL_LINES = 8


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.strip().lstrip("-").isdigit() else None


def parse_show(text: str, units: list[str]) -> dict[str, UnitFacts]:
    """`systemctl show` of these units -> their facts, by the name asked."""
    return {
        name: UnitFacts(
            name=name,
            load_state=block.get("LoadState") or None,
            active_state=block.get("ActiveState") or None,
            sub_state=block.get("SubState") or None,
            result=block.get("Result") or None,
            n_restarts=_int(block.get("NRestarts")),
            main_pid=_int(block.get("MainPID")),
            exec_main_status=_int(block.get("ExecMainStatus")),
            control_group=block.get("ControlGroup") or None,
        )
        for name, block in show_blocks(text, units).items()
    }


def probe_units(
    r: Reader, units: list[str], key: str, files: Mapping[str, Sequence[str]] | None = None
) -> dict[str, UnitFacts]:
    """The units' state; {} with the reason noted under `key` when systemd cannot be asked
    (no systemctl, systemd not running here, a hung systemd). ``files``: unit -> the files its
    process reads at start besides its unit file, to tell an older configuration."""
    if not units:
        return {}
    try:
        ran = r.run(show_argv(units, PROPERTIES), SHOW_TIMEOUT_S)
    except FileNotFoundError:
        r.note(key, "systemctl not found: not a systemd machine")
        return {}
    except OSError as exc:
        r.note(key, f"systemctl show: {exc}")
        return {}
    if ran.returncode != 0:
        why = (ran.stderr.strip().splitlines() or [f"exit status {ran.returncode}"])[0]
        r.note(key, f"systemctl show: {why}")
        return {}
    got = {name: _with_journal(r, u) for name, u in parse_show(ran.stdout, units).items()}
    return _with_older(r, got, show_blocks(ran.stdout, units), files or {})


def _with_older(
    r: Reader,
    got: dict[str, UnitFacts],
    blocks: Mapping[str, Mapping[str, str]],
    files: Mapping[str, Sequence[str]],
) -> dict[str, UnitFacts]:
    # CLOCK_MONOTONIC is the clock of systemd's *TimestampMonotonic (/proc/uptime is the
    # container's own under lxcfs).
    boot_s = time.time() - time.monotonic()

    def mtime(p: str) -> float | None:
        try:
            return os.stat(r.path(p)).st_mtime
        except OSError:
            return None

    out = dict(got)
    for name, u in got.items():
        verdict = running.judge(
            name,
            blocks.get(name, {}),
            files.get(name, ()),
            boot_s,
            mtime,
            lambda pid: running.proc_cmdline(pid, r.path),
            lambda path: running.unit_exec_start(r.path(path)),
        )
        if verdict.stale:
            out[name] = dataclasses.replace(u, older_configuration=verdict.reasons)
    return out


def _with_journal(r: Reader, u: UnitFacts) -> UnitFacts:
    """A unit that exited (failed, or waiting for its automatic restart) with its last journal
    lines of this boot; any other unit as it is. Unreadable: without them (the state says why)."""
    down = u.active_state == "failed" or u.sub_state == "auto-restart"
    if not down or u.load_state == "not-found":
        return u
    argv = ["journalctl", "--no-pager", "--output=cat", "--boot", f"--lines={JOURNAL_LINES}"]
    try:
        ran = r.run([*argv, f"--unit={u.name}"], SHOW_TIMEOUT_S)
    except OSError:
        return u
    if ran.returncode != 0:
        return u
    lines = tuple(line[:400] for line in ran.stdout.splitlines()[-JOURNAL_LINES:])
    return dataclasses.replace(u, journal_tail=lines)
