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
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from ct200_tools.provisioned import PROVISIONED, playbook_command
from ct200_tools.serve import engines as engine
from ct200_tools.serve.bootsteps import (
    BOOT_ID_PATH,
    MANAGER_PROPERTIES,
    NOT_LISTENING,
    OK,
    STATES,
    STOPPED_AFTER_RUNNING,
    TEXTFILE_DIR,
    UNIT_PROPERTIES,
    Chain,
    Step,
    boot_id,
    failed_command,
    parse_blocks,
    step_of,
    stop_lines,
    table,
    textfile,
    with_manager,
)
from ct200_tools.serve.serving import ServingSet
from ct200_tools.serve.systemd import Systemd
from ct200_tools.spec import SiteSpec
from ct200_tools.untrusted import show

# The steps, their states and the textfile are bootsteps.py's, shared with the host's chain
# (host/chain.py); they are this module's too.
__all__ = [
    "BOOT_ID_PATH",
    "MANAGER_PROPERTIES",
    "NOT_LISTENING",
    "OK",
    "STATES",
    "TEXTFILE",
    "UNIT_PROPERTIES",
    "Chain",
    "Step",
    "ask_doctor",
    "boot_id",
    "build",
    "doctor_gate",
    "failed_command",
    "fix_of",
    "gate_server",
    "lines",
    "listening",
    "parse_blocks",
    "plan",
    "read",
    "step_of",
    "textfile",
    "with_ports",
]

#: The container's report, in the directory node-exporter reads.
TEXTFILE: Final = f"{TEXTFILE_DIR}/ct200_boot.prom"
#: The chain's reason when the serving set is empty (`ct200-serve chain` exits NOTHING for it).
NOTHING_TO_SERVE: Final = "nothing to serve: the serving set is empty"


def plan(site: SiteSpec, chosen: ServingSet) -> list[tuple[str, str, str]]:
    """(kind, name, unit) in start order: every model of the serving set, then its servers."""
    models = site.needed_models(list(chosen.servers))
    out = [("stage", m.name, engine.stage_unit(m.name)) for m in models]
    out += [("server", s.name, engine.unit_name(s.name)) for s in chosen.servers]
    return out


def build(
    site: SiteSpec,
    chosen: ServingSet,
    units: Sequence[Mapping[str, str]],
    manager: Mapping[str, str],
) -> Chain:
    """The chain from `systemctl show` blocks of plan()'s units (in its order) and of the
    manager."""
    steps, boot_s = with_manager(plan(site, chosen), units, manager)
    reason = "" if chosen.servers else NOTHING_TO_SERVE
    return Chain(chosen.names, chosen.source, steps, boot_s, reason=reason)


def unreadable(reason: str, boot: str) -> Chain:
    """The chain when it cannot be read at all (the spec unreadable, systemd not answering):
    not ok, with the reason, so the textfile is still this boot's and says so."""
    return Chain((), "", (), None, boot_id=boot, reason=reason)


#: How long a server's port may take to accept a connection before it is "cannot tell".
LISTEN_TIMEOUT_S: Final = 1.0


