"""The container's boot chain: where it got to, from systemd's unit states, and its report.

After a host reboot the container comes back by itself: each model of the serving set is
restaged by its ct200-stage@ unit, then each server's unit starts behind its gates (preflight,
then `ct200-doctor gate`) and returns once it serves. This module reads that chain back, step by
step in start order (the stages, then the servers), from `systemctl show`: each step's state,
when it started and became active (seconds since this machine's systemd started, i.e. since the
container booted) and, for a failed server, which of its commands failed (preflight, gate, the
engine, the readiness wait). The first step that is not good is where the chain stopped.

`ct200-serve chain` prints it; ct200-boot-report.service runs it at the end of every boot and
writes it as a Prometheus textfile (whole or not at all).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from ct200_tools import engines as engine
from ct200_tools.serve.systemd import Systemd
from ct200_tools.serving import ServingSet
from ct200_tools.spec import SiteSpec

#: Where Debian's prometheus-node-exporter reads textfiles from.
TEXTFILE: Final = "/var/lib/prometheus/node-exporter/ct200_boot.prom"
UNIT_PROPERTIES: Final = (
    "Id",
    "LoadState",
    "ActiveState",
    "SubState",
    "Result",
    "UnitFileState",
    "InactiveExitTimestampMonotonic",
    "ActiveEnterTimestampMonotonic",
    "StateChangeTimestampMonotonic",
    "ExecStartPre",
    "ExecStartPost",
    "ExecMainStatus",
)
MANAGER_PROPERTIES: Final = ("UserspaceTimestampMonotonic", "FinishTimestampMonotonic")

#: Step states. ok: active; starting: its start job runs; failed; masked; off: not started
#: (or stopped) although the serving set needs it.
OK: Final = "ok"
STATES: Final = ("ok", "starting", "failed", "masked", "off")

_STATUS = re.compile(r"\bstatus=(\d+)")
_ARGV = re.compile(r"\bargv\[\]=([^;]*)")


@dataclass(frozen=True)
class Step:
    kind: str  # stage | server
    name: str  # the model or the server
    unit: str
    state: str
    #: systemd's own words: "failed (failed), result exit-code", "inactive (dead)".
    detail: str
    #: Seconds after the container's systemd started: when the unit began starting, and when it
    #: became active (None: not in this boot).
    started_s: float | None = None
    active_s: float | None = None
    #: For a failed server: the command that failed (preflight, gate, engine, ready).
    failed_at: str = ""

    @property
    def ok(self) -> bool:
        return self.state == OK

    @property
    def seconds(self) -> float | None:
        """How long the step itself took (start to active)."""
        if self.started_s is None or self.active_s is None:
            return None
        return max(0.0, self.active_s - self.started_s)

    @property
    def label(self) -> str:
        return f"{self.kind} {self.name}"


@dataclass(frozen=True)
class Chain:
    serving: tuple[str, ...]
    source: str
    steps: tuple[Step, ...]
    #: Seconds from the container's systemd start to the end of its boot (None: still booting).
    boot_s: float | None = None
    journal: tuple[str, ...] = field(default=())

    @property
    def stopped(self) -> Step | None:
        """The first step that is not good: where the chain stopped."""
        return next((s for s in self.steps if not s.ok), None)

    @property
    def ok(self) -> bool:
        return self.stopped is None

    @property
    def serving_s(self) -> float | None:
        """Seconds from the container's start until the last step became active."""
        if not self.ok or not self.steps:
            return None
        times = [s.active_s for s in self.steps]
        return max(t for t in times if t is not None) if all(times) else None

    def to_dict(self) -> dict[str, object]:
        stopped = self.stopped
        return {
            "ok": self.ok,
            "serving": list(self.serving),
            "source": self.source,
            "boot_seconds": self.boot_s,
            "serving_seconds": self.serving_s,
            "stopped_at": None
            if stopped is None
            else {"kind": stopped.kind, "name": stopped.name, "unit": stopped.unit},
            "steps": [
                {
                    "kind": s.kind,
                    "name": s.name,
                    "unit": s.unit,
                    "state": s.state,
                    "detail": s.detail,
                    "started_s": s.started_s,
                    "active_s": s.active_s,
                    "seconds": s.seconds,
                    "failed_at": s.failed_at,
                }
                for s in self.steps
            ],
            "journal": list(self.journal),
        }


