"""ct200-serve: parse options, call ct200_tools.serve, print, exit. No logic of its own."""

from __future__ import annotations

import contextlib
import enum
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import click

from ct200_tools import __version__
from ct200_tools.cli.options import internal_error, spec_option
from ct200_tools.provisioned import installed_spec_fix
from ct200_tools.serve.serving import ServingError
from ct200_tools.serve.systemd import SystemdError
from ct200_tools.spec import ServerSpec, SiteSpec, SpecError

EPILOG = """\b
Examples:
  ct200-serve status                          the serving set and each server's unit
  ct200-serve switch kimi-tp8-eagle3          serve Kimi; stops the Qwen servers on its GPUs
  ct200-serve switch qwen-tp4-ddtree qwen-tp4-dflash --json
  ct200-serve switch kimi-tp8 --exact --dry-run   the plan alone; serve kimi-tp8 and nothing else
  ct200-serve chain                           after a reboot: where the boot chain stopped
  ct200-serve chain --smoke --json            ... and, when it serves, a completion from each
  ct200-serve smoke                           each server of the set: ready, and a completion

\b
Inside each server unit (not for people):
  ct200-serve preflight NAME      ExecStartPre: engine, config, models staged, GPU nodes
  ct200-serve wait-ready NAME     ExecStartPost: GET the readiness path until it answers 200

\b
The serving set lives in /var/lib/ct200/serving.json; without it the spec's enabled flags rule.
Exit codes: 0 done, 1 failed (switch: the previous set serves again), 2 bad input or refused
before any change, 3 the tool itself broke, 4 a switch failed and the previous set does not
serve again (the report names what does not), 5 (chain, smoke) nothing to serve: the serving
set is empty.
"""
SCHEMA_VERSION = 1


class Exit(enum.IntEnum):
    OK = 0
    FAILED = 1
    BAD_INPUT = 2
    INTERNAL = 3
    NOT_RESTORED = 4
    NOTHING = 5


def _load(spec_path: str | None) -> SiteSpec:
    from ct200_tools.spec import find_spec, load_spec  # noqa: PLC0415

    choice = find_spec(spec_path)
    if choice.path is None:
        raise ServingError(choice.describe(), "pass --spec PATH (normally /etc/ct200/site.yml)")
    return load_spec(choice.path)


def _server(site: SiteSpec, name: str) -> ServerSpec:
    from ct200_tools.serve.serving import resolve  # noqa: PLC0415

    return resolve(site, [name])[0]


def _json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print a JSON report.")(fn)


def _smoke_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The smoke test's bounds and prompt: `smoke` and `chain --smoke` take the same."""
    for option in reversed(
        (
            click.option(
                "--timeout",
                type=click.FloatRange(min=0.1),
                default=60.0,
                show_default=True,
                help="Seconds each server may take to answer its readiness path.",
            ),
            click.option(
                "--completion-timeout",
                type=click.FloatRange(min=0.1),
                default=120.0,
                show_default=True,
                help="Seconds each 1-token completion may take.",
            ),
            click.option(
                "--prompt", default="Hello", show_default=True, help="The completion's prompt."
            ),
        )
    ):
        fn = option(fn)
    return fn


def _smoke_lines(got: Sequence[Any]) -> list[str]:
    from ct200_tools.serve import engines  # noqa: PLC0415

    lines = []
    for g in got:
        if g.ok and g.completion is not None:
            lines.append(
                f"ct200-serve smoke {g.name}: ok: ready after {g.ready.seconds:.2f} s, "
                f"{g.completion.tokens} token(s) in {g.completion.duration_s} s"
            )
        else:
            lines.append(f"ct200-serve smoke {g.name}: {g.why}")
            lines.append(f"  fix: journalctl -u {engines.unit_name(g.name)} says why")
    return lines


