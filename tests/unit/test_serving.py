"""The serving set (ct200_tools.serve.serving), the switch's plan and steps
(ct200_tools.serve.switch), preflight and the readiness poll, on the CT200 example.

Planning is a pure function of the spec, the recorded set and what systemd says; the steps run
against ScriptedSystemctl, a stand-in for systemctl that keeps unit states in memory (this
controller has no systemd as PID 1). tests/testbed/test_servers.py switches real units.
"""

from __future__ import annotations

import base64
import dataclasses
import http.server
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from ct200_tools.httpclient import Answer
from ct200_tools.serve import engines as engine
from ct200_tools.serve import notify, serving
from ct200_tools.serve.preflight import Preflight
from ct200_tools.serve.ready import process_alive, wait_ready
from ct200_tools.serve.serving import ServingError, ServingSet, ServingState
from ct200_tools.serve.switch import Machine, ModelState, Switch, choose_drops, plan
from ct200_tools.serve.systemd import Systemd, UnitState, parse_show
from ct200_tools.spec import SiteSpec, load_spec, validate
from tests.unit.spec_helpers import EXAMPLE_DIR, changed

QWEN = ("qwen-tp4-ddtree", "qwen-tp4-dflash")
KIMI = "kimi-tp8-eagle3"


@pytest.fixture(scope="module")
def site() -> SiteSpec:
    return load_spec(EXAMPLE_DIR)


def units(site: SiteSpec, running: Sequence[str] = (), enabled: Sequence[str] = ()) -> Machine:
    states = {}
    for s in site.servers:
        unit = engine.unit_name(s.name)
        active = "active" if s.name in running else "inactive"
        state = "enabled" if s.name in enabled else "disabled"
        states[unit] = UnitState(unit, "loaded", active, "running", "success", state)
    loaded = {m.name for m in site.needed_models(s for s in site.servers if s.name in enabled)}
    for m in site.models:
        unit = engine.stage_unit(m.name)
        state = "enabled" if m.name in loaded else "disabled"
        states[unit] = UnitState(unit, "loaded", "inactive", "dead", "success", state)
    return Machine(states)


# -- the recorded set ---------------------------------------------------------------------------


def test_state_round_trips_atomically(tmp_path: Path) -> None:
    path = str(tmp_path / "serving.json")
    assert serving.read_state(path) is None
    serving.write_state(ServingState((KIMI,), "2026-01-01T00:00:00+00:00"), path)
    assert serving.read_state(path) == ServingState((KIMI,), "2026-01-01T00:00:00+00:00")
    assert json.loads(Path(path).read_text())["kind"] == serving.KIND
    assert [p.name for p in tmp_path.iterdir()] == ["serving.json"]  # no temp file left
    assert oct(Path(path).stat().st_mode & 0o777) == "0o644"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{", "not JSON"),
        ("[]", "not a serving set"),
        ('{"kind": "ct200-serving-set", "schema_version": 9, "servers": []}', "schema_version 9"),
        ('{"kind": "ct200-serving-set", "schema_version": 1, "servers": [1]}', "server names"),
    ],
)
def test_a_damaged_state_names_the_file_and_the_fix(text: str, fragment: str) -> None:
    with pytest.raises(ServingError) as caught:
        serving.parse(text, "/var/lib/ct200/serving.json")
    assert fragment in caught.value.message
    assert "/var/lib/ct200/serving.json" in caught.value.message
    assert "ct200-serve switch" in caught.value.fix


def test_a_state_file_that_is_not_utf8_names_the_file_and_the_fix(tmp_path: Path) -> None:
    """A damaged serving.json (a byte that is not UTF-8) is a clear error, not an internal one:
    `ct200-serve chain` (at every boot, and recover.yml's) reads it first."""
    path = tmp_path / "serving.json"
    path.write_bytes(b'{"kind": "ct200-serving-set", "servers": ["\xff"]}')
    with pytest.raises(ServingError) as caught:
        serving.read_state(str(path))
    assert "not UTF-8" in caught.value.message and str(path) in caught.value.message
    assert "ct200-serve switch" in caught.value.fix


