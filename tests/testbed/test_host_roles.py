"""playbooks/host.yml and the ct200_pve_lxc_gpu module on the testbed's `pve` machine.

host.yml: check mode on a fresh host changes nothing; converge; the second run and check mode
report changed=0; the boot units installed, enabled, ordered Before=pve-guests.service, clean
under `systemd-analyze verify`, run at "boot" (no GPU here: they say so and exit 0); the
container restarted (the `pct` stand-in's log) only when its config changed.

The module, from a playbook outside the repository (ansible.cfg's module path finds it): check
mode, converge, idempotence in both passthrough modes on configs of tests/fixtures/pve; a stale
nvidia-uvm major corrected in place, then followed after a "driver update"; bad input refused
with nothing written; a held config lock waited for, or failed on cleanly. The host has no
NVIDIA driver, so raw-lxc reads recorded /proc/devices files (tests/fixtures/raw/h200).

host.yml's runs are those of the session's shared converge (tests/testbed/conftest.py: site.yml
runs host.yml's play on pve, on machines no playbook has run on), recorded with pve's state
before and after each. This module layers on the converged host, and its finalizer puts back
what it added and checks it did: test_host_chain.py builds on the converged host next.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tbharness import REPO, AnsibleRun, Bed, Converged, diff, snapshot

from ct200_tools.tunings import TMPFILES_FILE
from testbed import units
from testbed.machine import hostname

# The module's fixtures (nine module runs, the benchmark) run in its first tests' setup; run
# alone, the session's shared converge too.
pytestmark = [pytest.mark.testbed, pytest.mark.timeout(1800)]

HOST = "playbooks/host.yml"
PVE = hostname("pve")
UNITS = ("ct200-host-devices.service", "ct200-pcie-tune.service")
#: roles/host_boot_report: the report of those units at every boot, and its program.
REPORT_UNIT = "ct200-host-boot-report.service"
HOST_CHAIN = "/usr/local/sbin/ct200-host-chain"
HOST_TEXTFILE = "/var/lib/prometheus/node-exporter/ct200_host_boot.prom"
FIXTURES = REPO / "tests/fixtures"
WORK = "/root/ct200-host-test"
NODES = [f"/dev/nvidia{i}" for i in range(8)] + [
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
]
#: Recorded on the H200 machine: nvidia-uvm is 238 there.
PROC_238 = f"{WORK}/proc_devices.238"
#: The same host after a driver update moved nvidia-uvm to 511 (the incident's major).
PROC_511 = f"{WORK}/proc_devices.511"
#: nvidia-uvm not loaded.
PROC_NO_UVM = f"{WORK}/proc_devices.no-uvm"

#: The module from a playbook that is not in the repository; every case's result is saved on
#: the controller as JSON (also in check mode).
MODULE_PLAYBOOK = f"""\
- name: ct200_pve_lxc_gpu by its short name, from outside the repository
  hosts: {PVE}
  gather_facts: false
  tasks:
    - name: Run the module on each case.
      ct200_pve_lxc_gpu:
        path: "{{{{ item.path }}}}"
        passthrough: "{{{{ item.passthrough }}}}"
        devices: "{{{{ item.devices }}}}"
        proc_devices: "{{{{ item.proc }}}}"
        lock_timeout: "{{{{ item.lock_timeout | default(10) }}}}"
      loop: "{{{{ cases }}}}"
      loop_control:
        label: "{{{{ item.name }}}}"
      register: results
      ignore_errors: true

    - name: Save the results on the controller.
      ansible.builtin.copy:
        content: "{{{{ results.results | to_json }}}}"
        dest: "{{{{ out }}}}"
        mode: "0644"
      delegate_to: localhost
      check_mode: false
