"""Findings -> the doctor's text view, versioned JSON, or a node_exporter textfile."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ct200_tools import __version__
from ct200_tools.checks import CHECKS
from ct200_tools.checks.base import Finding
from ct200_tools.exitcodes import Exit as Exit  # noqa: PLC0414 - re-exported for the doctor
from ct200_tools.facts import Facts, to_jsonable

#: Version of the --json document; bump when a field changes meaning or disappears.
REPORT_SCHEMA_VERSION = 1


def exit_code(findings: Sequence[Finding], strict: bool = False) -> Exit:
    statuses = {f.status for f in findings}
    if "fail" in statuses:
        return Exit.FAILURES
    if strict and "warn" in statuses:
        return Exit.WARNINGS
    return Exit.OK


@dataclass(frozen=True)
class Header:
    facts: Facts
    spec_source: str | None
    #: The spec's own warnings (e.g. a TP group across NUMA nodes), shown under the title.
    spec_warnings: tuple[str, ...] = ()


_TITLES = {c.id: c.title for c in CHECKS}
_MARK = {"pass": "✓", "warn": "!", "fail": "✗", "skip": "-"}
_COLOR = {"pass": "green", "warn": "yellow", "fail": "red", "skip": "bright_black"}


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
    lines.extend(f"spec warning: {w}" for w in head.spec_warnings)
    width = max((len(x.id) for x in findings), default=10)
    for x in findings:
        lines.append(style(f"[{_MARK[x.status]}] {x.id:<{width}}  {x.summary}", x.status))
        expand = verbose or x.status in ("fail", "warn")
        if expand:
            lines.extend(f"      · {e}" for e in x.evidence)
        if x.remediation and x.status in ("fail", "warn"):
            r = x.remediation
            lines.append(f"      → fix on {r.where}: {r.action}")
            if r.command:
                lines.extend(f"        $ {c}" for c in r.command.splitlines())
            if r.tag:
                lines.append(f"        (playbook tag: {r.tag})")
    counts = Counter(x.status for x in findings)
    lines.append("")
    lines.append(
        f"{counts['pass']} passed, {counts['warn']} warnings, {counts['fail']} failed, "
        f"{counts['skip']} skipped"
    )
    slow = [p for p in f.probes if p.outcome != "ok"]
    for p in slow:
        lines.append(f"probe {p.name}: {p.outcome}: {p.error}")
    return "\n".join(lines) + "\n"


def render_json(findings: Sequence[Finding], head: Header, code: int) -> str:
    counts = Counter(x.status for x in findings)
    doc = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "doctor_version": __version__,
        "hostname": head.facts.hostname,
        "collected_at": head.facts.collected_at,
        "spec": head.spec_source,
        "spec_warnings": list(head.spec_warnings),
        "exit_code": int(code),
        "summary": {s: counts.get(s, 0) for s in ("pass", "warn", "fail", "skip")},
        "checks": [
            {
                "id": x.id,
                "title": _TITLES.get(x.id, x.id),
                "status": x.status,
                "severity": x.severity,
                "summary": x.summary,
                "evidence": list(x.evidence),
                "remediation": to_jsonable(x.remediation),
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
        "# HELP ct200_doctor_check 1 for the check's current status (one series per status).",
        "# TYPE ct200_doctor_check gauge",
    ]
    for x in findings:
        for status in ("pass", "warn", "fail", "skip"):
            out.append(
                f'ct200_doctor_check{{check="{_label(x.id)}",severity="{x.severity}",'
                f'status="{status}"}} {int(x.status == status)}'
            )
    out += [
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
