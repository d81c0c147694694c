"""ct200-bench against the real llama-server seen through a proxy that relays its answers in
small TCP segments, as a client on another host sees it: /props, /v1/models and /tokenize come
through whole, so the engine is identified and the prompts are made by the server's tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed import llama_build
from testbed.llama_server import DEFAULT_ALIAS, Server
from tests.unit.bench_helpers import bench, segmenting_proxy

pytestmark = [pytest.mark.llama, pytest.mark.timeout(llama_build.BUILD_TIMEOUT_S)]

INPUT = 32


@pytest.mark.parametrize("segment", [1448, 7])
def test_llama_servers_answers_in_small_segments_come_through_whole(
    server: Server, tmp_path: Path, segment: int
) -> None:
    out = tmp_path / "out"
    with segmenting_proxy(server.base, segment, pause=0.0005) as proxy:
        proc = bench("run", "--target", proxy, "--concurrency", "1", "--input-tokens",
                     str(INPUT), "--output-tokens", "4", "--requests", "2", "--json",
                     "--out", str(out), timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = (out / "runs").iterdir()
    prov = json.loads((run_dir / "provenance.json").read_text())
    engine = prov["engine"]
    # /props is several KiB (its chat template): many segments, read whole.
    assert engine["props"]["error"] is None, engine["props"]
    assert engine["engine"]["name"] == "llama-server"
    assert prov["model"] == DEFAULT_ALIAS
    (point,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert point["workload"]["prompt_length_method"] == "tokenize"
    assert point["requests_completed"] == 2 and point["errors"] == {}
