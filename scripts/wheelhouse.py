"""The release step: ct200-tools and all its dependencies as wheels for the target's Python.

    make wheelhouse            # dist/ct200-tools-wheelhouse.tar, for Debian 12 (CPython 3.11)
    .venv/bin/python scripts/wheelhouse.py --out FILE [--python-version 3.12 --glibc 2.39]

playbooks/container.yml installs ct200-tools on the container from this one tar file (inventory
variable ``ct200_tools_wheelhouse``), so the container needs no package index. The testbed runs
the same step for its machines (testbed/wheelhouse.py).

The target is the container's Python, not the controller's: compiled dependencies (PyYAML,
psutil, xxhash, and paramiko's cryptography, bcrypt, PyNaCl, cffi) are downloaded as binary
wheels for the target's CPython version and glibc (manylinux tags), never built here. Before the
tar is replaced, pip resolves ct200-tools from the new wheels alone, for the target: a wheelhouse
that lacks a wheel is never written. The ct200-tools wheel is built reproducibly
(SOURCE_DATE_EPOCH) from a copy of the checkout, so an unchanged checkout gives a byte-identical
tar and a re-run of the playbook copies and installs nothing.

Exit codes: 0 written or up to date, 1 pip failed (network, index), 2 bad arguments.
"""

from __future__ import annotations

import argparse
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
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = Path("dist/ct200-tools-wheelhouse.tar")
#: Debian 12 (bookworm), what PVE 8 and the testbed machines run: its python3 and glibc.
DEFAULT_PYTHON = "3.11"
DEFAULT_GLIBC = (2, 36)
#: 1980-01-01, the earliest time a zip file can hold.
SOURCE_DATE_EPOCH = "315532800"
#: Never copied into the wheel's build tree: at the top (VCS, venvs, build output) and anywhere.
_SKIP_TOP = frozenset({".git", ".venv", "build", "dist", ".testbed"})
_SKIP_ANY = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".*_cache", ".hypothesis")


class WheelhouseError(Exception):
    def __init__(self, message: str, detail: str = "", fix: str = "") -> None:
        super().__init__(message)
        self.detail = detail
        self.fix = fix


@dataclass(frozen=True)
class Target:
    """The Python the wheels are for: CPython version, glibc, machine architecture."""

    python: str = DEFAULT_PYTHON
    glibc: tuple[int, int] = DEFAULT_GLIBC
    arch: str = platform.machine()

    def platforms(self) -> list[str]:
        """Wheel platform tags a machine with this glibc accepts, newest first (pip does not
        infer the older ones from ``--platform``)."""
        tags = [f"manylinux_2_{minor}_{self.arch}" for minor in range(self.glibc[1], 4, -1)]
        return [*tags, *(f"manylinux{y}_{self.arch}" for y in ("2014", "2010", "1"))]

    def pip_args(self) -> list[str]:
        plats = [arg for tag in self.platforms() for arg in ("--platform", tag)]
        return [
            "--only-binary=:all:",
            *plats,
            "--python-version",
            self.python,
            "--implementation",
            "cp",
        ]

    def describe(self) -> str:
        return f"CPython {self.python}, glibc <= {self.glibc[0]}.{self.glibc[1]}, {self.arch}"


@dataclass(frozen=True)
class Result:
    archive: Path
    wheels: tuple[str, ...]
    #: What this run rebuilt: "dependencies", "ct200-tools", "archive"; empty when up to date.
    rebuilt: tuple[str, ...]
    seconds: float


def _project(repo: Path) -> dict[str, object]:
    return dict(tomllib.loads((repo / "pyproject.toml").read_text())["project"])


def requirements(repo: Path) -> list[str]:
    deps = _project(repo)["dependencies"]
    return [str(r) for r in deps] if isinstance(deps, list) else []


def version(repo: Path) -> str:
    return str(_project(repo)["version"])


