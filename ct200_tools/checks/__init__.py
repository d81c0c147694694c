"""The ordered registry of checks, and running them.

Ids are stable (dashboards and scripts key on them); docs/checks.md is generated from this list
and a test keeps the two in step.
"""

from __future__ import annotations

from collections.abc import Iterable

from ct200_tools.checks import devices, driver, gpus, memory, models, topology, tuning
from ct200_tools.checks.base import Check, Context, Finding, run_check
from ct200_tools.facts import Facts
from ct200_tools.spec import SiteSpec

CHECKS: tuple[Check, ...] = (
    Check(
        "driver.module",
        "NVIDIA kernel module loaded",
        "error",
        driver.check_module,
        "The host's NVIDIA kernel module is loaded (/proc/driver/nvidia/version). Without it "
        "nothing else works. Fix on the host: load nvidia and nvidia_uvm and persist them in "
        "/etc/modules-load.d.",
    ),
    Check(
        "driver.nvml",
        "NVML initialises",
        "error",
        driver.check_nvml,
        "libnvidia-ml answers. In a container this needs the userspace driver installed "
        "with --no-kernel-module, at the host module's exact version.",
    ),
    Check(
        "driver.versions",
        "kernel module and userspace driver match",
        "error",
        driver.check_versions,
        "The kernel module version equals the userspace (NVML) driver version; CUDA refuses "
        "a mismatch. The host's module wins: reinstall the container's userspace driver.",
    ),
    Check(
        "dev.nodes",
        "device nodes present",
        "error",
        devices.check_nodes_present,
        "/dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools and /dev/nvidia0..N-1 exist "
        "as character devices. In an LXC container they come from devN: entries (or "
        "lxc.mount.entry lines); on the host from nvidia-modprobe -u -c0.",
    ),
    Check(
        "dev.majors",
        "device node majors are current",
        "error",
        devices.check_node_majors,
        "Each node's major equals its driver's major in /proc/devices. nvidia-uvm's major is "
        "dynamic (511, 238, 508...): a node or an lxc.cgroup2.devices.allow line made for an "
        "older major is stale after a driver update or reboot.",
    ),
    Check(
        "dev.open",
        "device nodes open read-write",
        "error",
        devices.check_nodes_open,
        "open(O_RDWR) succeeds on each node, as libcuda's does. EPERM means the device cgroup "
        "denies the major:minor (the incident: nvidia-uvm not allowed in the LXC config); "
        "EACCES means file permissions; ENXIO/ENODEV a node with no driver behind it.",
    ),
    Check(
        "gpu.cuda_init",
        "CUDA initialises",
        "error",
        driver.check_cuda_init,
        "cuInit(0) returns CUDA_SUCCESS in a child process within the timeout. nvidia-smi can "
        "work while this fails (999 CUDA_ERROR_UNKNOWN when /dev/nvidia-uvm is denied); the "
        "finding names the node, errno and the exact host config line that fixes it.",
    ),
    Check(
        "gpu.count",
        "GPU count matches the spec",
        "error",
        gpus.check_count,
        "NVML (and CUDA) see gpus.count GPUs.",
        needs_spec=True,
    ),
    Check(
        "gpu.model",
        "GPU model matches the spec",
        "error",
        gpus.check_model,
        "Every GPU's name contains gpus.model.",
        needs_spec=True,
    ),
    Check(
        "gpu.pcie_link",
        "PCIe link capability",
        "error",
        gpus.check_pcie_link,
        "Each GPU's maximum negotiated link reaches gpus.pcie gen and width. The current link "
        "speed drops at idle (32 -> 2.5 GT/s on RTX PRO 6000): that is not a fault and is "
        "only shown as evidence.",
        needs_spec=True,
    ),
    Check(
        "gpu.persistence",
        "persistence mode",
        "warning",
        gpus.check_persistence,
        "Persistence mode keeps the driver initialised between CUDA processes; run "
        "nvidia-persistenced on the host.",
    ),
    Check(
        "gpu.memory_health",
        "GPU memory health",
        "error",
        gpus.check_memory_health,
        "No failed row remapping (fail: RMA) and no pending remap or retired page (warn: "
        "reset the GPU when idle).",
    ),
    Check(
        "gpu.clocks",
        "no clock slowdown",
        "warning",
        gpus.check_clocks,
        "No hardware, thermal or power-brake slowdown is holding clocks back.",
    ),
    Check(
        "topo.numa_layout",
        "NUMA layout matches the spec",
        "warning",
        topology.check_numa_layout,
        "Each GPU's NUMA node (sysfs numa_node via its PCI address) is where gpus.numa says.",
        needs_spec=True,
    ),
    Check(
        "topo.tp_numa",
        "TP groups inside one NUMA node",
        "warning",
        topology.check_tp_numa,
        "Each enabled server's GPUs share one NUMA node. Crossing the inter-socket link made "
        "TP8 slower than TP4 for single requests on CT200.",
        needs_spec=True,
    ),
    Check(
        "topo.p2p",
        "P2P inside TP groups",
        "warning",
        topology.check_p2p,
        "NVML reports P2P read and write OK for every GPU pair of an enabled server; "
        "otherwise NCCL copies through host memory. ACS and IOMMU translation are the usual "
        "causes.",
        needs_spec=True,
    ),
    Check(
        "tune.numa_balancing",
        "NUMA balancing",
        "error",
        tuning.check_numa_balancing,
        "kernel.numa_balancing equals tuning.numa_balancing (0: the workload is NUMA-pinned "
        "already). Host sysctl; read-only inside a container.",
        needs_spec=True,
    ),
    Check(
        "tune.pcie_mrrs",
        "PCIe Max Read Request",
        "error",
        tuning.check_mrrs,
        "Each GPU's Device Control MRRS equals tuning.pcie_max_read_request. Config space "
        "resets at reboot and GPU reset, so a boot unit re-applies it. Skipped where only "
        "the 64-byte header is readable (unprivileged container).",
        needs_spec=True,
    ),
    Check(
        "host.iommu",
        "IOMMU passthrough",
        "warning",
        tuning.check_iommu,
        "If the kernel enables IOMMU translation (intel_iommu=on / amd_iommu=on) it also "
        "has iommu=pt, so GPU P2P is not redirected through the root complex.",
    ),
    Check(
        "mem.shm",
        "/dev/shm size",
        "error",
        memory.check_shm,
        "/dev/shm is a tmpfs at least shm.size large, and the models of enabled servers fit.",
        needs_spec=True,
    ),
    Check(
        "models.staged",
        "models staged and intact",
        "error",
        models.check_staged,
        "Every model an enabled server serves (and its declared draft model) is staged by "
        "ct200-stage: a marker naming the manifest, every file at its size, and with --deep "
        "every chunk re-hashed. A partial tree with a running stage is a warning; a missing "
        "persistent copy says so, since staging never creates one.",
        needs_spec=True,
    ),
    Check(
        "mem.headroom",
        "memory for staging",
        "error",
        memory.check_headroom,
        "The memory cgroup (tmpfs pages count against it) and /dev/shm have room for the "
        "models still to stage plus shm.reserve_ram.",
        needs_spec=True,
    ),
)

CHECK_IDS = tuple(c.id for c in CHECKS)


class UnknownCheckError(ValueError):
    pass


def select(only: Iterable[str] = (), skip: Iterable[str] = ()) -> tuple[Check, ...]:
    """Checks by id or id prefix ("dev" selects dev.*); unknown names are an error."""
    only, skip = list(only), list(skip)
    for name in [*only, *skip]:
        if not any(_matches(c.id, name) for c in CHECKS):
            raise UnknownCheckError(f"unknown check {name!r}; see `ct200-doctor list-checks`")
    return tuple(
        c
        for c in CHECKS
        if (not only or any(_matches(c.id, n) for n in only))
        and not any(_matches(c.id, n) for n in skip)
    )


def _matches(check_id: str, name: str) -> bool:
    return check_id == name or check_id.startswith(name.rstrip(".") + ".")


def run_checks(
    facts: Facts, spec: SiteSpec | None, checks: Iterable[Check] = CHECKS
) -> list[Finding]:
    ctx = Context(facts, spec)
    return [run_check(c, ctx) for c in checks]
