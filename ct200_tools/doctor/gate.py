"""A server's start gate: can server NAME start? The checks that decide it, scoped to the
server, through the same probes and checks as `ct200-doctor check` (not a bypass).

`ct200-doctor gate NAME` prints `run_gate`'s findings; the server's unit runs it as
ExecStartPre, so a machine that cannot serve fails in seconds with the doctor's message in the
journal, instead of a CUDA traceback minutes into a model load.
"""

from __future__ import annotations

from dataclasses import dataclass

from ct200_tools.doctor.checks import gate_checks, needed_facts, run_checks
from ct200_tools.doctor.checks.base import Finding
from ct200_tools.doctor.report import Exit, exit_code
from ct200_tools.doctor.scope import Scope
from ct200_tools.facts import Facts
from ct200_tools.spec import SiteSpec


@dataclass(frozen=True)
class GateResult:
    scope: Scope
    facts: Facts
    findings: tuple[Finding, ...]
    code: Exit


def run_gate(spec: SiteSpec, name: str, timeout_s: float) -> GateResult:
    """Probe what the server's gate checks need, and judge it. UnknownServerError when the
    spec has no server `name`."""
    from ct200_tools.doctor.probes import collect  # noqa: PLC0415 - the probes only when probing

    scope = Scope.of(spec, name, serving=False)
    selected = gate_checks(scope)
    facts = collect(spec=spec, timeout_s=timeout_s, scope=scope, only=needed_facts(selected))
    findings = tuple(run_checks(facts, spec, selected, scope))
    return GateResult(scope, facts, findings, exit_code(findings))
