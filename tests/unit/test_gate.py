"""Scope (one server's GPUs, models, port), the gate's selection, and `ct200-doctor gate` /
`check --server` from the command line: exit codes, the verdict first and last, bad input."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ct200_tools.doctor import warmup
from ct200_tools.doctor.checks import BY_ID, for_scope, gate_checks, needed_facts, run_checks
from ct200_tools.doctor.gate import run_gate
from ct200_tools.doctor.probes import NOT_NEEDED, collect
from ct200_tools.doctor.probes.base import Reader
from ct200_tools.doctor.report import Exit, gate_verdict
from ct200_tools.doctor.scope import Scope, UnknownServerError
from ct200_tools.facts import LATER_SECTIONS, OLDER_SNAPSHOT, DevNode, Facts, loads
from ct200_tools.spec import SiteSpec, load_spec
from tests.unit import server_facts as sf

ROOT = Path(__file__).parents[2]
FIX = ROOT / "tests" / "fixtures" / "facts"
CT200 = ROOT / "inventory" / "ct200"


@pytest.fixture(scope="module")
def ct200() -> SiteSpec:
    return load_spec(CT200)


@pytest.fixture
def no_prestart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warmup, "_prestarted", None)


def facts(name: str) -> Facts:
    return loads((FIX / f"{name}.json").read_text())


def test_scope_of_a_server(ct200: SiteSpec) -> None:
    s = Scope.of(ct200, "qwen-tp4-ddtree")
    assert (s.gpus, s.models, s.port) == (
        (0, 1, 2, 3),
        ("qwen3.6-27b", "qwen3.6-27b-dflash"),
        30000,
    )
    assert s.cuda_visible_devices == "0,1,2,3"
    assert Scope.of(ct200, "kimi-tp8").models == ("kimi-k2.6",)
    with pytest.raises(UnknownServerError, match="no server 'qwen' in the spec"):
        Scope.of(ct200, "qwen")


def test_gate_selection_with_and_without_gpus() -> None:
    gpu = Scope("x", (0, 1), ("m",), 1)
    none = Scope("x", (), ("m",), 1)
    assert [c.id for c in gate_checks(gpu)] == [
        "driver.module",
        "driver.nvml",
        "driver.versions",
        "dev.nodes",
        "dev.majors",
        "dev.open",
        "gpu.cuda_init",
        "models.staged",
        "server.engine",
        "server.port_free",
        "server.quant",
    ]
    # No skip-as-pass: a server without GPUs is judged on what applies to it, nothing else.
    assert [c.id for c in gate_checks(none)] == [
        "models.staged",
        "server.engine",
        "server.port_free",
        "server.quant",
    ]
    # memory: mem.shm may be the root cause of a model not staged (a /dev/shm too small).
    assert needed_facts(gate_checks(none)) == {
        "models",
        "serving",
        "servers",
        "kernel",
        "memory",
    }
    assert "cuda" in needed_facts(gate_checks(gpu))
    assert BY_ID["tune.numa_balancing"] in for_scope([BY_ID["tune.numa_balancing"]], none)


def _without(path: str) -> Facts:
    f = facts("ct200-ct-healthy")
    assert f.devices is not None
    nodes = tuple(DevNode(n.path, False) if n.path == path else n for n in f.devices.nodes)
    return dataclasses.replace(f, devices=dataclasses.replace(f.devices, nodes=nodes))


def test_device_nodes_are_judged_within_the_scope(ct200: SiteSpec) -> None:
    """derived: /dev/nvidia5 missing in the CT200 container: the server on GPUs 4-7 cannot
    start; the one on GPUs 0-3 can, and its gate says so."""
    f = _without("/dev/nvidia5")
    checks = [BY_ID["dev.nodes"]]
    whole = run_checks(f, ct200, checks)[0]
    left = run_checks(f, ct200, checks, Scope.of(ct200, "qwen-tp4-ddtree"))[0]
    right = run_checks(f, ct200, checks, Scope.of(ct200, "qwen-tp4-dflash"))[0]
    assert whole.status == "fail" and right.status == "fail"
    assert "/dev/nvidia5 does not exist" in right.evidence
    assert left.status == "pass" and left.summary == "7 device nodes present"
    # The fix still passes every GPU through: a devN block for 4 GPUs would drop the others.
    assert right.remediation is not None
    assert "dev7: /dev/nvidia7,mode=0666" in right.remediation.config


def test_models_are_judged_within_the_scope(ct200: SiteSpec) -> None:
    f = facts("ct200-ct-healthy")  # the Qwen models staged, Kimi not
    check = [BY_ID["models.staged"]]
    kimi = run_checks(f, ct200, check, Scope.of(ct200, "kimi-tp8"))[0]
    qwen = run_checks(f, ct200, check, Scope.of(ct200, "qwen-tp4-dflash"))[0]
    assert kimi.status == "fail" and kimi.summary == "kimi-k2.6 is missing"
    assert qwen.status == "pass"


def test_scoped_cuda_child_sees_only_the_servers_gpus(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_prestart: None
) -> None:
    """The real child process, printing the CUDA_VISIBLE_DEVICES it got (where cuInit would
    see only those GPUs)."""
    child = (
        "import json, os\n"
        'print(json.dumps({"code": 0, "name": os.environ.get("CUDA_VISIBLE_DEVICES", "unset")}))\n'
    )
    monkeypatch.setattr(warmup, "CUDA_CHILD", child)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    scope = Scope("qwen-tp4-dflash", (4, 5, 6, 7), (), 30001)
    got = collect(reader=Reader(root=tmp_path), scope=scope, only={"cuda"}, cuda_mode="all")
    assert got.cuda is not None and got.cuda.name == "4,5,6,7"
    assert got.kernel is None and got.unreadable["kernel"] == NOT_NEEDED
    whole = collect(reader=Reader(root=tmp_path), only={"cuda"}, cuda_mode="all")
    assert whole.cuda is not None and whole.cuda.name == "unset"


def test_scoped_per_gpu_children_are_the_servers_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_prestart: None
) -> None:
    """Per-GPU mode: one real child per GPU of the server, each seeing only its own GPU."""
    child = (
        "import json, os\n"
        'print(json.dumps({"code": 0, "visible": os.environ["CUDA_VISIBLE_DEVICES"]}))\n'
    )
    monkeypatch.setattr(warmup, "PER_GPU_CHILD", child)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    scope = Scope("qwen-tp4-dflash", (4, 5, 6, 7), (), 30001)
    got = collect(reader=Reader(root=tmp_path), scope=scope, only={"cuda"}, cuda_mode="per-gpu")
    assert got.cuda is not None and got.cuda.mode == "per-gpu"
    assert [(g.index, g.visible) for g in got.cuda.gpus] == [(i, str(i)) for i in (4, 5, 6, 7)]


def test_a_prestarted_child_is_not_used_by_a_scoped_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_prestart: None
) -> None:
    monkeypatch.setattr(warmup, "CUDA_CHILD", "import sys; sys.stdin.read()\n")
    pre = warmup.spawn("all", str(tmp_path))
    monkeypatch.setattr(warmup, "_prestarted", pre)
    got = warmup.take("all", str(tmp_path), (0,))
    try:
        assert got is not pre
        assert all(c.proc.poll() is not None for c in pre.children)  # ended, not left running
    finally:
        got.kill()


def test_an_older_snapshot_says_why_it_has_no_servers() -> None:
    data = json.loads((FIX / "nodriver-vm.json").read_text())
    for name in LATER_SECTIONS:
        del data[name]
        del data["unreadable"][name]
    f = loads(json.dumps(data))
    assert all(f.unreadable[n] == OLDER_SNAPSHOT for n in LATER_SECTIONS)
    got = {x.id: x for x in run_checks(f, load_spec(sf.LLAMA_SPEC))}
    assert got["server.port"].status == "skip"
    assert got["server.port"].summary == f"servers not probed: {OLDER_SNAPSHOT}"


def test_gate_of_a_server_without_gpus_runs_what_applies(tmp_path: Path) -> None:
    """The same machinery, on this machine: no GPU check runs (none is skipped as a pass), the
    CUDA child is not started, and the model that is not there is the root cause."""
    spec = load_spec(sf.LLAMA_SPEC)
    server = dataclasses.replace(spec.servers[0], gpus=(), port=_free_port())
    model = dataclasses.replace(spec.models[0], staged=str(tmp_path / "tiny"))
    spec = dataclasses.replace(spec, servers=(server,), models=(model,))
    result = run_gate(spec, "llama", 10.0)
    assert [x.id for x in result.findings] == [
        "models.staged",
        "server.engine",
        "server.port_free",
        "server.quant",
    ]
    assert result.code == Exit.FAILURES
    got = {x.id: x for x in result.findings}
    assert got["models.staged"].status == "fail"
    assert got["server.port_free"].status == "pass"
    assert got["server.quant"].caused_by == "models.staged"
    assert result.facts.cuda is None and result.facts.unreadable["cuda"] == NOT_NEEDED
    assert {p.name for p in result.facts.probes} == {
        "kernel",
        "models",
        "serving",
        "servers",
        "memory",
    }
    (s,) = result.facts.servers or ()
    assert s.connected is None and s.unit is None  # a gate does not look at it serving


def _free_port() -> int:
    import socket  # noqa: PLC0415

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ct200_tools.cli.entry", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=ROOT,
    )


def test_gate_cli_no_go_names_the_root_first_and_last() -> None:
    """This machine has no GPU: the llama server's spec gives it GPU 0, so its gate stops it,
    naming the root cause and its fix on the first and the last line (the journal's tail)."""
    r = doctor("gate", "llama", "--spec", str(sf.LLAMA_SPEC))
    assert r.returncode == Exit.FAILURES, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == lines[-1]
    assert lines[0].startswith("ct200-doctor gate llama: no-go: driver.module: ")
    assert "fix on this machine: lspci -nn -d 10de:" in lines[0]
    assert "Traceback" not in r.stdout + r.stderr


def test_gate_cli_sets_the_units_status_line_to_its_verdict(tmp_path: Path) -> None:
    """Run as the unit's ExecStartPre (NOTIFY_SOCKET set, NotifyAccess=exec), the gate's
    verdict becomes the status line `systemctl status` shows: a server the gate stopped no
    longer shows the preflight's "preflight passed; starting" (issue 19's fault matrix, a
    taken port). A real datagram socket stands in for systemd's."""
    import socket  # noqa: PLC0415

    address = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(address)
        sock.settimeout(30)
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "ct200_tools.cli.entry",
                "gate",
                "llama",
                "--spec",
                str(sf.LLAMA_SPEC),
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
            cwd=ROOT,
            env={**os.environ, "NOTIFY_SOCKET": address},
        )
        assert r.returncode == Exit.FAILURES, r.stdout + r.stderr
        got = sock.recv(4096).decode()
    assert got.startswith("STATUS=gate llama: no-go: driver.module: "), got


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("gate", "nope", "--spec", str(sf.LLAMA_SPEC)), "no server 'nope' in the spec"),
        (
            ("check", "--server", "nope", "--spec", str(sf.LLAMA_SPEC)),
            "no server 'nope' in the spec (its servers: llama)",
        ),
        (("gate", "llama", "--spec", "/nonexistent/site.yml"), "/nonexistent/site.yml"),
    ],
    ids=["gate-unknown", "check-unknown", "gate-no-spec"],
)
def test_bad_server_or_spec_is_exit_2_with_a_message(args: tuple[str, ...], message: str) -> None:
    r = doctor(*args)
    assert r.returncode == Exit.FAILURES, r.stdout + r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_check_server_judges_one_server_from_a_snapshot() -> None:
    r = doctor(
        "check",
        "--facts",
        str(FIX / "llama-cpu-serving.json"),
        "--spec",
        str(sf.LLAMA_SPEC),
        "--server",
        "llama",
        "--only",
        "server",
        "--json",
    )
    doc = json.loads(r.stdout)
    got = {c["id"]: c for c in doc["checks"]}
    assert got["server.generate"]["status"] == "pass"
    assert got["server.port_free"]["status"] == "fail"
    assert "taken by pid 19428 (llama-server)" in got["server.port_free"]["summary"]
    assert doc["root_causes"] == ["server.port_free"]
    assert r.returncode == Exit.FAILURES


