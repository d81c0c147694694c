"""`systemctl show`'s output, read the one way the doctor's unit probe (probes/systemd.py) and
ct200-serve (serve/systemd.py) both need: argv with the properties asked, and the KEY=VALUE
blocks by unit. No D-Bus library: the format is stable, one block per unit, in the order asked.
Kept apart from both, so ct200-serve (inside every unit start) does not import the probes.
Standard library only: the host's chain (host/chain.py) runs it on the PVE host too.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence


def show_argv(units: Sequence[str], properties: Sequence[str]) -> list[str]:
    return ["systemctl", "show", "--no-pager", f"--property={','.join(properties)}", *units]


def show_blocks(text: str, units: Sequence[str]) -> dict[str, dict[str, str]]:
    """`systemctl show` of these units -> each one's KEY=VALUE block, by the name asked. Blocks
    are matched by Id, else by position (systemd prints them in the order asked)."""
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
    out: dict[str, dict[str, str]] = {}
    for i, block in enumerate(blocks):
        name = block.get("Id") or (units[i] if i < len(units) else "")
        if name not in units and i < len(units):
            name = units[i]  # an alias resolved to another Id: keep the name asked for
        out[name] = block
    return out


def run_argv(argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
    try:
        proc = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            # journalctl --output=cat passes logged bytes through, valid UTF-8 or not.
            errors="replace",
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]} {argv[1] if len(argv) > 1 else ''} ran over {timeout:.0f} s"
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: not found (not a systemd machine?)"
    return proc.returncode, proc.stdout, proc.stderr
