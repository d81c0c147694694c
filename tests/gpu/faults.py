"""Inject real device-access faults for the GPU tests, the way the incident happened.

- run_denied: a cgroup-v2 BPF device program (what LXC attaches for lxc.cgroup2.devices.allow)
  that denies one character major (nvidia-uvm's, or 195: nvidiactl and every GPU node), or one
  node of it (195:N, one GPU); the child runs inside that new cgroup, which alone carries it.
- replace_node: a private mount namespace where another node is bind-mounted over a device
  node (a stale node whose major no longer matches /proc/devices).
Linux, root and x86_64 only; stdlib + ctypes, so it runs where nothing can be installed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

SYS_BPF = 321  # x86_64
BPF_PROG_LOAD, BPF_PROG_ATTACH = 5, 8
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6
BPF_F_ALLOW_MULTI = 2
CLONE_NEWNS = 0x00020000
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _insn(code: int, dst: int, src: int, off: int, imm: int) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def device_program(deny_major: int, deny_minor: int | None = None) -> bytes:
    """r2 = ctx->major; if r2 == deny_major return 0 (deny); return 1 (allow). With a minor,
    only that one node of the major is denied (one GPU's /dev/nvidiaN)."""
    if deny_minor is None:
        return b"".join(
            [
                _insn(0x61, 2, 1, 4, 0),  # ldxw r2, [r1 + 4]  (struct bpf_cgroup_dev_ctx.major)
                _insn(0x15, 2, 0, 2, deny_major),  # jeq r2, imm, +2
                _insn(0xB7, 0, 0, 0, 1),  # mov r0, 1
                _insn(0x95, 0, 0, 0, 0),  # exit
                _insn(0xB7, 0, 0, 0, 0),  # mov r0, 0
                _insn(0x95, 0, 0, 0, 0),  # exit
            ]
        )
    return b"".join(
        [
            _insn(0x61, 2, 1, 4, 0),  # ldxw r2, [r1 + 4]   (major)
            _insn(0x55, 2, 0, 4, deny_major),  # jne r2, imm, +4  (to allow)
            _insn(0x61, 3, 1, 8, 0),  # ldxw r3, [r1 + 8]   (minor)
            _insn(0x55, 3, 0, 2, deny_minor),  # jne r3, imm, +2  (to allow)
            _insn(0xB7, 0, 0, 0, 0),  # mov r0, 0  (deny)
            _insn(0x95, 0, 0, 0, 0),  # exit
            _insn(0xB7, 0, 0, 0, 1),  # allow: mov r0, 1
            _insn(0x95, 0, 0, 0, 0),  # exit
        ]
    )


def _bpf(cmd: int, attr: bytes) -> int:
    buf = ctypes.create_string_buffer(attr, 128)
    ret = _libc.syscall(SYS_BPF, cmd, buf, 128)
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf({cmd}): {os.strerror(err)}")
    return int(ret)


def load_device_program(deny_major: int, deny_minor: int | None = None) -> int:
    prog = device_program(deny_major, deny_minor)
    insns = ctypes.create_string_buffer(prog, len(prog))
    license_ = ctypes.create_string_buffer(b"GPL")
    attr = struct.pack(
        "<IIQQ",
        BPF_PROG_TYPE_CGROUP_DEVICE,
        len(prog) // 8,
        ctypes.addressof(insns),
        ctypes.addressof(license_),
    )
    return _bpf(BPF_PROG_LOAD, attr)


def cgroup2_root() -> Path:
    """The cgroup v2 hierarchy: /sys/fs/cgroup, or its `unified` mount on a hybrid machine."""
    for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        if (root / "cgroup.controllers").exists():
            return root
    raise OSError("no cgroup v2 hierarchy under /sys/fs/cgroup")


def run_denied(
    argv: Sequence[str],
    deny_major: int,
    cgroup_root: str | None = None,
    timeout: float = 120,
    deny_minor: int | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run argv in a fresh child cgroup whose device program denies `deny_major` (only its
    `deny_minor` node when given).

    Only that new cgroup is affected: the program is attached to it alone (never to the root
    or the test's own cgroup), so denying even c 195:* leaves the machine's GPU usable; and
    the cgroup is emptied (every process in it killed) and removed afterwards, also when argv
    hangs or the attach fails, so no denying cgroup outlives the test."""
    root = Path(cgroup_root) if cgroup_root else cgroup2_root()
    if not (root / "cgroup.controllers").exists():
        raise OSError(f"{root} is not a cgroup v2 hierarchy")
    node = f"{deny_major}" if deny_minor is None else f"{deny_major}-{deny_minor}"
    cg = root / f"ct200-fault-{os.getpid()}-{node}"
    cg.mkdir()
    try:
        prog_fd = load_device_program(deny_major, deny_minor)
        cg_fd = os.open(cg, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _bpf(
                BPF_PROG_ATTACH,
                struct.pack("<IIII", cg_fd, prog_fd, BPF_CGROUP_DEVICE, BPF_F_ALLOW_MULTI),
            )
        finally:
            os.close(cg_fd)
            os.close(prog_fd)  # the attachment holds the program; our fd is not needed
        procs = str(cg / "cgroup.procs")

        def enter() -> None:  # runs in the child between fork and exec
            with open(procs, "w") as fh:
                fh.write(str(os.getpid()))

        return subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=enter,
            check=False,
        )
    finally:
        remove_cgroup(cg)


def remove_cgroup(cg: Path, wait_s: float = 10.0) -> None:
    """Kill whatever is left in `cg` (a CUDA child of a timed-out doctor) and remove it."""
    with contextlib.suppress(OSError):
        (cg / "cgroup.kill").write_text("1")  # kernel >= 5.14: the whole cgroup at once
    deadline = time.monotonic() + wait_s
    while True:
        try:
            pids = [int(p) for p in (cg / "cgroup.procs").read_text().split()]
        except OSError:
            pids = []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            cg.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def run_with_node_replaced(
    argv: Sequence[str], node: str, replacement: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run argv in a private mount namespace where `replacement` is bind-mounted over `node`."""

    def enter() -> None:
        if _libc.unshare(CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
        if _libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
            raise OSError(ctypes.get_errno(), "make / private")
        if _libc.mount(replacement.encode(), node.encode(), None, MS_BIND, None) != 0:
            raise OSError(ctypes.get_errno(), f"bind {replacement} over {node}")

    return subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, preexec_fn=enter, check=False
    )


def doctor_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "ct200_tools.cli.entry", *args]
