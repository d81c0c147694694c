"""The doctor's server checks and the start gate against the real llama-server (the testbed's
OpenAI-compatible server) on a free port of this machine, its model staged by ct200-stage.

Here the server runs as a plain child process, not under its systemd unit (this machine may not
run systemd), so its port is held by a process outside ct200-server-llama.service: server.port_free
says so, naming it, which is what it must say. The unit side is tested against real systemd on the
testbed (tests/testbed/test_server_units.py).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ct200_tools.doctor.checks import for_scope, needed_facts, run_checks, select
from ct200_tools.doctor.checks.base import Finding
from ct200_tools.doctor.gate import run_gate
from ct200_tools.doctor.probes import collect
from ct200_tools.doctor.report import Exit, gate_verdict, root_causes
from ct200_tools.doctor.scope import Scope
from ct200_tools.spec import SiteSpec, load_spec
from testbed import llama_build
from testbed.llama_server import free_port, http_get

pytestmark = [pytest.mark.llama, pytest.mark.timeout(llama_build.BUILD_TIMEOUT_S)]

ROOT = Path(__file__).parents[2]
SYSTEMD = Path("/run/systemd/system").is_dir()  # systemd is PID 1 here (sd_booted)


@dataclasses.dataclass
class Site:
    path: Path
    spec: SiteSpec
    port: int

    def without_gpus(self) -> SiteSpec:
        """The server as the testbed declares it: no GPUs (the YAML schema still wants one)."""
        server = dataclasses.replace(self.spec.servers[0], gpus=())
        return dataclasses.replace(self.spec, servers=(server,))


@pytest.fixture(scope="module")
def site(
    llama_binary: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("site")
    source = root / "models" / "tiny"
    source.mkdir(parents=True)
    (source / "tiny.gguf").write_bytes(tiny_model.read_bytes())
    staged = root / "shm" / "tiny"
    port = free_port()
    doc = {
        "ct200_site": {
            "gpus": {"count": 1, "model": "NVIDIA H200"},
            "models": [{"name": "tiny", "source": str(source), "staged": str(staged)}],
            "servers": [
                {
                    "name": "llama",
                    "engine": "command",
                    "model": "tiny",
                    "gpus": [0],
                    "port": port,
                    "command": [
                        str(llama_binary),
                        *("--model", f"{staged}/tiny.gguf", "--alias", "tiny"),
                        *("--port", str(port), "--ctx-size", "512", "--threads", "2"),
                    ],
                }
            ],
        }
    }
    path = root / "site.yml"
    path.write_text(yaml.safe_dump(doc))
    manifests = str(root / "manifests")
    env = {**os.environ, "CT200_MANIFEST_DIR": manifests}
    stage = [sys.executable, "-m", "ct200_tools.cli.stage", "stage", "tiny"]
    r = subprocess.run(
        [*stage, "--spec", str(path), "--create-manifest"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    with pytest.MonkeyPatch.context() as mp:  # the doctor reads the same manifests
        mp.setenv("CT200_MANIFEST_DIR", manifests)
        yield Site(path, load_spec(path), port)


@pytest.fixture
def serving(site: Site) -> Iterator[subprocess.Popen[bytes]]:
    """The server, started from the spec's own command (as its unit would), ready."""
    proc = subprocess.Popen(
        list(site.spec.servers[0].command), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        until = time.monotonic() + 60
        while time.monotonic() < until:
            assert proc.poll() is None, "llama-server exited before it served"
            try:
                if http_get(f"http://127.0.0.1:{site.port}/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.05)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def check_server(spec: SiteSpec) -> dict[str, Finding]:
    """`ct200-doctor check --server llama --only server --only models`, in this process."""
    scope = Scope.of(spec, "llama")
    selected = for_scope(select(["server", "models"]), scope)
    facts = collect(spec=spec, timeout_s=10, scope=scope, only=needed_facts(selected))
    return {f.id: f for f in run_checks(facts, spec, selected, scope)}


def test_server_checks_pass_while_it_serves_and_fail_when_stopped(
    site: Site, serving: subprocess.Popen[bytes]
) -> None:
    got = check_server(site.spec)
    for cid in ("models.staged", "server.engine", "server.port", "server.models"):
        assert got[cid].status == "pass", got[cid]
    assert got["server.models"].summary == "llama: /v1/models lists 'tiny'"
    assert got["server.generate"].status == "pass", got["server.generate"]
    assert got["server.generate"].summary.startswith("llama: 1-token completion in ")
    # Not in its unit here: its port is held by a process outside ct200-server-llama.service.
    free = got["server.port_free"]
    assert free.status == "fail"
    assert f"port {site.port} is taken by pid {serving.pid} (llama-server)" in free.summary
    assert got["server.quant"].status == "skip"
    assert "no config.json" in got["server.quant"].summary
    if not SYSTEMD:
        assert got["server.unit"].status == "skip"

    serving.terminate()
    serving.wait(timeout=30)
    got = check_server(site.spec)
    port = got["server.port"]
    assert port.status == "fail"
    assert "connection refused" in port.summary
    for cid in ("server.models", "server.generate"):
        assert got[cid].status == "skip", got[cid]
    assert got["server.port_free"].status == "pass"
    findings = list(got.values())
    if SYSTEMD:  # the unit is not installed here: that is the root, the port its consequence
        assert root_causes(findings) == ["server.unit"]
        assert port.caused_by == "server.unit"
    else:
        assert root_causes(findings) == ["server.port"]
        assert got["server.models"].caused_by == "server.port"
        assert got["server.generate"].caused_by == "server.port"


@pytest.fixture
def squatter(site: Site) -> Iterator[subprocess.Popen[str]]:
    """Another program listening on the server's port."""
    code = (
        "import socket, sys\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('127.0.0.1', {site.port})); s.listen()\n"
        "print('up', flush=True); sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    yield proc
    proc.kill()
    proc.wait()


def test_gate_names_the_process_holding_the_port(
    site: Site, squatter: subprocess.Popen[str]
) -> None:
    name = Path(f"/proc/{squatter.pid}/comm").read_text().strip()
    result = run_gate(site.without_gpus(), "llama", 10.0)
    assert result.code == Exit.FAILURES
    got = {f.id: f for f in result.findings}
    taken = f"port {site.port} is taken by pid {squatter.pid} ({name}"
    assert got["server.port_free"].status == "fail"
    assert taken in got["server.port_free"].summary
    assert got["server.port_free"].remediation is not None
    assert got["server.port_free"].remediation.command == f"kill {squatter.pid}"
    verdict = gate_verdict(result.findings, "llama", result.code)
    assert verdict.startswith(f"ct200-doctor gate llama: no-go: server.port_free: llama: {taken}")
    # The command line, with the spec as written (GPU 0, on this GPU-less machine): the port's
    # holder is named beside the missing GPU.
    r = subprocess.run(
        [sys.executable, "-m", "ct200_tools.cli.entry", "gate", "llama", "--spec", str(site.path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=ROOT,
    )
    assert r.returncode == Exit.FAILURES
    assert taken in r.stdout


def test_gate_go_with_the_model_staged_and_the_port_free(site: Site) -> None:
    with socket.socket() as s:  # nothing listens on the server's port
        assert s.connect_ex(("127.0.0.1", site.port)) != 0
    result = run_gate(site.without_gpus(), "llama", 10.0)
    statuses = {f.id: f.status for f in result.findings}
    assert statuses == {
        "models.staged": "pass",
        "server.engine": "pass",
        "server.port_free": "pass",
        "server.quant": "skip",  # a GGUF: no compressed-tensors format to check
    }
    assert result.code == Exit.OK
    verdict = gate_verdict(result.findings, "llama", result.code)
    assert verdict == (
        "ct200-doctor gate llama: go (models.staged, server.engine, server.port_free)"
    )
