"""A full disk leaves no corrupt result: a real tmpfs of a few pages, mounted by the test (root).

The stand-in for a full disk is the kernel's own ENOSPC from a tiny tmpfs: the run must stop
with exit 4 and the fix, every line of results.jsonl whole, provenance.json whole, and no
temporary file left behind; --resume then continues once there is room.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.bench_helpers import bench, standin

pytestmark = pytest.mark.timeout(180)


@contextlib.contextmanager
def tiny_tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def whole(path: Path) -> list[object]:
    data = path.read_bytes()
    assert not data or data.endswith(b"\n")
    return [json.loads(line) for line in data.splitlines()]


def test_a_full_disk_stops_with_exit_4_and_leaves_whole_files(tmp_path: Path) -> None:
    levels = ",".join(str(c) for c in range(1, 41))
    args = (
        "run",
        "--concurrency",
        levels,
        "--input-tokens",
        "2",
        "--output-tokens",
        "2",
        "--requests",
        "1",
    )
    # 128 KiB: room for the provenance and 40 points of about 2 KiB each.
    with tiny_tmpfs(tmp_path / "disk", "128k") as disk, standin() as url:
        out = disk / "out"
        # Leave about 24 KiB: room for the provenance and some points, not for 40.
        filler = disk / "filler"
        filler.write_bytes(b"x" * (104 << 10))
        proc = bench(*args, "--target", url, "--out", str(out))
        assert proc.returncode == 4, proc.stdout + proc.stderr
        assert "No space left on device" in proc.stderr and "fix: free space" in proc.stderr
        assert "Traceback" not in proc.stderr
        points = whole(out / "results.jsonl")
        assert 0 < len(points) < 40
        (run_dir,) = (out / "runs").iterdir()
        json.loads((run_dir / "provenance.json").read_text())
        leftovers = list(out.rglob(".tmp-*"))
        assert leftovers == []
        # Room again: --resume finishes the run from the whole points.
        filler.unlink()
        resumed = bench(*args, "--target", url, "--out", str(out), "--resume")
        assert resumed.returncode == 0, resumed.stderr
        final = whole(out / "results.jsonl")
        assert final[: len(points)] == points
        assert sorted(p["concurrency"] for p in final) == list(range(1, 41))
        assert os.path.getsize(out / "results.jsonl") > 0
