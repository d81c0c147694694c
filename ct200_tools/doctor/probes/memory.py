"""/dev/shm, the memory cgroup that bounds it, cpuset, and /proc/meminfo."""

from __future__ import annotations

from dataclasses import dataclass

from ct200_tools.doctor.probes.base import Reader
from ct200_tools.facts import MemoryFacts

SHM = "/dev/shm"
CGROUP_ROOT = "/sys/fs/cgroup"
#: cgroup v1 reports "no limit" as a huge page-aligned number.
V1_UNLIMITED = 1 << 62


@dataclass(frozen=True)
class CgroupMemory:
    version: int
    limit: int | None
    current: int | None
    cpus: str | None
    mems: str | None


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo in bytes."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            scale = 1024 if len(fields) > 1 and fields[1] == "kB" else 1
            out[name.strip()] = int(fields[0]) * scale
    return out


def shm_fstype(mountinfo: str | None) -> str | None:
    """Filesystem type of the mount at /dev/shm (the last one wins, as in the kernel)."""
    fstype = None
    for line in (mountinfo or "").splitlines():
        left, sep, right = line.partition(" - ")
        parts = left.split()
        if sep and len(parts) > 4 and parts[4] == SHM:
            fstype = right.split()[0]
    return fstype


def own_cgroup_v2(text: str) -> str | None:
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def _int_or_none(value: str) -> int | None:
    value = value.strip()
    return None if value == "max" else int(value)


def probe_cgroup(r: Reader) -> CgroupMemory | None:
    """The tightest memory limit on the path from our cgroup to the root.

    Inside a container the cgroup namespace makes the container's cgroup look like the root,
    and its memory.max is the container's limit; on a host we walk up to the first limit.
    """
    text = r.read_or_note("/proc/self/cgroup", "memory.cgroup")
    if text is None:
        return None
    rel = own_cgroup_v2(text)
    if rel is not None and r.exists(f"{CGROUP_ROOT}/cgroup.controllers"):
        return _cgroup_v2(r, rel)
    if r.exists(f"{CGROUP_ROOT}/memory/memory.limit_in_bytes"):
        return _cgroup_v1(r)
    r.note("memory.cgroup", "no cgroup v2 or v1 memory controller found under /sys/fs/cgroup")
    return None


def _cgroup_v2(r: Reader, rel: str) -> CgroupMemory:
    parts = [p for p in rel.split("/") if p]
    best: tuple[int, int, int] | None = None  # (headroom, limit, current)
    for depth in range(len(parts), -1, -1):
        d = "/".join([CGROUP_ROOT, *parts[:depth]])
        try:
            limit = _int_or_none(r.read_text(f"{d}/memory.max"))
            current = _int_or_none(r.read_text(f"{d}/memory.current"))
        except (OSError, ValueError):
            continue  # the root cgroup has no memory.max; a level may hide the controller
        if limit is not None and current is not None:
            headroom = limit - current
            if best is None or headroom < best[0]:
                best = (headroom, limit, current)
    own = "/".join([CGROUP_ROOT, *parts])
    cpus = r.first_text(f"{own}/cpuset.cpus.effective", f"{CGROUP_ROOT}/cpuset.cpus.effective")
    mems = r.first_text(f"{own}/cpuset.mems.effective", f"{CGROUP_ROOT}/cpuset.mems.effective")
    if best is None:
        return CgroupMemory(2, None, None, cpus, mems)
    return CgroupMemory(2, best[1], best[2], cpus, mems)


def _cgroup_v1(r: Reader) -> CgroupMemory:
    base = f"{CGROUP_ROOT}/memory"
    limit = current = None
    try:
        limit = int(r.read_text(f"{base}/memory.limit_in_bytes"))
        current = int(r.read_text(f"{base}/memory.usage_in_bytes"))
    except (OSError, ValueError) as exc:
        r.note("memory.cgroup", f"cannot read cgroup v1 memory: {exc}")
    if limit is not None and limit >= V1_UNLIMITED:
        limit = None
    cpus = r.first_text(f"{CGROUP_ROOT}/cpuset/cpuset.effective_cpus")
    mems = r.first_text(f"{CGROUP_ROOT}/cpuset/cpuset.effective_mems")
    return CgroupMemory(1, limit, current, cpus, mems)


def probe_memory(r: Reader) -> MemoryFacts:
    shm_exists = r.exists(SHM)
    size = free = None
    if shm_exists:
        try:
            st = r.statvfs(SHM)
            size, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        except OSError as exc:
            r.note("memory.shm", f"cannot statvfs {SHM}: {exc.strerror}")
    fstype = shm_fstype(r.read_or_note("/proc/self/mountinfo", "memory.mountinfo"))
    cg = probe_cgroup(r)
    meminfo = parse_meminfo(r.read_or_note("/proc/meminfo", "memory.meminfo") or "")
    return MemoryFacts(
        shm_path=SHM,
        shm_exists=shm_exists,
        shm_fstype=fstype,
        shm_size=size,
        shm_free=free,
        cgroup_version=cg.version if cg else None,
        memory_max=cg.limit if cg else None,
        memory_current=cg.current if cg else None,
        cpuset_cpus=cg.cpus if cg else None,
        cpuset_mems=cg.mems if cg else None,
        mem_total=meminfo.get("MemTotal"),
        mem_available=meminfo.get("MemAvailable"),
    )
