"""Inference server units on the testbed: llama.cpp's llama-server (built once per machine by
testbed/llama_build.py) serving tiny GGUF models, as `command` servers under the very unit template
of the SGLang servers, with the models staged by the real model_staging role.

As a user would, the test first puts the program and the models' persistent copies on the `ct`
machine (tests/server_sites.py: prepare_ct), then converges the container with the site of
tests/server_sites.py (llama_site: one server enabled, the others there to be switched to or to
fail). One fixture runs the whole sequence, phase by phase; each test asserts one part of it.

Each unit's start gate is the real `ct200-doctor gate NAME` the tools role installs (no stand-in,
no bypass): on the testbed's server without GPUs it runs the checks that apply to it (model
staged, engine installed, port free), and the taken-port test checks that it names the process.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from tbharness import AnsibleRun, Bed

from ct200_tools.serve import engines as engine
from ct200_tools.serve.render import render
from ct200_tools.spec import validate
from testbed import llama_build, units
from testbed.machine import hostname
from tests.server_sites import (
    LLAMA,
    SHM_SIZE,
    TRICKY_ALIAS,
    llama_site,
    prepare_ct,
)

pytestmark = pytest.mark.testbed

SITE = "playbooks/site.yml"
CONTAINER = "playbooks/container.yml"
CT = hostname("ct")
LIMIT = ("--limit", f"{CT},localhost")
VENV_BIN = "/opt/ct200/venv/bin"
SERVE = f"{VENV_BIN}/ct200-serve"
DOCTOR = f"{VENV_BIN}/ct200-doctor"
#: Bounds for the polls below, not expectations: the tiny model starts in well under a second.
DEADLINE_S = 180.0
BROKEN = ("tiny-gpu", "tiny-badflag", "tiny-nobin", "tiny-unstaged")

#: One completion from inside the machine (argv[1]: port, argv[2]: max_tokens): prints the
#: HTTP status and the usage, or the error.
COMPLETE = r"""
import json, sys, urllib.request
body = json.dumps({"prompt": "Hello", "max_tokens": int(sys.argv[2]), "temperature": 0.8}).encode()
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/completions", data=body,
                             headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=60) as resp:
        print(json.dumps({"status": resp.status, "usage": json.load(resp)["usage"]}))
except Exception as exc:
    print(json.dumps({"status": None, "error": repr(exc)}))
