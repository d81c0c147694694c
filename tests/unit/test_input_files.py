"""Every file ct200-doctor reads from a path, given as a FIFO, /dev/zero or a link to it
(issue 20): refused at once with exit 2, the file and a fix line; never a hang, never exit 3.
The site spec (`validate`, `--spec`) and a facts snapshot (`check --facts`); the fleet file and
serving.json have their own tests (test_fleet_untrusted.py, test_serving_untrusted.py).
Real FIFOs and devices; the doctor runs as a real process with a timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).parents[2]
CT200 = str(ROOT / "inventory" / "ct200")
FACTS = str(ROOT / "tests" / "fixtures" / "facts" / "ct200-ct-healthy.json")


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ct200_tools.cli.entry", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,  # a command that blocks on a FIFO fails here instead of hanging the suite
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
    )


def hostile(tmp_path: Path, kind: str, name: str) -> str:
    path = tmp_path / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero-link":
        path.symlink_to("/dev/zero")
    else:
        return "/dev/zero"
    return str(path)


KINDS = [("fifo", "FIFO"), ("dev-zero-link", "a device"), ("dev-zero", "a device")]


def refused(r: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    for fragment in fragments:
        assert fragment in r.stderr, r.stderr


@pytest.mark.parametrize(("kind", "said"), KINDS)
def test_a_facts_file_that_is_no_file_is_refused_with_a_fix(
    tmp_path: Path, kind: str, said: str
) -> None:
    path = hostile(tmp_path, kind, "facts.json")
    refused(doctor("check", "--facts", path, "--spec", CT200), path, said, "fix:", "snapshot")


@pytest.mark.parametrize(("kind", "said"), KINDS)
def test_a_spec_that_is_no_file_is_refused_with_a_fix(tmp_path: Path, kind: str, said: str) -> None:
    path = hostile(tmp_path, kind, "site.yml")
    refused(doctor("validate", path), path, said, "fix:")
    refused(doctor("check", "--facts", FACTS, "--spec", path), path, said, "fix:")


def test_a_staged_models_config_that_is_a_fifo_is_an_error_not_a_hang(tmp_path: Path) -> None:
    """The quantization probe (doctor and preflight) reads config.json from the staged model."""
    from ct200_tools.doctor.probes.base import Reader  # noqa: PLC0415
    from ct200_tools.doctor.probes.engine import probe_quant  # noqa: PLC0415

    staged = tmp_path / "dev" / "shm" / "models" / "m"
    staged.mkdir(parents=True)
    os.mkfifo(staged / "config.json")
    got = probe_quant(Reader(root=tmp_path), "/dev/shm/models/m")
    assert got.error is not None and "FIFO" in got.error, got