def test_absent_state_means_the_enabled_servers(site: SiteSpec) -> None:
    chosen = serving.serving_set(site, None)
    assert (chosen.names, chosen.source) == (QWEN, "spec")


def test_state_names_servers_in_spec_order_and_ignores_unknown(site: SiteSpec) -> None:
    chosen = serving.serving_set(site, ServingState((QWEN[1], "gone", QWEN[0])))
    assert chosen.names == QWEN and chosen.unknown == ("gone",)


def test_resolve_and_check_set(site: SiteSpec) -> None:
    with pytest.raises(ServingError) as caught:
        serving.resolve(site, ["kimi-tp8-eagel3"])
    assert "did you mean 'kimi-tp8-eagle3'" in caught.value.message
    with pytest.raises(ServingError) as clash:
        serving.check_set(serving.resolve(site, [QWEN[0], KIMI]))
    assert "GPUs 0, 1, 2, 3" in clash.value.message
    serving.check_set(serving.resolve(site, QWEN))


def test_the_ansible_filter_is_the_same_code(site: SiteSpec) -> None:
    path = Path(__file__).parents[2] / "roles/ct200_tools/filter_plugins/ct200_serving.py"
    spec = importlib.util.spec_from_file_location("ct200_serving_filter", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    raw = changed({})
    assert module.ct200_serving_set(None, raw) == {
        "servers": list(QWEN),
        "models": ["qwen3.6-27b", "qwen3.6-27b-dflash"],
        "source": "spec",
        "unknown": [],
    }
    content = base64.b64encode(ServingState((KIMI, "old")).to_json().encode()).decode()
    assert module.ct200_serving_set(content, raw)["models"] == ["kimi-k2.6", "kimi-k2.6-eagle3"]
    with pytest.raises(Exception, match="not JSON"):
        module.ct200_serving_set(base64.b64encode(b"{").decode(), raw)


# -- the plan -----------------------------------------------------------------------------------


def test_switch_to_kimi_stops_both_qwen_servers(site: SiteSpec) -> None:
    previous = serving.serving_set(site, None)
    p = plan(site, previous, [KIMI], units(site, QWEN, QWEN))
    assert [s.name for s in p.stop] == list(QWEN)
    assert [s.name for s in p.start] == [KIMI] and p.names == (KIMI,)
    assert [m.name for m in p.stage] == ["kimi-k2.6", "kimi-k2.6-eagle3"]
    assert p.enable == (
        "ct200-server-kimi-tp8-eagle3.service",
        "ct200-stage@kimi-k2.6-eagle3.service",
        "ct200-stage@kimi-k2.6.service",
    )
    qwen_models = ("qwen3.6-27b", "qwen3.6-27b-dflash")
    assert p.disable == tuple(
        sorted([*(engine.unit_name(n) for n in QWEN), *map(engine.stage_unit, qwen_models)])
    )
    assert p.write_state and p.changed


def test_only_the_servers_in_the_way_stop() -> None:
    """A TP4 server on node 0 replaced; the one on node 1 keeps serving, and stays in the set."""
    site = validate(changed({"servers[2].gpus": [0, 1, 2, 3], "servers[2].port": 30002}))
    previous = serving.serving_set(site, None)
    p = plan(site, previous, ["kimi-tp8"], units(site, QWEN, QWEN))
    assert [s.name for s in p.stop] == ["qwen-tp4-ddtree"]
    assert [s.name for s in p.keep] == ["qwen-tp4-dflash"]
    assert p.names == ("qwen-tp4-dflash", "kimi-tp8")
    exact = plan(site, previous, ["kimi-tp8"], units(site, QWEN, QWEN), exact=True)
    assert [s.name for s in exact.stop] == list(QWEN) and exact.names == ("kimi-tp8",)


def test_a_port_in_the_way_stops_its_server_too() -> None:
    site = validate(changed({"servers[2].gpus": [0, 1, 2, 3], "servers[2].port": 30001}))
    p = plan(site, serving.serving_set(site, None), ["kimi-tp8"], units(site, QWEN))
    assert [s.name for s in p.stop] == list(QWEN)


def test_serving_what_serves_changes_nothing(site: SiteSpec) -> None:
    previous = serving.serving_set(site, None)
    p = plan(site, previous, list(QWEN), units(site, QWEN, QWEN))
    assert not p.changed and not p.stage and not p.stop


def test_a_set_that_cannot_run_or_an_uninstalled_unit_is_refused(site: SiteSpec) -> None:
    previous = serving.serving_set(site, None)
    with pytest.raises(ServingError, match="cannot run together"):
        plan(site, previous, ["kimi-tp8", KIMI], units(site))
    machine = units(site)
    del machine.units[engine.unit_name(KIMI)]
    with pytest.raises(ServingError, match="not installed: ct200-server-kimi-tp8-eagle3"):
        plan(site, previous, [KIMI], machine)


def test_drops_only_what_no_target_server_loads_largest_first(site: SiteSpec) -> None:
    models = {
        "qwen3.6-27b": ModelState(staged=54 << 30, need=54 << 30),
        "qwen3.6-27b-dflash": ModelState(staged=2 << 30, need=2 << 30),
        "kimi-k2.6": ModelState(staged=None, need=595 << 30),
        "kimi-k2.6-eagle3": ModelState(staged=None, need=3 << 30),
    }
    machine = Machine(units(site, QWEN).units, models)
    p = plan(site, serving.serving_set(site, None), [KIMI], machine)
    assert [m.name for m in p.droppable] == ["qwen3.6-27b", "qwen3.6-27b-dflash"]
    assert choose_drops(p.stage, p.droppable, models, 600 << 30) == ((), 598 << 30)
    drops, _ = choose_drops(p.stage, p.droppable, models, 560 << 30)
    assert [m.name for m in drops] == ["qwen3.6-27b"]
    drops, _ = choose_drops(p.stage, p.droppable, models, 10 << 30)
    assert [m.name for m in drops] == ["qwen3.6-27b", "qwen3.6-27b-dflash"]
    assert choose_drops(p.stage, p.droppable, models, None) == ((), 598 << 30)


# -- the steps, against a stand-in for systemctl -------------------------------------------------


class ScriptedSystemctl:
    """A stand-in for systemctl and journalctl (this controller has no systemd): unit states in
    memory; `start` of a unit in `fails` fails with a journal line."""

    def __init__(self, site: SiteSpec, running: Sequence[str], fails: Sequence[str] = ()) -> None:
        self.machine = units(site, running, running)
        self.fails = {engine.unit_name(n) for n in fails}
        self.calls: list[list[str]] = []

    def set(self, unit: str, **changes: str) -> None:
        state = self.machine.units[unit]
        self.machine.units[unit] = UnitState(
            unit,
            state.load,
            changes.get("active", state.active),
            state.sub,
            changes.get("result", state.result),
            changes.get("file_state", state.file_state),
        )

    def __call__(self, argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
        self.calls.append(list(argv))
        if argv[0] == "journalctl":
            return 0, "preflight: engine: /usr/bin/llama-server does not exist\n", ""
        verb, names = argv[1], [a for a in argv[2:] if not a.startswith("--")]
        if verb == "show":
            blocks = []
            for n in names:
                s = self.machine.units[n]
                blocks.append(
                    f"Id={n}\nLoadState={s.load}\nActiveState={s.active}\nSubState={s.sub}\n"
                    f"Result={s.result}\nUnitFileState={s.file_state}\n"
                )
            return 0, "\n".join(blocks), ""
        for n in names:
            if verb == "start" and n in self.fails:
                self.set(n, active="failed", result="exit-code")
                return 1, "", f"Job for {n} failed."
            if verb in ("start", "stop"):
                self.set(n, active="active" if verb == "start" else "inactive")
            elif verb in ("enable", "disable"):
                self.set(n, file_state=f"{verb}d")
        return 0, "", ""


def switch(site: SiteSpec, tmp_path: Path, fake: ScriptedSystemctl) -> tuple[Switch, str]:
    path = str(tmp_path / "serving.json")
    sw = Switch(
        site,
        Systemd(fake),
        state_path=path,
        machine=lambda s, d: Machine(dict(fake.machine.units)),
        room=lambda s, m: None,
    )
    return sw, path


def test_switch_runs_every_step_and_records_the_set(site: SiteSpec, tmp_path: Path) -> None:
    fake = ScriptedSystemctl(site, QWEN)
    sw, path = switch(site, tmp_path, fake)
    report = sw.run([KIMI])
    assert report.ok and report.changed and report.serving == {KIMI: "serving"}
    assert report.warnings == (
        "kimi-tp8-eagle3: GPUs 0, 1, 2, 3, 4, 5, 6, 7 span NUMA nodes 0, 1: TP across the "
        "inter-socket link was measured slower than TP4 on CT200 for single requests",
    )
    assert [s.name for s in report.steps] == ["plan", "stop", "stage", "start", "persist"]
    assert serving.read_state(path) is not None
    assert serving.read_state(path).servers == (KIMI,)  # type: ignore[union-attr]
    assert fake.machine.units[engine.unit_name(KIMI)].active == "active"
    assert fake.machine.units[engine.unit_name(KIMI)].file_state == "enabled"
    assert all(fake.machine.units[engine.unit_name(n)].active == "inactive" for n in QWEN)
    assert all(fake.machine.units[engine.unit_name(n)].file_state == "disabled" for n in QWEN)
    again = Switch(
        site, Systemd(fake), state_path=path, machine=lambda s, d: Machine(dict(fake.machine.units))
    ).run([KIMI])
    assert again.ok and not again.changed and [s.name for s in again.steps] == ["plan", "persist"]


def test_a_failed_start_restores_the_previous_set(site: SiteSpec, tmp_path: Path) -> None:
    fake = ScriptedSystemctl(site, QWEN, fails=[KIMI])
    sw, path = switch(site, tmp_path, fake)
    report = sw.run([KIMI])
    assert not report.ok and report.restored is True
    assert report.failure.startswith("start: kimi-tp8-eagle3: preflight: engine:")
    assert report.serving == dict.fromkeys(QWEN, "serving")
    assert [s.name for s in report.steps][-1] == "restore"
    assert serving.read_state(path) is None  # the choice is not recorded
    assert all(fake.machine.units[engine.unit_name(n)].file_state == "enabled" for n in QWEN)
    assert fake.machine.units[engine.unit_name(KIMI)].active == "inactive"


def test_a_restore_that_fails_says_what_does_not_serve(site: SiteSpec, tmp_path: Path) -> None:
    fake = ScriptedSystemctl(site, QWEN, fails=[KIMI, QWEN[1]])
    sw, _ = switch(site, tmp_path, fake)
    report = sw.run([KIMI])
    assert not report.ok and report.restored is False
    assert report.serving[QWEN[0]] == "serving"
    assert report.serving[QWEN[1]].startswith("not serving: preflight: engine:")


def test_dry_run_changes_nothing(site: SiteSpec, tmp_path: Path) -> None:
    fake = ScriptedSystemctl(site, QWEN)
    sw, path = switch(site, tmp_path, fake)
    report = sw.run([KIMI], dry_run=True)
    assert report.ok and report.changed and report.dry_run
    assert [c[1] for c in fake.calls] == []  # the machine was read through `machine=`
    assert serving.read_state(path) is None


def test_parse_show_keeps_the_names_asked_for() -> None:
    text = "Id=a.service\nActiveState=active\n\nId=alias.service\nActiveState=failed\nResult=x\n"
    got = parse_show(text, ["a.service", "b.service"])
    assert got["a.service"].running and got["b.service"].describe() == "failed, result x"


# -- preflight ----------------------------------------------------------------------------------


def cpu_site(program: str) -> SiteSpec:
    return validate(
        changed(
            {
                "servers[1].engine": "command",
                "servers[1].speculative": None,
                "servers[1].gpus": [],
                "servers[1].command": [program, "--port", "30001"],
            }
        )
    )


def test_preflight_names_a_missing_program_and_the_fix(tmp_path: Path) -> None:
    site = cpu_site(str(tmp_path / "llama-server"))
    server = site.servers[1]
    fake = ScriptedSystemctl(site, ())
    check = Preflight(site, server, Systemd(fake), staged=lambda m: (True, ""))
    (problem,) = check.problems()
    assert problem.what == "engine"
    assert problem.message == f"{tmp_path}/llama-server does not exist (or is hidden from it)"
    assert "servers[1].command[0]" in problem.fix
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    assert check.problems() == []


def test_preflight_names_the_model_that_is_not_staged(tmp_path: Path) -> None:
    site = cpu_site("/bin/sh")
    server = site.servers[1]
    fake = ScriptedSystemctl(site, ())
    fake.set("ct200-stage@qwen3.6-27b.service", active="failed", result="exit-code")
    check = Preflight(site, server, Systemd(fake), staged=lambda m: (False, "nothing staged"))
    (problem,) = check.problems()
    assert problem.what == "model qwen3.6-27b"
    assert "ct200-stage@qwen3.6-27b.service is failed" in problem.message
    assert "journalctl -u ct200-stage@qwen3.6-27b.service" in problem.fix


def test_preflight_restages_a_damaged_copy_with_the_owned_target_replace(tmp_path: Path) -> None:
    """Issue 19: for a damaged copy (something at the staged path, not matching) the preflight
    printed `systemctl restart ct200-stage@X`, whose stage refuses to overwrite it."""
    import dataclasses  # noqa: PLC0415

    site = cpu_site("/bin/sh")
    model = next(m for m in site.models if m.name == "qwen3.6-27b")
    damaged = tmp_path / "qwen"
    damaged.mkdir()
    models = tuple(
        dataclasses.replace(m, staged=str(damaged)) if m is model else m for m in site.models
    )
    site = dataclasses.replace(site, models=models)
    server = site.servers[1]
    fake = ScriptedSystemctl(site, ())
    fake.set("ct200-stage@qwen3.6-27b.service", active="active")
    check = Preflight(site, server, Systemd(fake), staged=lambda m: (False, "changed since"))
    (problem,) = check.problems()
    assert problem.fix.startswith(
        "`ct200-stage stage qwen3.6-27b --spec /etc/ct200/site.yml --replace` restages it"
    ), problem.fix
    assert "systemctl restart" not in problem.fix


def test_preflight_finds_an_engine_module_with_the_engine_python(site: SiteSpec) -> None:
    server = site.servers[0]
    calls: list[list[str]] = []

    def run(argv: Sequence[str], timeout: float) -> int:
        calls.append(list(argv))
        return 1

    check = Preflight(site, server, staged=lambda m: (True, ""), run=run)
    (problem,) = check.program()
    assert problem.message == "/usr/bin/python3 has no sglang package"
    assert calls[0][0] == "/usr/bin/python3" and calls[0][-1] == "sglang"


# -- readiness ----------------------------------------------------------------------------------


@pytest.fixture
def http_server() -> Iterator[tuple[str, list[int]]]:
    """A real HTTP server on localhost that answers the statuses listed, then 200."""
    script = [503, 503]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(script.pop(0) if script else 200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/health", script
    server.shutdown()
    server.server_close()


def test_wait_ready_returns_at_the_first_200(http_server: tuple[str, list[int]]) -> None:
    url, _ = http_server
    got = wait_ready(url, 30)
    assert got.ok and got.polls == 3 and got.last == "200 OK" and got.status == 200


def test_wait_ready_gives_up_at_the_deadline_saying_what_it_got() -> None:
    now = [0.0]

    def get(url: str, timeout: float) -> Answer:
        raise OSError("connection refused")

    def sleep(s: float) -> None:
        now[0] += s

    got = wait_ready("http://127.0.0.1:1/health", 5, get=get, clock=lambda: now[0], sleep=sleep)
    assert not got.ok and got.last == "connection refused" and got.seconds <= 5


def test_serving_set_of_an_empty_state_is_empty(site: SiteSpec) -> None:
    assert serving.serving_set(site, ServingState(())) == ServingSet((), "serving.json")


def test_status_line_reaches_the_notify_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What systemd receives from the unit's ExecStartPre and ExecStartPost (NotifyAccess=exec)."""
    address = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(address)
        monkeypatch.setenv("NOTIFY_SOCKET", address)
        assert notify.status("preflight failed:\n  model x")
        assert sock.recv(1024) == b"STATUS=preflight failed: model x"
        # A control character left in the text is escaped; our own backslashes stay as they are.
        assert notify.status("got \x1b[2J\x07 from C:\\x")
        assert sock.recv(1024) == b"STATUS=got \\x1b[2J\\x07 from C:\\x"
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert not notify.status("outside a unit")


def test_wait_ready_stops_when_the_engine_is_gone() -> None:
    """systemd lets ExecStartPost run on after the main process died: the poll must notice."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    got = wait_ready("http://127.0.0.1:1/health", 60, alive=process_alive(proc.pid))
    assert got.exited and not got.ok and got.polls == 0
    assert process_alive(os.getpid())()


def test_a_damaged_serving_set_prints_a_command_that_repairs_it_when_pasted(
    tmp_path: Path,
) -> None:
    """The command in backquotes is whole: pasted, the damaged file is gone and the spec's
    enabled servers rule (issue 19's fault matrix: `ct200-serve switch NAME...` in backquotes
    was pasted as a server named NAME...)."""
    state = tmp_path / "serving.json"
    state.write_text('{"servers": []}\n')
    with pytest.raises(serving.ServingError) as err:
        serving.read_state(state)
    commands = err.value.fix.split("`")[1::2]
    assert commands == [f"rm -f {state}"], err.value.fix
    subprocess.run(["bash", "-c", commands[0]], check=True, timeout=10)
    assert serving.read_state(state) is None


def test_a_wanted_server_on_an_older_configuration_is_restarted(site: SiteSpec) -> None:
    """Issue 33: a switch that serves a server whose process predates its files restarts it (stop,
    then start), and only it; the other running server of the set is kept."""
    previous = serving.serving_set(site, None)
    machine = units(site, QWEN, QWEN)
    stale = dataclasses.replace(machine, stale=frozenset({engine.unit_name(QWEN[0])}))
    p = plan(site, previous, list(QWEN), stale)
    assert [s.name for s in p.stop] == [QWEN[0]] and [s.name for s in p.start] == [QWEN[0]]
    assert [s.name for s in p.keep] == [QWEN[1]] and p.changed


def test_the_kept_files_record_names_only_paths() -> None:
    """roles/inference_servers' record of the files a failed run kept: a damaged one names
    nothing, so nothing is removed by it."""
    path = Path(__file__).parents[2] / "roles/inference_servers/filter_plugins/ct200_render.py"
    spec = importlib.util.spec_from_file_location("ct200_render_filter", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kept = module.FilterModule().filters()["ct200_kept_files"]

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    good = ["/etc/systemd/system/ct200-server-a.service.1.2026-12-06@08:00:00~"]
    assert kept(b64(json.dumps([*good, 3, None]).encode())) == good
    for damaged in (b64(b'["/etc/x~"'), b64(b'{"a": 1}'), "not base64!", None, ""):
        assert kept(damaged) == [], damaged
