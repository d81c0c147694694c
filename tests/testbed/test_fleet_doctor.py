"""playbooks/doctor.yml on a testbed of three machines (the PVE stand-in and two containers),
over SSH as in production, after site.yml: one container broken on purpose (/dev/shm remounted
smaller than the spec's shm.size) is named with its root cause and fix, the play fails, the
healthy container is ok; the printed fix, pasted, makes the fleet pass. An inventory host with
no machine behind it is listed as unreachable, and without --only the driverless containers
show only the real root cause (no NVIDIA driver), their consequences counted. A container whose
doctor is gone is "missing", and the install command printed for it, pasted, brings it back.

A testbed of its own (module scope, a free test slot): the session's has two machines. The PVE
stand-in has no ct200-doctor (site.yml installs it in the containers): its row says so and
does not fail the fleet.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from tbharness import REPO, VENV_BIN, AnsibleRun, Bed

from ct200_tools.doctor.fleet import from_document, render_table
from testbed.config import MachineSpec, Settings
from testbed.harness import Harness, claim_test_slot
from testbed.machine import hostname

pytestmark = pytest.mark.testbed

MACHINES = ("pve:pve", "ct:ct", "ct2:ct")
PVE, CT, CT2 = hostname("pve"), hostname("ct"), hostname("ct2")
GONE = "ct200-gone"
DOCTOR = "playbooks/doctor.yml"
SHM = "1G"
BROKEN_SHM = "256M"


@dataclass
class Fleet:
    bed: Bed
    converge: AnsibleRun
    broken: AnsibleRun
    broken_doc: dict[str, Any]
    full: AnsibleRun
    full_doc: dict[str, Any]
    fix: str
    repaired: AnsibleRun
    repaired_doc: dict[str, Any]
    missing: AnsibleRun
    missing_doc: dict[str, Any]
    install: str
    reinstalled: AnsibleRun
    reinstalled_doc: dict[str, Any]


def _rows(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["host"]: h for h in doc["hosts"]}


def _doctor(bed: Bed, saved: Path, *args: str) -> tuple[AnsibleRun, dict[str, Any]]:
    saved.unlink(missing_ok=True)
    run = bed.ansible(DOCTOR, "-e", f"ct200_doctor_fleet_file={saved}", *args)
    assert saved.is_file(), run.describe()
    return run, json.loads(saved.read_text())


@pytest.fixture(scope="module")
def fleet(testbed_requirements: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("fleet")
    with contextlib.ExitStack() as stack:
        slot = claim_test_slot(Settings.from_env(), stack)
        if slot is None:
            pytest.fail("every test slot is in use")
        harness = Harness(slot)
        stack.callback(harness.down)
        report = harness.up([MachineSpec.parse(m) for m in MACHINES], fresh=True)
        bed = Bed(harness, report, work)

        site: dict[str, Any] = yaml.safe_load(
            (REPO / "inventory/testbed/group_vars/all.yml").read_text()
        )
        # Sized, so that the doctor's mem.shm judges /dev/shm against the spec.
        site["ct200_site"]["shm"] = {"size": SHM}
        extra = work / "site.yml"
        extra.write_text(yaml.safe_dump(site, sort_keys=False))
        # Two containers: the PVE stand-in's own is ct (the role's documented setting).
        converge = bed.ansible(
            "playbooks/site.yml", "-e", f"@{extra}", "-e", f"lxc_passthrough_container_host={CT}"
        )
        assert converge.rc == 0, converge.describe()

        # The fault: /dev/shm of ct2 smaller than the spec, as after a hand-made remount.
        proc = bed.ssh("ct2", "mount", "-o", f"remount,size={BROKEN_SHM}", "/dev/shm")
        assert proc.returncode == 0, proc.stderr
        # One more inventory host, in group ct, on an address of the slot no machine has.
        gone = work / "gone.yml"
        gone_host = {"ansible_host": str(slot.address(60)), "ansible_ssh_timeout": 5}
        gone.write_text(yaml.safe_dump({"ct": {"hosts": {GONE: gone_host}}}))
        saved = work / "fleet.json"
        broken, broken_doc = _doctor(
            bed, saved, "-i", str(gone), "-e", "ct200_doctor_only=mem,tune.numa_balancing"
        )
        # Without --only: every check, on machines without an NVIDIA driver.
        full, full_doc = _doctor(bed, saved)

        # The fix the table printed for ct2, pasted as printed.
        (root,) = [c for c in _rows(broken_doc)[CT2]["report"]["checks"] if c["id"] == "mem.shm"]
        fix = root["remediation"]["command"]
        proc = bed.ssh("ct2", "sh", "-c", fix)
        assert proc.returncode == 0, proc.stderr
        repaired, repaired_doc = _doctor(bed, saved, "-e", "ct200_doctor_only=mem")
        # The doctor gone from ct2 (a container the tools never reached); the fix the table
        # prints for it, pasted as printed, from the repository root.
        proc = bed.ssh("ct2", "rm", "-rf", "/usr/local/bin/ct200-doctor", "/opt/ct200/venv")
        assert proc.returncode == 0, proc.stderr
        missing, missing_doc = _doctor(bed, saved, "-e", "ct200_doctor_only=mem")
        install = _rows(missing_doc)[CT2]["detail"].partition("fix: ")[2]
        pasted = subprocess.run(
            shlex.split(install),
            cwd=REPO,
            env={**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"},
            capture_output=True,
            text=True,
            check=False,
            timeout=540,
        )
        assert pasted.returncode == 0, pasted.stdout[-3000:] + pasted.stderr
        reinstalled, reinstalled_doc = _doctor(bed, saved, "-e", "ct200_doctor_only=mem")
        # The tables, for the log (-s, or pytest's report on a failure).
        for doc in (broken_doc, full_doc, repaired_doc, missing_doc, reinstalled_doc):
            print(render_table(from_document(doc)))
        yield Fleet(
            bed,
            converge,
            broken,
            broken_doc,
            full,
            full_doc,
            fix,
            repaired,
            repaired_doc,
            missing,
            missing_doc,
            install,
            reinstalled,
            reinstalled_doc,
        )


def test_the_broken_container_is_named_with_its_root_cause_and_the_play_fails(
    fleet: Fleet,
) -> None:
    run, rows = fleet.broken, _rows(fleet.broken_doc)
    assert run.rc != 0, run.describe()
    assert set(rows) == {PVE, CT, CT2, GONE}
    ct2 = rows[CT2]
    assert ct2["status"] == "fail" and ct2["rc"] == 2
    assert ct2["report"]["root_causes"] == ["mem.shm"]
    table = run.output
    assert "mem.shm: /dev/shm is 0.2 GiB, the spec wants 1.0 GiB" in table, run.describe()
    assert f"$ {fleet.fix}" in table and "(playbook tag: container_shm)" in table, table
    assert f"fleet: FAIL (2 hosts: {GONE}, {CT2})" in run.output
    for host in (CT2, GONE):
        assert f"the fleet doctor found problems on {host} " in run.output, run.describe()
    # The recap marks the failing hosts, and no healthy one (issue 33).
    assert run.stats[CT]["failures"] == 0 and run.stats[PVE]["failures"] == 0, run.describe()
    assert fleet.broken_doc["exit_code"] == 2


def test_the_healthy_ones_are_ok_and_the_pve_host_says_it_has_no_doctor(fleet: Fleet) -> None:
    rows = _rows(fleet.broken_doc)
    assert rows[CT]["status"] == "ok" and rows[CT]["rc"] == 0
    assert {c["id"] for c in rows[CT]["report"]["checks"]} == {
        "mem.shm",
        "mem.headroom",
        "tune.numa_balancing",
    }
    assert rows[PVE]["status"] == "no doctor" and rows[PVE]["report"] is None
    assert "the site does not put it here" in fleet.broken.output


def test_an_inventory_host_without_a_machine_is_unreachable(fleet: Fleet) -> None:
    gone = _rows(fleet.broken_doc)[GONE]
    assert gone["status"] == "unreachable" and gone["report"] is None
    assert "ssh" in gone["detail"].lower(), gone


def test_without_only_the_root_cause_is_the_missing_driver_consequences_counted(
    fleet: Fleet,
) -> None:
    rows = _rows(fleet.full_doc)
    assert fleet.full.rc != 0
    for host in (CT, CT2):
        report = rows[host]["report"]
        assert rows[host]["status"] == "fail"
        roots = report["root_causes"]
        assert roots[0] == "driver.module", roots
        consequences = [c for c in report["checks"] if c["caused_by"] == "driver.module"]
        assert consequences, report["checks"]
        assert "driver.module: " in fleet.full.output
        assert f"(+{len(consequences)} consequence" in fleet.full.output
        # A consequence is counted under its root, never listed with a fix of its own.
        for c in consequences:
            if c["id"] not in roots:
                assert f"{c['id']}: " not in fleet.full.output, c["id"]
    # ct2 still has its small /dev/shm here: a second root of its own.
    assert "mem.shm" in rows[CT2]["report"]["root_causes"]
    assert "mem.shm" not in rows[CT]["report"]["root_causes"]


def test_the_printed_fix_pasted_makes_the_fleet_pass(fleet: Fleet) -> None:
    assert fleet.fix == f"mount -o remount,size={1 << 30} /dev/shm"
    run, rows = fleet.repaired, _rows(fleet.repaired_doc)
    assert run.rc == 0, run.describe()
    assert {h: r["status"] for h, r in rows.items()} == {
        PVE: "no doctor",
        CT: "ok",
        CT2: "ok",
    }
    assert "fleet: ok" in run.output
    # The saved reports: only for the one who ran the play.
    saved = fleet.bed.workdir / "fleet.json"
    assert saved.stat().st_mode & 0o777 == 0o600


def test_a_container_without_the_doctor_is_missing_and_its_printed_fix_installs_it(
    fleet: Fleet,
) -> None:
    run, rows = fleet.missing, _rows(fleet.missing_doc)
    assert run.rc != 0 and rows[CT2]["status"] == "missing", run.describe()
    assert rows[CT]["status"] == "ok" and rows[PVE]["status"] == "no doctor"
    assert fleet.install == (
        f"ansible-playbook -i {fleet.bed.inventory} playbooks/container.yml --tags tools "
        f"--limit {CT2},localhost"
    )
    assert fleet.install in run.output
    again = _rows(fleet.reinstalled_doc)
    assert fleet.reinstalled.rc == 0, fleet.reinstalled.describe()
    assert {h: r["status"] for h, r in again.items()} == {PVE: "no doctor", CT: "ok", CT2: "ok"}
