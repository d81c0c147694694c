"""Findings -> the doctor's text view, versioned JSON, or a node_exporter textfile."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ct200_tools import __version__
from ct200_tools.doctor.checks.base import NEEDS_SPEC, NO_SPEC_FIX, STATUSES, Finding, plural
from ct200_tools.exitcodes import Exit as Exit  # noqa: PLC0414 - re-exported for the doctor
from ct200_tools.facts import Facts, to_jsonable

#: Version of the --json document; bump when a field changes meaning or disappears.
REPORT_SCHEMA_VERSION = 1


def exit_code(findings: Sequence[Finding], strict: bool = False) -> Exit:
    """3 when a check broke; 2 when one failed, was blocked by a failing check (selected or
    not), or when nothing at all was judged; 1 for warnings with --strict; else 0."""
    statuses = {f.status for f in findings}
    if "error" in statuses:
        return Exit.DOCTOR_BROKE
    if "fail" in statuses or blocked(findings) or not checked_anything(findings):
        return Exit.FAILURES
    if strict and "warn" in statuses:
        return Exit.WARNINGS
    return Exit.OK


def blocked(findings: Sequence[Finding]) -> list[Finding]:
    """Skips that another check's failure caused (run_checks keeps caused_by only then)."""
    return [f for f in findings if f.status == "skip" and f.caused_by]


def checked_anything(findings: Sequence[Finding]) -> bool:
    return any(f.status in ("pass", "warn", "fail") for f in findings)


@dataclass(frozen=True)
class Header:
    facts: Facts
    spec_source: str | None
    #: The spec's own warnings (e.g. a TP group across NUMA nodes), shown under the title.
    spec_warnings: tuple[str, ...] = ()


#: A broken check gets flutter doctor's crash mark: it is the doctor's failure, not the machine's.
_MARK = {"pass": "✓", "warn": "!", "fail": "✗", "skip": "-", "error": "☠"}
_COLOR = {
    "pass": "green",
    "warn": "yellow",
    "fail": "red",
    "skip": "bright_black",
    "error": "magenta",
}
_SHOWN = ("fail", "warn", "error")


def root_causes(findings: Sequence[Finding]) -> list[str]:
    """The failing checks that explain every failure and blocked skip, in report order (a root
    that was not selected comes where its first consequence is)."""
    roots: list[str] = []
    for x in findings:
        root = x.caused_by or (x.id if x.status == "fail" else None)
        if root is not None and x.status in ("fail", "warn", "skip") and root not in roots:
            roots.append(root)
    return roots


