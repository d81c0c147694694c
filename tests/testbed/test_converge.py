"""Converge means running (issue 33), on the testbed's `ct` with real systemd and llama-server:
two servers serve; the spec changes one of them while a poller on the machine asks both, every
50 ms, whether they serve, and site.yml runs as an operator would run it.

- A one-argument change (`--ctx-size`) restarts that server only: the other keeps its PID and
  never misses a poll; the changed one runs the new argv; a second run is changed=0.
- A flag the engine rejects fails the play naming llama-server's own error (its journal), and the
  previous unit comes back: the server serves its old argv again and no backup file is left.
  With inference_servers_rollback=false the failed state stays, and the next good run repairs it.
- `enabled: false` stops the server in the same play, not at the next boot.

One fixture runs the sequence phase by phase; each test asserts one part of it. The play's wall
time for the one-argument change and the changed server's longest gap between two good polls are
printed (`-s`), not asserted: tests never assert timings.
"""

from __future__ import annotations

import copy
import json
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from tbharness import AnsibleRun, Bed

from ct200_tools.serve import engines as engine
from testbed import llama_build
from testbed import ssh as tbssh
from testbed.machine import hostname
from tests.server_sites import llama, llama_site, prepare_ct

#: The fixture runs six plays; on a busy 2-core machine one takes up to about 90 s.
pytestmark = [pytest.mark.testbed, pytest.mark.timeout(1800)]

SITE = "playbooks/site.yml"
CONTAINER = "playbooks/container.yml"
CT = hostname("ct")
LIMIT = ("--limit", f"{CT},localhost")
KEPT, CHANGED = "conv-a", "conv-b"
PORTS = {KEPT: 8091, CHANGED: 8092}
BAD_FLAG = "--no-such-flag"
STOP = "/run/ct200-test-poll.stop"
SERVE = "/opt/ct200/venv/bin/ct200-serve"

#: Asks each port's /health every 50 ms until STOP exists; then prints, per port, the polls,
#: the failed ones, and the longest time between two answered polls that had failures between
#: them (the service gap).
POLL = r"""
import json, os, sys, time, urllib.request
ports = sys.argv[1:]
new = lambda: {"polls": 0, "failed": 0, "gap_s": 0.0, "last_ok": None, "failing": False}
stats = {p: new() for p in ports}
while not os.path.exists("/run/ct200-test-poll.stop"):
    for p in ports:
        s = stats[p]
        s["polls"] += 1
        ok = False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{p}/health", timeout=2) as r:
                ok = r.status == 200
        except Exception:
            pass
        now = time.monotonic()
        if ok:
            if s["failing"] and s["last_ok"] is not None:
                s["gap_s"] = max(s["gap_s"], now - s["last_ok"])
            s["failing"], s["last_ok"] = False, now
        else:
            s["failed"] += 1
            s["failing"] = True
    time.sleep(0.05)
print(json.dumps({p: {k: s[k] for k in ("polls", "failed", "gap_s")} for p, s in stats.items()}))
"""


def unit(name: str) -> str:
    return engine.unit_name(name)


def site(ctx: str = "512", extra: Sequence[str] = (), enabled: bool = True) -> dict[str, Any]:
    """The testbed spec with two llama-servers of their own models and ports; CHANGED's
    `--ctx-size` is ``ctx``, ``extra`` more arguments of its command, ``enabled`` its flag."""
    data = llama_site()
    kept = llama(KEPT, "tiny-a", PORTS[KEPT], enabled=True)
    other = llama(CHANGED, "tiny-b", PORTS[CHANGED], enabled=enabled)
    command = list(other["command"])
    command[command.index("--ctx-size") + 1] = ctx
    other["command"] = [*command, *extra]
    data["servers"] = [kept, other]
    return data


def write(workdir: Path, name: str, data: dict[str, Any]) -> str:
    path = workdir / f"converge-{name}.yml"
    path.write_text(yaml.safe_dump({"ct200_site": copy.deepcopy(data)}, sort_keys=False))
    return str(path)


def main_pid(bed: Bed, name: str) -> str:
    proc = bed.ssh("ct", "systemctl", "show", "--property=MainPID", "--value", unit(name))
    return proc.stdout.strip()


