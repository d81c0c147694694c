"""probes/memory.py: meminfo, cgroup v1/v2 trees and /dev/shm, from the H200 recordings and small
cgroup trees built here."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ct200_tools.doctor.probes.base import Reader
from ct200_tools.doctor.probes.memory import (
    SHM,
    V1_UNLIMITED,
    own_cgroup_v2,
    parse_meminfo,
    probe_memory,
    shm_fstype,
)
from tests.unit.probe_helpers import (
    capture,
    facts,
    h200_mountinfo,
    h200_root,
    meminfo_text,
    put,
)


def test_parse_meminfo() -> None:
    fx = facts("h200-healthy").memory
    assert fx is not None and fx.mem_total is not None and fx.mem_available is not None
    info = parse_meminfo(meminfo_text(fx.mem_total, fx.mem_available))
    assert info["MemTotal"] == fx.mem_total == 131981020 * 1024
    assert info["MemAvailable"] == fx.mem_available
    assert info["HugePages_Total"] == 0  # no unit: not scaled
    assert info["Hugepagesize"] == 2048 * 1024
    assert parse_meminfo("") == {}
    assert parse_meminfo("garbage\nMemTotal: lots kB\n") == {}


def test_own_cgroup_v2() -> None:
    recorded = capture()["cgroup"].splitlines()[0] + "\n"
    assert own_cgroup_v2(recorded) == "/process_api/3e06fcb1f5e8d36ed4ef8f863d5b3470"
    assert own_cgroup_v2("0::/\n") == "/"  # inside a cgroup namespace
    v1 = "12:memory:/lxc/200\n11:cpuset:/lxc/200\n1:name=systemd:/lxc/200\n"
    assert own_cgroup_v2(v1) is None
    assert own_cgroup_v2(v1 + "0::/lxc/200/ns\n") == "/lxc/200/ns"  # hybrid hierarchy
    assert own_cgroup_v2("") is None


def test_shm_fstype() -> None:
    assert shm_fstype(h200_mountinfo()) == "tmpfs"
    # DERIVED: the second /dev/shm mount edited to ramfs: the last mount is the visible one.
    over = h200_mountinfo().replace(
        "/dev/shm rw,relatime - tmpfs tmpfs rw,size=134217728k",
        "/dev/shm rw,relatime - ramfs ramfs rw",
    )
    assert shm_fstype(over) == "ramfs"
    assert shm_fstype(None) is None
    assert shm_fstype("") is None
    assert shm_fstype(h200_mountinfo().replace("/dev/shm", "/run/shm")) is None


def cgroup_v2(root: Path, own: str, levels: dict[str, tuple[str, str] | None]) -> Reader:
    """A cgroup v2 tree: {relative dir: (memory.max, memory.current) or None for no files}."""
    put(root, "/proc/self/cgroup", f"0::{own}\n")
    put(root, "/sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory pids\n")
    put(root, "/sys/fs/cgroup/cpuset.cpus.effective", "0-15\n")
    put(root, "/sys/fs/cgroup/cpuset.mems.effective", "0\n")
    for rel, files in levels.items():
        d = "/sys/fs/cgroup/" + rel.strip("/")
        (root / d.lstrip("/")).mkdir(parents=True, exist_ok=True)
        if files is not None:
            put(root, f"{d}/memory.max", files[0] + "\n")
            put(root, f"{d}/memory.current", files[1] + "\n")
    return Reader(root=root)


def test_probe_memory_reproduces_h200_fixture(tmp_path: Path) -> None:
    r = h200_root(tmp_path)
    assert probe_memory(r) == facts("h200-healthy").memory
    assert r.unreadable == {}


def test_probe_memory_tightest_headroom_wins(tmp_path: Path) -> None:
    """Nested cgroups: the parent's 2 GiB headroom beats the child's 15 GiB."""
    gib = 1 << 30
    r = cgroup_v2(
        tmp_path,
        "/lxc/200/ns",
        {
            "": None,  # the root cgroup has no memory.max
            "lxc": ("max", str(7 * gib)),
            "lxc/200": (str(8 * gib), str(6 * gib)),
            "lxc/200/ns": (str(16 * gib), str(1 * gib)),
        },
    )
    got = probe_memory(r)
    assert got.cgroup_version == 2
    assert (got.memory_max, got.memory_current) == (8 * gib, 6 * gib)
    assert (got.cpuset_cpus, got.cpuset_mems) == ("0-15", "0")


def test_probe_memory_child_limit_tighter(tmp_path: Path) -> None:
    gib = 1 << 30
    r = cgroup_v2(
        tmp_path,
        "/a/b",
        {"a": (str(64 * gib), str(10 * gib)), "a/b": (str(12 * gib), str(9 * gib))},
    )
    got = probe_memory(r)
    assert (got.memory_max, got.memory_current) == (12 * gib, 9 * gib)


def test_probe_memory_max_everywhere_is_no_limit(tmp_path: Path) -> None:
    r = cgroup_v2(tmp_path, "/a/b", {"a": ("max", "100"), "a/b": ("max", "50")})
    got = probe_memory(r)
    assert got.cgroup_version == 2
    assert got.memory_max is None
    assert "memory.cgroup" not in r.unreadable


def test_probe_memory_namespace_root_with_limit(tmp_path: Path) -> None:
    """Inside an LXC cgroup namespace the container's cgroup is "/" and has memory.max."""
    r = cgroup_v2(tmp_path, "/", {"": ("137438953472", "924594176")})
    got = probe_memory(r)
    assert (got.memory_max, got.memory_current) == (137438953472, 924594176)


