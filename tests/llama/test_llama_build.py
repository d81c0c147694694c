"""The cached llama-server build: self-contained enough for the testbed's rootfs, built once.

Which Debian the rootfs is: testbed/config.py (SUITE, TARGET_GLIBC).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import llama_build

pytestmark = [pytest.mark.llama, pytest.mark.timeout(llama_build.BUILD_TIMEOUT_S)]

#: glibc of the testbed's rootfs (Debian bookworm): the newest symbol version the binary may use.
ROOTFS_GLIBC = (2, 36)
#: Libraries glibc itself provides; anything else would have to be installed in the rootfs.
GLIBC_LIBS = {
    "libc.so.6",
    "libm.so.6",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "ld-linux-x86-64.so.2",
}
ROOTFS_MARKER = ".ct200-testbed-rootfs"


def _readelf(binary: Path, *flags: str) -> str:
    if shutil.which("readelf") is None:
        pytest.fail("readelf is missing: apt-get install -y binutils (g++ brings it)")
    return subprocess.run(
        ["readelf", *flags, str(binary)], check=True, capture_output=True, text=True
    ).stdout


def _needed(binary: Path) -> set[str]:
    return set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", _readelf(binary, "-d")))


def _rootfs() -> Path | None:
    """The testbed's finished rootfs cache, when tests/testbed or `up` has built one."""
    cache = llama_build.cache_root().parent
    trees = sorted(p for p in cache.glob("rootfs-*") if (p / ROOTFS_MARKER).is_file())
    return trees[-1] if trees else None


def test_binary_needs_nothing_but_glibc(llama_binary: Path) -> None:
    needed = _needed(llama_binary)
    assert "libc.so.6" in needed
    assert needed <= GLIBC_LIBS, f"not linked statically: {sorted(needed - GLIBC_LIBS)}"
    assert "(RPATH)" not in _readelf(llama_binary, "-d")


def test_binary_needs_no_glibc_newer_than_the_rootfs(llama_binary: Path) -> None:
    versions = {
        tuple(int(n) for n in v.split("."))
        for v in re.findall(r"GLIBC_(\d+\.\d+(?:\.\d+)?)", _readelf(llama_binary, "-V"))
    }
    assert versions, "no GLIBC_ symbol versions found"
    assert max(versions) <= ROOTFS_GLIBC, sorted(versions)


def test_binary_runs_inside_the_testbed_rootfs(llama_binary: Path) -> None:
    root = _rootfs()
    if root is None:
        pytest.skip("the testbed's rootfs is not built here yet (tests/testbed builds it)")
    if os.geteuid() != 0 or shutil.which("systemd-nspawn") is None:
        pytest.skip("needs root and systemd-nspawn")
    libdir = root / "usr/lib/x86_64-linux-gnu"
    assert all((libdir / lib).exists() for lib in _needed(llama_binary)), sorted(
        lib for lib in _needed(llama_binary) if not (libdir / lib).exists()
    )
    # Read-only: the template the machines share stays as it is. Unregistered and in our own
    # unit, as the testbed starts its machines: no system bus is needed (a container, CI).
    inside = "/run/llama-server"
    proc = subprocess.run(
        [
            "systemd-nspawn",
            "--quiet",
            "--register=no",
            "--keep-unit",
            "--read-only",
            "--private-network",
            "--resolv-conf=off",
            "--timezone=off",
            "--link-journal=no",
            f"--directory={root}",
            f"--bind-ro={llama_binary}:{inside}",
            inside,
            "--version",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "version:" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_a_second_ensure_uses_the_cache(llama_binary: Path) -> None:
    again = llama_build.ensure()
    assert again == llama_build.Built(llama_binary, 0.0)
    record = json.loads((llama_binary.parent / "build.json").read_text())
    assert record["version"] == llama_build.VERSION
    assert record["sha256"] == llama_build.SDIST_SHA256
    assert tuple(record["flags"]) == llama_build.CMAKE_FLAGS
    assert llama_binary.parent.parent == llama_build.cache_root()


def test_a_directory_without_its_build_record_is_not_a_build(
    llama_binary: Path, tmp_path: Path
) -> None:
    half = tmp_path / llama_build.build_key()
    half.mkdir()
    shutil.copy2(llama_binary, half / llama_build.TARGET)
    assert llama_build.cached(tmp_path) is None
    shutil.copy2(llama_binary.parent / "build.json", half / "build.json")
    assert llama_build.cached(tmp_path) == half / llama_build.TARGET


def test_a_concurrent_run_waits_for_the_build_and_does_not_build_again(
    llama_binary: Path, tmp_path: Path
) -> None:
    """Hold the lock as a building run would, finish 'its' build, and see the waiter use it."""
    with (tmp_path / f".{llama_build.build_key()}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        code = (
            "import sys; from pathlib import Path; from testbed import llama_build as b; "
            "r = b.ensure(Path(sys.argv[1])); print(r.binary, r.build_s, flush=True)"
        )
        waiter = subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=Path(__file__).resolve().parents[2],
        )
        try:
            assert waiter.stdout is not None
            assert "waiting for that build" in waiter.stdout.readline()
            done = tmp_path / llama_build.build_key()
            done.mkdir()
            shutil.copy2(llama_binary, done / llama_build.TARGET)
            shutil.copy2(llama_binary.parent / "build.json", done / "build.json")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
        out, _ = waiter.communicate(timeout=60)
    assert waiter.returncode == 0, out
    assert out.split() == [str(done / llama_build.TARGET), "0.0"]
    assert not list(tmp_path.glob("*.partial-*"))


def test_the_build_key_follows_the_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    key = llama_build.build_key()
    assert key.startswith(llama_build.VERSION + "-")
    monkeypatch.setattr(llama_build, "CMAKE_FLAGS", (*llama_build.CMAKE_FLAGS, "-DGGML_AVX512=ON"))
    assert llama_build.build_key() != key


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "testbed.llama_server", *args],
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_build_and_path_print_the_cached_binary(llama_binary: Path) -> None:
    build = _cli("build")
    assert (build.returncode, build.stdout) == (0, f"{llama_binary}\n"), build.stderr
    assert "(cached)" in build.stderr
    path = _cli("path")
    assert (path.returncode, path.stdout) == (0, f"{llama_binary}\n")


def test_cli_serve_rejects_a_missing_model(llama_binary: Path, tmp_path: Path) -> None:
    proc = _cli("serve", "--model", str(tmp_path / "none.gguf"))
    assert proc.returncode == 2
    assert f"--model {tmp_path / 'none.gguf'}: no such file" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_build_without_the_tools_names_the_packages(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    proc = _cli("build", env={"CT200_TESTBED_CACHE": str(tmp_path), "PATH": str(empty)})
    assert proc.returncode == 2, proc.stderr
    assert "missing c++, cmake, make" in proc.stderr
    assert "apt-get install -y cmake g++ make" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == [empty]  # nothing made before the error


def test_cli_build_into_an_unusable_cache_says_how_to_move_it(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = _cli("build", env={"CT200_TESTBED_CACHE": str(blocker)})
    if llama_build.missing_tools():
        pytest.skip("the build tools are missing; the test above covers that error")
    assert proc.returncode == 2, proc.stderr
    assert f"cannot create the build cache {blocker}/llama-server" in proc.stderr
    assert "set CT200_TESTBED_CACHE to a writable directory" in proc.stderr
    assert "Traceback" not in proc.stderr
