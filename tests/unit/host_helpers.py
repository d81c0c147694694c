"""The PVE host as `check --host` reads it, rebuilt from the recordings for the host checks'
tests: the real host probe (probes/host.py) reads a tree made of

* the H200's recorded /proc/devices, /proc/driver/nvidia/version, /proc/cmdline, and each GPU's
  recorded sysfs files and 4096-byte config space (tests/fixtures/raw/h200);
* the container configs of the PVE corpus (tests/fixtures/pve), as /etc/pve/lxc/200.conf;
* device nodes replayed from a container recording's metadata (ReplayReader: a tree cannot
  hold char devices).

DERIVED, each edit named where it is made: the CT200's eight GPUs (the recorded config space at
the bus ids of tests/fixtures/facts/ct200-*.json, as derive_ct200.py does) and its nvidia-uvm
major 511; each GPU behind a PCIe root port whose config space is made here (no bridge was
recorded: on the lent machines the GPU sits on the root bus of a VM), with the ACS Control that
Linux's pci_std_enable_acs sets (SV|RR|CR|UF, 0x001d) or ACS off.
"""

from __future__ import annotations

import dataclasses
import functools
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ct200_tools.doctor.probes.host import probe_host
from ct200_tools.facts import DevNode, Facts, HostFacts
from ct200_tools.spec import SiteSpec, load_spec
from tests.unit.probe_helpers import (
    FIXTURES,
    REPO,
    SYSFS_NAMES,
    ReplayReader,
    capture,
    numa_nodes,
    put,
    raw,
    recorded_config,
    with_devctl,
)

CT200_SPEC = REPO / "inventory" / "ct200"
#: The CT200's GPUs (tests/fixtures/facts/ct200-*.json, derived).
CT200_BDFS = tuple(f"0000:{b}:00.0" for b in ("01", "21", "41", "61", "81", "a1", "c1", "e1"))
#: What Linux enables on a port when the IOMMU is on (drivers/pci/pci.c, pci_std_enable_acs).
ACS_LINUX_DEFAULT = 0x001D


@functools.cache
def ct200_spec() -> SiteSpec:
    return load_spec(str(CT200_SPEC))


def proc_devices(uvm: int | None = 511, nvidia: bool = True) -> str:
    """The recorded /proc/devices (nvidia-uvm 238 there); DERIVED: nvidia-uvm at `uvm` (the
    CT200's 511), or not loaded (None), or no NVIDIA driver at all."""
    text = raw("proc_devices.txt")
    lines = text.splitlines(keepends=True)
    out = []
    for line in lines:
        name = line.split()[1] if len(line.split()) == 2 else ""
        if name == "nvidia-uvm":
            if uvm is None or not nvidia:
                continue
            out.append(line.replace("238", str(uvm)))
            continue
        if name.startswith("nvidia") and not nvidia:
            continue
        out.append(line)
    return "".join(out)


def bridge_config(acs_ctl: int | None) -> bytes:
    """DERIVED: a PCIe root port's 4096-byte config space: type 1 header, the PCI Express
    capability at 0x40 (the capability list the recorded GPU has at 0x60), and ACS at 0x100
    with capability 0x005f and the given control (None: no ACS capability)."""
    cfg = bytearray(4096)
    cfg[0:4] = (0x1022).to_bytes(2, "little") + (0x14AB).to_bytes(2, "little")
    cfg[0x06] = 0x10  # status: capability list
    cfg[0x0E] = 0x01  # header type 1: a bridge
    cfg[0x0A:0x0C] = (0x0604).to_bytes(2, "little")  # class: PCI-to-PCI bridge
    cfg[0x34] = 0x40
    cfg[0x40:0x42] = bytes([0x10, 0x00])  # PCI Express, last in the list
    cfg[0x42:0x44] = (0x0042).to_bytes(2, "little")  # version 2, root port
    if acs_ctl is not None:
        cfg[0x100:0x104] = (0x000D | 1 << 16).to_bytes(4, "little")  # ACS v1, last
        cfg[0x104:0x106] = (0x005F).to_bytes(2, "little")
        cfg[0x106:0x108] = acs_ctl.to_bytes(2, "little")
    return bytes(cfg)


@dataclass(frozen=True)
class HostCase:
    #: A file of tests/fixtures/pve, as /etc/pve/lxc/200.conf; None: no such file.
    conf: str | None = "incident-raw.conf"
    #: Text replacing the config's (a derived edit), else the corpus file's.
    conf_text: str | None = None
    uvm: int | None = 511
    nvidia: bool = True
    #: Nodes not made on the host.
    missing: tuple[str, ...] = ()
    gpus: tuple[str, ...] = CT200_BDFS
    #: DERIVED: the MRRS code written on every GPU (None: as recorded, 5 = 4096).
    mrrs_code: int | None = None
    numa_balancing: int = 0
    #: ACS Control of the root port above each GPU; None: no ACS; "none": on the root bus.
    acs: int | str | None = 0
    module: str | None = "recorded"


def _nodes(case: HostCase) -> dict[str, DevNode]:
    majors = {"nvidia": 195, "uvm": case.uvm}
    nodes = {f"/dev/nvidia{i}": (195, i) for i in range(len(case.gpus))}
    nodes["/dev/nvidiactl"] = (195, 255)
    if case.uvm is not None and case.nvidia:
        nodes["/dev/nvidia-uvm"] = (case.uvm, 0)
        nodes["/dev/nvidia-uvm-tools"] = (case.uvm, 1)
    if not case.nvidia:
        nodes = {}
    assert majors
    return {
        p: DevNode(p, exists=True, is_char=True, major=mj, minor=mn, mode=0o666)
        for p, (mj, mn) in nodes.items()
        if p not in case.missing
    }


