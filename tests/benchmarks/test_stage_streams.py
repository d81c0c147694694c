"""dd-streams cuts the data into --jobs runs of equal bytes; together they read every byte once."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.stage.__main__ import streams


@pytest.mark.parametrize(
    ("sizes", "jobs"),
    [([100, 100, 100, 100], 16), ([7, 1, 0, 300, 5], 4), ([3], 16), ([5, 5], 1), ([64, 64], 3)],
)
def test_streams_cover_every_byte_once(tmp_path: Path, sizes: list[int], jobs: int) -> None:
    files = []
    for i, size in enumerate(sizes):
        f = tmp_path / f"f{i}"
        f.write_bytes(b"x" * size)
        files.append(f)
    cut = streams(files, jobs)
    assert len(cut) == min(jobs, sum(sizes))
    seen: dict[Path, list[tuple[int, int]]] = {f: [] for f in files}
    lengths = []
    for stream in cut:
        lengths.append(sum(n for _f, _o, n in stream))
        for f, offset, n in stream:
            assert n > 0
            seen[f].append((offset, offset + n))
    assert max(lengths) - min(lengths) <= 1, lengths
    for f, size in zip(files, sizes, strict=True):
        spans = sorted(seen[f])
        pos = 0
        for lo, hi in spans:
            assert lo == pos
            pos = hi
        assert pos == size
