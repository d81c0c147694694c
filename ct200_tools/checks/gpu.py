"""gpu.*: CUDA really initialising, and the GPUs themselves: count, model, PCIe link
capability, persistence, memory health, clocks."""

from __future__ import annotations

from ct200_tools.checks import dev
from ct200_tools.checks.base import (
    Context,
    Outcome,
    Remedy,
    check,
    failed,
    passed,
    plural,
    skipped,
)
from ct200_tools.checks.driver import MODULE_FIX
from ct200_tools.facts import GpuFacts

#: sysfs link speed -> PCIe generation.
SPEED_GEN = {"2.5": 1, "5.0": 2, "8.0": 3, "16.0": 4, "32.0": 5, "64.0": 6}
#: nvmlClocksEventReason bits that mean the GPU is being held back by hardware or heat.
SLOWDOWN_REASONS = {
    0x8: "HW slowdown",
    0x20: "SW thermal slowdown",
    0x40: "HW thermal slowdown",
    0x80: "HW power brake",
}


def gen_of(speed: str | None) -> int | None:
    return SPEED_GEN.get(speed.split()[0]) if speed else None


def _gpus(ctx: Context) -> tuple[GpuFacts, ...] | None:
    return ctx.facts.nvml.gpus if ctx.facts.nvml is not None else None


def _libcuda_error(error: str | None) -> str:
    """The probe's "libcuda.so.1 not found: libcuda.so.1: cannot open shared object file: ..."
    said once: "libcuda.so.1 not found (cannot open shared object file: ...)"."""
    if not error:
        return "libcuda.so.1 could not be loaded"
    head, sep, detail = error.partition(": ")
    if sep and head == "libcuda.so.1 not found":
        detail = detail.removeprefix("libcuda.so.1: ")
        return f"{head} ({detail})"
    return error


def _no_nvml(ctx: Context) -> Outcome:
    return skipped(
        "NVML unavailable (see driver.nvml)", ctx.unreadable("nvml") or "", caused_by="driver.nvml"
    )


