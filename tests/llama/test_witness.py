"""benchmarks/bench_client/witness.py (ct200-bench against the minimal independent client on one
real llama-server) at a tiny size: both clients measure every level in both orders, and the
report has the shape the docs' table is made from. The figures of a smoke run mean nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import llama_build

pytestmark = [pytest.mark.llama, pytest.mark.timeout(llama_build.BUILD_TIMEOUT_S)]

REPO = Path(__file__).resolve().parents[2]


def test_witness_benchmark(llama_binary: Path, tiny_model: Path, tmp_path: Path) -> None:
    argv = [
        *(sys.executable, "-m", "benchmarks.bench_client.witness", "--binary", str(llama_binary)),
        *("--model", str(tiny_model), "--out", str(tmp_path), "--levels", "1,2"),
        *("--rounds", "2", "--requests", "2", "--input-tokens", "16", "--output-tokens", "8"),
        *("--ngl", "0"),
    ]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=570, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "witness.json").read_text())
    rows = report["rows"]
    seen = [(r["client"], r["concurrency"], r["round"], r["order"]) for r in rows]
    assert sorted(seen) == sorted(
        (client, level, rnd, (client == "minimal") == (rnd == 0))
        for level in (1, 2)
        for rnd in (0, 1)
        for client in ("ct200-bench", "minimal")
    ), seen
    for row in rows:
        assert "error" not in row, row
        assert row["requests_ok"] == 2 and row["requests_failed"] == 0, row
        assert row["output_tokens"] == 2 * 8, row
        # The server's own log accounts for each row's requests, start to end.
        assert row["server_span_s"] > 0 and row["server_output_tokens_per_s"] > 0, row
    # Both clients' prompts have the same length by the server's own count.
    for level in (1, 2):
        lengths = {r["client"]: r["prompt_tokens_mean"] for r in rows if r["concurrency"] == level}
        assert lengths["ct200-bench"] == lengths["minimal"], lengths
    assert len(report["table"]) == 4 and report["table"][2].startswith("| 1 |")
    assert report["table"][0].count("|") == report["table"][2].count("|") == 11
    # The load's shape by the server's log: how far apart the first wave launched.
    assert all(r["server_first_wave_spread_ms"] >= 0 for r in rows if r["concurrency"] == 2)
    assert report["server_prompt_evals"]["count"] >= 16
