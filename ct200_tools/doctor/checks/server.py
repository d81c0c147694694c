"""server.*: the inference servers, each judged on its own (the serving set's, or the one a gate
or `check --server NAME` is about): installed and free to start (engine, port, the engine's
compressed-tensors for its model's format), and serving (unit active, port answering, the served
name listed, a 1-token completion, on the GPUs the spec gives it).

The contract with the server units is ct200_tools/serve/engines.py, the one module the units, the
preflight and these checks take it from: server NAME runs as ct200-server-NAME.service; its
interpreter is $VIRTUAL_ENV/bin/python from its env, else /usr/bin/python3; a bare program
is looked up on systemd's fixed search path; its served name, its install and the fixes for
both are its engine module's (ct200_tools/engines/).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ct200_tools.doctor.checks import quant
from ct200_tools.doctor.checks.base import (
    Check,
    CheckFn,
    Context,
    Outcome,
    Remedy,
    Where,
    check,
    failed,
    passed,
    skipped,
)
from ct200_tools.doctor.checks.staged import model_verdict
from ct200_tools.facts import HttpFacts, PortHolder, ProcessGpuFacts, ServerFacts, UnitFacts
from ct200_tools.serve import engines
from ct200_tools.spec import ServerSpec
from ct200_tools.untrusted import show


@dataclass(frozen=True)
class Verdict:
    """One server's part of a check: ok True/False, or None (cannot judge: why, and the check
    whose failure keeps it from judging, if one does)."""

    ok: bool | None
    summary: str
    evidence: tuple[str, ...] = ()
    remedy: Remedy | None = None
    warn_only: bool = False
    caused_by: str | None = None


def _ok(summary: str, *evidence: str) -> Verdict:
    return Verdict(True, summary, evidence)


def _bad(summary: str, remedy: Remedy | None, *evidence: str, warn: bool = False) -> Verdict:
    return Verdict(False, summary, evidence, remedy, warn)


def _cannot(summary: str, caused_by: str | None = None, *evidence: str | None) -> Verdict:
    return Verdict(None, summary, tuple(e for e in evidence if e), caused_by=caused_by)


Judge = Callable[[Context, ServerSpec, ServerFacts], Verdict]


def server_check(id: str, title: str) -> Callable[[CheckFn], Check]:
    """A check that judges each serving server (_each) from the servers' facts, the serving set
    that chose them, and the kernel's view (container or not, for where a fix applies)."""
    return check(id, title, "error", needs=("servers", "serving", "kernel"), needs_spec=True)


def where(ctx: Context) -> Where:
    return "container" if ctx.in_container else "this machine"


def judged(ctx: Context) -> tuple[ServerSpec, ...]:
    return ctx.serving_servers()


def _each(ctx: Context, judge: Judge) -> Outcome:
    """Judge every server; the check fails when one fails, names each server in its summary,
    and carries the first failing server's fix."""
    servers = judged(ctx)
    if not servers:
        if ctx.scope is not None:
            return skipped(f"the spec has no server {ctx.scope.server!r}")
        return skipped("no serving server (none enabled, and no serving set names one)")
    found = ctx.facts.servers
    if found is None:
        return skipped(
            f"servers not probed: {ctx.facts.unreadable.get('servers') or 'no reason recorded'}"
        )
    by_name = {f.name: f for f in found}
    results = []
    for s in servers:
        f = by_name.get(s.name)
        v = _cannot("not probed") if f is None else judge(ctx, s, f)
        results.append((s.name, v))
    # With several servers the summary names the failing ones; the evidence has every one.
    evidence = [f"{name}: {v.summary}" for name, v in results] if len(results) > 1 else []
    evidence += [f"{name}: {e}" for name, v in results for e in v.evidence]
    bad = [(n, v) for n, v in results if v.ok is False and not v.warn_only]
    warn = [(n, v) for n, v in results if v.ok is False and v.warn_only]
    blocked = [(n, v) for n, v in results if v.ok is None and v.caused_by]
    good = [(n, v) for n, v in results if v.ok]
    if bad or warn:
        shown = bad or warn
        return failed(
            "; ".join(f"{n}: {v.summary}" for n, v in shown),
            shown[0][1].remedy,
            *evidence,
            warn_only=not bad,
        )
    if blocked or not good:
        first = (blocked or results)[0]
        return skipped(
            "; ".join(f"{n}: {v.summary}" for n, v in results if v.ok is None),
            *evidence,
            caused_by=first[1].caused_by,
        )
    return passed("; ".join(f"{n}: {v.summary}" for n, v in results), *evidence)