def test_probe_memory_own_cpuset_preferred(tmp_path: Path) -> None:
    r = cgroup_v2(tmp_path, "/lxc/200", {"lxc/200": ("max", "1")})
    put(tmp_path, "/sys/fs/cgroup/lxc/200/cpuset.cpus.effective", "0-3\n")
    got = probe_memory(r)
    assert (got.cpuset_cpus, got.cpuset_mems) == ("0-3", "0")


def test_probe_memory_cgroup_v1_reproduces_nodriver_fixture(tmp_path: Path) -> None:
    """cgroup v1 as on the driverless VM: the limit file holds the unlimited page-counter max
    (0x7ffffffffffff000 on x86_64), which is no limit. Usage, cpuset and meminfo values are the
    fixture's; statvfs of /dev/shm is this machine's, so shm sizes are not compared."""
    fx = facts("nodriver-vm").memory
    assert fx is not None and fx.mem_total is not None and fx.mem_available is not None
    put(tmp_path, "/proc/self/cgroup", "12:memory:/\n11:cpuset:/\n1:name=systemd:/init.scope\n")
    put(tmp_path, "/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n")
    assert V1_UNLIMITED <= 9223372036854771712
    put(tmp_path, "/sys/fs/cgroup/memory/memory.usage_in_bytes", f"{fx.memory_current}\n")
    put(tmp_path, "/sys/fs/cgroup/cpuset/cpuset.effective_cpus", "0-1\n")
    put(tmp_path, "/sys/fs/cgroup/cpuset/cpuset.effective_mems", "0\n")
    put(tmp_path, "/proc/meminfo", meminfo_text(fx.mem_total, fx.mem_available))
    put(tmp_path, "/proc/self/mountinfo", h200_mountinfo())
    put(tmp_path, SHM + "/.keep")
    r = Reader(root=tmp_path)
    got = probe_memory(r)
    assert got == dataclasses.replace(fx, shm_size=got.shm_size, shm_free=got.shm_free)
    assert got.shm_size is not None and got.shm_size > 0  # statvfs of the tmp filesystem
    assert r.unreadable == {}


def test_probe_memory_cgroup_v1_limited(tmp_path: Path) -> None:
    put(tmp_path, "/proc/self/cgroup", "12:memory:/lxc/200\n")
    put(tmp_path, "/sys/fs/cgroup/memory/memory.limit_in_bytes", "34359738368\n")
    put(tmp_path, "/sys/fs/cgroup/memory/memory.usage_in_bytes", "1073741824\n")
    got = probe_memory(Reader(root=tmp_path))
    assert (got.cgroup_version, got.memory_max, got.memory_current) == (1, 34359738368, 1 << 30)


def test_probe_memory_nothing_readable(tmp_path: Path) -> None:
    r = Reader(root=tmp_path)
    got = probe_memory(r)
    assert not got.shm_exists and got.shm_size is None
    assert got.cgroup_version is None and got.memory_max is None and got.mem_total is None
    assert set(r.unreadable) == {"memory.cgroup", "memory.mountinfo", "memory.meminfo"}


def test_probe_memory_no_controller(tmp_path: Path) -> None:
    put(tmp_path, "/proc/self/cgroup", "0::/\n")
    r = Reader(root=tmp_path)
    assert probe_memory(r).cgroup_version is None
    assert "no cgroup v2 or v1 memory controller" in r.unreadable["memory.cgroup"]
