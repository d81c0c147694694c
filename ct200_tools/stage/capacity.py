"""Will the model fit? Filesystem free space and memory headroom, read before anything is written.

tmpfs pages are memory: they count against the writer's memory cgroup (memory.max in cgroup v2,
memory.limit_in_bytes in v1) and against the machine's RAM, and they cannot be reclaimed. So for a
memory-backed destination the room is the smallest of: the filesystem's free space, every
ancestor cgroup's limit minus its usage, and MemAvailable, less the reserve the spec keeps for
everything else. Usage counts the reclaimable page cache (inactive_file) as free: it is what the
kernel drops first, and counting it as used would refuse a restage after any large read.
Files need inodes too: a tmpfs mounted with few (nr_inodes=) fills up by count, not by bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ct200_tools.stage.errors import CapacityError
from ct200_tools.stage.sizes import format_size

MEMORY_FS = ("tmpfs", "ramfs")
#: cgroup v1 writes "unlimited" as a huge page-aligned number, v2 as "max".
_UNLIMITED = 1 << 62
PAGE = 4096


@dataclass(frozen=True)
class MemoryLimit:
    source: str
    headroom: int
    detail: str


@dataclass(frozen=True)
class Capacity:
    path: str
    fs_type: str
    fs_free: int | None
    memory: tuple[MemoryLimit, ...]
    reserve: int
    #: Free inodes; None where the filesystem has no fixed number (f_files == 0).
    inodes_free: int | None = None
    #: The filesystem's size; None where it has no limit of its own (as fs_free).
    fs_size: int | None = None

    @property
    def memory_backed(self) -> bool:
        return self.fs_type in MEMORY_FS

    @property
    def memory_headroom(self) -> int | None:
        if not self.memory_backed or not self.memory:
            return None
        return min(m.headroom for m in self.memory) - self.reserve

    @property
    def available(self) -> int | None:
        figures = [f for f in (self.fs_free, self.memory_headroom) if f is not None]
        return min(figures) if figures else None

    def to_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "fs_type": self.fs_type,
            "fs_free": self.fs_free,
            "memory": [m.__dict__ for m in self.memory],
            "reserve": self.reserve,
            "memory_headroom": self.memory_headroom,
            "available": self.available,
            "inodes_free": self.inodes_free,
        }


def bytes_needed(sizes: list[int]) -> int:
    """tmpfs rounds every file up to whole pages."""
    return sum(-(-s // PAGE) * PAGE for s in sizes)


def measure(path: str, reserve: int = 0, proc: str = "/proc") -> Capacity:
    anchor = _existing_ancestor(path)
    fs_type = fs_type_of(anchor, proc)
    st = os.statvfs(anchor)
    fs_free: int | None = st.f_bavail * st.f_frsize
    if fs_type == "ramfs" or st.f_blocks == 0:
        fs_free = None  # ramfs (and tmpfs size=0) have no size limit of their own
    memory: tuple[MemoryLimit, ...] = ()
    if fs_type in MEMORY_FS:
        memory = tuple(cgroup_limits(proc)) + tuple(_meminfo(proc))
    inodes = st.f_favail if st.f_files else None
    size = st.f_blocks * st.f_frsize if fs_free is not None else None
    return Capacity(anchor, fs_type, fs_free, memory, reserve, inodes, size)


def require(
    cap: Capacity, needed: int, what: str, inodes: int = 0, grow_to: int | None = None
) -> None:
    """Raise CapacityError naming every figure and the fix, unless `needed` bytes and `inodes`
    files and directories fit. ``grow_to``: the size the spec gives the tmpfs (shm.size), for a
    fix that is a whole command when the tmpfs is smaller than that."""
    if cap.inodes_free is not None and inodes > cap.inodes_free:
        fix = f"free inodes on {cap.path} (remove files there) or stage elsewhere"
        if cap.memory_backed:
            fix = f"give the tmpfs more inodes: mount -o remount,nr_inodes={2 * inodes} {cap.path}"
        raise CapacityError(
            f"{what} does not fit: {inodes} files and directories need as many inodes, "
            f"{cap.fs_type} {cap.path} has {cap.inodes_free} free (nothing was written)",
            fix,
        )
    available = cap.available
    if available is None or needed <= available:
        return
    lines = [f"needed: {format_size(needed)} ({needed} bytes)"]
    if cap.fs_free is not None:
        lines.append(f"{cap.fs_type} {cap.path} free: {format_size(cap.fs_free)}")
    lines += [f"{m.source}: {format_size(m.headroom)} headroom ({m.detail})" for m in cap.memory]
    if cap.memory_backed:
        lines.append(f"reserve kept for everything else: {format_size(cap.reserve)}")
    headroom = cap.memory_headroom
    if headroom is not None and headroom < 0:
        raise CapacityError(
            f"{what} does not fit: the reserve kept for everything else "
            f"({format_size(cap.reserve)}) is more than the memory there is "
            f"({format_size(headroom + cap.reserve)}) (nothing was written)",
            "lower --reserve (or the spec's shm.reserve_ram) to what the machine can spare",
            details=tuple(lines),
        )
    short_fs = cap.fs_free is not None and cap.fs_free < needed
    used = (cap.fs_size or 0) - (cap.fs_free or 0)
    grows = grow_to is not None and grow_to > (cap.fs_size or 0) and grow_to - used >= needed
    if short_fs and cap.memory_backed and grows:
        # Smaller than the spec says (e.g. its fstab line lost the size): the spec's size is the
        # repair, now; the fstab line makes it last (container.yml --tags container_shm).
        fix = (
            f"grow the tmpfs to the spec's shm.size: `mount -o remount,size={grow_to} "
            f"{cap.path}`, then stage again; container.yml --tags container_shm (or recover.yml) "
            "writes its fstab line for every boot"
        )
    elif short_fs and cap.memory_backed:
        fix = (
            f"grow the tmpfs (mount -o remount,size=... {cap.path}; the spec's shm.size) or free "
            "space in it (remove models no server uses)"
        )
    elif short_fs:
        fix = f"free space on {cap.path} or stage elsewhere"
    else:
        fix = (
            "raise the memory limit (container memory / memory.max), lower the spec's "
            "shm.reserve_ram, or stage fewer models"
        )
    raise CapacityError(
        f"{what} does not fit: {format_size(needed)} needed, {format_size(available)} available "
        "(nothing was written)",
        fix,
        details=tuple(lines),
    )


def fs_type_of(path: str, proc: str = "/proc") -> str:
    """The filesystem type of the mount that holds path, matched by device number."""
    dev = os.stat(path).st_dev
    want = f"{os.major(dev)}:{os.minor(dev)}"
    found = "unknown"
    try:
        with open(f"{proc}/self/mountinfo", encoding="utf-8") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) < 10 or fields[2] != want:
                    continue
                sep = fields.index("-")
                found = fields[sep + 1]  # the last mount of a device wins: it is the visible one
    except OSError:
        pass
    return found


def cgroup_limits(proc: str = "/proc") -> list[MemoryLimit]:
    """Headroom of our memory cgroup and each ancestor (a parent's limit binds its children)."""
    try:
        with open(f"{proc}/self/cgroup", encoding="utf-8") as fh:
            lines = fh.read().splitlines()
        with open(f"{proc}/self/mountinfo", encoding="utf-8") as fh:
            mounts = fh.read().splitlines()
    except OSError:
        return []
    for line in lines:
        hid, controllers, path = line.split(":", 2)
        if hid == "0" and controllers == "":
            base = _mount_for(mounts, "cgroup2", None, path)
            if base is not None:
                return _walk(base, v2=True)
        elif "memory" in controllers.split(","):
            base = _mount_for(mounts, "cgroup", "memory", path)
            if base is not None:
                return _walk(base, v2=False)
    return []


def _mount_for(
    mounts: list[str], fstype: str, option: str | None, path: str
) -> tuple[str, str] | None:
    for line in mounts:
        fields = line.split()
        sep = fields.index("-")
        if fields[sep + 1] != fstype:
            continue
        if option is not None and option not in fields[sep + 3].split(","):
            continue
        root, mountpoint = fields[3], fields[4]
        rel = path if root == "/" else path.removeprefix(root)
        return mountpoint, rel.strip("/")
    return None


def _walk(base: tuple[str, str], *, v2: bool) -> list[MemoryLimit]:
    mountpoint, rel = base
    found: list[MemoryLimit] = []
    parts = rel.split("/") if rel else []
    for depth in range(len(parts), -1, -1):
        d = os.path.join(mountpoint, *parts[:depth])
        limit = _read(d, "memory.max" if v2 else "memory.limit_in_bytes")
        usage = _read(d, "memory.current" if v2 else "memory.usage_in_bytes")
        if limit is None or usage is None or limit >= _UNLIMITED:
            continue
        stat = _stat(d)
        cache = stat.get("inactive_file" if v2 else "total_inactive_file", 0)
        label = f"cgroup {'v2' if v2 else 'v1'} {d}"
        detail = f"limit {format_size(limit)}, used {format_size(usage)}"
        detail += f", reclaimable cache {format_size(cache)}"
        found.append(MemoryLimit(label, max(0, limit - usage + cache), detail))
    return found


def _meminfo(proc: str) -> list[MemoryLimit]:
    try:
        with open(f"{proc}/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    return [MemoryLimit("MemAvailable", avail, "the machine's free RAM")]
    except (OSError, ValueError):
        pass
    return []


def _read(d: str, name: str) -> int | None:
    try:
        with open(os.path.join(d, name), encoding="utf-8") as fh:
            text = fh.read().strip()
    except OSError:
        return None
    if text == "max":
        return _UNLIMITED
    try:
        return int(text)
    except ValueError:
        return None


def _stat(d: str) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open(os.path.join(d, "memory.stat"), encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition(" ")
                if value.strip().isdigit():
                    out[key] = int(value)
    except OSError:
        pass
    return out


def _existing_ancestor(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p
