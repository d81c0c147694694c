"""ct200_tools/serve/chain.py: the boot chain read back from `systemctl show`, where it stopped,
and its Prometheus textfile. The systemctl output below has the shape systemd 252 (bookworm)
prints; tests/testbed/test_recovery.py reads the real thing after real reboots."""

from __future__ import annotations

import re

import pytest

from ct200_tools.serve import chain as ch
from ct200_tools.serve.serving import ServingState, serving_set
from ct200_tools.serve.systemd import Systemd
from ct200_tools.spec import validate
from tests.server_sites import llama_site

SITE = validate(llama_site())
#: The container's systemd started 100 s after the host's monotonic zero.
ZERO = 100_000_000
MANAGER = f"UserspaceTimestampMonotonic={ZERO}\nFinishTimestampMonotonic={ZERO + 9_500_000}\n"
PRE_OK = (
    "{ path=/opt/ct200/venv/bin/ct200-serve ; argv[]=/opt/ct200/venv/bin/ct200-serve preflight "
    "tiny --spec /etc/ct200/site.yml ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; "
    "pid=10 ; code=exited ; status=0/SUCCESS }"
)
GATE_FAIL = (
    "{ path=/opt/ct200/venv/bin/ct200-doctor ; argv[]=/opt/ct200/venv/bin/ct200-doctor gate tiny "
    "--spec /etc/ct200/site.yml ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; "
    "pid=11 ; code=exited ; status=2/INVALIDARGUMENT }"
)


def block(unit: str, active: str, sub: str, start: float, up: float, **extra: str) -> str:
    props = {
        "Id": unit,
        "LoadState": "loaded",
        "ActiveState": active,
        "SubState": sub,
        "Result": "success" if active != "failed" else "exit-code",
        "UnitFileState": "enabled",
        "InactiveExitTimestampMonotonic": str(ZERO + int(start * 1e6)) if start else "0",
        "ActiveEnterTimestampMonotonic": str(ZERO + int(up * 1e6)) if up else "0",
        **extra,
    }
    return "".join(f"{k}={v}\n" for k, v in props.items()) + "\n"


def build(*blocks: str, servers: tuple[str, ...] = ()) -> ch.Chain:
    state = ServingState(servers) if servers else None
    chosen = serving_set(SITE, state)
    return ch.build(SITE, chosen, ch.parse_blocks("".join(blocks)), ch.parse_blocks(MANAGER)[0])


GOOD = (
    block("ct200-stage@tiny-a.service", "active", "exited", 2.0, 2.5),
    block("ct200-server-tiny.service", "active", "running", 2.5, 4.25, ExecStartPre=PRE_OK),
)


def test_a_good_chain_serves_and_times_each_step_from_the_container_start() -> None:
    got = build(*GOOD)
    assert got.ok and got.stopped is None
    assert [(s.kind, s.name, s.state) for s in got.steps] == [
        ("stage", "tiny-a", "ok"),
        ("server", "tiny", "ok"),
    ]
    assert got.steps[0].started_s == 2.0 and got.steps[1].active_s == 4.25
    assert got.steps[1].seconds == pytest.approx(1.75)
    assert got.boot_s == 9.5 and got.serving_s == 4.25


def test_the_serving_set_chosen_last_decides_the_steps() -> None:
    got = build(
        block("ct200-stage@tiny-b.service", "active", "exited", 1, 2),
        block("ct200-server-tiny-b.service", "active", "running", 2, 3),
        servers=("tiny-b",),
    )
    assert got.source == "serving.json" and got.serving == ("tiny-b",)
    assert [s.unit for s in got.steps] == [
        "ct200-stage@tiny-b.service",
        "ct200-server-tiny-b.service",
    ]


def test_a_failed_stage_stops_the_chain_there_not_at_the_server() -> None:
    got = build(
        block("ct200-stage@tiny-a.service", "failed", "failed", 2.0, 0),
        block("ct200-server-tiny.service", "failed", "failed", 2.5, 0),
    )
    assert not got.ok
    assert got.stopped is not None and got.stopped.unit == "ct200-stage@tiny-a.service"
    assert got.stopped.active_s is None and got.serving_s is None
    # The cause is in the stage's journal (a missing copy, /dev/shm too small: its fix there),
    # not assumed to be a missing copy (issue 19's fault matrix).
    fix = ch.fix_of(got.stopped)
    assert fix.startswith("its journal (above; `journalctl -u ct200-stage@tiny-a.service`)")
    assert "`systemctl reset-failed ct200-stage@tiny-a.service && systemctl start" in fix


def test_a_failed_gate_is_named_as_the_gate() -> None:
    server = block(
        "ct200-server-tiny.service",
        "activating",
        "auto-restart",
        2.5,
        0,
        ExecStartPre=f"{PRE_OK}\nExecStartPre={GATE_FAIL}",
    )
    got = build(GOOD[0], server)
    stopped = got.stopped
    assert stopped is not None and stopped.state == "failed" and stopped.failed_at == "gate"
    assert "gate" in ch.fix_of(stopped)


def test_a_masked_unit_is_a_stop_with_the_unmask_fix() -> None:
    masked = "Id=ct200-server-tiny.service\nLoadState=masked\nActiveState=inactive\n\n"
    got = build(GOOD[0], masked)
    assert got.stopped is not None and got.stopped.state == "masked"
    assert "`systemctl unmask ct200-server-tiny.service && systemctl start" in ch.fix_of(
        got.stopped
    )


