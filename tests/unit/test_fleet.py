"""The fleet doctor's judgement and table (ct200_tools/doctor/fleet.py), its filter and module as
playbooks/doctor.yml uses them, and `ct200-doctor fleet`. The reports judged are the real
doctor's JSON on recorded facts; the module results are the shapes the module and Ansible give
(an unreachable host's is Ansible's own, from a real run of doctor.yml at the end)."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ct200_tools.doctor.checks.base import Finding
from ct200_tools.doctor.fleet import (
    FleetFormatError,
    Status,
    exit_code,
    from_document,
    gather,
    judge,
    render_table,
    roots_of,
    to_document,
)
from ct200_tools.doctor.report import Header, render_json
from ct200_tools.exitcodes import Exit
from ct200_tools.facts import read_file

ROOT = Path(__file__).parents[2]
FIX = ROOT / "tests" / "fixtures" / "facts"
CT200 = str(ROOT / "inventory" / "ct200")
VENV_BIN = Path(sys.executable).parent
DOCTOR = (sys.executable, "-m", "ct200_tools.cli.entry")
FIXFMT = "install it: ansible-playbook ... --limit {host}"


@functools.cache
def doctor(facts: str, *extra: str) -> tuple[int, str]:
    """The real doctor's exit code and JSON on a recorded snapshot."""
    r = subprocess.run(
        [*DOCTOR, "check", "--json", "--facts", str(FIX / facts), "--spec", CT200, *extra],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=ROOT,
    )
    assert r.returncode in (0, 1, 2), r.stderr
    return r.returncode, r.stdout


def result(facts: str, *extra: str) -> dict[str, Any]:
    """What ct200_doctor_run returns for the doctor on these facts."""
    rc, out = doctor(facts, *extra)
    where = "/usr/local/bin/ct200-doctor"
    return {"installed": True, "doctor": where, "exit_code": rc, "stdout": out, "stderr": ""}


def test_a_healthy_host_is_ok_with_its_counts() -> None:
    row = judge("ct1", result("ct200-ct-healthy.json"), True, "")
    assert row.status is Status.OK and row.rc == 0 and not row.roots
    # The counts are the report's own, so a check added to the registry changes no figure here.
    checks = json.loads(doctor("ct200-ct-healthy.json")[1])["checks"]
    statuses = [c["status"] for c in checks]
    assert set(statuses) == {"pass", "skip"}
    passed, skipped = statuses.count("pass"), statuses.count("skip")
    assert row.detail == f"{passed} passed, {skipped} skipped"
    # The host checks (host.*, lxc.*) skip too when no --host was read (host.iommu reads the
    # container's /proc/cmdline, which is the host's).
    host_side = [
        c for c in checks if c["id"].startswith(("host.", "lxc.")) and c["id"] != "host.iommu"
    ]
    assert host_side and all(c["status"] == "skip" for c in host_side)
    assert passed > 0
    assert exit_code([row]) == Exit.OK


def test_a_failing_host_lists_its_root_causes_only_with_fixes_and_counts_consequences() -> None:
    row = judge("ct2", result("ct200-ct-incident.json"), True, "")
    assert row.status is Status.FAIL and row.rc == 2
    report = json.loads(doctor("ct200-ct-incident.json")[1])
    # gpu.cuda_init fails too, but because of dev.open: a consequence, not a root.
    assert {c["id"] for c in report["checks"] if c["status"] == "fail"} == {
        "dev.open",
        "gpu.cuda_init",
        "models.staged",
    }
    assert [r.id for r in row.roots] == ["dev.open", "models.staged"]
    dev_open, staged = row.roots
    assert dev_open.consequences == ("gpu.cuda_init",) and staged.consequences == ()
    assert (dev_open.where, dev_open.tag) == ("host", "lxc_passthrough")
    assert staged.command == "ct200-stage stage qwen3.6-27b --spec /etc/ct200/site.yml --replace"
    table = render_table([row])
    assert "dev.open: 2 device nodes cannot be opened (+1 consequence)" in table
    assert "$ ct200-stage stage qwen3.6-27b --spec /etc/ct200/site.yml --replace" in table
    assert "(playbook tag: staging)" in table
    # The consequence is counted, never shown with a fix of its own.
    assert "gpu.cuda_init" not in table
    assert table.count("fix on host:") == 1
    assert table.rstrip().endswith("fleet: FAIL (1 host: ct2)")
    assert exit_code([row]) == Exit.FAILURES


