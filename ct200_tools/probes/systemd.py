"""Unit state from `systemctl show`: one call for every server unit, with a deadline.

No D-Bus library: systemctl is on every systemd machine and its `show` output is a stable
KEY=VALUE format (one block per unit, blank line between blocks, in the order asked).
"""

from __future__ import annotations

from ct200_tools.facts import UnitFacts
from ct200_tools.probes.base import Reader

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
)
SHOW_TIMEOUT_S = 3.0


def show_argv(units: list[str]) -> list[str]:
    return ["systemctl", "show", "--no-pager", f"--property={','.join(PROPERTIES)}", *units]


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.strip().lstrip("-").isdigit() else None


def parse_show(text: str, units: list[str]) -> dict[str, UnitFacts]:
    """`systemctl show` of these units -> their facts, by the name asked. Blocks are matched by
    Id, else by position (systemd prints them in the order asked)."""
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, sep, value = line.partition("=")
        if sep:
            current[key] = value
    if current:
        blocks.append(current)
    out: dict[str, UnitFacts] = {}
    for i, block in enumerate(blocks):
        name = block.get("Id") or (units[i] if i < len(units) else "")
        if name not in units and i < len(units):
            name = units[i]
        out[name] = UnitFacts(
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
    return out


def probe_units(r: Reader, units: list[str], key: str) -> dict[str, UnitFacts]:
    """The units' state; {} with the reason noted under `key` when systemd cannot be asked
    (no systemctl, systemd not running here, a hung systemd)."""
    if not units:
        return {}
    try:
        ran = r.run(show_argv(units), SHOW_TIMEOUT_S)
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
    return parse_show(ran.stdout, units)
