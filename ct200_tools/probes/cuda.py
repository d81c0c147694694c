"""cuInit(0) in a child process, with a timeout: a hung driver must not hang the doctor.

This is the check DCGM and gpud skip: nvidia-smi can work while cuInit fails (a container
whose cgroup denies /dev/nvidia-uvm), and only cuInit tells.
"""

from __future__ import annotations

import json
import subprocess
import time

from ct200_tools.facts import CudaFacts
from ct200_tools.warmup import take_cuda_child

#: The CUresult names the doctor explains, for facts recorded where cuGetErrorName failed.
CU_NAMES = {
    0: "CUDA_SUCCESS",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    34: "CUDA_ERROR_STUB_LIBRARY",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    304: "CUDA_ERROR_OPERATING_SYSTEM",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
    999: "CUDA_ERROR_UNKNOWN",
}


class CudaChild:
    """Started first, joined last: the slowest probe runs alongside all the others."""

    def __init__(self, timeout_s: float, visible: str | None = None) -> None:
        self.timeout_s = timeout_s
        # visible: CUDA_VISIBLE_DEVICES for the child (a run scoped to one server's GPUs).
        self.proc, self.started = take_cuda_child(visible)

    def result(self) -> CudaFacts:
        remaining = max(0.0, self.timeout_s - (time.monotonic() - self.started))
        try:
            out, err = self.proc.communicate(timeout=remaining)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return CudaFacts(
                timed_out=True,
                duration_s=round(time.monotonic() - self.started, 3),
                error=f"cuInit did not return within {self.timeout_s:g} s (driver hung?)",
            )
        duration = round(time.monotonic() - self.started, 3)
        return parse_child_output(
            out.decode(errors="replace"),
            err.decode(errors="replace"),
            self.proc.returncode,
            duration,
        )


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def parse_child_output(out: str, err: str, returncode: int, duration: float) -> CudaFacts:
    """The child's last stdout line; anything but our JSON object is reported, not trusted."""
    try:
        data = json.loads(out.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        data = None
    if not isinstance(data, dict):
        tail = (err.strip().splitlines() or out.strip().splitlines() or ["no output"])[-1]
        return CudaFacts(duration_s=duration, error=f"cuInit child exited {returncode}: {tail}")
    code = _int(data.get("code"))
    return CudaFacts(
        code=code,
        name=_str(data.get("name")) or (CU_NAMES.get(code) if code is not None else None),
        device_count=_int(data.get("device_count")),
        driver_version=_int(data.get("driver_version")),
        duration_s=duration,
        error=_str(data.get("error")),
    )
