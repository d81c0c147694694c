"""Shared by the probe tests: the H200 recordings and trees rebuilt from them.

Hardware inputs come from tests/fixtures (facts/*.json and raw/h200/*). Where a test needs a case
the machine did not show (64 readable config bytes, MRRS 512, a second GPU, a NUMA node pair), it
edits the recorded data and the comment says "derived" and how. cgroup trees and container
markers are not hardware: small trees built here, with the recorded values where there are some.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ct200_tools.doctor.probes.base import NodeStat, Reader
from ct200_tools.doctor.probes.memory import (
    SHM,
)
from ct200_tools.facts import DevNode, Facts, loads

REPO = Path(__file__).resolve().parents[2]


FIXTURES = REPO / "tests" / "fixtures"


RAW = FIXTURES / "raw" / "h200"


BDF = "0000:00:06.0"


SYSFS_NAMES = (
    "class",
    "device",
    "numa_node",
    "local_cpulist",
    "max_link_speed",
    "max_link_width",
    "current_link_speed",
    "current_link_width",
)


#: The NVIDIA probes the fixtures were recorded with (devices majors need these names).
H200_FIXTURES = ("h200-healthy", "h200-uvm-denied", "h200-uvm-stale")


def facts(name: str) -> Facts:
    return loads((FIXTURES / "facts" / f"{name}.json").read_text())


def raw(name: str) -> str:
    return (RAW / name).read_text()


def recorded_config() -> bytes:
    """The H200's 4096-byte config space, read as root on the machine."""
    return bytes.fromhex(raw("pcicfg_0000_00_06.0.hex").strip())


def capture() -> dict[str, str]:
    """capture-raw.txt by section ("== name" headers)."""
    sections: dict[str, list[str]] = {}
    current: list[str] = []
    for line in raw("capture-raw.txt").splitlines():
        if line.startswith("== "):
            current = sections.setdefault(line[3:].strip(), [])
        else:
            current.append(line)
    return {k: "\n".join(v) + "\n" for k, v in sections.items()}


def with_devctl(cfg: bytes, mrrs_code: int | None = None, mps_code: int | None = None) -> bytes:
    """DERIVED: the recorded config with the MRRS/MPS fields of Device Control rewritten."""
    out = bytearray(cfg)
    word = int.from_bytes(out[0x68:0x6A], "little")
    if mrrs_code is not None:
        word = (word & ~0x7000) | mrrs_code << 12
    if mps_code is not None:
        word = (word & ~0x00E0) | mps_code << 5
    out[0x68:0x6A] = word.to_bytes(2, "little")
    return bytes(out)


def put(root: Path, path: str, content: str | bytes = "") -> Path:
    p = root / path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content)
    return p


def gpu_sysfs(root: Path, bdf: str = BDF, cfg: bytes | None = None, cls: str | None = None) -> Path:
    """/sys/bus/pci/devices/<bdf> from the recorded sysfs_* files and config space.

    `vendor` was not saved by the recorder (it only kept 0x10de functions); it is the first
    word of the recorded config space.
    """
    config = recorded_config() if cfg is None else cfg
    base = f"/sys/bus/pci/devices/{bdf}"
    for name in SYSFS_NAMES:
        put(root, f"{base}/{name}", raw(f"sysfs_0000_00_06.0_{name}.txt"))
    put(root, f"{base}/vendor", f"0x{int.from_bytes(recorded_config()[0:2], 'little'):04x}\n")
    put(root, f"{base}/config", config)
    if cls is not None:
        put(root, f"{base}/class", cls)
    return root / base.lstrip("/")


def numa_nodes(root: Path, *nodes: int) -> None:
    """/sys/devices/system/node with the given nodeN directories and the usual other entries."""
    base = root / "sys/devices/system/node"
    base.mkdir(parents=True, exist_ok=True)
    for name in ("online", "possible", "has_cpu", "has_memory", "uevent"):
        (base / name).write_text("0\n")
    for n in nodes:
        (base / f"node{n}").mkdir()


@dataclass
class ReplayReader(Reader):
    """A Reader that replays what a tree of files cannot hold: device nodes (stat and open
    result, as recorded in a facts fixture) and /dev/shm's statvfs (df, as recorded)."""

    nodes: dict[str, DevNode] = field(default_factory=dict)
    shm_statvfs: os.statvfs_result | None = None

    def stat_node(self, p: str) -> NodeStat | None:
        n = self.nodes.get(p)
        if n is None or not n.exists:
            return None
        assert n.major is not None and n.minor is not None and n.mode is not None
        return NodeStat(is_char=n.is_char, major=n.major, minor=n.minor, mode=n.mode)

    def try_open(self, p: str) -> int:
        recorded = self.nodes[p].open_errno
        assert recorded is not None, f"{p} was not opened on the machine; the probe must not open"
        return recorded

    def statvfs(self, p: str) -> os.statvfs_result:
        if p == SHM and self.shm_statvfs is not None:
            return self.shm_statvfs
        return super().statvfs(p)