def state(bed: Bed, name: str) -> str:
    return bed.ssh("ct", "systemctl", "is-active", unit(name)).stdout.strip()


def argv(bed: Bed, name: str) -> list[str]:
    pid = main_pid(bed, name)
    raw = bed.ssh("ct", "cat", f"/proc/{pid}/cmdline").stdout
    return raw.split("\0")[:-1]


KEPT_RECORD = "/etc/ct200/servers/.kept-for-debugging.json"


def leftovers(bed: Bed) -> str:
    """The previous files a run kept beside the new ones (NAME.PID.DATE@TIME~)."""
    return bed.ssh(
        "ct", "sh", "-c", "ls /etc/systemd/system/ /etc/ct200/servers/ | grep '~$' || true"
    ).stdout


def messages(run: AnsibleRun) -> list[str]:
    return [str(r["msg"]) for r in run.report.get("results", []) if r["status"] == "ok"]


@dataclass
class Polled:
    run: AnsibleRun
    wall_s: float
    polls: dict[str, dict[str, Any]]


def polled(bed: Bed, site_file: str, *extra: str) -> Polled:
    """site.yml with the spec in ``site_file`` while the poller asks both servers."""
    bed.ssh("ct", "rm", "-f", STOP)
    remote = tbssh.argv(
        bed.slot, bed.addresses["ct"], ["python3", "-c", POLL, *map(str, PORTS.values())]
    )
    poller = subprocess.Popen(remote, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1)  # the poller's first round, before the play
        t0 = time.monotonic()
        run = bed.ansible(SITE, *LIMIT, "-e", f"@{site_file}", *extra)
        wall = time.monotonic() - t0
        time.sleep(1)
    finally:
        bed.ssh("ct", "touch", STOP)
        out, err = poller.communicate(timeout=60)
    polls = json.loads(out) if out.strip() else {"error": err}
    return Polled(run, wall, {name: polls.get(str(port), {}) for name, port in PORTS.items()})


@dataclass
class Phases:
    first: AnsibleRun
    pids: dict[str, str]
    change: Polled
    pids_after_change: dict[str, str]
    argv_after_change: list[str]
    second: AnsibleRun
    #: `ct200-serve status` after the env file was written, the restart's rc, status after it.
    status: tuple[str, int, str]
    #: `ct200-serve status` when only the process's command line tells the unit changed.
    argv_stale: str
    bad: Polled
    after_bad: dict[str, Any]
    kept_failed: AnsibleRun
    kept_failed_state: dict[str, Any]
    disabled: AnsibleRun
    after_disabled: dict[str, str]
    switch: tuple[int, str]
    overridden: AnsibleRun
    from_spec: AnsibleRun
    after_from_spec: dict[str, str]


