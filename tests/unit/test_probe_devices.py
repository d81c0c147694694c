"""probes/devices.py: /proc/devices, and the /dev nodes replayed from the H200 recordings."""

from __future__ import annotations

import errno
import re
import string
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ct200_tools.doctor.probes.base import NodeStat, Reader
from ct200_tools.doctor.probes.devices import inspect_node, parse_proc_devices, probe_devices
from ct200_tools.facts import DeviceFacts, DevNode
from tests.unit.probe_helpers import (
    H200_FIXTURES,
    capture,
    facts,
    put,
    raw,
    replay_devices,
)


def test_parse_proc_devices_recorded() -> None:
    majors = parse_proc_devices(raw("proc_devices.txt"))
    assert majors["nvidia"] == 195
    assert majors["nvidiactl"] == 195
    assert majors["nvidia-uvm"] == 238
    assert majors["nvidia-caps"] == 241
    # The block section (loop 7, zram 253, virtblk 254, blkext 259) is ignored.
    assert not {"loop", "zram", "virtblk", "blkext"} & majors.keys()
    assert majors["ndctl"] == 254  # the char 254, not the block virtblk 254
    # The machine registered infiniband_verbs at 231 and again at 244: the first one wins.
    assert majors["infiniband_verbs"] == 231
    assert majors["infiniband_mad"] == 231
    assert majors == facts("h200-healthy").devices.majors  # type: ignore[union-attr]


def test_parse_proc_devices_without_sections() -> None:
    assert parse_proc_devices("") == {}
    # Lines before any section header belong to no section.
    assert parse_proc_devices("195 nvidia\n") == {}
    only_block = raw("proc_devices.txt").split("Block devices:")[1]
    assert parse_proc_devices("Block devices:" + only_block) == {}


DEV_NAME = st.text(alphabet=string.ascii_lowercase + string.digits + "_-/", min_size=1, max_size=24)


MAJOR = st.integers(min_value=1, max_value=511)


@settings(max_examples=150)
@given(
    chars=st.lists(st.tuples(MAJOR, DEV_NAME), max_size=40),
    blocks=st.lists(st.tuples(MAJOR, DEV_NAME), max_size=10),
)
def test_proc_devices_round_trip(
    chars: list[tuple[int, str]], blocks: list[tuple[int, str]]
) -> None:
    """/proc/devices as the kernel prints it ("%3d %s\\n") parses back to the first major per
    character-device name; block devices never leak in."""
    text = "Character devices:\n"
    text += "".join(f"{m:3d} {n}\n" for m, n in chars)
    text += "\nBlock devices:\n" + "".join(f"{m:3d} {n}\n" for m, n in blocks)
    want: dict[str, int] = {}
    for m, n in chars:
        want.setdefault(n, m)
    assert parse_proc_devices(text) == want


@pytest.mark.parametrize("fixture", H200_FIXTURES)
def test_probe_devices_replays_recorded_nodes(tmp_path: Path, fixture: str) -> None:
    """Nodes (stat and open() result) replayed from each H200 fixture: the probe rebuilds the
    fixture's DeviceFacts. uvm-denied: EPERM on both uvm nodes (cgroup device program);
    uvm-stale: /dev/null (c 1:3) bind-mounted over /dev/nvidia-uvm."""
    fx = facts(fixture)
    r = replay_devices(tmp_path, fx)
    got = probe_devices(r, gpu_count=1)
    assert got == fx.devices
    assert r.unreadable == {}


def test_probe_devices_uvm_denied_values() -> None:
    dev = facts("h200-uvm-denied").devices
    assert dev is not None
    for path in ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"):
        node = dev.node(path)
        assert node is not None and node.open_errno == errno.EPERM and node.major == 238
    ctl = dev.node("/dev/nvidiactl")
    assert ctl is not None and ctl.open_errno == 0


def test_recorded_ls_agrees_with_fixture_nodes() -> None:
    """capture-raw.txt's `ls -l` of the nodes matches the healthy fixture's mode/major/minor."""
    dev = facts("h200-healthy").devices
    assert dev is not None
    listing = capture()["ls dev nvidia"]
    seen = 0
    for m in re.finditer(r"^(c[rwx-]{9}) .*? (\d+), +(\d+) \S+ \d+ [\d:]+ (\S+)$", listing, re.M):
        perms, major, minor, name = m.groups()
        path = name if name.startswith("/") else f"/dev/nvidia-caps/{name}"
        node = dev.node(path)
        assert node is not None, path
        mode = sum(1 << (8 - i) for i, c in enumerate(perms[1:]) if c != "-")
        assert (node.major, node.minor, node.mode) == (int(major), int(minor), mode), path
        seen += 1
    assert seen >= len(dev.nodes)


def test_probe_devices_only_core_nodes_without_gpus(tmp_path: Path) -> None:
    """nodriver-vm: no /proc/devices NVIDIA entries and no nodes; the core nodes are reported
    absent, no /dev/nvidiaN is invented without a GPU count."""
    fx = facts("nodriver-vm")
    assert fx.devices is not None
    (tmp_path / "dev").mkdir()
    # /proc/devices printed back from the majors recorded on that VM (char section only).
    lines = "".join(f"{m:3d} {n}\n" for n, m in fx.devices.majors.items())
    put(tmp_path, "/proc/devices", f"Character devices:\n{lines}\nBlock devices:\n  7 loop\n")
    r = Reader(root=tmp_path)
    assert probe_devices(r, gpu_count=None) == fx.devices
    assert r.unreadable == {}


def test_probe_devices_spec_count_adds_missing_gpu_nodes(tmp_path: Path) -> None:
    """With the spec's GPU count, absent /dev/nvidiaN are listed as missing, in index order."""
    r = replay_devices(tmp_path, facts("h200-healthy"))
    got = probe_devices(r, gpu_count=3)
    gpu_nodes = [n for n in got.nodes if re.fullmatch(r"/dev/nvidia\d+", n.path)]
    assert [(n.path, n.exists) for n in gpu_nodes] == [
        ("/dev/nvidia0", True),
        ("/dev/nvidia1", False),
        ("/dev/nvidia2", False),
    ]


def test_inspect_node_stat_failure_is_noted(tmp_path: Path) -> None:
    class Denied(Reader):
        def stat_node(self, p: str) -> NodeStat | None:
            raise PermissionError(errno.EACCES, "Permission denied")

    r = Denied(root=tmp_path)
    assert inspect_node(r, "/dev/nvidia0") == DevNode(path="/dev/nvidia0", exists=True)
    assert r.unreadable["devices./dev/nvidia0"] == "cannot stat: Permission denied"


def test_probe_devices_proc_devices_unreadable(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    r = Reader(root=tmp_path)
    got = probe_devices(r, None)
    assert got.majors == {}
    assert "cannot read /proc/devices" in r.unreadable["devices.proc_devices"]


def test_fixture_majors_are_parsed_proc_devices() -> None:
    for name in H200_FIXTURES:
        dev = facts(name).devices
        assert isinstance(dev, DeviceFacts)
        assert dev.majors == parse_proc_devices(raw("proc_devices.txt")), name
