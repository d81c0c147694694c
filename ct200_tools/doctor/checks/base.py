"""What a check is, what it returns, and the helpers every check uses.

A check is one self-describing unit: its id, title, severity, doc (the function's docstring),
the facts it reads, the playbook tags its fixes name, and a pure function (Context -> Outcome),
made by the `@check(...)` decorator. It never touches the machine. When the facts it needs were
not readable it skips and says why; it never guesses. When it cannot judge because another
check fails, it skips naming that check (`caused_by`). A check that raises is a bug: `error`.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ct200_tools.doctor.scope import About, Scope
from ct200_tools.facts import Facts
from ct200_tools.serve.serving import selected
from ct200_tools.spec import ModelSpec, ServerSpec, SiteSpec

Status = Literal["pass", "warn", "fail", "skip", "error"]
#: Every status, in the order reports count them.
STATUSES: tuple[Status, ...] = ("pass", "warn", "fail", "skip", "error")
Severity = Literal["error", "warning"]
Where = Literal["host", "container", "this machine"]
#: The Facts sections a check may read (the probes' names).
FactName = Literal[
    "kernel", "devices", "pci", "nvml", "cuda", "memory", "models", "serving", "servers", "host"
]
#: A check's `about` when its unit does not say: by id prefix; other prefixes judge the
#: machine as a whole (sysctls, /dev/shm).
ABOUT_BY_PREFIX: dict[str, tuple[About, ...]] = {
    "driver": ("gpus",),
    "dev": ("gpus",),
    "gpu": ("gpus",),
    "topo": ("gpus",),
    "models": ("models",),
    "server": ("servers",),
}


@dataclass(frozen=True)
class Remedy:
    """How to fix a failure: what, where, the exact commands and config lines, the playbook tag.

    ``command`` is shell to paste, one command a line; ``config`` holds lines that belong in
    ``file`` (a PVE container config, a sysctl.d file): pasted into a shell they would run as
    commands, so reports print them as lines of their file, never after a `$`."""

    action: str
    where: Where
    command: str | None = None
    tag: str | None = None
    config: tuple[str, ...] = ()
    #: Where the config lines go: an absolute path, or the place when no path names it.
    file: str | None = None

    def __post_init__(self) -> None:
        if self.config and not self.file:
            raise ValueError(f"remedy {self.action!r}: config lines without the file they go in")

    def lines(self, prompt: str = "$ ") -> list[str]:
        """The fix as reports print it (fix_lines)."""
        return fix_lines(self.command, self.config, self.file, prompt)


def fix_lines(
    command: str | None, config: Sequence[str], file: str | None, prompt: str = "$ "
) -> list[str]:
    """A fix's lines as reports print them: first each config line as `in FILE: LINE` (a line
    to put in that file, never after a `$`), then each command after the prompt (to paste)."""
    return [f"in {file}: {line}" for line in config] + [
        f"{prompt}{c}" for c in (command or "").splitlines()
    ]


@dataclass(frozen=True)
class Finding:
    """One check's verdict, carrying all a report needs (no report looks back into the registry)."""

    id: str
    title: str
    status: Status
    severity: Severity
    summary: str
    evidence: tuple[str, ...] = ()
    remediation: Remedy | None = None
    #: The check whose failure this finding comes from; run_checks keeps it only when that check
    #: (or the root of its own chain) fails in these facts, and then names that failing check.
    caused_by: str | None = None


@dataclass(frozen=True)
class Outcome:
    """What a check function returns; run_check adds id, title and severity."""

    ok: bool | None  # None: skipped
    summary: str
    evidence: tuple[str, ...] = ()
    remedy: Remedy | None = None
    #: A failed check may downgrade itself to a warning (e.g. "probably fine at idle").
    warn_only: bool = False
    #: The id of the check whose failure this outcome comes from: for a skip, the check that
    #: keeps this one from judging; for a failure, its root cause.
    caused_by: str | None = None


def passed(summary: str, *evidence: str) -> Outcome:
    return Outcome(True, summary, tuple(evidence))


def failed(
    summary: str,
    remedy: Remedy | None,
    *evidence: str,
    warn_only: bool = False,
    caused_by: str | None = None,
) -> Outcome:
    return Outcome(False, summary, tuple(evidence), remedy, warn_only, caused_by)


def skipped(summary: str, *evidence: str, caused_by: str | None = None) -> Outcome:
    return Outcome(None, summary, tuple(e for e in evidence if e), caused_by=caused_by)


