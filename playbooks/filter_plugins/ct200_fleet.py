"""Filters of playbooks/doctor.yml, by ct200_tools.doctor.fleet (the same code as
`ct200-doctor fleet`): ct200_doctor_only, the --only list checked before any doctor runs;
ct200_fleet, every host's ct200_doctor_run result -> the fleet table, exit code and document.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError

from ct200_tools.doctor.checks import SelectionError
from ct200_tools.doctor.fleet import FAILING, exit_code, gather, only_ids, render_table, to_document
from ct200_tools.untrusted import show


def ct200_doctor_only(value: object) -> list[str]:
    """ct200_doctor_only as the --only list, or a clear error before any doctor runs."""
    try:
        return only_ids(value)
    except SelectionError as exc:
        raise AnsibleFilterError(str(exc)) from None


def ct200_fleet(
    hosts: Sequence[str],
    hostvars: Mapping[str, Any],
    groups: Mapping[str, Sequence[str]],
    expected_groups: Sequence[str],
    fix: str,
    register: str = "ct200_doctor_run",
) -> dict[str, Any]:
    """hosts: those the play targeted; a host is expected to have the doctor when it is in one of
    expected_groups, unless its own ct200_doctor_expected says otherwise."""
    grouped = {h for g in expected_groups for h in groups.get(g, ())}
    records = []
    for host in hosts:
        hv = hostvars[host]
        expected = hv.get("ct200_doctor_expected")
        records.append(
            {
                "host": host,
                "result": hv.get(register),
                "expected": host in grouped if expected is None else bool(expected),
            }
        )
    results = gather(records, fix)
    return {
        "table": render_table(results),
        "exit_code": int(exit_code(results)),
        # For the failure message: shown as the table shows them (the document keeps them exact).
        "failing": [show(r.host) for r in results if r.status in FAILING],
        "document": to_document(results),
    }


def ct200_user_path(value: str) -> str:
    """A path the user gave on the command line (-e ct200_doctor_fleet_file=...), resolved against
    the directory ansible-playbook runs from (the controller's, which Ansible does not change),
    not playbooks/: README's next command (`ct200-doctor fleet FILE`) reads it from there."""
    return os.path.abspath(os.path.expanduser(str(value)))


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "ct200_fleet": ct200_fleet,
            "ct200_doctor_only": ct200_doctor_only,
            "ct200_user_path": ct200_user_path,
        }