def test_a_root_that_was_not_selected_is_named_with_how_to_see_it() -> None:
    row = judge("ct2", result("ct200-ct-incident.json", "--only", "gpu.cuda_init"), True, "")
    assert row.status is Status.FAIL
    (root,) = row.roots
    assert root.id == "dev.open" and root.consequences == ("gpu.cuda_init",)
    assert "not selected" in root.summary and "--only dev.open" in root.summary


def test_exit_2_without_a_report_or_with_another_output_is_the_doctor_broken() -> None:
    refused = {"installed": True, "exit_code": 2, "stdout": "", "stderr": "ct200-doctor: bad\n"}
    row = judge("a", refused, True, "")
    assert row.status is Status.BROKE and "not JSON" in row.detail
    assert row.stderr == ("ct200-doctor: bad",)
    assert "stderr: ct200-doctor: bad" in render_table([row])
    other = {**refused, "stdout": json.dumps({"schema_version": 99, "checks": []})}
    assert "schema_version 99" in judge("b", other, True, "").detail
    assert judge("c", {**refused, "stdout": "[1]"}, True, "").status is Status.BROKE
    assert exit_code([row]) == Exit.DOCTOR_BROKE


def test_exit_3_names_the_broken_check() -> None:
    facts = read_file(FIX / "ct200-ct-healthy.json")
    broken = Finding("mem.shm", "/dev/shm size", "error", "error", "check raised: KeyError")
    out = render_json([broken], Header(facts, CT200), Exit.DOCTOR_BROKE)
    row = judge("ct3", {"installed": True, "exit_code": 3, "stdout": out}, True, "")
    assert row.status is Status.BROKE
    assert row.detail == "the doctor broke in mem.shm: please report it"
    healthy = judge("ct1", result("ct200-ct-healthy.json"), True, "")
    failing = judge("ct2", result("ct200-ct-incident.json"), True, "")
    # A broken doctor outranks a failing host, as a broken check outranks a failing one.
    assert exit_code([healthy, failing, row]) == Exit.DOCTOR_BROKE


def test_timeout_and_a_module_that_did_not_run_are_broke() -> None:
    timed = {"installed": True, "exit_code": None, "timed_out": True, "duration_s": 300.0}
    assert judge("a", timed, True, "").detail == "the doctor timed out after 300.0 s"
    failed = {"failed": False, "msg": "MODULE FAILURE\n/usr/bin/python3: not found"}
    row = judge("b", failed, True, "")
    assert row.status is Status.BROKE
    assert row.detail == "the doctor could not be run: MODULE FAILURE /usr/bin/python3: not found"


def test_unreachable_and_missing_fail_the_fleet_a_doctor_absent_by_design_does_not() -> None:
    unreachable = {"unreachable": True, "msg": "Task failed: ssh: connect: No route to host"}
    rows = gather(
        [
            {"host": "gone", "expected": True, "result": unreachable},
            {"host": "never", "expected": True, "result": None},
            {"host": "ct9", "expected": True, "result": {"installed": False}},
            {"host": "pve1", "expected": False, "result": {"installed": False}},
            {"host": "ct1", "expected": True, "result": result("ct200-ct-healthy.json")},
        ],
        FIXFMT,
    )
    by = {r.host: r for r in rows}
    assert by["gone"].status is Status.UNREACHABLE
    assert by["gone"].detail == "ssh: connect: No route to host"
    assert by["never"].status is Status.UNREACHABLE
    assert by["ct9"].status is Status.MISSING
    assert by["ct9"].detail.endswith("fix: install it: ansible-playbook ... --limit ct9")
    assert by["pve1"].status is Status.NO_DOCTOR
    assert exit_code(rows) == Exit.FAILURES
    table = render_table(rows).splitlines()
    # Worst first; the healthy and the by-design rows last.
    assert [ln.split()[0] for ln in table[2:-1]] == ["gone", "never", "ct9", "ct1", "pve1"]
    assert table[0] == ("ct200 fleet doctor: 5 hosts: 2 unreachable, 1 missing, 1 ok, 1 no doctor")
    assert table[-1] == "fleet: FAIL (3 hosts: gone, never, ct9)"
    healthy = [r for r in rows if r.host in ("ct1", "pve1")]
    assert exit_code(healthy) == Exit.OK
    assert render_table(healthy).rstrip().endswith("fleet: ok")
    assert exit_code([]) == Exit.FAILURES