def plan(site: SiteSpec, chosen: ServingSet) -> list[tuple[str, str, str]]:
    """(kind, name, unit) in start order: every model of the serving set, then its servers."""
    models = site.needed_models(list(chosen.servers))
    out = [("stage", m.name, engine.stage_unit(m.name)) for m in models]
    out += [("server", s.name, engine.unit_name(s.name)) for s in chosen.servers]
    return out


def _since(props: Mapping[str, str], key: str, zero: int) -> float | None:
    value = props.get(key, "")
    if not value.isdigit() or int(value) == 0 or int(value) < zero:
        return None
    return round((int(value) - zero) / 1e6, 3)


def failed_command(props: Mapping[str, str]) -> str:
    """Which of a server unit's commands failed in its last start: preflight, gate (the
    doctor's), ready (the readiness wait) or, when none of them did, the engine."""
    for key in ("ExecStartPre", "ExecStartPost"):
        for entry in props.get(key, "").split("}"):
            status = _STATUS.search(entry)
            if status is None or status.group(1) == "0":
                continue
            argv = _ARGV.search(entry)
            words = argv.group(1).split() if argv else []
            if "gate" in words:
                return "gate"
            if "preflight" in words:
                return "preflight"
            if "wait-ready" in words:
                return "ready"
            return key
    return "engine"


def step_of(kind: str, name: str, unit: str, props: Mapping[str, str], zero: int) -> Step:
    load, active = props.get("LoadState", ""), props.get("ActiveState", "")
    sub, result = props.get("SubState", ""), props.get("Result", "")
    detail = f"{active or 'unknown'} ({sub})" if sub else active or "unknown"
    if active == "failed" and result:
        detail += f", result {result}"
    if load in ("masked", "not-found"):
        state, detail = "masked" if load == "masked" else "off", f"unit {load}"
    elif active == "active":
        state = OK
    elif active in ("activating", "reloading"):
        # A server in its restart delay after a failed start has failed, whatever comes next.
        state = "failed" if sub == "auto-restart" else "starting"
    elif active == "failed":
        state = "failed"
    else:
        state = "off"
    failed_at = failed_command(props) if kind == "server" and state == "failed" else ""
    return Step(
        kind,
        name,
        unit,
        state,
        detail,
        _since(props, "InactiveExitTimestampMonotonic", zero),
        _since(props, "ActiveEnterTimestampMonotonic", zero) if state == OK else None,
        failed_at,
    )


def parse_blocks(text: str) -> list[dict[str, str]]:
    """`systemctl show` output of several units: one KEY=VALUE block per unit, in order. A
    property systemd repeats (ExecStartPre= of each command) is joined with spaces."""
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in [*text.splitlines(), ""]:
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, _, value = line.partition("=")
        current[key] = f"{current[key]} {value}" if key in current else value
    return blocks


def build(
    site: SiteSpec,
    chosen: ServingSet,
    units: Sequence[Mapping[str, str]],
    manager: Mapping[str, str],
) -> Chain:
    """The chain from `systemctl show` blocks of plan()'s units (in its order) and of the
    manager."""
    order = plan(site, chosen)
    by_id = {u.get("Id", ""): u for u in units}
    zero_text = manager.get("UserspaceTimestampMonotonic", "0")
    zero = int(zero_text) if zero_text.isdigit() else 0
    steps = tuple(
        step_of(kind, name, unit, by_id.get(unit, units[i] if i < len(units) else {}), zero)
        for i, (kind, name, unit) in enumerate(order)
    )
    return Chain(
        chosen.names, chosen.source, steps, _since(manager, "FinishTimestampMonotonic", zero)
    )


