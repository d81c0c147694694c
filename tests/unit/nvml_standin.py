"""A stand-in for the `pynvml` module (nvidia-ml-py) that replays what NVML answered on the H200.

This is not a model of NVML. Every value `H200` returns was recorded on the real H200 machine:
tests/fixtures/facts/h200-healthy.json (what the doctor read through the real pynvml), cross-checked
against tests/fixtures/raw/h200/nvidia-smi-q.xml (product name, bus id, PCIe gen 5 x16, ECC and
persistence enabled, remapped rows 0/0/No/No, clocks event reason "gpu_idle" only = 0x1, 143771 MiB,
retired pages "N/A", no NVLink section). The XML and capture-raw.txt come from another lease of
the same machine type (UUID GPU-05d4bf58-...); the UUID here is the one in the facts fixture.

Refusals are replayed as NVML gave them: the retired-pages query is NOT_SUPPORTED on that H200
(the fixture records "Not Supported"), NVLink state is NOT_SUPPORTED (PCIe card, no NVLink), and
a machine without the driver fails nvmlInit with LIBRARY_NOT_FOUND (nodriver-vm.json).

Anything that was not recorded (a second GPU, a topology level between two GPUs) is built with
the helpers at the bottom, which say so; tests that use them mark their inputs as derived.
The function names and signatures are pynvml's; test_probe_nvml checks them against the real module.
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

# nvmlReturn_t values and pynvml's own strings for them (NVMLError._errcode_to_string).
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
_ERROR_TEXT = {
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
}
#: nvidia-ml-py 13.x (the H200 ran 13.610.43): how many link indices the probe walks.
NVML_NVLINK_MAX_LINKS = 36
NVML_FEATURE_ENABLED = 1
#: nvidia-smi -q: clocks_event_reason_gpu_idle "Active", every other reason "Not Active".
NVML_CLOCKS_EVENT_REASON_GPU_IDLE = 0x1
#: nvmlClockType_t NVML_CLOCK_SM / NVML_CLOCK_MEM and nvmlTemperatureSensors_t NVML_TEMPERATURE_GPU.
NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0


class NVMLError(Exception):
    """pynvml.NVMLError: carries the nvmlReturn_t; str() is pynvml's text for it."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _ERROR_TEXT.get(self.value, f"NVML Error with code {self.value}")


@dataclass(frozen=True)
class RecordedGpu:
    """What NVML answered for one GPU."""

    name: str
    bus_id: str  # NVML's form, 8-digit domain, upper case hex as nvidia-smi prints it
    pci_device_id: int
    uuid: str
    memory_total: int
    link_gen_current: int
    link_width_current: int
    link_gen_max: int
    link_width_max: int
    device_link_gen_max: int
    persistence_mode: int
    ecc_mode: tuple[int, int]  # (current, pending)
    remapped_rows: tuple[int, int, int, int]  # (correctable, uncorrectable, pending, failure)
    clocks_event_reasons: int
    cpu_affinity_words: tuple[int, ...]  # 64-bit words, CPU n = bit n % 64 of word n // 64
    #: None: the call raises NVMLError(NOT_SUPPORTED), as recorded.
    retired_pages_pending: int | None
    #: Clocks, temperature and power as nvidia-smi -q read them on the same machine type
    #: (tests/fixtures/raw/h200/nvidia-smi-q.xml: sm_clock 345 MHz, mem_clock 3201 MHz at idle,
    #: gpu_temp 33 C, average_power_draw 80.46 W: NVML's power usage is that 1 s average on
    #: Hopper, in milliwatts).
    sm_clock_mhz: int = 345
    mem_clock_mhz: int = 3201
    temperature_c: int = 33
    power_mw: int = 80460


#: GPU 0 of the H200 machine, as recorded.
H200_GPU = RecordedGpu(
    name="NVIDIA H200",
    bus_id="00000000:00:06.0",
    pci_device_id=0x233510DE,
    uuid="GPU-e9673eb8-8617-9ef6-bcd9-7ef72efe3c28",
    memory_total=143771 * 1024 * 1024,  # 150754820096 bytes; nvidia-smi: 143771 MiB
    link_gen_current=5,
    link_width_current=16,
    link_gen_max=5,
    link_width_max=16,
    device_link_gen_max=5,
    persistence_mode=1,
    ecc_mode=(1, 1),
    remapped_rows=(0, 0, 0, 0),
    clocks_event_reasons=NVML_CLOCKS_EVENT_REASON_GPU_IDLE,
    cpu_affinity_words=(0xFFFF,),  # CPUs 0-15 (nvidia-smi topo -m: CPU Affinity 0-15)
    retired_pages_pending=None,
)


@dataclass(frozen=True)
class _Handle:
    index: int


