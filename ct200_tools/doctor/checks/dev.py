"""Device nodes: present, right major, openable -- and the root cause when CUDA cannot start.

The incident: /dev/nvidia-uvm's major is dynamic (511 on CT200 that day). A container whose
cgroup allows a stale major gets EPERM on open(), and cuInit returns 999 while nvidia-smi works.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
from ct200_tools.facts import DevNode
from ct200_tools.spec import NVIDIA_CORE_NODES

CORE = NVIDIA_CORE_NODES
_GPU_NODE = re.compile(r"^/dev/nvidia(\d+)$")


#: /proc/devices name that owns each node family.
def driver_of(path: str) -> str | None:
    if _GPU_NODE.match(path) or path in ("/dev/nvidiactl", "/dev/nvidia-modeset"):
        return "nvidia"
    if path in ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"):
        return "nvidia-uvm"
    if path.startswith("/dev/nvidia-caps/"):
        return "nvidia-caps"
    if path.startswith("/dev/nvidia-nvswitch"):
        return "nvidia-nvswitch"
    if path == "/dev/nvidia-nvlink":
        return "nvidia-nvlink"
    return None


def expected_gpu_count(ctx: Context) -> int | None:
    if ctx.spec is not None:
        return ctx.spec.gpus.count
    f = ctx.facts
    if f.nvml is not None:
        return len(f.nvml.gpus)
    if f.pci:
        return len(f.pci)
    return None


def expected_nodes(ctx: Context) -> list[str]:
    """Every node the machine's GPUs need (what the container config passes through)."""
    n = expected_gpu_count(ctx)
    gpus = [f"/dev/nvidia{i}" for i in range(n)] if n else []
    if n is None and ctx.facts.devices:
        gpus = [d.path for d in ctx.facts.devices.nodes if _GPU_NODE.match(d.path) and d.exists]
    return [*CORE, *gpus]


def in_scope(ctx: Context, path: str) -> bool:
    """A run scoped to one server judges the core nodes and its own GPUs' nodes only."""
    m = _GPU_NODE.match(path)
    return ctx.scope is None or m is None or int(m.group(1)) in ctx.scope.gpus


def checked_nodes(ctx: Context) -> list[str]:
    """The nodes this run judges: expected_nodes, within the scope's GPUs."""
    return [p for p in expected_nodes(ctx) if in_scope(ctx, p)]


@dataclass(frozen=True)
class NodeProblem:
    path: str
    kind: str  # missing | not_char | wrong_major | denied | no_access | no_device | open_error
    message: str
    expected_major: int | None


def node_problem(node: DevNode | None, path: str, majors: dict[str, int]) -> NodeProblem | None:
    drv = driver_of(path)
    want = majors.get(drv) if drv else None
    if drv == "nvidia" and want is None:
        want = majors.get("nvidiactl")
    if node is None or not node.exists:
        return NodeProblem(path, "missing", f"{path} does not exist", want)
    if not node.is_char:
        return NodeProblem(path, "not_char", f"{path} is not a character device", want)
    actual = f"c {node.major}:{node.minor}"
    if want is not None and node.major != want:
        return NodeProblem(
            path,
            "wrong_major",
            f"{path} is {actual} but /proc/devices gives {drv} major {want} (stale node)",
            want,
        )
    e = node.open_errno
    if not e:
        return None
    name = errno.errorcode.get(e, str(e))
    if e == errno.EPERM:
        return NodeProblem(
            path, "denied", f"the device cgroup denies {actual} ({drv}): open({path}) = EPERM", want
        )
    if e == errno.EACCES:
        mode = f"{node.mode:04o}" if node.mode is not None else "?"
        return NodeProblem(path, "no_access", f"open({path}) = EACCES: mode {mode}", want)
    if e in (errno.ENXIO, errno.ENODEV):
        return NodeProblem(
            path, "no_device", f"open({path}) = {name}: no driver behind {actual}", want
        )
    return NodeProblem(path, "open_error", f"open({path}) = {name}", want)


def problems(ctx: Context, paths: list[str] | None = None) -> list[NodeProblem]:
    dev = ctx.facts.devices
    if dev is None:
        return []
    out = []
    for p in paths if paths is not None else checked_nodes(ctx):
        pr = node_problem(dev.node(p), p, dev.majors)
        if pr is not None:
            out.append(pr)
    return out


