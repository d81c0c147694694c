"""host.*: the host kernel's own settings that the GPUs depend on: IOMMU mode."""

from __future__ import annotations

from ct200_tools.checks.base import Context, Outcome, Remedy, check, failed, passed, skipped


@check("host.iommu", "IOMMU passthrough", "warning", needs=("kernel",), tags=("host_tuning",))
def check_iommu(ctx: Context) -> Outcome:
    """If the kernel enables IOMMU translation (intel_iommu=on / amd_iommu=on) it also has
    iommu=pt, so GPU P2P is not redirected through the root complex."""
    k = ctx.facts.kernel
    if k is None or k.cmdline is None:
        return skipped("kernel command line not read")
    args = k.cmdline.split()
    iommu_on = any(a in ("intel_iommu=on", "amd_iommu=on") for a in args)
    passthrough = "iommu=pt" in args or "iommu.passthrough=1" in args
    if iommu_on and not passthrough:
        return failed(
            "IOMMU translation is on without passthrough: GPU P2P goes through the root complex",
            Remedy(
                "add iommu=pt to the host kernel command line and reboot",
                ctx.host_where,
                'GRUB_CMDLINE_LINUX_DEFAULT="... iommu=pt" then update-grub',
                "host_tuning",
            ),
            f"cmdline: {' '.join(a for a in args if 'iommu' in a)}",
        )
    shown = " ".join(a for a in args if "iommu" in a) or "no iommu arguments"
    return passed("IOMMU does not translate GPU traffic", f"cmdline: {shown}")
