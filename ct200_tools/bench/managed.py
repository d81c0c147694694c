"""The managed mode's admission of a serving set: switch to it, then the doctor's verdict.

For each serving set of the plan (servers of the site spec), `ct200-bench run PLAN` without
--target calls `ct200-serve switch NAME...` once for the set's servers (ct200_tools.serve.switch:
stops what is in the way, restages, starts behind the units' gates; timed) and then the doctor's
full check of each server (`ct200-doctor check --server NAME`: its GPUs, CUDA on them, its models
staged, its unit active, its port, its answer, its processes on its GPUs). A server is
benchmark-ready when that check exits 0 (warnings allowed). Otherwise the run refuses
(NotReady, exit 5) with the doctor's root cause and fix, unless --force: then it runs, and every
point records `forced: true` and the failing findings. The server's URL comes from the spec
(engines.base_url), never typed again.

Switching and checking touch systemd, NVML and CUDA: they are parameters, so the unit tests pass
stand-ins and the testbed runs the real ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ct200_tools.bench.plan import ServingSet
from ct200_tools.doctor.checks.base import Finding
from ct200_tools.facts import Facts, to_jsonable
from ct200_tools.serve import engines
from ct200_tools.spec import ServerSpec, SiteSpec
from ct200_tools.untrusted import UntrustedInputError, read_bounded

#: Each probe of the admission check (and cuInit) may take this long: the doctor's default.
CHECK_TIMEOUT_S = 10.0
#: A unit, EnvironmentFile or engine config is a few KiB; more is not ours.
MAX_SERVER_FILE = 256 << 10
UNIT_DIR = "/etc/systemd/system"


class NotReady(Exception):
    """A serving set the machine cannot benchmark: its switch failed, or the doctor's check
    did not pass (without --force). `lines` is the doctor's own text view, when it ran."""

    def __init__(self, message: str, fix: str, lines: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.lines = lines


class SwitchReport(Protocol):
    @property
    def ok(self) -> bool: ...

    @property
    def failure(self) -> str: ...

    def to_dict(self) -> dict[str, object]: ...


@dataclass(frozen=True)
class Readiness:
    """The doctor's check of one server: its exit code (0 ready), findings and facts."""

    code: int
    findings: tuple[Finding, ...]
    facts: Facts | None
    verdict: str
    text: str


Switcher = Callable[[SiteSpec, Sequence[str]], SwitchReport]
Checker = Callable[[SiteSpec, str], Readiness]


def switch_to(site: SiteSpec, names: Sequence[str]) -> SwitchReport:
    """`ct200-serve switch NAME...` in this process: one switch at a time on the machine."""
    name = " ".join(names)
    from ct200_tools.serve import switch as sw  # noqa: PLC0415
    from ct200_tools.serve.serving import ServingError  # noqa: PLC0415
    from ct200_tools.serve.systemd import SystemdError  # noqa: PLC0415

    try:
        with sw.locked():
            return sw.Switch(site).run(list(names))
    except ServingError as exc:
        raise NotReady(f"ct200-serve switch {name}: {exc.message}", exc.fix) from None
    except SystemdError as exc:
        raise NotReady(
            f"ct200-serve switch {name}: {exc}",
            "run ct200-bench on the container, where systemd runs, as root",
        ) from None
    except OSError as exc:
        raise NotReady(
            f"ct200-serve switch {name}: {exc.filename or 'a file'}: {exc.strerror or exc}",
            "run ct200-bench as root on the container",
        ) from None


def doctor_check(site: SiteSpec, name: str) -> Readiness:
    """`ct200-doctor check --server NAME`, through the doctor's own probes and checks."""
    from ct200_tools.doctor.checks import for_scope, run_checks, select  # noqa: PLC0415
    from ct200_tools.doctor.probes import collect  # noqa: PLC0415
    from ct200_tools.doctor.report import Header, exit_code, gate_verdict, render_text  # noqa: PLC0415
    from ct200_tools.doctor.scope import Scope  # noqa: PLC0415

    scope = Scope.of(site, name)
    selected = for_scope(select(), scope)
    facts = collect(spec=site, timeout_s=CHECK_TIMEOUT_S, scope=scope)
    findings = tuple(run_checks(facts, site, selected, scope))
    code = int(exit_code(findings))
    head = Header(facts, site.source, tuple(str(w) for w in site.warnings))
    verdict = gate_verdict(findings, name, code).replace("ct200-doctor gate", "benchmark-ready", 1)
    return Readiness(code, findings, facts, verdict, render_text(findings, head))


def failing(findings: tuple[Finding, ...]) -> list[dict[str, object]]:
    """The findings that keep a set from being ready, as recorded with a forced point."""
    out: list[dict[str, object]] = []
    for f in findings:
        if f.status in ("fail", "error") or (f.status == "skip" and f.caused_by):
            fix = None
            if f.remediation is not None:
                r = f.remediation
                fix = {"where": r.where, "action": r.action, "command": r.command}
            out.append(
                {
                    "id": f.id,
                    "status": f.status,
                    "summary": f.summary,
                    "caused_by": f.caused_by,
                    "fix": fix,
                }
            )
    return out


def server_files(name: str, unit_dir: str = UNIT_DIR) -> dict[str, dict[str, object]]:
    """The server's rendered unit, EnvironmentFile and engine config as the machine has them:
    read bounded (regular files only), kept exactly; a file that is absent or refused says why."""
    paths = {
        "unit": f"{unit_dir}/{engines.unit_name(name)}",
        "environment_file": engines.env_path(name),
        "engine_config": engines.config_path(name),
    }
    out: dict[str, dict[str, object]] = {}
    for key, path in paths.items():
        try:
            data = read_bounded(path, f"the server's {key}", MAX_SERVER_FILE, "")
            out[key] = {"path": path, "text": data.decode("utf-8", errors="replace")}
        except UntrustedInputError as exc:
            out[key] = {"path": path, "text": None, "error": exc.message}
    return out


def machine_summary(facts: Facts | None, name: str) -> dict[str, object]:
    """What a reader of results asks first, from the doctor's facts: the driver and CUDA
    driver, the GPUs' models, and the engine's distribution installed for this server."""
    nvml = facts.nvml if facts is not None else None
    server = next((s for s in (facts.servers or ()) if s.name == name), None) if facts else None
    engine = server.engine if server is not None else None
    return {
        "driver": {
            "version": nvml.driver_version if nvml else None,
            "cuda_driver_version": nvml.cuda_driver_version if nvml else None,
            "gpus": [g.name for g in nvml.gpus] if nvml else None,
        },
        "engine_installed": {
            "dist": engine.dist if engine else None,
            "version": engine.dist_version if engine else None,
        },
    }


@dataclass(frozen=True)
class Admission:
    """A server of a serving set admitted to the benchmark (or forced through)."""

    name: str
    server: ServerSpec
    target: str
    switch: dict[str, object]
    switch_seconds: float
    readiness: Readiness
    forced: bool
    #: The plan's serving set this server was switched to with.
    serving_set: str

    @property
    def point_fields(self) -> dict[str, object]:
        """What each of the server's points carries about its admission."""
        fields: dict[str, object] = {"server": self.name, "forced": self.forced}
        if self.forced:
            fields["gate_failures"] = failing(self.readiness.findings)
        return fields

    def record(self) -> dict[str, Any]:
        """The set's provenance: target, switch, the doctor's verdict and facts."""
        r = self.readiness
        return {
            "server": self.name,
            "serving_set": self.serving_set,
            "target": self.target,
            "engine_kind": self.server.engine,
            "gpus": list(self.server.gpus),
            "switch": self.switch,
            "switch_seconds": round(self.switch_seconds, 3),
            "gate": {
                "check": f"ct200-doctor check --server {self.name}",
                "exit_code": r.code,
                "passed": r.code == 0,
                "verdict": r.verdict,
                "failing": failing(r.findings),
            },
            "forced": self.forced,
            **machine_summary(r.facts, self.name),
            "facts": to_jsonable(r.facts) if r.facts is not None else None,
        }


def admit(
    site: SiteSpec,
    sset: ServingSet,
    force: bool,
    switcher: Switcher = switch_to,
    checker: Checker = doctor_check,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[Admission, ...]:
    """Switch to the set's servers at once, then judge each; NotReady when the switch fails, or
    a server's check fails without `force` (the first such server, with the doctor's text)."""
    servers: list[ServerSpec] = []
    for n in sset.servers:
        server = site.server(n)
        if server is None:  # the session checks the names first; this is the last guard
            raise NotReady(f"no server {n!r} in the spec", "name a server of the site spec")
        servers.append(server)
    names = " ".join(sset.servers)
    t0 = clock()
    report = switcher(site, sset.servers)
    seconds = clock() - t0
    if not report.ok:
        raise NotReady(
            f"ct200-serve switch {names} failed at {report.failure}",
            f"see `ct200-serve switch {names}` and `ct200-doctor check --server NAME` for "
            "the cause and its fix",
        )
    admitted = []
    for name, server in zip(sset.servers, servers, strict=True):
        readiness = checker(site, name)
        if readiness.code != 0 and not force:
            raise NotReady(
                f"{name} is not benchmark-ready: {readiness.verdict}",
                f"apply the fix above, then run again; or add --force to benchmark {name} "
                "anyway (its points are recorded as forced, with these findings)",
                tuple(readiness.text.splitlines()),
            )
        admitted.append(
            Admission(
                name,
                server,
                engines.base_url(server),
                report.to_dict(),
                seconds,
                readiness,
                forced=readiness.code != 0,
                serving_set=sset.name,
            )
        )
    return tuple(admitted)