def _vmid(ctx: Context) -> str:
    return str(ctx.spec.pve.vmid) if ctx.spec and ctx.spec.pve else "<vmid>"


def _raw_lxc(ctx: Context) -> bool:
    return bool(ctx.spec and ctx.spec.pve and ctx.spec.pve.passthrough == "raw-lxc")


def passthrough_nodes(ctx: Context) -> list[str]:
    """Every node the container needs passed through, GPUs first (the devN block's order)."""
    nodes = expected_nodes(ctx)
    return [*(p for p in nodes if _GPU_NODE.match(p)), *(p for p in nodes if p in CORE)]


#: Node problems an LXC container's config fixes (the host passes the node through and its
#: cgroup allows the node's current major); anything else is fixed where the node is made.
_PASSTHROUGH = ("denied", "missing", "not_char", "wrong_major")


def remedy_for(ctx: Context, prs: Sequence[NodeProblem]) -> Remedy:
    """One fix for all the node problems given, where it must be applied: applying it once
    fixes every node, so an operator never restarts the container to find the next one."""
    if ctx.in_container and _raw_lxc(ctx) and any(pr.kind in _PASSTHROUGH for pr in prs):
        return _raw_lxc_fix(ctx, [pr for pr in prs if pr.kind in _PASSTHROUGH])
    if ctx.in_container and any(pr.kind in (*_PASSTHROUGH, "no_access") for pr in prs):
        return _devn_fix(ctx)
    parts = [
        fix(ctx, group)
        for kinds, fix in _LOCAL_FIXES
        if (group := [pr for pr in prs if pr.kind in kinds])
    ]
    if not parts:
        return _devn_fix(ctx)
    return Remedy(
        "; ".join(p.action for p in parts),
        parts[0].where,
        "\n".join(p.command for p in parts if p.command) or None,
        next((p.tag for p in parts if p.tag), None),
        tuple(line for p in parts for line in p.config),
        next((p.file for p in parts if p.file), None),
    )


def _devn_fix(ctx: Context) -> Remedy:
    conf, vmid = f"/etc/pve/lxc/{_vmid(ctx)}.conf", _vmid(ctx)
    lines = [f"dev{i}: {p},mode=0666" for i, p in enumerate(passthrough_nodes(ctx))]
    return Remedy(
        f"make these the NVIDIA device entries of {conf}, replacing every devN line there "
        f"that names a /dev/nvidia* node (number other devices after dev{len(lines) - 1}); "
        "pve-container then allows each node's current major at every start. The nodes must "
        f"exist on the host first (nvidia-modprobe -u -c0), then pct reboot {vmid}",
        "host",
        None,
        "lxc_passthrough",
        tuple(lines),
        conf,
    )


def _raw_lxc_fix(ctx: Context, prs: Sequence[NodeProblem]) -> Remedy:
    conf, vmid = f"/etc/pve/lxc/{_vmid(ctx)}.conf", _vmid(ctx)
    majors: dict[str, str] = {}
    for pr in prs:
        drv = driver_of(pr.path) or "nvidia"
        majors.setdefault(
            str(pr.expected_major) if pr.expected_major is not None else f"<{drv} major>", drv
        )
    lines = [f"lxc.cgroup2.devices.allow: c {m}:* rwm" for m in majors]
    lines += [
        f"lxc.mount.entry: {pr.path} {pr.path[1:]} none bind,optional,create=file"
        for pr in prs
        if pr.kind in ("missing", "not_char")
    ]
    drivers = sorted(set(majors.values()))
    awk = " ".join(f"awk '$2==\"{d}\"{{print $1}}' /proc/devices;" for d in drivers)
    return Remedy(
        f"add these lines to {conf} with the majors the host has now ({awk.rstrip(';')}) and "
        f"delete allow lines for older majors of {', '.join(drivers)}, then pct reboot {vmid}",
        "host",
        None,
        "lxc_passthrough",
        tuple(lines),
        conf,
    )


def _create_fix(ctx: Context, prs: Sequence[NodeProblem]) -> Remedy:
    cmds = []
    if any(driver_of(pr.path) == "nvidia-uvm" for pr in prs):
        cmds.append("nvidia-modprobe -u -c0")
    gpus = sorted({int(m.group(1)) for pr in prs if (m := _GPU_NODE.match(pr.path))})
    if not gpus and any(pr.path == "/dev/nvidiactl" for pr in prs) and not cmds:
        gpus = [0]  # nvidia-modprobe -c N makes /dev/nvidiactl beside /dev/nvidiaN
    cmds += [f"nvidia-modprobe -c {i}" for i in gpus]
    return Remedy(
        "create the missing NVIDIA device nodes: " + ", ".join(pr.path for pr in prs),
        ctx.host_where,
        "\n".join(cmds),
        "host_devices",
    )