"""


#: Writes argv[2] to argv[1], mode 0640 (as pmxcfs shows every config).
WRITE_640 = (
    "import os, sys; open(sys.argv[1], 'w').write(sys.argv[2]); os.chmod(sys.argv[1], 0o640)"
)


def conf(vmid: int) -> str:
    return f"/etc/pve/lxc/{vmid}.conf"


def case(name: str, vmid: int, passthrough: str, **kw: Any) -> dict[str, Any]:
    return {
        "name": name,
        "path": conf(vmid),
        "passthrough": passthrough,
        "devices": NODES,
        "proc": PROC_238,
        **kw,
    }


#: vmid -> the corpus config it starts as.
START = {
    210: "incident-raw.conf",
    211: "incident-raw.conf",
    212: "fresh-pve8.conf",
    213: "pending-devn.conf",
    214: "fresh-pve8.conf",
    215: "unparseable.conf",
    216: "locked.conf",
    217: "fresh-pve8.conf",
}
GOOD = [
    case("devn from the incident's raw lines", 210, "devn"),
    case("raw-lxc on the incident (stale uvm 509)", 211, "raw-lxc"),
    case("raw-lxc on a fresh config", 212, "raw-lxc"),
    case("devn beside a pending section", 213, "devn"),
]
BAD = [
    case("unknown vmid", 299, "devn"),
    case("no nvidia-uvm in /proc/devices", 214, "raw-lxc", proc=PROC_NO_UVM),
    case("unknown device path", 214, "devn", devices=[*NODES, "/dev/dri/card0"]),
    case("a line PVE does not understand", 215, "devn"),
    case("locked by a backup", 216, "devn"),
]


def sh(bed: Bed, script: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = bed.ssh("pve", "sh", "-ec", script, timeout=timeout)
    assert proc.returncode == 0, f"{script}\n{proc.stdout}{proc.stderr}"
    return proc


def confs(bed: Bed) -> dict[str, str]:
    """Every file in /etc/pve/lxc: inode, mode and sha256 (a rename changes the inode)."""
    out = sh(bed, "cd /etc/pve/lxc && stat -c '%n %i %a' * && sha256sum *").stdout.splitlines()
    stats = {ln.split()[0]: " ".join(ln.split()[1:]) for ln in out if len(ln.split()) == 3}
    sums = {ln.split()[1]: ln.split()[0] for ln in out if len(ln.split()) == 2}
    return {name: f"{stats[name]} {sums[name]}" for name in stats}


def text(bed: Bed, path: str) -> str:
    return sh(bed, f"cat {path}").stdout


def pct_calls(bed: Bed, since: int = 0) -> list[list[str]]:
    """The `pct` stand-in's calls, from the `since`-th on: the log is the session's, and the
    modules before this one (site.yml, host.yml) restarted the container too."""
    out = bed.ssh("pve", "cat", "/var/log/ct200-testbed/pct.log").stdout
    return [json.loads(line)["argv"] for line in out.splitlines()][since:]


@dataclass
class ModuleRun:
    run: AnsibleRun
    results: dict[str, dict[str, Any]]


def module(bed: Bed, label: str, cases: list[dict[str, Any]], *flags: str) -> ModuleRun:
    work = Path(bed.workdir)
    playbook = work / "module.yml"
    playbook.write_text(MODULE_PLAYBOOK)
    out = work / f"module-{label}.json"
    extra = work / f"cases-{label}.json"
    extra.write_text(json.dumps({"cases": cases, "out": str(out)}))
    run = bed.ansible(str(playbook), "-e", f"@{extra}", *flags)
    assert out.exists(), run.describe()
    results = {r["item"]["name"]: r for r in json.loads(out.read_text())}
    return ModuleRun(run, results)


def unit_state(bed: Bed) -> dict[str, dict[str, str]]:
    props = "ActiveState,Result,UnitFileState,Before,After,WantedBy,ExecMainStatus,InvocationID"
    out = {}
    for u in UNITS:
        proc = bed.ssh("pve", "systemctl", "show", f"--property={props}", u)
        assert proc.returncode == 0, proc.stderr
        out[u] = dict(line.split("=", 1) for line in proc.stdout.splitlines())
    return out


def hold_lock(bed: Bed, vmid: int, seconds: int) -> None:
    """Hold pve-container's config lock as `pct set` would, from a transient unit."""
    lock = f"/run/lock/lxc/pve-config-{vmid}.lock"
    sh(
        bed,
        f"mkdir -p /run/lock/lxc; systemd-run --quiet --collect --unit=ct200-test-lock "
        f"flock {lock} sleep {seconds}; "
        f"i=0; while flock -n {lock} true; do i=$((i+1)); [ $i -lt 200 ]; sleep 0.05; done",
    )


