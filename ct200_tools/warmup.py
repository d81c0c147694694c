"""Start the two slow driver initialisations before Python imports the rest of the doctor.

cuInit (~0.3 s on an H200) and nvmlInit (~0.2 s) dominate a check. Both need nothing from the
doctor's own modules, so the console entry starts them first; the probes then collect the
result. Stdlib only: importing anything heavier here would delay exactly what this saves.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

# Runs in `python -I -S` (no site, no user paths): ctypes only, prints one JSON line.
CUDA_CHILD = r"""
import ctypes, json, sys
out = {}
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as exc:
    print(json.dumps({"error": "libcuda.so.1 not found: " + str(exc)})); sys.exit(0)
code = cuda.cuInit(0)
out["code"] = code
name = ctypes.c_char_p()
if cuda.cuGetErrorName(code, ctypes.byref(name)) == 0 and name.value:
    out["name"] = name.value.decode()
v = ctypes.c_int()
if cuda.cuDriverGetVersion(ctypes.byref(v)) == 0:
    out["driver_version"] = v.value
if code == 0:
    n = ctypes.c_int()
    if cuda.cuDeviceGetCount(ctypes.byref(n)) == 0:
        out["device_count"] = n.value
print(json.dumps(out))
"""

_prestarted: tuple[subprocess.Popen[bytes], float] | None = None


def spawn_cuda_child(visible: str | None = None) -> tuple[subprocess.Popen[bytes], float]:
    """The child and its start time (the probe's timeout counts from here). `visible`, when
    given, is its CUDA_VISIBLE_DEVICES: a gate initialises CUDA on its server's GPUs only."""
    started = time.monotonic()
    env = os.environ.copy()
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", CUDA_CHILD],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    return proc, started


def take_cuda_child(visible: str | None = None) -> tuple[subprocess.Popen[bytes], float]:
    """The prestarted child if there is one (once) and it sees the GPUs asked for, else a new
    one (a prestarted child that sees every GPU is ended: a scoped run cannot use it)."""
    global _prestarted
    got, _prestarted = _prestarted, None
    if got is not None and visible is not None:
        got[0].kill()
        got[0].communicate()
        got = None
    return got or spawn_cuda_child(visible)


def _nvml_init() -> None:
    # NVML counts nvmlInit calls: the probe's own init and shutdown then cost almost nothing.
    # Errors are left for the probe to record; here they only mean nothing was gained.
    try:
        import pynvml  # noqa: PLC0415

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001, S110
        pass


def wants_probes(argv: Sequence[str]) -> bool:
    args = set(argv)
    return bool(args & {"check", "snapshot"}) and not args & {"--facts", "-h", "--help"}


def start(argv: Sequence[str]) -> None:
    global _prestarted  # noqa: PLW0603
    if _prestarted is None and wants_probes(argv):
        _prestarted = spawn_cuda_child()
        threading.Thread(target=_nvml_init, name="warmup-nvml", daemon=True).start()