def run_sequence(bed: Bed, workdir: Path) -> Phases:
    good = write(workdir, "good", site("1024"))
    bad = write(workdir, "bad", site("1024", [BAD_FLAG]))
    off = write(workdir, "off", site("1024", enabled=False))
    first = bed.ansible(SITE, *LIMIT, "-e", f"@{write(workdir, 'first', site())}")
    assert first.rc == 0, first.describe()
    pids = {n: main_pid(bed, n) for n in PORTS}
    change = polled(bed, good)
    print(
        f"\nconverge: one-argument change, site.yml wall {change.wall_s:.1f} s; "
        f"{CHANGED} gap {change.polls[CHANGED].get('gap_s', -1):.2f} s, polls {change.polls}"
    )
    after_change = {n: main_pid(bed, n) for n in PORTS}
    argv_after = argv(bed, CHANGED)
    second = bed.ansible(SITE, *LIMIT, "-e", f"@{good}")
    # What `ct200-serve status` says of a process whose files changed after it started, and
    # after its printed fix, pasted.
    bed.ssh("ct", "touch", f"/etc/ct200/servers/{CHANGED}.env")
    stale = bed.ssh("ct", SERVE, "status").stdout
    restart = bed.ssh("ct", "systemctl", "restart", unit(CHANGED))
    current = bed.ssh("ct", SERVE, "status").stdout
    # A unit file put back with an old time (what `cp -p` does) and read by systemd: neither
    # NeedDaemonReload nor the times tell, the process's command line does. Then put back.
    path = f"/etc/systemd/system/{unit(CHANGED)}"
    edit = (
        f"cp -p {path} /root/converge-unit && sed -i 's/--ctx-size 1024/--ctx-size 2048/' {path}"
        f" && touch -d '2001-01-01' {path} && systemctl daemon-reload"
    )
    assert bed.ssh("ct", "sh", "-c", edit).returncode == 0
    argv_stale = bed.ssh("ct", SERVE, "status").stdout
    back = f"cp -p /root/converge-unit {path} && systemctl daemon-reload"
    assert bed.ssh("ct", "sh", "-c", back).returncode == 0

    failed = polled(bed, bad)
    after_bad = {
        "state": state(bed, CHANGED),
        "argv": argv(bed, CHANGED),
        "pids": {n: main_pid(bed, n) for n in PORTS},
        "unit": bed.ssh("ct", "cat", f"/etc/systemd/system/{unit(CHANGED)}").stdout,
        "leftovers": leftovers(bed),
    }
    kept_failed = bed.ansible(
        SITE, *LIMIT, "-e", f"@{bad}", "-e", "inference_servers_rollback=false"
    )
    kept_state = {
        "state": state(bed, CHANGED),
        "unit": bed.ssh("ct", "cat", f"/etc/systemd/system/{unit(CHANGED)}").stdout,
        "kept": leftovers(bed),
        "record": bed.ssh("ct", "cat", KEPT_RECORD).stdout,
    }
    # Disabled in the spec while it is failed: stopped (not failed) in the same play, and the
    # files the failed run kept for debugging go (this run serves).
    disabled = bed.ansible(SITE, *LIMIT, "-e", f"@{off}")
    after_disabled = {n: state(bed, n) for n in PORTS}
    after_disabled["leftovers"] = leftovers(bed) + bed.ssh("ct", "ls", KEPT_RECORD).stdout
    # A switch records a serving set that overrides the spec's flags: the play says so, and
    # ct200_tools_serving_from_spec returns to the flags (CHANGED stops again).
    switch = bed.ssh("ct", SERVE, "switch", CHANGED, timeout=600)
    overridden = bed.ansible(SITE, *LIMIT, "-e", f"@{off}")
    from_spec = bed.ansible(
        SITE, *LIMIT, "-e", f"@{off}", "-e", "ct200_tools_serving_from_spec=true"
    )
    return Phases(
        first,
        pids,
        change,
        after_change,
        argv_after,
        second,
        (stale, restart.returncode, current),
        argv_stale,
        failed,
        after_bad,
        kept_failed,
        kept_state,
        disabled,
        after_disabled,
        (switch.returncode, switch.stdout + switch.stderr),
        overridden,
        from_spec,
        {n: state(bed, n) for n in PORTS},
    )


CLEANUP = (
    f"systemctl stop {unit(KEPT)} {unit(CHANGED)} 'ct200-stage@*.service';"
    " systemctl reset-failed;"
    f" rm -f /etc/systemd/system/{unit(KEPT)} /etc/systemd/system/{unit(CHANGED)}"
    f" /etc/systemd/system/*.wants/{unit(KEPT)} /etc/systemd/system/*.wants/{unit(CHANGED)}"
    f" /etc/ct200/servers/{KEPT}.* /etc/ct200/servers/{CHANGED}.* {STOP};"
    " systemctl daemon-reload"
)


@pytest.fixture(scope="module")
def seq(testbed: Bed) -> Iterator[Phases]:
    bed = testbed
    built = llama_build.ensure()
    prepare_ct(bed.push, bed.workdir, built.binary)
    tools = bed.ansible(
        CONTAINER, *LIMIT, "-e", f"@{write(bed.workdir, 'tools', site())}", "--tags", "tools"
    )
    assert tools.rc == 0, tools.describe()
    try:
        yield run_sequence(bed, bed.workdir)
    finally:
        bed.ssh("ct", "sh", "-c", CLEANUP)


