"""One machine: an overlay on the cached rootfs, made its own (hostname, keys, role), booted with
systemd-nspawn in its own network namespace and cgroup."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from testbed import cgroups, ssh, standins
from testbed.config import MachineSpec, Slot
from testbed.errors import TestbedError
from testbed.system import Runner


@dataclass(frozen=True)
class Machine:
    name: str
    role: str
    address: str
    #: systemd-nspawn's pid; the machine's processes are found by cgroup, not by this.
    pid: int
    netns: str
    root: str
    log: str
    #: The lock file systemd-nspawn keeps for the root directory; left behind when it is killed.
    lock: str = ""

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Machine:
        return cls(
            name=str(data["name"]),
            role=str(data["role"]),
            address=str(data["address"]),
            pid=int(str(data["pid"])),
            netns=str(data["netns"]),
            root=str(data["root"]),
            log=str(data["log"]),
            lock=str(data.get("lock", "")),
        )


def mount_root(runner: Runner, slot: Slot, name: str, lower: Path) -> Path:
    """The machine's writable root: an overlay on the cache (or a copy where overlayfs fails)."""
    top = slot.machine_dir(name)
    upper, work, root = top / "upper", top / "work", top / "root"
    for d in (upper, work, root):
        d.mkdir(parents=True, exist_ok=True)
    for p in (lower, upper, work):
        if any(c in str(p) for c in ",:\\ \n"):
            raise TestbedError(
                f"path {p} cannot be used in overlayfs options",
                fix="set CT200_TESTBED_CACHE / CT200_TESTBED_RUN to paths without , : \\ or spaces",
            )
    opts = f"lowerdir={lower},upperdir={upper},workdir={work}"
    proc = runner.run(["mount", "-t", "overlay", "overlay", "-o", opts, root], check=False)
    if proc.returncode != 0:
        print(f"testbed: overlay mount failed ({proc.stderr.strip()}); copying the rootfs instead")
        runner.run(["cp", "-a", "--reflink=auto", f"{lower}/.", root], timeout=600)
    return root


def hostname(machine: str) -> str:
    """The machine's hostname and inventory name: ``pve`` -> ``ct200-pve``, as in the example
    site inventory/ct200, and never the name of an inventory group."""
    return f"ct200-{machine}"


def personalize(
    runner: Runner,
    root: Path,
    spec: MachineSpec,
    hosts: dict[str, str],
    controller_pub: str,
    vmid: int,
) -> str:
    """Write what makes the machine itself; returns its public host key line.

    ``hosts``: every machine of the slot, name -> address (for /etc/hosts).
    """
    etc = root / "etc"
    (etc / "hostname").write_text(hostname(spec.name) + "\n")
    lines = ["127.0.0.1 localhost", f"127.0.1.1 {hostname(spec.name)} {spec.name}"]
    lines += ["::1 localhost ip6-localhost"]
    lines += [f"{a} {hostname(n)} {n}" for n, a in hosts.items() if n != spec.name]
    (etc / "hosts").write_text("\n".join(lines) + "\n")
    (etc / "machine-id").write_text(uuid.uuid4().hex + "\n")
    hostkey = ssh.keygen(
        runner, etc / "ssh" / "ssh_host_ed25519_key", f"root@{hostname(spec.name)}"
    )
    dot_ssh = root / "root" / ".ssh"
    dot_ssh.mkdir(mode=0o700, exist_ok=True)
    auth = dot_ssh / "authorized_keys"
    auth.write_text(controller_pub + "\n")
    auth.chmod(0o600)
    (etc / "ct200-testbed").mkdir(exist_ok=True)
    (etc / "ct200-testbed" / "role").write_text(spec.role + "\n")
    if spec.role == "pve":
        lxc = etc / "pve" / "lxc"
        lxc.mkdir(parents=True, exist_ok=True)
        (etc / "pve" / ".ct200-testbed-standin").write_text(standins.PVE_STANDIN_MARKER)
        conf = lxc / f"{vmid}.conf"
        conf.write_text(standins.lxc_conf(vmid))
        conf.chmod(0o640)
        sbin = root / "usr" / "local" / "sbin"
        tools = (
            ("pct", standins.PCT),
            ("pveversion", standins.PVEVERSION),
            ("ct200-testbed-pve-guests", standins.PVE_GUESTS),
        )
        for tool, text in tools:
            (sbin / tool).write_text(text)
            (sbin / tool).chmod(0o755)
        units = etc / "systemd" / "system"
        (units / "pve-guests.service").write_text(standins.PVE_GUESTS_UNIT)
        wants = units / "multi-user.target.wants"
        wants.mkdir(parents=True, exist_ok=True)
        (wants / "pve-guests.service").symlink_to("/etc/systemd/system/pve-guests.service")
    return hostkey


