"""One contract between the server units and the doctor, after the two halves of issue 11 were
merged: where the unit side (ct200_tools/serve/engine.py) and the doctor side
(ct200_tools/serve/engines.py) disagreed, and where the doctor read the serving set with a reader of
its own. Each test shows the disagreement gone, against real files, real programs and the real
systemd of this machine where one is needed.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ct200_tools.doctor.checks import run_checks
from ct200_tools.doctor.checks.base import Context, Finding
from ct200_tools.doctor.probes.base import Reader
from ct200_tools.doctor.probes.engine import probe_engine
from ct200_tools.doctor.probes.serving import probe_serving
from ct200_tools.facts import Facts, ServerFacts, loads
from ct200_tools.serve import engines, serving
from ct200_tools.serve.preflight import Preflight, find_program
from ct200_tools.serve.serving import ServingState
from ct200_tools.spec import ServerSpec, SiteSpec, load_spec
from tests.unit import server_facts as sf

ROOT = Path(__file__).parents[2]
FIX = ROOT / "tests" / "fixtures"
KIMI = "kimi-tp8-eagle3"
QWEN = ("qwen-tp4-ddtree", "qwen-tp4-dflash")
#: The checks that judge per-server things: only the servers selected to serve.
PER_SERVER = ("topo.tp_numa", "topo.p2p", "mem.shm", "mem.headroom", "models.staged", "server.")


@pytest.fixture(scope="module")
def ct200() -> SiteSpec:
    return load_spec(ROOT / "inventory" / "ct200")


# -- one engines module ---------------------------------------------------------------------------


def test_served_name_is_what_the_unit_serves(ct200: SiteSpec) -> None:
    """The unit side read args.served_model_name, the doctor only served-model-name: the unit
    served "qwen" while server.models asked /v1/models for the model's name."""
    server = dataclasses.replace(ct200.servers[0], args={"served_model_name": "qwen"})
    assert engines.sglang_config(ct200, server)["served-model-name"] == "qwen"
    assert engines.served_name(server) == "qwen"
    # The doctor's rule for engine command (the unit side had none): its own --alias.
    llama = ServerSpec("l", "command", "tiny", (), 8080, 0, command=("llama-server", "-a", "t"))
    assert engines.served_name(llama) == "t"


