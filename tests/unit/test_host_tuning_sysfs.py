"""roles/host_tuning's sysfs step (tasks/sysfs.yml) run for real on this machine by
ansible-playbook, on a sysfs-shaped tree in tmp_path instead of /sys: the tmpfiles.d line
written, `systemd-tmpfiles --create` setting the CPUs that differ (through the cpuN/cpufreq
links, as on a host), a second run changing nothing, check mode changing nothing, and a
machine without cpufreq (a VM) having nothing to set. The entry is the table's
(tuning.cpu_governor), moved under tmp_path."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ct200_tools.tunings import BY_KEY, export

REPO = Path(__file__).parents[2]
PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"

pytestmark = pytest.mark.skipif(
    not PLAYBOOK.exists() or shutil.which("systemd-tmpfiles") is None,
    reason="needs ansible-playbook and systemd-tmpfiles",
)


def entry(root: Path) -> dict[str, Any]:
    """tuning.cpu_governor's export with /sys/devices/system/cpu moved under root."""
    (got,) = (e for e in export({"cpu_governor": "performance"}) if e["key"] == "cpu_governor")
    real = BY_KEY["cpu_governor"].sysfs
    assert real is not None
    moved = {
        k: v.replace(real.root, str(root)) if isinstance(v, str) else v for k, v in got.items()
    }
    assert moved["line"] == f"w {root}/cpu*/cpufreq/scaling_governor - - - - performance"
    return moved


def cpus(root: Path, governors: list[str]) -> None:
    """cpuN/cpufreq -> ../cpufreq/policyN, as the kernel lays them out."""
    for n, gov in enumerate(governors):
        policy = root / "cpufreq" / f"policy{n}"
        policy.mkdir(parents=True)
        (policy / "scaling_governor").write_text(gov + "\n")
        (root / f"cpu{n}").mkdir()
        (root / f"cpu{n}" / "cpufreq").symlink_to(f"../cpufreq/policy{n}")


def governors(root: Path) -> list[str]:
    found = sorted(root.glob("cpu[0-9]*/cpufreq/scaling_governor"))
    return [p.read_text().strip() for p in found]


def play(tmp_path: Path, sysfs: list[dict[str, Any]], *extra: str) -> dict[str, int]:
    """Run tasks/sysfs.yml on localhost; its recap (ok, changed, failed, ...)."""
    plays = [
        {
            "name": "The sysfs step",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars": {
                "host_tuning_sysfs": sysfs,
                "host_tuning_tmpfiles_file": str(tmp_path / "60-ct200-tune.conf"),
            },
            "tasks": [
                {
                    "name": "Apply",
                    "ansible.builtin.import_tasks": str(REPO / "roles/host_tuning/tasks/sysfs.yml"),
                }
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(json.dumps(plays))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env |= {"ANSIBLE_NOCOLOR": "1", "ANSIBLE_RETRY_FILES_ENABLED": "0"}
    proc = subprocess.run(
        [
            str(PLAYBOOK),
            "-i",
            "localhost,",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            str(tmp_path / "play.yml"),
            *extra,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        cwd=REPO,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    recap = re.search(r"^localhost\s+:\s+(.*)$", proc.stdout, re.MULTILINE)
    assert recap, proc.stdout[-2000:]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", recap.group(1))}


def test_sets_now_and_persists_then_changes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "cpu"
    root.mkdir()
    cpus(root, ["performance", "powersave", "schedutil"])
    sysfs = [entry(root)]
    # Check mode: says it would change, changes nothing.
    assert play(tmp_path, sysfs, "--check")["changed"] > 0
    assert governors(root) == ["performance", "powersave", "schedutil"]
    assert not (tmp_path / "60-ct200-tune.conf").exists()
    # Converge: the line persisted, every CPU set now.
    assert play(tmp_path, sysfs)["changed"] == 2
    assert governors(root) == ["performance"] * 3
    conf = (tmp_path / "60-ct200-tune.conf").read_text().splitlines()
    assert sysfs[0]["line"] in conf
    assert "# tuning.cpu_governor: " + BY_KEY["cpu_governor"].why in conf
    # Idempotent; and a CPU that drifted since is set again.
    assert play(tmp_path, sysfs)["changed"] == 0
    (root / "cpufreq" / "policy1" / "scaling_governor").write_text("powersave\n")
    assert play(tmp_path, sysfs)["changed"] == 1
    assert governors(root) == ["performance"] * 3


def test_no_cpufreq_is_nothing_to_set_and_not_managed_removes_the_file(tmp_path: Path) -> None:
    root = tmp_path / "cpu"
    for n in range(2):
        (root / f"cpu{n}").mkdir(parents=True)  # a VM: CPUs without cpufreq
    sysfs = [entry(root)]
    assert play(tmp_path, sysfs)["changed"] == 1  # the tmpfiles file only
    assert play(tmp_path, sysfs)["changed"] == 0
    assert play(tmp_path, [])["changed"] == 1  # the spec manages no sysfs tuning: removed
    assert not (tmp_path / "60-ct200-tune.conf").exists()