def _chmod_fix(ctx: Context, prs: Sequence[NodeProblem]) -> Remedy:
    return Remedy(
        "make the nodes readable and writable for the serving user",
        ctx.host_where,
        "chmod 0666 " + " ".join(pr.path for pr in prs),
        "host_devices",
    )


def _allow_fix(ctx: Context, prs: Sequence[NodeProblem]) -> Remedy:
    drivers = sorted({driver_of(pr.path) or "nvidia" for pr in prs})
    return Remedy(
        "the cgroup of this process denies "
        + ", ".join(f"c {pr.expected_major}:* ({driver_of(pr.path)})" for pr in _by_major(prs))
        + "; allow it where the cgroup is made (systemd unit: DeviceAllow=; docker: --device "
        "or the NVIDIA runtime)",
        "this machine",
        None,
        None,
        tuple(f"DeviceAllow=char-{d} rw" for d in drivers),
        # No path: the unit is whatever starts this program (`systemctl edit UNIT` writes one).
        "the [Service] section of the systemd unit that starts the program",
    )


def _recreate_fix(ctx: Context, prs: Sequence[NodeProblem]) -> Remedy:
    gpus = sorted({int(m.group(1)) for pr in prs if (m := _GPU_NODE.match(pr.path))})
    make = " ".join(["nvidia-modprobe -u -c0", *(f"&& nvidia-modprobe -c {i}" for i in gpus)])
    return Remedy(
        "re-create the nodes from the driver's current majors (the driver reloaded since they "
        "were made)",
        ctx.host_where,
        f"rm -f {' '.join(pr.path for pr in prs)} && {make}",
        "host_devices",
    )


def _by_major(prs: Sequence[NodeProblem]) -> list[NodeProblem]:
    seen: dict[int | None, NodeProblem] = {}
    for pr in prs:
        seen.setdefault(pr.expected_major, pr)
    return list(seen.values())


_LOCAL_FIXES: tuple[tuple[tuple[str, ...], Callable[[Context, Sequence[NodeProblem]], Remedy]], ...]
_LOCAL_FIXES = (
    (("missing",), _create_fix),
    (("wrong_major", "not_char", "no_device", "open_error"), _recreate_fix),
    (("no_access",), _chmod_fix),
    (("denied",), _allow_fix),
)


def host_node_fix(ctx: Context, prs: Sequence[NodeProblem]) -> Remedy:
    """The fix for node problems on the host itself (missing, not a node, stale major): made
    there with nvidia-modprobe, whatever this machine is (host.nodes)."""
    parts = [
        fix(ctx, group)
        for kinds, fix in _LOCAL_FIXES[:2]
        if (group := [pr for pr in prs if pr.kind in kinds])
    ]
    return Remedy(
        "; ".join(p.action for p in parts),
        "host",
        "\n".join(p.command for p in parts if p.command),
        "host_devices",
    )


def _evidence(ctx: Context) -> list[str]:
    dev = ctx.facts.devices
    if dev is None:
        return []
    majors = {k: v for k, v in dev.majors.items() if k.startswith("nvidia")}
    return [f"/proc/devices: {majors or 'no nvidia drivers registered'}"]


def _module_missing(ctx: Context) -> bool:
    k = ctx.facts.kernel
    return (
        k is not None and not k.nvidia_module_version and not ctx.unreadable("kernel.nvidia_module")
    )


#: The playbook tags remedy_for names.
TAGS = ("lxc_passthrough", "host_devices")


