"""playbooks/site.yml on real systemd machines over SSH: syntax, check mode on fresh machines,
converge, idempotence, truthful check mode afterwards, and verification on the machines.

The sequence is the session's shared converge (``converged`` in conftest.py), which the modules
that need a converged machine build on; this module asserts it."""

from __future__ import annotations

import json
import tomllib
from typing import Any

import pytest
import yaml
from tbharness import MACHINES, REPO, Converged, diff

from testbed import units
from testbed.machine import hostname

# The session's shared converge (five site.yml runs) is set up in this module's first test: on a
# busy 2-core machine that takes longer than the default per-test limit.
pytestmark = [pytest.mark.testbed, pytest.mark.timeout(1800)]

#: machine -> its inventory name, which the recap uses.
HOST = {m: hostname(m) for m in MACHINES}


def test_syntax_check(converged: Converged) -> None:
    assert converged.syntax.rc == 0, converged.syntax.describe()


def test_check_mode_on_fresh_machines_changes_nothing(converged: Converged) -> None:
    run = converged.check_fresh
    assert run.rc == 0, run.describe()
    assert set(run.stats) >= set(HOST.values()), run.describe()
    for m in MACHINES:
        assert run.stats[HOST[m]]["failures"] == 0, run.describe()
        changes = diff(converged.fresh[m], converged.after_check[m])
        assert not changes, f"--check changed {m}:\n" + "\n".join(changes)


def test_check_mode_with_the_quickstarts_spec_on_fresh_machines(converged: Converged) -> None:
    """The README's first command converges inventory/testbed/serving.yml (no GPU): its spec
    goes through the validate play and every role's reading of the export, in check mode."""
    run = converged.check_quickstart
    assert run.rc == 0, run.describe()
    for m in MACHINES:
        assert run.stats[HOST[m]]["failures"] == 0, run.describe()


def test_converge(converged: Converged) -> None:
    run = converged.converge
    assert run.rc == 0, run.describe()
    for host in HOST.values():
        stats = run.stats[host]
        assert stats["failures"] == 0 and stats["unreachable"] == 0, run.describe()
        # A converge that changes nothing on a fresh machine has not done its job.
        assert stats["changed"] > 0, run.describe()


def test_second_run_changes_nothing(converged: Converged) -> None:
    run = converged.second
    assert run.rc == 0, run.describe()
    changed = {host: s["changed"] for host, s in run.stats.items() if s["changed"]}
    assert not changed, "not idempotent:\n" + run.describe()


def test_check_mode_after_converge_reports_no_changes(converged: Converged) -> None:
    run = converged.check_after
    assert run.rc == 0, run.describe()
    changed = {host: s["changed"] for host, s in run.stats.items() if s["changed"]}
    assert not changed, "--check is not truthful on a converged machine:\n" + run.describe()


def _site_spec() -> dict[str, Any]:
    data = yaml.safe_load((REPO / "inventory/testbed/group_vars/all.yml").read_text())
    return {"ct200_site": data["ct200_site"]}


@pytest.mark.parametrize("name", MACHINES)
def test_site_spec_installed(converged: Converged, name: str) -> None:
    bed = converged.bed
    stat = bed.ssh(name, "stat", "-c", "%a %U %G %F", "/etc/ct200", "/etc/ct200/site.yml")
    assert stat.stdout.split("\n")[:2] == ["755 root root directory", "644 root root regular file"]
    text = bed.ssh(name, "cat", "/etc/ct200/site.yml").stdout
    assert yaml.safe_load(text) == _site_spec()


@pytest.mark.parametrize("name", MACHINES)
def test_machine_healthy_sshd_active_and_listening(converged: Converged, name: str) -> None:
    bed = converged.bed
    assert bed.ssh(name, "systemctl", "is-system-running").stdout.strip() == "running"
    assert bed.ssh(name, "systemctl", "is-active", "ssh.service").stdout.strip() == "active"
    listening = bed.ssh(name, "ss", "-Hltn", "sport = :22").stdout
    assert "0.0.0.0:22" in listening, listening


def test_container_has_ct200_tools(converged: Converged) -> None:
    bed = converged.bed
    link = bed.ssh("ct", "readlink", "/usr/local/bin/ct200-doctor").stdout.strip()
    assert link == "/opt/ct200/venv/bin/ct200-doctor"
    probe = "import importlib.metadata as m, ct200_tools; print(m.version('ct200-tools'))"
    proc = bed.ssh("ct", "/opt/ct200/venv/bin/python", "-c", probe)
    assert proc.returncode == 0, proc.stderr
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert proc.stdout.strip() == version


def test_doctor_runs_in_container(converged: Converged) -> None:
    """The doctor judges the testbed container: no GPU here, so failures (2) are expected; a
    crash of the doctor itself (3) or a missing command is not."""
    proc = converged.bed.ssh("ct", "ct200-doctor", "check")
    assert proc.returncode in (0, 1, 2), proc.stdout + proc.stderr
    assert "ct200-doctor" in proc.stdout


def test_pve_standins(converged: Converged) -> None:
    bed = converged.bed
    conf = bed.ssh("pve", "stat", "-c", "%a", "/etc/pve/lxc/200.conf")
    assert conf.stdout.strip() == "640"
    assert bed.ssh("pve", "pct", "status", "200").stdout.strip() == "status: running"
    calls = [
        json.loads(line)
        for line in bed.ssh("pve", "cat", "/var/log/ct200-testbed/pct.log").stdout.splitlines()
    ]
    assert ["status", "200"] in [c["argv"] for c in calls]
    missing = bed.ssh("pve", "pct", "status", "999")
    assert missing.returncode != 0 and "does not exist" in missing.stderr


def test_rendered_units_verify_clean(converged: Converged) -> None:
    """systemd-analyze verify, failing on any stderr, on every unit file the converge added or
    changed (found by comparing the machines before and after)."""
    checked: list[str] = []
    for m in MACHINES:
        before, after = converged.fresh[m], converged.done[m]
        touched = [p for p in after if after[p] != before.get(p)]
        rendered = [u for u in units.units_of(touched) if u.startswith(units.UNIT_DIRS)]

        def run(argv: list[str], m: str = m) -> tuple[int, str, str]:
            proc = converged.bed.ssh(m, *argv)
            return proc.returncode, proc.stdout, proc.stderr

        problems = units.verify(rendered, run)
        assert not problems, "\n".join(map(str, problems))
        checked += [f"{m}:{u}" for u in rendered]
    if not checked:
        pytest.skip("the playbooks render no systemd units yet (placeholder roles)")