# --- installed and free to start: what a gate checks -----------------------------------------


def _install_engine_fix(ctx: Context, s: ServerSpec, python: str) -> Remedy:
    dist = engines.engine_dist(s) or s.engine
    return Remedy(
        f"install {dist} into the interpreter the unit runs ({python}), or point the server's "
        "env VIRTUAL_ENV at the venv that has it",
        where(ctx),
        f"{python} -m pip install {dist}",
    )


def _missing_fix(ctx: Context, s: ServerSpec, path: str) -> Remedy:
    """The engine's own words for a program that is not there (its module's missing_fix)."""
    what, command = engines.kind(s).missing_fix(s, _where_in_spec(ctx, s), path)
    return Remedy(what, where(ctx), command)


def _where_in_spec(ctx: Context, s: ServerSpec) -> str:
    servers = ctx.spec.servers if ctx.spec is not None else ()
    return f"servers[{servers.index(s)}]" if s in servers else f"server {s.name}"


def _judge_engine(ctx: Context, s: ServerSpec, f: ServerFacts) -> Verdict:
    e = f.engine
    if e is None:
        return _cannot("engine not probed")
    what = "command" if engines.engine_module(s) is None else "interpreter"
    if e.resolved is None:
        return _bad(
            f"{what} {e.path!r} not found on PATH {engines.SYSTEMD_PATH_TEXT} (systemd's search "
            "path for ExecStart=, whatever the server's env sets PATH to)",
            Remedy(
                f"install {e.path}, or give its absolute path in "
                f"{_where_in_spec(ctx, s)}.command[0]",
                where(ctx),
                f"command -v {e.path}",
            ),
        )
    if not e.exists:
        return _bad(f"{what} {e.resolved} does not exist", _missing_fix(ctx, s, e.resolved))
    if not e.executable:
        return _bad(
            f"{what} {e.resolved} is not an executable file",
            Remedy("make it executable", where(ctx), f"chmod +x {e.resolved}"),
        )
    if e.error is not None:
        return _bad(
            f"{what} {e.resolved} cannot read its environment: {e.error}",
            Remedy(f"run it by hand to see why: {e.resolved} -c pass", where(ctx), None),
        )
    if e.module is not None and e.module_found is False:
        return _bad(
            f"{e.module} is not installed for {e.resolved}",
            _install_engine_fix(ctx, s, e.resolved),
        )
    if e.module is not None:
        version = f" {e.dist_version}" if e.dist_version else ""
        return _ok(f"{e.module}{version} installed for {e.resolved}")
    return _ok(f"{e.resolved} is installed")


@server_check("server.engine", "engine installed")
def check_engine(ctx: Context) -> Outcome:
    """The program the server's unit runs is there: for a Python engine (sglang, vllm: its
    module names the package), the interpreter ($VIRTUAL_ENV/bin/python when the server's env
    sets VIRTUAL_ENV, else /usr/bin/python3) exists and finds the engine's package (found
    without importing it); for an engine whose program is the server (command, llamacpp), the
    program (a bare name looked up on systemd's fixed search path, as ExecStart= does, not on
    the server's env PATH) is an executable file. A missing one names the path and how to
    install it (the engine module's own fix), before the unit waits for a server that cannot
    start."""
    return _each(ctx, _judge_engine)


def _holder(h: PortHolder) -> str:
    if h.pid is None:
        return f"a process on {h.address} that cannot be named ({h.why_unknown})"
    unit = f", unit {show(h.unit)}" if h.unit else ""
    # The process name is whatever the process set (prctl): escaped like all text from outside.
    return f"pid {h.pid} ({show(h.name or '?')}{unit}) on {h.address}"