def test_a_changed_server_restarts_and_only_it(seq: Phases) -> None:
    run = seq.change.run
    assert run.rc == 0, run.describe()
    assert seq.pids_after_change[KEPT] == seq.pids[KEPT]
    assert seq.pids_after_change[CHANGED] != seq.pids[CHANGED]
    i = seq.argv_after_change.index("--ctx-size")
    assert seq.argv_after_change[i + 1] == "1024", seq.argv_after_change
    kept = seq.change.polls[KEPT]
    assert kept.get("polls", 0) > 0 and kept["failed"] == 0, seq.change.polls


def test_the_second_run_changes_nothing(seq: Phases) -> None:
    assert seq.second.rc == 0, seq.second.describe()
    assert seq.second.stats[CT]["changed"] == 0, seq.second.describe()


def test_a_bad_change_fails_naming_the_engine_error_and_rolls_back(seq: Phases) -> None:
    run = seq.bad.run
    assert run.rc != 0, run.describe()
    assert f"{CHANGED} did not serve" in run.output, run.describe()
    # llama-server's own words about the flag, from its journal.
    assert BAD_FLAG in run.output and "Rolled back" in run.output, run.describe()
    after = seq.after_bad
    assert after["state"] == "active", after
    assert BAD_FLAG not in after["argv"] and BAD_FLAG not in after["unit"], after
    assert "1024" in after["argv"], after
    assert after["pids"][KEPT] == seq.pids[KEPT], after
    assert after["leftovers"] == "", after
    assert seq.bad.polls[KEPT]["failed"] == 0, seq.bad.polls


def test_status_names_a_process_on_an_older_configuration(seq: Phases) -> None:
    stale, restart_rc, current = seq.status
    env = f"/etc/ct200/servers/{CHANGED}.env"
    assert f"{unit(CHANGED)} is running an older configuration: {env} was written" in stale, stale
    assert f"`systemctl restart {unit(CHANGED)}`" in stale, stale
    assert restart_rc == 0
    assert "older configuration" not in current, current


def test_status_tells_an_older_command_line_when_the_times_cannot(seq: Phases) -> None:
    assert (
        f"{unit(CHANGED)} is running an older configuration: its process's command line is not "
        "its unit's ExecStart=: word "
    ) in seq.argv_stale, seq.argv_stale
    assert "is `1024` where the unit has `2048`" in seq.argv_stale, seq.argv_stale


def test_rollback_false_keeps_the_failed_state(seq: Phases) -> None:
    run = seq.kept_failed
    assert run.rc != 0 and "Not rolled back" in run.output, run.describe()
    assert seq.kept_failed_state["state"] != "active", seq.kept_failed_state
    assert BAD_FLAG in seq.kept_failed_state["unit"]
    # The previous files stay beside the new ones, recorded as kept (the next run that serves
    # removes exactly these).
    kept = seq.kept_failed_state["kept"].split()
    assert kept and all(name.endswith("~") for name in kept), seq.kept_failed_state
    recorded = json.loads(seq.kept_failed_state["record"])
    assert sorted(Path(f).name for f in recorded) == sorted(kept), (recorded, kept)


def test_a_disabled_server_stops_in_the_same_play(seq: Phases) -> None:
    assert seq.disabled.rc == 0, seq.disabled.describe()
    assert seq.after_disabled == {KEPT: "active", CHANGED: "inactive", "leftovers": ""}


def test_a_recorded_serving_set_is_announced_and_one_variable_returns_to_the_spec(
    seq: Phases,
) -> None:
    assert seq.switch[0] == 0, seq.switch[1]
    run = seq.overridden
    assert run.rc == 0, run.describe()
    # The messages as the play gave them (its YAML output wraps and quotes them).
    said = " ".join(messages(run))
    assert "it overrides the spec's enabled flags (they enable conv-a)" in said, run.describe()
    assert "-e ct200_tools_serving_from_spec=true" in said
    assert seq.from_spec.rc == 0, seq.from_spec.describe()
    assert "overrides the spec's enabled flags" not in " ".join(messages(seq.from_spec))
    assert seq.after_from_spec == {KEPT: "active", CHANGED: "inactive"}