def read(site: SiteSpec, chosen: ServingSet, systemd: Systemd, journal_lines: int = 15) -> Chain:
    """The chain on this machine now, with the journal tail of the step where it stopped."""
    units = [unit for _, _, unit in plan(site, chosen)]
    blocks = parse_blocks(systemd.show_text(units, UNIT_PROPERTIES)) if units else []
    manager = parse_blocks(systemd.show_text([], MANAGER_PROPERTIES))
    chain = build(site, chosen, blocks, manager[0] if manager else {})
    stopped = chain.stopped
    if stopped is None or stopped.state not in ("failed", "starting"):
        return chain
    journal = tuple(systemd.journal(stopped.unit, journal_lines))
    return dataclasses.replace(chain, journal=journal)


def gate_server(site: SiteSpec, chosen: ServingSet, step: Step) -> str | None:
    """The server whose gate judges the step: the server itself, or the first server of the
    serving set that loads the stage's model."""
    if step.kind == "server":
        return step.name
    return next(
        (s.name for s in chosen.servers if step.name in (m.name for m in site.needed_models([s]))),
        None,
    )


def doctor_gate(name: str, spec_path: str, timeout: float = 180) -> list[str]:
    """`ct200-doctor gate NAME`, beside this program, as a subprocess: the doctor's own words
    about the link where the chain stopped (its root cause and fix)."""
    beside = os.path.join(os.path.dirname(sys.executable), "ct200-doctor")
    program = beside if os.access(beside, os.X_OK) else shutil.which("ct200-doctor")
    if program is None:
        return ["ct200-doctor is not installed here: cannot ask the doctor"]
    try:
        proc = subprocess.run(
            [program, "gate", name, "--spec", spec_path],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return [f"ct200-doctor gate {name} ran over {timeout:.0f} s"]
    return (proc.stdout + proc.stderr).rstrip().splitlines()


def ask_doctor(
    site: SiteSpec, chosen: ServingSet, chain: Chain, spec_path: str
) -> tuple[str | None, list[str]]:
    """Where the chain stopped at a failed or unstarted link: the server the doctor's gate
    judges, and what the gate says; (None, []) when it did not stop there."""
    stopped = chain.stopped
    if stopped is None or stopped.state not in ("failed", "off"):
        return None, []
    name = gate_server(site, chosen, stopped)
    return (name, doctor_gate(name, spec_path)) if name is not None else (None, [])


# -- the report ---------------------------------------------------------------------------------


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def textfile(chain: Chain, now: float) -> str:
    """The chain as Prometheus text exposition: one series per step and state, its times, and
    the step where the chain stopped."""
    lines = [
        "# HELP ct200_boot_chain_ok 1 when every step of the boot chain is good (serving).",
        "# TYPE ct200_boot_chain_ok gauge",
        f"ct200_boot_chain_ok {int(chain.ok)}",
        "# HELP ct200_boot_step_state The state of a boot chain step (1 for its state).",
        "# TYPE ct200_boot_step_state gauge",
    ]
    for s in chain.steps:
        for state in STATES:
            lines.append(
                f'ct200_boot_step_state{{kind="{s.kind}",name="{_label(s.name)}",'
                f'unit="{_label(s.unit)}",state="{state}"}} {int(s.state == state)}'
            )
    lines += [
        "# HELP ct200_boot_step_active_seconds Seconds from the container's start until the "
        "step was active.",
        "# TYPE ct200_boot_step_active_seconds gauge",
    ]
    lines += [
        f'ct200_boot_step_active_seconds{{kind="{s.kind}",name="{_label(s.name)}"}} '
        f"{s.active_s:.3f}"
        for s in chain.steps
        if s.active_s is not None
    ]
    lines += [
        "# HELP ct200_boot_step_seconds Seconds the step took (start to active).",
        "# TYPE ct200_boot_step_seconds gauge",
    ]
    lines += [
        f'ct200_boot_step_seconds{{kind="{s.kind}",name="{_label(s.name)}"}} {s.seconds:.3f}'
        for s in chain.steps
        if s.seconds is not None
    ]
    lines += [
        "# HELP ct200_boot_chain_stopped The step where the boot chain stopped (absent: none).",
        "# TYPE ct200_boot_chain_stopped gauge",
    ]
    stopped = chain.stopped
    if stopped is not None:
        lines.append(
            f'ct200_boot_chain_stopped{{kind="{stopped.kind}",name="{_label(stopped.name)}",'
            f'unit="{_label(stopped.unit)}",state="{stopped.state}",'
            f'failed_at="{stopped.failed_at}"}} 1'
        )
    if chain.serving_s is not None:
        lines += [
            "# HELP ct200_boot_serving_seconds Seconds from the container's start until every "
            "server of the serving set served.",
            "# TYPE ct200_boot_serving_seconds gauge",
            f"ct200_boot_serving_seconds {chain.serving_s:.3f}",
        ]
    lines += [
        "# HELP ct200_boot_serving_set A server of the serving set, and where the set came from.",
        "# TYPE ct200_boot_serving_set gauge",
    ]
    lines += [
        f'ct200_boot_serving_set{{name="{_label(n)}",source="{chain.source}"}} 1'
        for n in chain.serving
    ]
    lines += [
        "# HELP ct200_boot_report_timestamp_seconds When this report was written.",
        "# TYPE ct200_boot_report_timestamp_seconds gauge",
        f"ct200_boot_report_timestamp_seconds {now:.0f}",
    ]
    return "\n".join(lines) + "\n"


def fix_of(step: Step) -> str:
    """What to do about the step where the chain stopped (docs/runbook.md has the rest)."""
    if step.state == "masked":
        return f"systemctl unmask {step.unit} (it was masked: it cannot start at boot)"
    if step.state == "starting":
        return "it is still starting: wait, then run `ct200-serve chain` again"
    if step.kind == "stage":
        return (
            f"journalctl -u {step.unit} says why; ct200-doctor check (models.staged) names the "
            f"model; restore its persistent copy, then `systemctl start {step.unit}` or "
            "ansible-playbook playbooks/recover.yml"
        )
    if step.state == "off":
        return (
            f"systemctl enable --now {step.unit} (not started at boot), or "
            "ansible-playbook playbooks/recover.yml"
        )
    at = {
        "gate": "the doctor's gate said no: its message is above",
        "preflight": "its preflight said no: its message is above",
        "ready": "it did not serve in time",
        "engine": "the engine exited",
    }.get(step.failed_at, step.failed_at)
    return (
        f"{at}; fix what it names, then `systemctl reset-failed {step.unit} && systemctl start "
        f"{step.unit}` or ansible-playbook playbooks/recover.yml"
    )


def lines(chain: Chain) -> list[str]:
    """The chain for people: one line per step, then where it stopped and what to do."""
    head = "serving" if chain.ok else "STOPPED"
    src = "serving.json" if chain.source == "serving.json" else "the spec's enabled flags"
    out = [
        f"boot chain: {head}; serving set ({src}): {', '.join(chain.serving) or 'none'}",
    ]
    if chain.boot_s is not None:
        out.append(f"  container booted in {chain.boot_s:.1f} s (systemd)")

    def t(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    out.append(f"  {'step':<32} {'state':<9} {'start s':>8} {'ready s':>8} {'took s':>7}")
    for s in chain.steps:
        mark = "" if s.ok else f"  <- {s.detail}" + (f", at {s.failed_at}" if s.failed_at else "")
        out.append(
            f"  {s.label:<32} {s.state:<9} {t(s.started_s):>8} {t(s.active_s):>8} "
            f"{t(s.seconds):>7}{mark}"
        )
    stopped = chain.stopped
    if stopped is None:
        if chain.serving_s is not None:
            out.append(f"  every server serves {chain.serving_s:.1f} s after the container started")
        return out
    out.append(f"stopped at: {stopped.label} ({stopped.unit}): {stopped.state}")
    if chain.journal:
        out.append(f"  journal of {stopped.unit} (last lines):")
        out += [f"    {line}" for line in chain.journal]
    out.append(f"  fix: {fix_of(stopped)}")
    return out