def _judge_port_free(ctx: Context, s: ServerSpec, f: ServerFacts) -> Verdict:
    if f.listeners is None:
        return _cannot("listening sockets not read", None, ctx.unreadable(f"servers.{s.name}"))
    own = engines.unit_name(s.name)
    others = [h for h in f.listeners if h.unit != own]
    if not f.listeners:
        return _ok(f"port {s.port} is free")
    if not others:
        return _ok(f"port {s.port} is held by {own} itself")
    h = others[0]
    if h.pid is None:
        fix = Remedy(
            f"find the holder as root and stop it, or give server {s.name} another port",
            where(ctx),
            f"ss -ltnp 'sport = :{s.port}'",
        )
    elif h.unit and engines.server_of_unit(h.unit) is None and h.unit.endswith(".service"):
        fix = Remedy(
            f"stop {h.unit}, which holds the port, or give server {s.name} another port",
            where(ctx),
            f"systemctl stop {h.unit}",
        )
    elif h.unit and engines.server_of_unit(h.unit):
        fix = Remedy(
            f"stop server {engines.server_of_unit(h.unit)}, which has the same port (a serving "
            f"set with both is invalid), or give server {s.name} another port",
            where(ctx),
            f"systemctl stop {h.unit}",
        )
    else:
        fix = Remedy(
            f"stop pid {h.pid} ({show(h.name or '?')}), which holds the port, or give server "
            f"{s.name} another port",
            where(ctx),
            f"kill {h.pid}",
        )
    return _bad(f"port {s.port} is taken by {_holder(h)}", fix, *(_holder(x) for x in others))


@server_check("server.port_free", "port free for the server")
def check_port_free(ctx: Context) -> Outcome:
    """No other process listens on the server's port (on its host, or on a wildcard address that
    covers it): the port is free, or held by the server's own unit (a running or restarting
    server). A taken port names the holder: pid, process name and systemd unit, read from
    /proc/net/tcp and /proc/PID/fd (naming another user's process needs root)."""
    return _each(ctx, _judge_port_free)


def _judge_quant(ctx: Context, s: ServerSpec, f: ServerFacts) -> Verdict:
    q, e = f.quant, f.engine
    if q is None:
        return _cannot(f"model {s.model} is not in the spec")
    if q.error is not None:
        staged = _model_staged(ctx, s.model)
        return _cannot(q.error, None if staged else "models.staged")
    if not q.exists:
        return _cannot(
            f"{s.model} has no config.json (not a Hugging Face checkpoint): no quantization "
            "format to read"
        )
    if q.quant_method != "compressed-tensors":
        what = q.quant_method or "no quantization_config"
        return _cannot(f"{s.model} is not a compressed-tensors model ({what})")
    formats = list(dict.fromkeys(x for x in (q.format, *q.group_formats) if x))
    shown = ", ".join(formats) or "no format"
    if e is None or not e.exists or e.error is not None or e.module_found is False:
        return _cannot(f"{s.model} is {shown}; the engine is not readable", "server.engine")
    python = e.python
    if python is None:
        return _cannot(f"{s.model} is {shown}; {e.path} is not a Python: no version to read")
    if e.compressed_tensors is None:
        floor = _floor(formats)
        return _bad(
            f"{s.model} is {shown} but compressed-tensors is not installed for {python}",
            _ct_fix(ctx, python, f">={floor}" if floor else ""),
        )
    installed = e.compressed_tensors
    problems = [p for x in formats if (p := quant.format_problem(x, installed))]
    unknown = [x for x in formats if not quant.format_known(x)]
    pin = quant.requirement_spec(e.ct_requirement) if e.ct_requirement else ""
    meets = quant.satisfies(installed, pin) if pin else True
    evidence = [f"{x}: {_since(x)}" for x in formats]
    if e.ct_requirement:
        evidence.append(f"{e.dist} {e.dist_version or '?'} requires {e.ct_requirement}")
    if problems:
        return _bad(f"{s.model}: {'; '.join(problems)}", _ct_fix(ctx, python, pin), *evidence)
    if meets is False:
        return _bad(
            f"{e.dist} {e.dist_version or '?'} requires compressed-tensors{pin} but "
            f"{installed} is installed (module paths moved at 0.13 and 0.15: a newer one breaks "
            "the engine as an older one does)",
            _ct_fix(ctx, python, pin),
            *evidence,
        )
    if unknown:
        return _bad(
            f"{s.model} is {', '.join(unknown)}, a format this doctor does not know (it knows "
            f"compressed-tensors up to {quant.CHECKED_UP_TO}); compressed-tensors {installed}",
            Remedy(
                "check that this compressed-tensors release reads the format",
                where(ctx),
                None,
            ),
            *evidence,
            warn=True,
        )
    pinned = f", as {e.dist} requires ({pin})" if pin else ""
    return _ok(f"compressed-tensors {installed} reads {shown}{pinned}", *evidence)