def test_a_model_still_staging_stops_the_gate_but_only_warns_a_check(ct200: SiteSpec) -> None:
    """derived: the CT200 container after a reboot with a stage running (pid 4242) for every
    model: a server about to start cannot load a half-copied model."""
    from ct200_tools.facts import StagedTreeFacts  # noqa: PLC0415

    f = facts("ct200-ct-incident")
    assert f.models is not None
    running = tuple(
        dataclasses.replace(
            m, staged_tree=StagedTreeFacts(m.staged_tree.path, partial=True, lock_pid=4242)
        )
        for m in f.models
        if m.staged_tree is not None
    )
    f = dataclasses.replace(f, models=running)
    check = [BY_ID["models.staged"]]
    gate = run_checks(f, ct200, check, Scope.of(ct200, "qwen-tp4-ddtree", serving=False))[0]
    seen = run_checks(f, ct200, check, Scope.of(ct200, "qwen-tp4-ddtree"))[0]
    assert gate.status == "fail" and "pid 4242" in gate.summary
    assert gate.remediation is not None
    assert gate.remediation.command == "ct200-stage status --spec /etc/ct200/site.yml"
    assert seen.status == "warn"


def test_gate_verdict_names_the_denied_node_and_counts_the_fix_lines() -> None:
    """The one line systemctl status shows: the root, what it found (node, major, errno), and
    where the multi-line fix is (issue 11: the journal says why, without scrolling)."""
    f = loads((FIX / "h200-uvm-denied.json").read_text())
    findings = run_checks(f, None)
    line = gate_verdict(findings, "bench", Exit.FAILURES)
    assert line.startswith("ct200-doctor gate bench: no-go: dev.open: 2 device nodes cannot be ")
    assert "the device cgroup denies c 238:0 (nvidia-uvm): open(/dev/nvidia-uvm) = EPERM" in line
    assert "more lines above" in line