def _emit(command: str, ok: bool, result: dict[str, object]) -> None:
    envelope = {"schema_version": SCHEMA_VERSION, "command": command, "ok": ok}
    click.echo(json.dumps({**envelope, "result": result, "error": None}, indent=1))


@click.group(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ct200-serve")
def cli() -> None:
    """Switch what this machine serves, and run the checks inside each server's unit."""


@cli.command()
@click.argument("names", nargs=-1, required=True, metavar="NAME...")
@spec_option
@click.option("--exact", is_flag=True, help="Serve NAME... alone: stop every other server.")
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
@_json_option
def switch(
    names: tuple[str, ...], spec_path: str | None, exact: bool, dry_run: bool, as_json: bool
) -> None:
    """Serve NAME...: stop the servers on their GPUs or ports, stage, start, persist."""
    from ct200_tools.serve import switch as sw  # noqa: PLC0415

    site = _load(spec_path)
    with contextlib.nullcontext() if dry_run else sw.locked():
        report = sw.Switch(site).run(names, exact=exact, dry_run=dry_run)
    if as_json:
        _emit("switch", report.ok, report.to_dict())
    else:
        for line in switch_lines(report):
            click.echo(line)
    if report.ok:
        sys.exit(Exit.OK)
    sys.exit(Exit.FAILED if report.restored else Exit.NOT_RESTORED)


def switch_lines(report: Any) -> list[str]:
    target = ", ".join(report.target) or "nothing"
    was = ", ".join(report.previous) or "nothing"
    if report.dry_run:
        head = f"ct200-serve switch (dry run): would serve {target} (now {was})"
    elif report.ok:
        head = f"ct200-serve switch: serving {target} (was {was})"
    else:
        head = f"ct200-serve switch: FAILED at {report.failure}"
    lines = [head]
    for step in report.steps:
        items = ", ".join(
            f"{i.name} {i.seconds:.1f} s" + ("" if i.ok else " FAILED") for i in step.items
        )
        lines.append(f"  {step.name:<8}{step.seconds:8.1f} s  {items or step.detail}")
        if step.items and step.detail and step.name in ("plan", "restore", "drop"):
            lines.append(f"  {'':<8}{'':>10}  {step.detail}")
    lines.append(f"  {'total':<8}{sum(s.seconds for s in report.steps):8.1f} s")
    lines += [f"  warning: {w}" for w in report.warnings]
    if not report.ok:
        state = "the previous set serves again" if report.restored else "NOT all restored"
        lines.append(f"  {state}:")
        lines += [f"    {name}: {what}" for name, what in report.serving.items()]
    else:
        lines += [
            f"    {name}: {what}" for name, what in report.serving.items() if what != "serving"
        ]
    return lines


@cli.command()
@spec_option
@_json_option
def status(spec_path: str | None, as_json: bool) -> None:
    """The serving set, where it comes from, and each server's unit."""
    from ct200_tools.serve import engines, serving  # noqa: PLC0415
    from ct200_tools.serve.chain import listening  # noqa: PLC0415
    from ct200_tools.serve.running import read as read_running  # noqa: PLC0415
    from ct200_tools.serve.systemd import Systemd  # noqa: PLC0415
    from ct200_tools.untrusted import show  # noqa: PLC0415

    site = _load(spec_path)
    chosen = serving.current(site)
    systemd = Systemd()
    units = systemd.show([engines.unit_name(s.name) for s in site.servers])
    # What runs, not only what the files say: a process on an older configuration is named.
    running = read_running(
        systemd,
        {
            engines.unit_name(s.name): (engines.env_path(s.name), engines.config_path(s.name))
            for s in site.servers
        },
    )
    # An active unit whose port refuses connections is not serving (issue 33).
    active = {s.name for s in site.servers if units[engines.unit_name(s.name)].active == "active"}
    ports = {
        s.name: listening(engines.connect_host(s.host), s.port)
        for s in site.servers
        if s.name in active and s.port is not None
    }
    rows = [
        {
            "name": s.name,
            "in_set": s.name in chosen.names,
            "unit": engines.unit_name(s.name),
            "active": units[engines.unit_name(s.name)].active,
            "listening": ports.get(s.name),
            "enabled": units[engines.unit_name(s.name)].file_state,
            "url": engines.base_url(s),
            "served_name": engines.served_name(s),
            "older_configuration": list(running[engines.unit_name(s.name)].reasons),
            "fix": running[engines.unit_name(s.name)].fix
            if running[engines.unit_name(s.name)].stale
            else "",
        }
        for s in site.servers
    ]
    result: dict[str, object] = {
        "serving": list(chosen.names),
        "source": chosen.source,
        "unknown": list(chosen.unknown),
        "servers": rows,
    }
    if as_json:
        _emit("status", True, result)
        return
    source = serving.STATE_PATH if chosen.source == "serving.json" else "the spec's enabled flags"
    click.echo(f"serving set ({source}): {', '.join(chosen.names) or 'none'}")
    for name in chosen.unknown:
        shown = show(name, 80)  # from the file: never raw to the terminal
        click.echo(f"  ignored: {shown} is in {serving.STATE_PATH} but not in the spec")
    for row in rows:
        mark = "*" if row["in_set"] else " "
        click.echo(
            f" {mark} {row['name']:<24} {row['active']:<12} {row['enabled']:<9} {row['url']}"
        )
        got = running[str(row["unit"])]
        if row["listening"] is False:
            click.echo(
                f"     not serving: nothing listens on {row['url']}"
                + ("" if got.stale else f"; `systemctl restart {row['unit']}`")
            )
        if got.stale:
            click.echo(f"     {got.describe()}")


@cli.command()
@spec_option
@_json_option
@click.option(
    "--textfile",
    type=click.Path(dir_okay=False, writable=True),
    help="Also write the chain as a Prometheus textfile here (temp file + rename).",
)
@click.option(
    "--doctor/--no-doctor",
    default=True,
    show_default=True,
    help="Where the chain stopped, also print `ct200-doctor gate` of the server it blocks.",
)
@click.option(
    "--smoke",
    "with_smoke",
    is_flag=True,
    help="When the chain serves, also smoke-test each server of the serving set in this "
    "process, as `ct200-serve smoke` does (the report's smoke; null when not run).",
)
@_smoke_options
def chain(
    spec_path: str | None,
    as_json: bool,
    textfile: str | None,
    doctor: bool,
    with_smoke: bool,
    timeout: float,
    completion_timeout: float,
    prompt: str,
) -> None:
    """Where the boot chain got to: each stage and server of the serving set in start order,
    its state and times since the container started, and the step where it stopped.
    Exit 0 serving (with --smoke: and each server answered), 1 stopped (or still starting), or
    a server did not answer the smoke test, 5 nothing to serve (the serving set is empty). With
    --textfile the file is written whatever fails (the spec unreadable: chain_ok 0 with the
    reason, then exit 2), with this boot's id."""
    import time  # noqa: PLC0415

    from ct200_tools.serve import chain as ch  # noqa: PLC0415
    from ct200_tools.serve import serving  # noqa: PLC0415
    from ct200_tools.serve.smoke import smoke as run_smoke  # noqa: PLC0415
    from ct200_tools.serve.systemd import Systemd  # noqa: PLC0415
    from ct200_tools.spec import find_spec  # noqa: PLC0415

    try:
        site = _load(spec_path)
        chosen = serving.current(site)
        got = ch.read(site, chosen, Systemd())
    except (SpecError, ServingError, SystemdError) as exc:
        # This boot's report says why there is none, whatever failed: the last boot's file must
        # not stand as this one's. Then main() prints the error and exits 2.
        if textfile:
            _write_textfile(textfile, ch.unreadable(_unreadable_reason(exc), ch.boot_id()))
        raise
    if textfile:
        _write_textfile(textfile, got)
    path = find_spec(spec_path).path
    gated, doctor_lines = (
        ch.ask_doctor(site, chosen, got, str(path)) if doctor and path else (None, [])
    )
    # Only a chain that serves is smoke-tested: one that stopped is for recover.yml to repair
    # first, and its servers would fail the test for the reason the chain already names.
    started = time.monotonic()
    smoked = (
        run_smoke(chosen.servers, timeout, completion_timeout, prompt)
        if with_smoke and got.ok
        else None
    )
    smoke_s = time.monotonic() - started
    ok = got.ok and all(g.ok for g in smoked or ())
    # The process, not only the unit: a server of the set on an older configuration than its
    # files (issue 33) is named with the restart that applies them.
    older = _older_configurations(chosen.servers)
    if as_json:
        smoke_report = (
            None
            if smoked is None
            else {
                "seconds": round(smoke_s, 3),
                "ready_seconds": round(sum(g.ready.seconds for g in smoked), 3),
                "servers": [g.to_dict() for g in smoked],
            }
        )
        _emit(
            "chain",
            ok,
            {
                **got.to_dict(),
                "doctor": doctor_lines,
                "smoke": smoke_report,
                "older_configuration": {r.unit: list(r.reasons) for r in older},
            },
        )
    else:
        for line in ch.lines(got, site):
            click.echo(line)
        for r in older:
            click.echo(f"note: {r.describe()}")
        if doctor_lines:
            click.echo(f"the doctor on {gated} (ct200-doctor gate {gated}):")
            for line in doctor_lines:
                click.echo(f"  {line}")
        for line in _smoke_lines(smoked or ()):
            click.echo(line)
        if textfile:
            click.echo(f"report: {textfile}")
    if got.reason == ch.NOTHING_TO_SERVE:
        sys.exit(Exit.NOTHING)
    sys.exit(Exit.OK if ok else Exit.FAILED)


def _older_configurations(servers: Sequence[Any]) -> list[Any]:
    """The servers among these whose process runs an older configuration than its files."""
    from ct200_tools.serve import engines  # noqa: PLC0415
    from ct200_tools.serve.running import read as read_running  # noqa: PLC0415
    from ct200_tools.serve.systemd import Systemd  # noqa: PLC0415

    files = {
        engines.unit_name(s.name): (engines.env_path(s.name), engines.config_path(s.name))
        for s in servers
    }
    return [r for r in read_running(Systemd(), files).values() if r.stale]


@cli.command(hidden=True)
@click.argument("name", metavar="NAME")
def stopped(name: str) -> None:
    """The unit's ExecStopPost: once the engine of server NAME ended after it served, the
    status line says so (it kept "serving: ..." through a crash's restart delay and after
    `systemctl stop`). A start that failed keeps its own reason (preflight, gate, readiness)."""
    import subprocess  # noqa: PLC0415

    from ct200_tools.serve import engines, notify  # noqa: PLC0415

    unit = engines.unit_name(name)
    try:
        was = subprocess.run(
            [engines.SYSTEMCTL, "show", "--property=StatusText", "--value", unit],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        was = ""
    if not was.startswith("serving:"):
        sys.exit(Exit.OK)
    # systemd's own words for how the main process ended (ExecStopPost's environment).
    result = os.environ.get("SERVICE_RESULT", "")
    how = " ".join(x for x in (os.environ.get("EXIT_CODE"), os.environ.get("EXIT_STATUS")) if x)
    if result == "success":
        notify.status(f"not serving: stopped ({how or 'systemctl stop'})")
    else:
        notify.status(
            f"not serving: the engine ended ({result or 'unknown'}: {how or 'unknown'}); systemd "
            f"restarts it after a failure, until its start limit; `journalctl -u {unit}` says why"
        )
    sys.exit(Exit.OK)


def _unreadable_reason(exc: Exception) -> str:
    """The textfile's reason for a chain that could not be read: the first error, escaped."""
    from ct200_tools.untrusted import show  # noqa: PLC0415

    if isinstance(exc, SpecError):
        first = str(exc.issues[0]) if exc.issues else str(exc)
        return f"spec unreadable: {show(first, 300)}"
    if isinstance(exc, ServingError):
        return f"serving set unreadable: {show(exc.message, 300)}"
    return f"systemd could not be asked: {show(str(exc), 300)}"


def _write_textfile(path: str, got: Any) -> None:
    """Write the chain's textfile; a file that cannot be written is exit 3, not main()'s 1 for
    OSError: ct200-boot-report.service counts 1 (stopped) as success, and the last boot's file
    would stand as this one's."""
    import time  # noqa: PLC0415

    from ct200_tools.fsutil import write_atomic  # noqa: PLC0415
    from ct200_tools.serve import chain as ch  # noqa: PLC0415

    try:
        write_atomic(path, ch.textfile(got, time.time()))
    except OSError as exc:
        why = exc.strerror or str(exc)
        _fail(
            [
                f"ct200-serve: cannot write {path}: {why}",
                "  fix: make its directory a writable directory with free space",
            ],
            Exit.INTERNAL,
        )


@cli.command("wait-ready")
@click.argument("name")
@spec_option
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    help="Seconds to wait [default: from the spec, a tenth less than the unit's start timeout].",
)
def wait_ready(name: str, spec_path: str | None, timeout: float | None) -> None:
    """Poll server NAME's readiness path until it answers 200 (the unit's ExecStartPost)."""
    from ct200_tools.serve import engines, notify  # noqa: PLC0415
    from ct200_tools.serve.ready import process_alive  # noqa: PLC0415
    from ct200_tools.serve.ready import wait_ready as poll  # noqa: PLC0415

    site = _load(spec_path)
    server = _server(site, name)
    deadline = timeout if timeout is not None else engines.ready_timeout(site, server)
    main_pid = os.environ.get("MAINPID", "")  # set by systemd for ExecStartPost
    alive = process_alive(int(main_pid)) if main_pid.isdigit() else None
    got = poll(engines.ready_url(server), deadline, alive=alive)
    if got.ok:
        said = f"{name} serves: GET {got.url} answered 200 after {got.seconds:.2f} s"
        click.echo(f"ct200-serve: {said}")
        notify.status(f"serving: GET {got.url} answered 200 after {got.seconds:.2f} s")
        sys.exit(Exit.OK)
    if got.exited:
        said = f"the engine (pid {main_pid}) exited after {got.seconds:.1f} s, before it served"
        click.echo(f"ct200-serve: {name}: {said}")
        click.echo(
            "  fix: its own lines above (journalctl -u " + engines.unit_name(name) + ") say why"
        )
        notify.status(f"not serving: {said}; journalctl -u {engines.unit_name(name)} says why")
        sys.exit(Exit.FAILED)
    index = site.servers.index(server)
    said = f"does not serve after {got.seconds:.0f} s: GET {got.url} last got {got.last}"
    click.echo(f"ct200-serve: {name} {said} ({got.polls} polls)")
    notify.status(f"not serving: {said}")
    click.echo(
        f"  fix: if the model needs longer to load, raise servers[{index}].start_timeout in the "
        f"site spec (now {engines.start_timeout(site, server)} s); otherwise the engine's lines "
        f"above (journalctl -u {engines.unit_name(name)}) say where it is stuck"
    )
    sys.exit(Exit.FAILED)


@cli.command()
@click.argument("names", nargs=-1, metavar="[NAME...]")
@spec_option
@_smoke_options
@_json_option
def smoke(
    names: tuple[str, ...],
    spec_path: str | None,
    timeout: float,
    completion_timeout: float,
    prompt: str,
    as_json: bool,
) -> None:
    """Each server NAME... (default: the serving set) answers its readiness path and a real
    1-token completion through its OpenAI API. Exit 0 all did, 1 one did not, 5 nothing to
    serve (the serving set is empty)."""
    from ct200_tools.serve import serving  # noqa: PLC0415
    from ct200_tools.serve.smoke import smoke as run_smoke  # noqa: PLC0415

    site = _load(spec_path)
    if names:
        servers = serving.resolve(site, list(names))
    else:
        servers = serving.require_known(site, serving.current(site)).servers
    got = run_smoke(servers, timeout, completion_timeout, prompt)
    ok = bool(got) and all(g.ok for g in got)
    if as_json:
        reason = "" if got else "nothing to serve: the serving set is empty"
        _emit("smoke", ok, {"servers": [g.to_dict() for g in got], "reason": reason})
    else:
        for line in _smoke_lines(got):
            click.echo(line)
        if not got:
            click.echo("ct200-serve smoke: nothing to serve: the serving set is empty")
            if site.servers:
                first = site.servers[0].name
                click.echo(
                    f"  fix: choose what this machine serves, e.g. `ct200-serve switch {first}`"
                )
    if not got:
        sys.exit(Exit.NOTHING)
    sys.exit(Exit.OK if ok else Exit.FAILED)


@cli.command()
@click.argument("name")
@spec_option
def preflight(name: str, spec_path: str | None) -> None:
    """Check what server NAME needs before its engine starts (the unit's ExecStartPre)."""
    from ct200_tools.serve import notify  # noqa: PLC0415
    from ct200_tools.serve.preflight import Preflight  # noqa: PLC0415

    site = _load(spec_path)
    server = _server(site, name)
    problems = Preflight(site, server).problems()
    if not problems:
        click.echo(f"ct200-serve preflight {name}: ok")
        notify.status("preflight passed; starting")
        sys.exit(Exit.OK)
    click.echo(f"ct200-serve preflight {name}: {len(problems)} problem(s), not starting")
    for problem in problems:
        for line in problem.lines():
            click.echo(line)
    first = problems[0]
    more = f" (+{len(problems) - 1} more in the journal)" if len(problems) > 1 else ""
    notify.status(f"preflight failed: {first.what}: {first.message}{more}; fix: {first.fix}")
    sys.exit(Exit.FAILED)


def _fail(lines: Sequence[str], code: Exit) -> NoReturn:
    for line in lines:
        click.echo(line, err=True)
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Console entry: every error becomes a message and an exit code, never a traceback."""
    try:
        cli.main(args=list(argv) if argv is not None else None, standalone_mode=False)
    except ServingError as exc:
        _fail(
            [f"ct200-serve: {exc.message}", *([f"  fix: {exc.fix}"] if exc.fix else [])],
            Exit.BAD_INPUT,
        )
    except SpecError as exc:
        fix = installed_spec_fix(exc.source)
        _fail(
            [
                f"ct200-serve: {exc}",
                *(f"  error: {i}" for i in exc.issues),
                *([f"  fix: {fix}"] if fix else []),
            ],
            Exit.BAD_INPUT,
        )
    except SystemdError as exc:
        _fail([f"ct200-serve: {exc}", "  fix: run it where systemd runs, as root"], Exit.BAD_INPUT)
    except OSError as exc:
        where = exc.filename or "a file"
        _fail(
            [f"ct200-serve: {where}: {exc.strerror or exc}", "  fix: run it as root"], Exit.FAILED
        )
    except click.exceptions.Abort:
        _fail(["ct200-serve: interrupted"], Exit.FAILED)
    except click.ClickException as exc:
        exc.show()
        sys.exit(Exit.BAD_INPUT)
    except BrokenPipeError:
        os._exit(Exit.OK)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: no traceback by default
        internal_error("ct200-serve", exc, Exit.INTERNAL)
    sys.exit(Exit.OK)


if __name__ == "__main__":
    main()
