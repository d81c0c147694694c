"""Zero-touch recovery on the testbed: real power cycles of both machines, the boot chain with
nobody at the keyboard, then a broken link, the chain stopping there, and playbooks/recover.yml.

One fixture runs the sequence, phase by phase; each test asserts one part of it:

1. provision: llama-server and the models' persistent copies on `ct` (tests/server_sites.py),
   site.yml on both machines (host roles: onboot and startup in the container's config), then a
   `ct200-serve switch` to tiny-b, so the serving set chosen last is not the spec's default;
2. reboot both machines (`Bed.reboot`: nspawn ends, systemd boots again, /dev/shm is empty). The
   pve-guests.service stand-in on `pve` starts the container (its vmid has onboot: 1) and the
   harness powers `ct` on. No playbook runs. A real completion comes back; the time from power-on
   to it is recorded, split by chain step (the boot report's own times);
3. break one link: the persistent copy of tiny-b moved away (the test keeps it, to put it back),
   reboot. The chain stops at the stage of tiny-b: `ct200-serve chain`, the boot report's
   textfile and journal, and the doctor name it. recover.yml fails naming it, the copy is put
   back, recover.yml repairs it, and a second run changes nothing.

The testbed has no GPU, so recover.yml's final doctor runs per server (recover_doctor=servers:
the tiny servers use no GPU); the full doctor fails there on the driver checks by design.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from tbharness import AnsibleRun, Bed
from test_host_roles import restore as restore_pve
from test_servers import CLEANUP, DOCTOR, SERVE, complete, setup, show, unit, wait_failed

from benchmarks.recovery.bench import split
from ct200_tools.serve import engines as engine
from testbed.harness import RebootReport
from testbed.machine import hostname

# The whole sequence runs in the module fixture: two real reboots, site.yml and three
# recover.yml runs take longer than the default per-test limit on a busy 2-core machine.
pytestmark = [pytest.mark.testbed, pytest.mark.timeout(1800)]

SITE = "playbooks/site.yml"
RECOVER = "playbooks/recover.yml"
CT, PVE = hostname("ct"), hostname("pve")
TEXTFILE = "/var/lib/prometheus/node-exporter/ct200_boot.prom"
REPORT_UNIT = "ct200-boot-report.service"
COPY = "/tank/models/tiny-b"
KEPT = "/root/tiny-b.kept-by-test"
MARKER = "/dev/shm/ct200-test-before-reboot"
#: The container's systemd start as a wall-clock time (controller and machines share one kernel
#: clock): now, less the monotonic time since systemd started.
USERSPACE_EPOCH = r"""
import subprocess, time
us = subprocess.run(["systemctl", "show", "--property=UserspaceTimestampMonotonic", "--value"],
                    capture_output=True, text=True, check=True).stdout.strip()
