"""Build llama.cpp's ``llama-server`` once per machine, from the llama-cpp-python sdist.

The testbed's stand-in for SGLang (issue 11) is llama.cpp's OpenAI-compatible server on the CPU.
The sdist vendors a pinned llama.cpp tree, so the build is reproducible from PyPI alone, checked by
its sha256. The binary lands in a cache outside the clone, keyed by version and build flags, so a
second test run (another clone, another CI job) on the same machine skips the build
(about 6 minutes on 2 cores).

A build runs in a ``.partial-*`` directory under an exclusive lock and its result is renamed into
place when complete: a concurrent run waits for the lock and then finds the binary, and a killed
build leaves nothing that looks finished. Dev-only: stdlib, no import of the shipped package.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: The llama-cpp-python release whose vendored llama.cpp we build, and its sdist's sha256 (PyPI).
VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_ROOT = f"llama_cpp_python-{VERSION}"
VENDORED = "vendor/llama.cpp"
TARGET = "llama-server"

#: Every llama-server build's flags (the GPU machine's CUDA build too: tests/gpu/llama_cuda.py).
COMMON_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    # llama and ggml inside the binary, so it runs in the testbed's rootfs without our .so files.
    "-DBUILD_SHARED_LIBS=OFF",
    # The C++ runtime inside too: the binary then needs only glibc (libc, libm) where it runs.
    "-DCMAKE_EXE_LINKER_FLAGS=-static-libstdc++ -static-libgcc",
    # A native build uses this CPU's newest instructions and dies of SIGILL on another CPU.
    "-DGGML_NATIVE=OFF",
    # libgomp is not in the testbed's rootfs; ggml's own thread pool serves the CPU backend.
    "-DGGML_OPENMP=OFF",
    # No downloads at build or run time: no HTTPS client (model download; OpenSSL in this tree,
    # libcurl in older ones: LLAMA_CURL is ignored here, kept for a version change) and no
    # prebuilt web UI, which the build would otherwise fetch and fail on offline.
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)
#: The testbed's: -O1, not Release's -O3. Its models are tiny, and this build is the longest wait
#: of a first run and of CI (cold caches). Measured on the GPU machine's 16 cores, llama-server
#: alone: 538 CPU-s at -O1 against 782 at -O3 (0.69x); -O0 saves little more (476) for a far
#: slower binary.
CMAKE_FLAGS = (
    *COMMON_FLAGS,
    "-DCMAKE_C_FLAGS_RELEASE=-O1 -DNDEBUG",
    "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG",
)

#: What the build runs, and the Debian package that brings each (scripts/setup.sh installs them).
BUILD_TOOLS = {"cmake": "cmake", "c++": "g++", "make": "make"}
DEFAULT_CACHE = Path("/var/cache/ct200-testbed")
#: A cold build on a 2-core machine took 376 s at -O1 (11.6 CPU-minutes); this is the limit,
#: not the estimate.
BUILD_TIMEOUT_S = 3600
#: While a build step runs, a line this often says how far it is (cmake's own [ NN%]), so a
#: cold build is never minutes of silence.
PROGRESS_EVERY_S = 30.0
#: cmake's progress in the build's output: "[ 42%] Building CXX object ...".
_PERCENT = re.compile(rb"^\[\s*(\d+)%\]", re.MULTILINE)
_BUILT = "build.json"


class BuildError(Exception):
    """The server cannot be built here; ``fix`` says what to do about it."""

    def __init__(self, what: str, fix: str = "", log: Path | None = None) -> None:
        self.what = what
        self.fix = fix
        self.log = log
        super().__init__(what)

    def __str__(self) -> str:
        lines = [self.what]
        if self.log is not None:
            lines.append(f"  log: {self.log}")
        if self.fix:
            lines.append(f"  fix: {self.fix}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Built:
    binary: Path
    #: Seconds this call spent building; 0.0 when the cache had it.
    build_s: float


def cache_root(env: dict[str, str] | None = None) -> Path:
    """Beside the testbed's rootfs cache (same variable), so one setting moves both."""
    env = dict(os.environ) if env is None else env
    return Path(env.get("CT200_TESTBED_CACHE", str(DEFAULT_CACHE))) / "llama-server"


def build_key() -> str:
    recipe = {
        "version": VERSION,
        "sha256": SDIST_SHA256,
        "flags": CMAKE_FLAGS,
        "target": TARGET,
        "arch": platform.machine(),
    }
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    return f"{VERSION}-{digest}"


def binary_path(root: Path | None = None) -> Path:
    return (cache_root() if root is None else root) / build_key() / TARGET


def cached(root: Path | None = None) -> Path | None:
    """The built binary, or None; a directory without its build record is not a finished one."""
    binary = binary_path(root)
    if binary.is_file() and (binary.parent / _BUILT).is_file():
        return binary
    return None


def missing_tools() -> dict[str, str]:
    return {tool: pkg for tool, pkg in BUILD_TOOLS.items() if shutil.which(tool) is None}