def test_warnings_are_shown_and_do_not_fail_the_fleet() -> None:
    # The H200 machine against the CT200 spec: failures and one warning (not a consequence).
    row = judge("h", result("h200-healthy.json"), True, "")
    assert row.status is Status.FAIL and row.warnings
    assert all(not w.startswith(r.id + ":") for w in row.warnings for r in row.roots)
    report = json.loads(doctor("h200-healthy.json")[1])
    assert [r.id for r in roots_of(report)] == report["root_causes"]


def test_the_document_round_trips_and_ct200_doctor_fleet_renders_it(tmp_path: Path) -> None:
    rows = gather(
        [
            {"host": "ct1", "result": result("ct200-ct-healthy.json")},
            {"host": "ct2", "result": result("ct200-ct-incident.json")},
            {"host": "gone", "result": {"unreachable": True, "msg": "refused"}},
        ]
    )
    doc = to_document(rows)
    assert doc["exit_code"] == 2 and doc["summary"]["fail"] == 1
    again = from_document(json.loads(json.dumps(doc)))
    assert render_table(again) == render_table(rows)
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(doc))
    r = subprocess.run(
        [sys.executable, "-m", "ct200_tools.cli.entry", "fleet", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert r.returncode == 2 and r.stdout == render_table(rows), r.stderr
    for bad, why in (
        ("{}", "not a fleet document"),
        ('{"schema_version": 1, "hosts": [{"host": "x"}]}', "hosts[0]"),
        ("nope", "Expecting value"),
    ):
        path.write_text(bad)
        r = subprocess.run(
            [sys.executable, "-m", "ct200_tools.cli.entry", "fleet", str(path)],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert r.returncode == 2 and why in r.stderr and "Traceback" not in r.stderr, r.stderr
    with pytest.raises(FleetFormatError):
        from_document({"schema_version": 1, "hosts": {}})


def test_the_filter_reads_hostvars_and_the_expected_groups() -> None:
    sys.path.insert(0, str(ROOT / "playbooks" / "filter_plugins"))
    try:
        from ct200_fleet import ct200_fleet  # noqa: PLC0415
    finally:
        sys.path.pop(0)
    missing = {"ct200_doctor_run": {"installed": False}}
    hostvars = {
        "pve1": missing,
        "ct1": {"ct200_doctor_run": result("ct200-ct-healthy.json")},
        "ct2": missing,
        "pve2": {**missing, "ct200_doctor_expected": True},
    }
    groups = {"pve": ["pve1", "pve2"], "ct": ["ct1", "ct2"]}
    out = ct200_fleet(list(hostvars), hostvars, groups, ["ct"], "fix {host}")
    assert out["exit_code"] == 2 and out["failing"] == ["ct2", "pve2"]
    statuses = {h["host"]: h["status"] for h in out["document"]["hosts"]}
    assert statuses == {"pve1": "no doctor", "ct1": "ok", "ct2": "missing", "pve2": "missing"}
    assert "fix: fix ct2" in out["table"]


def ansible_env() -> dict[str, str]:
    if not (VENV_BIN / "ansible-playbook").exists():
        pytest.skip(f"ansible-playbook is not installed in {VENV_BIN}: run `bash scripts/setup.sh`")
    return {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
    }


def test_doctor_yml_over_local_connections(tmp_path: Path) -> None:
    """The playbook itself, with inventory hosts on local connections (the testbed test runs it
    over SSH): the real doctor on recorded facts, a missing one, a broken one, an unreachable
    host; the table, the saved file (0600) and the exit status."""
    facts = {"ok1": "ct200-ct-healthy.json", "sick": "ct200-ct-incident.json"}
    ct: dict[str, Any] = {
        name: {"ct200_doctor_args": ["--facts", str(FIX / f), "--spec", CT200]}
        for name, f in facts.items()
    }
    ct["nodoc"] = {"ct200_doctor_command": str(tmp_path / "absent" / "ct200-doctor")}
    ct["junk"] = {"ct200_doctor_command": "/bin/true"}
    ct["gone"] = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1}
    inventory = {
        "all": {
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "ct200_doctor_command": str(VENV_BIN / "ct200-doctor"),
            },
            "children": {
                "ct": {"hosts": ct},
                "pve": {"hosts": {"pve1": {"ct200_doctor_command": "no-such-doctor"}}},
            },
        }
    }
    inv = tmp_path / "hosts.yml"
    inv.write_text(json.dumps(inventory))
    saved = tmp_path / "fleet.json"
    argv = [str(VENV_BIN / "ansible-playbook"), "-i", str(inv), "playbooks/doctor.yml"]
    argv += ["-e", f"ct200_doctor_fleet_file={saved}", "-e", "ct200_doctor_only=dev,mem,models"]
    r = subprocess.run(
        argv, cwd=ROOT, env=ansible_env(), capture_output=True, text=True, check=False, timeout=300
    )
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "fleet: FAIL (4 hosts: junk, gone, nodoc, sick)" in out
    assert "dev.open: 2 device nodes cannot be opened" in out
    assert "--limit nodoc" in out
    assert (saved.stat().st_mode & 0o777) == 0o600
    doc = json.loads(saved.read_text())
    statuses = {h["host"]: h["status"] for h in doc["hosts"]}
    assert statuses == {
        "ok1": "ok",
        "sick": "fail",
        "nodoc": "missing",
        "junk": "broke",
        "gone": "unreachable",
        "pve1": "no doctor",
    }
    sick = next(h for h in doc["hosts"] if h["host"] == "sick")
    # --only reached the doctor: only dev, mem and models checks ran.
    assert {c["id"].split(".")[0] for c in sick["report"]["checks"]} == {"dev", "mem", "models"}
    assert doc["exit_code"] == 3
    # The recap marks the hosts that failed and no other (issue 33: the first host took them).
    for host, failed in (("ok1", 0), ("pve1", 0), ("sick", 1), ("junk", 1), ("nodoc", 1)):
        assert re.search(rf"^{host}\s+:.* failed={failed} ", out, re.M), out
    # Only the healthy and the by-design hosts: the play passes. Run from another directory with
    # a relative fleet file in a directory: saved there, not under playbooks/ (issue 33).
    (tmp_path / "out").mkdir()
    r = subprocess.run(
        [
            *argv[:3],
            str(ROOT / "playbooks/doctor.yml"),
            *("-e", "ct200_doctor_fleet_file=out/fleet.json", "--limit", "ok1,pve1"),
        ],
        cwd=tmp_path,
        env=ansible_env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fleet: ok" in r.stdout
    relative = tmp_path / "out" / "fleet.json"
    assert {h["host"] for h in json.loads(relative.read_text())["hosts"]} == {"ok1", "pve1"}


def test_ansible_doc_finds_the_module_by_its_short_name() -> None:
    env = ansible_env()
    env.pop("ANSIBLE_CONFIG")
    r = subprocess.run(
        [str(VENV_BIN / "ansible-doc"), "-t", "module", "--json", "ct200_doctor_run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)["ct200_doctor_run"]
    assert set(doc["doc"]["options"]) == {"command", "only", "args", "timeout"}
    assert {"installed", "exit_code", "stdout", "timed_out"} <= set(doc["return"])


def test_ct200_doctor_only_is_checked_before_any_doctor_runs() -> None:
    from ct200_tools.doctor.checks import SelectionError  # noqa: PLC0415
    from ct200_tools.doctor.fleet import only_ids  # noqa: PLC0415

    assert only_ids("") == [] and only_ids(" mem , models.staged,") == ["mem", "models.staged"]
    assert only_ids(["dev", "gpu.cuda_init"]) == ["dev", "gpu.cuda_init"]
    with pytest.raises(SelectionError, match="ct200_doctor_only: unknown check 'staged'"):
        only_ids("mem,staged")
    with pytest.raises(SelectionError, match="ct200_doctor_only: 3 is not a list"):
        only_ids(3)
