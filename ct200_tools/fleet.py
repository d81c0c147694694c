"""The fleet doctor's judgement and table: what every host's `ct200-doctor check --json` said,
as one table of root causes and their fixes (playbooks/doctor.yml gathers, this renders).

A host's record is what the ct200_doctor_run module returned there (or Ansible's unreachable
result); nothing here touches a machine. Exit 2 with a valid report is a result (the host
fails); exit 3, a timeout or output that is not the doctor's JSON is the doctor broken there.
Consequences (checks whose `caused_by` names another) are counted under their root, never
offered as fixes of their own, as in the doctor's own text view.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ct200_tools.checks import SelectionError, select
from ct200_tools.checks.base import STATUSES, plural
from ct200_tools.exitcodes import Exit
from ct200_tools.report import REPORT_SCHEMA_VERSION

#: Version of the gathered fleet document (the file doctor.yml writes).
FLEET_SCHEMA_VERSION = 1
#: Lines of a broken doctor's stderr kept in the table and the document.
STDERR_LINES = 5


class Status(StrEnum):
    """A host's row, worst first: the table lists rows in this order."""

    BROKE = "broke"
    UNREACHABLE = "unreachable"
    MISSING = "missing"
    FAIL = "fail"
    WARN = "warn"
    OK = "ok"
    #: Not installed where the site does not install it (e.g. a PVE host): said, not failed.
    NO_DOCTOR = "no doctor"


#: What makes the fleet fail, and how: a broken doctor is exit 3 as for one host.
FAILING = {Status.BROKE, Status.UNREACHABLE, Status.MISSING, Status.FAIL}


class FleetFormatError(ValueError):
    """A fleet document that is not one doctor.yml wrote."""


@dataclass(frozen=True)
class Root:
    """A root-cause failure on a host, with its fix and how many checks it took down."""

    id: str
    summary: str
    where: str | None = None
    action: str | None = None
    command: str | None = None
    tag: str | None = None
    consequences: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostResult:
    host: str
    status: Status
    #: One line: counts for a report, else what went wrong (and for a missing doctor, the fix).
    detail: str
    rc: int | None = None
    report: Mapping[str, Any] | None = None
    stderr: tuple[str, ...] = ()
    roots: tuple[Root, ...] = field(default=())
    warnings: tuple[str, ...] = ()


def only_ids(value: object) -> list[str]:
    """ct200_doctor_only ("mem,models" or a list) as --only values, checked against the
    registry before any host is asked: a typo is one message, not a broken row per host."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise SelectionError(
            f"ct200_doctor_only: {value!r} is not a list of check ids; give ids or prefixes "
            "separated by commas, e.g. -e ct200_doctor_only=mem,models"
        )
    ids = [i.strip() for i in items if i.strip()]
    if ids:
        try:
            select(ids)
        except SelectionError as exc:
            raise SelectionError(f"ct200_doctor_only: {exc}") from None
    return ids


def _report_problem(doc: object) -> str | None:
    """Why a parsed stdout is not a doctor report this code reads, or None."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    if doc.get("schema_version") != REPORT_SCHEMA_VERSION:
        return f"schema_version {doc.get('schema_version')!r}, expected {REPORT_SCHEMA_VERSION}"
    checks = doc.get("checks")
    if not isinstance(checks, list) or not all(
        isinstance(c, dict) and isinstance(c.get("id"), str) and c.get("status") in STATUSES
        for c in checks
    ):
        return "its checks are not a list of {id, status}"
    roots = doc.get("root_causes")
    if not isinstance(roots, list) or not all(isinstance(r, str) for r in roots):
        return "root_causes is not a list of check ids"
    return None


def roots_of(report: Mapping[str, Any]) -> tuple[Root, ...]:
    """The report's root causes with their fixes; every consequence counted under its root."""
    checks = {c["id"]: c for c in report["checks"]}
    under: dict[str, list[str]] = {}
    for c in report["checks"]:
        cause = c.get("caused_by")
        if cause and cause != c["id"] and c["status"] in ("fail", "warn", "skip"):
            under.setdefault(cause, []).append(c["id"])
    out = []
    for rid in report["root_causes"]:
        c = checks.get(rid)
        if c is None:
            summary = f"fails (not selected): see `ct200-doctor check --only {rid}` there"
            out.append(Root(rid, summary, consequences=tuple(under.get(rid, ()))))
            continue
        fix = c.get("remediation") if isinstance(c.get("remediation"), dict) else {}
        out.append(
            Root(
                rid,
                str(c.get("summary", "")),
                fix.get("where"),
                fix.get("action"),
                fix.get("command"),
                fix.get("tag"),
                tuple(under.get(rid, ())),
            )
        )
    return tuple(out)


