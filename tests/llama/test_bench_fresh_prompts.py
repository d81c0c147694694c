"""Every point's prompts are fresh on the real llama-server: over a sweep of three points and a
second run into the same --out, the server's own log shows the whole prompt evaluated for every
request (`prompt eval time = X ms / N tokens`, N the tokens it really evaluated), and the
`cached_tokens` the client recorded from usage agree. Before issue 32 every point after the first
was served from llama-server's slot cache: N was 1."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ct200_tools.bench.metrics import CACHE_SLACK
from testbed import llama_build
from testbed.llama_server import Server
from tests.unit.bench_helpers import bench

pytestmark = [pytest.mark.llama, pytest.mark.timeout(llama_build.BUILD_TIMEOUT_S)]

INPUT = 32
EVAL = re.compile(rb"prompt eval time = +[0-9.]+ ms / +(\d+) tokens")
#: Three points of 4 counted requests and 1 warm-up each, within the fixture's 4 slots.
ARGS = ("--concurrency", "1,2,4", "--input-tokens", str(INPUT), "--output-tokens", "4")
PER_RUN = 3 * (4 + 1)


def evaluated_since(server: Server, start: int) -> list[int]:
    """The prompt tokens llama-server evaluated for each request it logged after byte `start`."""
    with server.log.open("rb") as f:
        f.seek(start)
        return [int(n) for n in EVAL.findall(f.read())]


def test_a_sweep_and_a_second_run_evaluate_every_prompt_in_full(
    server: Server, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    start = server.log.stat().st_size
    for _ in range(2):
        proc = bench(
            "run", "--target", server.base, *ARGS, "--requests", "4", "--warmup", "1",
            "--out", str(out), "--json", timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
    evaluated = evaluated_since(server, start)
    points = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    # The tiny model's vocabulary is characters: two fresh prompts share their first letters by
    # chance, which the slack allows (a dozen tokens here, 4 with a word-level vocabulary).
    slack = max(p["workload"]["cache_slack_tokens"] for p in points)
    assert CACHE_SLACK <= slack <= 16
    # One line a completion, warm-up included: every prompt evaluated whole (the tokenizer's
    # count and the server's BOS), none served from a slot that held an earlier prompt.
    assert len(evaluated) == 2 * PER_RUN, evaluated
    assert min(evaluated) >= INPUT + 1 - slack, evaluated
    assert len(points) == 6 and len({p["run_id"] for p in points}) == 2
    assert len({p["workload"]["prompt_seed"] for p in points}) == 6
    for p in points:
        assert p["workload"]["prompt_length_method"] == "tokenize"
        assert p["requests_with_cached_count"] == 4 and p["cache_flag"] is False, p
        assert p["cached_tokens_max"] <= p["workload"]["cache_slack_tokens"]
        assert p["input_lengths"]["min"] >= INPUT
    print(f"\nllama-server evaluated prompt tokens per request: {evaluated}")
    print("cached_tokens per point:", [p["cached_prompt_tokens"] for p in points], "slack", slack)


def test_chat_requests_are_measured_and_fresh_past_the_template(
    server: Server, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    start = server.log.stat().st_size
    proc = bench(
        "run", "--target", server.base, "--endpoint", "chat", *ARGS, "--requests", "4",
        "--out", str(out), "--json", timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    evaluated = evaluated_since(server, start)
    points = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(evaluated) == 12 and len(points) == 3
    for p in points:
        assert p["workload"]["endpoint"] == "chat" and p["requests_completed"] == 4
        # Every answer's tokens streamed as content (the role-only first chunk is no token).
        assert p["output_tokens"] == 16 == p["content_chunks"] and p["reasoning_chunks"] == 0
        assert p["cache_flag"] is False, p
        # The chat template's tokens (the same in every request) are all a prefix cache serves.
        whole = p["input_lengths"]["min"]
        assert whole > INPUT and min(evaluated) >= whole - p["workload"]["cache_allowed_tokens_max"]
    print(f"\nllama-server evaluated (chat): {evaluated}")
