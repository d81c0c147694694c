"""ct200_tools.serve.running: whether a server's process runs what its files say now (issue 33),
from `systemctl show` text as systemd prints it and file times, with the clock given."""

from __future__ import annotations

from collections.abc import Sequence

from ct200_tools.serve.running import read
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


def judge(block: str, times: dict[str, float]) -> tuple[tuple[str, ...], str]:
    got = read(
        systemd_with(block),
        {UNIT: (ENV,)},
        monotonic=lambda: 1000.0,
        mtime=times.get,
        now=lambda: BOOT + 1000.0,
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