def _since(fmt: str) -> str:
    support = quant.FORMATS.get(fmt)
    if support is None:
        return "any release" if fmt in quant.PLAIN else "unknown"
    until = f", not from {support.until}" if support.until else ""
    return f"read from compressed-tensors {support.since}{until}"


def _floor(formats: list[str]) -> str | None:
    floors = [quant.FORMATS[x].since for x in formats if x in quant.FORMATS]
    return max(floors, key=quant.version_tuple) if floors else None


def _ct_fix(ctx: Context, python: str, spec: str) -> Remedy:
    return Remedy(
        "install the compressed-tensors the engine was built with and the model's format needs "
        "(the engine's own pin, when it has one)",
        where(ctx),
        f"{python} -m pip install 'compressed-tensors{spec}'",
    )


def _model_staged(ctx: Context, name: str) -> bool:
    found = {m.name: m for m in ctx.facts.models or ()}
    f = found.get(name)
    v = model_verdict(f) if f is not None else None
    return v is not None and v.ok


@check(
    "server.quant",
    "compressed-tensors reads the model's format",
    "error",
    needs=("servers", "serving", "models", "kernel"),
    needs_spec=True,
)
def check_quant(ctx: Context) -> Outcome:
    """For a model quantized with compressed-tensors (config.json quantization_config.quant_method
    "compressed-tensors"), the compressed-tensors installed in the engine's environment (read
    with importlib.metadata by the engine's own interpreter) reads the model's format and every
    config group's format, and meets the engine's own pin (its Requires-Dist). In the incident,
    Kimi K2.6's nvfp4-pack-quantized failed on an older compressed-tensors; module paths moved at
    0.13 (compressors.quantized_compressors.nvfp4_quantized became fp4_quantized) and 0.15
    (compressors.quantized_compressors and config.format gone, compressors.nvfp4 and others
    new), so a newer one than the engine was built with breaks it too. First release
    that reads each format (compressed-tensors' own releases: the wheels on PyPI, file
    src/compressed_tensors/config/base.py, CompressionFormat, and the compressors registered
    under compressed_tensors/compressors/; repository vllm-project/compressed-tensors, formerly
    neuralmagic/compressed-tensors): int-quantized and pack-quantized 0.4.0 (pack: #47);
    marlin-24 0.4.0 (#77) until 0.14, no longer registered in 0.15.0; float-quantized and
    naive-quantized 0.5.0; sparse-24-bitmask 0.9.0; nvfp4-pack-quantized 0.10.0 (#311; 0.9.4
    lacks it); mixed-precision 0.11.0 (#415); mxfp4-pack-quantized 0.13.0 (#502);
    mxfp8-quantized 0.15.0; mxfp6-pack-quantized 0.20.0 (checked up to 0.20.1). A model that is
    not compressed-tensors is not judged (skip)."""
    return _each(ctx, _judge_quant)


# --- serving: what a running server must do ---------------------------------------------------


def unit_state(u: UnitFacts) -> str:
    state = f"{u.active_state or '?'} ({u.sub_state or '?'})"
    if u.result and u.result != "success":
        state += f", result {u.result}"
    return state


def unit_active(u: UnitFacts | None) -> bool:
    return u is not None and u.active_state == "active"


