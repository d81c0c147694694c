"""The ct200_pve_lxc_gpu module as Ansible finds and ships it, without a testbed: by its short
name from the repository root (ansible.cfg's module path), from a playbook outside the
repository, with its module_utils shipped to a Python that has no ct200_tools; and the tags the
doctor's remediations name in the site playbook. The module on a PVE machine: tests/testbed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
CORPUS = ROOT / "tests/fixtures/pve"
#: The doctor's remediation tags this part of the playbooks provides.
HOST_TAGS = ("host_devices", "lxc_passthrough", "host_tuning")


def ansible(tool: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    if not (VENV_BIN / tool).exists():
        pytest.skip(f"{tool} is not installed in {VENV_BIN}: run `bash scripts/setup.sh`")
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_NOCOLOR": "1",
    }
    env.pop("ANSIBLE_CONFIG", None)
    return subprocess.run(
        [str(VENV_BIN / tool), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_ansible_doc_finds_the_module_by_its_short_name() -> None:
    proc = ansible("ansible-doc", "-t", "module", "--json", "ct200_pve_lxc_gpu")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)["ct200_pve_lxc_gpu"]["doc"]
    assert set(doc["options"]) == {
        "path",
        "passthrough",
        "devices",
        "proc_devices",
        "mode",
        "lock_timeout",
        "onboot",
        "startup",
    }
    assert doc["options"]["passthrough"]["default"] == "devn"
    assert doc["options"]["mode"]["default"] == "0666"


def system_python() -> str:
    """A Python without ct200_tools, as on a PVE host: the module must carry pvecfg itself."""
    for candidate in ("/usr/bin/python3", shutil.which("python3") or ""):
        if not candidate or not os.access(candidate, os.X_OK):
            continue
        probe = subprocess.run(
            [candidate, "-I", "-c", "import ct200_tools"], capture_output=True, check=False
        )
        if probe.returncode != 0:
            return candidate
    pytest.skip("every python3 here has ct200_tools installed")


def test_module_runs_from_a_playbook_outside_the_repository(tmp_path: Path) -> None:
    conf = tmp_path / "lxc" / "200.conf"
    conf.parent.mkdir()
    shutil.copyfile(CORPUS / "incident-raw.conf", conf)
    before = conf.read_bytes()
    out = tmp_path / "result.json"
    playbook = tmp_path / "outside.yml"
    playbook.write_text(
        f"""\
- name: The module by its short name, from a playbook outside the repository
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Pass the GPUs (check mode, so no lock and no write here)
      ct200_pve_lxc_gpu:
        path: {conf}
        passthrough: raw-lxc
        devices: [/dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools]
        proc_devices: {ROOT / "tests/fixtures/raw/h200/proc_devices.txt"}
      register: result
    - name: Save the result
      ansible.builtin.copy:
        content: "{{{{ result | to_json }}}}"
        dest: {out}
        mode: "0644"
      check_mode: false
"""
    )
    proc = ansible(
        "ansible-playbook",
        "-i",
        "localhost,",
        "-e",
        f"ansible_python_interpreter={system_python()}",
        "--check",
        "--diff",
        str(playbook),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["changed"] is True
    assert result["removed"] == ["lxc.cgroup2.devices.allow: c 509:* rwm"]
    assert result["added"] == ["lxc.cgroup2.devices.allow: c 238:* rwm"]
    assert (result["majors"]["nvidia"], result["majors"]["nvidia-uvm"]) == (195, 238)
    assert "+lxc.cgroup2.devices.allow: c 238:* rwm" in proc.stdout
    assert conf.read_bytes() == before
    assert sorted(p.name for p in conf.parent.iterdir()) == ["200.conf"]


def test_module_edits_pending_and_refuses_a_symlink(tmp_path: Path) -> None:
    """A pending delete of an index the module keeps, shown in the diff and the result; a
    symlinked config refused in one message, the link and its target untouched."""
    conf = tmp_path / "lxc" / "200.conf"
    conf.parent.mkdir()
    conf.write_text(
        (CORPUS / "pending-devn.conf").read_text().replace("delete: swap", "delete: dev2,swap")
    )
    before = conf.read_bytes()
    target = tmp_path / "real.conf"
    target.write_bytes(before)
    (tmp_path / "lxc" / "201.conf").symlink_to(target)
    out = tmp_path / "result.json"
    playbook = tmp_path / "pending.yml"
    playbook.write_text(
        f"""\
- name: Pending state and a symlinked config
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: A config whose pending section deletes dev2
      ct200_pve_lxc_gpu:
        path: {conf}
        devices: [/dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm]
      register: pending
    - name: A symlinked config
      ct200_pve_lxc_gpu:
        path: {tmp_path / "lxc" / "201.conf"}
        devices: [/dev/nvidia0]
      register: linked
      ignore_errors: true
    - name: Save the results
      ansible.builtin.copy:
        content: "{{{{ {{'pending': pending, 'linked': linked}} | to_json }}}}"
        dest: {out}
        mode: "0644"
      check_mode: false
"""
    )
    proc = ansible(
        "ansible-playbook",
        "-i",
        "localhost,",
        "-e",
        f"ansible_python_interpreter={system_python()}",
        "--check",
        "--diff",
        str(playbook),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    pending = result["pending"]
    assert pending["changed"] is True and pending["added"] == pending["removed"] == []
    assert pending["pending_removed"] == ["delete: dev2,swap"]
    assert pending["pending_added"] == ["delete: swap"]
    assert "-delete: dev2,swap\n+delete: swap" in proc.stdout
    linked = result["linked"]
    assert linked["failed"] is True
    assert "201.conf is a symbolic link" in linked["msg"]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert conf.read_bytes() == before and target.read_bytes() == before
    assert (tmp_path / "lxc" / "201.conf").is_symlink()


def test_module_failure_is_one_clear_message(tmp_path: Path) -> None:
    proc = ansible(
        "ansible",
        "localhost",
        "-i",
        "localhost,",
        "-c",
        "local",
        "-e",
        f"ansible_python_interpreter={system_python()}",
        "-m",
        "ct200_pve_lxc_gpu",
        "-a",
        json.dumps({"path": str(tmp_path / "299.conf"), "devices": ["/dev/nvidia0"]}),
        "--check",
    )
    assert proc.returncode != 0
    assert "container 299 does not exist on this host" in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


def test_site_playbook_lists_the_host_tags() -> None:
    proc = ansible(
        "ansible-playbook", "-i", "inventory/ct200/hosts.yml", "playbooks/site.yml", "--list-tags"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tags = {
        tag.strip()
        for line in proc.stdout.splitlines()
        if "TASK TAGS:" in line
        for tag in line.split("[", 1)[1].rstrip("]").split(",")
    }
    assert set(HOST_TAGS) <= tags, tags


def test_host_benchmark_module_figures_at_the_smoke_size() -> None:
    """benchmarks/host's one-line command, its in-process part at the smallest size (the
    testbed part runs in tests/testbed/test_host_roles.py)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.host.bench",
            "--module-only",
            "--module-reps",
            "2",
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    module = json.loads(proc.stdout)["module"]
    assert (module["lines"], module["devices"]) == (40, 11)
    for mode in ("devn", "raw-lxc"):
        assert module[mode]["first_ms"] > 0 and module[mode]["converged_ms"] > 0
