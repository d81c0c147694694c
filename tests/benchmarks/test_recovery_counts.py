"""benchmarks/recovery's task counting for its two no-op floors, on a recorded report of the
shape tests/testbed/callback_plugins/ct200_report writes (the counting is pure: no testbed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks.recovery.bench import noop_playbook, task_counts


def result(host: str, action: str, status: str, items: int = 1) -> dict[str, Any]:
    return {"task": f"{action} task", "host": host, "status": status, "items": items,
            "action": action}  # fmt: skip


REPORT = {
    "results": [
        result("localhost", "ansible.builtin.assert", "ok"),
        result("localhost", "ansible.builtin.command", "ok"),
        result("pve", "ansible.builtin.set_fact", "ok"),
        result("pve", "ansible.builtin.command", "ok"),
        # A loop over nothing: skipped, no item, still one task of the play.
        result("pve", "ansible.builtin.command", "skipped", items=0),
        result("pve", "ct200_pve_lxc_gpu", "ok"),
        # A role's argument check runs on the controller alone.
        result("pve", "ansible.builtin.validate_argument_spec", "ok"),
        result("pve", "ansible.builtin.include_role", "ok"),
        result("ct", "ansible.builtin.command", "ok"),
        # A loop of two items whose condition skipped both.
        result("ct", "ansible.builtin.command", "skipped", items=2),
        # A loop of three items that ran.
        result("ct", "ansible.builtin.command", "ok", items=3),
        result("ct", "ansible.builtin.debug", "ok"),
        result("ct", "ansible.builtin.assert", "skipped"),
        result("ct", "meta", "skipped"),
    ]
}


def test_the_issue_floor_counts_every_task_gone_through() -> None:
    assert task_counts(REPORT, "issue") == {
        "localhost": {"controller": 1, "remote": 1},
        "pve": {"controller": 2, "remote": 3},
        "ct": {"remote": 6, "controller": 2},
    }


def test_the_strict_floor_counts_the_executed_tasks_alone() -> None:
    assert task_counts(REPORT, "strict") == {
        "localhost": {"controller": 1, "remote": 1},
        "pve": {"controller": 2, "remote": 2},
        "ct": {"remote": 4, "controller": 1},
    }


def test_an_unknown_floor_is_refused() -> None:
    with pytest.raises(ValueError, match="issue"):
        task_counts(REPORT, "loose")


def test_the_noop_play_mirrors_the_counts(tmp_path: Path) -> None:
    path = tmp_path / "noop.yml"
    noop_playbook(task_counts(REPORT, "issue"), path)
    plays = {p["hosts"]: p for p in yaml.safe_load(path.read_text())}
    assert plays["localhost"]["connection"] == "local"
    ct = [next(k for k in t if k != "name") for t in plays["ct"]["tasks"]]
    assert ct.count("ansible.builtin.command") == 6 and ct.count("ansible.builtin.set_fact") == 2
