"""Helpers of the testbed tests: ssh and ansible-playbook against a running testbed,
and snapshots of what a playbook may change on a machine.

A module of its own (not conftest.py) so test modules can import it by a name no other test
directory uses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed import ssh as tbssh
from testbed.config import Slot
from testbed.harness import Harness, RebootReport, UpReport

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
CALLBACKS = Path(__file__).parent / "callback_plugins"


@dataclass
class AnsibleRun:
    argv: list[str]
    rc: int
    output: str
    report: dict[str, Any] = field(default_factory=dict)

    @property
    def stats(self) -> dict[str, dict[str, int]]:
        return dict(self.report.get("stats", {}))

    def results(self, status: str) -> list[str]:
        return [
            f"{r['host']}: {r['task']}" + (f" ({r['msg']})" if r.get("msg") else "")
            for r in self.report.get("results", [])
            if r["status"] == status
        ]

    def describe(self) -> str:
        """What a failed assertion should show: failures, changes, and the output's tail."""
        lines = [f"$ {' '.join(self.argv)}", f"exit {self.rc}"]
        for status in ("failed", "unreachable", "changed"):
            lines += [f"{status}: {r}" for r in self.results(status)]
        return "\n".join([*lines, "--- output (tail) ---", self.output[-4000:]])


class Bed:
    """A running testbed: its machines, and ssh and ansible-playbook against them."""

    def __init__(self, harness: Harness, report: UpReport, workdir: Path) -> None:
        self.harness = harness
        self.slot: Slot = harness.slot
        self.report = report
        self.inventory = report.inventory
        self.addresses = {m.name: m.address for m in report.machines}
        self.workdir = workdir
        self._runs = 0

    def ssh(
        self, name: str, *command: str, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        argv = tbssh.argv(self.slot, self.addresses[name], command)
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)

    def reboot(self, *names: str) -> RebootReport:
        """Power-cycle machines (default: all) and wait until they booted; see Harness.reboot."""
        return self.harness.reboot(names)

    def push(self, name: str, src: Path, dest: str, mode: int = 0o644) -> None:
        self.harness.push(name, src, dest, mode)

    def ansible(
        self, playbook: str, *args: str, timeout: float = 540, inventory: Path | None = None
    ) -> AnsibleRun:
        """``inventory``: another inventory of these machines (e.g. one whose group_vars hold a
        site of a test's own); default the testbed's."""
        self._runs += 1
        report_file = self.workdir / f"run-{self._runs}.json"
        source = str(inventory or self.inventory)
        argv = [str(VENV_BIN / "ansible-playbook"), "-i", source, playbook, *args]
        env = {
            **os.environ,
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "ANSIBLE_CALLBACK_PLUGINS": str(CALLBACKS),
            "ANSIBLE_CALLBACKS_ENABLED": "ct200_report",
            "ANSIBLE_NOCOLOR": "1",
            "CT200_ANSIBLE_REPORT": str(report_file),
        }
        proc = subprocess.run(
            argv,
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        report = json.loads(report_file.read_text()) if report_file.exists() else {}
        return AnsibleRun(argv, proc.returncode, proc.stdout + proc.stderr, report)


#: Lists every file, directory and link under the trees a playbook may change, with mode, owner
#: and content hash. Ansible's own temp files (/root/.ansible) are left out.
SNAPSHOT = r"""
import hashlib, os, stat
TOPS = ("/etc", "/opt", "/usr/local", "/srv", "/root", "/var/lib/ct200")
for top in TOPS:
    for root, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if os.path.join(root, d) != "/root/.ansible")
        for name in sorted(dirs + files):
            path = os.path.join(root, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                what = "-> " + os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as fh:
                    what = hashlib.sha256(fh.read()).hexdigest()
            else:
                what = ""
            print(path, oct(st.st_mode), st.st_uid, st.st_gid, what)
"""


def snapshot(bed: Bed, name: str) -> dict[str, str]:
    proc = bed.ssh(name, "python3", "-c", SNAPSHOT)
    assert proc.returncode == 0, proc.stderr
    entries = {}
    for line in proc.stdout.splitlines():
        path, _, rest = line.partition(" ")
        entries[path] = rest
    return entries


def diff(before: dict[str, str], after: dict[str, str]) -> list[str]:
    out = [f"+ {p}" for p in sorted(after.keys() - before.keys())]
    out += [f"- {p}" for p in sorted(before.keys() - after.keys())]
    out += [f"~ {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]]
    return out


#: The machines of the session's testbed, and the playbook the shared converge runs on them.
MACHINES = ("pve", "ct")
SITE = "playbooks/site.yml"
PCT_LOG = "/var/log/ct200-testbed/pct.log"
CONF_200 = "/etc/pve/lxc/200.conf"


@dataclass
class Converged:
    """site.yml with the committed testbed spec, once per session, on machines no playbook has
    run on: the syntax check, --check --diff on the fresh machines, the converge, the second run
    and --check --diff again, with what the machines held before and after each. The modules
    that need a converged machine layer their difference on it (and put back what they change);
    their assertions read the runs recorded here."""

    bed: Bed
    syntax: AnsibleRun
    fresh: dict[str, dict[str, str]]
    check_fresh: AnsibleRun
    after_check: dict[str, dict[str, str]]
    converge: AnsibleRun
    converged: dict[str, dict[str, str]]
    second: AnsibleRun
    check_after: AnsibleRun
    done: dict[str, dict[str, str]]
    #: pve's container config before the converge (what a pristine pve holds).
    conf_200: str
    #: The `pct` stand-in's log (argv per call) before the converge, after it, and at the end.
    pct_before: int
    pct_converge: list[list[str]]
    pct_after: list[list[str]]
    #: site.yml --check --diff with the quickstart's spec (inventory/testbed/serving.yml: no GPU,
    #: one llama-server) on the fresh machines, after the committed spec's check.
    check_quickstart: AnsibleRun


def pct_log(bed: Bed) -> list[list[str]]:
    out = bed.ssh("pve", "cat", PCT_LOG).stdout
    return [json.loads(line)["argv"] for line in out.splitlines()]