def _judge_unit(ctx: Context, s: ServerSpec, f: ServerFacts) -> Verdict:
    name = engines.unit_name(s.name)
    u = f.unit
    if u is None:
        return _cannot("unit state not read", None, ctx.unreadable("servers.units"))
    restarts = f"{u.n_restarts} restarts" if u.n_restarts else ""
    journal = f"journalctl -u {name} -n 50 --no-pager"
    if u.load_state == "not-found":
        return _bad(
            f"{name} is not installed",
            Remedy(
                "install the server units from the spec (playbooks/site.yml renders them), then "
                "start the serving set",
                where(ctx),
                f"systemctl daemon-reload && systemctl start {name}",
            ),
        )
    if u.active_state == "active":
        if u.sub_state not in (None, "running"):
            return _bad(
                f"{name} is {unit_state(u)}: no main process runs",
                Remedy("read why, then restart it", where(ctx), journal),
                restarts,
            )
        if u.older_configuration:
            # Active, but not what its files say (issue 33: a port changed in the unit while the
            # process kept the old one); the restart applies them.
            reload = any("systemd has not read it" in x for x in u.older_configuration)
            restart = f"systemctl restart {name}"
            return _bad(
                f"{name} is running an older configuration: "
                + "; ".join(show(x, 300) for x in u.older_configuration),
                Remedy(
                    "restart it so it runs what its files say (site.yml restarts a server whose "
                    "files it changed)",
                    where(ctx),
                    f"systemctl daemon-reload && {restart}" if reload else restart,
                ),
                # A failure when its port does not answer: this is why (server.port points here).
                warn=f.connected is not False,
            )
        return _ok(f"{name} is {unit_state(u)}" + (f", {restarts}" if restarts else ""))
    last = f"last exit status {u.exec_main_status}" if u.exec_main_status is not None else ""
    # What the engine said as it exited (escaped: it is the engine's text), under the verdict.
    said_last = tuple(f"journal: {show(line, 400)}" for line in u.journal_tail)
    if u.active_state in ("activating", "reloading") and u.sub_state == "auto-restart":
        # Between a failure and its restart: the engine exited, it does not serve; a failure,
        # the root cause of its port not answering (issue 33: after a crash at boot the doctor
        # blamed the port). Restarting it again does not help: the cause does.
        said = ", ".join(x for x in (f"restart {(u.n_restarts or 0) + 1}", last) if x)
        return _bad(
            f"{name} exited and is restarting after a failure ({said}): it does not serve now",
            Remedy(
                "the engine's last lines say why it exited: fix that (a flag or setting of the "
                "spec: change it and run site.yml, which restarts the server and puts the "
                "previous configuration back if it still does not serve)",
                where(ctx),
                journal,
            ),
            restarts,
            *said_last,
        )
    if u.active_state in ("activating", "reloading"):
        return _bad(
            f"{name} is starting: {unit_state(u)}",
            Remedy("wait for it to serve (a big model loads for minutes)", where(ctx), journal),
            restarts,
            warn=True,
        )
    looped = u.active_state == "failed" and (u.n_restarts or 0) >= engines.START_LIMIT_BURST
    if u.result == "start-limit-hit" or looped:
        # Each start that served reset the count (the unit's last ExecStartPost=): these starts
        # failed in a row. A crash loop, stopped by systemd's start limit.
        said = ", ".join(x for x in (f"{u.n_restarts} restarts" if u.n_restarts else "", last) if x)
        return _bad(
            f"{name} is in a crash loop: its starts failed in a row without serving and systemd "
            f"stopped restarting it ({unit_state(u)}" + (f"; {said}" if said else "") + ")",
            Remedy(
                "its journal says why its starts failed (the engine's last lines, or its start "
                "gate's check): a flag or setting of the spec the engine rejects is changed in "
                "the spec and applied with site.yml (it clears the start limit, restarts the "
                "server and puts the previous configuration back if it does not serve); "
                "anything else, fix it, then clear the start limit and start it",
                where(ctx),
                f"{journal}\nsystemctl reset-failed {name} && systemctl start {name}",
            ),
            *said_last,
        )
    if u.active_state == "failed" or (u.result and u.result != "success"):
        return _bad(
            f"{name} is {unit_state(u)}",
            Remedy(
                "its journal says why it failed (the engine's last lines, or its start gate's "
                "check): a flag or setting of the spec the engine rejects is changed in the spec "
                "and applied with site.yml; anything else, fix it, then start it again",
                where(ctx),
                f"{journal}\nsystemctl reset-failed {name} && systemctl start {name}",
            ),
            restarts,
            *said_last,
        )
    return _bad(
        f"{name} is {unit_state(u)}",
        Remedy("start it", where(ctx), f"systemctl start {name}"),
        restarts,
    )


