"""Device nodes: present, right major, openable -- and the root cause when CUDA cannot start.

The incident: /dev/nvidia-uvm's major is dynamic (511 on CT200 that day). A container whose
cgroup allows a stale major gets EPERM on open(), and cuInit returns 999 while nvidia-smi works.
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass

from ct200_tools.checks.base import Context, Outcome, Remedy, check, failed, passed, skipped
from ct200_tools.facts import DevNode

CORE = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
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
    n = expected_gpu_count(ctx)
    gpus = [f"/dev/nvidia{i}" for i in range(n)] if n else []
    if n is None and ctx.facts.devices:
        gpus = [d.path for d in ctx.facts.devices.nodes if _GPU_NODE.match(d.path) and d.exists]
    return [*CORE, *gpus]


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
    for p in paths if paths is not None else expected_nodes(ctx):
        pr = node_problem(dev.node(p), p, dev.majors)
        if pr is not None:
            out.append(pr)
    return out


def _vmid(ctx: Context) -> str:
    return str(ctx.spec.pve.vmid) if ctx.spec and ctx.spec.pve else "<vmid>"


def _raw_lxc(ctx: Context) -> bool:
    return bool(ctx.spec and ctx.spec.pve and ctx.spec.pve.passthrough == "raw-lxc")


def remedy_for(ctx: Context, pr: NodeProblem) -> Remedy:
    """The exact fix for one node problem, where it must be applied."""
    major = str(pr.expected_major) if pr.expected_major is not None else "<major>"
    drv = driver_of(pr.path) or "nvidia"
    conf = f"/etc/pve/lxc/{_vmid(ctx)}.conf"
    if ctx.in_container:
        if pr.kind in ("denied", "missing", "wrong_major") and _raw_lxc(ctx):
            lines = [f"lxc.cgroup2.devices.allow: c {major}:* rwm"]
            if pr.kind == "missing":
                lines.append(
                    f"lxc.mount.entry: {pr.path} {pr.path[1:]} none bind,optional,create=file"
                )
            return Remedy(
                f"allow {drv}'s current major {major} in {conf} (read it with "
                f"awk '$2==\"{drv}\"{{print $1}}' /proc/devices), then pct reboot {_vmid(ctx)}",
                "host",
                "\n".join(lines),
                "lxc_passthrough",
            )
        if pr.kind in ("denied", "missing", "wrong_major"):
            return Remedy(
                f"pass the node through by path in {conf} (pve-container then "
                f"allows its current major at every start; N = the next free dev index), "
                f"make sure it exists on the host first (nvidia-modprobe -u -c0), then "
                f"pct reboot {_vmid(ctx)}",
                "host",
                f"devN: {pr.path},mode=0666",
                "lxc_passthrough",
            )
    if pr.kind == "missing" and drv == "nvidia-uvm":
        return Remedy(
            "load nvidia_uvm and create its nodes",
            ctx.host_where,
            "nvidia-modprobe -u -c0",
            "host_devices",
        )
    if pr.kind == "missing":
        m = _GPU_NODE.match(pr.path)
        return Remedy(
            "create the NVIDIA device nodes",
            ctx.host_where,
            f"nvidia-modprobe -c {m.group(1) if m else 0}",
            "host_devices",
        )
    if pr.kind == "no_access":
        return Remedy(
            "make the node readable and writable for the serving user",
            ctx.host_where,
            f"chmod 0666 {pr.path}",
            "host_devices",
        )
    if pr.kind == "denied":
        return Remedy(
            f"the cgroup of this process denies c {major}:*; allow it where the cgroup is made "
            "(systemd unit: DeviceAllow=; docker: --device or the NVIDIA runtime)",
            "this machine",
            f"DeviceAllow=char-{drv} rw",
            None,
        )
    return Remedy(
        "re-create the node from the driver's current major (the driver reloaded since it was "
        "made)",
        ctx.host_where,
        f"rm -f {pr.path} && nvidia-modprobe -u -c0",
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
    lines); on the host from nvidia-modprobe -u -c0."""
    if ctx.facts.devices is None:
        return skipped("device nodes not read", ctx.unreadable("devices") or "")
    if _module_missing(ctx):
        return skipped(
            "the NVIDIA kernel module is not loaded (see driver.module)", caused_by="driver.module"
        )
    want = expected_nodes(ctx)
    missing = [pr for pr in problems(ctx, want) if pr.kind in ("missing", "not_char")]
    if not missing:
        return passed(f"{len(want)} device nodes present", *want)
    return failed(
        f"{len(missing)} of {len(want)} device nodes missing",
        remedy_for(ctx, missing[0]),
        *[pr.message for pr in missing],
        *_evidence(ctx),
    )


@check(
    "dev.majors",
    "device node majors are current",
    "error",
    needs=("devices", "kernel"),
    tags=TAGS,
)
def check_node_majors(ctx: Context) -> Outcome:
    """Each node's major equals its driver's major in /proc/devices. nvidia-uvm's major is
    dynamic (511, 238, 508...): a node or an lxc.cgroup2.devices.allow line made for an older
    major is stale after a driver update or reboot."""
    dev = ctx.facts.devices
    if dev is None:
        return skipped("device nodes not read", ctx.unreadable("devices") or "")
    if not any(k.startswith("nvidia") for k in dev.majors):
        return skipped(
            "no NVIDIA driver in /proc/devices (see driver.module)", caused_by="driver.module"
        )
    present = [n.path for n in dev.nodes if n.exists and n.is_char]
    wrong = [pr for pr in problems(ctx, present) if pr.kind == "wrong_major"]
    if not wrong:
        return passed("every NVIDIA node has its driver's current major", *_evidence(ctx))
    return failed(
        "stale device node majors",
        remedy_for(ctx, wrong[0]),
        *[w.message for w in wrong],
        *_evidence(ctx),
    )


@check(
    "dev.open",
    "device nodes open read-write",
    "error",
    needs=("devices", "kernel", "nvml", "pci"),
    tags=TAGS,
)
def check_nodes_open(ctx: Context) -> Outcome:
    """open(O_RDWR) succeeds on each node, as libcuda's does. EPERM means the device cgroup
    denies the major:minor (the incident: nvidia-uvm not allowed in the LXC config); EACCES
    means file permissions; ENXIO/ENODEV a node with no driver behind it."""
    dev = ctx.facts.devices
    if dev is None:
        return skipped("device nodes not read", ctx.unreadable("devices") or "")
    present = [
        p for p in expected_nodes(ctx) if (n := dev.node(p)) is not None and n.exists and n.is_char
    ]
    if not present:
        return skipped("no NVIDIA device nodes to open (see dev.nodes)", caused_by="dev.nodes")
    bad = [
        pr
        for pr in problems(ctx, present)
        if pr.kind in ("denied", "no_access", "no_device", "open_error")
    ]
    if not bad:
        return passed(f"{len(present)} nodes open read-write", *present)
    return failed(
        f"{len(bad)} device node(s) cannot be opened",
        remedy_for(ctx, bad[0]),
        *[pr.message for pr in bad],
        *_evidence(ctx),
    )
