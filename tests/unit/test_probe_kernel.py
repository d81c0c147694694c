"""probes/kernel.py: module version, kernel settings and container markers on rebuilt roots."""

from __future__ import annotations

from pathlib import Path

import pytest

from ct200_tools.doctor.probes.base import Reader
from ct200_tools.doctor.probes.kernel import detect_container, parse_module_version, probe_kernel
from tests.unit.probe_helpers import (
    facts,
    h200_root,
    put,
    raw,
)


def test_parse_module_version_open_module_recorded() -> None:
    text = raw("nvidia_version.txt")
    assert text.startswith("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64")
    assert parse_module_version(text) == "580.159.04"
    assert parse_module_version(text) == facts("h200-healthy").kernel.nvidia_module_version  # type: ignore[union-attr]


def test_parse_module_version_proprietary_module() -> None:
    line = (
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )
    assert parse_module_version(line) == "550.54.14"


def test_parse_module_version_unknown_text() -> None:
    assert parse_module_version("") is None
    assert parse_module_version("GCC version:  gcc version 15.3.0 (GCC)\n") is None


def test_probe_kernel_reproduces_h200_fixture(tmp_path: Path) -> None:
    r = h200_root(tmp_path)
    assert probe_kernel(r) == facts("h200-healthy").kernel
    assert r.unreadable == {}


def test_probe_kernel_module_not_loaded_is_not_unreadable(tmp_path: Path) -> None:
    r = h200_root(tmp_path)
    (tmp_path / "proc/driver/nvidia/version").unlink()
    assert probe_kernel(r).nvidia_module_version is None
    assert r.unreadable == {}


def test_probe_kernel_numa_balancing_garbage(tmp_path: Path) -> None:
    r = h200_root(tmp_path)
    put(tmp_path, "/proc/sys/kernel/numa_balancing", "on\n")
    assert probe_kernel(r).numa_balancing is None
    assert r.unreadable["kernel.numa_balancing"] == "unexpected content 'on'"


def test_probe_kernel_empty_root(tmp_path: Path) -> None:
    r = Reader(root=tmp_path)
    got = probe_kernel(r)
    assert got.release is None and got.cmdline is None and got.container == "none"
    assert set(r.unreadable) == {"kernel.release", "kernel.cmdline", "kernel.numa_balancing"}


@pytest.mark.parametrize(
    ("files", "want"),
    [
        # systemd (and LXC's init) write the container type here
        ({"/run/systemd/container": "lxc\n"}, "lxc"),
        # LXC puts container=lxc into init's environment
        ({"/proc/1/environ": b"PATH=/usr/bin:/bin\0container=lxc\0TERM=linux\0"}, "lxc"),
        ({"/.dockerenv": ""}, "docker"),
        ({"/run/.containerenv": ""}, "podman"),
        # the systemd file wins over the other hints
        ({"/run/systemd/container": "systemd-nspawn\n", "/.dockerenv": ""}, "systemd-nspawn"),
        # an empty file says nothing; init's environment decides
        ({"/run/systemd/container": "", "/proc/1/environ": b"container=lxc\0"}, "lxc"),
        ({"/proc/1/environ": b"container=\0"}, "unknown"),
        ({"/proc/1/environ": b"PATH=/usr/bin\0"}, "none"),
        ({}, "none"),
    ],
)
def test_detect_container(tmp_path: Path, files: dict[str, str | bytes], want: str) -> None:
    for path, content in files.items():
        put(tmp_path, path, content)
    assert detect_container(Reader(root=tmp_path)) == want
