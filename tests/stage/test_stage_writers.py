"""One writer per destination file at a time (issue 22): a real engine run traced with strace.

tmpfs serialises writes to one file on the inode's rwsem, and threads waiting for it there spin
on a CPU; the engine makes them wait on its own lock instead (they sleep). What is observable from
outside: no two pwrite64 calls on the same file are in the kernel at the same time, while several
threads still copy that file.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

from tests.stage.conftest import STRACE, needs_strace

#: Run in a child under strace: 8 threads copy one 16 MiB file in 256 KiB chunks, 64 KiB writes.
ENGINE = """
import os, sys
from ct200_tools.stage.engine import ChunkEngine, FileJob
src, dst = sys.argv[1], sys.argv[2]
size = os.path.getsize(os.path.join(src, "f"))
os.close(os.open(os.path.join(dst, "f"), os.O_WRONLY | os.O_CREAT, 0o600))
engine = ChunkEngine(algorithm="blake2b-128", chunk_size=256 << 10, jobs=8,
                     buffer_size=64 << 10, drop_cache=False)
engine.run(src, [FileJob("f", size)], dst)
"""


@needs_strace
def test_no_two_writes_to_one_file_at_once(tmp_path: Path, shm: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    data = bytes(range(256)) * (64 << 10)  # 16 MiB
    (src / "f").write_bytes(data)
    trace = tmp_path / "trace"
    assert STRACE is not None
    child = [sys.executable, "-c", ENGINE, str(src), str(shm)]
    proc = subprocess.run(
        [STRACE, "-f", "-ttt", "-T", "-y", "-e", "trace=pwrite64", "-o", str(trace), *child],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert (shm / "f").read_bytes() == data
    lines = trace.read_text().splitlines()
    spans: list[tuple[float, float, str]] = []
    begun: dict[str, tuple[float, str]] = {}  # pid -> a call strace printed as unfinished
    for line in lines:
        # "<pid> <start> pwrite64(<fd><path>, ..., <offset>) = <n> <secs>", or split in two
        # ("<unfinished ...>", then "<... pwrite64 resumed>") when another thread's line came
        # in between: its own pwrite64, or only its exit.
        pid, stamp = line.split()[:2]
        if "pwrite64(" in line:
            began, path = float(stamp), line.split("<", 1)[1].split(">", 1)[0]
            if line.endswith("<unfinished ...>"):
                begun[pid] = (began, path)
                continue
        elif "pwrite64 resumed>" in line:
            began, path = begun.pop(pid)
        else:
            continue
        spans.append((began, began + float(line.rsplit("<", 1)[1].rstrip(">")), path))
    assert not begun and len(spans) == len(data) // (64 << 10), "every write traced"
    writers = {line.split()[0] for line in lines if "pwrite64" in line}
    assert len(writers) > 1, "one thread wrote the whole file: nothing was checked"
    spans.sort()
    for (s0, e0, p0), (s1, _e1, p1) in itertools.pairwise(spans):
        assert not (p0 == p1 and s1 < e0), f"two writes to {p0} at once: {s0}-{e0} and {s1}"
