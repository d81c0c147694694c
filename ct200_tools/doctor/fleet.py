"""The fleet doctor's judgement and table: what every host's `ct200-doctor check --json` said,
as one table of root causes and their fixes (playbooks/doctor.yml gathers, this renders).

A host's record is what the ct200_doctor_run module returned there (or Ansible's unreachable
result); nothing here touches a machine. Exit 2 with a valid report is a result (the host
fails); exit 3, a timeout or output that is not the doctor's JSON is the doctor broken there.
Consequences (checks whose `caused_by` names another) are counted under their root, never
offered as fixes of their own, as in the doctor's own text view.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ct200_tools.doctor.checks import SelectionError, select
from ct200_tools.doctor.checks.base import STATUSES, plural
from ct200_tools.doctor.report import REPORT_SCHEMA_VERSION
from ct200_tools.exitcodes import Exit
from ct200_tools.untrusted import FieldError, Fields, UntrustedInputError, each, parse_json, show

#: Version of the gathered fleet document (the file doctor.yml writes).
FLEET_SCHEMA_VERSION = 1
#: Lines of a broken doctor's stderr kept in the table and the document.
STDERR_LINES = 5
#: The most a fleet file may be: a doctor's report is tens of KB, this holds thousands of hosts.
MAX_FILE_BYTES = 64 << 20
#: The most of one host's output read as its report.
MAX_REPORT_CHARS = 16 << 20
#: How to get a good fleet file (every refusal of one says it).
FILE_FIX = (
    "give the file playbooks/doctor.yml wrote with -e ct200_doctor_fleet_file=FILE, "
    "or run that playbook again to write it"
)


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
    #: Lines that belong in ``file`` (Remedy.config), shown as such, never as commands.
    config: tuple[str, ...] = ()
    file: str | None = None


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


def check_report(doc: object, path: str = "") -> None:
    """FieldError naming the first field of ``doc`` that is not what a doctor report has, among
    those this module reads. A report comes from another machine: every field the table shows
    is typed here, so that rendering it can never raise."""
    report = Fields(doc, path)
    version = report.raw("schema_version")
    if type(version) is not int or version != REPORT_SCHEMA_VERSION:
        raise FieldError(
            path, f"schema_version {show(version, 40)}, expected {REPORT_SCHEMA_VERSION}"
        )
    for where, item in report.each("checks"):
        check = Fields(item, where)
        check.text("id")
        if check.text("status") not in STATUSES:
            raise FieldError(check.at("status"), f"expected one of {', '.join(STATUSES)}")
        check.opt_text("summary")
        check.opt_text("caused_by")
        fix = check.opt_obj("remediation")
        if fix is not None:
            for key in ("where", "action", "command", "tag", "file"):
                fix.opt_text(key)
            fix.texts("config", optional=True)
    report.texts("root_causes")


def _report_problem(doc: object) -> str | None:
    """Why a parsed stdout is not a doctor report this code reads, or None."""
    try:
        check_report(doc)
    except FieldError as exc:
        return str(exc)
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
                tuple(fix.get("config") or ()),
                fix.get("file"),
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
    if rc is not None and (type(rc) is not int):
        return HostResult(host, Status.BROKE, f"exit code {show(rc, 40)} is not a number")
    if result.get("timed_out"):
        took = f"the doctor timed out after {result.get('duration_s')} s"
        return HostResult(host, Status.BROKE, took, rc, None, stderr)
    stdout = str(result.get("stdout") or "")
    if len(stdout) > MAX_REPORT_CHARS:
        why = f"its output is {len(stdout)} characters, not a report"
        return HostResult(host, Status.BROKE, f"exit {rc}: {why}", rc, None, stderr)
    try:
        report = parse_json(stdout, "its output", "")
    except UntrustedInputError as exc:
        return HostResult(host, Status.BROKE, f"exit {rc}: {exc.message}", rc, None, stderr)
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


def _lines(text: str) -> list[str]:
    """A multi-line field (a fix's command) as lines, each escaped: only a newline the field
    itself holds starts a line, never a CR or another break a terminal would honour."""
    return [show(line) for line in text.removesuffix("\n").split("\n")] if text else []


def render_table(results: Sequence[HostResult]) -> str:
    """The fleet table: worst rows first; for a failing host its root causes and their fixes.

    Every field comes from a host or a saved file, so each is shown escaped (show): a host
    named "x\\n fleet: ok" is one row with that name, never a forged row or summary line."""
    rows = sorted(results, key=_order)
    names = {id(r): show(r.host) for r in rows}
    width = max([len("HOST"), *(len(n) for n in names.values())])
    swidth = max(len(s.value) for s in Status)
    n = Counter(r.status for r in rows)
    lines = [
        f"ct200 fleet doctor: {plural(len(rows), 'host')}: "
        + ", ".join(f"{n[s]} {s.value}" for s in Status if n[s]),
        f"{'HOST':<{width}}  {'STATUS':<{swidth}}  ROOT CAUSES AND FIXES",
    ]
    pad = " " * (width + swidth + 4)
    for r in rows:
        status = r.status.value.upper()
        lines.append(f"{names[id(r)]:<{width}}  {status:<{swidth}}  {show(r.detail)}")
        for root in r.roots:
            more = f" (+{plural(len(root.consequences), 'consequence')})"
            said = f"{show(root.id)}: {show(root.summary)}"
            lines.append(f"{pad}{said}{more if root.consequences else ''}")
            if root.action:
                lines.append(f"{pad}  fix on {show(root.where)}: {show(root.action)}")
            lines.extend(f"{pad}    in {show(root.file or '?')}: {show(c)}" for c in root.config)
            lines.extend(f"{pad}    $ {c}" for c in _lines(root.command or ""))
            if root.tag:
                lines.append(f"{pad}    (playbook tag: {show(root.tag)})")
        lines.extend(f"{pad}warning {show(w)}" for w in r.warnings)
        lines.extend(f"{pad}stderr: {show(e)}" for e in r.stderr)
    bad = [names[id(r)] for r in rows if r.status in FAILING]
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
    """Rows again from a document to_document wrote (`ct200-doctor fleet FILE`); FleetFormatError
    naming the field path (hosts[3].report.checks[0].summary) of the first field that is not
    what to_document writes."""
    try:
        return _rows(doc)
    except FieldError as exc:
        raise FleetFormatError(str(exc)) from None


def _rows(doc: object) -> list[HostResult]:
    top = Fields(doc)
    version = top.raw("schema_version")
    if type(version) is not int or version != FLEET_SCHEMA_VERSION:
        raise FieldError(
            "",
            f"not a fleet document (schema_version {show(version, 40)}, "
            f"expected {FLEET_SCHEMA_VERSION})",
        )
    out = []
    for where, item in each(top.raw("hosts"), "hosts"):
        h = Fields(item, where)
        host, detail, rc = h.text("host"), h.text("detail"), h.opt_int("rc")
        said = h.text("status")
        try:
            status = Status(said)
        except ValueError:
            choices = ", ".join(s.value for s in Status)
            raise FieldError(h.at("status"), f"expected one of {choices}") from None
        got = h.raw("report")
        if got is not None:
            check_report(got, h.at("report"))
        report = got if isinstance(got, dict) else None  # check_report: a dict or None
        stderr = _tail("\n".join(h.texts("stderr", optional=True)))
        if report is not None and status in (Status.FAIL, Status.WARN, Status.OK):
            out.append(_from_report(host, rc, report, stderr))
        else:
            out.append(HostResult(host, status, detail, rc, report, stderr))
    return out