def _counts(report: Mapping[str, Any]) -> str:
    n = Counter(c["status"] for c in report["checks"])
    words = {"pass": "passed", "fail": "failed", "warn": "warnings", "skip": "skipped"}
    return ", ".join(f"{n[s]} {w}" for s, w in words.items() if n[s]) or "no checks"


def _tail(text: object) -> tuple[str, ...]:
    lines = [ln for ln in str(text or "").splitlines() if ln.strip()]
    return tuple(lines[-STDERR_LINES:])


def judge(host: str, result: Mapping[str, Any] | None, expected: bool, fix: str) -> HostResult:
    """One host's row from its module result. ``expected``: the site installs the doctor there;
    ``fix``: the command that installs it (shown when it is missing)."""
    if result is None:
        return HostResult(host, Status.UNREACHABLE, "no result: the play did not reach it")
    if result.get("unreachable"):
        msg = " ".join(str(result.get("msg", "")).split()).removeprefix("Task failed: ")
        return HostResult(host, Status.UNREACHABLE, msg or "unreachable")
    if "installed" not in result:
        # The module itself did not run (no Python there, a module failure).
        msg = " ".join(str(result.get("msg", "")).split())[:300]
        return HostResult(host, Status.BROKE, f"the doctor could not be run: {msg or 'no reason'}")
    if not result["installed"]:
        if expected:
            return HostResult(host, Status.MISSING, f"ct200-doctor is not installed; fix: {fix}")
        return HostResult(
            host, Status.NO_DOCTOR, "ct200-doctor is not installed (the site does not put it here)"
        )
    rc, stderr = result.get("exit_code"), _tail(result.get("stderr"))
    if result.get("timed_out"):
        took = f"the doctor timed out after {result.get('duration_s')} s"
        return HostResult(host, Status.BROKE, took, rc, None, stderr)
    try:
        report: object = json.loads(str(result.get("stdout") or ""))
    except json.JSONDecodeError as exc:
        why = f"its output is not JSON ({exc.msg})"
        return HostResult(host, Status.BROKE, f"exit {rc}: {why}", rc, None, stderr)
    problem = _report_problem(report)
    if problem is not None or not isinstance(report, dict):
        why = f"its output is not the doctor's report ({problem})"
        return HostResult(host, Status.BROKE, f"exit {rc}: {why}", rc, None, stderr)
    return _from_report(host, rc, report, stderr)


def _from_report(
    host: str, rc: int | None, report: Mapping[str, Any], stderr: tuple[str, ...] = ()
) -> HostResult:
    counts = _counts(report)
    if rc == Exit.DOCTOR_BROKE:
        broken = [c["id"] for c in report["checks"] if c["status"] == "error"]
        what = f"broke in {', '.join(broken)}" if broken else "exit 3"
        return HostResult(host, Status.BROKE, f"the doctor {what}: please report it", rc, report)
    if rc not in (Exit.OK, Exit.WARNINGS, Exit.FAILURES):
        return HostResult(host, Status.BROKE, f"the doctor exited {rc}", rc, report, stderr)
    warnings = tuple(
        f"{c['id']}: {c.get('summary', '')}"
        for c in report["checks"]
        if c["status"] == "warn" and not c.get("caused_by")
    )
    if rc == Exit.FAILURES:
        roots = roots_of(report)
        detail = counts if roots else f"nothing was checked ({counts})"
        return HostResult(host, Status.FAIL, detail, rc, report, (), roots, warnings)
    status = Status.WARN if warnings else Status.OK
    return HostResult(host, status, counts, rc, report, (), (), warnings)


