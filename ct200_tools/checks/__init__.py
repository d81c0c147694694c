"""The ordered registry of checks, and running them.

Each check is a unit defined beside its function in the module named by its id prefix
(`gpu.*` in checks/gpu.py, ...). This tuple is the one place that decides which checks exist
and the order they run and print in (as gpud's component registry); importing a module does not
register anything. Ids are stable: dashboards and scripts key on them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from ct200_tools.checks import dev, driver, gpu, host, mem, models, topo, tune
from ct200_tools.checks.base import Check, Context, Finding, run_check
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
    tune.check_numa_balancing,
    tune.check_mrrs,
    host.check_iommu,
    mem.check_shm,
    models.check_staged,
    mem.check_headroom,
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


def _matches(check_id: str, name: str) -> bool:
    return check_id == name or check_id.startswith(name.rstrip(".") + ".")


def run_checks(
    facts: Facts, spec: SiteSpec | None, checks: Iterable[Check] = CHECKS
) -> list[Finding]:
    """Judge `checks` in order. A finding's caused_by is resolved to the failing check at the
    end of its chain, judged here even when it was not selected, or dropped when no check in
    the chain fails (then the skip is only a skip)."""
    ctx = Context(facts, spec)
    judged: dict[str, Finding] = {}

    def judge(c: Check) -> Finding:
        if c.id not in judged:
            judged[c.id] = run_check(c, ctx)
        return judged[c.id]

    return [_resolve_cause(judge(c), judge) for c in checks]


def _resolve_cause(f: Finding, judge: Callable[[Check], Finding]) -> Finding:
    seen = {f.id}
    cause = f.caused_by
    while cause is not None and cause not in seen and cause in BY_ID:
        seen.add(cause)
        g = judge(BY_ID[cause])
        if g.status in ("fail", "error"):
            return dataclasses.replace(f, caused_by=g.id)
        cause = g.caused_by if g.status == "skip" else None
    return dataclasses.replace(f, caused_by=None) if f.caused_by else f
