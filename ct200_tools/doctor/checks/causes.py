"""Root causes as data: which check's failure explains another check's failure.

One fault often fails several checks: with c 195:* denied, dev.open fails, cuInit fails and
nvmlInit says "Unknown Error". Only the first is the cause; the others are its consequences,
and a consequence offering its own fix ("read the kernel log") is a wrong lead. Each rule below
names an effect, the root whose failure explains it, and the facts in which that holds (a
denied /dev/nvidia-uvm explains cuInit failing, not NVML failing: NVML never opens it).
run_checks (checks/__init__.py) applies the first rule, in this order, whose root fails and
whose condition holds: the effect then names the root (`caused_by`, followed to the end of the
chain: dev.nodes <- dev.majors), carries the root's fix instead of its own, and the report shows
it under its root.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ct200_tools.doctor.checks import dev, server
from ct200_tools.doctor.checks.base import Context
from ct200_tools.doctor.checks.gpu import node_problems_of
from ct200_tools.host import pvecfg
from ct200_tools.tunings import TUNINGS


@dataclass(frozen=True)
class Cause:
    effect: str
    root: str
    #: When the link holds, for docs/checks.md.
    when: str
    holds: Callable[[Context], bool]


def _always(ctx: Context) -> bool:
    return True


#: Nodes NVML opens: nvidiactl and the GPUs' own (not nvidia-uvm, which only CUDA needs).
def _nvml_opens(path: str) -> bool:
    return path == "/dev/nvidiactl" or dev.driver_of(path) == "nvidia"


def _cuda_returned_error(ctx: Context) -> bool:
    """cuInit ran and failed (libcuda loaded, no timeout): a node problem can explain it. Per
    GPU: every GPU's child did so (a fault shared by all GPUs cannot explain some failing)."""
    c = ctx.facts.cuda
    if c is not None and c.gpus:
        return all(g.code not in (None, 0) and not g.timed_out for g in c.gpus)
    return c is not None and c.code not in (None, 0) and not c.timed_out


def _cuda_nodes(kinds: tuple[str, ...]) -> Callable[[Context], bool]:
    """cuInit failed and a node problem of these kinds explains it. Per GPU: every failing
    GPU is explained, by its own /dev/nvidiaN or by a node all GPUs need when all fail (see
    gpu.node_problems_of); a GPU failing beside healthy ones with a sound node is no node's."""

    def holds(ctx: Context) -> bool:
        c = ctx.facts.cuda
        if c is None or not c.gpus:
            return _cuda_returned_error(ctx) and _nodes(kinds)(ctx)
        prs = node_problems_of(ctx, c.failing)
        return prs is not None and any(pr.kind in kinds for pr in prs)

    return holds


def _cuda_short_by_failed_gpus(ctx: Context) -> bool:
    """Per GPU: CUDA counts fewer GPUs than the spec only because some GPUs' children failed;
    NVML (or the PCI bus) sees as many as the spec."""
    c, f = ctx.facts.cuda, ctx.facts
    if c is None or not c.failing or ctx.spec is None:
        return False
    seen = len(f.nvml.gpus) if f.nvml is not None else len(f.pci) if f.pci is not None else None
    return seen == ctx.spec.gpus.count


def _nvml_failed_on_nodes(ctx: Context) -> bool:
    """NVML could not start, and not because its library is missing (that is no node's fault)."""
    why = ctx.facts.unreadable.get("nvml") or ""
    return ctx.facts.nvml is None and not ("not installed" in why or "Library Not Found" in why)


def _nodes(kinds: tuple[str, ...], nvml_only: bool = False) -> Callable[[Context], bool]:
    def holds(ctx: Context) -> bool:
        return any(
            pr.kind in kinds and (not nvml_only or _nvml_opens(pr.path)) for pr in dev.problems(ctx)
        )

    return holds


def _both(*conds: Callable[[Context], bool]) -> Callable[[Context], bool]:
    return lambda ctx: all(c(ctx) for c in conds)


def _uvm_not_registered(ctx: Context) -> bool:
    d = ctx.facts.devices
    return d is not None and "nvidia-uvm" not in d.majors


def _missing_only_unregistered(ctx: Context) -> bool:
    """Every missing node belongs to a driver /proc/devices does not list (nvidia_uvm not
    loaded): loading it creates them, so the missing nodes are no separate fault."""
    d = ctx.facts.devices
    if d is None:
        return False
    missing = [pr for pr in dev.problems(ctx) if pr.kind == "missing"]
    return bool(missing) and all(dev.driver_of(pr.path) not in d.majors for pr in missing)


