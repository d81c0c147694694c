"""ct200_fleet: every host's ct200_doctor_run result -> the fleet table, exit code and document,
by ct200_tools.fleet (the same code as `ct200-doctor fleet FILE`). Used by playbooks/doctor.yml.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ct200_tools.fleet import FAILING, exit_code, gather, render_table, to_document


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
        "failing": [r.host for r in results if r.status in FAILING],
        "document": to_document(results),
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"ct200_fleet": ct200_fleet}