@dataclass(frozen=True)
class Context:
    facts: Facts
    spec: SiteSpec | None
    #: Judge only what one server uses; None: the whole machine and every serving server.
    scope: Scope | None = None

    @property
    def in_container(self) -> bool:
        k = self.facts.kernel
        return bool(k and k.container and k.container != "none")

    @property
    def host_where(self) -> Where:
        """Where a host-side fix is applied: "host" seen from a container, else here."""
        return "host" if self.in_container else "this machine"

    @property
    def site(self) -> SiteSpec:
        """The spec, for checks registered with needs_spec (run_check skips them without)."""
        if self.spec is None:
            raise RuntimeError("check needs a spec but was run without one")
        return self.spec

    def unreadable(self, *keys: str) -> str | None:
        return self.facts.why_unreadable(*keys)

    def serving_servers(self) -> tuple[ServerSpec, ...]:
        """The servers the checks judge (ct200_tools.serve.serving.selected): the scope's server;
        else the serving set when one is recorded (the switch writes it), else the spec's
        enabled servers. Every check about servers, their GPUs or their models judges these."""
        serving = self.facts.serving
        names = serving.servers if serving is not None else None
        only = self.scope.server if self.scope is not None else None
        return selected(self.site, names, only)

    def needed_models(self) -> tuple[ModelSpec, ...]:
        """The models the judged servers load: SiteSpec.needed_models of serving_servers()."""
        return self.site.needed_models(self.serving_servers())


CheckFn = Callable[[Context], Outcome]


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    severity: Severity
    fn: CheckFn
    #: For docs/checks.md: what a failure means and how the fix works (the function's docstring).
    doc: str = ""
    #: The Facts sections the function reads; nothing else in Facts changes its verdict.
    needs: tuple[FactName, ...] = ()
    needs_spec: bool = False
    #: The playbook tags its remediations may name.
    tags: tuple[str, ...] = ()
    #: What it judges (see About); a Scope drops the checks that do not apply to its server.
    about: tuple[About, ...] = ()
    #: Whether it judges the NVIDIA GPUs, their driver or their passthrough: on a site whose
    #: spec declares none (gpus.count: 0) it does not apply.
    gpu_only: bool = False

    @property
    def module(self) -> str:
        return self.fn.__module__

    def __call__(self, ctx: Context) -> Outcome:
        return self.fn(ctx)


def check(
    id: str,
    title: str,
    severity: Severity,
    *,
    needs: tuple[FactName, ...],
    needs_spec: bool = False,
    tags: tuple[str, ...] = (),
    about: tuple[About, ...] | None = None,
    gpu_only: bool | None = None,
) -> Callable[[CheckFn], Check]:
    """Make the decorated function a check unit; its docstring is the check's doc. `about`
    defaults to its id prefix's (ABOUT_BY_PREFIX), `gpu_only` to whether it is about GPUs."""

    def unit(fn: CheckFn) -> Check:
        doc = " ".join((fn.__doc__ or "").split())
        if not doc:
            raise TypeError(f"check {id}: {fn.__name__} needs a docstring (it is the check's doc)")
        what = about if about is not None else ABOUT_BY_PREFIX.get(id.partition(".")[0], ())
        gpus = gpu_only if gpu_only is not None else "gpus" in what
        return Check(id, title, severity, fn, doc, needs, needs_spec, tags, what, gpus)

    return unit


#: Said once, in the report's header, when checks that need the spec skipped without one.
NO_SPEC_FIX = (
    "pass --spec FILE or an inventory dir, or install /etc/ct200/site.yml (playbooks/site.yml does)"
)
#: The skip of each needs-spec check without one: short, since the header says how to fix it.
NEEDS_SPEC = "needs the site spec"
#: The skip of a GPU check on a site without GPUs: not applicable, which is healthy (gpud).
NO_GPU_SITE = "does not apply: the site spec declares no NVIDIA GPU (gpus.count: 0)"


def run_check(c: Check, ctx: Context) -> Finding:
    if c.needs_spec and ctx.spec is None:
        return Finding(c.id, c.title, "skip", c.severity, NEEDS_SPEC)
    if c.gpu_only and ctx.spec is not None and ctx.spec.gpus.count == 0:
        return Finding(c.id, c.title, "skip", c.severity, NO_GPU_SITE)
    try:
        out = c.fn(ctx)
    except Exception as exc:  # noqa: BLE001 - a check bug is reported as such, never a traceback
        return Finding(
            c.id,
            c.title,
            "error",
            c.severity,
            f"the check itself failed ({type(exc).__name__}: {exc}); please report this",
            _raised_at(exc),
        )
    status: Status
    if out.ok is None:
        status = "skip"
    elif out.ok:
        status = "pass"
    else:
        status = "warn" if (c.severity == "warning" or out.warn_only) else "fail"
    return Finding(
        c.id, c.title, status, c.severity, out.summary, out.evidence, out.remedy, out.caused_by
    )


def _raised_at(exc: BaseException) -> tuple[str, ...]:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ()
    last = frames[-1]
    return (f"raised at {Path(last.filename).name}:{last.lineno} in {last.name}",)


def plural(n: int, word: str, words: str | None = None) -> str:
    """'1 GPU', '2 GPUs', '0 GPUs' ('1 device node', '3 device nodes')."""
    return f"{n} {word if n == 1 else (words or word + 's')}"


def gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"
