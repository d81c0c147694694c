"""The PVE host's side (`check --host`): its kernel, its NVIDIA nodes, its GPUs' config space and
the bridges above them, and the container's config in /etc/pve -- through any Reader: this
machine's (`--host local`) or the host's over SSH (probes/ssh.py), with the same probes as the
container side. It judges nothing; what it cannot read lands in `unreadable` under "host.".
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ct200_tools.doctor.probes.base import Reader, SshError
from ct200_tools.doctor.probes.devices import probe_devices
from ct200_tools.doctor.probes.kernel import probe_kernel
from ct200_tools.doctor.probes.pci import probe_bridges, probe_pci
from ct200_tools.facts import Facts, HostFacts, LxcConfFacts
from ct200_tools.spec import SiteSpec

LXC_DIR = "/etc/pve/lxc"
T = TypeVar("T")


def conf_path(vmid: int) -> str:
    return f"{LXC_DIR}/{vmid}.conf"


def probe_lxc(r: Reader, vmid: int, passthrough: str) -> LxcConfFacts:
    path = conf_path(vmid)
    try:
        # Read as bytes: pvecfg keeps what is not UTF-8, and so does the check's parse.
        text = r.read_bytes(path).decode("utf-8", "surrogateescape")
    except FileNotFoundError:
        return LxcConfFacts(vmid, path, exists=False, passthrough=passthrough)
    except OSError as exc:
        r.note("lxc", f"cannot read {path}: {exc.strerror or exc}")
        return LxcConfFacts(vmid, path, exists=True, passthrough=passthrough)
    return LxcConfFacts(vmid, path, exists=True, text=text, passthrough=passthrough)


def _guard(r: Reader, key: str, fn: Callable[[], T]) -> T | None:
    """One part's failure (a probe bug, a dropped connection) is recorded, not raised."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a fact, as in probes/__init__.py
        r.note(key, f"probe failed: {type(exc).__name__}: {exc}")
        return None


def probe_host(r: Reader, spec: SiteSpec, via: str) -> tuple[HostFacts, dict[str, str]]:
    """The host's facts and why parts of them could not be read (keys prefixed "host.")."""
    t0 = time.monotonic()
    gpus = spec.gpus.count
    kernel = _guard(r, "kernel", lambda: probe_kernel(r))
    devices = _guard(r, "devices", lambda: probe_devices(r, gpus, open_nodes=False))
    pci = _guard(r, "pci", lambda: probe_pci(r))
    bridges = _guard(r, "bridges", lambda: probe_bridges(r, pci)) if pci is not None else None
    if pci is None and "bridges" not in r.unreadable:
        r.note("bridges", "the host's PCI bus was not read")
    lxc = None
    if spec.pve is not None:
        pve = spec.pve
        lxc = _guard(r, "lxc", lambda: probe_lxc(r, pve.vmid, pve.passthrough))
    hostname = r.first_text("/proc/sys/kernel/hostname")
    facts = HostFacts(
        via=via,
        hostname=hostname,
        kernel=kernel,
        devices=devices,
        pci=pci,
        bridges=bridges,
        lxc=lxc,
        duration_s=round(time.monotonic() - t0, 3),
    )
    return facts, {f"host.{k}": v for k, v in sorted(r.unreadable.items())}


class HostProbe(threading.Thread):
    """probe_host beside the container-side probes (their threads and CUDA children). Over SSH
    the connection is made here too, so its key exchange overlaps the local probes; a refusal
    (unknown host key...) is kept in `refused` and raised by finish()."""

    def __init__(self, r: Reader | None, spec: SiteSpec, via: str, target: Any = None) -> None:
        super().__init__(name="probe-host", daemon=True)
        self.reader, self.spec, self.via, self.target = r, spec, via, target
        self.result: tuple[HostFacts, dict[str, str]] | None = None
        self.error: str | None = None
        #: The SshError that kept the host from being read at all.
        self.refused: Exception | None = None
        #: The SSH session (ssh.SshSession) to close after the read; None for --host local.
        self.session: Any = None
        #: The SSH connection's own timeout (connect, banner, auth).
        self.timeout_s = 10.0

    def run(self) -> None:
        try:
            if self.reader is None:
                from ct200_tools.doctor.probes import ssh  # noqa: PLC0415

                try:
                    self.session = ssh.connect(self.target, self.timeout_s)
                except SshError as exc:
                    self.refused = exc
                    return
                self.reader = ssh.SshReader(self.session)
            self.result = probe_host(self.reader, self.spec, self.via)
        except Exception as exc:  # noqa: BLE001 - recorded, as every probe's
            self.error = f"{type(exc).__name__}: {exc}"


def _ssh_module(host: str) -> Any:
    """probes/ssh.py, imported only for --host HOST (paramiko is needed only there); a missing
    paramiko is a clear SshError, not the doctor's own crash."""
    try:
        from ct200_tools.doctor.probes import ssh  # noqa: PLC0415
    except ImportError as exc:
        raise SshError(
            f"--host {host}: reading a host over SSH needs paramiko, which is not importable "
            f"here ({exc}): install ct200-tools with its dependencies (pip install "
            "'paramiko>=3.4' into the doctor's venv), or run the doctor on the host itself "
            "with --host local"
        ) from None
    return ssh


#: `--host local`: this machine is the host, read through the plain Reader (no SSH).
LOCAL = "local"


def start(host: str, spec: SiteSpec, ssh_config: str | None, timeout_s: float) -> HostProbe:
    """Start reading the host in the background: this machine with --host local, else over
    SSH (the target resolved here: a bad HOST or ssh config is an SshError at once)."""
    if host == LOCAL:
        probe = HostProbe(Reader(), spec, LOCAL)
    else:
        ssh = _ssh_module(host)
        target = ssh.resolve(host, ssh_config)
        via = "".join(f" via {j.describe()}" for j in reversed(target.jumps))
        probe = HostProbe(None, spec, f"ssh {target.describe()}{via}", target)
        probe.timeout_s = timeout_s
    probe.start()
    return probe


def finish(probe: HostProbe, facts: Facts, timeout_s: float) -> Facts:
    """The facts with the host's added (or why it could not be read, under "host"); the
    SshError when the host refused the connection."""
    probe.join(timeout_s)
    if probe.refused is not None:
        raise probe.refused
    unreadable = dict(facts.unreadable)
    host = None
    if probe.is_alive():
        unreadable["host"] = f"reading the host ({probe.via}) did not finish within {timeout_s:g} s"
    elif probe.error is not None or probe.result is None:
        unreadable["host"] = f"reading the host ({probe.via}) failed: {probe.error}"
    else:
        host, more = probe.result
        unreadable.update(more)
    if probe.session is not None and not probe.is_alive():
        probe.session.close()
    return dataclasses.replace(facts, host=host, unreadable=dict(sorted(unreadable.items())))
