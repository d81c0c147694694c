"""The Ansible inventory of a running testbed, written by ``up``.

Slot 0 writes ``inventory/testbed/hosts.yml`` in the checkout (gitignored), beside the committed
``group_vars`` that hold the testbed's site spec. Other slots write theirs in the slot's runtime
directory, with ``group_vars`` linked to the same committed one, so every slot converges the same
site. Everything harness-specific (addresses, keys, known_hosts) is here, never in group_vars.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from testbed import ssh
from testbed.config import Slot
from testbed.machine import Machine, hostname

#: machine role -> inventory group: the groups the playbooks target, as in inventory/ct200.
GROUPS = {"pve": "pve", "ct": "ct", "plain": "testbed_plain"}


def render(slot: Slot, machines: Sequence[Machine], wheelhouse: Path | None) -> str:
    hosts: dict[str, dict[str, object]] = {}
    for m in machines:
        hosts.setdefault(GROUPS[m.role], {})[hostname(m.name)] = {"ansible_host": m.address}
    groups = {group: {"hosts": members} for group, members in hosts.items()}
    variables: dict[str, object] = {
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(slot.key),
        "ansible_ssh_common_args": " ".join(ssh.options(slot)),
        "ansible_control_path_dir": str(slot.control_dir),
        "ansible_python_interpreter": "/usr/bin/python3",
    }
    if wheelhouse is not None:
        variables["ct200_tools_wheelhouse"] = str(wheelhouse)
    header = (
        f"# Written by `python -m testbed up --slot {slot.index}` at "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}; rewritten on every up, removed on down.\n"
    )
    body = {"all": {"vars": variables, "children": groups}}
    return header + yaml.safe_dump(body, sort_keys=False, default_flow_style=False)


def write(slot: Slot, machines: Sequence[Machine], wheelhouse: Path | None) -> Path:
    slot.inventory_dir.mkdir(parents=True, exist_ok=True)
    if slot.index != 0:
        link = slot.inventory_dir / "group_vars"
        target = slot.settings.repo / "inventory" / "testbed" / "group_vars"
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    tmp = slot.inventory.with_suffix(".tmp")
    tmp.write_text(render(slot, machines, wheelhouse))
    tmp.replace(slot.inventory)
    return slot.inventory


def remove(slot: Slot) -> bool:
    if slot.inventory.exists():
        slot.inventory.unlink()
        return True
    return False
