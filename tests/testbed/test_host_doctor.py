"""`ct200-doctor check --host pve` over real SSH (paramiko, known_hosts verified) against the
testbed's `pve` machine after playbooks/host.yml ran on it.

The pve machine has no NVIDIA driver, so it gets two stand-ins, named as such and taken away at
the end: the H200's recorded /proc/devices bind-mounted over /proc/devices (as lxcfs mounts
files over /proc; nvidia-uvm is 238 there), and the NVIDIA nodes made with mknod at those
majors. host.yml then runs with the testbed's spec switched to raw-lxc passthrough, so the
module writes allow rules with the host's current majors (the incident's mode).

Checked: the doctor passes on the converged config; after a stale nvidia-uvm allow rule (509)
is put in, it fails naming the stale line and the line that replaces it, and the printed tag
fixes it; a host key that is not in known_hosts, or another key than the recorded one, is
refused with the fix, and nothing is read. The benchmark runs at its smoke size.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from tbharness import REPO, AnsibleRun, Bed, diff, snapshot
from test_host_roles import restore, sh, text

from testbed.machine import hostname

pytestmark = pytest.mark.testbed

PVE = hostname("pve")
HOST = "playbooks/host.yml"
WORK = "/root/ct200-hostdoctor-test"
STANDIN_PROC = f"{WORK}/proc_devices"
CONF = "/etc/pve/lxc/200.conf"
#: The testbed spec's one GPU: the nodes the container is given.
NODES = {
    "/dev/nvidia0": (195, 0),
    "/dev/nvidiactl": (195, 255),
    "/dev/nvidia-uvm": (238, 0),
    "/dev/nvidia-uvm-tools": (238, 1),
}
STALE = "lxc.cgroup2.devices.allow: c 509:* rwm"
CURRENT = "lxc.cgroup2.devices.allow: c 238:* rwm"
SELECT = ("--only", "host", "--only", "lxc")


def site(passthrough: str) -> dict[str, object]:
    spec = yaml.safe_load((REPO / "inventory/testbed/group_vars/all.yml").read_text())
    site = spec["ct200_site"]
    site["pve"]["passthrough"] = passthrough
    return {"ct200_site": site}


@dataclass
class Run:
    rc: int
    out: str
    err: str

    def describe(self) -> str:
        return f"rc {self.rc}\n--- stdout\n{self.out}\n--- stderr\n{self.err}"


def doctor(*args: str) -> Run:
    proc = subprocess.run(
        [sys.executable, "-m", "ct200_tools.cli.entry", "check", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "NO_COLOR": "1"},
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


@dataclass
class HostDoctor:
    bed: Bed
    spec: Path
    converge: AnsibleRun
    good: Run
    good_json: dict[str, object]
    stale_conf: str
    stale: Run
    fixed_by_tag: AnsibleRun
    fixed: Run
    unknown_key: Run
    changed_key: Run


def _ssh_config(bed: Bed, tmp: Path, known_hosts: Path) -> Path:
    """The testbed's ssh config for people, with another known_hosts file."""
    text = bed.slot.ssh_config.read_text().replace(str(bed.slot.known_hosts), str(known_hosts))
    path = tmp / f"config-{known_hosts.name}"
    path.write_text(text)
    return path


def standins(bed: Bed) -> None:
    proc_devices = (REPO / "tests/fixtures/raw/h200/proc_devices.txt").read_text()
    sh(bed, f"mkdir -p {WORK}")
    r = bed.ssh(
        "pve",
        "python3",
        "-c",
        "import sys; open(sys.argv[1], 'w').write(sys.argv[2])",
        STANDIN_PROC,
        proc_devices,
    )
    assert r.returncode == 0, r.stderr
    made = " && ".join(f"mknod -m 0666 {p} c {mj} {mn}" for p, (mj, mn) in NODES.items())
    sh(bed, f"mount --bind {STANDIN_PROC} /proc/devices && {made}")


def unstandins(bed: Bed) -> None:
    bed.ssh(
        "pve",
        "sh",
        "-c",
        f"umount /proc/devices; rm -f {' '.join(NODES)}; rm -rf {WORK}",
    )