@server_check("server.unit", "server unit active")
def check_unit(ctx: Context) -> Outcome:
    """The server's systemd unit ct200-server-NAME.service is active (running), as
    `systemctl show` gives it (ActiveState, SubState, Result, NRestarts), and its process runs
    what its files say: an active unit with NeedDaemonReload, whose unit, EnvironmentFile or
    config was written after its process started, or whose process's command line is not its
    unit's ExecStart=, is a warning "running an older configuration" with the restart that
    applies them (a failure when its port does not answer: the cause). A unit still starting
    (activating: its gate, the model load or the readiness poll) is a warning; one between a
    failure and its automatic restart (auto-restart) is a failure, the root cause of its port
    not answering: the engine exited, with the restart number, the last exit status and the
    engine's last journal lines (escaped); a failed one names its result (exit-code, timeout),
    its last journal lines and the journal to read. A unit failed after START_LIMIT_BURST
    restarts (or start-limit-hit) is named a crash loop with the last exit status: each start
    that served reset the count (the unit's last ExecStartPost=), so these starts failed in a
    row. When its gate failed on device nodes, CUDA, a model that is not staged, a missing
    engine or a taken port, that check is the root cause."""
    return _each(ctx, _judge_unit)


def _not_serving(s: ServerSpec, f: ServerFacts) -> Verdict | None:
    """Why a serving check cannot judge this server: its port does not answer."""
    if f.connected is None:
        return _cannot("not tried")
    if not f.connected:
        return _cannot(f"port {s.port} does not answer", "server.port")
    return None


def _judge_port(ctx: Context, s: ServerSpec, f: ServerFacts) -> Verdict:
    target = f"{engines.connect_host(s.host)}:{s.port}"
    if f.connected is None:
        return _cannot("not tried")
    if f.connected:
        return _ok(f"{target} accepts connections")
    name = engines.unit_name(s.name)
    if unit_active(f.unit):
        # Its process runs and does not listen there: `systemctl start` would do nothing.
        return _bad(
            f"{target}: {f.connect_error or 'no connection'}, while {name} is active",
            Remedy(
                "restart it on its unit's configuration; if it still does not listen, its "
                f"journal (journalctl -u {name}) says why",
                where(ctx),
                f"systemctl restart {name}",
            ),
        )
    return _bad(
        f"{target}: {f.connect_error or 'no connection'}",
        Remedy(f"start the server ({name})", where(ctx), f"systemctl start {name}"),
    )


@server_check("server.port", "server port answers")
def check_port(ctx: Context) -> Outcome:
    """A TCP connection to the server's host and port (a wildcard host means this machine)
    opens within 1 s. When the unit is not active, server.unit is the root cause, and so it is
    when its process runs an older configuration (a port changed in the unit); an active unit's
    fix is the restart, since `systemctl start` does nothing to a running unit."""
    return _each(ctx, _judge_port)


def _http_failure(h: HttpFacts) -> str:
    # h.error is our own sentence (the client escaped what the server said in it); the body is
    # the server's exact text, escaped here where it is shown.
    if h.error is not None and h.status is None:
        return f"{h.url}: {h.error}"
    body = f": {show(h.body, 300)}" if h.body else ""
    what = f"HTTP {h.status}" + (f", {h.error}" if h.error else "")
    return f"{h.url}: {what}{body}"


def _judge_models(ctx: Context, s: ServerSpec, f: ServerFacts) -> Verdict:
    blocked = _not_serving(s, f)
    if blocked is not None:
        return blocked
    h, want = f.models, engines.served_name(s)
    if h is None:
        return _cannot("not asked")
    journal = f"journalctl -u {engines.unit_name(s.name)} -n 50 --no-pager"
    if h.status == 503:
        return _bad(
            f"still loading ({_http_failure(h)})",
            Remedy("wait for the model to load", where(ctx), journal),
            warn=True,
        )
    if h.served is None:
        return _bad(_http_failure(h), Remedy("read the server's log", where(ctx), journal))
    listed = ", ".join(show(name, 100) for name in h.served[:20]) or "nothing"
    if len(h.served) > 20:
        listed += f" (+{len(h.served) - 20} more)"
    if want not in h.served:
        return _bad(
            f"/v1/models lists {listed}, not {want!r}",
            Remedy(
                f"serve it as {want!r}: {engines.kind(s).served_name_fix(s, want)}",
                where(ctx),
                None,
            ),
        )
    return _ok(f"/v1/models lists {want!r}")