@contextlib.contextmanager
def _lock(root: Path) -> Iterator[None]:
    with (root / f".{build_key()}.lock").open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("llama-server: another run is building it; waiting for that build", flush=True)
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def ensure(root: Path | None = None, jobs: int | None = None) -> Built:
    """The cached binary, built first when missing (concurrent callers build it once)."""
    root = cache_root() if root is None else root
    found = cached(root)
    if found is not None:
        return Built(found, 0.0)
    missing = missing_tools()
    if missing:
        raise BuildError(
            f"cannot build llama-server: missing {', '.join(sorted(missing))}",
            fix=f"apt-get install -y {' '.join(sorted(set(missing.values())))} "
            "(or `bash scripts/setup.sh`, which installs what the tests need)",
        )
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BuildError(
            f"cannot create the build cache {root}: {exc.strerror}",
            fix="run as root, or set CT200_TESTBED_CACHE to a writable directory",
        ) from exc
    with _lock(root):
        found = cached(root)  # another run built it while we waited
        if found is not None:
            return Built(found, 0.0)
        started = time.monotonic()
        _build(root, jobs or os.cpu_count() or 1)
        binary = cached(root)
        assert binary is not None  # noqa: S101 (_build's rename just made it)
        return Built(binary, time.monotonic() - started)


def progress(log: Path) -> str:
    """How far the build is, from the last cmake progress mark in the log's tail."""
    with log.open("rb") as fh:
        fh.seek(max(0, log.stat().st_size - 8192))
        marks = _PERCENT.findall(fh.read())
    return f"{int(marks[-1])}%" if marks else "started"


def _run(
    argv: list[str], log: Path, cwd: Path | None = None, every_s: float = PROGRESS_EVERY_S
) -> None:
    """Runs one build step with its output in ``log``, printing a progress line every
    ``every_s`` while it runs (cmake's percentage, the time so far, where the log is)."""
    with log.open("a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        started = time.monotonic()
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        while True:
            try:
                proc.wait(timeout=every_s)
                break
            except subprocess.TimeoutExpired:
                took = time.monotonic() - started
                if took > BUILD_TIMEOUT_S:
                    proc.kill()
                    proc.wait()
                    raise BuildError(f"`{argv[0]}` ran over {BUILD_TIMEOUT_S} s", log=log) from None
                print(
                    f"llama-server: {os.path.basename(argv[0])} {progress(log)} after "
                    f"{took:.0f} s (tail -f {log})",
                    flush=True,
                )
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise BuildError(
            f"`{' '.join(argv[:3])} ...` failed (exit {proc.returncode}):\n    "
            + "\n    ".join(tail),
            fix="a download error: check access to PyPI and run again; otherwise read the log",
            log=log,
        )


def _build(root: Path, jobs: int) -> None:
    key = build_key()
    for stale in root.glob(f".{key}.partial-*"):  # a killed build of an earlier run
        shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f".{key}.partial-", dir=root))
    log = root / f"{key}.log"
    log.write_text("")
    print(
        f"llama-server: building {key}, once per machine (about 6 minutes on 2 idle cores, "
        f"much longer on busy ones); a progress line every {PROGRESS_EVERY_S:.0f} s; log: {log}",
        flush=True,
    )
    try:
        requirement = work / "requirement.txt"
        requirement.write_text(f"llama-cpp-python=={VERSION} --hash=sha256:{SDIST_SHA256}\n")
        # pip checks the hash; --no-binary gets the sdist, the only form that carries the C++.
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet"]
        pip += ["--no-binary", "llama-cpp-python", "--require-hashes", "-r", str(requirement)]
        _run([*pip, "--dest", str(work)], log)
        source = _extract(work / f"{SDIST_ROOT}.tar.gz", work)
        build = work / "build"
        _run(["cmake", "-S", str(source), "-B", str(build), *CMAKE_FLAGS], log)
        _run(["cmake", "--build", str(build), "--target", TARGET, "-j", str(jobs)], log)
        done = work / "done"
        done.mkdir()
        shutil.copy2(build / "bin" / TARGET, done / TARGET)
        record = {"version": VERSION, "sha256": SDIST_SHA256, "flags": CMAKE_FLAGS}
        (done / _BUILT).write_text(json.dumps(record, indent=2) + "\n")
        for item in (done / TARGET, done / _BUILT):
            with item.open("rb") as fh:
                os.fsync(fh.fileno())
        target = root / key
        if target.exists():  # an unfinished directory without its build record
            shutil.rmtree(target)
        done.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _extract(sdist: Path, into: Path) -> Path:
    """Only the vendored llama.cpp tree; tarfile's data filter refuses links out of the tree."""
    prefix = f"{SDIST_ROOT}/{VENDORED}/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        if not members:
            raise BuildError(f"{sdist.name} has no {VENDORED}/ tree: not the expected sdist")
        tar.extractall(into, members=members, filter="data")
    return into / SDIST_ROOT / VENDORED