def _pip(args: list[str], what: str, env: Mapping[str, str] | None = None) -> str:
    """Runs pip in this Python; returns its output (stdout and stderr)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=900,
        check=False,
    )
    if proc.returncode != 0:
        raise WheelhouseError(
            f"pip could not {what} (exit {proc.returncode})",
            detail=(proc.stderr or proc.stdout)[-1500:],
            fix="the dependencies come from PyPI (or the index pip is configured with): check "
            "the network or proxy and run it again; 'No matching distribution' means a "
            "dependency has no wheel for this target: check --python-version and --glibc",
        )
    return proc.stdout + proc.stderr


def _copy_source(repo: Path, dest: Path) -> None:
    """The checkout as the build backend should see it: no VCS, venv or old build output, whose
    stale files could otherwise end up in the wheel."""

    def ignore(directory: str, names: list[str]) -> set[str]:
        skip = set(_SKIP_ANY(directory, names))
        if Path(directory) == repo:
            skip |= _SKIP_TOP & set(names)
        return skip

    shutil.copytree(repo, dest, ignore=ignore, symlinks=True)


@dataclass(frozen=True)
class BuiltWheel:
    path: Path
    #: The build's output: pip's, and the build backend's warnings, if any.
    log: str


def build_wheel(repo: Path, out_dir: Path) -> BuiltWheel:
    """ct200-tools' wheel from a copy of the checkout, with the build backend installed in this
    Python (no network): what ships, exactly as pyproject.toml selects it."""
    with tempfile.TemporaryDirectory(prefix="ct200-wheel-") as tmp:
        src = Path(tmp) / "src"
        _copy_source(repo, src)
        log = _pip(
            ["wheel", "--no-deps", "--no-build-isolation", "-w", str(out_dir), str(src)],
            "build the ct200-tools wheel (its build backend is installed by scripts/setup.sh)",
            env={"SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH},
        )
    wheels = sorted(out_dir.glob("ct200_tools-*.whl"))
    if len(wheels) != 1:
        raise WheelhouseError(f"expected one ct200-tools wheel in {out_dir}, found {wheels}")
    return BuiltWheel(wheels[0], log)


def _source_files(repo: Path) -> list[Path]:
    """What the ct200-tools wheel is made of (its cache key)."""
    files = [repo / "pyproject.toml", repo / "README.md"]
    files += [
        f
        for f in sorted((repo / "ct200_tools").rglob("*"))
        if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"
    ]
    return [f for f in files if f.exists()]


def _digest(parts: list[bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _download_deps(wh: Path, reqs: list[str], target: Target) -> None:
    with tempfile.TemporaryDirectory(dir=wh.parent) as tmp:
        _pip(
            ["download", "-q", "-d", tmp, *target.pip_args(), *reqs],
            f"download the dependencies of ct200-tools for {target.describe()}",
        )
        for old in wh.glob("*.whl"):
            if not old.name.startswith("ct200_tools-"):
                old.unlink()
        for new in Path(tmp).glob("*.whl"):
            os.replace(new, wh / new.name)


def _build_own(repo: Path, wh: Path) -> None:
    with tempfile.TemporaryDirectory(dir=wh.parent) as tmp:
        wheel = build_wheel(repo, Path(tmp)).path
        for old in wh.glob("ct200_tools-*.whl"):
            if old.name != wheel.name:
                old.unlink()
        os.replace(wheel, wh / wheel.name)


def check_installable(wh: Path, target: Target, version: str) -> None:
    """pip resolves ct200-tools and every dependency from these wheels alone, for the target."""
    with tempfile.TemporaryDirectory(dir=wh.parent) as tmp:
        _pip(
            [
                "install",
                "-q",
                "--dry-run",
                "--ignore-installed",
                "--no-index",
                "--find-links",
                str(wh),
                "--target",
                tmp,
                *target.pip_args(),
                f"ct200-tools=={version}",
            ],
            f"install ct200-tools {version} from {wh} alone for {target.describe()}",
        )


def _pack(wh: Path, tar: Path) -> None:
    """A byte-reproducible tar of the wheels (sorted, no times, no owners), written to a temp
    file, synced and renamed: a killed run never leaves a partial archive under the real name."""
    tmp = tar.with_name(tar.name + ".tmp")
    with tmp.open("wb") as raw:
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as out:
            for wheel in sorted(wh.glob("*.whl")):
                info = tarfile.TarInfo(wheel.name)
                info.size, info.mode, info.mtime = wheel.stat().st_size, 0o644, 0
                with wheel.open("rb") as fh:
                    out.addfile(info, fh)
        raw.flush()
        os.fsync(raw.fileno())
    os.replace(tmp, tar)


def build(repo: Path, tar: Path, target: Target) -> Result:
    """Bring the wheelhouse ``tar`` up to date for ``target``; work files sit beside it."""
    started = time.monotonic()
    tar.parent.mkdir(parents=True, exist_ok=True)
    stem = tar.name.removesuffix(".tar")
    wh = tar.with_name(stem)
    wh.mkdir(exist_ok=True)
    stamp_file = tar.with_name(stem + ".stamp.json")
    rebuilt: list[str] = []
    with _lock(tar.with_name(stem + ".lock")):
        try:
            stamp = json.loads(stamp_file.read_text())
        except (OSError, ValueError):
            stamp = {}
        reqs = requirements(repo)
        deps_key = _digest([json.dumps([reqs, target.python, target.platforms()]).encode()])
        src_key = _digest(
            [bytes(f.relative_to(repo)) + b"\0" + f.read_bytes() for f in _source_files(repo)]
        )
        if stamp.get("deps") != deps_key:
            _download_deps(wh, reqs, target)
            rebuilt.append("dependencies")
        if stamp.get("src") != src_key or not list(wh.glob("ct200_tools-*.whl")):
            _build_own(repo, wh)
            rebuilt.append("ct200-tools")
        if rebuilt or stamp.get("tar") != [deps_key, src_key] or not tar.exists():
            check_installable(wh, target, version(repo))
            _pack(wh, tar)
            rebuilt.append("archive")
            stamp = {"deps": deps_key, "src": src_key, "tar": [deps_key, src_key]}
            stamp_file.write_text(json.dumps(stamp) + "\n")
        wheels = tuple(sorted(w.name for w in wh.glob("*.whl")))
    return Result(tar, wheels, tuple(rebuilt), time.monotonic() - started)


def _version(text: str, major: int) -> tuple[int, int]:
    match = re.fullmatch(rf"{major}\.(\d+)", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a version {major}.N")
    return major, int(match.group(1))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/wheelhouse.py",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="Ubuntu 24.04 containers: --python-version 3.12 --glibc 2.39; "
        "Ubuntu 22.04: --python-version 3.10 --glibc 2.35 (the package needs Python >= 3.11).",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the tar file ({DEFAULT_OUT})")
    p.add_argument(
        "--python-version",
        type=lambda t: "{}.{}".format(*_version(t, 3)),
        default=DEFAULT_PYTHON,
        help=f"the container's python3, MAJOR.MINOR ({DEFAULT_PYTHON}: Debian 12)",
    )
    p.add_argument(
        "--glibc",
        type=lambda t: _version(t, 2),
        default=DEFAULT_GLIBC,
        help="the container's glibc (`ldd --version`), 2.N (2.36: Debian 12)",
    )
    p.add_argument("--repo", type=Path, default=REPO, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    target = Target(args.python_version, args.glibc)
    try:
        result = build(args.repo.resolve(), args.out.resolve(), target)
    except WheelhouseError as exc:
        print(f"wheelhouse: error: {exc}", file=sys.stderr)
        if exc.detail:
            print("  " + exc.detail.strip().replace("\n", "\n  "), file=sys.stderr)
        if exc.fix:
            print(f"  fix: {exc.fix}", file=sys.stderr)
        return 1
    what = f"rebuilt {', '.join(result.rebuilt)}" if result.rebuilt else "up to date"
    print(
        f"wheelhouse: {args.out}: {len(result.wheels)} wheels for {target.describe()} "
        f"({what}, {result.seconds:.1f}s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
