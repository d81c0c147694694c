"""The PVE host's link of the boot chain: its boot units, read back, and their textfile.

The chain starts on the host: ct200-host-devices.service (modules, nodes) and
ct200-pcie-tune.service (MRRS) run before pve-guests.service starts the container. This reads
those units back from `systemctl show`, in start order, as the container's chain reads its stages
and servers (bootsteps.py: the same steps, states, times and textfile families, kind="host"):
the first unit that is not good (failed, masked, or off: not run at this boot, e.g. disabled) is
where the chain stopped; its journal of this boot says why.

ct200-host-chain (installed by roles/host_boot_report) runs it: by hand it prints the steps;
ct200-host-boot-report.service runs it at every boot with --textfile. Exit 0 every step good,
1 stopped, 2 bad input, 3 systemd could not be asked.

Standard library only, with bootsteps.py, systemctl.py, units.py and fsutil.py: ct200-tools is not
installed on the host; the role copies these modules there.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from ct200_tools.fsutil import write_atomic
from ct200_tools.provisioned import PROVISIONED, playbook_command
from ct200_tools.serve.bootsteps import (
    MANAGER_PROPERTIES,
    TEXTFILE_DIR,
    UNIT_PROPERTIES,
    Chain,
    Step,
    boot_id,
    parse_blocks,
    stop_lines,
    table,
    textfile,
    with_manager,
)
from ct200_tools.systemctl import run_argv, show_argv
from ct200_tools.units import HOST_DEVICES

#: The host's report, beside the container's name (ct200_boot.prom) in node-exporter's directory.
TEXTFILE: Final = f"{TEXTFILE_DIR}/ct200_host_boot.prom"
KIND: Final = "host"
#: What a step's name and unit may be (they become Prometheus labels and systemctl arguments).
#: \Z, not $: $ also matches before a final newline.
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*\Z")
_UNIT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9@_.:-]*\.service\Z")
QUICK_S: Final = 30.0
#: Runs argv with a timeout (seconds); returns (exit status, stdout, stderr).
Run = Callable[[Sequence[str], float], tuple[int, str, str]]


class Exit(enum.IntEnum):
    OK = 0
    STOPPED = 1
    BAD_INPUT = 2
    BROKE = 3


class BadInput(ValueError):
    """A --step that is not NAME=UNIT.service: the message names it and the form."""


def parse_step(text: str) -> tuple[str, str, str]:
    """NAME=UNIT (e.g. host-devices=ct200-host-devices.service) -> ("host", NAME, UNIT).
    The role passes the steps of units.host_chain (ct200_validated.host_chain)."""
    name, sep, unit = text.partition("=")
    if not sep or not _NAME.match(name) or not _UNIT.match(unit):
        raise BadInput(
            f"--step {text!r}: give NAME=UNIT, a lower-case name and a .service unit, e.g. "
            f"--step {HOST_DEVICES.step}={HOST_DEVICES.name()}"
        )
    return KIND, name, unit


def build(
    order: Sequence[tuple[str, str, str]],
    units: Sequence[Mapping[str, str]],
    manager: Mapping[str, str],
) -> Chain:
    """The host's chain from `systemctl show` blocks of its units (in order) and the manager's."""
    steps, boot_s = with_manager(order, units, manager)
    return Chain((), "", steps, boot_s, machine="host", boot_id=boot_id())


def fix_of(step: Step, record: str = PROVISIONED) -> str:
    """What to do on the host about the step where its chain stopped (docs/runbook.md, step 1).
    Each command is whole between backquotes (valid shell, pasted literally): the playbook
    commands from the record of the inventory that provisioned this host (site.yml's host play
    writes it too), else with what to fill in, said plainly."""
    unit = step.unit
    recover = playbook_command("playbooks/recover.yml", "--tags", "recover_host", path=record)
    controller = "on the controller, in your ct200-tools checkout"
    if step.state == "masked":
        return (
            f"masked, so it cannot run at boot: `systemctl unmask {unit} && systemctl start {unit}`"
        )
    if step.state == "starting":
        return "it is still starting: wait, then run `ct200-host-chain` again"
    if step.detail == "unit not-found":
        installs = playbook_command("playbooks/host.yml", path=record)
        if installs.startswith("`"):
            return f"{unit} is not installed: {installs} installs it"
        return (
            f"{unit} is not installed: {controller}, `ansible-playbook -i INVENTORY "
            "playbooks/host.yml --limit HOST,localhost` installs it"
        )
    if step.state == "off":
        why = "disabled, it did not run at this boot" if "disabled" in step.detail else "not run"
        return f"{why}: `systemctl enable --now {unit}`, or {recover}"
    return (
        f"`journalctl -b -u {unit}` says why (its last lines are above); fix that, then "
        f"`systemctl restart {unit}`, or {recover}"
    )


def lines(chain: Chain) -> list[str]:
    """The host's chain for people: one line per unit, then where it stopped and what to do."""
    out = [
        f"host boot chain: {'ok' if chain.ok else 'STOPPED'}",
        f"  boot id {chain.boot_id or 'unknown'}",
    ]
    if chain.boot_s is not None:
        out.append(f"  host booted in {chain.boot_s:.1f} s (systemd)")
    return out + table(chain) + stop_lines(chain, fix_of)