def gather(
    records: Iterable[Mapping[str, Any]], fix: str = "install ct200-tools there"
) -> list[HostResult]:
    """Rows from records {host, expected, result}; ``fix`` may hold {host} for each host."""
    return [
        judge(
            str(r["host"]),
            r.get("result"),
            bool(r.get("expected", True)),
            fix.replace("{host}", str(r["host"])),
        )
        for r in records
    ]


def exit_code(results: Sequence[HostResult]) -> Exit:
    statuses = {r.status for r in results}
    if Status.BROKE in statuses:
        return Exit.DOCTOR_BROKE
    if statuses & FAILING or not results:
        return Exit.FAILURES
    return Exit.OK


def _order(r: HostResult) -> tuple[int, str]:
    return list(Status).index(r.status), r.host


def render_table(results: Sequence[HostResult]) -> str:
    """The fleet table: worst rows first; for a failing host its root causes and their fixes."""
    rows = sorted(results, key=_order)
    width = max([len("HOST"), *(len(r.host) for r in rows)])
    swidth = max(len(s.value) for s in Status)
    n = Counter(r.status for r in rows)
    lines = [
        f"ct200 fleet doctor: {plural(len(rows), 'host')}: "
        + ", ".join(f"{n[s]} {s.value}" for s in Status if n[s]),
        f"{'HOST':<{width}}  {'STATUS':<{swidth}}  ROOT CAUSES AND FIXES",
    ]
    pad = " " * (width + swidth + 4)
    for r in rows:
        lines.append(f"{r.host:<{width}}  {r.status.value.upper():<{swidth}}  {r.detail}")
        for root in r.roots:
            more = f" (+{plural(len(root.consequences), 'consequence')})"
            lines.append(f"{pad}{root.id}: {root.summary}{more if root.consequences else ''}")
            if root.action:
                lines.append(f"{pad}  fix on {root.where}: {root.action}")
            lines.extend(f"{pad}    $ {c}" for c in (root.command or "").splitlines())
            if root.tag:
                lines.append(f"{pad}    (playbook tag: {root.tag})")
        lines.extend(f"{pad}warning {w}" for w in r.warnings)
        lines.extend(f"{pad}stderr: {e}" for e in r.stderr)
    bad = [r.host for r in rows if r.status in FAILING]
    lines.append(
        f"fleet: FAIL ({plural(len(bad), 'host')}: {', '.join(bad)})"
        if bad
        else "fleet: ok"
        if rows
        else "fleet: FAIL (no host was checked)"
    )
    return "\n".join(lines) + "\n"


def to_document(results: Sequence[HostResult]) -> dict[str, Any]:
    """The gathered JSON: each host's status and the doctor's full report."""
    n = Counter(r.status for r in results)
    return {
        "schema_version": FLEET_SCHEMA_VERSION,
        "exit_code": int(exit_code(results)),
        "summary": {s.value: n[s] for s in Status},
        "hosts": [
            {
                "host": r.host,
                "status": r.status.value,
                "detail": r.detail,
                "rc": r.rc,
                "stderr": list(r.stderr),
                "report": r.report,
            }
            for r in results
        ],
    }


def from_document(doc: object) -> list[HostResult]:
    """Rows again from a document to_document wrote (`ct200-doctor fleet FILE`)."""
    if not isinstance(doc, dict) or doc.get("schema_version") != FLEET_SCHEMA_VERSION:
        raise FleetFormatError(f"not a fleet document (schema_version {FLEET_SCHEMA_VERSION})")
    hosts = doc.get("hosts")
    if not isinstance(hosts, list):
        raise FleetFormatError("hosts: not a list")
    out = []
    for i, h in enumerate(hosts):
        try:
            status = Status(h["status"])
            host, detail, rc, report = str(h["host"]), str(h["detail"]), h.get("rc"), h["report"]
        except (KeyError, TypeError, ValueError) as exc:
            raise FleetFormatError(f"hosts[{i}]: {exc!r} is missing or wrong") from None
        if report is not None and (_report_problem(report) is not None):
            raise FleetFormatError(f"hosts[{i}].report: {_report_problem(report)}")
        stderr = _tail("\n".join(h.get("stderr") or ()))
        if report is not None and status in (Status.FAIL, Status.WARN, Status.OK):
            out.append(_from_report(host, rc, report, stderr))
        else:
            out.append(HostResult(host, status, detail, rc, report, stderr))
    return out
