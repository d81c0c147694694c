"""driver.*: the NVIDIA driver's kernel module, NVML, and their versions matching."""

from __future__ import annotations

from ct200_tools.doctor.checks.base import (
    Context,
    Outcome,
    Remedy,
    check,
    failed,
    passed,
    plural,
    skipped,
)

MODULE_FIX = Remedy(
    "load the NVIDIA kernel modules and create the device nodes; persist them in "
    "/etc/modules-load.d/nvidia.conf",
    "host",
    "modprobe nvidia && modprobe nvidia_uvm && nvidia-modprobe -u -c0",
    "host_devices",
)


@check(
    "driver.module",
    "NVIDIA kernel module loaded",
    "error",
    needs=("kernel", "pci"),
    tags=("host_devices",),
)
def check_module(ctx: Context) -> Outcome:
    """The host's NVIDIA kernel module is loaded (/proc/driver/nvidia/version). Without it
    nothing else works. Fix on the host: load nvidia and nvidia_uvm and persist them in
    /etc/modules-load.d. With no NVIDIA GPU on the PCI bus either, this is not a GPU machine:
    the finding says so instead of suggesting a modprobe that cannot work."""
    k = ctx.facts.kernel
    if k is None:
        return skipped("kernel facts not read", ctx.unreadable("kernel") or "")
    if k.nvidia_module_version:
        return passed(f"NVIDIA kernel module {k.nvidia_module_version} loaded")
    absent = "/proc/driver/nvidia/version absent"
    pci = ctx.facts.pci
    if pci is not None and not pci and "pci" not in ctx.facts.unreadable:
        # Nothing to load a driver for: modprobe would only fail. The GPUs are elsewhere.
        return failed(
            "no NVIDIA GPU on the PCI bus and no NVIDIA kernel module: not a GPU machine",
            Remedy(
                "run the doctor on the GPU machine (or in its container); if GPUs should be "
                "here, the PCI bus does not show them: check that they are seated, powered and "
                "enabled in the firmware, or passed through to this VM",
                "this machine",
                "lspci -nn -d 10de:",
                None,
            ),
            "/sys/bus/pci/devices: no NVIDIA (vendor 0x10de) display device",
            absent,
        )
    if pci is None:
        seen = f"PCI bus not read ({ctx.unreadable('pci') or 'unknown'})"
    else:
        seen = f"{plural(len(pci), 'NVIDIA GPU')} on the PCI bus"
    remedy = MODULE_FIX
    if ctx.in_container:
        remedy = Remedy(MODULE_FIX.action, "host", MODULE_FIX.command, MODULE_FIX.tag)
    return failed(f"NVIDIA kernel module not loaded ({absent})", remedy, seen)


@check(
    "driver.nvml",
    "NVML initialises",
    "error",
    needs=("nvml", "kernel"),
    tags=("host_devices",),
)
def check_nvml(ctx: Context) -> Outcome:
    """libnvidia-ml answers. In a container this needs the userspace driver installed with
    --no-kernel-module, at the host module's exact version."""
    if ctx.facts.nvml is not None:
        n = ctx.facts.nvml
        return passed(
            f"NVML {n.nvml_version} sees {plural(len(n.gpus), 'GPU')}, driver {n.driver_version}"
        )
    why = ctx.facts.unreadable.get("nvml")
    if why is None:
        return skipped("NVML was not probed")
    k = ctx.facts.kernel
    if k is not None and not k.nvidia_module_version:
        return failed(f"NVML unavailable: {why}", MODULE_FIX, "the kernel module is not loaded")
    if "not installed" in why or "Library Not Found" in why:
        version = (k.nvidia_module_version if k else None) or "<version>"
        return failed(
            f"NVML unavailable: {why}",
            Remedy(
                f"install the NVIDIA userspace driver {version} (same version as the host's "
                "kernel module) without its kernel module",
                "container" if ctx.in_container else "this machine",
                f"sh NVIDIA-Linux-x86_64-{version}.run --no-kernel-module --silent",
                None,
            ),
        )
    return failed(
        f"NVML unavailable: {why}",
        Remedy(
            "read the host's kernel log for NVRM/Xid errors", "host", "dmesg | grep -E 'NVRM|Xid'"
        ),
    )


@check(
    "driver.versions", "kernel module and userspace driver match", "error", needs=("kernel", "nvml")
)
def check_versions(ctx: Context) -> Outcome:
    """The kernel module version equals the userspace (NVML) driver version; CUDA refuses a
    mismatch. The host's module wins: reinstall the container's userspace driver."""
    k, n = ctx.facts.kernel, ctx.facts.nvml
    module = k.nvidia_module_version if k else None
    user = n.driver_version if n else None
    if not module or not user:
        return skipped(
            "needs both the kernel module and NVML versions (see driver.module, driver.nvml)",
            caused_by="driver.nvml" if module else "driver.module",
        )
    if module == user:
        return passed(f"kernel module and userspace driver are both {module}")
    return failed(
        f"kernel module {module} but userspace driver {user}: CUDA refuses mismatched pairs",
        Remedy(
            f"install userspace driver {module} in the container (the host's module wins)",
            "container" if ctx.in_container else "this machine",
            f"sh NVIDIA-Linux-x86_64-{module}.run --no-kernel-module --silent",
        ),
        f"/proc/driver/nvidia/version: {module}",
        f"nvmlSystemGetDriverVersion: {user}",
    )