@check(
    "gpu.cuda_init",
    "CUDA initialises",
    "error",
    needs=("cuda", "kernel", "devices", "nvml", "pci"),
    tags=(*dev.TAGS,),
)
def check_cuda_init(ctx: Context) -> Outcome:
    """cuInit(0) returns CUDA_SUCCESS in a child process within the timeout. nvidia-smi can
    work while this fails (999 CUDA_ERROR_UNKNOWN when /dev/nvidia-uvm is denied); the finding
    names the node, errno and the exact host config line that fixes it."""
    c = ctx.facts.cuda
    if c is None:
        return skipped("CUDA was not probed", ctx.unreadable("cuda") or "")
    if c.code == 0:
        return passed(
            f"cuInit ok, {plural(c.device_count or 0, 'device')}, in {c.duration_s or 0:.2f} s"
        )
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
            f"CUDA unavailable: {_libcuda_error(c.error)}; the NVIDIA kernel module is not loaded",
            MODULE_FIX,
        )
    if c.code is None:
        return failed(
            f"CUDA unavailable: {_libcuda_error(c.error)}",
            Remedy(
                "install the NVIDIA userspace driver (libcuda.so.1) matching the kernel module",
                "container" if ctx.in_container else "this machine",
                "sh NVIDIA-Linux-x86_64-<version>.run --no-kernel-module --silent",
            ),
        )
    head = f"cuInit returned {c.code} {c.name or ''}".strip()
    if not module_loaded:
        return failed(f"{head}: the NVIDIA kernel module is not loaded", MODULE_FIX)
    node_problems = dev.problems(ctx)
    if node_problems:
        return failed(
            f"{head}: {node_problems[0].message}",
            dev.remedy_for(ctx, node_problems),
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


@check(
    "gpu.count",
    "GPU count matches the spec",
    "error",
    needs=("nvml", "pci", "cuda", "kernel"),
    needs_spec=True,
    tags=("lxc_passthrough",),
)
def check_count(ctx: Context) -> Outcome:
    """NVML (and CUDA) see gpus.count GPUs."""
    want = ctx.site.gpus.count
    gpus = _gpus(ctx)
    pci = ctx.facts.pci
    if gpus is None:
        if pci is None:
            return _no_nvml(ctx)
        seen, via = len(pci), "on the PCI bus (NVML unavailable)"
    else:
        seen, via = len(gpus), "through NVML"
    cuda = ctx.facts.cuda
    evidence = [f"{plural(seen, 'GPU')} {via}"]
    if cuda is not None and cuda.device_count is not None:
        evidence.append(f"CUDA sees {cuda.device_count}")
    if seen == want and (cuda is None or cuda.device_count in (None, want)):
        return passed(f"{plural(want, 'GPU')} as the spec expects", *evidence)
    return failed(
        f"expected {plural(want, 'GPU')}, found {seen}"
        if seen != want
        else f"{plural(seen, 'GPU')} found but CUDA sees {cuda.device_count if cuda else '?'}",
        Remedy(
            "pass every GPU through (dev entries /dev/nvidia0..N-1) and make sure no "
            "CUDA_VISIBLE_DEVICES hides one; a GPU missing on the host too has fallen off "
            "the bus (dmesg | grep -i xid)",
            ctx.host_where,
            "nvidia-smi -L",
            "lxc_passthrough",
        ),
        *evidence,
    )


@check("gpu.model", "GPU model matches the spec", "error", needs=("nvml",), needs_spec=True)
def check_model(ctx: Context) -> Outcome:
    """Every GPU's name contains gpus.model."""
    gpus = _gpus(ctx)
    if gpus is None:
        return _no_nvml(ctx)
    want = ctx.site.gpus.model.lower()
    wrong = [g for g in gpus if want not in g.name.lower()]
    if not wrong:
        return passed(f"all GPUs are {ctx.site.gpus.model}", *sorted({g.name for g in gpus}))
    return failed(
        f"{plural(len(wrong), 'GPU is', 'GPUs are')} not {ctx.site.gpus.model!r}",
        Remedy("correct gpus.model in the site spec, or check the hardware", "this machine"),
        *[f"GPU{g.index} {g.pci_bus_id}: {g.name}" for g in wrong],
    )


@check("gpu.pcie_link", "PCIe link capability", "error", needs=("nvml", "pci"), needs_spec=True)
def check_pcie_link(ctx: Context) -> Outcome:
    """Each GPU's maximum negotiated link reaches gpus.pcie gen and width. The current link
    speed drops at idle (32 -> 2.5 GT/s on RTX PRO 6000): that is not a fault and is only shown
    as evidence."""
    want = ctx.site.gpus.pcie
    if want is None:
        return skipped("gpus.pcie not set in the spec")
    gpus = _gpus(ctx)
    if gpus is None:
        return _no_nvml(ctx)
    pci = {p.bdf: p for p in ctx.facts.pci or ()}
    bad, evidence = [], []
    for g in gpus:
        p = pci.get(g.pci_bus_id)
        gen = g.link_gen_max or (gen_of(p.max_link_speed) if p else None)
        width = g.link_width_max or (p.max_link_width if p else None)
        line = f"GPU{g.index} {g.pci_bus_id}: max Gen{gen} x{width}"
        if g.link_gen_current is not None and (g.link_gen_current, g.link_width_current) != (
            gen,
            width,
        ):
            line += (
                f" (now Gen{g.link_gen_current} x{g.link_width_current}: idle downshift is normal)"
            )
        evidence.append(line)
        if gen is None or width is None:
            continue
        if gen < want.gen or width < want.width:
            bad.append(g.index)
    if bad:
        return failed(
            f"{'GPU' if len(bad) == 1 else 'GPUs'} {', '.join(map(str, bad))} cannot train to "
            f"Gen{want.gen} x{want.width}",
            Remedy(
                "reseat the card or riser and check the slot's BIOS link setting; the maximum "
                "link is what the card and slot negotiated at boot",
                "host",
                "nvidia-smi -q -d PCIE",
            ),
            *evidence,
        )
    return passed(f"every GPU can link at Gen{want.gen} x{want.width}", *evidence)


@check("gpu.persistence", "persistence mode", "warning", needs=("nvml",), tags=("host_devices",))
def check_persistence(ctx: Context) -> Outcome:
    """Persistence mode keeps the driver initialised between CUDA processes; run
    nvidia-persistenced on the host."""
    gpus = _gpus(ctx)
    if gpus is None:
        return _no_nvml(ctx)
    off = [g.index for g in gpus if g.persistence_mode is False]
    if not off:
        return passed("persistence mode on (or not reported)")
    return failed(
        f"persistence mode off on {'GPU' if len(off) == 1 else 'GPUs'} "
        f"{', '.join(map(str, off))}: each CUDA start re-initialises the GPU",
        Remedy(
            "run the persistence daemon at boot",
            "host",
            "systemctl enable --now nvidia-persistenced",
            "host_devices",
        ),
    )


@check("gpu.memory_health", "GPU memory health", "error", needs=("nvml",))
def check_memory_health(ctx: Context) -> Outcome:
    """No failed row remapping (fail: RMA) and no pending remap or retired page (warn: reset the
    GPU when idle)."""
    gpus = _gpus(ctx)
    if gpus is None:
        return _no_nvml(ctx)
    bad, warn = [], []
    for g in gpus:
        rr = g.remapped_rows
        if rr is not None and rr.failure:
            bad.append(f"GPU{g.index}: row remapping failed (uncorrectable={rr.uncorrectable})")
        elif rr is not None and rr.pending:
            warn.append(f"GPU{g.index}: row remap pending, needs a GPU reset")
        if g.retired_pages_pending:
            warn.append(f"GPU{g.index}: retired pages pending, needs a GPU reset")
    if bad:
        return failed(
            "GPU memory has failed row remapping",
            Remedy(
                "take the GPU out of service and RMA it (nvidia-smi -q -d ROW_REMAPPER)",
                "host",
                "nvidia-smi -q -d ROW_REMAPPER",
            ),
            *bad,
            *warn,
        )
    if warn:
        return failed(
            "GPU memory repair pending",
            Remedy(
                "reset the GPU when idle (or reboot the host)",
                "host",
                "nvidia-smi -q -d ROW_REMAPPER",
            ),
            *warn,
            warn_only=True,
        )
    return passed("no pending or failed memory remaps")


@check("gpu.clocks", "no clock slowdown", "warning", needs=("nvml",))
def check_clocks(ctx: Context) -> Outcome:
    """No hardware, thermal or power-brake slowdown is holding clocks back."""
    gpus = _gpus(ctx)
    if gpus is None:
        return _no_nvml(ctx)
    slow = []
    for g in gpus:
        reasons = [
            name for bit, name in SLOWDOWN_REASONS.items() if (g.clocks_event_reasons or 0) & bit
        ]
        if reasons:
            slow.append(f"GPU{g.index}: {', '.join(reasons)}")
    if not slow:
        return passed("no hardware or thermal clock slowdown")
    return failed(
        "GPU clocks held back",
        Remedy(
            "check cooling, power cables and power limits", "host", "nvidia-smi -q -d PERFORMANCE"
        ),
        *slow,
    )
