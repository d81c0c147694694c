"""GPU telemetry around each point: clocks, temperature, power and clock-event reasons by NVML.

Read through the same pynvml module and helpers as the doctor's NVML probe (probes/nvml.py), before
and after every point, for the GPUs of the server under test. Without nvidia-ml-py, without a
driver, or where NVML refuses a field, the sample says so (`available: false` and the reason, or
the field null with its reason): never a made-up value. Throttling (a thermal, power or hardware
slowdown reason active in either sample) is flagged on the point.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, TypeVar

from ct200_tools.doctor.checks.gpu import SLOWDOWN_REASONS
from ct200_tools.doctor.probes.nvml import _clocks_event_reasons, _text

T = TypeVar("T")

#: nvmlClockType_t and nvmlTemperatureSensors_t (stable values of NVML's API).
NVML_CLOCK_SM: Final = 1
NVML_CLOCK_MEM: Final = 2
NVML_TEMPERATURE_GPU: Final = 0
#: nvmlClocksEventReason bits that throttle a point: the doctor's slowdown bits (heat, a hardware
#: slowdown, the power brake), which a healthy GPU does not show under load.
THROTTLE_REASONS: Final = dict(SLOWDOWN_REASONS)
#: The software power cap: the driver holding the board at its power limit. Recorded apart: a
#: busy H200 sits at its 700 W limit in every point (docs/benchmarks.md, the real NVML run), so
#: counting it as throttling would flag every point, and a flag on everything flags nothing.
SW_POWER_CAP: Final = 0x4
#: Every bit nvidia-smi names, for the record (idle and application clocks are no throttling).
REASON_NAMES: Final = {
    0x1: "GPU idle",
    0x2: "applications clocks setting",
    0x10: "sync boost",
    0x100: "display clocks setting",
    SW_POWER_CAP: "SW power cap",
    **THROTTLE_REASONS,
}


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in sorted(REASON_NAMES.items()) if mask & bit]


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in sorted(THROTTLE_REASONS.items()) if mask & bit]


def _load_nvml() -> tuple[Any, str | None]:
    try:
        import pynvml  # noqa: PLC0415 - optional: only a GPU machine has it
    except ImportError:
        return None, "the nvidia-ml-py package is not installed (pip install nvidia-ml-py)"
    return pynvml, None


class Telemetry:
    """Samples the GPUs `gpus` (nvidia-smi indices); `nvml` is the pynvml module (a stand-in in
    tests). NVML is initialised once and shut down by close()."""

    def __init__(self, gpus: Sequence[int], nvml: Any = None) -> None:
        self.gpus = tuple(gpus)
        self.reason: str | None = None
        if nvml is None:
            nvml, self.reason = _load_nvml()
        self.nvml = nvml
        self.ready = False
        if self.nvml is not None and self.reason is None and self.gpus:
            try:
                self.nvml.nvmlInit()
                self.ready = True
            except self.nvml.NVMLError as exc:
                self.reason = f"nvmlInit failed: {exc}"
        elif not self.gpus and self.reason is None:
            self.reason = "the server has no GPUs"

    def close(self) -> None:
        if self.ready:
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlShutdown()
            self.ready = False

    def sample(self) -> dict[str, object]:
        if not self.ready:
            return {"available": False, "reason": self.reason or "NVML is shut down"}
        out = []
        for index in self.gpus:
            try:
                handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
            except self.nvml.NVMLError as exc:
                out.append({"index": index, "error": f"no handle for GPU {index}: {exc}"})
                continue
            out.append(self._gpu(index, handle))
        return {"available": True, "gpus": out}

    def _gpu(self, index: int, handle: Any) -> dict[str, object]:
        nvml = self.nvml
        unread: dict[str, str] = {}

        def field(what: str, fn: Callable[[], T]) -> T | None:
            try:
                return fn()
            except nvml.NVMLError as exc:
                unread[what] = str(exc)
            except AttributeError:
                unread[what] = "not in this nvidia-ml-py version"
            return None

        name = field("name", lambda: _text(nvml.nvmlDeviceGetName(handle)))
        sm = field("sm_clock_mhz", lambda: int(nvml.nvmlDeviceGetClockInfo(handle, NVML_CLOCK_SM)))
        mem = field(
            "mem_clock_mhz", lambda: int(nvml.nvmlDeviceGetClockInfo(handle, NVML_CLOCK_MEM))
        )
        temp = field(
            "temperature_c",
            lambda: int(nvml.nvmlDeviceGetTemperature(handle, NVML_TEMPERATURE_GPU)),
        )
        power = field("power_w", lambda: int(nvml.nvmlDeviceGetPowerUsage(handle)) / 1000)
        mask = field("clocks_event_reasons", lambda: _clocks_event_reasons(nvml, handle))
        sample: dict[str, object] = {
            "index": index,
            "name": name,
            "sm_clock_mhz": sm,
            "mem_clock_mhz": mem,
            "temperature_c": temp,
            "power_w": power,
            "clocks_event_reasons": mask,
            "reasons": reason_names(mask) if mask is not None else None,
            "throttle": throttle_names(mask) if mask is not None else None,
        }
        if unread:
            sample["unread"] = unread
        return sample


def _gpus(samples: tuple[dict[str, object], ...]) -> Iterator[dict[str, Any]]:
    """Each GPU's entry of each sample that was read (an unavailable sample has none)."""
    for s in samples:
        gpus = s.get("gpus") if s.get("available") else None
        yield from gpus if isinstance(gpus, list) else []


def throttled(*samples: dict[str, object]) -> list[str]:
    """'GPU<n>: <reason>' for each throttle reason active in any of the samples, once each."""
    found: list[str] = []
    for g in _gpus(samples):
        for reason in g.get("throttle") or []:
            line = f"GPU{g.get('index')}: {reason}"
            if line not in found:
                found.append(line)
    return found


def power_capped(*samples: dict[str, object]) -> list[str]:
    """'GPU<n>' for each GPU at its software power cap in any of the samples, once each."""
    found: list[str] = []
    for g in _gpus(samples):
        mask = g.get("clocks_event_reasons")
        line = f"GPU{g.get('index')}"
        if isinstance(mask, int) and mask & SW_POWER_CAP and line not in found:
            found.append(line)
    return found


def around(before: dict[str, object], after: dict[str, object]) -> dict[str, object]:
    """A point's `gpu` field."""
    return {
        "before": before,
        "after": after,
        "throttled": throttled(before, after),
        "power_capped": power_capped(before, after),
    }
