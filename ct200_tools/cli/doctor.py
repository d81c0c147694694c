"""ct200-doctor: parse options, call probes/checks/report, print, exit. No logic of its own."""

from __future__ import annotations

import math
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import click

from ct200_tools import __version__
from ct200_tools.cli.options import internal_error, spec_option
from ct200_tools.doctor.checks import (
    CHECKS,
    SelectionError,
    for_scope,
    run_checks,
    select,
)
from ct200_tools.doctor.checks.base import plural
from ct200_tools.doctor.report import (
    Exit,
    Header,
    exit_code,
    gate_verdict,
    render_gate,
    render_json,
    render_prometheus,
    render_text,
)
from ct200_tools.doctor.scope import Scope, UnknownServerError
from ct200_tools.doctor.warmup import DEFAULT_MODE as DEFAULT_CUDA_MODE
from ct200_tools.doctor.warmup import MODES as CUDA_MODES
from ct200_tools.facts import Facts, FactsFormatError
from ct200_tools.fsutil import write_atomic
from ct200_tools.provisioned import installed_spec_fix
from ct200_tools.serve import notify
from ct200_tools.spec import SiteSpec, SpecError, find_spec, load_spec

EPILOG = """\b
Examples:
  ct200-doctor check                       judge this machine against /etc/ct200/site.yml
  ct200-doctor check --spec inventory/ct200 --only dev --only gpu.cuda_init
  ct200-doctor check --json | jq '.checks[] | select(.status=="fail")'
  ct200-doctor check --textfile /var/lib/node_exporter/textfile/ct200.prom
  ct200-doctor check --cuda-init all        one cuInit over every GPU (the default: one per GPU)
  ct200-doctor snapshot > facts.json       on the sick machine; then anywhere:
  ct200-doctor check --facts facts.json --spec site.yml
  ct200-doctor validate inventory/ct200
  ct200-doctor check --server qwen-tp4-ddtree   one server: its GPUs, models, unit, port
  ct200-doctor check --host pve            also the PVE host, over SSH (keys in known_hosts)
  ct200-doctor check --host local          on the PVE host itself: its checks, no SSH
  ct200-doctor gate qwen-tp4-ddtree        can it start? (its unit's ExecStartPre)
  ct200-doctor fleet fleet.json            the table playbooks/doctor.yml saved, again

\b
Exit codes: 0 clean, 1 warnings (with --strict), 2 failures (a failed check, a check
blocked by a failing one, or nothing checked at all) or bad input, 3 the doctor broke (a
check raised: status "error").
"""


GATE_EPILOG = """\b
Examples:
  ct200-doctor gate qwen-tp4-ddtree                 (ExecStartPre of ct200-server-qwen-tp4-ddtree)
  ct200-doctor gate kimi-tp8 --spec inventory/ct200
"""

QUICK_TIMEOUT_S = 10.0
DEEP_TIMEOUT_S = 3600.0
#: A day: past it a "timeout" is a typo, and inf overflows the thread joins.
MAX_TIMEOUT_S = 86400.0


def cuda_init_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--cuda-init per-gpu|all: how the CUDA probe initialises (see ct200_tools/doctor/warmup.py,
    which reads the same option before the doctor is imported, to start the children first)."""
    return click.option(
        "--cuda-init",
        "cuda_init",
        type=click.Choice(CUDA_MODES),
        help=f"per-gpu: one CUDA child per GPU, side by side, naming a failing GPU; all: one "
        f"cuInit over every GPU [default: {DEFAULT_CUDA_MODE}]. Not with --facts.",
    )(fn)


class DoctorError(Exception):
    """Bad input: printed as one clear message, exit 2."""


def host_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--host HOST and --ssh-config FILE: also read the PVE host (checks host.*, lxc.*)."""
    fn = click.option(
        "--ssh-config",
        "ssh_config",
        type=click.Path(dir_okay=False),
        help="The ssh config that resolves --host, as ssh -F (HostName, User, Port, "
        "IdentityFile, ProxyJump...; what else: docs/host.md) [default: ~/.ssh/config].",
    )(fn)
    return click.option(
        "--host",
        "host",
        metavar="HOST",
        callback=_host_value,
        help="Also read the PVE host and judge it (host.*, lxc.*): over SSH ([USER@]NAME as "
        "for ssh; its key must be in known_hosts), or `local` on the host itself (no SSH). "
        "Needs the spec's pve.vmid.",
    )(fn)