def build(root: Path, case: HostCase) -> ReplayReader:
    cap = capture()
    put(root, "/proc/devices", proc_devices(case.uvm, case.nvidia))
    if case.module == "recorded" and case.nvidia:
        put(root, "/proc/driver/nvidia/version", raw("nvidia_version.txt"))
    elif case.module not in (None, "recorded"):
        put(
            root,
            "/proc/driver/nvidia/version",
            raw("nvidia_version.txt").replace("580.159.04", str(case.module)),
        )
    put(root, "/proc/cmdline", cap["cmdline"])
    put(root, "/proc/sys/kernel/osrelease", cap["uname"].split()[2] + "\n")
    put(root, "/proc/sys/kernel/numa_balancing", f"{case.numa_balancing}\n")
    put(root, "/proc/sys/kernel/hostname", "pve\n")
    numa_nodes(root, 0)
    cfg = recorded_config()
    if case.mrrs_code is not None:
        cfg = with_devctl(cfg, mrrs_code=case.mrrs_code)
    (root / "sys/bus/pci/devices").mkdir(parents=True, exist_ok=True)
    for i, bdf in enumerate(case.gpus):
        port = f"0000:00:{i + 1:02x}.1"
        rel = f"pci0000:00/{bdf}" if case.acs == "none" else f"pci0000:00/{port}/{bdf}"
        dev = f"/sys/devices/{rel}"
        for name in SYSFS_NAMES:
            put(root, f"{dev}/{name}", raw(f"sysfs_0000_00_06.0_{name}.txt"))
        put(root, f"{dev}/vendor", "0x10de\n")
        put(root, f"{dev}/config", cfg)
        links = root / "sys/bus/pci/devices"
        links.mkdir(parents=True, exist_ok=True)
        (links / bdf).symlink_to(f"../../../devices/{rel}")
        if case.acs != "none":
            pdir = f"/sys/devices/pci0000:00/{port}"
            put(root, f"{pdir}/vendor", "0x1022\n")
            put(root, f"{pdir}/class", "0x060400\n")
            put(root, f"{pdir}/config", bridge_config(case.acs))  # type: ignore[arg-type]
            (links / port).symlink_to(f"../../../devices/pci0000:00/{port}")
    (root / "dev").mkdir(exist_ok=True)
    nodes = _nodes(case)
    for p in nodes:
        put(root, p)
    if case.conf_text is not None:
        put(root, "/etc/pve/lxc/200.conf", case.conf_text)
    elif case.conf is not None:
        put(root, "/etc/pve/lxc/200.conf", (FIXTURES / "pve" / case.conf).read_bytes())
    return ReplayReader(root=root, nodes=nodes)


_READ: dict[tuple[HostCase, str], tuple[HostFacts, dict[str, str]]] = {}


def read_host(case: HostCase, spec: SiteSpec | None = None) -> tuple[HostFacts, dict[str, str]]:
    """What probe_host reads of the case's tree (over SSH it reads the same files); once per
    case and spec (a spec holds dicts: it is keyed by its repr)."""
    spec = spec or ct200_spec()
    key = (case, repr(spec))
    if key not in _READ:
        with tempfile.TemporaryDirectory() as tmp:
            _READ[key] = probe_host(build(Path(tmp), case), spec, "ssh root@pve")
    return _READ[key]


def with_host(f: Facts, case: HostCase = HostCase(), spec: SiteSpec | None = None) -> Facts:
    host, unreadable = read_host(case, spec)
    return dataclasses.replace(f, host=host, unreadable={**f.unreadable, **unreadable})


def on(case: HostCase = HostCase()) -> Callable[[Facts], Facts]:
    """An Example edit: the container's facts with this host beside them."""
    return lambda f: with_host(f, case)


def conf_edit(name: str, old: str, new: str) -> str:
    """DERIVED: a corpus config with one edit."""
    text = (FIXTURES / "pve" / name).read_text()
    assert old in text, (name, old)
    return text.replace(old, new, 1)


def _devn_conf() -> str:
    """DERIVED: the fresh PVE 8 config as the ct200_pve_lxc_gpu module leaves it in devn mode
    (its own plan, for the CT200's eleven nodes)."""
    from ct200_tools.host import pvecfg  # noqa: PLC0415

    nodes = (*(f"/dev/nvidia{i}" for i in range(8)), "/dev/nvidiactl")
    want = pvecfg.Want((*nodes, "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"), "devn")
    return pvecfg.plan(pvecfg.parse((FIXTURES / "pve" / "fresh-pve8.conf").read_text()), want).after


#: DERIVED: the incident's config with the stale rule corrected (509 -> 511).
INCIDENT_FIXED = conf_edit("incident-raw.conf", "c 509:* rwm", "c 511:* rwm")
DEVN = _devn_conf()
#: DERIVED: devN entries plus the incident's leftover rule for the old major.
DEVN_STALE = DEVN + "lxc.cgroup2.devices.allow: c 509:* rwm\n"


def userspace(version: str, case: HostCase) -> Callable[[Facts], Facts]:
    """DERIVED: the container's NVML reports another userspace driver than the host's module."""

    def edit(f: Facts) -> Facts:
        assert f.nvml is not None
        f = dataclasses.replace(f, nvml=dataclasses.replace(f.nvml, driver_version=version))
        return with_host(f, case)

    return edit
