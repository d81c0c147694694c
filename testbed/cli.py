"""``python -m testbed``: parse options, call the harness, print, set the exit code."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click

from testbed import rootfs, ssh, units, wheelhouse
from testbed.config import DEFAULT_MACHINES, MAX_SLOTS, MachineSpec, Settings, Slot
from testbed.errors import TestbedError
from testbed.harness import Harness, Status, slot_lock
from testbed.system import Runner, require_root

EXIT_OK = 0
EXIT_ERROR = 1
#: status: the slot has nothing.
EXIT_DOWN = 3
#: status: something is there but not a working testbed (a killed run, a dead machine).
EXIT_LEFTOVER = 4

EPILOG = """\b
Examples:
  python -m testbed up      # pve + ct in slot 0: inventory/testbed/hosts.yml
  ansible-playbook -i inventory/testbed/hosts.yml playbooks/site.yml
  python -m testbed ssh ct -- systemctl is-system-running
  python -m testbed status --all
  python -m testbed reboot  # power-cycle pve, then ct if pve-guests starts it
  python -m testbed down    # idempotent; also clears a killed run's leftovers
Run it from the repository root (testbed/ is not installed: it never ships)."""

slot_option = click.option(
    "--slot",
    type=click.IntRange(0, MAX_SLOTS - 1),
    default=0,
    show_default=True,
    help="Which testbed; tests use 1 and up, so they never touch yours.",
)


def _harness(ctx: click.Context, slot: int) -> Harness:
    obj: dict[str, Any] = ctx.obj
    return Harness(Slot(slot, obj["settings"]), obj["runner"])


def _guard(fn: Callable[[], int]) -> None:
    try:
        code = fn()
    except TestbedError as exc:
        click.echo(f"testbed: error: {exc}", err=True)
        code = EXIT_ERROR
    sys.exit(code)


@click.group(epilog=EPILOG)
@click.option("-v", "--verbose", is_flag=True, help="Print every command the harness runs.")
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """Local testbed: throwaway systemd machines (systemd-nspawn) reached over SSH."""
    try:
        settings = Settings.from_env()
    except TestbedError as exc:
        click.echo(f"testbed: error: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    ctx.obj = {"settings": settings, "runner": Runner(verbose=verbose)}


@main.command()
@slot_option
@click.option(
    "--machine",
    "machines",
    multiple=True,
    metavar="NAME[:ROLE]",
    help="A machine to boot (repeatable); roles: pve, ct, plain. Default: pve:pve and ct:ct.",
)
@click.option("--fresh", is_flag=True, help="Replace a running testbed instead of reusing it.")
@click.option("--rebuild", is_flag=True, help="Rebuild the rootfs cache first.")
@click.option("--no-wheelhouse", is_flag=True, help="Do not build the ct200-tools wheelhouse.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def up(
    ctx: click.Context,
    slot: int,
    machines: tuple[str, ...],
    fresh: bool,
    rebuild: bool,
    no_wheelhouse: bool,
    as_json: bool,
) -> None:
    """Boot the machines (building the rootfs cache on first use) and write the inventory."""

    def run() -> int:
        require_root()
        specs = [MachineSpec.parse(m) for m in (machines or DEFAULT_MACHINES)]
        h = _harness(ctx, slot)
        with slot_lock(h.slot):
            report = h.up(specs, fresh=fresh, with_wheelhouse=not no_wheelhouse, rebuild=rebuild)
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "slot": slot,
                        "reused": report.reused,
                        "inventory": str(report.inventory),
                        "timings": report.timings,
                        "machines": [m.to_json() for m in report.machines],
                    },
                    indent=1,
                )
            )
            return EXIT_OK
        t = report.timings
        built = t.get("rootfs_build", 0.0)
        cache = f"rootfs built in {built:.1f}s" if built else "rootfs cached"
        how = "already up, reused" if report.reused else f"{cache}, boot {t.get('boot', 0):.1f}s"
        click.echo(f"testbed: slot {slot} up in {t['total']:.1f}s ({how})")
        for m in report.machines:
            click.echo(f"  {m.name:<8} {m.role:<6} {m.address}")
        inv = os.path.relpath(report.inventory)
        slot_arg = "" if slot == 0 else f" --slot {slot}"
        click.echo(
            f"inventory: {inv}\n"
            f"run:       ansible-playbook -i {inv} playbooks/site.yml\n"
            f"login:     python -m testbed ssh{slot_arg} NAME"
        )
        return EXIT_OK

    _guard(run)


@main.command()
@slot_option
@click.option("--all", "all_slots", is_flag=True, help="Every slot.")
@click.pass_context
def down(ctx: click.Context, slot: int, all_slots: bool) -> None:
    """Stop the machines and remove namespaces, mounts, cgroups and state. Idempotent."""

    def run() -> int:
        require_root()
        for n in range(MAX_SLOTS) if all_slots else [slot]:
            h = _harness(ctx, n)
            if all_slots and not h.leftovers():
                continue
            with slot_lock(h.slot):
                h.down()
        return EXIT_OK

    _guard(run)


@main.command()
@slot_option
@click.argument("names", nargs=-1, metavar="[NAME]...")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def reboot(ctx: click.Context, slot: int, names: tuple[str, ...], as_json: bool) -> None:
    """Power-cycle machines NAME... (default: all): systemd boots again, /dev/shm starts empty.
    With pve in the cycle, ct is powered on only if pve-guests (stand-in) starts its vmid."""

    def run() -> int:
        require_root()
        h = _harness(ctx, slot)
        with slot_lock(h.slot):
            report = h.reboot(names)
        if as_json:
            click.echo(json.dumps({"slot": slot, **dataclasses.asdict(report)}, indent=1))
            return EXIT_OK
        for name, at in report.powered_on.items():
            took = report.ready[name] - at
            state = report.system_state[name]
            click.echo(f"  {name:<8} booted in {took:.1f}s, systemd {state}")
        for name, why in report.left_off.items():
            click.echo(f"  {name:<8} left powered off: {why}")
        return EXIT_OK

    _guard(run)


def _print_status(st: Status) -> None:
    if st.state == "down":
        click.echo(f"slot {st.slot}: down")
        return
    click.echo(
        f"slot {st.slot}: {st.state}" + (f", inventory {st.inventory}" if st.inventory else "")
    )
    for m in st.machines:
        reach = {True: "ssh ok", False: "ssh FAILED", None: ""}[m.ssh]
        click.echo(
            f"  {m.name:<8} {m.role:<6} {m.address:<15} "
            f"{'running' if m.running else 'STOPPED'} {reach}"
        )
    if st.state == "leftover":
        click.echo("  leftovers: " + ", ".join(st.leftovers))
        click.echo(
            f"  fix: `python -m testbed down --slot {st.slot}`, or `up`, which clears them first"
        )


@main.command()
@slot_option
@click.option("--all", "all_slots", is_flag=True, help="Every slot that has anything.")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.pass_context
def status(ctx: click.Context, slot: int, all_slots: bool, as_json: bool) -> None:
    """Say whether the slot is up, down, or holds leftovers (exit 0, 3 or 4)."""

    def run() -> int:
        require_root()
        slots = range(MAX_SLOTS) if all_slots else [slot]
        found = [_harness(ctx, n).status() for n in slots]
        shown = [s for s in found if s.state != "down"] if all_slots else found
        if as_json:
            click.echo(json.dumps([dataclasses.asdict(s) for s in shown], indent=1))
        else:
            for st in shown or found[:1]:
                _print_status(st)
        states = {s.state for s in found}
        if "leftover" in states:
            return EXIT_LEFTOVER
        return EXIT_OK if "up" in states else EXIT_DOWN

    _guard(run)


@main.command(context_settings={"ignore_unknown_options": True})
@slot_option
@click.argument("name")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def ssh_cmd(ctx: click.Context, slot: int, name: str, command: tuple[str, ...]) -> None:
    """Log in to machine NAME, or run COMMAND there (after `--`); exits with its status."""

    def run() -> int:
        h = _harness(ctx, slot)
        found = {m.name: m for m in h.machines()}
        if name not in found:
            raise TestbedError(
                f"no machine {name!r} in slot {slot}"
                + (f" (there are: {', '.join(found)})" if found else " (the slot is down)"),
                fix="`python -m testbed up` first" if not found else "",
            )
        # As ssh: the words joined by spaces, run by the remote shell (`-- 'a; b'` runs both).
        tty = None if not command else False
        args = ssh.argv(h.slot, found[name].address, command, tty=tty, as_ssh=True)
        sys.stdout.flush()
        os.execvp(args[0], args)  # noqa: S606 (argv list, replaces this process)

    _guard(run)


ssh_cmd.name = "ssh"


@main.command()
@click.option("--rebuild", is_flag=True, help="Build it again even when cached.")
@click.pass_context
def build(ctx: click.Context, rebuild: bool) -> None:
    """Build the rootfs cache (and the wheelhouse) without booting anything."""

    def run() -> int:
        require_root()
        obj: dict[str, Any] = ctx.obj
        path, seconds = rootfs.ensure(obj["settings"], obj["runner"], rebuild=rebuild)
        click.echo(f"rootfs: {path} ({f'built in {seconds:.1f}s' if seconds else 'cached'})")
        wh, seconds = wheelhouse.build(obj["settings"], obj["runner"])
        click.echo(f"wheelhouse: {wh} ({seconds:.1f}s)")
        return EXIT_OK

    _guard(run)


@main.command("verify-units")
@click.argument("paths", nargs=-1, type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--spec",
    "specs",
    multiple=True,
    type=click.Path(exists=True),
    help="Also render the unit of every server of this site spec (YAML file or inventory dir; "
    "enabled or not) and verify it in a scratch root with stand-ins for its programs.",
)
@click.pass_context
def verify_units(ctx: click.Context, paths: tuple[str, ...], specs: tuple[str, ...]) -> None:
    """Run `systemd-analyze verify` on PATHS (default: the repository's static unit files),
    failing on any stderr output, not only on a non-zero exit."""

    def run() -> int:
        obj: dict[str, Any] = ctx.obj
        runner: Runner = obj["runner"]
        found = list(paths) or units.repo_units(obj["settings"].repo)

        def local(argv: Sequence[str]) -> tuple[int, str, str]:
            proc = runner.run(argv, check=False)
            return proc.returncode, proc.stdout, proc.stderr

        problems = units.verify(found, local)
        rendered = {}
        for spec in specs:
            rendered.update(units.render_servers(spec))
        problems += units.verify_rendered(rendered, local)
        for problem in problems:
            click.echo(f"systemd-analyze verify: {problem}", err=True)
        total = len(found) + len(rendered)
        click.echo(f"verify-units: {total} unit file(s), {len(problems)} with problems")
        return EXIT_ERROR if problems else EXIT_OK

    _guard(run)