#: Started nspawn processes, reaped on stop when this process is their parent.
_children: list[subprocess.Popen[bytes]] = []


def boot(
    slot: Slot,
    spec: MachineSpec,
    root: Path,
    netns_path: str,
    cgroup_dirs: list[Path],
    env: dict[str, str],
) -> tuple[int, Path]:
    """Start systemd-nspawn in the background; returns its pid and its console log."""
    log = slot.machine_dir(spec.name) / "console.log"
    args = [
        "systemd-nspawn",
        "--boot",
        f"--directory={root}",
        f"--machine={slot.netns(spec.name)}",
        f"--hostname={hostname(spec.name)}",
        # No systemd as PID 1 on the controller (a container, CI): nothing to register with.
        "--register=no",
        "--keep-unit",
        f"--network-namespace-path={netns_path}",
        "--console=read-only",
        "--resolv-conf=off",
        "--timezone=off",
        "--link-journal=no",
    ]
    cgroups.create(cgroup_dirs)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            start_new_session=True,
            # Between fork and exec, so nspawn starts in the machine's cgroup. The harness
            # starts no threads, which is what makes preexec_fn safe here.
            preexec_fn=functools.partial(cgroups.enter, cgroup_dirs),  # noqa: PLW1509
        )
    _children.append(proc)
    return proc.pid, log


NSPAWN_LOCKS = Path("/run/systemd/nspawn/locks")


def nspawn_lock(root: Path) -> str:
    """The lock file systemd-nspawn takes for ``root`` (named after its device and inode)."""
    st = root.stat()
    return str(NSPAWN_LOCKS / f"inode-{st.st_dev}:{st.st_ino}")


def alive(pid: int, machine: str) -> bool:
    """Whether ``pid`` is still the systemd-nspawn of ``machine`` (not a reused pid, no zombie)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    return (
        state != "Z"
        and bool(cmdline)
        and cmdline[0].endswith(b"systemd-nspawn")
        and f"--machine={machine}".encode() in cmdline
    )


def stop(pid: int, machine: str, timeout: float = 10.0) -> bool:
    """Power the machine off (SIGTERM makes nspawn ask systemd to power off); True if it did."""
    if alive(pid, machine):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(pid, machine):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    for proc in [p for p in _children if p.pid == pid]:
        proc.wait(timeout=5)
        _children.remove(proc)
    return True


def _unescape(field: str) -> str:
    return field.encode().decode("unicode_escape")


def unmount_under(runner: Runner, top: Path) -> list[str]:
    """Unmount everything mounted at or below ``top``, deepest first; returns the mountpoints."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mountpoint = _unescape(line.split()[4])
        if mountpoint == str(top) or mountpoint.startswith(str(top) + "/"):
            mounts.append(mountpoint)
    for mountpoint in sorted(set(mounts), key=lambda m: m.count("/"), reverse=True):
        if runner.run(["umount", mountpoint], check=False).returncode != 0:
            runner.run(["umount", "--lazy", mountpoint], check=False)
    return sorted(set(mounts))
