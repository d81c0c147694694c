"""llama.cpp's llama-server built with CUDA on the GPU machine, from the carried source.

The source is the llama.cpp tree vendored in the llama-cpp-python sdist the testbed builds for
the CPU (testbed/llama_build.py pins its version and sha256; tests/gpu/carry_llama.sh packs it).
The flags are the testbed's, plus CUDA for this GPU's architecture. The binary is cached under
/tmp by the source's hash and the flags, built in a partial directory and renamed when whole.

A build takes about 4.5 min of a 10-minute device call, and the machine rarely outlives the
call: `export()` writes the binary into $OUT as xz parts; joined here into
.gpu-carry/llama-cuda/llama-cuda.tar.xz and carried (`carry: [".gpu-carry/wheels",
".gpu-carry/llama-cuda"]`, under the 64 MiB limit without the source), a later call unpacks it
instead of building, when its key (source, flags, GPU arch) is this machine's.
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
from tests.gpu.carried import CARRY, LLAMA_SOURCE

CACHE = Path("/tmp/ct200-llama-cuda")
#: A binary built by an earlier call and carried back (see export()).
CARRIED = CARRY / "llama-cuda" / "llama-cuda.tar.xz"
#: The source's sha256 (part of the build's key), carried with the binary.
SOURCE_SHA256 = CARRIED.with_name("llama-src.sha256")
BUILD_TIMEOUT_S = 1800
#: Under the device tool's 16 MiB a file back from $OUT.
PART_BYTES = 15 * 1024 * 1024


def cuda_flags(arch: str) -> tuple[str, ...]:
    # The static C++ runtime flag of the CPU build is kept: the binary needs only glibc and the
    # CUDA libraries of the driver and toolkit.
    return (*COMMON_FLAGS, "-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={arch}")


def compute_arch() -> str:
    """This GPU's compute capability as CMake's architecture number (9.0 -> 90)."""
    return nvsmi.query("gpu", ["compute_cap"])[0]["compute_cap"].replace(".", "")


def missing() -> str | None:
    if not LLAMA_SOURCE.is_file() and not (CARRIED.is_file() and SOURCE_SHA256.is_file()):
        return f"{LLAMA_SOURCE} is missing: run bash tests/gpu/carry_llama.sh, carry .gpu-carry"
    tools = [t for t in ("cmake", "ninja", "nvcc", "c++") if shutil.which(t) is None]
    if "nvcc" in tools and Path("/usr/local/cuda/bin/nvcc").exists():
        os.environ["PATH"] = f"/usr/local/cuda/bin:{os.environ.get('PATH', '')}"
        tools.remove("nvcc")
    return f"cannot build llama-server with CUDA: missing {', '.join(tools)}" if tools else None


def source_sha256() -> str:
    """The carried source's sha256, from the file beside it when the source itself stayed here
    (a call that carries a built binary instead)."""
    if LLAMA_SOURCE.is_file():
        return hashlib.sha256(LLAMA_SOURCE.read_bytes()).hexdigest()
    return SOURCE_SHA256.read_text().split()[0]


def ensure() -> tuple[Path, float]:
    """The binary, and the seconds its build took (0 when it was cached)."""
    flags = cuda_flags(compute_arch())
    digest = hashlib.sha256(source_sha256().encode())
    digest.update("\0".join(flags).encode())
    done = CACHE / digest.hexdigest()[:16]
    binary = done / TARGET
    if binary.is_file():
        return binary, 0.0
    CACHE.mkdir(parents=True, exist_ok=True)
    if CARRIED.is_file():
        with tarfile.open(CARRIED) as tar:
            if f"{done.name}/{TARGET}" in tar.getnames():
                work = Path(tempfile.mkdtemp(prefix=".partial-", dir=CACHE))
                tar.extractall(work, filter="data")
                (work / done.name).rename(done)  # whole, or not there at all
                work.rmdir()
                return binary, 0.0
        print(f"{CARRIED} holds another build than {done.name}: building", flush=True)
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


def export(binary: Path, out: Path) -> list[Path]:
    """The binary as `llama-cuda.tar.xz.NN` parts under out, each under the device tool's limit.

    Back here: `cat FILES_AT/llama-cuda.tar.xz.* | tar -xJ -C .gpu-carry/llama-cuda`.
    """
    packed = out / "llama-cuda.tar.xz"
    with tarfile.open(packed, "w:xz", preset=1) as tar:
        tar.add(binary, arcname=f"{binary.parent.name}/{TARGET}")
    parts = []
    with packed.open("rb") as fh:
        for n, chunk in enumerate(iter(lambda: fh.read(PART_BYTES), b"")):
            part = out / f"llama-cuda.tar.xz.{n:02d}"
            part.write_bytes(chunk)
            parts.append(part)
    packed.unlink()
    return parts


def prepare(out: Path | None = None) -> Path:
    """A GPU runner's setup (benchmarks/bench_client/device.py, benchmarks/day/gpu.py): this
    checkout on the children's PYTHONPATH, the binary (built, or unpacked from a carried build;
    a fresh build is also exported into `out`, for the next call to carry), or SystemExit with
    what is missing."""
    root = str(Path(__file__).resolve().parents[2])
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH", "")) if p
    )
    reason = missing()
    if reason:
        raise SystemExit(reason)
    binary, build_s = ensure()
    print(f"llama-server: {binary} (build {build_s:.0f} s)", flush=True)
    if build_s and out is not None:
        print(f"binary parts: {[p.name for p in export(binary, out)]}", flush=True)
    return binary