def _host_value(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An empty --host was a silent skip (exit 0), and a control character reached the
    terminal raw: both are usage errors, the value shown escaped."""
    from ct200_tools.untrusted import is_plain, show  # noqa: PLC0415

    if value is None:
        return None
    if not value:
        raise click.BadParameter(
            "empty: give the PVE host's name ([USER@]NAME, as for ssh), or `local` on the host",
            ctx,
            param,
        )
    if not is_plain(value):
        raise click.BadParameter(
            f"'{show(value)}' holds a control character: give the host's name as for ssh",
            ctx,
            param,
        )
    return value


def _check_host_args(host: str, spec: SiteSpec | None, source: str | None) -> SiteSpec:
    """--host needs the spec's pve.vmid: the container whose config the host checks read."""
    if spec is None:
        raise DoctorError(
            f"--host {host}: the host checks read the container's config named by the site "
            "spec's pve.vmid: pass --spec PATH"
        )
    if spec.pve is None:
        raise DoctorError(
            f"--host {host}: the site spec {source} has no pve.vmid (e.g. `pve: {{vmid: 200}}`; "
            "ct200_site.pve.vmid in an inventory): it names the container whose "
            "/etc/pve/lxc/<vmid>.conf the host checks read"
        )
    if host == "local":
        from ct200_tools.doctor.probes.base import Reader  # noqa: PLC0415
        from ct200_tools.doctor.probes.kernel import detect_container  # noqa: PLC0415

        # An LXC container is the PVE host's guest, never the host: its /etc/pve is not there.
        if detect_container(Reader()) == "lxc":
            raise DoctorError(
                "--host local reads this machine as the PVE host, but this is an LXC container "
                "(a guest of the host): give the host's name, e.g. --host pve"
            )
    return spec


def _start_host(host: str, spec: SiteSpec, ssh_config: str | None, timeout: float) -> Any:
    from ct200_tools.doctor.probes import host as host_probe  # noqa: PLC0415
    from ct200_tools.doctor.probes.base import SshError  # noqa: PLC0415

    try:
        return host_probe.start(host, spec, ssh_config, min(timeout, QUICK_TIMEOUT_S))
    except SshError as exc:
        raise DoctorError(str(exc)) from None


def _load_spec(path: str | None) -> tuple[SiteSpec | None, str | None]:
    """The spec find_spec chooses; without one, says so once (the checks that need it skip)."""
    choice = find_spec(path)
    if choice.path is None:
        click.echo(
            f"ct200-doctor: {choice.describe()}; the checks that need one are skipped "
            "(pass --spec PATH)",
            err=True,
        )
        return None, None
    return load_spec(choice.path), choice.path


def _split(values: Sequence[str]) -> list[str]:
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def _seconds(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """A probe timeout is finite, above 0 and at most a day: 0, a negative number or nan gave
    a false "driver hung?" finding, and inf an OverflowError."""
    if value is not None and not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S):
        raise click.BadParameter(
            f"{value:g} is not a timeout: give seconds above 0 and at most {MAX_TIMEOUT_S:g}",
            ctx,
            param,
        )
    return value


class OnceCommand(click.Command):
    """A command whose single-value options may be given once: click silently keeps the last of
    `--facts a --facts b`, hiding which snapshot or spec was judged."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        _, _, order = self.make_parser(ctx).parse_args(args=list(args))
        seen: dict[str, int] = {}
        for param in order:
            if isinstance(param, click.Option) and not (param.multiple or param.is_flag):
                seen[param.opts[0]] = seen.get(param.opts[0], 0) + 1
        repeated = [name for name, n in seen.items() if n > 1]
        if repeated:
            raise click.UsageError(
                f"{repeated[0]} given {seen[repeated[0]]} times: give it once", ctx
            )
        return super().parse_args(ctx, args)


def _emit(text: str) -> None:
    """Print the report. A reader that leaves early (`| head`) or a closed stdout changes
    nothing: the exit code stays the verdict's."""
    if sys.stdout is None:
        click.echo("ct200-doctor: standard output is closed: the report is not shown", err=True)
        return
    try:
        click.echo(text, nl=False)
        sys.stdout.flush()
    except BrokenPipeError:
        # Later flushes (at exit) must not raise again: the rest goes nowhere.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _check_textfile(path: Path) -> None:
    """Refuse, before anything is probed, a textfile the run could not write: a missing
    directory (a typo in the node_exporter path must not silently create a tree nobody reads),
    a directory as the target, or a directory this process cannot create files in (/proc,
    /sys, read-only or foreign ones)."""
    where = f"--textfile {path}"
    parent = path.parent
    if path.is_dir():
        raise DoctorError(f"{where} is a directory: name the file, e.g. {path / 'ct200.prom'}")
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        raise DoctorError(
            f"{where}: {parent} {what}; the doctor creates no directories (node_exporter's "
            "textfile directory must exist already: a typo?)"
        )
    try:
        fd, probe = tempfile.mkstemp(prefix=".ct200-doctor-", dir=parent)
    except OSError as exc:
        kernel = str(parent.resolve()).split("/")[1:2] in (["proc"], ["sys"])
        raise DoctorError(
            f"{where}: cannot create files in {parent}"
            + (" (a kernel filesystem)" if kernel else f" ({exc.strerror})")
        ) from None
    os.close(fd)
    os.unlink(probe)


def _write_textfile(path: Path, text: str) -> None:
    try:
        write_atomic(str(path), text)
    except OSError as exc:
        raise DoctorError(f"--textfile {path}: cannot write it: {exc.strerror or exc}") from None


@click.group(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ct200-doctor")
def cli() -> None:
    """Verify in seconds that a CT200 GPU machine is ready to serve and benchmark."""


@cli.command(cls=OnceCommand)
@spec_option
@click.option(
    "--facts",
    "facts_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Judge a saved snapshot instead of probing this machine.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the versioned JSON report.")
@click.option("--prometheus", is_flag=True, help="Print a node_exporter textfile.")
@click.option(
    "--textfile",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the node_exporter textfile here (atomically; the directory must exist).",
)
@click.option("--only", multiple=True, metavar="ID", help="Run only these checks (id or prefix).")
@click.option("--skip", multiple=True, metavar="ID", help="Skip these checks (id or prefix).")
@click.option(
    "--server",
    metavar="NAME",
    help="Judge one server: its GPUs, model and draft, unit and port; checks about GPUs are "
    "left out for a server without GPUs. Needs the spec.",
)
@click.option("-v", "--verbose", is_flag=True, help="Show evidence for every check.")
@click.option("--strict", is_flag=True, help="Exit 1 when there are warnings.")
@click.option(
    "--deep",
    is_flag=True,
    help="Re-hash every staged model against its manifest (seconds per GB; the probe "
    "timeout becomes 1 h unless --timeout is given). Not with --facts.",
)
@click.option(
    "--timeout",
    type=float,
    callback=_seconds,
    help=f"Seconds each probe (and cuInit) may take [default: {QUICK_TIMEOUT_S:g}]. "
    "Not with --facts.",
)
@cuda_init_option
@host_options
def check(
    spec_path: str | None,
    facts_path: Path | None,
    as_json: bool,
    prometheus: bool,
    textfile: Path | None,
    only: tuple[str, ...],
    skip: tuple[str, ...],
    server: str | None,
    verbose: bool,
    strict: bool,
    deep: bool,
    timeout: float | None,
    cuda_init: str | None,
    host: str | None,
    ssh_config: str | None,
) -> None:
    """Probe this machine (or read --facts) and judge it against the site spec; with --host,
    the PVE host too."""
    if as_json and prometheus:
        raise click.UsageError(
            "--json and --prometheus both choose what is printed: give one "
            "(--textfile writes the Prometheus textfile beside either)"
        )
    if facts_path is not None and (deep or timeout is not None or cuda_init is not None):
        flag, arg = (
            ("--deep", "")
            if deep
            else ("--timeout", " SECONDS")
            if timeout is not None
            else ("--cuda-init", f" {cuda_init}")
        )
        raise click.UsageError(
            f"{flag} changes how this machine is probed, and --facts probes nothing: take "
            f"the snapshot with `ct200-doctor snapshot {flag}{arg}`"
        )
    if facts_path is not None and host is not None:
        raise click.UsageError(
            "--host reads the host now, and --facts probes nothing: take the snapshot with "
            f"`ct200-doctor snapshot --host {host}`"
        )
    try:
        selected = select(_split(only), _split(skip))
    except SelectionError as exc:
        raise DoctorError(str(exc)) from None
    if textfile is not None:
        _check_textfile(textfile)
    spec, source = _load_spec(spec_path)
    if host is not None:
        spec = _check_host_args(host, spec, source)
    scope = _scope(spec, server) if server is not None else None
    if scope is not None:
        selected = for_scope(selected, scope)
        if not selected:
            raise DoctorError(
                f"server {server} has no GPUs, and the checks selected are all about GPUs: "
                "nothing to check"
            )
    facts = (
        _read_facts(facts_path)
        if facts_path
        else _probe(spec, timeout, deep, scope, cuda_init=cuda_init, host=host, ssh=ssh_config)
    )
    findings = run_checks(facts, spec, selected, scope)
    code = exit_code(findings, strict)
    head = Header(facts, source, tuple(str(w) for w in spec.warnings) if spec else ())
    if textfile is not None:
        _write_textfile(textfile, render_prometheus(findings, head, code))
    if as_json:
        _emit(render_json(findings, head, code))
    elif prometheus:
        _emit(render_prometheus(findings, head, code))
    else:
        _emit(render_text(findings, head, verbose, color=bool(sys.stdout and sys.stdout.isatty())))
    _exit(code)


def _scope(spec: SiteSpec | None, name: str) -> Scope:
    if spec is None:
        raise DoctorError(f"server {name}: the servers are in the site spec; pass --spec PATH")
    try:
        return Scope.of(spec, name)
    except UnknownServerError as exc:
        raise DoctorError(str(exc)) from None


@cli.command(cls=OnceCommand, epilog=GATE_EPILOG)
@click.argument("name", metavar="NAME")
@spec_option
@click.option(
    "--timeout",
    type=float,
    callback=_seconds,
    help=f"Seconds each probe (and cuInit) may take [default: {QUICK_TIMEOUT_S:g}].",
)
def gate(name: str, spec_path: str | None, timeout: float | None) -> None:
    """Can server NAME start? Its unit's ExecStartPre: exit 0 go, 2 no-go, 3 the doctor broke.

    Runs, through the same checks as `check`, what decides whether the server can start:
    device nodes and CUDA on its GPUs only (cuInit with CUDA_VISIBLE_DEVICES set to them), its
    model and draft staged, its engine installed and reading the model's format, its port free
    (or held by its own unit). A server without GPUs gets the checks that apply to it. Prints the
    verdict with the root cause and its fix first and last (the journal's tail)."""
    from ct200_tools.doctor.gate import run_gate  # noqa: PLC0415

    spec, source = _load_spec(spec_path)
    if spec is None:
        raise DoctorError(f"gate {name}: the servers are in the site spec; pass --spec PATH")
    try:
        result = run_gate(spec, name, timeout if timeout is not None else QUICK_TIMEOUT_S)
    except UnknownServerError as exc:
        raise DoctorError(f"gate: {exc}") from None
    findings, code = list(result.findings), result.code
    head = Header(result.facts, source, tuple(str(w) for w in spec.warnings))
    _emit(render_gate(findings, head, name, code))
    # The unit's status line says the verdict (its ExecStartPre; NotifyAccess=exec), so
    # `systemctl status` of a server the gate stopped does not keep "preflight passed; starting".
    notify.status(gate_verdict(findings, name, code).removeprefix("ct200-doctor "))
    _exit(code)


@cli.command(cls=OnceCommand)
@spec_option
@click.option("--deep", is_flag=True, help="Re-hash staged models (as check --deep).")
@click.option(
    "--timeout",
    type=float,
    callback=_seconds,
    help=f"Seconds per probe [default: {QUICK_TIMEOUT_S:g}].",
)
@cuda_init_option
@host_options
def snapshot(
    spec_path: str | None,
    deep: bool,
    timeout: float | None,
    cuda_init: str | None,
    host: str | None,
    ssh_config: str | None,
) -> None:
    """Print this machine's facts as JSON (with --host, the PVE host's too), to judge elsewhere
    with `check --facts`."""
    from ct200_tools.facts import dumps  # noqa: PLC0415

    spec, source = _load_spec(spec_path)
    if host is not None:
        spec = _check_host_args(host, spec, source)
    _emit(dumps(_probe(spec, timeout, deep, cuda_init=cuda_init, host=host, ssh=ssh_config)))
    _exit(Exit.OK)


@cli.command()
@click.argument("spec_path", required=False, metavar="[SPEC]")
def validate(spec_path: str | None) -> None:
    """Validate a site spec (YAML file or inventory dir); exit 0 valid, 2 invalid.

    SPEC defaults to $CT200_SPEC if set, else /etc/ct200/site.yml.
    """
    choice = find_spec(spec_path)
    if choice.path is None:
        raise DoctorError(f"nothing to validate: {choice.describe()}; give SPEC")
    spec = load_spec(choice.path)
    for w in spec.warnings:
        click.echo(f"warning: {w}", err=True)
    click.echo(
        f"{choice.describe()}: valid ({plural(spec.gpus.count, 'GPU')}, "
        f"{plural(len(spec.models), 'model')}, {plural(len(spec.servers), 'server')}, "
        f"{len(spec.enabled_servers)} enabled)"
    )


@cli.command(cls=OnceCommand)
@click.argument("path", metavar="FILE", type=click.Path(dir_okay=False, path_type=Path))
def fleet(path: Path) -> None:
    """Show the fleet table again from the FILE playbooks/doctor.yml saved
    (-e ct200_doctor_fleet_file=FILE); exit as that run: 0 ok, 2 a host failed, was
    unreachable or lacks the doctor, 3 a host's doctor broke."""
    from ct200_tools.doctor.fleet import (  # noqa: PLC0415
        FILE_FIX,
        MAX_FILE_BYTES,
        FleetFormatError,
        exit_code,
        from_document,
        render_table,
    )
    from ct200_tools.untrusted import UntrustedInputError, load_json, show  # noqa: PLC0415

    try:
        results = from_document(load_json(path, "fleet file", MAX_FILE_BYTES, FILE_FIX))
    except UntrustedInputError as exc:
        raise DoctorError(f"{exc.message}\n  fix: {exc.fix}") from None
    except FleetFormatError as exc:
        raise DoctorError(f"fleet file {show(path)}: {exc}\n  fix: {FILE_FIX}") from None
    _emit(render_table(results))
    _exit(exit_code(results))


@cli.command("list-checks")
@click.option("--json", "as_json", is_flag=True)
def list_checks(as_json: bool) -> None:
    """List every check id in the order they run."""
    import json  # noqa: PLC0415

    if as_json:
        rows = [
            {
                "id": c.id,
                "title": c.title,
                "severity": c.severity,
                "needs_spec": c.needs_spec,
                "needs": list(c.needs),
                "tags": list(c.tags),
            }
            for c in CHECKS
        ]
        _emit(json.dumps(rows, indent=2) + "\n")
        return
    width = max(len(c.id) for c in CHECKS)
    _emit("".join(f"{c.id:<{width}}  {c.severity:<7}  {c.title}\n" for c in CHECKS))


def _probe(
    spec: SiteSpec | None,
    timeout: float | None,
    deep: bool = False,
    scope: Scope | None = None,
    only: set[str] | None = None,
    cuda_init: str | None = None,
    host: str | None = None,
    ssh: str | None = None,
) -> Facts:
    """This machine's facts; with host, the host's read beside them (its connection first:
    an unknown host key stops the run before anything is probed)."""
    from ct200_tools.doctor.probes import collect  # noqa: PLC0415

    if timeout is None:
        timeout = DEEP_TIMEOUT_S if deep else QUICK_TIMEOUT_S
    reading = _start_host(host, spec, ssh, timeout) if host and spec else None
    facts = collect(
        spec=spec,
        timeout_s=timeout,
        deep=deep,
        scope=scope,
        only=only,
        cuda_mode=cuda_init or DEFAULT_CUDA_MODE,
    )
    if reading is None:
        return facts
    from ct200_tools.doctor.probes import host as host_probe  # noqa: PLC0415
    from ct200_tools.doctor.probes.base import SshError  # noqa: PLC0415

    try:
        return host_probe.finish(reading, facts, timeout)
    except SshError as exc:
        raise DoctorError(str(exc)) from None


def _read_facts(path: Path) -> Facts:
    from ct200_tools.facts import read_file  # noqa: PLC0415
    from ct200_tools.untrusted import UntrustedInputError, show  # noqa: PLC0415

    try:
        return read_file(path)
    except UntrustedInputError as exc:
        why = exc.reason.removeprefix("is ")
        raise DoctorError(f"cannot read facts file {show(path)}: {why}\n  fix: {exc.fix}") from None
    except FactsFormatError as exc:
        raise DoctorError(f"facts file {path}: {exc}") from None


def _exit(code: int) -> NoReturn:
    from ct200_tools.doctor.probes import stuck_probes  # noqa: PLC0415

    if stuck_probes():
        # A probe thread is stuck in a driver call; interpreter shutdown could wait on it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(code))
    sys.exit(int(code))


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Console entry: every error becomes a message and an exit code, never a traceback."""
    try:
        cli.main(args=list(argv) if argv is not None else None, standalone_mode=False)
    except SpecError as exc:
        click.echo(f"ct200-doctor: {exc}", err=True)
        for issue in exc.issues:
            click.echo(f"  error: {issue}", err=True)
        fix = installed_spec_fix(exc.source)
        if fix:
            click.echo(f"  fix: {fix}", err=True)
        sys.exit(Exit.FAILURES)
    except DoctorError as exc:
        click.echo(f"ct200-doctor: {exc}", err=True)
        sys.exit(Exit.FAILURES)
    except click.exceptions.Abort:
        click.echo("ct200-doctor: aborted", err=True)
        sys.exit(Exit.DOCTOR_BROKE)
    except click.ClickException as exc:
        exc.show()
        sys.exit(Exit.FAILURES)
    except BrokenPipeError:
        os._exit(Exit.OK)  # `| head` closed our stdout: not an error
    except Exception as exc:  # noqa: BLE001 - the last line of defence: no traceback by default
        internal_error("ct200-doctor", exc, Exit.DOCTOR_BROKE)
    sys.exit(Exit.OK)


if __name__ == "__main__":
    main()
