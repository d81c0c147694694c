"""Kernel-side facts: release, command line, NUMA balancing, NVIDIA module, container type."""

from __future__ import annotations

import re

from ct200_tools.doctor.probes.base import Reader
from ct200_tools.facts import KernelFacts
from ct200_tools.tunings import TUNINGS, Sysfs

#: The most items (CPUs, devices) one sysfs tuning reads, and the longest value kept.
MAX_ITEMS = 4096
MAX_VALUE = 64

_MODULE_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)")


def parse_module_version(text: str) -> str | None:
    """Version from /proc/driver/nvidia/version (proprietary and open kernel modules)."""
    m = _MODULE_VERSION.search(text)
    if m:
        return m.group(1)
    # Older formats: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.54.03  ..."
    m = re.search(r"NVRM version:.*?\s(\d{3,}\.\d+(?:\.\d+)?)\s", text)
    return m.group(1) if m else None


def detect_container(r: Reader) -> str:
    """Best-effort container type; "none" on bare metal or a VM."""
    value = r.first_text("/run/systemd/container", "/run/container_type")
    if value:
        return value
    try:
        environ = r.read_bytes("/proc/1/environ").split(b"\0")
    except OSError:
        environ = []
    for item in environ:
        if item.startswith(b"container="):
            return item.split(b"=", 1)[1].decode(errors="replace") or "unknown"
    if r.exists("/.dockerenv"):
        return "docker"
    if r.exists("/run/.containerenv"):
        return "podman"
    return "none"


def probe_kernel(r: Reader) -> KernelFacts:
    release = r.read_or_note("/proc/sys/kernel/osrelease", "kernel.release")
    cmdline = r.read_or_note("/proc/cmdline", "kernel.cmdline")
    numa_balancing: int | None = None
    raw = r.read_or_note("/proc/sys/kernel/numa_balancing", "kernel.numa_balancing")
    if raw is not None:
        try:
            numa_balancing = int(raw.strip())
        except ValueError:
            r.note("kernel.numa_balancing", f"unexpected content {raw.strip()!r}")
    module: str | None = None
    try:
        module = parse_module_version(r.read_text("/proc/driver/nvidia/version"))
    except FileNotFoundError:
        pass  # module not loaded: the driver check reports it, this is not a read failure
    except OSError as exc:
        r.note("kernel.nvidia_module", f"cannot read /proc/driver/nvidia/version: {exc.strerror}")
    tunings = {
        t.key: got
        for t in TUNINGS
        if t.sysfs is not None and (got := read_sysfs(r, t.key, t.sysfs))
    }
    tunings |= {
        t.key: got
        for t in TUNINGS
        if t.sysctl is not None and t.fact is None and (got := read_sysctl(r, t.key, t.sysctl))
    }
    return KernelFacts(
        release=release.strip() if release else None,
        cmdline=cmdline.strip() if cmdline else None,
        numa_balancing=numa_balancing,
        nvidia_module_version=module,
        container=detect_container(r),
        tunings=tunings,
    )


def read_sysfs(r: Reader, key: str, where: Sysfs) -> dict[str, str]:
    """Each item's value of a sysfs tuning (cpu0 -> performance). No item with the file (a CPU
    without cpufreq: a VM, no cpufreq driver) reads as {}; a file that exists but cannot be read
    is noted under kernel.tuning.<key>."""
    try:
        names = r.listdir(where.root)
    except OSError:
        return {}
    items = sorted((n for n in names if re.fullmatch(where.item, n)), key=lambda n: (len(n), n))[
        :MAX_ITEMS
    ]
    got: dict[str, str] = {}
    for item in items:
        path = f"{where.root}/{item}/{where.file}"
        try:
            raw = r.read_text(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            r.note(f"kernel.tuning.{key}", f"cannot read {path}: {exc.strerror}")
            continue
        value = raw.strip()
        if not value.isprintable() or len(value) > MAX_VALUE:
            r.note(f"kernel.tuning.{key}", f"{path}: unexpected content")
            continue
        got[item] = value
    return got


def read_sysctl(r: Reader, key: str, name: str) -> dict[str, str]:
    """A sysctl tuning's value, {name: value}; a kernel without it is noted under
    kernel.tuning.<key> (its checks then skip saying why)."""
    path = "/proc/sys/" + name.replace(".", "/")
    try:
        value = r.read_text(path).strip()
    except FileNotFoundError:
        r.note(f"kernel.tuning.{key}", f"{path}: no such sysctl on this kernel")
        return {}
    except OSError as exc:
        r.note(f"kernel.tuning.{key}", f"cannot read {path}: {exc.strerror}")
        return {}
    if not value.isprintable() or len(value) > MAX_VALUE:
        r.note(f"kernel.tuning.{key}", f"{path}: unexpected content")
        return {}
    return {name: value}
