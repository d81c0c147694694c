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


def test_sysfs_tunings_read_each_item_and_say_what_they_could_not(tmp_path: Path) -> None:
    """The table's sysfs tunings (tuning.cpu_governor: every CPU's scaling_governor) on a
    rebuilt root: each CPU with cpufreq read, one without skipped, a non-CPU entry ignored, and
    a file that exists but cannot be read noted, never guessed."""
    cpu = "/sys/devices/system/cpu"
    put(tmp_path, f"{cpu}/cpu0/cpufreq/scaling_governor", "performance\n")
    put(tmp_path, f"{cpu}/cpu10/cpufreq/scaling_governor", "powersave\n")
    put(tmp_path, f"{cpu}/cpu2/online", "1\n")  # no cpufreq: nothing to read
    put(tmp_path, f"{cpu}/cpufreq/boost", "1\n")  # not a CPU
    r = Reader(root=tmp_path)
    got = probe_kernel(r).tunings
    assert got == {"cpu_governor": {"cpu0": "performance", "cpu10": "powersave"}}
    assert not any(k.startswith("kernel.tuning") for k in r.unreadable)


def test_sysfs_tunings_absent_without_cpufreq_and_noted_when_unreadable(tmp_path: Path) -> None:
    cpu = "/sys/devices/system/cpu"
    put(tmp_path, f"{cpu}/cpu0/online", "1\n")
    r = Reader(root=tmp_path)
    assert probe_kernel(r).tunings == {}  # a VM: the check says "cannot be read here"
    assert r.unreadable.get("kernel.tuning.cpu_governor") is None
    (tmp_path / "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor").mkdir(parents=True)
    r = Reader(root=tmp_path)
    assert probe_kernel(r).tunings == {}
    assert "cannot read" in r.unreadable["kernel.tuning.cpu_governor"]


def test_a_sysctl_without_a_fact_of_its_own_is_read_and_judged(tmp_path: Path) -> None:
    """A sysctl entry added to the table (no KernelFacts field): read from /proc/sys into
    kernel.tunings, judged by the sysctl kind's judgement, with the sysctl.d fix; a kernel
    without it is noted and skips saying why."""
    import dataclasses  # noqa: PLC0415 - beside its use

    from ct200_tools.doctor.checks.base import Context  # noqa: PLC0415
    from ct200_tools.doctor.checks.tune import here, judge  # noqa: PLC0415
    from ct200_tools.doctor.probes.kernel import read_sysctl  # noqa: PLC0415
    from ct200_tools.facts import Facts  # noqa: PLC0415
    from ct200_tools.spec import TuningSpec, load_spec  # noqa: PLC0415
    from ct200_tools.tunings import SYSCTL_FILE, Tuning  # noqa: PLC0415

    swap = Tuning(
        key="vm_swappiness", check="vm_swappiness", title="swappiness", values=(0, 1),
        default=0, example="vm_swappiness: 0", apply="sysctl", doc="d", host_doc="h",
        cause="c", sysctl="vm.swappiness",
    )  # fmt: skip
    put(tmp_path, "/proc/sys/vm/swappiness", "60\n")
    r = Reader(root=tmp_path)
    got = read_sysctl(r, swap.key, "vm.swappiness")
    assert got == {"vm.swappiness": "60"} and not r.unreadable
    site = load_spec(Path(__file__).parents[2] / "inventory" / "ct200")
    site = dataclasses.replace(site, tuning=TuningSpec((("vm_swappiness", 0),)))
    facts = Facts(kernel=probe_kernel(r))
    facts = dataclasses.replace(
        facts,
        kernel=dataclasses.replace(facts.kernel, tunings={swap.key: got}),  # type: ignore[arg-type]
    )
    ctx = Context(facts, site)
    out = judge(ctx, swap, here(ctx, swap), "host")
    assert (out.ok, out.summary) == (False, "vm.swappiness = 60, the spec wants 0")
    assert out.remedy is not None and out.remedy.command == "sysctl -w vm.swappiness=0"
    assert out.remedy.config == ("vm.swappiness = 0",) and out.remedy.file == SYSCTL_FILE
    missing = Reader(root=tmp_path / "none")
    assert read_sysctl(missing, swap.key, "vm.swappiness") == {}
    assert "no such sysctl" in missing.unreadable["kernel.tuning.vm_swappiness"]
    gone = dataclasses.replace(facts, kernel=dataclasses.replace(facts.kernel, tunings={}))  # type: ignore[arg-type]
    out = judge(Context(gone, site), swap, here(Context(gone, site), swap), "host")
    assert (out.ok, out.summary) == (None, "vm.swappiness not readable")