def render_text(
    findings: Sequence[Finding], head: Header, verbose: bool = False, color: bool = False
) -> str:
    def style(text: str, status: str) -> str:
        if not color:
            return text
        import click  # noqa: PLC0415 - only for colour on a terminal

        return click.style(text, fg=_COLOR[status])

    f = head.facts
    where = f.kernel.container if f.kernel and f.kernel.container else "?"
    lines = [
        f"ct200-doctor {__version__} on {f.hostname or '?'} "
        f"(container: {where}; spec: {head.spec_source or 'none'})",
    ]
    if f.host is not None:
        lines.append(f"PVE host: {f.host.hostname or '?'} read {_via(f.host.via)}")
    elif "host" in f.unreadable:
        lines.append(f"PVE host: not read ({f.unreadable['host']})")
    lines.extend(f"spec warning: {w}" for w in head.spec_warnings)
    no_spec = [x for x in findings if x.status == "skip" and x.summary == NEEDS_SPEC]
    if no_spec and head.spec_source is None:
        lines.append(
            f"no site spec, so {plural(len(no_spec), 'check')} that need one "
            f"{'is' if len(no_spec) == 1 else 'are'} skipped: {NO_SPEC_FIX}"
        )
    width = max((len(x.id) for x in findings), default=10)
    shown = {x.id for x in findings}
    # A finding whose root is shown sits under it, in report order, instead of in its own place.
    under: dict[str, list[Finding]] = {}
    for x in findings:
        if x.caused_by in shown and x.caused_by != x.id:
            under.setdefault(x.caused_by, []).append(x)

    def block(x: Finding, indent: str, consequence: bool) -> None:
        summary = x.summary
        if x.caused_by and x.status in ("fail", "warn"):
            summary += f" (because of {x.caused_by}" + (")" if consequence else ", not selected)")
        lines.append(style(f"{indent}[{_MARK[x.status]}] {x.id:<{width}}  {summary}", x.status))
        pad = indent + "      "
        # A consequence's details are its root's, shown just above: only -v repeats them.
        if verbose or (x.status in _SHOWN and not consequence):
            lines.extend(f"{pad}· {e}" for e in x.evidence)
        if x.remediation and x.status in ("fail", "warn") and not consequence:
            r = x.remediation
            lines.append(f"{pad}→ fix on {r.where}: {r.action}")
            lines.extend(f"{pad}  {c}" for c in r.lines())
            if r.tag:
                lines.append(f"{pad}  (playbook tag: {r.tag})")

    for x in findings:
        if x.caused_by in shown and x.caused_by != x.id:
            continue
        block(x, "", consequence=False)
        for y in under.get(x.id, ()):
            block(y, "    ", consequence=True)
    counts = Counter(x.status for x in findings)
    lines.append("")
    roots = root_causes(findings)
    if roots:
        named = ", ".join(r if r in shown else f"{r} (not selected)" for r in roots)
        lines.append(
            f"{plural(len(roots), 'root cause')} "
            f"({plural(counts['fail'], 'failed check')}): {named}"
        )
    lines.append(
        f"{counts['pass']} passed, {plural(counts['warn'], 'warning')}, {counts['fail']} failed, "
        f"{counts['skip']} skipped"
        + (
            f", {counts['error']} broken (a doctor bug: please report it)"
            if counts["error"]
            else ""
        )
    )
    lines.extend(_not_run_causes(findings))
    if not checked_anything(findings):
        lines.append("nothing was checked: every selected check was skipped (reasons above)")
    slow = [p for p in f.probes if p.outcome != "ok"]
    for p in slow:
        lines.append(f"probe {p.name}: {p.outcome}: {p.error}")
    return "\n".join(lines) + "\n"


def _not_run_causes(findings: Sequence[Finding]) -> list[str]:
    """Name the failing checks that blocked a selected one but were not selected themselves."""
    ran = {x.id for x in findings}
    by_cause: dict[str, list[str]] = {}
    for x in blocked(findings):
        if x.caused_by is not None and x.caused_by not in ran:
            by_cause.setdefault(x.caused_by, []).append(x.id)
    return [
        f"{cause} fails (not selected), so {', '.join(ids)} could not be checked: "
        f"see it with `ct200-doctor check --only {cause}`"
        for cause, ids in by_cause.items()
    ]


def _via(via: str) -> str:
    return "here (--host local)" if via == "local" else f"over {via}"