@server_check("server.models", "server lists its served name")
def check_models(ctx: Context) -> Outcome:
    """GET /v1/models answers 200 within 2 s and lists the server's served name. The served
    name is the engine module's (ct200_tools.engines): args.served-model-name for SGLang and
    vLLM (the unit passes it as --served-model-name), the value of --served-model-name or
    --alias in the command of engine command, else the spec's model name (llama-server's
    --alias). 503 (still loading) is a warning."""
    return _each(ctx, _judge_models)


def _judge_generate(ctx: Context, s: ServerSpec, f: ServerFacts) -> Verdict:
    blocked = _not_serving(s, f)
    if blocked is not None:
        return blocked
    h = f.generation
    if h is None:
        return _cannot("not tried: /v1/models did not answer 200", "server.models")
    journal = f"journalctl -u {engines.unit_name(s.name)} -n 50 --no-pager"
    if h.status == 200 and h.error is None:
        took = f" in {h.duration_s:.2f} s" if h.duration_s is not None else ""
        return _ok(f"1-token completion{took}")
    return _bad(
        _http_failure(h),
        Remedy("read the server's log for the failed request", where(ctx), journal),
    )


@server_check("server.generate", "server completes a token")
def check_generate(ctx: Context) -> Outcome:
    """POST /v1/completions with the served name, max_tokens 1 and temperature 0 answers 200
    with a choice within 5 s: the model is loaded and the GPUs compute. A server that lists
    its model but cannot generate (a CUDA error after load, a broken NCCL group) fails here."""
    return _each(ctx, _judge_generate)


def _indices(visible: str) -> tuple[int, ...] | None:
    parts = [p.strip() for p in visible.split(",") if p.strip()]
    if not all(p.isdigit() for p in parts):
        return None  # UUIDs or MIG names: not comparable with indices here
    return tuple(int(p) for p in parts)


def _judge_gpus(ctx: Context, s: ServerSpec, f: ServerFacts) -> Verdict:
    want = tuple(s.gpus)
    g = f.gpus
    if g is None:
        if f.unit is None:
            return _cannot("the unit's processes are not known (its state was not read)")
        if not unit_active(f.unit):
            return _cannot(f"its unit is {unit_state(f.unit)}", "server.unit")
        return _cannot("the unit has no main process")
    shown = ",".join(str(i) for i in want) or "none"
    fix = Remedy(
        f"restart it from the unit, which sets CUDA_VISIBLE_DEVICES={','.join(map(str, want))} "
        "from the spec's gpus",
        where(ctx),
        f"systemctl restart {engines.unit_name(s.name)}",
    )
    mine = set(g.pids)
    if g.nvml_gpus is not None and (mine & set(g.nvml_pids) or not want):
        got = tuple(g.nvml_gpus)
        if set(got) == set(want):
            return _ok(f"on GPUs {shown} (NVML)")
        return _bad(f"on GPUs {','.join(map(str, got)) or 'none'} (NVML), spec: {shown}", fix)
    evidence = []
    if g.nvml_gpus is not None and g.nvml_pids:
        evidence.append(
            "NVML lists pids "
            + ", ".join(map(str, g.nvml_pids))
            + ", none of the unit's: another PID namespace (a container); judged from "
            "CUDA_VISIBLE_DEVICES"
        )
    elif g.why_no_nvml:
        evidence.append(g.why_no_nvml)
    return _by_environ(g, want, fix, evidence)