def _no_gpu_on_bus(ctx: Context) -> bool:
    return ctx.facts.nvml is None and ctx.facts.pci is not None and not ctx.facts.pci


def _versions_differ(ctx: Context) -> bool:
    k, n = ctx.facts.kernel, ctx.facts.nvml
    module = k.nvidia_module_version if k else None
    user = n.driver_version if n else None
    return bool(module and user) and module != user


#: How a node problem explains per-GPU results (gpu.node_problems_of).
_PER_GPU = "per GPU: the failing GPU's own /dev/nvidiaN, or a node every GPU needs when all fail"
_MISSING = ("missing", "not_char")
_STALE = ("wrong_major",)
_OPEN = dev.OPEN_FAILURES

CAUSES: tuple[Cause, ...] = (
    Cause("driver.nvml", "driver.module", "the NVIDIA kernel module is not loaded", _always),
    Cause("gpu.cuda_init", "driver.module", "the NVIDIA kernel module is not loaded", _always),
    Cause(
        "gpu.count",
        "driver.module",
        "no NVIDIA GPU on the PCI bus and no NVML (not a GPU machine)",
        _no_gpu_on_bus,
    ),
    Cause(
        "dev.nodes",
        "dev.majors",
        "every missing node belongs to a driver that /proc/devices does not list "
        "(nvidia_uvm not loaded)",
        _missing_only_unregistered,
    ),
    Cause(
        "gpu.cuda_init",
        "dev.majors",
        "cuInit returned an error and nvidia_uvm is not loaded",
        _both(_cuda_returned_error, _uvm_not_registered),
    ),
    Cause(
        "gpu.cuda_init",
        "dev.nodes",
        f"cuInit returned an error and a node it opens is missing ({_PER_GPU})",
        _cuda_nodes(_MISSING),
    ),
    Cause(
        "driver.nvml",
        "dev.nodes",
        "NVML failed (its library loaded) and /dev/nvidiactl or a /dev/nvidiaN is missing",
        _both(_nvml_failed_on_nodes, _nodes(_MISSING, nvml_only=True)),
    ),
    Cause(
        "gpu.cuda_init",
        "dev.majors",
        f"cuInit returned an error and a node it opens has a stale major ({_PER_GPU})",
        _cuda_nodes(_STALE),
    ),
    Cause(
        "driver.nvml",
        "dev.majors",
        "NVML failed (its library loaded) and /dev/nvidiactl or a /dev/nvidiaN has a stale major",
        _both(_nvml_failed_on_nodes, _nodes(_STALE, nvml_only=True)),
    ),
    Cause(
        "gpu.cuda_init",
        "dev.open",
        "cuInit returned an error and a node it opens cannot be opened (EPERM: the device "
        f"cgroup denies it; EACCES; ENXIO) ({_PER_GPU}: a cgroup denying every GPU is one "
        "root cause, not one per GPU)",
        _cuda_nodes(_OPEN),
    ),
    Cause(
        "driver.nvml",
        "dev.open",
        'NVML failed (its library loaded; e.g. nvmlInit\'s "Unknown Error") and /dev/nvidiactl '
        "or a /dev/nvidiaN cannot be opened",
        _both(_nvml_failed_on_nodes, _nodes(_OPEN, nvml_only=True)),
    ),
    Cause(
        "gpu.cuda_init",
        "driver.versions",
        "cuInit returned an error and the userspace driver is not the kernel module's version",
        _both(_cuda_returned_error, _versions_differ),
    ),
    Cause(
        "gpu.count",
        "gpu.cuda_init",
        "CUDA counts fewer GPUs only because some GPUs' own CUDA children failed (NVML sees "
        "as many as the spec)",
        _cuda_short_by_failed_gpus,
    ),
)


def _servers(effect: str, cond: Callable[..., bool]) -> Callable[[Context], bool]:
    """Every server failing `effect` meets `cond` (conditions per server, checks/server.py)."""
    return server.all_failing(server.JUDGES[effect], cond)