def render_json(findings: Sequence[Finding], head: Header, code: int) -> str:
    counts = Counter(x.status for x in findings)
    doc = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "doctor_version": __version__,
        "hostname": head.facts.hostname,
        "collected_at": head.facts.collected_at,
        "spec": head.spec_source,
        "spec_warnings": list(head.spec_warnings),
        # The PVE host `check --host` read, and how; null without --host.
        "host": (
            {"hostname": head.facts.host.hostname, "via": head.facts.host.via}
            if head.facts.host is not None
            else None
        ),
        "exit_code": int(code),
        "summary": {s: counts.get(s, 0) for s in STATUSES},
        # The failing checks every failure and blocked skip comes from (their caused_by).
        "root_causes": root_causes(findings),
        "checks": [
            {
                "id": x.id,
                "title": x.title,
                "status": x.status,
                "severity": x.severity,
                "summary": x.summary,
                "evidence": list(x.evidence),
                "remediation": to_jsonable(x.remediation),
                "caused_by": x.caused_by,
            }
            for x in findings
        ],
        "probes": to_jsonable(head.facts.probes),
        "unreadable": head.facts.unreadable,
    }
    return json.dumps(doc, indent=2) + "\n"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_prometheus(findings: Sequence[Finding], head: Header, code: int) -> str:
    """node_exporter textfile collector format: one-hot status per check."""
    out = [
        "# HELP ct200_doctor_check 1 for the check's current status (one series per status; "
        "error: the check itself broke).",
        "# TYPE ct200_doctor_check gauge",
    ]
    for x in findings:
        for status in STATUSES:
            out.append(
                f'ct200_doctor_check{{check="{_label(x.id)}",severity="{x.severity}",'
                f'status="{status}"}} {int(x.status == status)}'
            )
    out += [
        "# HELP ct200_doctor_root_causes Failing checks that explain every failure of the run.",
        "# TYPE ct200_doctor_root_causes gauge",
        f"ct200_doctor_root_causes {len(root_causes(findings))}",
        "# HELP ct200_doctor_exit_code Exit code of the last run (0 ok, 1 warn, 2 fail, 3 broke).",
        "# TYPE ct200_doctor_exit_code gauge",
        f"ct200_doctor_exit_code {int(code)}",
        "# HELP ct200_doctor_probe_duration_seconds Time each probe took.",
        "# TYPE ct200_doctor_probe_duration_seconds gauge",
    ]
    out += [
        f'ct200_doctor_probe_duration_seconds{{probe="{_label(p.name)}",outcome="{p.outcome}"}} '
        f"{p.duration_s}"
        for p in head.facts.probes
    ]
    out += [
        "# HELP ct200_doctor_last_run_timestamp_seconds When the doctor last ran.",
        "# TYPE ct200_doctor_last_run_timestamp_seconds gauge",
        f"ct200_doctor_last_run_timestamp_seconds {int(time.time())}",
    ]
    return "\n".join(out) + "\n"


def gate_verdict(findings: Sequence[Finding], server: str, code: int) -> str:
    """The gate's verdict in one line, root cause and its fix first: what `systemctl status`
    shows of the journal (its last lines) and what an operator reads first."""
    if code == Exit.OK:
        judged = [x.id for x in findings if x.status in ("pass", "warn")]
        return f"ct200-doctor gate {server}: go ({', '.join(judged)})"
    if code == Exit.DOCTOR_BROKE:
        broken = [x.id for x in findings if x.status == "error"]
        return f"ct200-doctor gate {server}: the doctor broke in {', '.join(broken)}: please report"
    by_id = {x.id: x for x in findings}
    roots = root_causes(findings)
    if not roots:
        return f"ct200-doctor gate {server}: no-go: nothing could be checked (reasons above)"
    parts = []
    for root in roots:
        x = by_id.get(root)
        if x is None:
            parts.append(f"{root} fails (see `ct200-doctor check --only {root}`)")
            continue
        fix = ""
        if x.remediation is not None:
            r = x.remediation
            cmd = r.lines(prompt="")
            more = f" (and {len(cmd) - 1} more lines above)" if len(cmd) > 1 else ""
            fix = f"; fix on {r.where}: " + (f"{cmd[0]}{more}" if cmd else r.action)
        # The first evidence line names the cause (the node, errno, major): what the summary
        # counts. Not repeated when the summary already says it.
        cause = x.evidence[0] if x.evidence and x.evidence[0] not in x.summary else ""
        parts.append(f"{root}: {x.summary}" + (f": {cause}" if cause else "") + fix)
    return f"ct200-doctor gate {server}: no-go: " + " | ".join(parts)


def render_gate(findings: Sequence[Finding], head: Header, server: str, code: int) -> str:
    """The verdict line, the doctor's text view (roots first, consequences under them), and
    the verdict again as the last line (the journal's tail)."""
    verdict = gate_verdict(findings, server, code)
    return f"{verdict}\n{render_text(findings, head)}{verdict}\n"
