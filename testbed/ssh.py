"""SSH between the controller and the machines: keys, known_hosts, and the ssh command line.

The controller key and every machine's host key are made fresh for each testbed; the harness
writes the host keys into its own known_hosts, so host-key checking stays on
(StrictHostKeyChecking=yes) and nothing touches the user's ~/.ssh.
"""

from __future__ import annotations

import contextlib
import shlex
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from testbed.config import SSH_PORT, Slot
from testbed.errors import TestbedError
from testbed.system import Runner


def keygen(runner: Runner, path: Path, comment: str) -> str:
    """A new ed25519 key pair at ``path``; returns the public key line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in (path, path.with_name(path.name + ".pub")):
        old.unlink(missing_ok=True)
    runner.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path])
    return path.with_name(path.name + ".pub").read_text().strip()


def options(slot: Slot) -> list[str]:
    """The -o options every connection to the slot's machines uses (Ansible's too)."""
    return [
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        f"UserKnownHostsFile={slot.known_hosts}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "StrictHostKeyChecking=yes",
    ]


def argv(
    slot: Slot,
    address: str,
    command: Sequence[str] = (),
    tty: bool | None = False,
    quote: bool = True,
) -> list[str]:
    """ssh argv for ``command`` on the machine; the remote shell gets it quoted, word by word,
    or with ``quote=False`` joined by spaces as ssh(1) joins its arguments, so the remote shell
    reads `'a; b'` as two commands (what a person typing `python -m testbed ssh` expects).

    ``tty``: True forces a terminal, False refuses one, None leaves it to ssh (interactive use).
    ``as_ssh``: the words joined by spaces, unquoted, as ssh itself does, so the remote shell
    parses them (`ssh ct -- 'a; b'` runs a, then b): for people at `python -m testbed ssh`.
    """
    args = ["ssh", "-F", "/dev/null", "-i", str(slot.key), *options(slot)]
    args += ["-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR"]
    if tty is not None:
        args += ["-t"] if tty else ["-T"]
    args += ["-p", str(SSH_PORT), f"root@{address}"]
    if command:
        args += ["--", shlex.join(command) if quote else " ".join(command)]
    return args


def write_known_hosts(slot: Slot, hostkeys: dict[str, str]) -> None:
    """``hostkeys``: address -> the machine's public host key line."""
    lines = []
    for address, pub in sorted(hostkeys.items()):
        keytype, key = pub.split()[:2]
        lines.append(f"{address} {keytype} {key}")
    slot.known_hosts.write_text("\n".join(lines) + "\n")


def write_config(slot: Slot, machines: dict[str, str]) -> None:
    """An ssh_config for people: ``ssh -F <slot>/ssh/config pve``. ``machines``: name -> address."""
    blocks = []
    for name, address in machines.items():
        blocks.append(
            f"Host {name}\n  HostName {address}\n  User root\n  IdentityFile {slot.key}\n"
            f"  IdentitiesOnly yes\n  UserKnownHostsFile {slot.known_hosts}\n"
            "  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n"
        )
    slot.ssh_config.write_text("\n".join(blocks))


def port_open(address: str, port: int = SSH_PORT, timeout: float = 0.5) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=timeout):
        return True
    return False


def wait_ready(
    runner: Runner,
    slot: Slot,
    name: str,
    address: str,
    alive: Callable[[], bool],
    boot_log: Path,
    timeout: float = 90,
) -> None:
    """Until sshd answers with the expected host key and systemd finished booting."""
    deadline = time.monotonic() + timeout

    def fail(what: str, fix: str) -> TestbedError:
        tail = boot_log.read_text(errors="replace")[-1500:] if boot_log.exists() else ""
        return TestbedError(f"machine {name}: {what}", fix=fix, detail=tail)

    while not port_open(address):
        if not alive():
            raise fail("systemd-nspawn exited during boot", f"see its log: {boot_log}")
        if time.monotonic() > deadline:
            raise fail(
                f"sshd did not listen on {address}:{SSH_PORT} within {timeout:.0f}s",
                f"see the boot log {boot_log}",
            )
        time.sleep(0.2)
    left = max(5.0, deadline - time.monotonic())
    proc = runner.run(
        argv(slot, address, ["systemctl", "is-system-running", "--wait"]), check=False, timeout=left
    )
    state = proc.stdout.strip()
    if proc.returncode == 255:
        raise fail(
            f"ssh failed: {proc.stderr.strip()}",
            "a host key mismatch means the known_hosts is stale: run `down` and `up` again",
        )
    if state != "running":
        failed = runner.run(
            argv(slot, address, ["systemctl", "--failed", "--no-legend"]), check=False
        ).stdout
        raise TestbedError(
            f"machine {name}: systemd reports {state or 'nothing'} after boot",
            detail=failed,
            fix=f"inspect it: `python -m testbed ssh {name} -- journalctl -b`",
        )


def wait_booted(
    runner: Runner,
    slot: Slot,
    name: str,
    address: str,
    alive: Callable[[], bool],
    boot_log: Path,
    timeout: float = 600,
) -> str:
    """After a power cycle: until sshd answers and systemd finished booting; returns systemd's
    state ("running", or "degraded" when a unit failed, which a test of the boot chain wants to
    see rather than an error)."""
    deadline = time.monotonic() + timeout
    while not port_open(address):
        if not alive():
            raise TestbedError(
                f"machine {name}: systemd-nspawn exited during boot",
                fix=f"see its log: {boot_log}",
            )
        if time.monotonic() > deadline:
            raise TestbedError(
                f"machine {name}: sshd did not listen on {address}:{SSH_PORT} "
                f"within {timeout:.0f}s",
                fix=f"see the boot log {boot_log}",
            )
        time.sleep(0.2)
    left = max(5.0, deadline - time.monotonic())
    proc = runner.run(
        argv(slot, address, ["systemctl", "is-system-running", "--wait"]), check=False, timeout=left
    )
    state = proc.stdout.strip()
    if proc.returncode == 255 or state not in ("running", "degraded"):
        raise TestbedError(
            f"machine {name}: systemd reports {state or 'nothing'} after boot "
            f"({proc.stderr.strip()})",
            fix=f"inspect it: `python -m testbed ssh {name} -- journalctl -b`",
        )
    return state