@dataclass
class Host:
    bed: Bed
    fresh: dict[str, str]
    check_fresh: AnsibleRun
    after_check: dict[str, str]
    converge: AnsibleRun
    converged: dict[str, str]
    calls_converge: list[list[str]]
    second: AnsibleRun
    check_after: AnsibleRun
    calls_after: list[list[str]]
    units: dict[str, dict[str, str]]
    journal: str
    verify: list[units.Problem]
    boot: dict[str, dict[str, str]]
    boot_journal: str
    modules_load: str
    sysctl: str
    conf_200: str


@pytest.fixture(scope="module")
def host(converged: Converged) -> Iterator[Host]:
    """host.yml's part of the session's shared converge (site.yml runs host.yml's play on pve):
    its runs and pve's snapshots, then what this module adds on the converged host."""
    bed = converged.bed
    found = snapshot(bed, "pve")
    try:
        state = unit_state(bed)
        journal = bed.ssh(
            "pve", "journalctl", "--no-pager", "-o", "cat", *[f"--unit={u}" for u in UNITS]
        ).stdout

        def run(argv: list[str]) -> tuple[int, str, str]:
            proc = bed.ssh("pve", *argv)
            return proc.returncode, proc.stdout, proc.stderr

        verify = units.verify([f"/etc/systemd/system/{u}" for u in (*UNITS, REPORT_UNIT)], run)
        # A boot, short of rebooting: the units inactive, then what boot starts; the journal of
        # exactly those runs (by their invocation ids).
        sh(bed, f"systemctl stop {' '.join(UNITS)}")
        sh(bed, "systemctl start multi-user.target", timeout=300)
        boot = unit_state(bed)
        boot_journal = "".join(
            bed.ssh(
                "pve",
                "journalctl",
                "--no-pager",
                "-o",
                "cat",
                f"_SYSTEMD_INVOCATION_ID={s['InvocationID']}",
            ).stdout
            for s in boot.values()
        )
        modules_load = text(bed, "/etc/modules-load.d/ct200-nvidia.conf")
        sysctl = text(bed, "/etc/sysctl.d/60-ct200.conf")
        yield Host(
            bed,
            converged.fresh["pve"],
            converged.check_fresh,
            converged.after_check["pve"],
            converged.converge,
            converged.converged["pve"],
            converged.pct_converge,
            converged.second,
            converged.check_after,
            converged.pct_after,
            state,
            journal,
            verify,
            boot,
            boot_journal,
            modules_load,
            sysctl,
            converged.conf_200,
        )
    finally:
        # Back to the converged host the modules after this one build on.
        unlayer(bed)
        left = diff(found, snapshot(bed, "pve"))
        assert not left, "the host tests left changes on pve:\n" + "\n".join(left)


def unlayer(bed: Bed) -> None:
    """What this module adds to the converged host, taken away: the module's configs and files,
    the lock holder."""
    bed.ssh(
        "pve",
        "sh",
        "-c",
        "systemctl stop ct200-test-lock.service 2>/dev/null;"
        " systemctl reset-failed ct200-test-lock.service 2>/dev/null;"
        f" rm -rf {WORK}; rm -f /etc/pve/lxc/2[1-9][0-9].conf",
    )


