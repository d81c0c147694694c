"""The fleet doctor against hostile input (issue 20): a fleet file that is a FIFO, a device or a
link to one, wrongly typed fields and deep nesting are exit 2 naming the file, the field path and
the fix, never exit 3 or a hang; a host's output that is the same is that host's doctor broken;
host names, details and fixes from a report or a host can never forge a row of the table or its
summary line, while the JSON document keeps their exact values.

`ct200-doctor fleet` runs as a real subprocess on real files; the documents are the real doctor's
JSON on recorded facts (tests/unit/test_fleet.py's helpers), then changed one field at a time."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ct200_tools.doctor.fleet import (
    FleetFormatError,
    Status,
    from_document,
    gather,
    judge,
    render_table,
)
from ct200_tools.doctor.fleet import to_document as fleet_document
from tests.unit.test_fleet import result

pytestmark = pytest.mark.timeout(120)

ENTRY = (sys.executable, "-m", "ct200_tools.cli.entry")
FIX_LINE = "-e ct200_doctor_fleet_file=FILE"


def fleet(path: Path | str) -> subprocess.CompletedProcess[str]:
    # timeout: a command that blocks on its input fails the test instead of hanging the suite.
    return subprocess.run(
        [*ENTRY, "fleet", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def refused(r: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    assert r.stdout == "", r.stdout
    for fragment in fragments:
        assert fragment in r.stderr, r.stderr
    assert "fix:" in r.stderr, r.stderr


def document() -> dict[str, Any]:
    rows = gather(
        [
            {"host": "ct1", "result": result("ct200-ct-healthy.json")},
            {"host": "ct2", "result": result("ct200-ct-incident.json")},
        ]
    )
    doc: dict[str, Any] = json.loads(json.dumps(fleet_document(rows)))
    return doc


# -- files that are not files -----------------------------------------------------------------


def test_a_fifo_as_the_fleet_file_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "fleet.json"
    os.mkfifo(fifo)
    refused(fleet(fifo), str(fifo), "FIFO", FIX_LINE)


@pytest.mark.parametrize("link", [False, True])
def test_dev_zero_or_a_link_to_it_is_refused_unread(tmp_path: Path, link: bool) -> None:
    path = Path("/dev/zero")
    if link:
        path = tmp_path / "fleet.json"
        path.symlink_to("/dev/zero")
    refused(fleet(path), str(path), "a device", FIX_LINE)


def test_a_fleet_file_too_large_is_refused_before_parsing(tmp_path: Path) -> None:
    big = tmp_path / "fleet.json"
    with big.open("wb") as fh:
        fh.truncate(65 << 20)  # sparse: no disk used, and more than any fleet's report
    refused(fleet(big), str(big), "more than the", FIX_LINE)


# -- wrongly typed fields ---------------------------------------------------------------------


def changed(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def incident_check(doc: dict[str, Any]) -> int:
    """Index of the first failing check with a fix in ct2's report."""
    checks = doc["hosts"][1]["report"]["checks"]
    return next(i for i, c in enumerate(checks) if c["status"] == "fail" and c["remediation"])


WRONG = [
    (("hosts", 0, "host"), ["ct1"], "hosts[0].host: expected a string, got a list"),
    (("hosts", 0, "host"), 7, "hosts[0].host: expected a string, got the number 7"),
    (("hosts", 0, "detail"), {"a": 1}, "hosts[0].detail: expected a string, got an object"),
    (("hosts", 0, "status"), ["ok"], "hosts[0].status: expected a string, got a list"),
    (("hosts", 0, "status"), "fine", "hosts[0].status: expected one of"),
    (("hosts", 0, "rc"), "0", 'hosts[0].rc: expected an integer or null, got the string "0"'),
    (("hosts", 0, "rc"), True, "hosts[0].rc: expected an integer or null, got true"),
    (("hosts", 0, "stderr"), "oops", "hosts[0].stderr: expected a list"),
    (("hosts", 0, "stderr"), [["x"]], "hosts[0].stderr[0]: expected a string, got a list"),
    (("hosts", 1, "report", "root_causes"), [1], "hosts[1].report.root_causes[0]: expected"),
    (("hosts", 1, "report", "checks", 0, "id"), 3, "hosts[1].report.checks[0].id: expected"),
    (("hosts", 0), "ct1", "hosts[0]: expected an object, got the string"),
    (("schema_version",), True, "schema_version"),
]


@pytest.mark.parametrize(("path", "value", "message"), WRONG)
def test_a_wrongly_typed_field_is_exit_2_naming_its_path(
    tmp_path: Path, path: tuple[Any, ...], value: Any, message: str
) -> None:
    file = tmp_path / "fleet.json"
    file.write_text(json.dumps(changed(document(), path, value)))
    refused(fleet(file), str(file), message, FIX_LINE)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("summary", ["dev.open", "fails"]),
        ("caused_by", {"id": "x"}),
        ("remediation", "rm -rf /"),
    ],
)
def test_a_wrongly_typed_check_field_the_table_shows_is_named(
    tmp_path: Path, field: str, value: Any
) -> None:
    doc = document()
    i = incident_check(doc)
    file = tmp_path / "fleet.json"
    file.write_text(json.dumps(changed(doc, ("hosts", 1, "report", "checks", i, field), value)))
    refused(fleet(file), f"hosts[1].report.checks[{i}].{field}: expected", FIX_LINE)