@pytest.fixture(scope="module")
def hd(testbed: Bed) -> Iterator[HostDoctor]:
    bed = testbed
    fresh = snapshot(bed, "pve")
    conf_200 = text(bed, CONF)
    tmp = bed.workdir / "hostdoctor"
    tmp.mkdir(exist_ok=True)
    raw = tmp / "raw-lxc.json"
    raw.write_text(json.dumps(site("raw-lxc")))
    spec = tmp / "site.yml"
    spec.write_text(yaml.safe_dump(site("raw-lxc")))
    config = str(bed.slot.ssh_config)
    try:
        standins(bed)
        converge = bed.ansible(HOST, "-e", f"@{raw}")
        good = doctor("--host", "pve", "--ssh-config", config, "--spec", str(spec), *SELECT)
        as_json = doctor(
            "--host", "pve", "--ssh-config", config, "--spec", str(spec), "--json", *SELECT
        )
        good_json = json.loads(as_json.out) if as_json.out.startswith("{") else {}
        converged = text(bed, CONF)
        assert CURRENT in converged.splitlines(), converged
        stale_conf = converged.replace(CURRENT, STALE)
        r = bed.ssh(
            "pve",
            "python3",
            "-c",
            "import sys; open(sys.argv[1], 'w').write(sys.argv[2])",
            CONF,
            stale_conf,
        )
        assert r.returncode == 0, r.stderr
        stale = doctor("--host", "pve", "--ssh-config", config, "--spec", str(spec), *SELECT)
        fixed_by_tag = bed.ansible(HOST, "-e", f"@{raw}", "--tags", "lxc_passthrough")
        fixed = doctor("--host", "pve", "--ssh-config", config, "--spec", str(spec), *SELECT)
        empty = tmp / "empty_known_hosts"
        empty.write_text("")
        unknown_key = doctor(
            "--host", "pve", "--ssh-config", str(_ssh_config(bed, tmp, empty)), "--spec", str(spec)
        )
        other = tmp / "other_key"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)],
            check=True,
            capture_output=True,
        )
        wrong = tmp / "wrong_known_hosts"
        pub = (tmp / "other_key.pub").read_text().split()
        wrong.write_text(f"{bed.addresses['pve']} {pub[0]} {pub[1]}\n")
        changed_key = doctor(
            "--host", "pve", "--ssh-config", str(_ssh_config(bed, tmp, wrong)), "--spec", str(spec)
        )
        yield HostDoctor(
            bed,
            spec,
            converge,
            good,
            good_json,
            stale_conf,
            stale,
            fixed_by_tag,
            fixed,
            unknown_key,
            changed_key,
        )
    finally:
        unstandins(bed)
        restore(bed, conf_200)
        left = diff(fresh, snapshot(bed, "pve"))
        assert not left, "the host doctor tests left changes on pve:\n" + "\n".join(left)


def test_host_play_converged_with_the_standin_majors(hd: HostDoctor) -> None:
    assert hd.converge.rc == 0, hd.converge.describe()
    assert "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm" in hd.stale_conf


def test_passes_on_the_converged_host(hd: HostDoctor) -> None:
    assert hd.good.rc == 0, hd.good.describe()
    for line in (
        "[✓] host.nodes",
        "[✓] lxc.nodes",
        "[✓] lxc.majors",
        "[✓] host.numa_balancing",
    ):
        assert line in hd.good.out, hd.good.describe()
    assert "Traceback" not in hd.good.err


def test_read_over_ssh_from_the_host(hd: HostDoctor) -> None:
    """The facts came from pve over SSH: its hostname, its /proc/devices (the stand-in), its
    config -- not from the controller."""
    host = hd.good_json.get("host")
    assert isinstance(host, dict), hd.good_json
    assert host["hostname"] == PVE and host["via"].startswith("ssh root@pve ("), host
    assert f"PVE host: {PVE} read over ssh root@pve ({hd.bed.addresses['pve']})" in hd.good.out
    checks = {c["id"]: c for c in hd.good_json["checks"]}  # type: ignore[union-attr]
    assert any("'nvidia-uvm': 238" in e for e in checks["lxc.majors"]["evidence"]), checks


def test_stale_uvm_rule_fails_with_the_line_to_change(hd: HostDoctor) -> None:
    r = hd.stale
    assert r.rc == 2, r.describe()
    assert "[✗] lxc.majors" in r.out, r.describe()
    assert "major 509, which no driver holds now (nvidia-uvm is 238)" in r.out, r.describe()
    assert f"-{STALE}" in r.out and f"+{CURRENT}" in r.out, r.describe()
    assert "playbook tag: lxc_passthrough" in r.out


def test_the_printed_tag_fixes_it(hd: HostDoctor) -> None:
    assert hd.fixed_by_tag.rc == 0, hd.fixed_by_tag.describe()
    assert hd.fixed.rc == 0, hd.fixed.describe()
    assert "[✓] lxc.majors" in hd.fixed.out


def test_unknown_host_key_is_refused(hd: HostDoctor) -> None:
    r = hd.unknown_key
    assert r.rc == 2, r.describe()
    assert r.out == "", r.describe()  # nothing judged: refused before anything was read
    assert "--host pve: the SSH host key of root@pve" in r.err, r.describe()
    assert "is not in known_hosts" in r.err and "ssh-keyscan" in r.err, r.describe()
    assert "Traceback" not in r.err


def test_changed_host_key_is_refused(hd: HostDoctor) -> None:
    r = hd.changed_key
    assert r.rc == 2, r.describe()
    assert r.out == "", r.describe()
    assert "its SSH host key CHANGED" in r.err and "ssh-keygen -R" in r.err, r.describe()
    assert "Traceback" not in r.err


def test_benchmark_smoke(hd: HostDoctor) -> None:
    """benchmarks/hostdoctor's one-line command at its smallest size on this testbed."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.hostdoctor.bench",
            "--ssh-config",
            str(hd.bed.slot.ssh_config),
            "--spec",
            str(hd.spec),
            "--reps",
            "1",
            "--json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    figures = json.loads(proc.stdout)
    assert figures["reps"] == 1
    for key in ("doctor_host_s", "ssh_true_s", "doctor_local_s", "ratio_host_to_ssh_plus_local"):
        assert figures[key] > 0, figures
    assert figures["doctor_host_rc"] in (0, 1, 2), figures  # this machine has no GPU
