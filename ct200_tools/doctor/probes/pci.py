"""NVIDIA GPU functions from sysfs: NUMA node, CPUs, link, and MRRS/MPS from config space.

Reads sysfs directly so it works when the driver is broken, and needs no lspci.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ct200_tools.doctor.probes.base import Reader
from ct200_tools.facts import BridgeFacts, PciFacts

NVIDIA_VENDOR = "0x10de"
PCI_CAP_ID_EXP = 0x10
#: The standard header ends here; an unprivileged reader sees only this much.
STD_HEADER = 0x40
#: PCIe extended capabilities start here (config space beyond 256 bytes).
EXT_START = 0x100
PCI_EXT_CAP_ID_ACS = 0x000D
#: ACS Control bits that send peer-to-peer requests and completions up to the root complex:
#: P2P Request Redirect (2) and Completion Redirect (3).
ACS_REDIRECT = 0x000C
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


@dataclass(frozen=True)
class DevCtl:
    max_read_request: int
    max_payload: int


class ConfigUnreadable(ValueError):
    """The PCIe capability is not within the bytes this process could read."""


def find_capability(cfg: bytes, cap_id: int) -> int | None:
    """Offset of a capability in the standard list, or None if the device has none."""
    if len(cfg) < STD_HEADER:
        raise ConfigUnreadable(f"only {len(cfg)} bytes of config space")
    status = int.from_bytes(cfg[0x06:0x08], "little")
    if not status & 0x10:
        return None
    ptr = cfg[0x34] & 0xFC
    seen: set[int] = set()
    while ptr and ptr not in seen:
        if ptr + 2 > len(cfg):
            raise ConfigUnreadable(f"capability at {ptr:#x} is past the {len(cfg)} readable bytes")
        seen.add(ptr)
        if cfg[ptr] == cap_id:
            return ptr
        ptr = cfg[ptr + 1] & 0xFC
    return None


def parse_devctl(cfg: bytes) -> DevCtl | None:
    """MRRS and MPS from the PCIe Device Control register (capability + 0x08).

    Bits 14:12 and 7:5 encode 128 << n; n = 6 and 7 are reserved and rejected.
    """
    cap = find_capability(cfg, PCI_CAP_ID_EXP)
    if cap is None:
        return None
    if cap + 0x0A > len(cfg):
        raise ConfigUnreadable(f"PCIe capability at {cap:#x} is past the {len(cfg)} readable bytes")
    devctl = int.from_bytes(cfg[cap + 0x08 : cap + 0x0A], "little")
    mrrs_code, mps_code = (devctl >> 12) & 7, (devctl >> 5) & 7
    if mrrs_code > 5 or mps_code > 5:
        raise ValueError(f"reserved encoding in Device Control {devctl:#06x}")
    return DevCtl(max_read_request=128 << mrrs_code, max_payload=128 << mps_code)


def find_ext_capability(cfg: bytes, cap_id: int) -> int | None:
    """Offset of an extended capability (PCIe, from 0x100), or None if the device has none.
    ConfigUnreadable when the extended space was not readable (only 256 bytes, or the header)."""
    if len(cfg) <= EXT_START + 4:
        raise ConfigUnreadable(
            f"only {len(cfg)} bytes of config space: the extended capabilities need 4096"
        )
    ptr = EXT_START
    seen: set[int] = set()
    while ptr and ptr not in seen and ptr + 4 <= len(cfg):
        seen.add(ptr)
        header = int.from_bytes(cfg[ptr : ptr + 4], "little")
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == cap_id:
            return ptr
        ptr = (header >> 20) & 0xFFC
    return None


def parse_acs_ctl(cfg: bytes) -> int | None:
    """The ACS Control register (capability + 6), or None when the function has no ACS."""
    cap = find_ext_capability(cfg, PCI_EXT_CAP_ID_ACS)
    if cap is None or cap + 8 > len(cfg):
        return None
    return int.from_bytes(cfg[cap + 6 : cap + 8], "little")


def parse_cpulist(text: str) -> tuple[int, ...]:
    """ "0-3,8,10-11" -> (0, 1, 2, 3, 8, 10, 11)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(cpus)


def _read_int(r: Reader, p: str) -> int | None:
    try:
        return int(r.read_text(p).strip(), 0)
    except (OSError, ValueError):
        return None


def _read_str(r: Reader, p: str) -> str | None:
    try:
        return r.read_text(p).strip() or None
    except OSError:
        return None


