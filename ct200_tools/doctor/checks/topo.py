"""topo.*: tensor-parallel groups against the machine's real topology: NUMA nodes and P2P."""

from __future__ import annotations

from ct200_tools.doctor.checks.base import Context, Outcome, Remedy, check, failed, passed, skipped
from ct200_tools.spec import ServerSpec

#: Measured on CT200 (domain.md section 1).
#: Why topo.tp_numa and topo.p2p skip: no server to judge runs on more than one GPU.
NO_TP_GROUP = "no multi-GPU server serving (the serving set's, else the spec's enabled ones)"
CROSS_NUMA_COST = (
    "on CT200, TP8 across the inter-socket link was slower than TP4 inside one node for single "
    "requests"
)


def numa_of_gpus(ctx: Context) -> dict[int, int | None] | None:
    """GPU index -> NUMA node from sysfs, joined through NVML's bus ids; None without NVML."""
    if ctx.facts.nvml is None:
        return None
    pci = {p.bdf: p for p in ctx.facts.pci or ()}
    return {
        g.index: (pci[g.pci_bus_id].numa_node if g.pci_bus_id in pci else None)
        for g in ctx.facts.nvml.gpus
    }


def _nodes(ctx: Context) -> tuple[dict[int, int | None] | None, Outcome | None]:
    nodes = numa_of_gpus(ctx)
    if nodes is None:
        return None, skipped("NVML unavailable (see driver.nvml)", caused_by="driver.nvml")
    if nodes and all(v is None for v in nodes.values()):
        why = ctx.unreadable("pci") or "sysfs gives no NUMA node"
        return None, skipped("the platform reports no NUMA node for the GPUs", why)
    return nodes, None


@check(
    "topo.numa_layout",
    "NUMA layout matches the spec",
    "warning",
    needs=("nvml", "pci"),
    needs_spec=True,
)
def check_numa_layout(ctx: Context) -> Outcome:
    """Each GPU's NUMA node (sysfs numa_node via its PCI address) is where gpus.numa says."""
    if not ctx.site.gpus.numa:
        return skipped("gpus.numa not declared in the spec")
    nodes, skip = _nodes(ctx)
    if skip is not None or nodes is None:
        return skip or skipped("no NUMA facts")
    wrong = []
    for i, actual in sorted(nodes.items()):
        declared = ctx.site.gpus.numa_node_of(i)
        if actual is not None and declared is not None and actual != declared:
            wrong.append(f"GPU{i}: spec says node {declared}, sysfs says {actual}")
    if not wrong:
        return passed(
            "GPU NUMA nodes match the spec",
            *[f"GPU{i}: node {n}" for i, n in sorted(nodes.items())],
        )
    return failed(
        "the spec's gpus.numa does not match the machine",
        Remedy(
            "correct gpus.numa in the site spec (group_vars) to what sysfs reports",
            "this machine",
            "cat /sys/bus/pci/devices/*/numa_node",
        ),
        *wrong,
    )


def _group_line(s: ServerSpec) -> str:
    return f"{s.name} (GPUs {list(s.gpus)})"


@check(
    "topo.tp_numa",
    "TP groups inside one NUMA node",
    "warning",
    needs=("nvml", "pci", "serving"),
    needs_spec=True,
)
def check_tp_numa(ctx: Context) -> Outcome:
    """Each serving server's GPUs share one NUMA node (the serving set's servers when one is
    recorded, else the spec's enabled ones). Crossing the inter-socket link made TP8
    slower than TP4 for single requests on CT200."""
    servers = [s for s in ctx.serving_servers() if len(s.gpus) > 1]
    if not servers:
        return skipped(NO_TP_GROUP)
    nodes, skip = _nodes(ctx)
    if skip is not None or nodes is None:
        return skip or skipped("no NUMA facts")
    spanning, evidence = [], []
    for s in servers:
        used = sorted({nodes.get(i) for i in s.gpus}, key=lambda n: -1 if n is None else n)
        evidence.append(f"{_group_line(s)}: NUMA {'node' if len(used) == 1 else 'nodes'} {used}")
        if len([n for n in used if n is not None]) > 1:
            spanning.append(s.name)
    if not spanning:
        return passed("every TP group stays inside one NUMA node", *evidence)
    return failed(
        f"{'TP group' if len(spanning) == 1 else 'TP groups'} {spanning} "
        f"{'spans' if len(spanning) == 1 else 'span'} NUMA nodes: {CROSS_NUMA_COST}",
        Remedy(
            "give each server GPUs from one NUMA node: edit servers[].gpus in the site spec "
            "(the inventory's group_vars), then check it",
            "this machine",
            "ct200-doctor validate inventory/<site>",
        ),
        *evidence,
    )


@check(
    "topo.p2p",
    "P2P inside TP groups",
    "warning",
    needs=("nvml", "serving"),
    needs_spec=True,
    tags=("host_tuning",),
)
def check_p2p(ctx: Context) -> Outcome:
    """NVML reports P2P read and write OK for every GPU pair of a serving server (the serving
    set's, else the enabled ones); otherwise NCCL
    copies through host memory. ACS and IOMMU translation are the usual causes."""
    servers = [s for s in ctx.serving_servers() if len(s.gpus) > 1]
    if not servers:
        return skipped(NO_TP_GROUP)
    nvml = ctx.facts.nvml
    if nvml is None:
        return skipped("NVML unavailable (see driver.nvml)", caused_by="driver.nvml")
    links = {(link.a, link.b): link for link in nvml.links}
    bad, evidence = [], []
    for s in servers:
        g = sorted(s.gpus)
        for i, a in enumerate(g):
            for b in g[i + 1 :]:
                link = links.get((a, b))
                if link is None:
                    bad.append(f"{s.name}: GPU{a}-GPU{b} not seen by NVML")
                    continue
                line = (
                    f"{s.name}: GPU{a}-GPU{b} {link.level} "
                    f"read={link.p2p_read} write={link.p2p_write}"
                )
                evidence.append(line)
                if link.p2p_read != "OK" or link.p2p_write != "OK":
                    bad.append(line)
    if not bad:
        return passed("P2P read and write available inside every TP group", *evidence)
    return failed(
        "P2P unavailable inside a TP group: NCCL falls back to copies through host memory",
        Remedy(
            "on the host, disable ACS on the PCIe bridges and boot with iommu=pt "
            "(NCCL troubleshooting: ACS/IOMMU redirect P2P through the root complex)",
            "host",
            "nvidia-smi topo -p2p r",
            "host_tuning",
        ),
        *bad,
    )