def listening(host: str, port: int, timeout_s: float = LISTEN_TIMEOUT_S) -> bool | None:
    """Whether something accepts TCP connections on host:port now: False when refused, None
    when it cannot be told (a timeout, no route: the chain then claims nothing either way)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except ConnectionRefusedError:
        return False
    except OSError:
        return None


def with_ports(chain: Chain, chosen: ServingSet, probe: Callable[[str, int], bool | None]) -> Chain:
    """An active server whose port refuses connections is not serving (issue 33: after a port
    change the process still listened on the old one, and the chain said serving)."""
    servers = {s.name: s for s in chosen.servers}

    def deaf(step: Step) -> Step:
        s = servers.get(step.name) if step.kind == "server" and step.ok else None
        if s is None or s.port is None:
            return step
        host = engine.connect_host(s.host)
        if probe(host, s.port) is not False:  # listening, or it cannot be told
            return step
        return dataclasses.replace(
            step,
            state=NOT_LISTENING,
            detail=f"{step.detail}, but nothing listens on {show(host, 100)}:{s.port}",
            failed_at="port",
        )

    steps = [deaf(step) for step in chain.steps]
    return dataclasses.replace(chain, steps=tuple(steps))


def read(
    site: SiteSpec,
    chosen: ServingSet,
    systemd: Systemd,
    journal_lines: int = 15,
    probe: Callable[[str, int], bool | None] = listening,
) -> Chain:
    """The chain on this machine now, with the journal tail of the step where it stopped."""
    units = [unit for _, _, unit in plan(site, chosen)]
    blocks = parse_blocks(systemd.show_text(units, UNIT_PROPERTIES)) if units else []
    manager = parse_blocks(systemd.show_text([], MANAGER_PROPERTIES))
    chain = dataclasses.replace(
        build(site, chosen, blocks, manager[0] if manager else {}), boot_id=boot_id()
    )
    chain = with_ports(chain, chosen, probe)
    stopped = chain.stopped
    if stopped is None or stopped.state not in ("failed", "starting", NOT_LISTENING):
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


def recover_command(path: str = PROVISIONED) -> str:
    """The full recover.yml command for this machine (provisioned.playbook_command)."""
    return playbook_command("playbooks/recover.yml", path=path)


def fix_of(step: Step) -> str:
    """What to do about the step where the chain stopped (docs/runbook.md has the rest). Each
    command is whole between backquotes: pasted literally, it is valid shell."""
    recover = recover_command()
    if step.state == "masked":
        return (
            f"it was masked, so it cannot start at boot: `systemctl unmask {step.unit} && "
            f"systemctl start {step.unit}`"
        )
    if step.state == "starting":
        return "it is still starting: wait, then run `ct200-serve chain` again"
    if step.state == NOT_LISTENING:
        # The usual cause: its unit changed (the port) and the process runs the older one,
        # which a note below names; a restart applies the unit either way.
        return (
            f"its process runs but does not accept connections on the spec's port: "
            f"`systemctl restart {step.unit}` starts it on its unit's configuration; if it "
            f"still does not listen, its journal (`journalctl -u {step.unit}`) says why"
        )
    if step.kind == "stage":
        # Its journal (above) names the cause and its fix: a missing persistent copy, a
        # /dev/shm smaller than the spec says, no memory left.
        return (
            f"its journal (above; `journalctl -u {step.unit}`) says why; fix what it names (a "
            f"missing persistent copy: restore it), then `systemctl reset-failed {step.unit} "
            f"&& systemctl start {step.unit}`, or {recover}"
        )
    if step.state == "off" and STOPPED_AFTER_RUNNING in step.detail:
        return (
            f"it was stopped (systemctl stop, by hand or by a tool): `systemctl start "
            f"{step.unit}`, or {recover}"
        )
    if step.state == "off":
        return f"not started at boot: `systemctl enable --now {step.unit}`, or {recover}"
    at = {
        "gate": "the doctor's gate said no: its message is above",
        "preflight": "its preflight said no: its message is above",
        # The readiness wait also fails when the engine exits before it answers (a rejected
        # flag exits at once): "in time" alone sent people to raise start_timeout (issue 33).
        "ready": (
            "it did not serve: the engine exited before it answered, or did not answer within "
            "its start timeout; its last journal lines (above) say which"
        ),
        "engine": "the engine exited",
    }.get(step.failed_at, step.failed_at)
    if step.failed_at in ("ready", "engine"):
        return (
            f"{at}; a flag or setting of the spec it rejects: correct the spec and run site.yml "
            f"(it restarts the server and puts the previous configuration back if it does not "
            f"serve); else fix what it names, then `systemctl reset-failed {step.unit} && "
            f"systemctl start {step.unit}`, or {recover}"
        )
    return (
        f"{at}; fix what it names, then `systemctl reset-failed {step.unit} && systemctl start "
        f"{step.unit}`, or {recover}"
    )


def reason_fix(site: SiteSpec | None, reason: str) -> str:
    """What to do when there is no chain to judge."""
    if reason == NOTHING_TO_SERVE:
        names = [s.name for s in site.servers] if site is not None else []
        if not names:
            return "the site spec has no servers: add one to it, then run site.yml"
        return f"choose what this machine serves, e.g. `ct200-serve switch {names[0]}`"
    return "fix what it names, then `ct200-serve chain` again"


def lines(chain: Chain, site: SiteSpec | None = None) -> list[str]:
    """The chain for people: one line per step, then where it stopped and what to do."""
    boot = f"  boot id {chain.boot_id or 'unknown (' + BOOT_ID_PATH + ' unreadable)'}"
    if chain.reason:
        return [
            f"boot chain: NOT SERVING: {show(chain.reason, 500)}",
            boot,
            f"  fix: {reason_fix(site, chain.reason)}",
        ]
    head = "serving" if chain.ok else "STOPPED"
    src = "serving.json" if chain.source == "serving.json" else "the spec's enabled flags"
    out = [
        f"boot chain: {head}; serving set ({src}): {', '.join(chain.serving) or 'none'}",
        boot,
    ]
    if chain.boot_s is not None:
        out.append(f"  container booted in {chain.boot_s:.1f} s (systemd)")

    out += table(chain)
    if chain.ok and chain.serving_s is not None:
        out.append(f"  every server serves {chain.serving_s:.1f} s after the container started")
    return out + stop_lines(chain, fix_of)
