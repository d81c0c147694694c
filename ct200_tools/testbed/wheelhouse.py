"""The wheelhouse the playbooks install ct200-tools from on machines without PyPI.

The testbed machines have no route to the Internet, and a production container need not have one
either, so the controller collects the wheels: ct200-tools built from this checkout and its
dependencies downloaded for the machines' Python and glibc. The ct200-tools wheel is built
reproducibly (SOURCE_DATE_EPOCH), so an unchanged checkout gives byte-identical wheels and a
re-run of the playbook copies and installs nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shutil
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

from ct200_tools.testbed.config import TARGET_GLIBC, TARGET_PYTHON, Settings
from ct200_tools.testbed.errors import TestbedError
from ct200_tools.testbed.system import Runner

#: 1980-01-01, the earliest time a zip file can hold.
SOURCE_DATE_EPOCH = "315532800"
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")


def path(settings: Settings) -> Path:
    return settings.repo / ".testbed" / "wheelhouse"


def archive(settings: Settings) -> Path:
    """The wheelhouse as one tar file: one checksum for Ansible's copy, not one per wheel."""
    return settings.repo / ".testbed" / "wheelhouse.tar"


def platforms(arch: str | None = None, glibc: tuple[int, int] = TARGET_GLIBC) -> list[str]:
    """Wheel platform tags a machine with ``glibc`` accepts, newest first (pip does not infer
    the older ones from ``--platform``)."""
    arch = arch or platform.machine()
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(glibc[1], 4, -1)]
    return [*tags, f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]


def requirements(repo: Path) -> list[str]:
    data = tomllib.loads((repo / "pyproject.toml").read_text())
    return [str(r) for r in data["project"]["dependencies"]]


def _source_files(repo: Path) -> list[Path]:
    files = [
        repo / "pyproject.toml",
        *([repo / "README.md"] if (repo / "README.md").exists() else []),
    ]
    for f in sorted((repo / "ct200_tools").rglob("*")):
        if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc":
            files.append(f)
    return files


def _digest(parts: list[bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


@contextlib.contextmanager
def _lock(where: Path) -> Iterator[None]:
    with (where.parent / "wheelhouse.lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def build(settings: Settings, runner: Runner) -> tuple[Path, float]:
    """Bring the wheelhouse and its archive up to date; returns the archive and the seconds."""
    started = time.monotonic()
    wh = path(settings)
    wh.mkdir(parents=True, exist_ok=True)
    repo = settings.repo
    with _lock(wh):
        stamp_file = wh.parent / "wheelhouse.stamp.json"
        try:
            stamp = json.loads(stamp_file.read_text())
        except (OSError, ValueError):
            stamp = {}
        reqs = requirements(repo)
        deps_key = _digest([json.dumps([reqs, TARGET_PYTHON, platforms()]).encode()])
        src_key = _digest(
            [
                str(f.relative_to(repo)).encode() + b"\0" + f.read_bytes()
                for f in _source_files(repo)
            ]
        )
        if stamp.get("deps") != deps_key:
            _download_deps(runner, wh, reqs)
            stamp["deps"] = deps_key
            stamp_file.write_text(json.dumps(stamp))
        if stamp.get("src") != src_key or not list(wh.glob("ct200_tools-*.whl")):
            _build_own(runner, repo, wh)
            stamp["src"] = src_key
            stamp_file.write_text(json.dumps(stamp))
        tar = archive(settings)
        if stamp.get("tar") != [stamp.get("deps"), stamp.get("src")] or not tar.exists():
            _pack(wh, tar)
            stamp["tar"] = [stamp.get("deps"), stamp.get("src")]
            stamp_file.write_text(json.dumps(stamp))
    return tar, time.monotonic() - started


def _pack(wh: Path, tar: Path) -> None:
    """A byte-reproducible tar of the wheels: sorted, no times, no owners."""
    tmp = tar.with_suffix(".tmp")
    with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as out:
        for wheel in sorted(wh.glob("*.whl")):
            info = tarfile.TarInfo(wheel.name)
            info.size, info.mode, info.mtime = wheel.stat().st_size, 0o644, 0
            with wheel.open("rb") as fh:
                out.addfile(info, fh)
    os.replace(tmp, tar)


def _pip(runner: Runner, args: list[str], what: str, env: dict[str, str] | None = None) -> None:
    proc = runner.run([sys.executable, "-m", "pip", *args], check=False, env=env, timeout=900)
    if proc.returncode != 0:
        raise TestbedError(
            f"pip could not {what} (exit {proc.returncode})",
            detail=(proc.stderr or proc.stdout)[-1500:],
            fix="the controller needs PyPI (or a configured index) for this; check the network "
            "or proxy and run it again",
        )


def _download_deps(runner: Runner, wh: Path, reqs: list[str]) -> None:
    with tempfile.TemporaryDirectory(dir=wh.parent) as tmp:
        plats = [arg for tag in platforms() for arg in ("--platform", tag)]
        _pip(
            runner,
            [
                "download",
                "-q",
                "-d",
                tmp,
                "--only-binary=:all:",
                *plats,
                "--python-version",
                TARGET_PYTHON,
                "--implementation",
                "cp",
                *reqs,
            ],
            "download the dependencies of ct200-tools for the testbed machines",
        )
        for old in wh.glob("*.whl"):
            if not old.name.startswith("ct200_tools-"):
                old.unlink()
        for new in Path(tmp).glob("*.whl"):
            os.replace(new, wh / new.name)


def _build_own(runner: Runner, repo: Path, wh: Path) -> None:
    with tempfile.TemporaryDirectory(dir=wh.parent) as tmp:
        src, out = Path(tmp) / "src", Path(tmp) / "out"
        src.mkdir()
        for f in ("pyproject.toml", "README.md"):
            if (repo / f).exists():
                shutil.copy2(repo / f, src / f)
        # A copy, so that stale files in the checkout's build/ never end up in the wheel.
        shutil.copytree(repo / "ct200_tools", src / "ct200_tools", ignore=_SKIP)
        _pip(
            runner,
            ["wheel", "-q", "--no-deps", "-w", str(out), str(src)],
            "build the ct200-tools wheel",
            env={"SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH},
        )
        wheels = list(out.glob("ct200_tools-*.whl"))
        if len(wheels) != 1:
            raise TestbedError(f"expected one ct200-tools wheel, pip made {wheels}")
        for old in wh.glob("ct200_tools-*.whl"):
            if old.name != wheels[0].name:
                old.unlink()
        os.replace(wheels[0], wh / wheels[0].name)
