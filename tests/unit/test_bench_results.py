"""The results store on its own: whole lines only, a torn tail cut before the next point."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

from ct200_tools.bench.results import Store, StoreError, read_lines
from ct200_tools.untrusted import UntrustedInputError
from tests.unit.bench_helpers import bench, standin


def test_a_torn_last_line_is_ignored_and_cut_before_the_next_point(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.add_point({"key": "a"})
    with store.results.open("ab") as fh:
        fh.write(b'{"key": "b", "dur')  # a machine crash mid-write
    seen = read_lines(store.results)
    assert seen.torn and seen.records == [{"key": "a"}]
    assert store.repair_tail() == len(b'{"key": "b", "dur')
    store.add_point({"key": "c"})
    assert [json.loads(x) for x in store.results.read_text().splitlines()] == [
        {"key": "a"},
        {"key": "c"},
    ]
    assert store.repair_tail() == 0


def test_a_whole_file_of_one_torn_line_is_cut_to_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.results.write_bytes(b"x" * 100_000)
    assert store.repair_tail() == 100_000 and store.results.read_bytes() == b""


def test_a_line_that_is_not_a_point_is_an_error_naming_it(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.results.write_text('{"key": "a"}\n[1, 2]\n')
    with pytest.raises(UntrustedInputError) as err:
        store.points()
    assert "line 2" in err.value.message and err.value.fix


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


@pytest.mark.timeout(60)
def test_a_point_is_never_written_into_a_fifo_and_never_waits_for_one(tmp_path: Path) -> None:
    store = Store(tmp_path)
    fifo = _fifo(tmp_path / "results.jsonl")
    with pytest.raises(StoreError, match="is a FIFO"):
        store.check()
    # Past the check (a FIFO swapped in later), without a reader and with one: refused at once.
    with pytest.raises(StoreError, match=r"results.jsonl is a FIFO \(named pipe\), not a regular"):
        store.add_point({"key": "x"})
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(StoreError, match="not a regular file"):
            store.add_point({"key": "x"})
        with pytest.raises(StoreError, match="not a regular file"):
            store.repair_tail()
        assert os.read(reader, 100) == b""  # nothing went into the pipe
    finally:
        os.close(reader)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["fifo", "directory", "device", "out-file", "runs-file"])
def test_results_that_are_not_regular_files_are_exit_4_before_any_request(
    tmp_path: Path, kind: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    results = out / "results.jsonl"
    if kind == "fifo":
        _fifo(results)
    elif kind == "directory":
        results.mkdir()
    elif kind == "device":
        results.symlink_to("/dev/null")
    elif kind == "out-file":
        out.rmdir()
        out.write_text("")
    else:
        (out / "runs").write_text("")
    with standin() as url:
        # A hang fails the test (TimeoutExpired) instead of blocking the suite.
        proc = bench("run", "--target", url, "--concurrency", "1", "--input-tokens", "4",
                     "--output-tokens", "2", "--requests", "1", "--out", str(out),
                     timeout=60)  # fmt: skip
    assert proc.returncode == 4, proc.stderr
    assert "ct200-bench: cannot write results: " in proc.stderr
    wanted = "a directory" if kind in ("out-file", "runs-file") else "a regular file"
    assert f", not {wanted}" in proc.stderr
    assert "fix: pass as --out a directory you can write" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not proc.stdout  # refused before the run started


def _append(root: str, writer: int, points: int) -> None:
    store = Store(root)
    for i in range(points):
        # Larger than a page: a reader can see such a write half done.
        store.add_point({"writer": writer, "i": i, "pad": "x" * 70_000})


def _repair_until(root: str, stop: Any) -> None:
    store = Store(root)
    while not stop.is_set():
        store.repair_tail()


def test_concurrent_runs_into_one_out_keep_every_point_whole(tmp_path: Path) -> None:
    """Two runs into the same --out (and a third starting, which cuts a torn tail first): a run
    starting while another's point is half written must not cut that point, and no line may mix
    two writers. Both paths take the file's lock; without it the starting run saw the half
    line as torn and truncated the other run's point."""
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    repairer = ctx.Process(target=_repair_until, args=(str(tmp_path), stop))
    repairer.start()
    writers = [ctx.Process(target=_append, args=(str(tmp_path), w, 40)) for w in range(3)]
    for p in writers:
        p.start()
    for p in writers:
        p.join(timeout=300)
    stop.set()
    repairer.join(timeout=60)
    assert [p.exitcode for p in [*writers, repairer]] == [0, 0, 0, 0]
    seen = read_lines(Store(tmp_path).results)
    assert not seen.torn
    got = sorted((r["writer"], r["i"]) for r in seen.records)
    assert got == sorted((w, i) for w in range(3) for i in range(40))
