"""The harness itself: isolation, host-key checking, crash recovery, teardown, bad input.

Tests marked ``testbed`` need root and boot machines; the others run anywhere.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml
from tbharness import REPO, Bed

from testbed import cgroups, inventory, network, rootfs, units
from testbed.config import MachineSpec, Settings, Slot
from testbed.errors import TestbedError
from testbed.harness import Harness, claim_test_slot, slot_lock
from testbed.machine import Machine
from testbed.system import TOOLS, Runner, require_root, require_tools

CLI = [sys.executable, "-m", "testbed"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )


# -- with machines -----------------------------------------------------------------------------


@pytest.mark.testbed
def test_host_key_checking_is_on(testbed: Bed, tmp_path: Path) -> None:
    base = ["ssh", "-F", "/dev/null", "-i", str(testbed.slot.key), "-o", "BatchMode=yes"]
    base += ["-o", "StrictHostKeyChecking=yes", "-o", "GlobalKnownHostsFile=/dev/null"]
    address = testbed.addresses["ct"]
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    unknown = subprocess.run(
        [*base, "-o", f"UserKnownHostsFile={empty}", f"root@{address}", "true"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert unknown.returncode == 255 and "Host key verification failed" in unknown.stderr
    # pve's key written for ct's address: a machine that is not who it claims to be.
    pve_line = next(
        line
        for line in testbed.slot.known_hosts.read_text().splitlines()
        if line.startswith(testbed.addresses["pve"] + " ")
    )
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(address + " " + pve_line.split(" ", 1)[1] + "\n")
    spoofed = subprocess.run(
        [*base, "-o", f"UserKnownHostsFile={wrong}", f"root@{address}", "true"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert spoofed.returncode == 255 and "HOST IDENTIFICATION HAS CHANGED" in spoofed.stderr
    assert testbed.ssh("ct", "true").returncode == 0


@pytest.mark.testbed
def test_machines_are_separate(testbed: Bed) -> None:
    netns = {m: testbed.ssh(m, "readlink", "/proc/1/ns/net").stdout.strip() for m in ("pve", "ct")}
    assert len(set(netns.values())) == 2
    assert os.readlink("/proc/self/ns/net") not in netns.values()
    keys = {
        m: testbed.ssh(m, "cat", "/etc/ssh/ssh_host_ed25519_key.pub").stdout.split()[1]
        for m in ("pve", "ct")
    }
    assert len(set(keys.values())) == 2
    assert testbed.ssh("pve", "hostname").stdout.strip() == "ct200-pve"
    for m, address in testbed.addresses.items():
        assert ipaddress.IPv4Address(address) in testbed.slot.subnet, m
    # The machines reach each other over the slot's bridge, by name.
    probe = "import socket; socket.create_connection(('ct200-pve', 22), timeout=5); print('ok')"
    assert testbed.ssh("ct", "python3", "-c", probe).stdout.strip() == "ok"
    # ...and nothing else: no default route out of the testbed.
    assert testbed.ssh("ct", "ip", "route", "show", "default").stdout.strip() == ""


@pytest.mark.testbed
def test_status_of_running_testbed(testbed: Bed) -> None:
    st = testbed.harness.status()
    assert st.state == "up"
    assert {(m.name, m.running, m.ssh) for m in st.machines} == {
        ("pve", True, True),
        ("ct", True, True),
    }
    proc = cli("status", "--slot", str(testbed.slot.index))
    assert proc.returncode == 0 and "ssh ok" in proc.stdout


def _leftovers(slot: Slot) -> list[str]:
    found = [f"netns {n}" for n in network.namespaces(slot.prefix + "-")]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True)
    found += [
        f"link {line.split(':')[1].strip()}"
        for line in links.stdout.splitlines()
        if f" {slot.bridge}:" in line or f" tb{slot.index}-" in line
    ]
    mounts = Path("/proc/self/mountinfo").read_text()
    found += [
        f"mount under {slot.dir}"
        for line in mounts.splitlines()
        if line.split()[4].startswith(str(slot.dir))
    ]
    dirs = cgroups.slot_dirs(cgroups.hierarchies(), slot.cgroup_rel)
    found += [f"cgroup {d}" for d in dirs if d.exists()]
    if slot.dir.exists():
        found.append(f"dir {slot.dir}")
    return found


@pytest.mark.testbed
def test_killed_run_is_recovered_and_teardown_leaves_nothing(
    testbed: Bed, capsys: pytest.CaptureFixture[str]
) -> None:
    """Kill a testbed the hard way (SIGKILL to systemd-nspawn, no teardown), then: status calls
    it a leftover, up recovers it, down removes everything, and down again is a no-op."""
    settings = testbed.slot.settings
    with contextlib.ExitStack() as stack:
        slot = claim_test_slot(settings, stack)
        if slot is None:
            pytest.skip("no second test slot free")
        harness = Harness(slot)
        stack.callback(harness.down, True)
        solo = [MachineSpec.parse("solo")]
        first = harness.up(solo, with_wheelhouse=False)
        os.kill(first.machines[0].pid, signal.SIGKILL)
        assert harness.status().state == "leftover"
        proc = cli("status", "--slot", str(slot.index))
        assert proc.returncode == 4 and "leftover" in proc.stdout, proc.stdout

        capsys.readouterr()
        second = harness.up(solo, with_wheelhouse=False)
        assert "left over from a run that did not finish" in capsys.readouterr().out
        assert harness.status().state == "up"
        assert second.machines[0].pid != first.machines[0].pid

        removed = harness.down()
        assert any(r.startswith("machine solo") for r in removed)
        assert _leftovers(slot) == []
        for m in (*first.machines, *second.machines):
            assert m.lock and not Path(m.lock).exists(), "systemd-nspawn's lock file was left"
        assert harness.down() == []
        assert harness.status().state == "down"
        assert cli("status", "--slot", str(slot.index)).returncode == 3


@pytest.mark.testbed
def test_address_in_use_is_reported(testbed_requirements: None, tmp_path: Path) -> None:
    """A controller address inside the slot's subnet stops `up` with the way out. Run in a
    namespace of the test's own, so the controller's network is untouched."""
    ns = "ct200tbtest-clash"
    slot = Slot(15, Settings.from_env())
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        inside = ["ip", "-n", ns]
        subprocess.run([*inside, "link", "add", "clash0", "type", "bridge"], check=True)
        address = f"{slot.subnet[5]}/24"
        subprocess.run([*inside, "addr", "add", address, "dev", "clash0"], check=True)

        class InNamespace(Runner):
            def run(
                self, argv: Sequence[str | Path], **kw: object
            ) -> subprocess.CompletedProcess[str]:  # type: ignore[override]
                return super().run([*inside, *map(str, argv[1:])], **kw)  # type: ignore[arg-type]

        with pytest.raises(TestbedError) as err:
            network.check_free(InNamespace(), slot)
        text = str(err.value)
        assert address in text and "clash0" in text and "CT200_TESTBED_NET=" in text
    finally:
        subprocess.run(["ip", "netns", "delete", ns], check=False)


# -- anywhere ----------------------------------------------------------------------------------


def test_not_root_says_how() -> None:
    with pytest.raises(TestbedError) as err:
        require_root(euid=1000)
    assert "needs root" in str(err.value) and "sudo" in str(err.value)


def test_missing_tools_name_the_packages() -> None:
    with pytest.raises(TestbedError) as err:
        require_tools(TOOLS, which=lambda _tool: None)
    text = str(err.value)
    assert "systemd-nspawn" in text
    assert "apt-get install -y iproute2 mount openssh-client systemd-container" in text


def test_unreachable_mirror_says_what_to_do() -> None:
    with pytest.raises(TestbedError) as err:
        rootfs.check_mirror("http://127.0.0.1:9/debian", timeout=3)
    assert "cannot reach the Debian mirror" in str(err.value)
    assert "CT200_TESTBED_MIRROR" in str(err.value)


def test_overlapping_address_or_route_is_a_conflict() -> None:
    slot = Slot(0, Settings.from_env({}))
    addrs: list[dict[str, object]] = [
        {"ifname": "eth0", "addr_info": [{"local": "192.0.2.2", "prefixlen": 24}]},
        {"ifname": "eth1", "addr_info": [{"local": "10.231.0.7", "prefixlen": 16}]},
        {"ifname": "ct200tb0", "addr_info": [{"local": "10.231.0.1", "prefixlen": 24}]},
    ]
    routes: list[dict[str, object]] = [
        {"dst": "default", "gateway": "192.0.2.1", "dev": "eth0"},
        {"dst": "10.231.0.0/20", "dev": "wg0"},
    ]
    assert network.conflicts(slot, addrs, routes) == [
        "address 10.231.0.7/16 on eth1",
        "route 10.231.0.0/20 via wg0",
    ]
    assert network.conflicts(slot, addrs[:1], routes[:1]) == []


def test_settings_keep_to_private_ranges() -> None:
    with pytest.raises(TestbedError):
        Settings.from_env({"CT200_TESTBED_NET": "8.8.8.0"})
    with pytest.raises(TestbedError):
        Settings.from_env({"CT200_TESTBED_NET": "10.1.2.3"})
    slot = Slot(3, Settings.from_env({"CT200_TESTBED_NET": "192.168.64.0"}))
    assert str(slot.subnet) == "192.168.67.0/24" and str(slot.address(0)) == "192.168.67.10"


def test_machine_spec() -> None:
    assert MachineSpec.parse("pve") == MachineSpec("pve", "pve")
    assert MachineSpec.parse("ct2:ct") == MachineSpec("ct2", "ct")
    assert MachineSpec.parse("solo") == MachineSpec("solo", "plain")
    for bad in ("Bad", "toolongname", "x:nope", "1x"):
        with pytest.raises(TestbedError):
            MachineSpec.parse(bad)


def test_busy_slot_is_reported(tmp_path: Path) -> None:
    slot = Slot(2, Settings.from_env({"CT200_TESTBED_RUN": str(tmp_path)}))
    with slot_lock(slot, wait=False):
        with pytest.raises(TestbedError) as err, slot_lock(slot, wait=False):
            pass
        assert f"pid {os.getpid()}" in str(err.value)


def test_inventory_keeps_host_key_checking_on(tmp_path: Path) -> None:
    settings = Settings.from_env(
        {"CT200_TESTBED_RUN": str(tmp_path), "CT200_TESTBED_REPO": str(REPO)}
    )
    slot = Slot(4, settings)
    machines = [
        Machine("pve", "pve", "10.231.4.10", 1, "/run/netns/x", "/r", "/l"),
        Machine("ct", "ct", "10.231.4.11", 2, "/run/netns/y", "/r", "/l"),
    ]
    data = yaml.safe_load(inventory.render(slot, machines, Path("/w/wheelhouse.tar")))
    groups = data["all"]["children"]
    assert groups["pve"]["hosts"] == {"ct200-pve": {"ansible_host": "10.231.4.10"}}
    assert groups["ct"]["hosts"] == {"ct200-ct": {"ansible_host": "10.231.4.11"}}
    common = data["all"]["vars"]["ansible_ssh_common_args"]
    assert "StrictHostKeyChecking=yes" in common and str(slot.known_hosts) in common
    assert data["all"]["vars"]["ct200_tools_wheelhouse"] == "/w/wheelhouse.tar"


def test_verify_units_fails_on_any_output(tmp_path: Path) -> None:
    if not Path("/usr/bin/systemd-analyze").exists():
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    good = tmp_path / "ct200-good.service"
    good.write_text("[Unit]\nDescription=good\n[Service]\nType=oneshot\nExecStart=/bin/true\n")
    typo = tmp_path / "ct200-typo.service"
    typo.write_text(good.read_text() + "Restartt=always\n")

    def run(argv: Sequence[str]) -> tuple[int, str, str]:
        proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
        return proc.returncode, proc.stdout, proc.stderr

    problems = units.verify([str(good), str(typo)], run)
    # systemd-analyze exits 0 on the typo: only its stderr gives it away.
    assert [p.unit for p in problems] == [str(typo)]
    assert "Restartt" in problems[0].output
    assert units.units_of(["/etc/systemd/system/a.service.d/x.conf", "/etc/b.timer", "/etc/c"]) == [
        "/etc/b.timer",
        "/etc/systemd/system/a.service",
    ]
