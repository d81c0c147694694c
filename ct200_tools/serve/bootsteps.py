"""Boot chain steps from systemd's unit states, and their Prometheus textfile: shared by the
container's chain (serve/chain.py, `ct200-serve chain`) and the host's (host/chain.py,
ct200-host-chain on the PVE host).

Standard library only, as host/chain.py and fsutil.py: the host_boot_report role copies these
modules to the PVE host, where ct200-tools is not installed (as pvecfg.py goes there as
module_utils). Nothing here touches the machine: `systemctl show` text in, steps and text out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from ct200_tools.untrusted import UntrustedInputError, read_bounded, show

#: Where Debian's prometheus-node-exporter reads textfiles from.
TEXTFILE_DIR: Final = "/var/lib/prometheus/node-exporter"
#: The kernel's id of this boot (a new random UUID at every boot, also inside a container): the
#: textfile carries it, so a file left by an earlier boot can never pass for this boot's.
BOOT_ID_PATH: Final = "/proc/sys/kernel/random/boot_id"
_BOOT_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
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
#: (or stopped) although the chain needs it (a disabled unit, after a boot); not-listening: a
#: server's unit is active but nothing accepts connections on the port its spec names.
OK: Final = "ok"
NOT_LISTENING: Final = "not-listening"
STATES: Final = ("ok", "starting", "failed", "masked", "off", NOT_LISTENING)

#: The detail of an "off" step whose unit ran at this boot and was stopped since.
STOPPED_AFTER_RUNNING: Final = "stopped after it ran at this boot"

_STATUS = re.compile(r"\bstatus=(\d+)")
_ARGV = re.compile(r"\bargv\[\]=([^;]*)")


@dataclass(frozen=True)
class Step:
    kind: str  # stage | server (the container's), host (the host's boot units)
    name: str  # the model, the server, or the host step
    unit: str
    state: str
    #: systemd's own words: "failed (failed), result exit-code", "inactive (dead)".
    detail: str
    #: Seconds after the machine's systemd started: when the unit began starting, and when it
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
    #: Seconds from the machine's systemd start to the end of its boot (None: still booting).
    boot_s: float | None = None
    journal: tuple[str, ...] = field(default=())
    #: Whose chain: the container's (stages, servers) or the PVE host's (its boot units).
    machine: str = "container"
    #: This boot's id (BOOT_ID_PATH); "" when it could not be read.
    boot_id: str = ""
    #: Why there is no chain to judge (the spec unreadable, systemd not answering, nothing to
    #: serve); never ok when set.
    reason: str = ""

    @property
    def stopped(self) -> Step | None:
        """The first step that is not good: where the chain stopped."""
        return next((s for s in self.steps if not s.ok), None)

    @property
    def ok(self) -> bool:
        return self.stopped is None and not self.reason

    @property
    def serving_s(self) -> float | None:
        """Seconds from the container's start until the last step became active."""
        if not self.ok or not self.steps or self.machine != "container":
            return None
        times = [s.active_s for s in self.steps]
        return max(t for t in times if t is not None) if all(times) else None

    def to_dict(self) -> dict[str, object]:
        stopped = self.stopped
        return {
            "ok": self.ok,
            "machine": self.machine,
            "boot_id": self.boot_id,
            "reason": self.reason,
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


def boot_id(path: str = BOOT_ID_PATH) -> str:
    """This boot's id, or "" when it cannot be read or is not a UUID (never a guess)."""
    try:
        text = read_bounded(path, "the boot id", 128, "").decode("ascii", "replace").strip()
    except (UntrustedInputError, OSError):
        return ""
    return text if _BOOT_ID.match(text) else ""


def since(props: Mapping[str, str], key: str, zero: int) -> float | None:
    """A monotonic timestamp of `systemctl show` as seconds after ``zero`` (the manager's
    UserspaceTimestampMonotonic); None when unset or from before it."""
    value = props.get(key, "")
    # isascii: str.isdigit() is true for "²", which int() refuses.
    if not (value.isascii() and value.isdigit()) or int(value) == 0 or int(value) < zero:
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
        # Why it does not run: it ran at this boot and was stopped (`systemctl stop`, by hand or
        # by a tool), or it did not run: a disabled unit is not pulled in by its target.
        file_state = props.get("UnitFileState", "")
        if since(props, "InactiveExitTimestampMonotonic", zero) is not None:
            detail += f", {STOPPED_AFTER_RUNNING}"
        elif file_state and file_state not in ("enabled", "enabled-runtime", "static"):
            detail += f", {file_state}"
    failed_at = failed_command(props) if kind == "server" and state == "failed" else ""
    return Step(
        kind,
        name,
        unit,
        state,
        detail,
        since(props, "InactiveExitTimestampMonotonic", zero),
        since(props, "ActiveEnterTimestampMonotonic", zero) if state == OK else None,
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


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def with_manager(
    order: Sequence[tuple[str, str, str]],
    units: Sequence[Mapping[str, str]],
    manager: Mapping[str, str],
) -> tuple[tuple[Step, ...], float | None]:
    """The steps of ``order`` ((kind, name, unit) in start order) from `systemctl show` blocks
    of their units (matched by Id, else by position), timed from the manager's userspace start;
    and the seconds the machine took to boot (None: still booting)."""
    by_id = {u.get("Id", ""): u for u in units}
    zero_text = manager.get("UserspaceTimestampMonotonic", "0")
    zero = int(zero_text) if zero_text.isascii() and zero_text.isdigit() else 0
    steps = tuple(
        step_of(kind, name, unit, by_id.get(unit, units[i] if i < len(units) else {}), zero)
        for i, (kind, name, unit) in enumerate(order)
    )
    return steps, since(manager, "FinishTimestampMonotonic", zero)


def textfile(chain: Chain, now: float) -> str:
    """The chain as Prometheus text exposition: one series per step and state, its times, and
    the step where the chain stopped; for the container also the serving set and when it served.
    The host's file has the same families (its steps are kind="host"), so one alert rule covers
    both machines."""
    whose = "the PVE host's boot units" if chain.machine == "host" else "the boot chain"
    lines = [
        f"# HELP ct200_boot_chain_ok 1 when every step of {whose} is good.",
        "# TYPE ct200_boot_chain_ok gauge",
        f"ct200_boot_chain_ok {int(chain.ok)}",
        "# HELP ct200_boot_report_info The boot this report is of (boot_id: "
        f"{BOOT_ID_PATH}; empty: unreadable); a file of an earlier boot has another id.",
        "# TYPE ct200_boot_report_info gauge",
        f'ct200_boot_report_info{{machine="{chain.machine}",boot_id="{_label(chain.boot_id)}"}} 1',
    ]
    if chain.reason:
        lines += [
            "# HELP ct200_boot_chain_reason Why there is no chain to judge (absent: there is).",
            "# TYPE ct200_boot_chain_reason gauge",
            f'ct200_boot_chain_reason{{reason="{_label(show(chain.reason, 300))}"}} 1',
        ]
    lines += [
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
        f"# HELP ct200_boot_step_active_seconds Seconds from the {chain.machine}'s start until "
        "the step was active.",
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
    if chain.machine == "container":
        lines += [
            "# HELP ct200_boot_serving_set A server of the serving set, and where the set came "
            "from.",
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


def table(chain: Chain) -> list[str]:
    """The steps for people, one line each with its times; a step that is not good says why."""

    def t(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    out = [f"  {'step':<32} {'state':<9} {'start s':>8} {'ready s':>8} {'took s':>7}"]
    for s in chain.steps:
        mark = "" if s.ok else f"  <- {s.detail}" + (f", at {s.failed_at}" if s.failed_at else "")
        out.append(
            f"  {s.label:<32} {s.state:<9} {t(s.started_s):>8} {t(s.active_s):>8} "
            f"{t(s.seconds):>7}{mark}"
        )
    return out


def stop_lines(chain: Chain, fix: Callable[[Step], str]) -> list[str]:
    """Where the chain stopped, the journal of that step's unit and what to do (none: [])."""
    stopped = chain.stopped
    if stopped is None:
        return []
    out = [f"stopped at: {stopped.label} ({stopped.unit}): {stopped.state}"]
    if chain.journal:
        out.append(f"  journal of {stopped.unit} (last lines):")
        # What the engine printed is not ours: escaped here (a CR or an escape sequence must not
        # rewrite the report), exact in the JSON.
        out += [f"    {show(line, 500)}" for line in chain.journal]
    out.append(f"  fix: {fix(stopped)}")
    return out
