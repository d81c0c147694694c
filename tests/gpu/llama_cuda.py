"""llama.cpp's llama-server built with CUDA on the GPU machine, from the carried source.

The source is the llama.cpp tree vendored in the llama-cpp-python sdist the testbed builds for
the CPU (testbed/llama_build.py pins its version and sha256; tests/gpu/carry_llama.sh packs it).
The flags are the testbed's, plus CUDA for this GPU's architecture. The binary is cached under
/tmp by the source's hash and the flags, built in a partial directory and renamed when whole.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from testbed.llama_build import COMMON_FLAGS, TARGET
from tests.gpu import nvsmi
from tests.gpu.carried import LLAMA_SOURCE

CACHE = Path("/tmp/ct200-llama-cuda")
BUILD_TIMEOUT_S = 1800


def cuda_flags(arch: str) -> tuple[str, ...]:
    # The static C++ runtime flag of the CPU build is kept: the binary needs only glibc and the
    # CUDA libraries of the driver and toolkit.
    return (*COMMON_FLAGS, "-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={arch}")


def compute_arch() -> str:
    """This GPU's compute capability as CMake's architecture number (9.0 -> 90)."""
    return nvsmi.query("gpu", ["compute_cap"])[0]["compute_cap"].replace(".", "")


def missing() -> str | None:
    if not LLAMA_SOURCE.is_file():
        return f"{LLAMA_SOURCE} is missing: run bash tests/gpu/carry_llama.sh, carry .gpu-carry"
    tools = [t for t in ("cmake", "ninja", "nvcc", "c++") if shutil.which(t) is None]
    if "nvcc" in tools and Path("/usr/local/cuda/bin/nvcc").exists():
        os.environ["PATH"] = f"/usr/local/cuda/bin:{os.environ.get('PATH', '')}"
        tools.remove("nvcc")
    return f"cannot build llama-server with CUDA: missing {', '.join(tools)}" if tools else None


def ensure() -> tuple[Path, float]:
    """The binary, and the seconds its build took (0 when it was cached)."""
    flags = cuda_flags(compute_arch())
    digest = hashlib.sha256(LLAMA_SOURCE.read_bytes())
    digest.update("\0".join(flags).encode())
    done = CACHE / digest.hexdigest()[:16]
    binary = done / TARGET
    if binary.is_file():
        return binary, 0.0
    CACHE.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".partial-", dir=CACHE))
    t0 = time.monotonic()
    try:
        with tarfile.open(LLAMA_SOURCE) as tar:
            tar.extractall(work, filter="data")
        build = work / "build"
        log = CACHE / f"{done.name}.log"
        with log.open("w") as fh:
            for argv in (
                ["cmake", "-G", "Ninja", "-S", str(work / "llama.cpp"), "-B", str(build), *flags],
                ["cmake", "--build", str(build), "--target", TARGET, "-j", str(os.cpu_count())],
            ):
                proc = subprocess.run(
                    argv, stdout=fh, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S, check=False
                )
                if proc.returncode != 0:
                    tail = log.read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"{' '.join(argv[:3])} failed; log {log}:\n{tail}")
        out = work / "done"
        out.mkdir()
        shutil.copy2(build / "bin" / TARGET, out / TARGET)
        out.rename(done)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return binary, time.monotonic() - t0