def test_a_unit_not_started_is_off() -> None:
    got = build(GOOD[0], block("ct200-server-tiny.service", "inactive", "dead", 0, 0))
    assert got.stopped is not None and got.stopped.state == "off"
    assert got.stopped.started_s is None


def test_a_server_stopped_after_it_ran_is_named_stopped_with_a_start_fix() -> None:
    """Not "not started at boot" with `enable --now` (issue 19's fault matrix: it is enabled,
    it ran, someone stopped it)."""
    got = build(GOOD[0], block("ct200-server-tiny.service", "inactive", "dead", 2.5, 0))
    assert got.stopped is not None and got.stopped.state == "off"
    assert got.stopped.detail == "inactive (dead), stopped after it ran at this boot"
    fix = ch.fix_of(got.stopped)
    assert fix.startswith(
        "it was stopped (systemctl stop, by hand or by a tool): `systemctl "
        "start ct200-server-tiny.service`"
    ), fix
    never = build(GOOD[0], block("ct200-server-tiny.service", "inactive", "dead", 0, 0))
    assert never.stopped is not None
    assert "not started at boot" in ch.fix_of(never.stopped)


def test_timestamps_of_an_earlier_boot_are_not_this_boot() -> None:
    old = block("ct200-stage@tiny-a.service", "active", "exited", 0, 0)
    old = old.replace("ActiveEnterTimestampMonotonic=0", "ActiveEnterTimestampMonotonic=5")
    got = build(old, GOOD[1])
    assert got.steps[0].active_s is None


def test_textfile_is_prometheus_text_with_the_stop() -> None:
    got = build(GOOD[0], block("ct200-server-tiny.service", "failed", "failed", 2.5, 0))
    text = ch.textfile(got, 1_700_000_000.0)
    sample = re.compile(r'^[a-z_][a-z0-9_]*(\{([a-z_]+="[^"]*",?)*\})? -?[0-9.]+$')
    for line in text.splitlines():
        assert line.startswith("# ") or sample.match(line), line
    assert "ct200_boot_chain_ok 0" in text
    assert (
        'ct200_boot_chain_stopped{kind="server",name="tiny",unit="ct200-server-tiny.service",'
        'state="failed",failed_at="engine"} 1'
    ) in text
    assert 'ct200_boot_step_state{kind="stage",name="tiny-a",' in text
    assert "ct200_boot_serving_seconds" not in text
    good = ch.textfile(build(*GOOD), 0)
    assert "ct200_boot_chain_ok 1" in good and "ct200_boot_serving_seconds 4.250" in good
    assert "ct200_boot_chain_stopped{" not in good


def test_lines_name_the_stop_and_its_fix() -> None:
    got = build(GOOD[0], block("ct200-server-tiny.service", "failed", "failed", 2.5, 0))
    text = "\n".join(ch.lines(got))
    assert text.startswith("boot chain: STOPPED")
    assert "stopped at: server tiny (ct200-server-tiny.service): failed" in text
    assert "fix: the engine exited" in text
    # The change to make, not a start that fails the same way (issue 33).
    assert "correct the spec and run site.yml" in text


def test_read_asks_systemctl_with_argv_lists() -> None:
    calls: list[list[str]] = []

    def run(argv: list[str] | tuple[str, ...], timeout: float) -> tuple[int, str, str]:
        calls.append(list(argv))
        if argv[:2] == ["journalctl", "--no-pager"]:
            return 0, "gate: no\n", ""
        if argv[-1].endswith(".service"):
            return 0, GOOD[0] + block("ct200-server-tiny.service", "failed", "failed", 2, 0), ""
        return 0, MANAGER, ""

    got = ch.read(SITE, serving_set(SITE, None), Systemd(run))
    assert got.journal == ("gate: no",)
    # This boot's lines only: an earlier boot's run must not pass for this one's (issue 19).
    assert "--boot" in calls[-1] and "--unit=ct200-server-tiny.service" in calls[-1]
    assert calls[0][:3] == ["systemctl", "show", "--no-pager"]
    assert calls[0][-2:] == ["ct200-stage@tiny-a.service", "ct200-server-tiny.service"]


def test_journal_lines_are_shown_escaped_and_kept_exact_in_json() -> None:
    """The journal tail is what the engine printed: an escape sequence in it must not rewrite
    the report (a forged "boot chain: serving" line); the JSON keeps it exactly."""
    evil = "\x1b[1A\x1b[2Kboot chain: serving\x07"  # up a line, erase it, write a verdict

    def run(argv: list[str] | tuple[str, ...], timeout: float) -> tuple[int, str, str]:
        if argv[:2] == ["journalctl", "--no-pager"]:
            return 0, f"{evil}\n", ""
        if argv[-1].endswith(".service"):
            return 0, GOOD[0] + block("ct200-server-tiny.service", "failed", "failed", 2, 0), ""
        return 0, MANAGER, ""

    got = ch.read(SITE, serving_set(SITE, None), Systemd(run))
    text = "\n".join(ch.lines(got))
    assert "    \\x1b[1A\\x1b[2Kboot chain: serving\\x07" in text
    assert not any(ord(c) < 0x20 and c != "\n" for c in text), text
    assert got.to_dict()["journal"] == [evil]


def test_the_gate_judges_the_first_server_that_loads_a_failed_stage() -> None:
    chosen = serving_set(SITE, None)
    stage = ch.Step("stage", "tiny-a", "ct200-stage@tiny-a.service", "failed", "failed")
    assert ch.gate_server(SITE, chosen, stage) == "tiny"