@check(
    "dev.nodes",
    "device nodes present",
    "error",
    needs=("devices", "kernel", "nvml", "pci"),
    tags=TAGS,
)
def check_nodes_present(ctx: Context) -> Outcome:
    """/dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools and /dev/nvidia0..N-1 exist as
    character devices. In an LXC container they come from devN: entries (or lxc.mount.entry
    lines); on the host from nvidia-modprobe -u -c0. The fix covers every missing node."""
    if ctx.facts.devices is None:
        return skipped("device nodes not read", ctx.unreadable("devices") or "")
    if _module_missing(ctx):
        return skipped(
            "the NVIDIA kernel module is not loaded (see driver.module)", caused_by="driver.module"
        )
    want = checked_nodes(ctx)
    missing = [pr for pr in problems(ctx, want) if pr.kind in ("missing", "not_char")]
    if not missing:
        return passed(f"{plural(len(want), 'device node')} present", *want)
    return failed(
        f"{len(missing)} of {plural(len(want), 'device node')} missing",
        remedy_for(ctx, missing),
        *[pr.message for pr in missing],
        *_evidence(ctx),
    )


def uvm_module_fix(ctx: Context) -> Remedy:
    restart = (
        f", then pct reboot {_vmid(ctx)} so the container gets them" if ctx.in_container else ""
    )
    return Remedy(
        "load nvidia_uvm and create its nodes, and persist it in /etc/modules-load.d/nvidia.conf"
        + restart,
        ctx.host_where,
        "modprobe nvidia_uvm && nvidia-modprobe -u -c0",
        "host_devices",
    )


@check(
    "dev.majors",
    "device node majors are current",
    "error",
    needs=("devices", "kernel"),
    tags=TAGS,
)
def check_node_majors(ctx: Context) -> Outcome:
    """Each node's major equals its driver's major in /proc/devices, and nvidia-uvm is there at
    all (else the nvidia_uvm module is not loaded and CUDA cannot start). nvidia-uvm's major is
    dynamic (511, 238, 508...): a node or an lxc.cgroup2.devices.allow line made for an older
    major is stale after a driver update or reboot."""
    dev = ctx.facts.devices
    if dev is None:
        return skipped("device nodes not read", ctx.unreadable("devices") or "")
    if not any(k.startswith("nvidia") for k in dev.majors):
        if ctx.unreadable("devices.proc_devices"):
            return skipped("/proc/devices not read", ctx.unreadable("devices.proc_devices") or "")
        return skipped(
            "no NVIDIA driver in /proc/devices (see driver.module)", caused_by="driver.module"
        )
    present = [n.path for n in dev.nodes if n.exists and n.is_char and in_scope(ctx, n.path)]
    wrong = [pr for pr in problems(ctx, present) if pr.kind == "wrong_major"]
    if "nvidia-uvm" not in dev.majors:
        return failed(
            "nvidia-uvm is not in /proc/devices: the nvidia_uvm kernel module is not loaded",
            uvm_module_fix(ctx),
            *[w.message for w in wrong],
            *_evidence(ctx),
        )
    if not wrong:
        return passed("every NVIDIA node has its driver's current major", *_evidence(ctx))
    return failed(
        "stale device node majors",
        remedy_for(ctx, wrong),
        *[w.message for w in wrong],
        *_evidence(ctx),
    )


#: What dev.open counts as a node that cannot be opened (a stale major is dev.majors').
OPEN_FAILURES = ("denied", "no_access", "no_device", "open_error")


@check(
    "dev.open",
    "device nodes open read-write",
    "error",
    needs=("devices", "kernel", "nvml", "pci"),
    tags=TAGS,
)
def check_nodes_open(ctx: Context) -> Outcome:
    """open(O_RDWR) succeeds on each node, as libcuda's does. EPERM means the device cgroup
    denies the major:minor (the incident: nvidia-uvm not allowed in the LXC config; with
    c 195:* denied, /dev/nvidiactl and every /dev/nvidiaN); EACCES means file permissions;
    ENXIO/ENODEV a node with no driver behind it. The fix covers every node that fails."""
    dev = ctx.facts.devices
    if dev is None:
        return skipped("device nodes not read", ctx.unreadable("devices") or "")
    present = [
        p for p in checked_nodes(ctx) if (n := dev.node(p)) is not None and n.exists and n.is_char
    ]
    if not present:
        return skipped("no NVIDIA device nodes to open (see dev.nodes)", caused_by="dev.nodes")
    bad = [pr for pr in problems(ctx, present) if pr.kind in OPEN_FAILURES]
    if not bad:
        return passed(f"{plural(len(present), 'node')} open read-write", *present)
    return failed(
        f"{plural(len(bad), 'device node')} cannot be opened",
        remedy_for(ctx, bad),
        *[pr.message for pr in bad],
        *_evidence(ctx),
    )
