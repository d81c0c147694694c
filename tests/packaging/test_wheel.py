"""What ships: the ct200-tools wheel, built as the release step builds it, holds ct200_tools only.

The wheel goes onto production hosts and containers. The testbed (testbed/), the tests, the
benchmarks and the scripts are development tools and never in it. Built offline, with the build
backend scripts/setup.sh installs into the venv.
"""

from __future__ import annotations

import email
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts import wheelhouse

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[wheelhouse.BuiltWheel]:
    yield wheelhouse.build_wheel(REPO, tmp_path_factory.mktemp("wheel"))


def names(built: wheelhouse.BuiltWheel) -> list[str]:
    with zipfile.ZipFile(built.path) as zf:
        return zf.namelist()


def test_wheel_holds_ct200_tools_only(wheel: wheelhouse.BuiltWheel) -> None:
    dist_info = f"ct200_tools-{PROJECT['version']}.dist-info/"
    found = names(wheel)
    assert "ct200_tools/__init__.py" in found
    assert "ct200_tools/py.typed" in found
    outside = [n for n in found if not n.startswith(("ct200_tools/", dist_info))]
    assert outside == []
    assert [n for n in found if "testbed" in n] == []
    # The checks' examples name test fixtures: they document in the checkout and docs/checks.md.
    assert [n for n in found if n.startswith("ct200_tools/doctor/checks/examples/")] == []


def test_wheel_has_every_subpackage_of_the_source(wheel: wheelhouse.BuiltWheel) -> None:
    """Nothing of ct200_tools is left out either: every module of the checkout is in the wheel."""
    source = {
        str(p.relative_to(REPO))
        for p in (REPO / "ct200_tools").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert source <= set(names(wheel))


def test_wheel_metadata(wheel: wheelhouse.BuiltWheel) -> None:
    with zipfile.ZipFile(wheel.path) as zf:
        dist_info = f"ct200_tools-{PROJECT['version']}.dist-info"
        meta = email.message_from_bytes(zf.read(f"{dist_info}/METADATA"))
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
    assert meta["Name"] == "ct200-tools"
    assert meta["License-Expression"] == "Apache-2.0"
    assert "ct200-doctor = ct200_tools.cli.entry:main" in entry_points
    assert "ct200-stage = ct200_tools.cli.stage:main" in entry_points
    assert "ct200-bench = ct200_tools.cli.bench:main" in entry_points


def test_wheel_builds_without_warnings(wheel: wheelhouse.BuiltWheel) -> None:
    """setuptools' deprecations (the `project.license` table was one) show in the build log."""
    flagged = [
        line
        for line in wheel.log.splitlines()
        if "Warning" in line or "deprecat" in line.lower() or "!!" in line
    ]
    assert flagged == [], wheel.log
