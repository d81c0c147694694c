"""check --host: the host probe on trees rebuilt from the recordings (tests/unit/host_helpers.py),
the host.* and lxc.* fixes, the SSH door (ct200_tools/doctor/probes/ssh.py) against a real SSH
server in this process, and the CLI's bad input.

The pass/fail examples of every check are in ct200_tools/doctor/checks/examples/ and its root
causes in test_causes.py; this file checks what the fixes say, and that they agree with the
ct200_pve_lxc_gpu module's own edit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from ct200_tools.doctor.checks import run_checks
from ct200_tools.doctor.checks.base import Finding
from ct200_tools.doctor.probes.base import SshError
from ct200_tools.doctor.probes.pci import (
    ConfigUnreadable,
    find_ext_capability,
    parse_acs_ctl,
    upstream_bridges,
)
from ct200_tools.doctor.probes.ssh import SshReader, connect, resolve
from ct200_tools.facts import dumps, loads
from ct200_tools.host import pvecfg
from tests.unit import host_helpers as hh
from tests.unit.probe_helpers import FIXTURES, facts

ROOT = Path(__file__).parents[2]
INCIDENT = (FIXTURES / "pve" / "incident-raw.conf").read_text()
STALE = "lxc.cgroup2.devices.allow: c 509:* rwm"
NODES = (*(f"/dev/nvidia{i}" for i in range(8)), *("/dev/nvidiactl", "/dev/nvidia-uvm"))
NODES += ("/dev/nvidia-uvm-tools",)


def judged(case: hh.HostCase, fixture: str = "ct200-ct-healthy") -> dict[str, Finding]:
    f = hh.with_host(facts(fixture), case)
    return {x.id: x for x in run_checks(f, hh.ct200_spec())}


# -- lxc.* -------------------------------------------------------------------------------------
def test_stale_uvm_rule_gives_the_line_to_change_as_the_module_changes_it() -> None:
    got = judged(hh.HostCase(), "ct200-ct-incident")["lxc.majors"]
    assert got.status == "fail"
    assert got.summary.startswith("an allow rule for major 509, which no driver holds now")
    assert got.remediation is not None and got.remediation.tag == "lxc_passthrough"
    assert got.remediation.where == "host"
    assert got.remediation.command is None  # lines of the config file, not commands
    assert got.remediation.config == (f"-{STALE}", "+lxc.cgroup2.devices.allow: c 511:* rwm")
    assert got.remediation.file == "/etc/pve/lxc/200.conf"
    assert "/etc/pve/lxc/200.conf" in got.remediation.action
    assert "pct reboot 200" in got.remediation.action
    # The module, in raw-lxc mode with the host's /proc/devices, makes the same change in place.
    majors = pvecfg.parse_proc_devices(hh.proc_devices(511))
    plan = pvecfg.plan(pvecfg.parse(INCIDENT), pvecfg.Want(NODES, "raw-lxc", majors=majors))
    assert (STALE, "lxc.cgroup2.devices.allow: c 511:* rwm") in plan.replaced
    # ... after which the check passes.
    after = judged(hh.HostCase(conf_text=plan.after), "ct200-ct-incident")["lxc.majors"]
    assert after.status == "pass", after


def test_recorded_h200_major_passes() -> None:
    """The recorded /proc/devices (nvidia-uvm 238) with the rule for 238."""
    conf = INCIDENT.replace("c 509:* rwm", "c 238:* rwm", 1)
    got = judged(hh.HostCase(uvm=238, conf_text=conf))
    assert got["lxc.majors"].status == "pass", got["lxc.majors"]
    assert got["lxc.nodes"].status == "pass"
    assert got["host.nodes"].status == "pass"


def test_nodes_not_passed_fix_is_pct_set_and_the_modules_edit_passes() -> None:
    got = judged(hh.HostCase(conf="fresh-pve8.conf"))["lxc.nodes"]
    assert got.status == "fail" and got.summary.startswith("11 of 11 NVIDIA nodes not passed")
    assert got.remediation is not None
    assert got.remediation.command == "pct set 200 " + " ".join(
        f"-dev{i} {p},mode=0666" for i, p in enumerate(NODES)
    )
    assert judged(hh.HostCase(conf_text=hh.DEVN))["lxc.nodes"].status == "pass"


def test_raw_lxc_nodes_not_passed_gives_the_lines_to_add() -> None:
    spec = dataclasses.replace(
        hh.ct200_spec(), pve=dataclasses.replace(hh.ct200_spec().pve, passthrough="raw-lxc")
    )
    f = hh.with_host(facts("ct200-ct-healthy"), hh.HostCase(conf="fresh-pve8.conf"), spec)
    got = {x.id: x for x in run_checks(f, spec)}["lxc.nodes"]
    assert got.status == "fail" and got.remediation is not None
    lines = got.remediation.config
    assert "+lxc.cgroup2.devices.allow: c 511:* rwm" in lines
    assert "+lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file" in (
        lines
    )


def test_no_config_names_the_file_and_pct_list() -> None:
    got = judged(hh.HostCase(conf=None))
    nodes = got["lxc.nodes"]
    assert nodes.status == "fail"
    assert nodes.summary == (
        "container 200 has no config on host pve: /etc/pve/lxc/200.conf does not exist"
    )
    assert nodes.remediation is not None and nodes.remediation.command == "pct list"
    assert got["lxc.majors"].status == "skip" and got["lxc.majors"].caused_by == "lxc.nodes"


# -- host.* ------------------------------------------------------------------------------------
def test_uvm_not_loaded_on_the_host_names_the_boot_unit() -> None:
    got = judged(hh.HostCase(uvm=None))
    nodes = got["host.nodes"]
    assert nodes.status == "fail"
    assert nodes.remediation is not None
    assert nodes.remediation.command == "modprobe nvidia_uvm && nvidia-modprobe -u -c0"
    assert "ct200-host-devices.service" in nodes.remediation.action
    assert nodes.remediation.tag == "host_devices" and nodes.remediation.where == "host"
    # Its major is unknown: the config's rules are not judged against a guess.
    assert got["lxc.majors"].status == "skip" and got["lxc.majors"].caused_by == "host.nodes"


def test_a_host_without_gpus_is_not_the_gpus_host() -> None:
    got = judged(hh.HostCase(gpus=(), nvidia=False, module=None))
    nodes = got["host.nodes"]
    assert nodes.status == "fail"
    assert nodes.summary.endswith("pve is not the GPUs' host")
    assert nodes.remediation is not None and nodes.remediation.command is None
    assert nodes.remediation.tag is None  # no playbook makes GPUs appear
    assert got["host.acs"].status == "skip"


def test_host_mrrs_reads_the_recorded_config_space() -> None:
    """The recorded H200 (MRRS 4096, MPS 256 in the recorded snapshot), read as the host."""
    host, _ = hh.read_host(hh.HostCase(gpus=("0000:00:06.0",), acs="none"))
    recorded = facts("h200-healthy").pci
    assert host.pci is not None and recorded is not None
    assert [(p.bdf, p.max_read_request, p.max_payload, p.config_readable) for p in host.pci] == [
        (p.bdf, p.max_read_request, p.max_payload, p.config_readable) for p in recorded
    ]
    got = judged(hh.HostCase(mrrs_code=2))["host.pcie_mrrs"]
    assert got.status == "fail" and got.remediation is not None
    assert "ct200-pcie-tune.service" in got.remediation.action
    assert got.remediation.command is not None
    assert got.remediation.command.splitlines()[0] == "setpci -s 0000:01:00.0 CAP_EXP+8.w=5000:7000"
    assert (got.remediation.tag, got.remediation.where) == ("host_tuning", "host")


def test_acs_capability_on_the_derived_root_port() -> None:
    assert parse_acs_ctl(hh.bridge_config(0x1D)) == 0x1D
    assert parse_acs_ctl(hh.bridge_config(None)) is None
    with pytest.raises(ConfigUnreadable):
        find_ext_capability(hh.bridge_config(0x1D)[:256], 0x0D)
    # The recorded H200 GPU has extended capabilities, and no ACS (an endpoint).
    from tests.unit.probe_helpers import recorded_config  # noqa: PLC0415

    assert parse_acs_ctl(recorded_config()) is None
    warn = judged(hh.HostCase(acs=hh.ACS_LINUX_DEFAULT))["host.acs"]
    assert warn.status == "warn" and warn.remediation is not None
    assert (warn.remediation.command or "").splitlines()[0] == (
        "setpci -s 0000:00:01.1 ECAP_ACS+6.w=0000:000c"
    )


def test_upstream_bridges_from_the_sysfs_path(tmp_path: Path) -> None:
    r = hh.build(tmp_path, hh.HostCase())
    assert upstream_bridges(r, "0000:21:00.0") == ["0000:00:02.1"]
    r2 = hh.build(tmp_path / "flat", hh.HostCase(acs="none"))
    assert upstream_bridges(r2, "0000:21:00.0") == []


def test_host_facts_round_trip_and_older_snapshots_unchanged() -> None:
    f = hh.with_host(facts("ct200-ct-incident"))
    assert loads(dumps(f)) == f
    plain = facts("ct200-ct-incident")
    assert '"host"' not in dumps(plain)
    assert dumps(plain) == (FIXTURES / "facts" / "ct200-ct-incident.json").read_text()


# -- the SSH door ------------------------------------------------------------------------------
def test_resolve_reads_the_ssh_config(tmp_path: Path) -> None:
    cfg = tmp_path / "config"
    cfg.write_text(
        "Host pve\n  HostName 10.0.0.5\n  Port 2222\n  User admin\n"
        f"  IdentityFile {tmp_path}/id\n  UserKnownHostsFile {tmp_path}/kh\n"
        "  GlobalKnownHostsFile /dev/null\n"
    )
    t = resolve("pve", str(cfg))
    assert (t.hostname, t.port, t.user) == ("10.0.0.5", 2222, "admin")
    assert t.identity_files == (f"{tmp_path}/id",)
    assert t.known_hosts == (f"{tmp_path}/kh", "/dev/null")
    assert t.key_name == "[10.0.0.5]:2222"
    assert resolve("root@pve", str(cfg)).user == "root"
    for bad in ("-oProxyCommand=x", "a b", "@pve"):
        with pytest.raises(SshError, match="is not a host"):
            resolve(bad, str(cfg))
    with pytest.raises(SshError, match="is empty"):
        resolve("", str(cfg))
    with pytest.raises(SshError, match=r"ssh config .*nope does not exist"):
        resolve("pve", str(tmp_path / "nope"))


def test_ssh_reader_refuses_what_it_does_not_read_remotely() -> None:
    r = SshReader(None)  # type: ignore[arg-type]
    for call in (
        lambda: r.try_open("/dev/nvidia0"),
        lambda: r.statvfs("/"),
        lambda: r.is_file("/etc/hostname"),
        lambda: r.request("GET", "http://x/", None, 1),
        lambda: r.run(["true"], 1, env={"A": "1"}),
    ):
        with pytest.raises(OSError, match="not read over SSH"):
            call()


class _Server(paramiko.ServerInterface):
    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_FAILED


@pytest.fixture
def sshd() -> Iterator[tuple[int, paramiko.PKey]]:
    """A real SSH server (paramiko's, in this process) on a loopback port with a fresh host
    key: enough for the key exchange, where host keys are verified."""
    host_key = paramiko.ECDSAKey.generate()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    transports: list[paramiko.Transport] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            t = paramiko.Transport(conn)
            t.add_server_key(host_key)
            transports.append(t)
            with contextlib.suppress(paramiko.SSHException, EOFError, OSError):
                t.start_server(server=_Server())

    threading.Thread(target=serve, daemon=True).start()
    yield port, host_key
    listener.close()
    for t in transports:
        t.close()


def _target(tmp_path: Path, port: int, known: str) -> object:
    kh = tmp_path / "known_hosts"
    kh.write_text(known)
    cfg = tmp_path / "config"
    client_key = tmp_path / "id_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(client_key)],
        check=True,
        capture_output=True,
    )
    cfg.write_text(
        f"Host pve\n  HostName 127.0.0.1\n  Port {port}\n  User root\n"
        f"  IdentityFile {client_key}\n"
        f"  UserKnownHostsFile {kh}\n  GlobalKnownHostsFile /dev/null\n"
    )
    return resolve("pve", str(cfg))


def test_unknown_host_key_is_refused_with_the_fix(
    tmp_path: Path, sshd: tuple[int, paramiko.PKey]
) -> None:
    port, _ = sshd
    target = _target(tmp_path, port, "")
    with pytest.raises(SshError) as exc:
        connect(target, 5)  # type: ignore[arg-type]
    msg = str(exc.value)
    assert msg.startswith(f"--host pve: the SSH host key of root@pve (127.0.0.1):{port} is not in")
    assert "ssh-keyscan" in msg and "ssh pve true" in msg
    assert (tmp_path / "known_hosts").read_text() == ""  # never added


def test_changed_host_key_is_refused(tmp_path: Path, sshd: tuple[int, paramiko.PKey]) -> None:
    port, _ = sshd
    other = paramiko.ECDSAKey.generate()
    target = _target(
        tmp_path, port, f"[127.0.0.1]:{port} {other.get_name()} {other.get_base64()}\n"
    )
    with pytest.raises(SshError, match="its SSH host key CHANGED") as exc:
        connect(target, 5)  # type: ignore[arg-type]
    assert f"ssh-keygen -R [127.0.0.1]:{port}" in str(exc.value)


def test_known_host_key_gets_to_authentication(
    tmp_path: Path, sshd: tuple[int, paramiko.PKey]
) -> None:
    """With the right key recorded the key exchange passes; this server then refuses every key,
    which is said as such."""
    port, host_key = sshd
    known = f"[127.0.0.1]:{port} {host_key.get_name()} {host_key.get_base64()}\n"
    target = _target(tmp_path, port, known)
    with pytest.raises(SshError, match="the host refused our keys"):
        connect(target, 5)  # type: ignore[arg-type]


# -- the CLI -----------------------------------------------------------------------------------
def doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ct200_tools.cli.entry", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=ROOT,
        env=env,
    )


def test_host_without_pve_vmid_is_a_usage_error(tmp_path: Path) -> None:
    spec = tmp_path / "site.yml"
    spec.write_text(
        (ROOT / "inventory/ct200/group_vars/all/ct200_site.yml")
        .read_text()
        .replace("  pve: {vmid: 200, passthrough: devn}\n", "")
    )
    r = doctor("check", "--host", "pve", "--spec", str(spec))
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert "has no pve.vmid" in r.stderr and "ct200_site.pve.vmid" in r.stderr
    assert "Traceback" not in r.stderr


def test_host_with_facts_is_a_usage_error() -> None:
    r = doctor(
        "check",
        "--host",
        "pve",
        "--facts",
        str(FIXTURES / "facts/ct200-ct-incident.json"),
        "--spec",
        "inventory/ct200",
    )
    assert r.returncode == 2 and "ct200-doctor snapshot --host pve" in r.stderr, r.stderr


def test_a_snapshot_with_the_host_is_judged_anywhere(tmp_path: Path) -> None:
    snap = tmp_path / "facts.json"
    snap.write_text(dumps(hh.with_host(facts("ct200-ct-incident"))))
    r = doctor("check", "--facts", str(snap), "--spec", "inventory/ct200", "--only", "lxc")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "PVE host: pve read over ssh root@pve" in r.stdout
    assert f"-{STALE}" in r.stdout


def test_host_local_reads_this_machine_without_ssh(tmp_path: Path) -> None:
    r = doctor(
        "check", "--host", "local", "--spec", "inventory/ct200", "--only", "lxc.nodes", "--json"
    )
    assert "Traceback" not in r.stderr, r.stderr
    import json  # noqa: PLC0415

    report = json.loads(r.stdout)
    assert report["host"]["via"] == "local"
    nodes = report["checks"][0]
    # This machine is no PVE host: it has no /etc/pve/lxc/200.conf.
    assert nodes["id"] == "lxc.nodes" and nodes["status"] == "fail", nodes
    assert "/etc/pve/lxc/200.conf does not exist" in nodes["summary"]
    assert nodes["remediation"]["where"] == "this machine"


def test_without_paramiko_local_works_and_ssh_says_what_is_missing(tmp_path: Path) -> None:
    # A paramiko that cannot be imported (as on a machine where only the local path is wanted):
    # --host local never needs it; --host NAME says what is missing, never an internal error.
    blocked = tmp_path / "block" / "paramiko"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('paramiko blocked by the test')\n")
    env = {**os.environ, "PYTHONPATH": f"{blocked.parent}{os.pathsep}{ROOT}"}
    local = doctor(
        "check",
        "--host",
        "local",
        "--spec",
        "inventory/ct200",
        "--only",
        "lxc.nodes",
        "--json",
        env=env,
    )
    assert local.returncode == 2 and "Traceback" not in local.stderr, local.stderr
    assert "internal error" not in local.stderr, local.stderr
    import json  # noqa: PLC0415

    assert json.loads(local.stdout)["host"]["via"] == "local"
    remote = doctor("check", "--host", "pve", "--spec", "inventory/ct200", env=env)
    assert remote.returncode == 2, remote.stdout + remote.stderr
    assert "internal error" not in remote.stderr and "Traceback" not in remote.stderr
    assert "needs paramiko" in remote.stderr and "--host local" in remote.stderr, remote.stderr