def _by_environ(
    g: ProcessGpuFacts, want: tuple[int, ...], fix: Remedy, evidence: list[str]
) -> Verdict:
    """The GPUs from CUDA_VISIBLE_DEVICES in the processes' environment."""
    shown = ",".join(str(i) for i in want) or "none"
    if not g.visible:
        return _cannot(
            f"neither NVML nor the processes' environment could be read ({g.why_no_environ})",
            None,
            *evidence,
        )
    values = set(g.visible.values())
    if len(values) > 1:
        return _bad(
            "its processes see different GPUs: "
            + ", ".join(f"pid {p}: {v!r}" for p, v in sorted(g.visible.items())),
            fix,
            *evidence,
        )
    (value,) = values
    if value is None:
        if not want:
            return _ok("CUDA_VISIBLE_DEVICES unset, and the spec gives it no GPU", *evidence)
        return _bad(
            f"CUDA_VISIBLE_DEVICES is not set: it sees every GPU, spec: {shown}", fix, *evidence
        )
    got_idx = _indices(value)
    if got_idx is None:
        return _cannot(f"CUDA_VISIBLE_DEVICES={value!r}: not GPU indices", None, *evidence)
    if set(got_idx) == set(want):
        return _ok(f"CUDA_VISIBLE_DEVICES={value!r} as the spec gives", *evidence)
    return _bad(f"CUDA_VISIBLE_DEVICES={value!r}, spec: {shown}", fix, *evidence)


@server_check("server.gpus", "server on its GPUs")
def check_gpus(ctx: Context) -> Outcome:
    """The running server's processes (its unit's cgroup) use exactly the spec's GPUs: NVML's
    running compute processes per GPU when NVML lists any of them; else (NVML unavailable, or a
    container whose PIDs NVML does not know) CUDA_VISIBLE_DEVICES in /proc/PID/environ of each
    process. GPU indices are NVML's (PCI bus order, as nvidia-smi), which the unit sets
    CUDA_VISIBLE_DEVICES from. Skips with the reason when neither can be read."""
    return _each(ctx, _judge_gpus)


# --- for the root-cause rules (checks/causes.py) ----------------------------------------------


def failing(ctx: Context, judge: Judge) -> list[tuple[ServerSpec, ServerFacts]]:
    """The servers whose part of a check fails (warnings included)."""
    found = {f.name: f for f in ctx.facts.servers or ()}
    out = []
    for s in judged(ctx) if ctx.spec is not None else ():
        f = found.get(s.name)
        if f is not None and judge(ctx, s, f).ok is False:
            out.append((s, f))
    return out


def all_failing(
    judge: Judge, cond: Callable[[Context, ServerSpec, ServerFacts], bool]
) -> Callable[[Context], bool]:
    """A rule's condition: every server failing `judge` meets `cond` (and one fails)."""

    def holds(ctx: Context) -> bool:
        bad = failing(ctx, judge)
        return bool(bad) and all(cond(ctx, s, f) for s, f in bad)

    return holds


def unit_down(ctx: Context, s: ServerSpec, f: ServerFacts) -> bool:
    return f.unit is not None and f.unit.active_state != "active"


def unit_stale(ctx: Context, s: ServerSpec, f: ServerFacts) -> bool:
    """Active, and its process runs an older configuration than its files."""
    return unit_active(f.unit) and bool(f.unit and f.unit.older_configuration)


def gate_failed(ctx: Context, s: ServerSpec, f: ServerFacts) -> bool:
    """The unit is down after trying to start (failed, or inactive with a failed result): what
    a no-go gate leaves."""
    return f.unit is not None and (
        f.unit.active_state == "failed" or (f.unit.result not in (None, "success"))
    )


def has_gpus(ctx: Context, s: ServerSpec, f: ServerFacts) -> bool:
    return bool(s.gpus)


def model_not_staged(ctx: Context, s: ServerSpec, f: ServerFacts) -> bool:
    return any(not _model_staged(ctx, m.name) for m in ctx.site.needed_models([s]))


def engine_bad(ctx: Context, s: ServerSpec, f: ServerFacts) -> bool:
    return _judge_engine(ctx, s, f).ok is False


def port_taken(ctx: Context, s: ServerSpec, f: ServerFacts) -> bool:
    return _judge_port_free(ctx, s, f).ok is False


def both(
    *conds: Callable[[Context, ServerSpec, ServerFacts], bool],
) -> Callable[[Context, ServerSpec, ServerFacts], bool]:
    return lambda ctx, s, f: all(c(ctx, s, f) for c in conds)


JUDGES: dict[str, Judge] = {
    "server.engine": _judge_engine,
    "server.port_free": _judge_port_free,
    "server.quant": _judge_quant,
    "server.unit": _judge_unit,
    "server.port": _judge_port,
    "server.models": _judge_models,
    "server.generate": _judge_generate,
    "server.gpus": _judge_gpus,
}