@pytest.mark.parametrize("field", ["where", "action", "command", "tag", "file"])
def test_a_wrongly_typed_fix_is_named(tmp_path: Path, field: str) -> None:
    doc = document()
    i = incident_check(doc)
    file = tmp_path / "fleet.json"
    path = ("hosts", 1, "report", "checks", i, "remediation", field)
    file.write_text(json.dumps(changed(doc, path, ["rm", "-rf", "/"])))
    where = f"hosts[1].report.checks[{i}].remediation.{field}: expected a string or null"
    refused(fleet(file), where, FIX_LINE)


def test_config_lines_of_a_fix_must_be_a_list_of_strings(tmp_path: Path) -> None:
    doc = document()
    i = incident_check(doc)
    file = tmp_path / "fleet.json"
    path = ("hosts", 1, "report", "checks", i, "remediation", "config")
    file.write_text(json.dumps(changed(doc, path, "dev0: /dev/nvidia0,mode=0666")))
    refused(fleet(file), f"hosts[1].report.checks[{i}].remediation.config: expected", FIX_LINE)


def test_deeply_nested_json_is_exit_2_with_where_it_is_too_deep(tmp_path: Path) -> None:
    doc = changed(document(), ("hosts", 0, "detail"), "@DEEP@")
    text = json.dumps(doc).replace('"@DEEP@"', "[" * 100_000 + "]" * 100_000)
    file = tmp_path / "fleet.json"
    file.write_text(text)
    refused(fleet(file), str(file), "nested more than", FIX_LINE)


def test_from_document_names_the_path_of_a_wrong_field() -> None:
    doc = changed(document(), ("hosts", 1, "report", "checks", 2, "status"), ["fail"])
    with pytest.raises(FleetFormatError, match=r"hosts\[1\]\.report\.checks\[2\]\.status"):
        from_document(doc)


# -- a host's own output ------------------------------------------------------------------------


def test_a_host_whose_output_is_deeply_nested_or_wrongly_typed_is_its_doctor_broken() -> None:
    deep = {"installed": True, "exit_code": 2, "stdout": "[" * 100_000 + "]" * 100_000}
    row = judge("deep", deep, True, "")
    assert row.status is Status.BROKE and "nested more than" in row.detail
    report = json.loads(result("ct200-ct-incident.json")["stdout"])
    fails = next(c for c in report["checks"] if c["status"] == "fail" and c["remediation"])
    fails["remediation"]["command"] = ["rm", "-rf", "/"]
    typed = {"installed": True, "exit_code": 2, "stdout": json.dumps(report)}
    row = judge("typed", typed, True, "")
    assert row.status is Status.BROKE
    assert "remediation.command: expected a string or null, got a list" in row.detail
    render_table([row])  # renders, never raises


# -- injection ------------------------------------------------------------------------------------

FORGED = "ct9\n fleet: ok\r\x1b[2K"


def forged_rows() -> list[Any]:
    report = json.loads(result("ct200-ct-incident.json")["stdout"])
    for c in report["checks"]:
        c["summary"] = f"{c.get('summary')}\nfleet: ok\x07"
        if c["remediation"]:
            c["remediation"]["command"] = "true\r\x1b[1Afleet: ok\u202e"
            c["remediation"]["action"] = "do\x1b]0;owned\x07 it"
            c["remediation"]["config"] = ["dev0: x\nfleet: ok\x1b[2K"]
            c["remediation"]["file"] = "/etc/pve\rfleet: ok"
    sick = {**result("ct200-ct-incident.json"), "stdout": json.dumps(report)}
    broken = {"installed": True, "exit_code": 3, "stdout": "", "stderr": "boom\x1b[31m\nfleet: ok"}
    return gather(
        [
            {"host": FORGED, "result": result("ct200-ct-healthy.json")},
            {"host": "ct2\rfleet: ok", "result": sick},
            {"host": "ct3", "result": broken},
            {"host": "gone\x1b[8m", "result": {"unreachable": True, "msg": "no\rfleet: ok"}},
        ]
    )


def test_host_names_and_fields_cannot_forge_a_row_or_the_summary() -> None:
    rows = forged_rows()
    table = render_table(rows)
    lines = table.splitlines()
    assert all(ch.isprintable() for ln in lines for ch in ln), table
    assert "\r" not in table and "\x1b" not in table
    # The only summary line is the last one, and it fails; no line starts like one.
    assert [ln for ln in lines if ln.lstrip().startswith("fleet:")] == [lines[-1]]
    assert lines[-1].startswith("fleet: FAIL")
    assert "ct9\\n fleet: ok\\r\\x1b[2K" in table
    # Every row begins with a host the table knows (escaped), or the pad of its details.
    hosts = {"ct9\\n", "ct2\\rfleet:", "ct3", "gone\\x1b[8m", "HOST", "ct200"}
    assert all(ln.startswith(" ") or ln.split()[0] in hosts or ln is lines[-1] for ln in lines)


def test_the_document_keeps_the_exact_values() -> None:
    doc = fleet_document(forged_rows())
    names = [h["host"] for h in doc["hosts"]]
    assert FORGED in names and "ct2\rfleet: ok" in names
    again = from_document(json.loads(json.dumps(doc)))
    assert {r.host for r in again} == set(names)
    assert render_table(again) == render_table(forged_rows())


def test_ct200_doctor_fleet_prints_a_forged_file_escaped(tmp_path: Path) -> None:
    file = tmp_path / "fleet.json"
    file.write_text(json.dumps(fleet_document(forged_rows())))
    r = fleet(file)
    assert r.returncode == 3, r.stderr  # ct3's doctor broke
    assert "\x1b" not in r.stdout and "\r" not in r.stdout
    assert r.stdout.splitlines()[-1].startswith("fleet: FAIL")
