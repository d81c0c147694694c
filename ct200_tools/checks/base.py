"""What a check is, what it returns, and the helpers every check uses.

A check is pure: (Facts, Spec) -> Finding. It never touches the machine. When the facts it needs
were not readable it skips and says why; it never guesses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from ct200_tools.facts import Facts
from ct200_tools.spec import SiteSpec

Status = Literal["pass", "warn", "fail", "skip"]
Severity = Literal["error", "warning"]
Where = Literal["host", "container", "this machine"]


@dataclass(frozen=True)
class Remedy:
    """How to fix a failure: what, where, the exact command or config line, the playbook tag."""

    action: str
    where: Where
    command: str | None = None
    tag: str | None = None


@dataclass(frozen=True)
class Finding:
    id: str
    status: Status
    severity: Severity
    summary: str
    evidence: tuple[str, ...] = ()
    remediation: Remedy | None = None


@dataclass(frozen=True)
class Outcome:
    """What a check function returns; the registry adds id and severity."""

    ok: bool | None  # None: skipped
    summary: str
    evidence: tuple[str, ...] = ()
    remedy: Remedy | None = None
    #: A failed check may downgrade itself to a warning (e.g. "probably fine at idle").
    warn_only: bool = False


def passed(summary: str, *evidence: str) -> Outcome:
    return Outcome(True, summary, tuple(evidence))


def failed(summary: str, remedy: Remedy | None, *evidence: str, warn_only: bool = False) -> Outcome:
    return Outcome(False, summary, tuple(evidence), remedy, warn_only)


def skipped(summary: str, *evidence: str) -> Outcome:
    return Outcome(None, summary, tuple(evidence))


@dataclass(frozen=True)
class Context:
    facts: Facts
    spec: SiteSpec | None

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


CheckFn = Callable[[Context], Outcome]


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    severity: Severity
    fn: CheckFn
    #: For docs/checks.md: what a failure means and how the fix works.
    doc: str = ""
    needs_spec: bool = False
    tags: tuple[str, ...] = field(default_factory=tuple)


NO_SPEC = (
    "no site spec: pass --spec FILE or an inventory dir, or install /etc/ct200/site.yml "
    "(playbooks/site.yml does)"
)


def run_check(check: Check, ctx: Context) -> Finding:
    if check.needs_spec and ctx.spec is None:
        return Finding(check.id, "skip", check.severity, NO_SPEC)
    try:
        out = check.fn(ctx)
    except Exception as exc:  # noqa: BLE001 - a check bug is reported as such, never a traceback
        return Finding(
            check.id,
            "skip",
            check.severity,
            f"the check itself failed ({type(exc).__name__}: {exc}); please report this",
        )
    if out.ok is None:
        status: Status = "skip"
    elif out.ok:
        status = "pass"
    else:
        status = "warn" if (check.severity == "warning" or out.warn_only) else "fail"
    return Finding(check.id, status, check.severity, out.summary, out.evidence, out.remedy)


def gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"
