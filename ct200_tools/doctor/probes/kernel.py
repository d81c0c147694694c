"""Kernel-side facts: release, command line, NUMA balancing, NVIDIA module, container type."""

from __future__ import annotations

import re

from ct200_tools.doctor.probes.base import Reader
from ct200_tools.facts import KernelFacts

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
    return KernelFacts(
        release=release.strip() if release else None,
        cmdline=cmdline.strip() if cmdline else None,
        numa_balancing=numa_balancing,
        nvidia_module_version=module,
        container=detect_container(r),
    )
