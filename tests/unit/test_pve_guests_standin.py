"""The testbed's pve-guests.service stand-in (testbed/standins.py): which containers it starts at
boot, and in what order, from /etc/pve/lxc/*.conf as PVE orders them (startup order=N
ascending, the containers without an order after them, ties by vmid). Run as its own program,
with its paths pointed at a temporary directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from testbed import standins


def run(tmp_path: Path, confs: dict[int, str]) -> dict[str, object]:
    lxc = tmp_path / "lxc"
    lxc.mkdir()
    for vmid, text in confs.items():
        (lxc / f"{vmid}.conf").write_text(text)
    (lxc / "notes.txt").write_text("not a config\n")
    state = tmp_path / "run" / "pve-guests.json"
    script = (
        standins.PVE_GUESTS.replace('"/etc/pve/lxc"', repr(str(lxc)))
        .replace(f'"{standins.PVE_GUESTS_STATE}"', repr(str(state)))
        .replace('"/var/lib/ct200-testbed/pct"', repr(str(tmp_path / "pct")))
    )
    # Never the real paths: the test runs on the controller.
    for real in ("/etc/pve/lxc", standins.PVE_GUESTS_STATE, "/var/lib/ct200-testbed"):
        assert f'"{real}' not in script, real
    path = tmp_path / "pve-guests"
    path.write_text(script)
    proc = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, check=False, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    data: dict[str, object] = json.loads(state.read_text())
    return data


def test_onboot_containers_start_in_pve_order(tmp_path: Path) -> None:
    got = run(
        tmp_path,
        {
            200: "arch: amd64\nonboot: 1\nstartup: order=2\n",
            201: "onboot: 1\n",
            202: "onboot: 1\nstartup: order=1,up=30\n",
            203: "onboot: 0\nstartup: order=1\n",
            204: "hostname: x\n",
            205: "onboot: 1\nlock: backup\n",
            199: "onboot: 1\n[snap]\nonboot: 0\n",
        },
    )
    assert got["started"] == [202, 200, 199, 201]
    assert got["skipped"] == {
        "203": "onboot is not 1",
        "204": "onboot is not 1",
        "205": "locked (backup)",
    }
    pct = tmp_path / "pct"
    assert sorted(p.name for p in pct.iterdir()) == ["199", "200", "201", "202"]
    assert (pct / "200").read_text() == "running\n"


def test_a_snapshot_section_does_not_count(tmp_path: Path) -> None:
    got = run(tmp_path, {300: "hostname: y\n[before]\nonboot: 1\n"})
    assert got["started"] == []