def replay_devices(root: Path, fixture: Facts) -> ReplayReader:
    """/proc/devices and the /dev entries of the machine, node metadata from the fixture."""
    assert fixture.devices is not None
    put(root, "/proc/devices", raw("proc_devices.txt"))
    (root / "dev").mkdir(exist_ok=True)
    for n in fixture.devices.nodes:
        if n.exists:
            put(root, n.path)
    return ReplayReader(root=root, nodes={n.path: n for n in fixture.devices.nodes})


def shm_statvfs_recorded() -> os.statvfs_result:
    """df -B1 /dev/shm on the H200: 137438953472 bytes, all available. The block size is ours;
    only the products are recorded."""
    line = next(ln for ln in capture()["shm"].splitlines() if ln.startswith("tmpfs "))
    size, _used, avail = (int(x) for x in line.split()[1:4])
    frsize = 4096
    return os.statvfs_result(
        (frsize, frsize, size // frsize, avail // frsize, avail // frsize, 0, 0, 0, 0, 255)
    )


def h200_mountinfo() -> str:
    """DERIVED: /proc/self/mountinfo lines for the two `mount` lines recorded for /dev/shm
    (capture-raw.txt shows `mount` output, not mountinfo; ids and options are ours)."""
    return (
        "700 690 0:50 / / rw,relatime - overlay overlay rw\n"
        "731 700 0:52 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=131981020k\n"
        "742 731 0:60 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=134217728k\n"
        "745 700 0:28 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 "
        "rw,nsdelegate,memory_recursiveprot\n"
    )


def meminfo_text(total: int, available: int) -> str:
    """/proc/meminfo in the kernel's format (kB), for byte values recorded in a fixture."""
    assert total % 1024 == 0 and available % 1024 == 0
    return (
        f"MemTotal:       {total // 1024} kB\n"
        f"MemFree:        {available // 1024} kB\n"
        f"MemAvailable:   {available // 1024} kB\n"
        "HugePages_Total:       0\n"
        "Hugepagesize:       2048 kB\n"
    )


def h200_root(root: Path) -> ReplayReader:
    """A root rebuilt from the H200 recordings (healthy run)."""
    fx = facts("h200-healthy")
    cap = capture()
    r = replay_devices(root, fx)
    r.shm_statvfs = shm_statvfs_recorded()
    # kernel: uname -a field 3, the recorded cmdline, sysctl, module version, /.dockerenv
    put(root, "/proc/sys/kernel/osrelease", cap["uname"].split()[2] + "\n")
    put(root, "/proc/cmdline", cap["cmdline"])
    put(root, "/proc/sys/kernel/numa_balancing", cap["sysctl"])
    put(root, "/proc/driver/nvidia/version", raw("nvidia_version.txt"))
    put(root, "/.dockerenv")
    # pci: the recorded function. /sys/devices/system/node was not recorded: left out.
    gpu_sysfs(root)
    # memory: recorded cgroup path and root cpuset files; the root has no memory.max (recorded
    # "No such file"). Which level holds the 128 GiB limit was not recorded: the leaf does here.
    assert fx.memory is not None
    leaf = cap["cgroup"].splitlines()[0]
    assert leaf == "0::/process_api/3e06fcb1f5e8d36ed4ef8f863d5b3470"
    put(root, "/proc/self/cgroup", leaf + "\n")
    put(root, "/proc/self/mountinfo", h200_mountinfo())
    cg = "/sys/fs/cgroup"
    put(root, f"{cg}/cgroup.controllers", "cpuset cpu io memory pids\n")
    put(root, f"{cg}/cpuset.cpus.effective", "0-15\n")
    put(root, f"{cg}/cpuset.mems.effective", "0\n")
    put(root, f"{cg}/process_api/memory.max", "max\n")
    put(root, f"{cg}/process_api/memory.current", f"{fx.memory.memory_current}\n")
    put(root, f"{cg}{leaf[3:]}/memory.max", f"{fx.memory.memory_max}\n")
    put(root, f"{cg}{leaf[3:]}/memory.current", f"{fx.memory.memory_current}\n")
    assert fx.memory.mem_total is not None and fx.memory.mem_available is not None
    put(root, "/proc/meminfo", meminfo_text(fx.memory.mem_total, fx.memory.mem_available))
    put(root, SHM + "/.keep")
    return r
