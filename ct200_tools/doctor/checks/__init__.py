"""The ordered registry of checks, and running them.

Each check is a unit defined beside its function in the module named by its id prefix
(`gpu.*` in checks/gpu.py, ...). This tuple is the one place that decides which checks exist
and the order they run and print in (as gpud's component registry); importing a module does not
register anything. Ids are stable: dashboards and scripts key on them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from ct200_tools.doctor.checks import dev, driver, gpu, host, lxc, mem, models, server, topo, tune
from ct200_tools.doctor.checks.base import Check, Context, Finding, run_check
from ct200_tools.doctor.checks.causes import CAUSES, rules_for
from ct200_tools.doctor.scope import Scope
from ct200_tools.facts import Facts
from ct200_tools.spec import SiteSpec

CHECKS: tuple[Check, ...] = (
    driver.check_module,
    driver.check_nvml,
    driver.check_versions,
    dev.check_nodes_present,
    dev.check_node_majors,
    dev.check_nodes_open,
    gpu.check_cuda_init,
    gpu.check_count,
    gpu.check_model,
    gpu.check_pcie_link,
    gpu.check_persistence,
    gpu.check_memory_health,
    gpu.check_clocks,
    topo.check_numa_layout,
    topo.check_tp_numa,
    topo.check_p2p,
    *tune.CHECKS,
    host.check_host_nodes,
    lxc.check_lxc_nodes,
    lxc.check_lxc_majors,
    host.check_host_driver,
    *host.TUNING_CHECKS,
    host.check_acs,
    host.check_iommu,
    mem.check_shm,
    models.check_staged,
    mem.check_headroom,
    server.check_engine,
    server.check_port_free,
    server.check_quant,
    server.check_unit,
    server.check_port,
    server.check_models,
    server.check_generate,
    server.check_gpus,
)

CHECK_IDS = tuple(c.id for c in CHECKS)
BY_ID = {c.id: c for c in CHECKS}


class SelectionError(ValueError):
    """--only/--skip that name no check, or leave none to run: a usage error."""


class UnknownCheckError(SelectionError):
    pass


def select(only: Iterable[str] = (), skip: Iterable[str] = ()) -> tuple[Check, ...]:
    """Checks by id or id prefix ("dev" selects dev.*); unknown names, or a selection that
    leaves nothing to run, are an error."""
    only, skip = list(only), list(skip)
    for name in [*only, *skip]:
        if not any(_matches(c.id, name) for c in CHECKS):
            raise UnknownCheckError(f"unknown check {name!r}; see `ct200-doctor list-checks`")
    chosen = tuple(
        c
        for c in CHECKS
        if (not only or any(_matches(c.id, n) for n in only))
        and not any(_matches(c.id, n) for n in skip)
    )
    if not chosen:
        given = " ".join([*(f"--only {n}" for n in only), *(f"--skip {n}" for n in skip)])
        raise SelectionError(
            f"{given} selects no check: a run that checks nothing cannot pass; "
            "see `ct200-doctor list-checks`"
        )
    return chosen


#: What a server's start gate (`ct200-doctor gate NAME`, the unit's ExecStartPre) runs: can
#: this server start? The driver, its GPUs' device nodes and CUDA on them, its model and draft
#: staged, its engine installed and able to read the model's format, its port free. Checks about
#: GPUs are left out for a server without GPUs (Scope.applies).
GATE: tuple[str, ...] = (
    "driver",
    "dev",
    "gpu.cuda_init",
    "models.staged",
    "server.engine",
    "server.port_free",
    "server.quant",
)


def for_scope(checks: Iterable[Check], scope: Scope | None) -> tuple[Check, ...]:
    """The checks that apply to the scope's server (all of them without a scope)."""
    return tuple(c for c in checks if scope is None or scope.applies(c.about))


def gate_checks(scope: Scope) -> tuple[Check, ...]:
    return for_scope(select(GATE), scope)


def needed_facts(checks: Iterable[Check]) -> set[str]:
    """The Facts sections these checks read, and those of every root cause that may explain
    them (run_checks judges the roots too): what a scoped run needs to probe."""
    need: set[str] = set()
    todo = [c.id for c in checks]
    seen: set[str] = set()
    while todo:
        cid = todo.pop()
        if cid in seen:
            continue
        seen.add(cid)
        need.update(BY_ID[cid].needs)
        todo.extend(r.root for r in CAUSES if r.effect == cid)
    return need


def _matches(check_id: str, name: str) -> bool:
    return check_id == name or check_id.startswith(name.rstrip(".") + ".")


def run_checks(
    facts: Facts,
    spec: SiteSpec | None,
    checks: Iterable[Check] = CHECKS,
    scope: Scope | None = None,
) -> list[Finding]:
    """Judge `checks` in order and link each finding to its root cause.

    A failing check that a rule in checks/causes.py explains by another failing check is a
    consequence: caused_by names the root and its remediation is the root's (never a fix of its
    own that leads elsewhere). A skip's caused_by names the failing check at the end of its
    chain, or is dropped when no check in the chain fails (then the skip is only a skip).
    Roots are judged here even when they were not selected."""
    checks = tuple(checks)
    ctx = Context(facts, spec, scope)
    units = {**BY_ID, **{c.id: c for c in checks}}
    judged: dict[str, Finding] = {}
    linked: dict[str, Finding] = {}

    def judge(cid: str) -> Finding:
        if cid not in judged:
            judged[cid] = run_check(units[cid], ctx)
        return judged[cid]

    def link(cid: str, seen: frozenset[str]) -> Finding:
        if cid in linked:
            return linked[cid]
        f = judge(cid)
        cause = f.caused_by
        if f.status in ("fail", "warn"):
            cause = next(
                (r.root for r in rules_for(cid) if judge(r.root).status == "fail" and r.holds(ctx)),
                cause,
            )
        root = None
        if cause is not None and cause in units and cause not in seen:
            g = link(cause, seen | {cid})
            if g.status in ("fail", "error"):
                root = g.caused_by or g.id
            elif g.status == "skip":
                root = g.caused_by
        if root is not None and f.status in ("fail", "warn"):
            f = dataclasses.replace(f, caused_by=root, remediation=link(root, seen).remediation)
        else:
            f = dataclasses.replace(f, caused_by=root)
        if not seen:
            linked[cid] = f
        return f

    return [link(c.id, frozenset()) for c in checks]