def restore(bed: Bed, conf_200: str) -> None:
    """Back to the machine the other test modules expect: nothing of host.yml left."""
    bed.ssh(
        "pve",
        "sh",
        "-c",
        f"systemctl disable --now {' '.join(UNITS)} {REPORT_UNIT} ct200-test-lock.service"
        " 2>/dev/null;"
        f" systemctl reset-failed {' '.join(UNITS)} {REPORT_UNIT} 2>/dev/null;"
        " rm -f /etc/systemd/system/ct200-host-devices.service"
        " /etc/systemd/system/ct200-pcie-tune.service /usr/local/sbin/ct200-host-devices"
        " /usr/local/sbin/ct200-pcie-tune /etc/modules-load.d/ct200-nvidia.conf"
        f" /etc/sysctl.d/60-ct200.conf {TMPFILES_FILE} /etc/systemd/system/{REPORT_UNIT}"
        f" {HOST_CHAIN}"
        f" {HOST_TEXTFILE}; rm -rf /usr/local/lib/ct200-host;"
        f" rm -rf /etc/ct200 {WORK}; rm -f /etc/pve/lxc/2[1-9][0-9].conf;"
        " systemctl daemon-reload",
    )
    proc = bed.ssh(
        "pve",
        "python3",
        "-c",
        "import sys; open(sys.argv[1], 'w').write(sys.argv[2])",
        conf(200),
        conf_200,
    )
    assert proc.returncode == 0, proc.stderr


# --- host.yml --------------------------------------------------------------------------------


def test_check_mode_on_a_fresh_host_changes_nothing(host: Host) -> None:
    run = host.check_fresh
    assert run.rc == 0, run.describe()
    assert run.stats[PVE]["failures"] == 0 and run.stats[PVE]["changed"] > 0, run.describe()
    changes = diff(host.fresh, host.after_check)
    assert not changes, "--check changed pve:\n" + "\n".join(changes)
    # The diff shows the passthrough lines it would write.
    assert "+dev0: /dev/nvidia0,mode=0666" in run.output


def test_converge(host: Host) -> None:
    run = host.converge
    assert run.rc == 0, run.describe()
    assert run.stats[PVE]["failures"] == 0 and run.stats[PVE]["changed"] > 0, run.describe()
    added = diff(host.fresh, host.converged)
    for path in (
        "+ /etc/systemd/system/ct200-host-devices.service",
        "+ /etc/systemd/system/ct200-pcie-tune.service",
        "+ /etc/systemd/system/multi-user.target.wants/ct200-host-devices.service",
        "+ /etc/systemd/system/multi-user.target.wants/ct200-pcie-tune.service",
        "+ /usr/local/sbin/ct200-host-devices",
        "+ /usr/local/sbin/ct200-pcie-tune",
        "+ /etc/modules-load.d/ct200-nvidia.conf",
        "+ /etc/sysctl.d/60-ct200.conf",
        f"+ /etc/systemd/system/{REPORT_UNIT}",
        f"+ /etc/systemd/system/multi-user.target.wants/{REPORT_UNIT}",
        f"+ {HOST_CHAIN}",
        "+ /usr/local/lib/ct200-host/ct200_tools/host/chain.py",
        "~ /etc/pve/lxc/200.conf",
    ):
        assert path in added, "\n".join(added)


def test_second_run_and_check_mode_change_nothing(host: Host) -> None:
    for run in (host.second, host.check_after):
        assert run.rc == 0, run.describe()
        assert run.stats[PVE]["changed"] == 0, "not idempotent:\n" + run.describe()


