"""A build step of llama-server (testbed/llama_build.py) says how far it is while it runs: the
quickstart's first run builds it for minutes, and silence looks like a hang (issue 19, item 7).
The step here is a real child process writing cmake-like progress into the real log; it ends
only once the progress line naming its percentage has been printed, so nothing is timed."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from testbed import llama_build

#: Writes a cmake progress mark, then waits (bounded) for the go file the test creates once the
#: parent printed that mark.
STEP = r"""
import os, sys, time
print("[ 10%] Building C object ggml.c.o", flush=True)
print("[ 57%] Building CXX object server.cpp.o", flush=True)
until = time.monotonic() + 60
while not os.path.exists(sys.argv[1]):
    if time.monotonic() > until:
        sys.exit(7)
    time.sleep(0.01)
"""


class Watch(io.StringIO):
    """stdout that creates ``go`` once a line with ``want`` was printed."""

    def __init__(self, go: Path, want: str) -> None:
        super().__init__()
        self.go, self.want = go, want

    def write(self, text: str) -> int:
        n = super().write(text)
        if self.want in self.getvalue():
            self.go.touch()
        return n


def test_a_running_step_prints_its_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, go = tmp_path / "build.log", tmp_path / "go"
    out = Watch(go, "57%")
    monkeypatch.setattr(sys, "stdout", out)
    llama_build._run([sys.executable, "-c", STEP, str(go)], log, every_s=0.05)
    lines = [ln for ln in out.getvalue().splitlines() if "57%" in ln]
    assert lines, out.getvalue()
    assert lines[0].startswith("llama-server: ") and f"(tail -f {log})" in lines[0]
    assert "[ 57%] Building CXX object server.cpp.o" in log.read_text()


def test_progress_reads_the_last_mark(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    log.write_text("$ cmake -S x\n-- Configuring done\n")
    assert llama_build.progress(log) == "started"
    log.write_text(log.read_text() + "[  3%] Built target a\n[ 42%] Building b\nwarning: x\n")
    assert llama_build.progress(log) == "42%"


def test_a_failing_step_still_names_its_log(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    with pytest.raises(llama_build.BuildError) as err:
        llama_build._run([sys.executable, "-c", "import sys; sys.exit(3)"], log, every_s=0.05)
    assert "(exit 3)" in str(err.value) and str(log) in str(err.value)