"""
#: A server unit's main process as the kernel sees it: argv, uid, and its environment.
PROCESS = r"""
import json, os, sys
pid = sys.argv[1]
argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[:-1]
pairs = open(f"/proc/{pid}/environ", "rb").read().decode().split("\0")
env = dict(p.split("=", 1) for p in pairs if "=" in p)
uid = [l.split()[1] for l in open(f"/proc/{pid}/status") if l.startswith("Uid:")][0]
print(json.dumps({"argv": [a.decode() for a in argv], "uid": int(uid), "env": env}))
"""
SHOW = ("ActiveState", "SubState", "Result", "UnitFileState", "NRestarts", "MainPID", "StatusText")


def unit(name: str) -> str:
    return engine.unit_name(name)


def show(bed: Bed, name: str) -> dict[str, str]:
    proc = bed.ssh("ct", "systemctl", "show", f"--property={','.join(SHOW)}", name)
    assert proc.returncode == 0, proc.stderr
    return dict(line.split("=", 1) for line in proc.stdout.splitlines())


def complete(bed: Bed, port: int, tokens: int = 8) -> dict[str, Any]:
    proc = bed.ssh("ct", "python3", "-c", COMPLETE, str(port), str(tokens))
    return dict(json.loads(proc.stdout)) if proc.returncode == 0 else {"error": proc.stderr}


def process(bed: Bed, name: str) -> dict[str, Any]:
    pid = show(bed, unit(name))["MainPID"]
    proc = bed.ssh("ct", "python3", "-c", PROCESS, pid)
    return dict(json.loads(proc.stdout)) if proc.returncode == 0 else {"error": proc.stderr}


def journal(bed: Bed, name: str, lines: int = 200) -> str:
    return bed.ssh(
        "ct", "journalctl", "--no-pager", "--output=cat", f"--lines={lines}", f"--unit={name}"
    ).stdout


def serve(bed: Bed, *args: str) -> tuple[int, dict[str, Any], str]:
    """ct200-serve switch ... --json on the machine: exit status, report, stderr."""
    proc = bed.ssh("ct", SERVE, "switch", *args, "--json", timeout=600)
    try:
        report = dict(json.loads(proc.stdout)["result"])
    except ValueError:
        report = {"unparsed": proc.stdout}
    return proc.returncode, report, proc.stderr


def wait_failed(bed: Bed, names: Sequence[str]) -> dict[str, dict[str, str]]:
    """Polls until each unit stays failed after its restarts (start limit hit), or the deadline
    passes (the tests then see the state it had)."""
    until = time.monotonic() + DEADLINE_S
    states: dict[str, dict[str, str]] = {}
    while time.monotonic() < until:
        states = {n: show(bed, unit(n)) for n in names}
        if all(
            s["ActiveState"] == "failed" and "repeated too quickly" in journal(bed, unit(n))
            for n, s in states.items()
        ):
            return states
        time.sleep(2)
    return states


# -- the sequence, phase by phase --------------------------------------------------------------


@dataclass
class Setup:
    site_file: str
    shm_before: str


def setup(bed: Bed) -> Setup:
    built = llama_build.ensure()
    site_file = prepare_ct(bed.push, bed.workdir, built.binary)
    shm_before = bed.ssh("ct", "findmnt", "--bytes", "-no", "SIZE", "/dev/shm").stdout.strip()
    tools = bed.ansible(CONTAINER, *LIMIT, "-e", f"@{site_file}", "--tags", "tools")
    assert tools.rc == 0, tools.describe()
    gate = bed.ssh("ct", DOCTOR, "gate", "--help")
    assert gate.returncode == 0, f"the installed ct200-doctor has no `gate`: {gate.stderr}"
    return Setup(str(site_file), shm_before)


@dataclass
class Converge:
    run: AnsibleRun
    second: AnsibleRun
    check_after: AnsibleRun
    units: dict[str, dict[str, str]]
    installed: dict[str, str]
    shm: str
    fstab: str
    user: str
    modes: str

    @classmethod
    def record(cls, bed: Bed, s: Setup) -> Converge:
        extra = ("-e", f"@{s.site_file}")
        run = bed.ansible(SITE, *LIMIT, *extra)
        second = bed.ansible(SITE, *LIMIT, *extra)
        check_after = bed.ansible(SITE, *LIMIT, *extra, "--check", "--diff")
        names = [x["name"] for x in llama_site()["servers"]]
        installed = {}
        for n in names:
            for path in (f"/etc/systemd/system/{unit(n)}", engine.env_path(n)):
                installed[path] = bed.ssh("ct", "cat", path).stdout
        dirs = ["/var/lib/ct200", "/etc/ct200/servers", "/etc/ct200/servers/tiny.env"]
        return cls(
            run,
            second,
            check_after,
            {n: show(bed, unit(n)) for n in names},
            installed,
            bed.ssh("ct", "findmnt", "--bytes", "-no", "FSTYPE,SIZE", "/dev/shm").stdout,
            bed.ssh("ct", "grep", "/dev/shm", "/etc/fstab").stdout,
            bed.ssh("ct", "getent", "passwd", "ct200").stdout,
            bed.ssh("ct", "stat", "-c", "%n %a %U %G", *dirs).stdout,
        )


@dataclass
class Serving:
    """`systemctl start` of the converged server, and a completion right after it returned."""

    start_rc: int
    completion: dict[str, Any]
    state: dict[str, str]
    process: dict[str, Any]
    uid: str
    verify: list[units.Problem]


def serving(bed: Bed) -> Serving:
    stop = bed.ssh("ct", "systemctl", "stop", unit("tiny"))
    assert stop.returncode == 0, stop.stderr
    start = bed.ssh("ct", "systemctl", "start", unit("tiny"))
    completion = complete(bed, 8081)  # at once: no wait between start returning and this

    def run(argv: Sequence[str]) -> tuple[int, str, str]:
        proc = bed.ssh("ct", *argv)
        return proc.returncode, proc.stdout, proc.stderr

    paths = [f"/etc/systemd/system/{unit(s['name'])}" for s in llama_site()["servers"]]
    return Serving(
        start.returncode,
        completion,
        show(bed, unit("tiny")),
        process(bed, "tiny"),
        bed.ssh("ct", "id", "-u", "ct200").stdout.strip(),
        units.verify(paths, run),
    )


@dataclass
class Broken:
    """Servers that must not start: each started once by hand, then left to its restarts."""

    start_rc: dict[str, int]
    states: dict[str, dict[str, str]]
    journals: dict[str, str]
    status: dict[str, str]
    restarts_later: dict[str, str]
    port: dict[str, Any] = field(default_factory=dict)


def broken(bed: Bed) -> Broken:
    rcs = {n: bed.ssh("ct", "systemctl", "start", unit(n)).returncode for n in BROKEN}
    states = wait_failed(bed, BROKEN)
    time.sleep(engine.RESTART_SEC + 2)  # a restart would have come by now
    later = {n: show(bed, unit(n))["NRestarts"] for n in BROKEN}
    status = {n: bed.ssh("ct", "systemctl", "status", "--no-pager", unit(n)).stdout for n in BROKEN}
    result = Broken(rcs, states, {n: journal(bed, unit(n)) for n in BROKEN}, status, later)
    # A taken port: another process listens on the server's port first.
    squat = bed.ssh(
        "ct",
        *("systemd-run", "--unit=ct200-test-squatter", "--property=Type=exec"),
        *("python3", "-m", "http.server", "8087", "--bind", "127.0.0.1"),
    )
    assert squat.returncode == 0, squat.stderr
    try:
        time.sleep(1)
        rc = bed.ssh("ct", "systemctl", "start", unit("tiny-port")).returncode
        result.port = {"rc": rc, "journal": journal(bed, unit("tiny-port"), 40)}
    finally:
        bed.ssh("ct", "systemctl", "stop", "ct200-test-squatter", unit("tiny-port"))
    for n in (*BROKEN, "tiny-port"):
        bed.ssh("ct", "systemctl", "reset-failed", unit(n))
    return result


@dataclass
class Switches:
    to_b: tuple[int, dict[str, Any], str]
    state_file: dict[str, Any]
    units_after: dict[str, dict[str, str]]
    completion_b: dict[str, Any]
    process_b: dict[str, Any]
    converge_after: AnsibleRun
    after_reboot: dict[str, dict[str, str]]
    completion_after_reboot: dict[str, Any]
    failed: tuple[int, dict[str, Any], str]
    after_failed: dict[str, str]
    completion_after_failed: dict[str, Any]
    big_1: tuple[int, dict[str, Any], str]
    big_2: tuple[int, dict[str, Any], str]
    staged_after_drop: str
    source_big_1: tuple[str, str]
    back: tuple[int, dict[str, Any], str]


def reboot(bed: Bed) -> None:
    """A reboot, short of rebooting: every server and stage stopped and /dev/shm emptied, then
    what boot does: start multi-user.target, which wants every enabled unit."""
    down = bed.ssh(
        "ct",
        "sh",
        "-ec",
        "systemctl stop 'ct200-server-*.service' 'ct200-stage@*.service'; rm -rf /dev/shm/models",
    )
    assert down.returncode == 0, down.stderr
    up = bed.ssh("ct", "systemctl", "start", "multi-user.target", timeout=300)
    assert up.returncode == 0, up.stderr


def sha256(bed: Bed, path: str) -> str:
    return bed.ssh("ct", "sha256sum", path).stdout.split(" ")[0]


def switches(bed: Bed, s: Setup) -> Switches:
    to_b = serve(bed, "tiny-b")
    state_file = json.loads(bed.ssh("ct", "cat", "/var/lib/ct200/serving.json").stdout or "{}")
    names = ("tiny", "tiny-b")
    units_after = {n: show(bed, unit(n)) for n in names}
    units_after |= {m: show(bed, engine.stage_unit(m)) for m in ("tiny-a", "tiny-b")}
    completion_b, process_b = complete(bed, 8081), process(bed, "tiny-b")
    converge_after = bed.ansible(CONTAINER, *LIMIT, "-e", f"@{s.site_file}")
    reboot(bed)
    after_reboot = {n: show(bed, unit(n)) for n in names}
    completion_after_reboot = complete(bed, 8081)
    failed = serve(bed, "tiny-badflag", "--exact")
    after_failed = show(bed, unit("tiny-b"))
    completion_after_failed = complete(bed, 8081)
    big_source = "/tank/models/tiny-big-1/pad.bin"
    source_before = sha256(bed, big_source)
    big_1 = serve(bed, "tiny-big-1", "--exact")
    big_2 = serve(bed, "tiny-big-2", "--exact")
    staged = bed.ssh("ct", "ls", "-A", "/dev/shm/models").stdout
    back = serve(bed, "tiny", "--exact")
    return Switches(
        to_b,
        state_file,
        units_after,
        completion_b,
        process_b,
        converge_after,
        after_reboot,
        completion_after_reboot,
        failed,
        after_failed,
        completion_after_failed,
        big_1,
        big_2,
        staged,
        (source_before, sha256(bed, big_source)),
        back,
    )


@dataclass
class Servers:
    bed: Bed
    setup: Setup
    converge: Converge
    serving: Serving
    broken: Broken
    switches: Switches


CLEANUP = (
    "systemctl stop 'ct200-server-*.service' 'ct200-stage@*.service' ct200-test-squatter;"
    " systemctl reset-failed;"
    # Enabled units leave links in multi-user.target.wants: gone with their units.
    " rm -rf /tank /dev/shm/models /var/lib/ct200 /var/cache/ct200 /etc/ct200/servers"
    " /etc/systemd/system/ct200-server-* /etc/systemd/system/ct200-stage@*"
    " /etc/systemd/system/*.wants/ct200-server-* /etc/systemd/system/*.wants/ct200-stage@*"
    # The boot report (roles/boot_report), which container.yml installs too, and its textfile.
    " /etc/systemd/system/ct200-boot-report.service"
    " /etc/systemd/system/*.wants/ct200-boot-report.service"
    " /var/lib/prometheus/node-exporter/ct200_boot.prom"
    " /usr/local/bin/llama-server;"
    " sed -i '\\# /dev/shm #d' /etc/fstab;"
    " userdel ct200; groupdel ct200;"
    " systemctl daemon-reload"
)


@pytest.fixture(scope="module")
def servers(testbed: Bed) -> Iterator[Servers]:
    bed = testbed
    s = setup(bed)
    try:
        converge = Converge.record(bed, s)
        assert converge.run.rc == 0, converge.run.describe()
        yield Servers(bed, s, converge, serving(bed), broken(bed), switches(bed, s))
    finally:
        # Back to the machine the other test modules expect: none of this module's units,
        # models, state or user; /dev/shm at its old size.
        bed.ssh("ct", "sh", "-c", CLEANUP)
        if s.shm_before:
            bed.ssh("ct", "mount", "-o", f"remount,size={s.shm_before}", "/dev/shm")


# -- converge ----------------------------------------------------------------------------------


def test_converge_is_idempotent_and_check_mode_truthful(servers: Servers) -> None:
    c = servers.converge
    assert c.run.stats[CT]["failures"] == 0 and c.run.stats[CT]["changed"] > 0, c.run.describe()
    for run in (c.second, c.check_after):
        assert run.rc == 0, run.describe()
        changed = {host: st["changed"] for host, st in run.stats.items() if st["changed"]}
        assert not changed, run.describe()


def test_every_server_has_a_unit_and_only_the_serving_set_runs(servers: Servers) -> None:
    units_ = servers.converge.units
    assert units_["tiny"]["ActiveState"] == "active", units_["tiny"]
    assert units_["tiny"]["UnitFileState"] == "enabled"
    for name, state in units_.items():
        if name != "tiny":
            assert (state["ActiveState"], state["UnitFileState"]) == ("inactive", "disabled"), name


def test_installed_files_are_what_python_renders(servers: Servers) -> None:
    """What the doctor will compare: the role's files equal ct200_tools.serve.render's, byte for
    byte."""
    site = validate(llama_site())
    for s in site.servers:
        files = render(site, s.name, VENV_BIN).files(s.name)
        for path, text in files.items():
            assert servers.converge.installed[path] == text, path


def test_shm_user_and_directories(servers: Servers) -> None:
    c = servers.converge
    assert c.shm.split() == ["tmpfs", str(96 << 20)]
    assert c.fstab.strip() == f"tmpfs /dev/shm tmpfs rw,nosuid,nodev,size={SHM_SIZE} 0 0"
    fields = c.user.strip().split(":")
    assert (fields[0], fields[5], fields[6]) == ("ct200", "/var/lib/ct200", "/usr/sbin/nologin")
    assert c.modes.splitlines() == [
        "/var/lib/ct200 755 root root",
        "/etc/ct200/servers 750 root ct200",
        "/etc/ct200/servers/tiny.env 640 root ct200",
    ]


# -- serving -----------------------------------------------------------------------------------


def test_start_returns_once_it_serves(servers: Servers) -> None:
    got = servers.serving
    assert got.start_rc == 0
    assert got.completion.get("status") == 200, got.completion
    # The tiny model never stops early: every request runs to max_tokens.
    assert got.completion["usage"]["completion_tokens"] == 8
    assert got.state["StatusText"].startswith(
        "serving: GET http://127.0.0.1:8081/health answered 200"
    ), got.state


def test_the_server_runs_as_the_unit_says(servers: Servers) -> None:
    proc = servers.serving.process
    site = validate(llama_site())
    assert proc["argv"] == engine.argv(site, site.servers[0])
    assert str(proc["uid"]) == servers.serving.uid
    env = proc["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == "" and "CUDA_DEVICE_ORDER" not in env
    assert env["HOME"] == "/var/cache/ct200/servers/tiny"


def test_installed_units_verify_clean(servers: Servers) -> None:
    """Every installed unit but tiny-nobin's, whose program is missing on purpose: systemd says
    so, and nothing else."""
    problems = {p.unit.rsplit("/", 1)[1]: p.output for p in servers.serving.verify}
    nobin = problems.pop(unit("tiny-nobin"), "")
    assert not problems, problems
    assert nobin == f"{unit('tiny-nobin')}: Command {LLAMA}-missing is not executable: " + (
        "No such file or directory"
    )


# -- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", BROKEN)
def test_a_broken_server_fails_and_stops_restarting(servers: Servers, name: str) -> None:
    b = servers.broken
    assert b.start_rc[name] != 0
    state = b.states[name]
    assert state["ActiveState"] == "failed", state
    assert "Start request repeated too quickly" in b.journals[name]
    # Restarted up to the limit, then no more: StartLimitBurst=3 starts in the interval.
    assert int(state["NRestarts"]) == engine.START_LIMIT_BURST, state
    assert b.restarts_later[name] == state["NRestarts"]


def test_a_broken_gpu_gate_fails_with_the_doctors_message(servers: Servers) -> None:
    text = servers.broken.journals["tiny-gpu"]
    # The doctor's report (a failed GPU check by its id, with its fix) is in the unit's journal.
    assert "ct200-doctor" in text, text[-3000:]
    assert re.search(r"\[✗\] (driver|dev|gpu)\.\w+", text), text[-3000:]
    assert "fix" in text
    # The engine never ran: the gate failed first.
    assert "llama_server: initializing" not in text


def test_a_bad_flag_fails_with_the_engines_message(servers: Servers) -> None:
    text = servers.broken.journals["tiny-badflag"]
    assert "--no-such-flag" in text, text[-3000:]
    # The readiness poll saw the engine exit and ended the start at once, not at its deadline.
    assert "exited after" in text and "before it served" in text, text[-3000:]
    assert "does not serve after" not in text


def test_a_missing_program_fails_in_preflight_with_path_and_fix(servers: Servers) -> None:
    b = servers.broken
    text = b.journals["tiny-nobin"]
    assert f"engine: {LLAMA}-missing does not exist" in text
    assert "fix: install the server's program there, or correct servers[4].command[0]" in text
    assert f"preflight failed: engine: {LLAMA}-missing does not exist" in b.status["tiny-nobin"]


def test_a_model_not_staged_is_named_by_systemctl_status(servers: Servers) -> None:
    status = servers.broken.status["tiny-unstaged"]
    assert "preflight failed: model tiny-missing: not staged at /dev/shm/models/tiny-missing" in (
        status
    ), status
    assert "ct200-stage@tiny-missing.service is failed" in status


def test_a_taken_port_fails_the_start_naming_what_holds_it(servers: Servers) -> None:
    port = servers.broken.port
    assert port["rc"] != 0
    # The real gate names the holder (a python3 listener the test started).
    assert "python3" in port["journal"], port["journal"]


# -- switching -------------------------------------------------------------------------------------


def test_switch_stops_what_is_in_the_way_stages_starts_and_records(servers: Servers) -> None:
    rc, report, err = servers.switches.to_b
    assert rc == 0, (report, err)
    steps = {s["step"]: s for s in report["steps"]}
    assert list(steps) == ["plan", "stop", "stage", "start", "persist"]
    assert [i["name"] for i in steps["stop"]["items"]] == ["tiny"]
    assert [i["name"] for i in steps["stage"]["items"]] == ["tiny-b"]
    assert [i["name"] for i in steps["start"]["items"]] == ["tiny-b"]
    assert all(s["seconds"] >= 0 for s in report["steps"])
    assert report["serving"] == {"tiny-b": "serving"} and report["previous"] == ["tiny"]
    assert servers.switches.state_file["servers"] == ["tiny-b"]
    u = servers.switches.units_after
    assert (u["tiny"]["ActiveState"], u["tiny"]["UnitFileState"]) == ("inactive", "disabled")
    assert (u["tiny-b"]["ActiveState"], u["tiny-b"]["UnitFileState"]) == ("active", "enabled")
    assert u["tiny-a"]["UnitFileState"] == "disabled" and u["tiny-b"]["UnitFileState"] == "enabled"
    assert servers.switches.completion_b.get("status") == 200


def test_argv_and_env_reach_the_process_exactly(servers: Servers) -> None:
    proc = servers.switches.process_b
    assert proc["argv"][proc["argv"].index("--alias") + 1] == TRICKY_ALIAS
    assert proc["env"]["NCCL_DEBUG"] == "WARN"


def test_the_playbook_keeps_the_switched_set(servers: Servers) -> None:
    run = servers.switches.converge_after
    assert run.rc == 0, run.describe()
    assert run.stats[CT]["changed"] == 0, run.describe()


def test_a_reboot_brings_the_same_set_back(servers: Servers) -> None:
    after = servers.switches.after_reboot
    assert after["tiny-b"]["ActiveState"] == "active" and after["tiny"]["ActiveState"] == "inactive"
    assert servers.switches.completion_after_reboot.get("status") == 200


def test_a_failed_switch_restores_the_previous_set(servers: Servers) -> None:
    rc, report, _ = servers.switches.failed
    assert rc == 1, report
    assert report["restored"] is True and report["failure"].startswith("start: tiny-badflag")
    assert report["serving"] == {"tiny-b": "serving"}
    assert [s["step"] for s in report["steps"]][-1] == "restore"
    assert servers.switches.after_failed["ActiveState"] == "active"
    assert servers.switches.completion_after_failed.get("status") == 200


def test_a_model_that_would_not_fit_is_dropped_never_its_source(servers: Servers) -> None:
    rc1, first, _ = servers.switches.big_1
    assert rc1 == 0, first
    assert "drop" not in [s["step"] for s in first["steps"]]
    rc2, second, err = servers.switches.big_2
    assert rc2 == 0, (second, err)
    steps = {s["step"]: s for s in second["steps"]}
    assert [i["name"] for i in steps["drop"]["items"]] == ["tiny-big-1"]
    staged = servers.switches.staged_after_drop.split()
    assert "tiny-big-2" in staged and "tiny-big-1" not in staged
    before, after = servers.switches.source_big_1
    assert before == after and len(before) == 64


def test_switching_back(servers: Servers) -> None:
    rc, report, err = servers.switches.back
    assert rc == 0, (report, err)
    assert report["serving"] == {"tiny": "serving"}


def test_serve_playbook_switches(servers: Servers) -> None:
    """playbooks/serve.yml runs the same command; --check prints the plan and changes nothing."""
    bed = servers.bed
    check = bed.ansible(
        "playbooks/serve.yml",
        *LIMIT,
        "-e",
        f"@{servers.setup.site_file}",
        "-e",
        "ct200_serve=tiny-b",
        "--check",
    )
    assert check.rc == 0, check.describe()
    assert show(bed, unit("tiny"))["ActiveState"] == "active"
    run = bed.ansible(
        "playbooks/serve.yml",
        *LIMIT,
        "-e",
        f"@{servers.setup.site_file}",
        "-e",
        "ct200_serve=tiny-b",
    )
    assert run.rc == 0 and run.stats[CT]["changed"] == 1, run.describe()
    again = bed.ansible(
        "playbooks/serve.yml",
        *LIMIT,
        "-e",
        f"@{servers.setup.site_file}",
        "-e",
        "ct200_serve=tiny-b",
    )
    assert again.rc == 0 and again.stats[CT]["changed"] == 0, again.describe()
    assert show(bed, unit("tiny-b"))["ActiveState"] == "active"