def test_the_search_path_is_systemds() -> None:
    """The unit side left /sbin and /bin out; systemd 252 (Debian 12, PVE 8) searches them."""
    if shutil.which("systemd-path") is None:
        pytest.skip("no systemd-path here to ask")
    said = subprocess.run(
        ["systemd-path", "search-binaries-default"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert said == engines.SYSTEMD_PATH_TEXT


def _program(path: Path) -> None:
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)


def test_the_servers_env_path_does_not_find_a_bare_program(tmp_path: Path, ct200: SiteSpec) -> None:
    """The doctor looked a bare command[0] up on the server's env PATH; systemd does not (the
    unit's environment does not change ExecStart='s lookup), and the preflight did not: now the
    probe, the check and the preflight agree that such a server cannot start."""
    _program(tmp_path / "ct200-only-here")
    server = ServerSpec(
        "cpu",
        "command",
        ct200.models[0].name,
        (),
        30001,
        0,
        env={"PATH": str(tmp_path)},
        command=("ct200-only-here", "--port", "30001"),
    )
    site = dataclasses.replace(ct200, servers=(server,))
    facts = probe_engine(Reader(), server)
    assert facts.resolved is None
    assert find_program("ct200-only-here") is None
    (problem,) = Preflight(site, server, staged=lambda m: (True, "")).program()
    assert "is not in systemd's search path" in problem.message
    verdict = _judge_engine(site, server, facts)
    assert verdict.ok is False and engines.SYSTEMD_PATH_TEXT in verdict.summary


def test_probe_and_preflight_resolve_a_bare_program_alike() -> None:
    server = ServerSpec("cpu", "command", "m", (), 30001, 0, command=("sh", "-c", "true"))
    assert probe_engine(Reader(), server).resolved == find_program("sh")
    assert find_program("sh") is not None


def _judge_engine(site: SiteSpec, server: ServerSpec, facts: object) -> object:
    from ct200_tools.doctor.checks.server import JUDGES  # noqa: PLC0415

    f = ServerFacts(server.name, engine=facts)  # type: ignore[arg-type]
    return JUDGES["server.engine"](Context(Facts(servers=(f,)), site), server, f)


# -- the serving set decides what is judged -------------------------------------------------------


def _machine(tmp_path: Path, state: ServingState | None) -> Reader:
    """A recorded tree with the serving set as `ct200-serve switch` writes it (or none)."""
    if state is not None:
        path = tmp_path / serving.STATE_PATH.lstrip("/")
        path.parent.mkdir(parents=True)
        serving.write_state(state, str(path))
    return Reader(root=tmp_path)


def _after(reader: Reader) -> Facts:
    """The healthy CT200 recording, with the serving set read from `reader` and the servers'
    units as systemd showed them: Kimi's active, the Qwen servers' stopped (what a switch to
    Kimi leaves)."""
    facts = loads((FIX / "facts" / "ct200-ct-healthy.json").read_text())
    up, down = sf.recorded_unit("ok"), sf.recorded_unit("dead")
    units = {KIMI: up, **dict.fromkeys(QWEN, down)}
    servers = tuple(
        ServerFacts(name, unit=dataclasses.replace(u, name=engines.unit_name(name)))
        for name, u in units.items()
    )
    return dataclasses.replace(facts, serving=probe_serving(reader), servers=servers)


def _per_server(findings: list[Finding]) -> dict[str, Finding]:
    return {f.id: f for f in findings if f.id.startswith(PER_SERVER)}


def _text(f: Finding) -> str:
    return " ".join([f.summary, *f.evidence])


def test_after_a_switch_to_kimi_the_qwen_servers_are_not_judged(
    tmp_path: Path, ct200: SiteSpec
) -> None:
    facts = _after(_machine(tmp_path, ServingState((KIMI,), serving.now())))
    assert facts.serving is not None and facts.serving.servers == (KIMI,)
    got = _per_server(run_checks(facts, ct200))
    for f in got.values():
        assert "qwen" not in _text(f), f
    assert got["server.unit"].status == "pass"
    assert engines.unit_name(KIMI) in got["server.unit"].summary
    # Kimi's own: its TP8 group spans the sockets, its models are not staged in this recording.
    assert got["topo.tp_numa"].status == "warn" and KIMI in got["topo.tp_numa"].summary
    assert got["models.staged"].summary == "kimi-k2.6 is missing; kimi-k2.6-eagle3 is missing"
    assert "served models: 597.0 GiB" in got["mem.shm"].evidence


def test_without_a_serving_set_the_enabled_servers_are_judged(
    tmp_path: Path, ct200: SiteSpec
) -> None:
    facts = _after(_machine(tmp_path, None))
    assert facts.serving is not None and facts.serving.exists is False
    got = _per_server(run_checks(facts, ct200))
    for f in got.values():
        assert KIMI not in _text(f) and "kimi" not in _text(f), f
    assert got["server.unit"].status == "fail"
    assert all(engines.unit_name(q) in got["server.unit"].summary for q in QWEN)
    assert got["models.staged"].status == "pass" and got["topo.tp_numa"].status == "pass"
    assert "served models: 57.0 GiB" in got["mem.shm"].evidence


def test_a_damaged_serving_set_is_said_and_the_enabled_servers_judged(
    tmp_path: Path, ct200: SiteSpec
) -> None:
    reader = _machine(tmp_path, None)
    path = tmp_path / serving.STATE_PATH.lstrip("/")
    path.parent.mkdir(parents=True)
    path.write_text('{"servers": ["kimi-tp8-eagle3"]}')  # no "kind": not what the switch writes
    facts = _after(reader)
    assert facts.serving is not None and facts.serving.servers is None
    assert facts.serving.error is not None and "not a serving set" in facts.serving.error
    assert "enabled servers are judged instead" in reader.unreadable["serving"]
    ctx = Context(facts, ct200)
    assert [s.name for s in ctx.serving_servers()] == list(QWEN)


def test_the_probe_reads_exactly_what_the_switch_wrote(tmp_path: Path, ct200: SiteSpec) -> None:
    state = ServingState((KIMI, "gone"), serving.now())
    reader = _machine(tmp_path, state)
    assert (
        probe_serving(reader).servers
        == serving.read_state(os.path.join(tmp_path, serving.STATE_PATH.lstrip("/"))).servers
    )  # type: ignore[union-attr]
    chosen = serving.serving_set(ct200, state)
    ctx = Context(Facts(serving=probe_serving(reader)), ct200)
    assert ctx.serving_servers() == chosen.servers
    assert ctx.needed_models() == ct200.needed_models(chosen.servers)


def test_the_preflight_runs_the_doctors_engine_child(
    tmp_path: Path, ct200: SiteSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One script finds the engine's package for both (the preflight had its own): run for real
    by this interpreter, in the preflight's environment, without and with a package `sglang`."""
    import sys  # noqa: PLC0415

    venv = Path(sys.executable).parent.parent
    server = dataclasses.replace(ct200.servers[0], env={"VIRTUAL_ENV": str(venv)})
    site = dataclasses.replace(ct200, servers=(server,))
    check = Preflight(site, server, staged=lambda m: (True, ""))
    (problem,) = check.program()
    assert problem.message == f"the venv {venv} has no sglang package"
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the unit's env may set it: it counts
    assert check.program() == []
