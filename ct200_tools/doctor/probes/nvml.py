"""GPUs, links and topology through NVML (nvidia-ml-py's `pynvml`).

The NVML module is a parameter so tests can pass a stand-in replaying calls recorded on a real
GPU; production imports pynvml. Each field that NVML refuses is recorded, never guessed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

from ct200_tools.doctor.probes.base import Reader
from ct200_tools.facts import GpuFacts, NvmlFacts, RemappedRows, TopoLink

T = TypeVar("T")

#: nvmlGpuTopologyLevel_t -> the letters of `nvidia-smi topo -m`.
TOPOLOGY_LETTERS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
#: nvmlGpuP2PStatus_t -> the letters of `nvidia-smi topo -p2p`.
P2P_LETTERS = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}
#: NVML_P2P_CAPS_INDEX_READ / _WRITE (pynvml's own READ constant is a tuple by a typo).
P2P_READ, P2P_WRITE = 0, 1
NVLINK_TYPE_SWITCH = 2
CPU_SET_WORDS = 16  # 16 x 64 bits: room for 1024 CPUs


def normalise_bus_id(bus_id: str | bytes) -> str:
    """NVML's "00000000:00:06.0" -> sysfs's "0000:00:06.0"."""
    text = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
    domain, _, rest = text.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}"


def cpus_from_mask(words: Any) -> tuple[int, ...]:
    return tuple(
        w * 64 + bit for w, word in enumerate(words) for bit in range(64) if int(word) >> bit & 1
    )


class _Field:
    """Read one optional NVML field; record why it could not be read."""

    def __init__(self, nvml: Any, r: Reader, prefix: str) -> None:
        self.nvml, self.r, self.prefix = nvml, r, prefix

    def __call__(self, what: str, fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except self.nvml.NVMLError as exc:
            self.r.note(f"{self.prefix}.{what}", str(exc))
        except AttributeError:
            self.r.note(f"{self.prefix}.{what}", "not in this nvidia-ml-py version")
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def probe_gpu(nvml: Any, r: Reader, index: int, handle: Any) -> GpuFacts:
    f = _Field(nvml, r, f"nvml.gpu{index}")
    ecc = f("ecc_mode", lambda: nvml.nvmlDeviceGetEccMode(handle))
    rows = f("remapped_rows", lambda: nvml.nvmlDeviceGetRemappedRows(handle))
    reasons = f("clocks_event_reasons", lambda: _clocks_event_reasons(nvml, handle))
    affinity = f("cpu_affinity", lambda: nvml.nvmlDeviceGetCpuAffinity(handle, CPU_SET_WORDS))
    memory = f("memory", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    persistence = f("persistence_mode", lambda: nvml.nvmlDeviceGetPersistenceMode(handle))
    pending = f(
        "retired_pages_pending", lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)
    )
    return GpuFacts(
        index=index,
        name=_text(nvml.nvmlDeviceGetName(handle)),
        pci_bus_id=normalise_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId),
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        memory_total_bytes=int(memory.total) if memory is not None else None,
        link_gen_current=f(
            "link_gen_current", lambda: nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)
        ),
        link_width_current=f(
            "link_width_current", lambda: nvml.nvmlDeviceGetCurrPcieLinkWidth(handle)
        ),
        link_gen_max=f("link_gen_max", lambda: nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)),
        link_width_max=f("link_width_max", lambda: nvml.nvmlDeviceGetMaxPcieLinkWidth(handle)),
        device_link_gen_max=f(
            "device_link_gen_max", lambda: nvml.nvmlDeviceGetGpuMaxPcieLinkGeneration(handle)
        ),
        persistence_mode=bool(persistence) if persistence is not None else None,
        ecc_mode_current=bool(ecc[0]) if ecc is not None else None,
        retired_pages_pending=bool(pending) if pending is not None else None,
        remapped_rows=RemappedRows(int(rows[0]), int(rows[1]), bool(rows[2]), bool(rows[3]))
        if rows is not None
        else None,
        clocks_event_reasons=int(reasons) if reasons is not None else None,
        cpu_affinity=cpus_from_mask(affinity) if affinity is not None else (),
    )


def _clocks_event_reasons(nvml: Any, handle: Any) -> int:
    fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if fn is None:  # nvidia-ml-py before 12.535 names it "throttle reasons"
        fn = nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return int(fn(handle))


def nvlink_peers(nvml: Any, handle: Any) -> tuple[dict[str, int], int]:
    """Active NVLinks of one GPU: direct links per peer bus id, and links to NVSwitches."""
    direct: dict[str, int] = {}
    switch = 0
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != 1:
                continue
            remote = normalise_bus_id(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
            kind = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
        except nvml.NVMLError:
            continue  # link index not present on this GPU, or NVLink not supported at all
        if kind == NVLINK_TYPE_SWITCH:
            switch += 1
        else:
            direct[remote] = direct.get(remote, 0) + 1
    return direct, switch


def _p2p(nvml: Any, f: _Field, what: str, h1: Any, h2: Any, index: int) -> str | None:
    status = f(what, lambda: nvml.nvmlDeviceGetP2PStatus(h1, h2, index))
    return P2P_LETTERS.get(status, f"?{status}") if status is not None else None


def probe_link(nvml: Any, r: Reader, a: int, b: int, ha: Any, hb: Any, nvlinks: int) -> TopoLink:
    f = _Field(nvml, r, f"nvml.link{a}-{b}")
    level = f("level", lambda: nvml.nvmlDeviceGetTopologyCommonAncestor(ha, hb))
    letter = TOPOLOGY_LETTERS.get(level, f"?{level}") if level is not None else None
    if nvlinks:  # nvidia-smi shows NV<n> over the PCIe letter when NVLink connects the pair
        letter = f"NV{nvlinks}"
    return TopoLink(
        a=a,
        b=b,
        level=letter,
        p2p_read=_p2p(nvml, f, "p2p_read", ha, hb, P2P_READ),
        p2p_write=_p2p(nvml, f, "p2p_write", ha, hb, P2P_WRITE),
    )


def probe_links(nvml: Any, r: Reader, gpus: list[GpuFacts], handles: list[Any]) -> list[TopoLink]:
    nv = [nvlink_peers(nvml, h) for h in handles]
    links = []
    for a in range(len(handles)):
        for b in range(a + 1, len(handles)):
            n = nv[a][0].get(gpus[b].pci_bus_id, 0) or min(nv[a][1], nv[b][1])
            links.append(probe_link(nvml, r, a, b, handles[a], handles[b], n))
    return links


def probe_nvml(r: Reader, nvml: Any = None) -> NvmlFacts | None:
    if nvml is None:
        try:
            import pynvml  # noqa: PLC0415 - optional at import time, needed only here
        except ImportError:
            r.note("nvml", "the nvidia-ml-py package is not installed (pip install nvidia-ml-py)")
            return None
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        r.note("nvml", f"nvmlInit failed: {exc}")
        return None
    try:
        f = _Field(nvml, r, "nvml")
        count = nvml.nvmlDeviceGetCount()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        gpus = [probe_gpu(nvml, r, i, h) for i, h in enumerate(handles)]
        return NvmlFacts(
            driver_version=f("driver_version", lambda: _text(nvml.nvmlSystemGetDriverVersion())),
            nvml_version=f("nvml_version", lambda: _text(nvml.nvmlSystemGetNVMLVersion())),
            cuda_driver_version=f("cuda_driver_version", nvml.nvmlSystemGetCudaDriverVersion),
            gpus=tuple(gpus),
            links=tuple(probe_links(nvml, r, gpus, handles)),
        )
    except nvml.NVMLError as exc:
        r.note("nvml", f"NVML query failed: {exc}")
        return None
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
