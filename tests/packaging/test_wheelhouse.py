"""The release step (scripts/wheelhouse.py, `make wheelhouse`): the wheels containers install.

The full build downloads the dependencies' wheels for the target through pip's configured index
(PyPI), as the testbed's `up` does; the rest runs offline.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest

from scripts import wheelhouse

REPO = Path(__file__).resolve().parents[2]
SCRIPT = [sys.executable, str(REPO / "scripts" / "wheelhouse.py")]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_wheel_platforms_cover_older_manylinux() -> None:
    tags = wheelhouse.Target("3.11", (2, 36), "x86_64").platforms()
    assert tags[0] == "manylinux_2_36_x86_64"
    assert {"manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"} <= set(tags)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--python-version", "3"], "argument --python-version: '3' is not a version 3.N"),
        (["--glibc", "2.x"], "argument --glibc: '2.x' is not a version 2.N"),
    ],
)
def test_bad_target_is_refused_before_anything(
    tmp_path: Path, args: list[str], message: str
) -> None:
    proc = subprocess.run(
        [*SCRIPT, "--out", str(tmp_path / "w.tar"), *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_wheelhouse_for_debian_12(tmp_path: Path) -> None:
    """ct200-tools and every dependency, compiled ones for CPython 3.11 (or the stable ABI),
    in one reproducible tar; a second run with nothing changed rewrites nothing."""
    tar = tmp_path / "dist" / "ct200-tools-wheelhouse.tar"
    first = subprocess.run(
        [*SCRIPT, "--out", str(tar)], capture_output=True, text=True, check=False
    )
    assert first.returncode == 0, first.stdout + first.stderr
    assert "rebuilt dependencies, ct200-tools, archive" in first.stdout
    with tarfile.open(tar) as tf:
        members = tf.getmembers()
    wheels = [m.name for m in members]
    assert all(m.mtime == 0 and m.uid == 0 and m.isfile() for m in members)
    assert wheels == sorted(wheels) and all(w.endswith(".whl") for w in wheels)
    have = {canonical(w.split("-")[0]) for w in wheels}
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    wanted = {canonical(re.split(r"[<>=!~ \[;]", d)[0]) for d in deps}
    assert wanted | {"ct200-tools"} <= have
    for w in wheels:
        python, abi, _platform = w.removesuffix(".whl").split("-")[-3:]
        if abi != "none":  # compiled: for the target's CPython, whatever runs this test
            assert python == "cp311" or abi == "abi3", w
    digest = hashlib.sha256(tar.read_bytes()).hexdigest()

    second = subprocess.run(
        [*SCRIPT, "--out", str(tar)], capture_output=True, text=True, check=False
    )
    assert second.returncode == 0, second.stderr
    assert "(up to date," in second.stdout
    assert hashlib.sha256(tar.read_bytes()).hexdigest() == digest
