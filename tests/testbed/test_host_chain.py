"""The first link of the boot chain on the testbed: the PVE host's boot units, their report at
every boot (roles/host_boot_report), a link broken by stopping a boot unit from running at boot,
and recover.yml repairing it. Real power cycles of the `pve` machine (`Bed.reboot("pve")`:
systemd boots anew); the `ct` machine keeps running.

1. host.yml (site.yml's host play: host_devices, host_tuning, host_boot_report, lxc_passthrough;
   the session's shared converge, tests/testbed/conftest.py), then a reboot: the report unit ran
   after the two boot units and its textfile and journal say every host step is good. pve has
   no NVIDIA GPU: ct200-host-devices says so and exits 0 there (as in test_host_roles.py), so on
   this machine "good" means the unit ran to success.
2. `systemctl disable ct200-host-devices.service` (a unit file in /etc/systemd/system cannot be
   masked for good: `systemctl mask` refuses, and --runtime is gone after the reboot), reboot: the
   unit does not run, and the textfile, the report's journal and ct200-host-chain all name it as
   the step where the chain stopped, with its fix.
3. recover.yml's host part (`--tags recover_host`; its container part needs the container
   provisioned, which tests/testbed/test_recovery.py does) enables the unit and runs it;
   ct200-host-chain then says good, and a second run changes nothing.
4. A unit that runs and fails: a STAND-IN NVIDIA GPU on the PCI bus (a vendor 0x10de, display
   class entry in a tree the script reads through CT200_SYSFS_PCI, set by a drop-in), reboot: the
   real script finds the GPU, cannot load the driver pve does not have, says so and exits 1; the
   report names the unit as failed and quotes that reason from this boot's journal.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from tbharness import AnsibleRun, Bed, Converged
from test_host_roles import HOST_CHAIN, HOST_TEXTFILE, REPORT_UNIT, restore, text

from testbed.machine import hostname

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(1800)]

RECOVER = "playbooks/recover.yml"
PVE = hostname("pve")
DEVICES = "ct200-host-devices.service"
STOPPED = (
    'ct200_boot_chain_stopped{kind="host",name="host-devices",'
    f'unit="{DEVICES}",state="off",failed_at=""}} 1'
)
PROPS = "ActiveState,Result,UnitFileState,InvocationID,ExecMainStatus"
#: The stand-in GPU's PCI tree and the drop-in that points the boot script at it.
FAKE_PCI = "/root/ct200-host-chain-test/pci"
DROP_IN = f"/etc/systemd/system/{DEVICES}.d/ct200-test-standin-gpu.conf"
STANDIN_GPU = f"""
set -e
mkdir -p {FAKE_PCI}/0000:01:00.0 {DROP_IN.rsplit("/", 1)[0]}
echo 0x10de > {FAKE_PCI}/0000:01:00.0/vendor
echo 0x030200 > {FAKE_PCI}/0000:01:00.0/class
printf '[Service]\nEnvironment=CT200_SYSFS_PCI={FAKE_PCI}\n' > {DROP_IN}
systemctl daemon-reload
"""
NO_STANDIN = (
    f"rm -rf {DROP_IN.rsplit('/', 1)[0]} {FAKE_PCI.rsplit('/', 1)[0]}; systemctl daemon-reload"
)


def show(bed: Bed, unit: str) -> dict[str, str]:
    proc = bed.ssh("pve", "systemctl", "show", f"--property={PROPS}", unit)
    assert proc.returncode == 0, proc.stderr
    return dict(line.split("=", 1) for line in proc.stdout.splitlines())


def host_chain(bed: Bed) -> tuple[int, dict[str, Any]]:
    proc = bed.ssh("pve", HOST_CHAIN, "--json")
    try:
        return proc.returncode, dict(json.loads(proc.stdout))
    except ValueError:
        return proc.returncode, {"unparsed": proc.stdout + proc.stderr}


def journal_of(bed: Bed, unit: str) -> str:
    return bed.ssh("pve", "journalctl", "--no-pager", "-o", "cat", "-b", f"--unit={unit}").stdout


@dataclass
class Boot:
    """A power cycle of `pve` and what its report says afterwards."""

    booted: list[str]
    textfile: str
    textfile_mode: str
    report: dict[str, str]
    report_journal: str
    devices: dict[str, str]
    devices_journal: str
    chain_rc: int
    chain: dict[str, Any]

    @classmethod
    def cycle(cls, bed: Bed) -> Boot:
        reboot = bed.reboot("pve")
        rc, got = host_chain(bed)
        return cls(
            list(reboot.ready),
            text(bed, HOST_TEXTFILE),
            bed.ssh("pve", "stat", "-c", "%a", HOST_TEXTFILE).stdout.strip(),
            show(bed, REPORT_UNIT),
            journal_of(bed, REPORT_UNIT),
            show(bed, DEVICES),
            journal_of(bed, DEVICES),
            rc,
            got,
        )


@dataclass
class HostChain:
    converge: AnsibleRun
    good: Boot
    broken: Boot
    recover: AnsibleRun
    devices_after: dict[str, str]
    chain_after: tuple[int, dict[str, Any]]
    again: AnsibleRun
    failed: Boot


@pytest.fixture(scope="module")
def host_chain_run(converged: Converged) -> Iterator[HostChain]:
    # On the session's shared converge: site.yml ran host.yml's play on pve.
    bed = converged.bed
    try:
        converge = converged.converge
        assert converge.rc == 0, converge.describe()
        good = Boot.cycle(bed)
        disabled = bed.ssh("pve", "systemctl", "disable", DEVICES)
        assert disabled.returncode == 0, disabled.stderr
        broken = Boot.cycle(bed)
        recover = bed.ansible(RECOVER, "--tags", "recover_host")
        devices_after = show(bed, DEVICES)
        chain_after = host_chain(bed)
        again = bed.ansible(RECOVER, "--tags", "recover_host")
        standin = bed.ssh("pve", "sh", "-c", STANDIN_GPU)
        assert standin.returncode == 0, standin.stderr
        failed = Boot.cycle(bed)
        yield HostChain(converge, good, broken, recover, devices_after, chain_after, again, failed)
    finally:
        bed.ssh("pve", "sh", "-c", NO_STANDIN)
        # The modules after this one (host_doctor, recovery) start from a pristine pve.
        restore(bed, converged.conf_200)


def test_a_good_boot_reports_every_host_step_good(host_chain_run: HostChain) -> None:
    good = host_chain_run.good
    assert good.booted == ["pve"]
    assert good.devices["Result"] == "success" and good.devices["ExecMainStatus"] == "0"
    # No GPU on pve: the unit says so and succeeds (the real work is tests/gpu's).
    assert "ct200-host-devices: no NVIDIA GPU on the PCI bus" in good.devices_journal
    assert good.report["Result"] == "success", good.report
    assert "ct200_boot_chain_ok 1" in good.textfile, good.textfile
    for name, unit in (("host-devices", DEVICES), ("pcie-tune", "ct200-pcie-tune.service")):
        assert (
            f'ct200_boot_step_state{{kind="host",name="{name}",unit="{unit}",state="ok"}} 1'
        ) in good.textfile
        assert f'ct200_boot_step_active_seconds{{kind="host",name="{name}"}} ' in good.textfile
    assert "ct200_boot_chain_stopped{" not in good.textfile
    assert good.textfile_mode == "644"
    assert "host boot chain: ok" in good.report_journal, good.report_journal
    assert good.chain_rc == 0 and good.chain["ok"], good.chain


def test_a_boot_unit_stopped_from_running_stops_the_chain_there(
    host_chain_run: HostChain,
) -> None:
    b = host_chain_run.broken
    assert b.booted == ["pve"]
    # It did not run at this boot: no invocation, nothing in this boot's journal.
    assert (b.devices["ActiveState"], b.devices["UnitFileState"]) == ("inactive", "disabled")
    assert b.devices["InvocationID"] == "", b.devices
    assert "ct200-host-devices:" not in b.devices_journal
    # The report still ran (ordering only) and says where the chain stopped.
    assert b.report["Result"] == "success", b.report
    assert b.report["InvocationID"] != host_chain_run.good.report["InvocationID"]
    assert "ct200_boot_chain_ok 0" in b.textfile, b.textfile
    assert STOPPED in b.textfile, b.textfile
    journal = b.report_journal
    assert f"stopped at: host host-devices ({DEVICES}): off" in journal, journal
    assert f"fix: disabled, it did not run at this boot: `systemctl enable --now {DEVICES}`" in (
        journal
    ), journal
    assert b.chain_rc == 1, b.chain
    assert b.chain["stopped_at"] == {"kind": "host", "name": "host-devices", "unit": DEVICES}
    # The step after it ran: only the disabled link is named.
    steps = {s["name"]: s["state"] for s in b.chain["steps"]}
    assert steps == {"host-devices": "off", "pcie-tune": "ok"}, b.chain


def test_recover_enables_and_runs_the_unit(host_chain_run: HostChain) -> None:
    run = host_chain_run.recover
    assert run.rc == 0, run.describe()
    started = [r for r in run.results("changed") if "host boot units" in r]
    assert started, run.describe()
    after = host_chain_run.devices_after
    assert (after["ActiveState"], after["Result"], after["UnitFileState"]) == (
        "active",
        "success",
        "enabled",
    ), after
    rc, got = host_chain_run.chain_after
    assert rc == 0 and got["ok"], got


def test_a_second_recover_changes_nothing(host_chain_run: HostChain) -> None:
    run = host_chain_run.again
    assert run.rc == 0, run.describe()
    changed = {host: st["changed"] for host, st in run.stats.items() if st["changed"]}
    assert not changed, run.describe()
    assert PVE in run.stats


def test_a_failed_boot_unit_shows_failed_with_its_reason(host_chain_run: HostChain) -> None:
    f = host_chain_run.failed
    assert f.booted == ["pve"]
    assert (f.devices["ActiveState"], f.devices["Result"]) == ("failed", "exit-code"), f.devices
    reason = "ct200-host-devices: cannot load nvidia: is the NVIDIA driver installed"
    assert reason in f.devices_journal, f.devices_journal
    assert "ct200_boot_chain_ok 0" in f.textfile
    assert STOPPED.replace('state="off"', 'state="failed"') in f.textfile, f.textfile
    journal = f.report_journal
    assert f"stopped at: host host-devices ({DEVICES}): failed" in journal, journal
    assert reason in journal, journal  # this boot's journal lines of the failed unit
    assert f"fix: `journalctl -b -u {DEVICES}` says why" in journal, journal
    assert f.chain_rc == 1 and f.chain["stopped_at"]["name"] == "host-devices", f.chain