def single_numa_node(r: Reader) -> int | None:
    """The node, when the machine has exactly one: then -1 in sysfs still means that node
    (nvidia-smi shows it the same way)."""
    try:
        nodes = [n for n in r.listdir("/sys/devices/system/node") if re.fullmatch(r"node\d+", n)]
    except OSError:
        return None
    return int(nodes[0][4:]) if len(nodes) == 1 else None


def probe_function(r: Reader, bdf: str) -> PciFacts:
    base = f"/sys/bus/pci/devices/{bdf}"
    key = f"pci.{bdf}"
    numa = _read_int(r, f"{base}/numa_node")
    if numa is not None and numa < 0:
        numa = single_numa_node(r)
        if numa is None:
            r.note(f"{key}.numa_node", "sysfs numa_node is -1: the platform reports no NUMA node")
    cpus_text = _read_str(r, f"{base}/local_cpulist")
    mrrs = mps = readable = None
    try:
        cfg = r.read_bytes(f"{base}/config")
        readable = len(cfg)
        ctl = parse_devctl(cfg)
        if ctl is not None:
            mrrs, mps = ctl.max_read_request, ctl.max_payload
        else:
            r.note(f"{key}.devctl", "no PCIe capability in config space")
    except ConfigUnreadable as exc:
        r.note(
            f"{key}.devctl",
            f"{exc}: config space beyond the header needs root on the host (run there)",
        )
    except (OSError, ValueError) as exc:
        r.note(f"{key}.devctl", f"cannot read {base}/config: {exc}")
    return PciFacts(
        bdf=bdf,
        device_id=_read_str(r, f"{base}/device"),
        numa_node=numa,
        local_cpus=parse_cpulist(cpus_text) if cpus_text else (),
        config_readable=readable,
        max_read_request=mrrs,
        max_payload=mps,
        max_link_speed=_read_str(r, f"{base}/max_link_speed"),
        max_link_width=_read_int(r, f"{base}/max_link_width"),
        current_link_speed=_read_str(r, f"{base}/current_link_speed"),
        current_link_width=_read_int(r, f"{base}/current_link_width"),
    )


def probe_pci(r: Reader) -> tuple[PciFacts, ...] | None:
    """Every NVIDIA display/3D controller function (class 0x03xxxx); audio functions skipped.
    None when the bus cannot be listed: unknown, which is not "no GPU"."""
    base = "/sys/bus/pci/devices"
    try:
        names = r.listdir(base)
    except OSError as exc:
        r.note("pci", f"cannot list {base}: {exc.strerror}")
        return None
    gpus = []
    for bdf in names:
        if _read_str(r, f"{base}/{bdf}/vendor") != NVIDIA_VENDOR:
            continue
        cls = _read_str(r, f"{base}/{bdf}/class") or ""
        if cls.startswith("0x03"):
            gpus.append(probe_function(r, bdf))
    return tuple(gpus)


def upstream_bridges(r: Reader, bdf: str) -> list[str]:
    """The bridges above a function, nearest first, from its sysfs path
    (../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0/<bdf>)."""
    target = r.readlink(f"/sys/bus/pci/devices/{bdf}")
    parts = [p for p in target.split("/") if _BDF.match(p)]
    return [p for p in reversed(parts) if p != bdf]


def probe_bridges(r: Reader, gpus: tuple[PciFacts, ...]) -> tuple[BridgeFacts, ...] | None:
    """Every bridge above the GPUs with its ACS Control; None when no GPU's path could be
    read (unknown, which is not "no bridge")."""
    below: dict[str, list[str]] = {}
    read_any = not gpus
    for g in gpus:
        try:
            chain = upstream_bridges(r, g.bdf)
        except OSError as exc:
            r.note(f"pci.{g.bdf}.bridges", f"cannot read its sysfs path: {exc.strerror or exc}")
            continue
        read_any = True
        for b in chain:
            below.setdefault(b, []).append(g.bdf)
    if not read_any:
        return None
    out = []
    for b, under in sorted(below.items()):
        has_acs: bool | None = None
        ctl: int | None = None
        try:
            ctl = parse_acs_ctl(r.read_bytes(f"/sys/bus/pci/devices/{b}/config"))
            has_acs = ctl is not None
        except ConfigUnreadable as exc:
            r.note(f"pci.{b}.acs", f"{exc}: reading it needs root on the host")
        except OSError as exc:
            r.note(f"pci.{b}.acs", f"cannot read its config space: {exc.strerror or exc}")
        out.append(BridgeFacts(bdf=b, gpus=tuple(under), has_acs=has_acs, acs_ctl=ctl))
    return tuple(out)
