"""driver.*: the NVIDIA driver's kernel module, NVML, and their versions matching."""

from __future__ import annotations

from ct200_tools.checks.base import Context, Outcome, Remedy, check, failed, passed, skipped

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
    /etc/modules-load.d."""
    k = ctx.facts.kernel
    if k is None:
        return skipped("kernel facts not read", ctx.unreadable("kernel") or "")
    if k.nvidia_module_version:
        return passed(f"NVIDIA kernel module {k.nvidia_module_version} loaded")
    pci = ctx.facts.pci or ()
    gpus = f"{len(pci)} NVIDIA GPU(s) on the PCI bus" if pci else "no NVIDIA GPU on the PCI bus"
    remedy = MODULE_FIX
    if ctx.in_container:
        remedy = Remedy(MODULE_FIX.action, "host", MODULE_FIX.command, MODULE_FIX.tag)
    elif not pci:
        remedy = Remedy(
            "install the NVIDIA driver (kernel module) on the GPU machine; this machine shows "
            "no NVIDIA GPU, so run the doctor where the GPUs are",
            "this machine",
            "modprobe nvidia",
            "host_devices",
        )
    return failed(
        "NVIDIA kernel module not loaded (/proc/driver/nvidia/version absent)",
        remedy,
        gpus,
    )


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
        return passed(f"NVML {n.nvml_version} sees {len(n.gpus)} GPU(s), driver {n.driver_version}")
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