@dataclass
class NvmlStandin:
    """Use an instance where probe_nvml expects the pynvml module."""

    gpus: tuple[RecordedGpu, ...] = (H200_GPU,)
    driver_version: str = "580.159.04"
    lib_version: str = "13.580.159.04"  # nvmlSystemGetNVMLVersion
    cuda_driver_version: int = 13000
    #: nvmlInit raises NVMLError(init_error) when set.
    init_error: int | None = None
    #: {(a, b): nvmlGpuTopologyLevel_t}; a pair not listed raises NOT_SUPPORTED.
    topology: dict[tuple[int, int], int] = field(default_factory=dict)
    #: {(a, b, p2p caps index): nvmlGpuP2PStatus_t}; a pair not listed raises NOT_SUPPORTED.
    p2p: dict[tuple[int, int, int], int] = field(default_factory=dict)
    #: pynvml function names this nvidia-ml-py version does not have (AttributeError).
    missing: frozenset[str] = frozenset()
    #: {function name: nvmlReturn_t} to raise from that function instead of answering.
    failing: dict[str, int] = field(default_factory=dict)
    #: Every pynvml function called, in order, for assertions on init/shutdown pairing.
    calls: list[str] = field(default_factory=list)

    NVMLError = NVMLError
    NVML_NVLINK_MAX_LINKS = NVML_NVLINK_MAX_LINKS

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml"):
            if name in object.__getattribute__(self, "missing"):
                raise AttributeError(f"module 'pynvml' has no attribute {name!r}")
            object.__getattribute__(self, "calls").append(name)
            code = object.__getattribute__(self, "failing").get(name)
            if code is not None:
                return _raiser(code)
        return object.__getattribute__(self, name)

    # -- system ---------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        return self.lib_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda_driver_version

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if not 0 <= index < len(self.gpus):
            raise NVMLError(2)  # NVML_ERROR_INVALID_ARGUMENT
        return _Handle(index)

    # -- one GPU ----------------------------------------------------------------------------
    def _gpu(self, handle: _Handle) -> RecordedGpu:
        return self.gpus[handle.index]

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self._gpu(handle).name

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return self._gpu(handle).uuid

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> SimpleNamespace:
        g = self._gpu(handle)
        return SimpleNamespace(busId=g.bus_id, pciDeviceId=g.pci_device_id)

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle) -> SimpleNamespace:
        return SimpleNamespace(total=self._gpu(handle).memory_total)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: _Handle) -> int:
        return self._gpu(handle).link_gen_current

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: _Handle) -> int:
        return self._gpu(handle).link_width_current

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: _Handle) -> int:
        return self._gpu(handle).link_gen_max

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: _Handle) -> int:
        return self._gpu(handle).link_width_max

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, handle: _Handle) -> int:
        return self._gpu(handle).device_link_gen_max

    def nvmlDeviceGetPersistenceMode(self, handle: _Handle) -> int:
        return self._gpu(handle).persistence_mode

    def nvmlDeviceGetEccMode(self, handle: _Handle) -> list[int]:
        return list(self._gpu(handle).ecc_mode)

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:
        return self._gpu(handle).remapped_rows

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: _Handle) -> int:
        value = self._gpu(handle).retired_pages_pending
        if value is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        return self._gpu(handle).clocks_event_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: _Handle) -> int:
        return self._gpu(handle).clocks_event_reasons

    def nvmlDeviceGetClockInfo(self, handle: _Handle, clock_type: int) -> int:
        gpu = self._gpu(handle)
        clocks = {NVML_CLOCK_SM: gpu.sm_clock_mhz, NVML_CLOCK_MEM: gpu.mem_clock_mhz}
        if clock_type not in clocks:
            raise NVMLError(2)  # NVML_ERROR_INVALID_ARGUMENT: only these two were recorded
        return clocks[clock_type]

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(2)
        return self._gpu(handle).temperature_c

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        return self._gpu(handle).power_mw

    def nvmlDeviceGetCpuAffinity(self, handle: _Handle, cpu_set_size: int) -> Any:
        # pynvml returns the ctypes array itself.
        words = self._gpu(handle).cpu_affinity_words[:cpu_set_size]
        return (ctypes.c_ulonglong * cpu_set_size)(*words)

    # -- NVLink and topology --------------------------------------------------------------
    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: _Handle, link: int) -> SimpleNamespace:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: _Handle, link: int) -> int:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetTopologyCommonAncestor(self, h1: _Handle, h2: _Handle) -> int:
        level = self.topology.get(_pair(h1, h2))
        if level is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return level

    def nvmlDeviceGetP2PStatus(self, h1: _Handle, h2: _Handle, index: int) -> int:
        status = self.p2p.get((*_pair(h1, h2), index))
        if status is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return status


def _pair(h1: _Handle, h2: _Handle) -> tuple[int, int]:
    return (min(h1.index, h2.index), max(h1.index, h2.index))


def _raiser(code: int) -> Callable[..., Any]:
    def fail(*_args: Any) -> Any:
        raise NVMLError(code)

    return fail


def api_names() -> list[str]:
    """The pynvml functions the stand-in provides (checked against the real module)."""
    return sorted(n for n, v in vars(NvmlStandin).items() if n.startswith("nvml") and callable(v))


# -- as recorded ------------------------------------------------------------------------------
def h200() -> NvmlStandin:
    """The H200 machine as recorded (h200-healthy.json)."""
    return NvmlStandin()


def no_driver() -> NvmlStandin:
    """The driverless VM as recorded (nodriver-vm.json): nvmlInit cannot load libnvidia-ml."""
    return NvmlStandin(gpus=(), init_error=NVML_ERROR_LIBRARY_NOT_FOUND)


# -- derived: NOT recorded --------------------------------------------------------------------
def derived_gpu(index: int, bus_id: str, base: RecordedGpu = H200_GPU) -> RecordedGpu:
    """DERIVED: the recorded H200 at another bus address with another UUID (only one GPU was
    recorded)."""
    return dataclasses.replace(base, bus_id=bus_id, uuid=f"{base.uuid[:-2]}{index:02x}")


def derived_pair(
    level: int, p2p_read: int, p2p_write: int, gpus: Iterable[RecordedGpu] | None = None
) -> NvmlStandin:
    """DERIVED: two GPUs with the given topology level and P2P statuses between them."""
    pair = tuple(gpus) if gpus is not None else (H200_GPU, derived_gpu(1, "00000000:00:07.0"))
    return NvmlStandin(
        gpus=pair,
        topology={(0, 1): level},
        p2p={(0, 1, 0): p2p_read, (0, 1, 1): p2p_write},
    )
