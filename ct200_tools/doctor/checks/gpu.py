"""gpu.*: CUDA really initialising, and the GPUs themselves: count, model, PCIe link
capability, persistence, memory health, clocks."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from ct200_tools.doctor.checks import dev
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
from ct200_tools.doctor.checks.driver import MODULE_FIX
from ct200_tools.facts import CudaFacts, CudaGpuInit, GpuFacts

#: One GPU's own node (not /dev/nvidiactl or /dev/nvidia-uvm, which every GPU needs).
_GPU_NODE = re.compile(r"^/dev/nvidia\d+$")
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
    """CUDA starts on every GPU within the timeout: by default one child per GPU, side by side,
    each with CUDA_VISIBLE_DEVICES naming its GPU alone, calls cuInit and retains and releases
    the GPU's primary context (with --cuda-init all, one cuInit(0) over every GPU). nvidia-smi
    can work while this fails (999 CUDA_ERROR_UNKNOWN when /dev/nvidia-uvm is denied); the
    finding names the node, errno and the exact host config line that fixes it. When some GPUs
    fail while the others start and their device nodes are fine, it names each failing GPU with
    its bus id: the GPU itself (Xid in the host's kernel log: fallen off the bus, memory
    errors) is at fault, and the fix is a reset or a reseat on the host."""
    c = ctx.facts.cuda
    if c is None:
        return skipped("CUDA was not probed", ctx.unreadable("cuda") or "")
    if c.gpus:
        return _per_gpu(ctx, c)
    if c.code == 0:
        return passed(
            f"cuInit ok, {plural(c.device_count or 0, 'device')}, in {c.duration_s or 0:.2f} s"
        )
    return _cuda_failed(ctx, c.code, c.name, c.timed_out, c.error)


def _cuda_failed(
    ctx: Context,
    code: int | None,
    name: str | None,
    timed_out: bool,
    error: str | None,
    step: str = "cuInit",
    on: str = "",
) -> Outcome:
    """Why CUDA does not start at all (one cuInit, or every GPU's child alike)."""
    if timed_out:
        return failed(
            error or "cuInit timed out",
            Remedy(
                "look for a hung GPU or driver on the host", "host", "dmesg | grep -E 'NVRM|Xid'"
            ),
        )
    module_loaded = bool(ctx.facts.kernel and ctx.facts.kernel.nvidia_module_version)
    if code is None and not module_loaded:
        return failed(
            f"CUDA unavailable: {_libcuda_error(error)}; the NVIDIA kernel module is not loaded",
            MODULE_FIX,
        )
    if code is None:
        return failed(
            f"CUDA unavailable: {_libcuda_error(error)}",
            Remedy(
                "install the NVIDIA userspace driver (libcuda.so.1) matching the kernel module",
                "container" if ctx.in_container else "this machine",
                "sh NVIDIA-Linux-x86_64-<version>.run --no-kernel-module --silent",
            ),
        )
    head = f"{step} returned {code} {name or ''}".strip() + on
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


def gpu_node(g: CudaGpuInit) -> str | None:
    """The /dev/nvidiaN a GPU's child opens: its minor, else its index."""
    n = g.minor if g.minor is not None else g.index
    return f"/dev/nvidia{n}" if n is not None else None


def node_problems_of(ctx: Context, failing: Sequence[CudaGpuInit]) -> list[dev.NodeProblem] | None:
    """The device-node problems that explain every failing GPU's child, or None when some
    failure has none: a GPU's own /dev/nvidiaN, or a node every GPU needs (/dev/nvidiactl,
    /dev/nvidia-uvm) when every GPU failed. A child that hung is never explained by a node (a
    denied or missing node fails at once)."""
    c = ctx.facts.cuda
    if c is None or not failing or any(g.timed_out for g in failing):
        return None
    shared: list[dev.NodeProblem] = []
    if len(failing) == len(c.gpus):
        shared = [pr for pr in dev.problems(ctx) if not _GPU_NODE.match(pr.path)]
    found = list(shared)
    for g in failing:
        path = gpu_node(g)
        own = dev.problems(ctx, [path]) if path else []
        if not (own or shared):
            return None
        found += [pr for pr in own if pr not in found]
    return found


def _failure(g: CudaGpuInit) -> str:
    if g.code is not None:
        return f"{g.step or 'cuInit'} returned {g.code} {g.name or ''}".strip()
    return g.error or "no result"


def _gpu_line(g: CudaGpuInit) -> str:
    if not g.ok:
        return f"{g.label}: {_failure(g)}"
    line = f"{g.label}: context ok"
    if g.duration_s is not None:
        line += f" in {g.duration_s:.2f} s"
    if g.cuinit_s is not None and g.context_s is not None:
        line += f" (cuInit {g.cuinit_s:.2f} s, context {g.context_s:.2f} s)"
    if g.cuda_bus_id and g.pci_bus_id and g.cuda_bus_id != g.pci_bus_id:
        line += f"; CUDA opened {g.cuda_bus_id}"
    return line


def _uniform(gpus: Sequence[CudaGpuInit]) -> bool:
    return len({(g.code, g.step, g.timed_out, g.error) for g in gpus}) == 1


def _per_gpu(ctx: Context, c: CudaFacts) -> Outcome:
    lines = [_gpu_line(g) for g in c.gpus]
    bad = c.failing
    n = len(c.gpus)
    if not bad:
        return passed(
            f"a CUDA context on each of {plural(n, 'GPU')} (one child per GPU) in "
            f"{c.duration_s or 0:.2f} s",
            *lines,
        )
    if len(bad) == n and _uniform(bad):
        g = bad[0]
        on = " on every GPU" if n > 1 else ""
        out = _cuda_failed(ctx, g.code, g.name, g.timed_out, g.error, g.step or "cuInit", on)
        if g.timed_out:
            who = g.label if n == 1 else "every GPU"
            out = dataclasses.replace(out, summary=f"{who}: {g.error}")
        return dataclasses.replace(out, evidence=(*out.evidence, *lines))
    prs = node_problems_of(ctx, bad)
    if prs:
        return failed(
            f"{bad[0].label}: {_failure(bad[0])}: {prs[0].message}",
            dev.remedy_for(ctx, prs),
            *[pr.message for pr in prs],
            *lines,
        )
    # Name the GPUs no node explains (a GPU whose own node is broken is dev.*'s, a root of
    # its own in the same report).
    lost = [g for g in bad if g.timed_out or not node_problems_of(ctx, [g])] or list(bad)
    return failed(_gpu_summary(ctx, lost, n - len(bad)), _gpu_fix(ctx, lost), *lines)


def _gpu_summary(ctx: Context, bad: Sequence[CudaGpuInit], started: int) -> str:
    what = "; ".join(f"{g.label}: {_failure(g)}" for g in bad)
    tail = f", while {plural(started, 'other GPU')} started" if started else ""
    nodes = [p for g in bad if (p := gpu_node(g))]
    if nodes and ctx.facts.devices is not None and not dev.problems(ctx, nodes):
        which = nodes[0] if len(nodes) == 1 else ", ".join(nodes)
        return (
            f"{what}{tail}; {which} open{'s' if len(nodes) == 1 else ''} fine, so the GPU "
            "itself (or the driver's state of it) is at fault"
        )
    return f"{what}{tail}"


def _gpu_fix(ctx: Context, bad: Sequence[CudaGpuInit]) -> Remedy:
    buses = [g.pci_bus_id or g.label for g in bad]
    first = buses[0]
    return Remedy(
        f"find the Xid errors of {', '.join(buses)} in the host's kernel log (Xid 79: fallen "
        "off the bus; 94/95: uncorrectable memory errors); reset the GPU while nothing uses it "
        f"(nvidia-smi -r -i {first}) and, if the reset fails, power-cycle the host and reseat "
        "the card",
        ctx.host_where,
        "dmesg -T | grep -E 'NVRM|Xid'",
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
