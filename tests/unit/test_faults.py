"""The GPU tests' fault injection, run here for real on a device nobody needs (c 1:*, /dev/null):
the denial reaches only the new cgroup's processes, and no cgroup outlives a run, also when the
command hangs. tests/gpu relies on both when it denies c 195:* on the GPU machine."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.gpu import faults

MEM_MAJOR = 1  # /dev/null is c 1:3


def _cgroup_root() -> str:
    if os.geteuid() != 0:
        pytest.skip("needs root (BPF device programs, cgroup creation)")
    try:
        return str(faults.cgroup2_root())
    except OSError as exc:
        pytest.skip(str(exc))


def leftovers(root: str) -> list[str]:
    return [n for n in os.listdir(root) if n.startswith("ct200-fault-")]


def test_denial_reaches_only_the_child_cgroup() -> None:
    root = _cgroup_root()
    r = faults.run_denied(
        ["sh", "-c", "echo x > /dev/null; echo rc=$?"], MEM_MAJOR, cgroup_root=root
    )
    assert "Operation not permitted" in r.stderr, r
    assert r.stdout.strip() == "rc=2"
    with open("/dev/null", "w") as fh:  # this process, outside that cgroup, is unaffected
        fh.write("x")
    assert leftovers(root) == []


def test_a_hung_command_and_its_children_are_killed_and_the_cgroup_removed() -> None:
    root = _cgroup_root()
    with pytest.raises(subprocess.TimeoutExpired):
        faults.run_denied(
            ["sh", "-c", "sleep 300 & sleep 300"], MEM_MAJOR, cgroup_root=root, timeout=1
        )
    assert leftovers(root) == []


def test_one_node_of_a_major_is_denied_alone() -> None:
    """deny_minor: only c 1:3 (/dev/null) is denied, c 1:5 (/dev/zero) of the same major is
    not, as tests/gpu denies one GPU's /dev/nvidiaN and leaves /dev/nvidiactl (195:255)."""
    root = _cgroup_root()
    script = "(: < /dev/zero); echo zero=$?; (: < /dev/null); echo null=$?"
    r = faults.run_denied(["sh", "-c", script], MEM_MAJOR, cgroup_root=root, deny_minor=3)
    zero, null = r.stdout.split()
    assert zero == "zero=0", r
    assert null != "null=0" and "cannot open /dev/null: Operation not permitted" in r.stderr, r
    assert leftovers(root) == []