def test_container_restarted_once_and_only_on_change(host: Host) -> None:
    reboots = [c for c in host.calls_converge if c[0] == "reboot"]
    assert reboots == [["reboot", "200"]]
    assert [c for c in host.calls_after if c[0] == "reboot"] == reboots
    # ... after asking whether it runs; and the waits were for the `ct` machine over SSH.
    at = host.calls_converge.index(["reboot", "200"])
    assert ["status", "200"] in host.calls_converge[:at]
    waited = [r for r in host.converge.report["results"] if "Wait until the container" in r["task"]]
    assert [r["status"] for r in waited] == ["ok"], host.converge.describe()


def test_passthrough_lines_in_the_config(host: Host) -> None:
    after = text(host.bed, conf(200))
    # The boot keys among the others in PVE's alphabetical order, the devN entries at the end.
    fresh = host.conf_200.replace("ostype:", "onboot: 1\nostype:")
    fresh = fresh.replace("swap:", "startup: order=1\nswap:")
    assert after == fresh + "".join(
        f"dev{i}: {p},mode=0666\n"
        for i, p in enumerate(
            ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
        )
    )
    # Written like PVE: same mode and owner, no temp or backup file beside it.
    # (mode, uid, gid) as the stand-in made it: 0640 root:root.
    kept = host.converged["/etc/pve/lxc/200.conf"].split()[:3]
    assert kept == host.fresh["/etc/pve/lxc/200.conf"].split()[:3] == ["0o100640", "0", "0"]
    assert [p for p in host.converged if p.startswith("/etc/pve/lxc/")] == ["/etc/pve/lxc/200.conf"]


@pytest.mark.parametrize("unit", UNITS)
def test_boot_unit_enabled_ordered_and_ran(host: Host, unit: str) -> None:
    for state in (host.units[unit], host.boot[unit]):
        assert (state["ActiveState"], state["Result"], state["ExecMainStatus"]) == (
            "active",
            "success",
            "0",
        ), state
        assert state["UnitFileState"] == "enabled", state
        assert "pve-guests.service" in state["Before"].split(), state
        assert "multi-user.target" in state["WantedBy"].split(), state
    assert "ct200-host-devices.service" in host.units["ct200-pcie-tune.service"]["After"].split()


def test_boot_units_verify_clean(host: Host) -> None:
    assert not host.verify, "\n".join(map(str, host.verify))


def test_no_gpu_is_said_and_not_a_failure(host: Host) -> None:
    for journal in (host.journal, host.boot_journal):
        assert "ct200-host-devices: no NVIDIA GPU on the PCI bus" in journal, journal
        assert "ct200-pcie-tune: no NVIDIA GPU on the PCI bus" in journal, journal
    assert "/dev/nvidia0 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools" in host.journal
    assert host.bed.ssh("pve", "systemctl", "is-system-running").stdout.strip() == "running"


def test_modules_and_sysctl_files(host: Host) -> None:
    lines = [ln for ln in host.modules_load.splitlines() if ln and not ln.startswith("#")]
    assert lines == ["nvidia", "nvidia_uvm"]
    assert "kernel.numa_balancing = 0" in host.sysctl.splitlines()
    value = host.bed.ssh("pve", "sysctl", "--values", "kernel.numa_balancing").stdout.strip()
    assert value in ("0", ""), value


