"""The NVIDIA driver: kernel module, NVML, matching versions, and CUDA really initialising."""

from __future__ import annotations

from ct200_tools.checks import devices
from ct200_tools.checks.base import Context, Outcome, Remedy, failed, passed, skipped

MODULE_FIX = Remedy(
    "load the NVIDIA kernel modules and create the device nodes; persist them in "
    "/etc/modules-load.d/nvidia.conf",
    "host",
    "modprobe nvidia && modprobe nvidia_uvm && nvidia-modprobe -u -c0",
    "host_devices",
)


def check_module(ctx: Context) -> Outcome:
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


def check_nvml(ctx: Context) -> Outcome:
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


def check_versions(ctx: Context) -> Outcome:
    k, n = ctx.facts.kernel, ctx.facts.nvml
    module = k.nvidia_module_version if k else None
    user = n.driver_version if n else None
    if not module or not user:
        return skipped(
            "needs both the kernel module and NVML versions (see driver.module, driver.nvml)"
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


def check_cuda_init(ctx: Context) -> Outcome:
    c = ctx.facts.cuda
    if c is None:
        return skipped("CUDA was not probed", ctx.unreadable("cuda") or "")
    if c.code == 0:
        return passed(f"cuInit ok, {c.device_count} device(s), in {c.duration_s:.2f} s")
    if c.timed_out:
        return failed(
            c.error or "cuInit timed out",
            Remedy(
                "look for a hung GPU or driver on the host", "host", "dmesg | grep -E 'NVRM|Xid'"
            ),
        )
    module_loaded = bool(ctx.facts.kernel and ctx.facts.kernel.nvidia_module_version)
    if c.code is None and not module_loaded:
        return failed(
            f"CUDA unavailable: {c.error}; the NVIDIA kernel module is not loaded", MODULE_FIX
        )
    if c.code is None:
        return failed(
            f"CUDA unavailable: {c.error}",
            Remedy(
                "install the NVIDIA userspace driver (libcuda.so.1) matching the kernel module",
                "container" if ctx.in_container else "this machine",
                "sh NVIDIA-Linux-x86_64-<version>.run --no-kernel-module --silent",
            ),
        )
    head = f"cuInit returned {c.code} {c.name or ''}".strip()
    if not module_loaded:
        return failed(f"{head}: the NVIDIA kernel module is not loaded", MODULE_FIX)
    node_problems = devices.problems(ctx)
    if node_problems:
        first = node_problems[0]
        return failed(
            f"{head}: {first.message}",
            devices.remedy_for(ctx, first),
            *[p.message for p in node_problems],
        )
    module = ctx.facts.kernel.nvidia_module_version if ctx.facts.kernel else None
    n = ctx.facts.nvml
    if n and n.driver_version and module != n.driver_version:
        return failed(
            f"{head}: userspace driver {n.driver_version} does not match module {module}",
            Remedy("install the matching userspace driver", "container", None),
        )
    return failed(
        f"{head}; device nodes look right, so look at the driver's own log",
        Remedy(
            "read the host's kernel log for NVRM/Xid errors", "host", "dmesg | grep -E 'NVRM|Xid'"
        ),
    )
