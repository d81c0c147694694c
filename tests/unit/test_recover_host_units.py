"""roles/recover's host boot units follow the spec as roles/host_boot_report's steps do: a site
whose spec does not manage PCIe MRRS has no ct200-pcie-tune.service (host_tuning removes it), so
recover.yml must not `systemctl enable --now` it (that fails: the unit does not exist).
Real ansible-playbook on localhost: the validate play, then the roles' own defaults, which read
the host chain it exports (ct200_tools/units.py), not the raw ct200_site."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.spec_helpers import changed

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"

pytestmark = pytest.mark.skipif(not PLAYBOOK.exists(), reason="ansible-playbook not installed")


def host_units(tmp_path: Path, site: dict[str, object]) -> tuple[list[str], list[str]]:
    """(recover_host_units, the units of host_boot_report_steps) for this ct200_site."""
    out = tmp_path / "out.json"
    play = [
        {
            "name": "Validate",
            "ansible.builtin.import_playbook": str(REPO / "playbooks/validate.yml"),
        },
        {
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars_files": [
                str(REPO / "roles/recover/defaults/main.yml"),
                str(REPO / "roles/host_boot_report/defaults/main.yml"),
            ],
            "tasks": [
                {
                    "name": "Write both lists",
                    "ansible.builtin.copy": {
                        "content": "{{ [recover_host_units, host_boot_report_steps"
                        " | map(attribute='unit') | list] | to_json }}",
                        "dest": str(out),
                        "mode": "0644",
                    },
                }
            ],
        },
    ]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    (tmp_path / "vars.json").write_text(
        json.dumps({"ct200_site": site, "ansible_python_interpreter": sys.executable})
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    vars_file = str(tmp_path / "vars.json")
    proc = subprocess.run(
        [str(PLAYBOOK), "-i", "localhost,", str(tmp_path / "play.yml"), "-e", "@" + vars_file],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={**env, "ANSIBLE_NOCOLOR": "1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recover, report = json.loads(out.read_text())
    return recover, report


@pytest.mark.parametrize(
    ("tuning", "units"),
    [
        (
            {"pcie_max_read_request": 4096},
            ["ct200-host-devices.service", "ct200-pcie-tune.service"],
        ),
        ({"pcie_max_read_request": None}, ["ct200-host-devices.service"]),
        ({}, ["ct200-host-devices.service"]),
    ],
)
def test_recover_starts_only_the_host_units_the_spec_installs(
    tmp_path: Path, tuning: dict[str, object], units: list[str]
) -> None:
    site = changed({"tuning": tuning})
    recover, report = host_units(tmp_path, site)
    assert report == units
    assert recover == units