print(time.time() - (time.clock_gettime(time.CLOCK_MONOTONIC) - int(us) / 1e6))
"""


def chain(bed: Bed) -> tuple[int, dict[str, Any]]:
    proc = bed.ssh("ct", SERVE, "chain", "--json", timeout=300)
    try:
        return proc.returncode, dict(json.loads(proc.stdout)["result"])
    except (ValueError, KeyError):
        return proc.returncode, {"unparsed": proc.stdout + proc.stderr}


def cat(bed: Bed, name: str, path: str) -> str:
    return bed.ssh(name, "cat", path).stdout


@dataclass
class Boot:
    """A power cycle of both machines and what the container says afterwards."""

    reboot: RebootReport
    userspace_before: str
    userspace_after: str
    marker: int
    completion: dict[str, Any]
    done: float
    userspace_epoch: float
    chain_rc: int
    chain: dict[str, Any]
    textfile: str
    report_unit: dict[str, str]
    report_journal: str
    pve_guests: dict[str, Any]
    units: dict[str, dict[str, str]]

    @classmethod
    def cycle(cls, bed: Bed) -> Boot:
        before = bed.ssh("ct", "systemctl", "show", "-p", "UserspaceTimestampMonotonic").stdout
        bed.ssh("ct", "touch", MARKER)
        reboot = bed.reboot()
        completion = complete(bed, 8081, 1) if "ct" in reboot.ready else {}
        done = time.time()
        rc, got = chain(bed)
        epoch = bed.ssh("ct", "python3", "-c", USERSPACE_EPOCH).stdout.strip()
        return cls(
            reboot,
            before,
            bed.ssh("ct", "systemctl", "show", "-p", "UserspaceTimestampMonotonic").stdout,
            bed.ssh("ct", "test", "-e", MARKER).returncode,
            completion,
            done,
            float(epoch or 0),
            rc,
            got,
            cat(bed, "ct", TEXTFILE),
            show(bed, REPORT_UNIT),
            bed.ssh(
                "ct", "journalctl", "--no-pager", "-o", "cat", "-b", f"--unit={REPORT_UNIT}"
            ).stdout,
            json.loads(cat(bed, "pve", "/run/ct200-testbed/pve-guests.json") or "{}"),
            {n: show(bed, unit(n)) for n in ("tiny", "tiny-b")},
        )


@dataclass
class Recovery:
    provision: AnsibleRun
    switch_rc: int
    conf: str
    good: Boot
    split: dict[str, float]
    broken: Boot
    doctor_rc: int
    doctor: str
    recover_blocked: AnsibleRun
    recover: AnsibleRun
    completion_after: dict[str, Any]
    chain_after: tuple[int, dict[str, Any]]
    recover_again: AnsibleRun
    source_kept: tuple[str, str]


def sha_tree(bed: Bed, path: str) -> str:
    return bed.ssh("ct", "sh", "-c", f"cd {path} && sha256sum * | sha256sum").stdout.split()[0]


@pytest.fixture(scope="module")
def recovery(testbed: Bed) -> Iterator[Recovery]:
    bed = testbed
    conf_200 = cat(bed, "pve", "/etc/pve/lxc/200.conf")
    s = setup(bed)
    extra = ("-e", f"@{s.site_file}")
    try:
        provision = bed.ansible(SITE, *extra)
        assert provision.rc == 0, provision.describe()
        switch = bed.ssh("ct", SERVE, "switch", "tiny-b", "--exact", timeout=300)
        conf = cat(bed, "pve", "/etc/pve/lxc/200.conf")
        good = Boot.cycle(bed)
        times = (
            split(good.reboot, good.userspace_epoch, good.chain, good.done)
            if good.chain.get("ok")
            else {}
        )
        print(f"\ntest_recovery: boot to first completion, by step (s): {json.dumps(times)}")
        (bed.workdir / "boot-to-first-completion.json").write_text(json.dumps(times, indent=1))
        source = sha_tree(bed, COPY)
        moved = bed.ssh("ct", "mv", COPY, KEPT)
        assert moved.returncode == 0, moved.stderr
        broken = Boot.cycle(bed)
        doctor = bed.ssh("ct", DOCTOR, "check", "--server", "tiny-b", timeout=300)
        recover_args = (*extra, "-e", "recover_doctor=servers")
        blocked = bed.ansible(RECOVER, *recover_args)
        # The server retries (Restart=on-failure) until its start limit, and each retry pulls in
        # its stage (Wants=): a copy put back before that would be staged by the last retry, not
        # by recover.yml. Wait for the limit, so recover.yml is what repairs the chain.
        wait_failed(bed, ["tiny-b"])
        back = bed.ssh("ct", "mv", KEPT, COPY)
        assert back.returncode == 0, back.stderr
        recover = bed.ansible(RECOVER, *recover_args)
        completion_after = complete(bed, 8081, 1)
        chain_after = chain(bed)
        again = bed.ansible(RECOVER, *recover_args)
        yield Recovery(
            provision,
            switch.returncode,
            conf,
            good,
            times,
            broken,
            doctor.returncode,
            doctor.stdout + doctor.stderr,
            blocked,
            recover,
            completion_after,
            chain_after,
            again,
            (source, sha_tree(bed, COPY)),
        )
    finally:
        bed.ssh("ct", "sh", "-c", f"test -e {KEPT} && mv {KEPT} {COPY}; true")
        bed.ssh(
            "ct",
            "sh",
            "-c",
            f"systemctl disable --now {REPORT_UNIT}; rm -f /etc/systemd/system/{REPORT_UNIT}"
            f" {TEXTFILE}; {CLEANUP}",
        )
        restore_pve(bed, conf_200)


# -- provisioning ------------------------------------------------------------------------------


def test_the_host_role_starts_the_container_at_boot_in_order(recovery: Recovery) -> None:
    assert recovery.provision.rc == 0, recovery.provision.describe()
    main = recovery.conf.split("\n[")[0].splitlines()
    assert "onboot: 1" in main and "startup: order=1" in main


# -- reboot, no playbook ---------------------------------------------------------------------


def test_a_reboot_is_a_real_boot_that_empties_dev_shm(recovery: Recovery) -> None:
    good = recovery.good
    assert good.reboot.left_off == {}, good.reboot.left_off
    assert set(good.reboot.ready) == {"pve", "ct"}
    assert good.userspace_after != good.userspace_before
    assert good.marker != 0  # the file put in /dev/shm before is gone
    # pve-guests (stand-in) started the container because of onboot: 1.
    assert good.pve_guests["started"] == [200], good.pve_guests


def test_the_servers_answer_a_real_completion_with_no_playbook(recovery: Recovery) -> None:
    got = recovery.good.completion
    assert got.get("status") == 200, got
    assert got["usage"]["completion_tokens"] == 1


def test_the_serving_set_chosen_last_comes_back(recovery: Recovery) -> None:
    assert recovery.switch_rc == 0
    good = recovery.good
    assert good.chain["serving"] == ["tiny-b"] and good.chain["source"] == "serving.json"
    assert good.units["tiny-b"]["ActiveState"] == "active"
    assert good.units["tiny"]["ActiveState"] == "inactive"


def test_the_boot_chain_and_its_report_say_serving(recovery: Recovery) -> None:
    good = recovery.good
    assert good.chain_rc == 0, good.chain
    assert [(s["kind"], s["name"], s["state"]) for s in good.chain["steps"]] == [
        ("stage", "tiny-b", "ok"),
        ("server", "tiny-b", "ok"),
    ]
    assert good.report_unit["Result"] == "success", good.report_unit
    assert "ct200_boot_chain_ok 1" in good.textfile
    assert 'ct200_boot_serving_set{name="tiny-b",source="serving.json"} 1' in good.textfile
    assert "boot chain: serving" in good.report_journal


def test_boot_to_first_completion_is_recorded_by_step(recovery: Recovery) -> None:
    times = recovery.split
    assert list(times) == [
        "host_boot_and_pve_guests",
        "container_to_systemd",
        "stage tiny-b",
        "server tiny-b",
        "first_completion",
        "total",
    ]
    assert all(v >= 0 for v in times.values()), times
    assert sum(v for k, v in times.items() if k != "total") == pytest.approx(
        times["total"], abs=0.01
    )


# -- a broken link ---------------------------------------------------------------------------------


def test_a_missing_persistent_copy_stops_the_chain_at_its_stage(recovery: Recovery) -> None:
    b = recovery.broken
    assert b.reboot.left_off == {}
    assert b.chain_rc == 1, b.chain
    assert b.chain["stopped_at"] == {
        "kind": "stage",
        "name": "tiny-b",
        "unit": engine.stage_unit("tiny-b"),
    }
    steps = {s["name"] + " " + s["kind"]: s for s in b.chain["steps"]}
    assert steps["tiny-b stage"]["state"] == "failed"
    # The server never ran its engine: its preflight found the model not staged.
    assert steps["tiny-b server"]["state"] == "failed"
    assert steps["tiny-b server"]["failed_at"] == "preflight"
    assert b.completion.get("status") != 200


def test_the_boot_report_names_the_stopped_link_with_the_doctors_message(
    recovery: Recovery,
) -> None:
    b = recovery.broken
    assert (
        'ct200_boot_chain_stopped{kind="stage",name="tiny-b",'
        f'unit="{engine.stage_unit("tiny-b")}",state="failed",failed_at=""}} 1'
    ) in b.textfile
    assert "ct200_boot_chain_ok 0" in b.textfile
    journal = b.report_journal
    assert "stopped at: stage tiny-b" in journal, journal[-3000:]
    assert "ct200-doctor gate tiny-b" in journal and "models.staged" in journal, journal[-3000:]
    # The report itself did its job: a stopped chain is not a failed report.
    assert b.report_unit["Result"] == "success"


def test_the_doctor_names_the_missing_copy(recovery: Recovery) -> None:
    assert recovery.doctor_rc == 2, recovery.doctor
    assert "models.staged" in recovery.doctor


def test_recover_stops_at_restage_while_the_copy_is_missing(recovery: Recovery) -> None:
    run = recovery.recover_blocked
    assert run.rc != 0
    assert any("Report the failed stage" in r for r in run.results("failed")), run.describe()
    assert "tiny-b" in run.output and "models.staged" in run.output


def test_recover_repairs_the_chain_once_the_copy_is_back(recovery: Recovery) -> None:
    run = recovery.recover
    assert run.rc == 0, run.describe()
    assert run.stats[CT]["changed"] >= 2, run.describe()  # the stage and the server started
    assert recovery.completion_after.get("status") == 200
    rc, got = recovery.chain_after
    assert rc == 0 and got["ok"], got
    before, after = recovery.source_kept
    assert before == after and len(before) == 64


def test_recover_prints_a_timing_summary(recovery: Recovery) -> None:
    out = recovery.recover.output
    for step in ("gate", "restage", "start", "health", "smoke", "doctor"):
        assert f"{step}:" in out or f"'{step}'" in out, out[-3000:]


def test_a_second_recover_changes_nothing(recovery: Recovery) -> None:
    run = recovery.recover_again
    assert run.rc == 0, run.describe()
    changed = {host: st["changed"] for host, st in run.stats.items() if st["changed"]}
    assert not changed, run.describe()
    assert PVE in run.stats and CT in run.stats
