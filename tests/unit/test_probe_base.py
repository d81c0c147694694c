"""probes/base.py: the Reader on this machine's own files and device nodes."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from ct200_tools.doctor.probes.base import NodeStat, Reader
from ct200_tools.doctor.probes.devices import inspect_node
from tests.unit.probe_helpers import (
    put,
)


def test_reader_stat_and_open_on_this_machine(tmp_path: Path) -> None:
    """The real Reader: /dev/null is c 1:3 everywhere; a regular file is not a char node and
    is not opened; a missing path is None / ENOENT."""
    if not Path("/dev/null").is_char_device():
        pytest.skip("no /dev/null char device here")
    real = Reader(root=Path("/"))
    assert real.stat_node("/dev/null") == NodeStat(is_char=True, major=1, minor=3, mode=0o666)
    assert real.try_open("/dev/null") == 0
    put(tmp_path, "/dev/nvidia-uvm", "not a device")
    r = Reader(root=tmp_path)
    st_ = r.stat_node("/dev/nvidia-uvm")
    assert st_ is not None and not st_.is_char
    node = inspect_node(r, "/dev/nvidia-uvm")
    assert node.exists and not node.is_char and node.open_errno is None
    assert r.stat_node("/dev/nvidia0") is None
    assert r.try_open("/dev/nvidia0") == errno.ENOENT