# -- the machine ---------------------------------------------------------------------------------


class SystemdError(Exception):
    """systemctl could not be asked at all."""


def read(order: Sequence[tuple[str, str, str]], run: Run = run_argv, journal: int = 15) -> Chain:
    """The host's chain now, with this boot's journal tail of the unit where it stopped."""
    units = [unit for _, _, unit in order]
    rc, out, err = run(show_argv(units, UNIT_PROPERTIES), QUICK_S)
    mrc, mout, merr = run(show_argv([], MANAGER_PROPERTIES), QUICK_S)
    if rc != 0 or mrc != 0:
        raise SystemdError(f"systemctl show: {(err or merr).strip() or f'exit {rc or mrc}'}")
    manager = parse_blocks(mout)
    chain = build(order, parse_blocks(out), manager[0] if manager else {})
    stopped = chain.stopped
    if stopped is None or stopped.state not in ("failed", "starting"):
        return chain
    argv = ["journalctl", "--no-pager", "--output=cat", "--boot", f"--lines={journal}"]
    jrc, jout, _ = run([*argv, f"--unit={stopped.unit}"], QUICK_S)
    tail = jout.splitlines()[-journal:] if jrc == 0 else []
    return dataclasses.replace(chain, journal=tuple(tail))


def _write(path: str, chain: Chain) -> bool:
    try:
        write_atomic(path, textfile(chain, time.time()))
    except OSError as exc:
        print(f"ct200-host-chain: cannot write {path}: {exc}", file=sys.stderr)
        return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ct200-host-chain",
        description="Where the PVE host's boot chain stopped: each boot unit in start order, "
        "its state and times since the host's systemd started. Exit 0 every unit good, "
        "1 stopped, 2 bad input, 3 systemd could not be asked.",
    )
    parser.add_argument(
        "--step",
        action="append",
        default=[],
        metavar="NAME=UNIT",
        help="a boot unit of the chain, in start order (repeat)",
    )
    parser.add_argument("--textfile", help="also write the Prometheus textfile here")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)
    try:
        order = [parse_step(s) for s in args.step]
        if not order:
            raise BadInput("no --step given: name the host's boot units (NAME=UNIT)")
        chain = read(order)
    except (BadInput, SystemdError) as exc:
        print(f"ct200-host-chain: {exc}", file=sys.stderr)
        # This boot's report says why there is none: the last boot's file must not stand.
        why = "bad input" if isinstance(exc, BadInput) else "systemd could not be asked"
        failed = Chain((), "", (), None, machine="host", boot_id=boot_id(), reason=f"{why}: {exc}")
        if args.textfile and not _write(args.textfile, failed):
            return Exit.BROKE
        return Exit.BAD_INPUT if isinstance(exc, BadInput) else Exit.BROKE
    if args.textfile and not _write(args.textfile, chain):
        return Exit.BROKE
    if args.json:
        print(json.dumps(chain.to_dict(), indent=1))
    else:
        print("\n".join(lines(chain)))
        if args.textfile:
            print(f"report: {args.textfile}")
    return Exit.OK if chain.ok else Exit.STOPPED


if __name__ == "__main__":
    sys.exit(main())
