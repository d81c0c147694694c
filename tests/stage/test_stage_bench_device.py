"""benchmarks/stage/device.sh, the GPU machine's run of the staging benchmark, at toy sizes here.

Real runs of the script: the benchmark's real contenders on real files into a tmpfs, once with this
venv's python (xxhash installed), once with a python that has no xxhash (a fresh venv without
packages), with and without a carried wheel. The carried wheel is the real xxhash package of this
venv zipped under a wheel's name: what carry_xxhash.sh downloads is not available offline.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks/stage/device.sh"
CONTENDERS = {"ct200-stage", "cp", "cat-parallel", "cat-sequential", "ct200-verify"}


@pytest.fixture
def shm_dst() -> Iterator[Path]:
    dst = Path("/dev/shm") / f"ct200-device-bench-{uuid.uuid4().hex[:8]}"
    yield dst
    shutil.rmtree(dst, ignore_errors=True)


def device(tmp_path: Path, dst: Path, python: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {
        **os.environ,
        "OUT": str(tmp_path / "out"),
        "SIZES": "2M:1M 3M:1M",
        "SETTLE": "0",
        "DATA": str(tmp_path / "data"),
        "DST": str(dst),
        "PYTHON": python,
        "PYTHONPATH": "",
        **env,
    }
    return subprocess.run(
        ["bash", str(SCRIPT)],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def results(tmp_path: Path, size: str) -> dict[str, object]:
    report = json.loads((tmp_path / "out" / size / "results.json").read_text())
    assert isinstance(report, dict)
    return report


def test_both_sizes_every_contender_three_rounds(tmp_path: Path, shm_dst: Path) -> None:
    proc = device(tmp_path, shm_dst, sys.executable)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*"))
    files = [f for f in files if (tmp_path / "out" / f).is_file()]
    assert files == [
        "2M/results.json",
        "2M/results.txt",
        "3M/results.json",
        "3M/results.txt",
        "env.txt",
        "run.log",
    ]
    for size in ("2M", "3M"):
        report = results(tmp_path, size)
        assert report["rounds"] == 3 and report["hash"] == "xxh3-128"
        runs = report["mb_per_s"]
        assert isinstance(runs, dict) and set(runs) == CONTENDERS
        assert all(len(v["runs"]) == 3 for v in runs.values())
    assert "NO XXHASH" not in proc.stdout
    assert "done in" in (tmp_path / "out" / "run.log").read_text()
    assert not shm_dst.exists() and not list(tmp_path.glob("data*")), "left data behind"


def bare_python(tmp_path: Path) -> str:
    """A python without xxhash (nor anything else installed): a fresh venv without pip."""
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin/python")
    probe = subprocess.run([python, "-c", "import xxhash"], capture_output=True, check=False)
    if probe.returncode == 0:
        pytest.skip("the base interpreter has xxhash installed globally")
    return python


def test_without_xxhash_it_says_so_loudly_and_hashes_with_blake2b(
    tmp_path: Path, shm_dst: Path
) -> None:
    python = bare_python(tmp_path)
    proc = device(tmp_path, shm_dst, python, WHEELS=str(tmp_path / "no-wheels"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "NO XXHASH" in proc.stdout and "carry_xxhash.sh" in proc.stdout
    assert "NO XXHASH" in (tmp_path / "out" / "run.log").read_text()
    assert results(tmp_path, "2M")["hash"] == "blake2b-128"


def test_a_carried_wheel_is_unpacked_not_installed(tmp_path: Path, shm_dst: Path) -> None:
    xxhash = pytest.importorskip("xxhash")
    python = bare_python(tmp_path)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    wheel = wheels / f"xxhash-{xxhash.VERSION}-{tag}-{tag}-linux_x86_64.whl"
    package = Path(xxhash.__file__).parent
    with zipfile.ZipFile(wheel, "w") as zf:
        for f in package.rglob("*"):
            zf.write(f, str(f.relative_to(package.parent)))
    proc = device(tmp_path, shm_dst, python, WHEELS=str(wheels))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "NO XXHASH" not in proc.stdout and "unpacked, not installed" in proc.stdout
    assert results(tmp_path, "2M")["hash"] == "xxh3-128"
    check = subprocess.run([python, "-c", "import xxhash"], capture_output=True, check=False)
    assert check.returncode != 0, "the wheel was installed into the interpreter"


def test_contenders_and_rounds_at_both_sizes(tmp_path: Path, shm_dst: Path) -> None:
    """FULL, FULL2 and ROUNDS (e.g. more rounds of the two the goal compares): the contenders
    given at each size, each compared with the parallel cats per round."""
    first, second = "ct200-stage,cp,cat-parallel", "ct200-stage,cat-parallel"
    proc = device(tmp_path, shm_dst, sys.executable, FULL=first, FULL2=second, ROUNDS="2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for size, only in (("2M", first), ("3M", second)):
        report = results(tmp_path, size)
        assert report["rounds"] == 2
        runs = report["mb_per_s"]
        assert isinstance(runs, dict) and set(runs) == set(only.split(","))
        assert all(len(v["runs"]) == 2 for v in runs.values())
        ratios = report["ratios"]
        assert isinstance(ratios, dict)
        assert len(ratios["ct200-stage/cat-parallel"]["per_round"]) == 2, ratios


def test_one_size_is_one_run(tmp_path: Path, shm_dst: Path) -> None:
    """SIZES with one SIZE:SHARD: that run alone, exit 0, no second run of an empty size."""
    proc = device(tmp_path, shm_dst, sys.executable, SIZES="2M:1M", FULL="ct200-stage,cp")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["2M", "env.txt", "run.log"]
    assert set(results(tmp_path, "2M")["mb_per_s"]) == {"ct200-stage", "cp"}  # type: ignore[arg-type]
