"""ct200_tools.serve.running: whether a server's process runs what its files say now (issue 33),
from `systemctl show` text as systemd prints it and file times, with the clock given."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from ct200_tools.serve.engines import exec_line, exec_start, exec_words
from ct200_tools.serve.running import argv_difference, proc_cmdline, read, unit_exec_start
from ct200_tools.serve.systemd import Systemd

UNIT = "ct200-server-tiny.service"
ENV = "/etc/ct200/servers/tiny.env"
FRAGMENT = f"/etc/systemd/system/{UNIT}"
BOOT = 1_000_000.0  # the machine booted at this time (epoch seconds)
STARTED_MONO_US = 500 * 1_000_000  # the process started 500 s after boot


def systemd_with(block: str) -> Systemd:
    def run(argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
        assert argv[:2] == ["systemctl", "show"] and argv[-1] == UNIT
        return 0, block, ""

    return Systemd(run)


def show(active: str = "active", pid: int = 42, reload: str = "no") -> str:
    return (
        f"Id={UNIT}\nActiveState={active}\nMainPID={pid}\nNeedDaemonReload={reload}\n"
        f"FragmentPath={FRAGMENT}\nExecMainStartTimestampMonotonic={STARTED_MONO_US}\n"
    )


UNIT_ARGV = ["/usr/bin/llama-server", "-m", "/dev/shm/models/tiny", "--ctx-size", "1024"]


def judge(
    block: str, times: dict[str, float], process: list[str] | None = None
) -> tuple[tuple[str, ...], str]:
    got = read(
        systemd_with(block),
        {UNIT: (ENV,)},
        monotonic=lambda: 1000.0,
        mtime=times.get,
        now=lambda: BOOT + 1000.0,
        cmdline=lambda pid: process if pid == 42 else None,
        exec_start=lambda path: UNIT_ARGV if path == FRAGMENT else None,
    )[UNIT]
    return got.reasons, got.fix


def test_files_older_than_the_process_are_current() -> None:
    assert judge(show(), {FRAGMENT: BOOT + 100, ENV: BOOT + 500.5}) == (
        (),
        "`systemctl restart " + UNIT + "`",
    )


def test_a_file_written_after_the_start_is_an_older_configuration() -> None:
    reasons, fix = judge(show(), {FRAGMENT: BOOT + 100, ENV: BOOT + 700})
    assert reasons == (f"{ENV} was written 200 s after the process started",)
    assert fix == f"`systemctl restart {UNIT}`"


def test_need_daemon_reload_asks_for_the_reload_too() -> None:
    reasons, fix = judge(show(reload="yes"), {FRAGMENT: BOOT + 800})
    assert reasons[0] == "its unit file changed on disk and systemd has not read it"
    assert f"{FRAGMENT} was written 300 s after the process started" in reasons
    assert fix == f"`systemctl daemon-reload && systemctl restart {UNIT}`"


def test_a_unit_that_does_not_run_is_never_stale() -> None:
    assert judge(show(active="failed", pid=0), {ENV: BOOT + 900})[0] == ()
    assert judge(show(active="inactive"), {ENV: BOOT + 900})[0] == ()


def test_systemd_that_cannot_be_asked_tells_nothing() -> None:
    def broken(argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
        return 1, "", "Failed to connect to bus"

    got = read(Systemd(broken), {UNIT: (ENV,)}, monotonic=lambda: 1.0, mtime=lambda p: 0.0)
    assert not got[UNIT].stale


OLD_ARGV = [*UNIT_ARGV[:-1], "512"]


def test_a_process_on_another_command_line_is_an_older_configuration() -> None:
    # The unit file was put back with an old time (cp -p): the times say nothing, argv does.
    reasons, fix = judge(show(), {FRAGMENT: BOOT + 100}, process=OLD_ARGV)
    assert reasons == (
        "its process's command line is not its unit's ExecStart=: word 4 is `512` where the "
        "unit has `1024`",
    )
    assert fix == f"`systemctl restart {UNIT}`"
    assert judge(show(), {FRAGMENT: BOOT + 100}, process=UNIT_ARGV)[0] == ()
    # A drop-in may set its own ExecStart=: the fragment's is not what ran, so no claim.
    dropin = show() + "DropInPaths=/etc/systemd/system/x.service.d/override.conf\n"
    assert judge(dropin, {FRAGMENT: BOOT + 100}, process=OLD_ARGV)[0] == ()
    # Unreadable (gone, another user's): not judged.
    assert judge(show(), {FRAGMENT: BOOT + 100}, process=None)[0] == ()


def test_argv_difference_tells_only_what_it_can() -> None:
    unit = ["/opt/vllm/bin/vllm", "serve", "/dev/shm/m", "--port", "8000"]
    # The interpreter of a #! script comes first: the same command.
    assert argv_difference(["/opt/vllm/bin/python3", *unit], unit) is None
    assert argv_difference(["/opt/vllm/bin/python3", *unit[:-1], "8001"], unit) == (
        "word 4 is `8001` where the unit has `8000`"
    )
    assert argv_difference(unit[:-1], unit) == "the unit adds `8000` at word 4"
    assert argv_difference([*unit, "-v"], unit) == (
        "the process has `-v` at word 5, which the unit does not"
    )
    # Another program (exec'd, or a title rewritten by setproctitle): not ours to judge.
    assert argv_difference(["VLLM::APIServer"], unit) is None
    assert argv_difference([], unit) is None and argv_difference(unit, []) is None
    # Shown escaped: a control character in the process's argv never reaches the terminal raw.
    assert "\x1b" not in (argv_difference([*unit[:-1], "\x1b[2J"], unit) or "")


def test_a_real_process_command_line_from_proc(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import time; time.sleep(60)", "a b", "--x=$1"]
    proc = subprocess.Popen(argv)
    try:
        unit = tmp_path / "u.service"
        unit.write_text(f"[Service]\nExecStart={exec_line(argv)}\n")
        assert unit_exec_start(unit) == argv
        assert proc_cmdline(proc.pid) == argv
        assert argv_difference(proc_cmdline(proc.pid) or [], argv) is None
    finally:
        proc.kill()
        proc.wait()
    assert proc_cmdline(proc.pid) is None  # gone: cannot be read, not judged


def test_exec_start_reads_one_line_or_none() -> None:
    assert exec_start("[Service]\nExecStart=+/bin/x -a\n") == ["/bin/x", "-a"]
    assert exec_start("[Service]\nExecStart=/bin/x\nExecStart=/bin/y\n") is None
    assert exec_start("[Service]\nExecStartPre=/bin/x\n") is None
    assert exec_words("a b\\") == ["a", "b\\"]  # a trailing backslash is no crash


@given(st.lists(st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00\n"),
                        min_size=1), min_size=1, max_size=6))  # fmt: skip
def test_exec_words_reads_what_exec_line_writes(words: list[str]) -> None:
    assert exec_words(exec_line(words)) == words
