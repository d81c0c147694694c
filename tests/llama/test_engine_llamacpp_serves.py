"""engine: llamacpp for real: the ExecStart argv its module renders from a spec starts the CPU
llama-server, which answers /health and a 1-token completion (issue 30)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from ct200_tools import serverhttp
from ct200_tools.serve import engines
from ct200_tools.spec import validate
from testbed.llama_server import free_port


def test_rendered_argv_serves_health_and_a_completion(
    llama_binary: Path, tiny_model: Path, tmp_path: Path
) -> None:
    port = free_port()
    site = validate(
        {
            "gpus": {"count": 0, "model": "none"},
            "models": [
                {"name": "tiny", "source": str(tmp_path / "source"), "staged": str(tiny_model)}
            ],
            "servers": [
                {
                    "name": "tiny",
                    "engine": "llamacpp",
                    "model": "tiny",
                    "gpus": [],
                    "port": port,
                    "command": [str(llama_binary)],
                    "args": {"parallel": 1, "ctx-size": 256, "threads": 1, "no-webui": True},
                }
            ],
        }
    )
    server = site.servers[0]
    argv = engines.argv(site, server)
    assert argv[:3] == [str(llama_binary), "-m", str(tiny_model)]
    log = (tmp_path / "llama-server.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        status = None
        until = time.monotonic() + 120
        while time.monotonic() < until and status != 200:
            assert proc.poll() is None, (tmp_path / "llama-server.log").read_text()[-2000:]
            try:
                status, _ = serverhttp.request("GET", engines.ready_url(server), None, 2.0)
            except OSError:
                time.sleep(0.1)
        assert status == 200, "never served /health"
        got = serverhttp.generate(
            serverhttp.request, engines.base_url(server), engines.served_name(server), "hi", 60.0
        )
        assert (got.status, got.error) == (200, None), got
        metrics, _ = serverhttp.request("GET", engines.base_url(server) + "/metrics", None, 5.0)
        assert metrics == 200  # --metrics
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