@pytest.fixture(scope="module")
def bench(host: Host) -> subprocess.CompletedProcess[str]:
    """The benchmark's one-line command at its smallest size, on this converged host."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.host.bench",
            "--inventory",
            str(host.bed.inventory),
            "--reps",
            "1",
            "--module-reps",
            "3",
            "--json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )


def test_benchmark_smoke(bench: subprocess.CompletedProcess[str]) -> None:
    assert bench.returncode == 0, bench.stdout + bench.stderr
    figures = json.loads(bench.stdout)
    assert figures["module"]["devices"] == 11 and figures["module"]["lines"] == 40
    assert figures["host_rerun_changed"] == 0
    assert figures["floor_tasks"] == figures["host_rerun_tasks"] > 0
    assert figures["ratio_host_rerun_to_floor"] > 0


# --- the module, on configs of the corpus ------------------------------------------------------


@dataclass
class Module:
    bed: Bed
    start: dict[str, str]
    check: ModuleRun
    after_check: dict[str, str]
    converge: ModuleRun
    converged: dict[str, str]
    texts: dict[int, str]
    second: ModuleRun
    check_again: ModuleRun
    after_again: dict[str, str]
    bad: ModuleRun
    after_bad: dict[str, str]
    moved: ModuleRun
    moved_again: ModuleRun
    after_moved: dict[str, str]
    locked_out: ModuleRun
    after_locked_out: dict[str, str]
    waited: ModuleRun


@pytest.fixture(scope="module")
def mod(host: Host) -> Iterator[Module]:
    bed = host.bed
    sh(bed, f"mkdir -p {WORK}")
    proc_238 = (FIXTURES / "raw/h200/proc_devices.txt").read_text()
    files = {
        PROC_238: proc_238,
        PROC_511: proc_238.replace("238 nvidia-uvm", "511 nvidia-uvm"),
        PROC_NO_UVM: proc_238.replace("238 nvidia-uvm\n", ""),
        **{conf(v): (FIXTURES / "pve" / name).read_text() for v, name in START.items()},
    }
    for path, content in files.items():
        proc = bed.ssh(
            "pve",
            "python3",
            "-c",
            WRITE_640,
            path,
            content,
        )
        assert proc.returncode == 0, proc.stderr
    start = confs(bed)
    check = module(bed, "check", GOOD, "--check", "--diff")
    after_check = confs(bed)
    converge = module(bed, "converge", GOOD)
    converged = confs(bed)
    texts = {v: text(bed, conf(v)) for v in (210, 211, 212, 213)}
    second = module(bed, "second", GOOD)
    check_again = module(bed, "check-again", GOOD, "--check", "--diff")
    after_again = confs(bed)
    bad = module(bed, "bad", BAD)
    after_bad = confs(bed)
    raw = [c for c in GOOD if c["passthrough"] == "raw-lxc"]
    moved = module(bed, "moved", [{**c, "proc": PROC_511} for c in raw])
    moved_again = module(bed, "moved-again", [{**c, "proc": PROC_511} for c in raw])
    after_moved = confs(bed)
    # A `pct set` holds the lock and does not let go: the module gives up, changing nothing.
    switch = [case("devn while locked", 217, "devn", lock_timeout=2)]
    hold_lock(bed, 217, 600)
    locked_out = module(bed, "locked-out", switch)
    after_locked_out = confs(bed)
    sh(bed, "systemctl stop ct200-test-lock.service")
    # One that lets go after a few seconds: the module waits for it and then writes.
    hold_lock(bed, 217, 4)
    waited = module(bed, "waited", [{**switch[0], "lock_timeout": 120}])
    yield Module(
        bed,
        start,
        check,
        after_check,
        converge,
        converged,
        texts,
        second,
        check_again,
        after_again,
        bad,
        after_bad,
        moved,
        moved_again,
        after_moved,
        locked_out,
        after_locked_out,
        waited,
    )


def test_module_found_from_outside_the_repository(mod: Module) -> None:
    assert mod.converge.run.rc == 0, mod.converge.run.describe()
    assert not str(mod.converge.run.argv[3]).startswith(str(REPO))


def test_module_check_mode_writes_nothing_and_shows_the_diff(mod: Module) -> None:
    assert mod.after_check == mod.start
    for name, r in mod.check.results.items():
        assert r.get("changed") is True and not r.get("failed"), (name, r)
        assert r["diff"]["before"] != r["diff"]["after"], name
    assert "+lxc.cgroup2.devices.allow: c 238:* rwm" in mod.check.run.output


def test_module_converges_in_both_modes(mod: Module) -> None:
    for name, r in mod.converge.results.items():
        assert r.get("changed") is True and not r.get("failed"), (name, r)
    for name in mod.converge.results:
        assert name in mod.check.results
    # Each changed file was replaced (new inode), keeping its mode; nothing else appeared.
    assert set(mod.converged) == set(mod.start)
    for v in (210, 211, 212, 213):
        before, after = mod.start[f"{v}.conf"].split(), mod.converged[f"{v}.conf"].split()
        assert after[0] != before[0] and after[1] == before[1] == "640", (v, before, after)
        assert mod.check.results[GOOD[v - 210]["name"]]["diff"]["after"] == mod.texts[v]
    devn = mod.texts[210].split("\n[before-driver-595]")[0].splitlines()
    assert [ln for ln in devn if ln.startswith("dev")] == [
        f"dev{i}: {p},mode=0666" for i, p in enumerate(NODES)
    ]
    assert not any("nvidia" in ln for ln in devn if ln.startswith("lxc."))


def test_module_stale_uvm_major_replaced_in_place(mod: Module) -> None:
    original = (FIXTURES / "pve/incident-raw.conf").read_text()
    after = mod.texts[211]
    r = mod.converge.results[GOOD[1]["name"]]
    assert r["removed"] == ["lxc.cgroup2.devices.allow: c 509:* rwm"], r
    assert r["added"] == ["lxc.cgroup2.devices.allow: c 238:* rwm"], r
    assert after == original.replace(
        "lxc.cgroup2.devices.allow: c 509:* rwm\nlxc.cgroup2.devices.allow: c 226",
        "lxc.cgroup2.devices.allow: c 238:* rwm\nlxc.cgroup2.devices.allow: c 226",
        1,
    )
    assert r["majors"]["nvidia-uvm"] == 238


def test_module_second_run_and_check_report_no_change(mod: Module) -> None:
    for run in (mod.second, mod.check_again):
        for name, r in run.results.items():
            assert r.get("changed") is False and not r.get("failed"), (name, r)
    assert mod.after_again == mod.converged


def test_module_follows_the_uvm_major_after_a_driver_update(mod: Module) -> None:
    for name, r in mod.moved.results.items():
        assert r.get("changed") is True, (name, r)
        assert r["removed"] == ["lxc.cgroup2.devices.allow: c 238:* rwm"], (name, r)
        assert r["added"] == ["lxc.cgroup2.devices.allow: c 511:* rwm"], (name, r)
    for name, r in mod.moved_again.results.items():
        assert r.get("changed") is False, (name, r)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("unknown vmid", r"container 299 does not exist on this host: /etc/pve/lxc/299.conf"),
        ("no nvidia-uvm in /proc/devices", r"load the module first.*host_devices"),
        ("unknown device path", r"/dev/dri/card0 to an NVIDIA driver"),
        ("a line PVE does not understand", r"line 5: 'lxc.cgroup2.devices.allow c 195:\* rwm'"),
        ("locked by a backup", r"'lock: backup'.*changed nothing"),
    ],
)
def test_module_bad_input_refused_with_nothing_written(
    mod: Module, name: str, message: str
) -> None:
    r = mod.bad.results[name]
    assert r.get("failed") is True and r.get("changed") is False, r
    assert re.search(message, r["msg"]), r["msg"]
    assert "Traceback" not in r["msg"]


def test_module_bad_input_leaves_every_file(mod: Module) -> None:
    assert mod.after_bad == mod.after_again


def test_module_gives_up_on_a_held_lock_cleanly(mod: Module) -> None:
    r = mod.locked_out.results["devn while locked"]
    assert r.get("failed") is True, r
    assert "another tool holds /run/lock/lxc/pve-config-217.lock" in r["msg"], r["msg"]
    assert mod.after_locked_out == mod.after_moved


def test_module_waits_for_the_lock_then_writes(mod: Module) -> None:
    r = mod.waited.results["devn while locked"]
    assert r.get("changed") is True and not r.get("failed"), r
    assert r["lines"][0] == "dev0: /dev/nvidia0,mode=0666"
