"""host.*: the PVE host as `check --host HOST` reads it (over SSH, or `--host local` on the host
itself): its NVIDIA modules and nodes, each host tuning of ct200_tools.tunings (MRRS from the
full config space, NUMA balancing, ...), ACS on the bridges above the GPUs, the IOMMU mode, and
its driver against the container's.

Without --host they skip (host.iommu then reads this machine's command line: in an LXC
container /proc/cmdline is the host's). The tunings' judgements are tune.*'s own, fed the
host's facts: the same fix, so the container's tune.* findings point here (checks/causes.py).
"""

from __future__ import annotations

import dataclasses

from ct200_tools.doctor.checks import dev, tune
from ct200_tools.doctor.checks.base import (
    Check,
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
from ct200_tools.doctor.probes.pci import ACS_REDIRECT
from ct200_tools.facts import HostFacts
from ct200_tools.tunings import TUNINGS, Tuning
from ct200_tools.units import HOST_DEVICES

#: Why a host check skipped: the host was not read.
NO_HOST = "the PVE host was not read: run `ct200-doctor check --host HOST` (`--host local` on it)"
HOST_DEVICES_UNIT = HOST_DEVICES.name()
#: Debian's (and PVE's) kernel command line for GRUB, read by update-grub.
GRUB_DEFAULTS = "/etc/default/grub"


def no_host(ctx: Context) -> Outcome:
    return skipped(NO_HOST, ctx.unreadable("host") or "")


def host_of(ctx: Context) -> HostFacts | None:
    return ctx.facts.host


def host_side(ctx: Context) -> Where:
    """Where a fix on the host is applied: here when the doctor reads this machine as the host
    (--host local), else on the host."""
    h = ctx.facts.host
    return "this machine" if h is not None and h.via == "local" else "host"


def _on_host(r: Remedy, ctx: Context) -> Remedy:
    return dataclasses.replace(r, where=host_side(ctx))


def modules_fix(ctx: Context, uvm_only: bool) -> Remedy:
    load = (
        "modprobe nvidia_uvm && nvidia-modprobe -u -c0"
        if uvm_only
        else "modprobe nvidia && modprobe nvidia_uvm && nvidia-modprobe -u -c0"
    )
    return Remedy(
        f"load the NVIDIA module{'' if uvm_only else 's'} and create the nodes on the host; "
        f"{HOST_DEVICES_UNIT} does it at every boot (the host_devices tag installs it), then "
        "restart the container so it gets the nodes",
        host_side(ctx),
        load,
        "host_devices",
    )


def expected_host_nodes(ctx: Context, h: HostFacts) -> list[str]:
    """The nodes the container is given: one per GPU of the spec (else of the host's PCI bus)."""
    if ctx.spec is not None:
        return list(ctx.spec.gpus.device_nodes)
    return [*(f"/dev/nvidia{i}" for i in range(len(h.pci or ()))), *dev.CORE]


@check(
    "host.nodes",
    "NVIDIA modules and nodes on the host",
    "error",
    needs=("host",),
    tags=("host_devices",),
    gpu_only=True,
)
def check_host_nodes(ctx: Context) -> Outcome:
    """On the PVE host, nvidia and nvidia_uvm are loaded (/proc/devices lists them) and every
    node the container is given exists as a character device with its driver's current major.
    pve-container passes the host's nodes: a node missing there is missing in the container, and
    a devN entry for it stops the container from starting. ct200-host-devices.service loads the
    modules and makes the nodes at every boot, before pve-guests.service."""
    h = host_of(ctx)
    if h is None:
        return no_host(ctx)
    d = h.devices
    if d is None:
        return skipped(
            "the host's device nodes were not read", ctx.unreadable("host.devices") or ""
        )
    majors = {k: v for k, v in d.majors.items() if k.startswith("nvidia")}
    evidence = f"host /proc/devices: {majors or 'no nvidia drivers registered'}"
    if not majors:
        if ctx.unreadable("host.devices.proc_devices"):
            return skipped(
                "the host's /proc/devices was not read", ctx.unreadable("host.devices") or ""
            )
        if h.pci is not None and not h.pci:
            # Nothing to load a driver for (driver.module's rule): the GPUs are elsewhere.
            return failed(
                "no NVIDIA GPU on the host's PCI bus and no NVIDIA driver: "
                f"{h.hostname or 'it'} is not the GPUs' host",
                Remedy(
                    "give --host the PVE host the GPUs (and the container) are in",
                    "this machine",
                    None,
                    None,
                ),
                evidence,
                "host /sys/bus/pci/devices: no NVIDIA (vendor 0x10de) display device",
            )
        return failed(
            "the NVIDIA kernel module is not loaded on the host", modules_fix(ctx, False), evidence
        )
    if "nvidia-uvm" not in majors:
        return failed(
            "nvidia_uvm is not loaded on the host: CUDA cannot start in the container",
            modules_fix(ctx, True),
            evidence,
        )
    want = expected_host_nodes(ctx, h)
    prs = [
        pr
        for p in want
        if (pr := dev.node_problem(d.node(p), p, d.majors)) is not None
        and pr.kind in ("missing", "not_char", "wrong_major")
    ]
    if not prs:
        return passed(f"{plural(len(want), 'node')} present with current majors", evidence)
    fix = dev.host_node_fix(ctx, prs)
    return failed(
        f"{len(prs)} of {plural(len(want), 'NVIDIA node')} wrong on the host",
        Remedy(
            f"{fix.action} ({HOST_DEVICES_UNIT} makes them at every boot), then restart the "
            "container",
            host_side(ctx),
            fix.command,
            "host_devices",
        ),
        *[pr.message for pr in prs],
        evidence,
    )


def host_tuning_check(t: Tuning) -> Check:
    """host.<check> of a tuning: tune.<check>'s judgement fed the host's facts, its fix applied
    on the host."""

    def fn(ctx: Context) -> Outcome:
        h = host_of(ctx)
        if h is None:
            return no_host(ctx)
        return tune.judge(ctx, t, tune.on_host(ctx, t, h), host_side(ctx))

    return tune.made(t, "host", f"{t.title} on the host", t.host_doc, ("host",), __name__, fn)


#: host.<check> of every tuning (ct200_tools.tunings), in the table's order.
TUNING_CHECKS: tuple[Check, ...] = tuple(host_tuning_check(t) for t in TUNINGS)


@check(
    "host.acs", "ACS redirect on bridges above the GPUs", "warning", needs=("host",), gpu_only=True
)
def check_acs(ctx: Context) -> Outcome:
    """No PCIe bridge above a GPU has ACS P2P Request or Completion Redirect on: with them,
    peer-to-peer traffic between GPUs under one switch goes up to the root complex (and through
    the IOMMU) instead of across the switch, cutting P2P bandwidth or breaking it. A warning: a
    host that isolates devices for VMs needs ACS, and the firmware may re-enable it at boot."""
    h = host_of(ctx)
    if h is None:
        return no_host(ctx)
    if h.bridges is None:
        return skipped("the bridges above the GPUs were not read", ctx.unreadable("host") or "")
    if h.pci is not None and not h.pci:
        return skipped("no NVIDIA GPU on the host's PCI bus")
    if not h.bridges:
        return passed("no PCIe bridge above the GPUs (they sit on the root bus)")
    unread = [b.bdf for b in h.bridges if b.has_acs is None]
    if len(unread) == len(h.bridges):
        return skipped(
            "no bridge's extended config space was readable (it needs root on the host)",
            ctx.unreadable("host.pci") or "",
        )
    on = [b for b in h.bridges if b.acs_ctl is not None and b.acs_ctl & ACS_REDIRECT]
    evidence = [
        f"{b.bdf}: "
        + (
            "not read"
            if b.has_acs is None
            else "no ACS"
            if b.acs_ctl is None
            else f"ACS Control {b.acs_ctl:#06x}"
        )
        + f" (above {', '.join(b.gpus)})"
        for b in h.bridges
    ]
    if not on:
        return passed(f"no ACS redirect on {plural(len(h.bridges), 'bridge')}", *evidence)
    return failed(
        f"ACS redirects P2P on {plural(len(on), 'bridge')} above the GPUs",
        Remedy(
            "clear ACS P2P Request/Completion Redirect on these bridges (it comes back at "
            "boot: disable ACS in the firmware, or re-apply at boot), unless the host needs "
            "ACS to isolate devices passed to VMs",
            host_side(ctx),
            "\n".join(f"setpci -s {b.bdf} ECAP_ACS+6.w=0000:{ACS_REDIRECT:04x}" for b in on),
        ),
        *evidence,
    )


@check(
    "host.iommu",
    "IOMMU passthrough",
    "warning",
    needs=("kernel", "host"),
    tags=("host_tuning",),
    gpu_only=True,
)
def check_iommu(ctx: Context) -> Outcome:
    """If the kernel enables IOMMU translation (intel_iommu=on / amd_iommu=on) it also has
    iommu=pt, so GPU P2P is not redirected through the root complex. Reads the host's command
    line with --host, else this machine's (an LXC container sees the host's)."""
    h = host_of(ctx)
    k = h.kernel if h is not None else ctx.facts.kernel
    if k is None or k.cmdline is None:
        return skipped("kernel command line not read")
    args = k.cmdline.split()
    iommu_on = any(a in ("intel_iommu=on", "amd_iommu=on") for a in args)
    passthrough = "iommu=pt" in args or "iommu.passthrough=1" in args
    where = host_side(ctx) if h is not None else ctx.host_where
    if iommu_on and not passthrough:
        return failed(
            "IOMMU translation is on without passthrough: GPU P2P goes through the root complex",
            Remedy(
                "add iommu=pt to the host kernel command line (the line below, last in the "
                "file, appends it to what is there), regenerate the boot config, then reboot "
                "(a host booted by systemd-boot: add it to /etc/kernel/cmdline, then "
                "proxmox-boot-tool refresh)",
                where,
                "update-grub",
                "host_tuning",
                # /etc/default/grub is shell: a later assignment extends the earlier one.
                ('GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT iommu=pt"',),
                GRUB_DEFAULTS,
            ),
            f"cmdline: {' '.join(a for a in args if 'iommu' in a)}",
        )
    shown = " ".join(a for a in args if "iommu" in a) or "no iommu arguments"
    return passed("IOMMU does not translate GPU traffic", f"cmdline: {shown}")


@check(
    "host.driver",
    "host driver matches the container's",
    "error",
    needs=("host", "nvml", "kernel"),
    gpu_only=True,
)
def check_host_driver(ctx: Context) -> Outcome:
    """The host's NVIDIA kernel module is the version of the userspace driver this machine (the
    container) runs (NVML's driver version); CUDA refuses a mismatch. When this machine's own
    /proc/driver/nvidia/version names another version than the host's, --host names another
    machine than the one this container runs on."""
    h = host_of(ctx)
    if h is None:
        return no_host(ctx)
    host_v = h.kernel.nvidia_module_version if h.kernel else None
    here = ctx.facts.kernel.nvidia_module_version if ctx.facts.kernel else None
    user = ctx.facts.nvml.driver_version if ctx.facts.nvml else None
    if host_v is None:
        return skipped(
            "the host's NVIDIA module version is not known (see host.nodes)", caused_by="host.nodes"
        )
    if here is not None and here != host_v:
        return failed(
            f"the host runs NVIDIA module {host_v} but this machine sees {here}: --host names "
            "another machine than this container's host",
            Remedy(
                "run the doctor in this container with --host naming its own PVE host",
                "this machine",
                None,
            ),
            f"host /proc/driver/nvidia/version: {host_v}",
            f"here /proc/driver/nvidia/version: {here}",
        )
    if user is None:
        # In the container NVML must answer (driver.nvml says why not); a workstation running
        # --host has no driver of its own to compare.
        return skipped(
            "this machine's userspace driver version is not known"
            + (" (see driver.nvml)" if ctx.in_container else ": no NVML here"),
            caused_by="driver.nvml" if ctx.in_container else None,
        )
    if user == host_v:
        return passed(f"host module and this machine's userspace driver are both {host_v}")
    return failed(
        f"the host's module is {host_v} but the userspace driver here is {user}: CUDA refuses "
        "mismatched pairs",
        Remedy(
            f"install userspace driver {host_v} in the container (the host's module wins)",
            "container" if ctx.in_container or h.via != "local" else "this machine",
            f"sh NVIDIA-Linux-x86_64-{host_v}.run --no-kernel-module --silent",
        ),
        f"host /proc/driver/nvidia/version: {host_v}",
        f"nvmlSystemGetDriverVersion here: {user}",
    )
