"""The stand-in streaming server (benchmarks/bench_client/standin.py) as a test fixture: a real
aiohttp server on 127.0.0.1 in a subprocess, with scripted delays and faults, and the CLI."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "benchmarks" / "bench_client" / "standin.py"
BENCH = [sys.executable, "-c", "from ct200_tools.cli.bench import main; main()"]


@contextlib.contextmanager
def standin(*args: str, lifetime: float = 120.0) -> Iterator[str]:
    """The server's base URL while it runs; it is killed (by pid) afterwards."""
    proc = subprocess.Popen(
        [sys.executable, str(STANDIN), "--port", "0", "--lifetime", str(lifetime), *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline() if ready else ""
        assert line.startswith("port "), f"the stand-in did not start: {line!r}"
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*BENCH, *args], capture_output=True, text=True, timeout=timeout, check=False, cwd=REPO
    )
