"""Device nodes: /proc/devices majors and every /dev/nvidia* node with its open() result."""

from __future__ import annotations

import contextlib
import re

from ct200_tools.doctor.probes.base import Reader
from ct200_tools.facts import DeviceFacts, DevNode

#: Nodes CUDA needs whatever the GPU count.
CORE_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def parse_proc_devices(text: str) -> dict[str, int]:
    """Character-device majors by name. Block devices are ignored; a name seen twice keeps
    its first major (the kernel lists each registration)."""
    majors: dict[str, int] = {}
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.endswith(":"):
            section = line[:-1].lower()
            continue
        if section != "character devices":
            continue
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[0].isdigit():
            majors.setdefault(parts[1], int(parts[0]))
    return majors


def node_paths(r: Reader, gpu_count: int | None) -> list[str]:
    """What to look at: the core nodes, /dev/nvidia0..N-1 from the spec, and whatever
    /dev/nvidia* and /dev/nvidia-caps/* exist."""
    paths = set(CORE_NODES)
    if gpu_count:
        paths.update(f"/dev/nvidia{i}" for i in range(gpu_count))
    try:
        paths.update(f"/dev/{n}" for n in r.listdir("/dev") if n.startswith("nvidia"))
    except OSError as exc:
        r.note("devices.dev", f"cannot list /dev: {exc.strerror}")
    paths.discard("/dev/nvidia-caps")
    # /dev/nvidia-caps exists only with MIG support; its absence is normal.
    with contextlib.suppress(OSError):
        paths.update(f"/dev/nvidia-caps/{n}" for n in r.listdir("/dev/nvidia-caps"))
    return sorted(paths, key=_node_order)


def _node_order(p: str) -> tuple[int, int, str]:
    tail = p.removeprefix("/dev/nvidia")
    if tail.isdigit():
        return (1, int(tail), p)
    return (0 if p in CORE_NODES else 2, 0, p)


def opened_by_cuda(path: str) -> bool:
    return path in CORE_NODES or re.fullmatch(r"/dev/nvidia\d+", path) is not None


def inspect_node(r: Reader, path: str, open_node: bool = True) -> DevNode:
    try:
        st = r.stat_node(path)
    except OSError as exc:
        r.note(f"devices.{path}", f"cannot stat: {exc.strerror}")
        return DevNode(path=path, exists=True)
    if st is None:
        return DevNode(path=path, exists=False)
    # Open only what libcuda opens, and only char nodes: opening whatever else sits at the path
    # proves nothing, and MIG capability or NVSwitch nodes are none of CUDA's start-up.
    errno_ = r.try_open(path) if open_node and st.is_char and opened_by_cuda(path) else None
    return DevNode(
        path=path,
        exists=True,
        is_char=st.is_char,
        major=st.major,
        minor=st.minor,
        mode=st.mode,
        open_errno=errno_,
    )


def probe_devices(r: Reader, gpu_count: int | None, open_nodes: bool = True) -> DeviceFacts:
    """open_nodes=False: stat only (the host's nodes, judged for existence and major: the
    container is what opens them)."""
    majors: dict[str, int] = {}
    text = r.read_or_note("/proc/devices", "devices.proc_devices")
    if text is not None:
        majors = parse_proc_devices(text)
    nodes = tuple(inspect_node(r, p, open_nodes) for p in node_paths(r, gpu_count))
    return DeviceFacts(majors=majors, nodes=nodes)
