"""tune.*: host tunings that must hold before benchmarks: NUMA balancing, PCIe MRRS."""

from __future__ import annotations

from ct200_tools.doctor.checks.base import (
    Context,
    Outcome,
    Remedy,
    Where,
    check,
    failed,
    passed,
    plural,
    skipped,
)
from ct200_tools.facts import KernelFacts, PciFacts
from ct200_tools.spec import mrrs_code
from ct200_tools.units import PCIE_TUNE

#: The file roles/host_tuning persists the sysctl in (host_tuning_sysctl_file).
SYSCTL_FILE = "/etc/sysctl.d/60-ct200.conf"


@check(
    "tune.numa_balancing",
    "NUMA balancing",
    "error",
    needs=("kernel",),
    needs_spec=True,
    tags=("host_tuning",),
)
def check_numa_balancing(ctx: Context) -> Outcome:
    """kernel.numa_balancing equals tuning.numa_balancing (0: the workload is NUMA-pinned
    already). Host sysctl; read-only inside a container."""
    k = ctx.facts.kernel
    return judge_numa_balancing(ctx, k, ctx.unreadable("kernel.numa_balancing"), ctx.host_where)


def judge_numa_balancing(
    ctx: Context, k: KernelFacts | None, why_unreadable: str | None, where: Where
) -> Outcome:
    """tune.numa_balancing's judgement, on this machine's kernel or the host's (host.*)."""
    want = ctx.site.tuning.numa_balancing
    if want is None:
        return skipped("tuning.numa_balancing not managed by the spec")
    have = k.numa_balancing if k else None
    if have is None:
        return skipped("kernel.numa_balancing not readable", why_unreadable or "")
    if have == want:
        return passed(f"kernel.numa_balancing = {have}")
    return failed(
        f"kernel.numa_balancing = {have}, the spec wants {want}",
        Remedy(
            "set the host sysctl now and persist it for every boot (a container cannot change it)",
            where,
            f"sysctl -w kernel.numa_balancing={want}",
            "host_tuning",
            (f"kernel.numa_balancing = {want}",),
            SYSCTL_FILE,
        ),
    )


@check(
    "tune.pcie_mrrs",
    "PCIe Max Read Request",
    "error",
    needs=("pci", "kernel"),
    needs_spec=True,
    tags=("host_tuning",),
    gpu_only=True,
)
def check_mrrs(ctx: Context) -> Outcome:
    """Each GPU's Device Control MRRS equals tuning.pcie_max_read_request. Config space resets
    at reboot and GPU reset, so a boot unit re-applies it. Skipped where only the 64-byte header
    is readable (unprivileged container)."""
    return judge_mrrs(ctx, ctx.facts.pci, ctx.unreadable("pci"), ctx.host_where)


def judge_mrrs(
    ctx: Context, pci: tuple[PciFacts, ...] | None, why_unreadable: str | None, where: Where
) -> Outcome:
    """tune.pcie_mrrs's judgement, on this machine's config space or the host's (host.*)."""
    want = ctx.site.tuning.pcie_max_read_request
    if want is None:
        return skipped("tuning.pcie_max_read_request not managed by the spec")
    if pci is None:
        return skipped("PCI facts not read", why_unreadable or "")
    if not pci:
        return skipped("no NVIDIA GPU on the PCI bus")
    unreadable = [p.bdf for p in pci if p.max_read_request is None]
    if len(unreadable) == len(pci):
        return skipped(
            "MRRS cannot be read here: config space beyond the header needs root on the host "
            "(run ct200-doctor check on the host, or check --host HOST)",
            why_unreadable or "",
        )
    wrong = [p for p in pci if p.max_read_request is not None and p.max_read_request != want]
    evidence = [f"{p.bdf}: MRRS {p.max_read_request} MPS {p.max_payload}" for p in pci]
    if not wrong:
        return passed(f"MRRS {want} on every readable GPU", *evidence)
    code = mrrs_code(want)
    return failed(
        f"MRRS is not {want} on {plural(len(wrong), 'GPU')} "
        "(config space resets at reboot and GPU reset)",
        Remedy(
            f"re-apply with a masked write at boot ({PCIE_TUNE.name()} does this)",
            where,
            "\n".join(f"setpci -s {p.bdf} CAP_EXP+8.w={code}000:7000" for p in wrong),
            "host_tuning",
        ),
        *evidence,
    )
