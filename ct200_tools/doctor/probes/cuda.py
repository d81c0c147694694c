"""CUDA initialised in child processes, with a timeout: a hung driver must not hang the doctor.

This is the check DCGM and gpud skip: nvidia-smi can work while cuInit fails (a container
whose cgroup denies /dev/nvidia-uvm), and only cuInit tells. Per-GPU mode (the default) runs one
child per GPU side by side, each with its own deadline, and records each GPU's result;
warmup.py says how the GPUs are listed and why.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ct200_tools.doctor.warmup import ALL, DEFAULT_MODE, PER_GPU, Child, Started, take
from ct200_tools.facts import CudaFacts, CudaGpuInit

#: The CUresult names the doctor explains, for facts recorded where cuGetErrorName failed.
CU_NAMES = {
    0: "CUDA_SUCCESS",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    34: "CUDA_ERROR_STUB_LIBRARY",
    46: "CUDA_ERROR_DEVICES_UNAVAILABLE",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    304: "CUDA_ERROR_OPERATING_SYSTEM",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
    999: "CUDA_ERROR_UNKNOWN",
}


class CudaChild:
    """Started first, joined last: the slowest probe runs alongside all the others."""

    def __init__(
        self,
        timeout_s: float,
        mode: str = DEFAULT_MODE,
        root: Path | None = None,
        gpus: Sequence[int] | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.started: Started = take(mode, str(root or "/"), gpus)

    def result(self) -> CudaFacts:
        s = self.started
        # Each child has its own deadline (its start + timeout); they started together, so
        # waiting for them in turn waits no longer than for the slowest.
        done = [(c, _wait(c, self.timeout_s)) for c in s.children]
        if s.mode != PER_GPU:
            ((_, d),) = done
            if d.timed_out:
                return CudaFacts(
                    timed_out=True,
                    duration_s=d.duration,
                    error=f"cuInit did not return within {self.timeout_s:g} s (driver hung?)",
                    mode=ALL,
                    note=s.note,
                )
            facts = parse_child_output(d.out, d.err, d.returncode, d.duration)
            return dataclasses.replace(facts, mode=ALL, note=s.note)
        parsed = [parse_gpu_output(c, d, self.timeout_s) for c, d in done]
        versions = [v for _, v in parsed if v is not None]
        return summarise(tuple(g for g, _ in parsed), versions[0] if versions else None, s.note)


@dataclass(frozen=True)
class Done:
    """What a child left: its output, exit status and wall time, or that it was cut off."""

    out: str
    err: str
    returncode: int
    duration: float
    timed_out: bool = False


def _wait(c: Child, timeout_s: float) -> Done:
    remaining = max(0.0, timeout_s - (time.monotonic() - c.started))
    try:
        out, err = c.proc.communicate(timeout=remaining)
    except subprocess.TimeoutExpired:
        c.proc.kill()
        c.proc.communicate()
        return Done("", "", -9, round(time.monotonic() - c.started, 3), timed_out=True)
    return Done(
        out.decode(errors="replace"),
        err.decode(errors="replace"),
        c.proc.returncode,
        round(time.monotonic() - c.started, 3),
    )


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _last_json(out: str) -> object:
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return None


def _tail(out: str, err: str) -> str:
    return (err.strip().splitlines() or out.strip().splitlines() or ["no output"])[-1]


def parse_child_output(out: str, err: str, returncode: int, duration: float) -> CudaFacts:
    """The all-GPU child's last stdout line; anything but our JSON object is reported, not
    trusted."""
    data = _last_json(out)
    if not isinstance(data, dict):
        return CudaFacts(
            duration_s=duration, error=f"cuInit child exited {returncode}: {_tail(out, err)}"
        )
    code = _int(data.get("code"))
    return CudaFacts(
        code=code,
        name=_str(data.get("name")) or (CU_NAMES.get(code) if code is not None else None),
        device_count=_int(data.get("device_count")),
        driver_version=_int(data.get("driver_version")),
        duration_s=duration,
        error=_str(data.get("error")),
    )


def normal_bus(bus: str | None) -> str | None:
    """CUDA's "0000:61:00.0" (upper-case hex) in sysfs form: lower case, 4-digit domain."""
    if not bus:
        return None
    domain, sep, rest = bus.strip().partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest.lower()}" if sep else bus.lower()
    except ValueError:
        return bus.lower()


def parse_gpu_output(c: Child, d: Done, timeout_s: float) -> tuple[CudaGpuInit, int | None]:
    """One per-GPU child's result (and the driver's CUDA version it read): its JSON line, or
    why there is none."""
    base = CudaGpuInit(index=c.index, visible=c.visible, pci_bus_id=c.bus, duration_s=d.duration)
    if d.timed_out:
        why = f"CUDA did not finish within {timeout_s:g} s (driver hung?)"
        return dataclasses.replace(base, timed_out=True, error=why), None
    data = _last_json(d.out)
    if not isinstance(data, dict):
        why = f"CUDA child exited {d.returncode}: {_tail(d.out, d.err)}"
        return dataclasses.replace(base, error=why), None
    code = _int(data.get("code"))
    cuda_bus = normal_bus(_str(data.get("cuda_bus_id")))
    got = dataclasses.replace(
        base,
        visible=_str(data.get("visible")) or c.visible,
        pci_bus_id=c.bus or cuda_bus,
        minor=_int(data.get("minor")),
        cuda_bus_id=cuda_bus,
        code=code,
        name=_str(data.get("name")) or (CU_NAMES.get(code) if code is not None else None),
        step=_str(data.get("step")),
        cuinit_s=_float(data.get("cuinit_s")),
        context_s=_float(data.get("context_s")),
        error=_str(data.get("error")),
    )
    return got, _int(data.get("driver_version"))


def summarise(
    gpus: tuple[CudaGpuInit, ...], driver_version: int | None = None, note: str | None = None
) -> CudaFacts:
    """Per-GPU results summed up in the fields an all-GPU run fills (see CudaFacts)."""
    failing = [g for g in gpus if not g.ok]
    first = failing[0] if failing else None
    durations = [g.duration_s for g in gpus if g.duration_s is not None]
    return CudaFacts(
        code=0 if first is None else first.code,
        name="CUDA_SUCCESS" if first is None else first.name,
        device_count=(len(gpus) - len(failing)) or None,
        driver_version=driver_version,
        duration_s=max(durations) if durations else None,
        timed_out=bool(gpus) and all(g.timed_out for g in gpus),
        error=f"{first.label}: {first.error}" if first and first.code is None else None,
        mode=PER_GPU,
        gpus=gpus,
        note=note,
    )