_GATE = server.gate_failed
CAUSES += (
    Cause(
        "server.unit",
        "gpu.cuda_init",
        "the unit failed to start, its server has GPUs, and CUDA does not initialise (its "
        "start gate stops it)",
        _servers("server.unit", server.both(_GATE, server.has_gpus)),
    ),
    Cause(
        "server.unit",
        "models.staged",
        "the unit failed to start and its model or draft is not staged",
        _servers("server.unit", server.both(_GATE, server.model_not_staged)),
    ),
    Cause(
        "server.unit",
        "server.engine",
        "the unit failed to start and the program it runs is missing",
        _servers("server.unit", server.both(_GATE, server.engine_bad)),
    ),
    Cause(
        "server.unit",
        "server.port_free",
        "the unit failed to start and another process holds its port",
        _servers("server.unit", server.both(_GATE, server.port_taken)),
    ),
    Cause(
        "server.port",
        "server.unit",
        "the port does not answer and the server's unit is not active",
        _servers("server.port", server.unit_down),
    ),
    Cause(
        "server.port",
        "server.unit",
        "the port does not answer and the server's process runs an older configuration",
        _servers("server.port", server.unit_stale),
    ),
    Cause(
        "server.models",
        "server.port_free",
        "another process holds the server's port: it is what answers",
        _servers("server.models", server.port_taken),
    ),
    Cause(
        "server.generate",
        "server.port_free",
        "another process holds the server's port: it is what answers",
        _servers("server.generate", server.port_taken),
    ),
)


def _host_uvm_missing(ctx: Context) -> bool:
    h = ctx.facts.host
    d = h.devices if h is not None else None
    return (
        d is not None
        and any(k.startswith("nvidia") for k in d.majors)
        and ("nvidia-uvm" not in d.majors)
    )


def _host_module_missing(ctx: Context) -> bool:
    h = ctx.facts.host
    d = h.devices if h is not None else None
    return (
        d is not None
        and not any(k.startswith("nvidia") for k in d.majors)
        and not ctx.unreadable("host.devices.proc_devices")
    )


def _missing_here_and_on_host(ctx: Context) -> bool:
    """A node missing here is missing on the host too: the host must make it first."""
    h = ctx.facts.host
    d = h.devices if h is not None else None
    if d is None:
        return False
    missing = [pr.path for pr in dev.problems(ctx) if pr.kind in _MISSING]
    return any((n := d.node(p)) is None or not n.exists for p in missing)


def _missing_here_not_passed(ctx: Context) -> bool:
    """A node missing here is not passed by the container's config (lxc.nodes names it)."""
    h = ctx.facts.host
    c = h.lxc if h is not None else None
    if c is None or c.text is None:
        return False
    passed = pvecfg.passed_nodes(pvecfg.parse(c.text))
    return any(pr.path not in passed for pr in dev.problems(ctx) if pr.kind in _MISSING)


def _denied_here(ctx: Context) -> bool:
    return any(pr.kind == "denied" for pr in dev.problems(ctx))


#: The host's side (check --host): the container's failures point at what the host shows.
CAUSES += (
    Cause(
        "driver.module",
        "host.nodes",
        "the host's /proc/devices lists no NVIDIA driver (check --host)",
        _host_module_missing,
    ),
    Cause(
        "dev.majors",
        "host.nodes",
        "nvidia_uvm is not loaded on the host (check --host)",
        _host_uvm_missing,
    ),
    Cause(
        "dev.nodes",
        "host.nodes",
        "a node missing here is missing on the host too (check --host)",
        _missing_here_and_on_host,
    ),
    Cause(
        "dev.nodes",
        "lxc.nodes",
        "a node missing here is not passed by the container's config (check --host)",
        _missing_here_not_passed,
    ),
    Cause(
        "dev.open",
        "lxc.majors",
        "the device cgroup denies a node here (EPERM) and the container's config allows a stale "
        "major or misses the current one (check --host)",
        _denied_here,
    ),
    Cause(
        "driver.versions",
        "host.driver",
        "the host's module is not this machine's userspace driver version (check --host)",
        _always,
    ),
)
#: Each tuning's container-side failure is the host's (ct200_tools.tunings: its cause text).
CAUSES += tuple(Cause(f"tune.{t.check}", f"host.{t.check}", t.cause, _always) for t in TUNINGS)


def _a_model_absent(ctx: Context) -> bool:
    """A model has nothing staged at all (not a damaged copy): its stage could not write it."""
    return any(
        (m.staged_tree.exists if m.staged_tree is not None else m.staged_exists) is False
        for m in ctx.facts.models or ()
    )


# /dev/shm too small (its fstab line shrunk): every stage fails "does not fit", and restaging
# the model, models.staged's own fix, fails the same way; the remount is the fix (issue 19).
CAUSES += (
    Cause(
        "models.staged",
        "mem.shm",
        "a model has nothing staged and /dev/shm is smaller than the spec says (or its models do "
        "not fit): its stage could not write it",
        _a_model_absent,
    ),
)


def rules_for(effect: str) -> tuple[Cause, ...]:
    return tuple(c for c in CAUSES if c.effect == effect)
