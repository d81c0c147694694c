"""Workloads end to end against the stand-in server (its prefix cache reports cached_tokens as
the longest word prefix a prompt shares with any prompt served before): fresh prompts at every
point and run, shared prefixes on purpose, chat with reasoning, datasets and length spreads."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml

from ct200_tools.bench import aggregate, datasets
from ct200_tools.bench.feed import Feed, Prepared
from ct200_tools.bench.plan import PlanError
from ct200_tools.bench.workload import Workload
from tests.unit.bench_helpers import REPO, bench, standin

pytestmark = pytest.mark.timeout(180)

EXAMPLES = REPO / "examples" / "datasets"


def points(out: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def run_plan(tmp_path: Path, url: str, plan: dict[str, object], *extra: str) -> tuple[str, Path]:
    path = tmp_path / "plan.yml"
    path.write_text(yaml.safe_dump(plan))
    out = tmp_path / "out"
    proc = bench("run", str(path), "--target", url, "--out", str(out), *extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout, out


def test_every_point_and_run_sends_fresh_prompts(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ("--concurrency", "1,2", "--input-tokens", "16", "--output-tokens", "2")
    with standin() as url:
        for _ in range(2):
            proc = bench(
                "run", "--target", url, *args, "--requests", "4", "--warmup", "1",
                "--repetitions", "2", "--out", str(out),
            )  # fmt: skip
            assert proc.returncode == 0, proc.stderr
    got = points(out)
    assert len(got) == 8 and len({p["run_id"] for p in got}) == 2
    assert len({p["workload"]["prompt_seed"] for p in got}) == 8
    for p in got:
        # Seeded alike at every point (as before issue 32), 15 of the 16 words would be cached.
        assert p["requests_with_cached_count"] == 4 and p["cache_flag"] is False, p
        assert p["cached_tokens_max"] <= p["workload"]["cache_slack_tokens"] == 4
        assert p["workload"]["prompt_length_method"] == "tokenize"
        assert p["input_lengths"] == {"requests": 4, "mean": 16, "min": 16, "max": 16, "stdev": 0}
    # The words-per-token ratio was learnt at the first point: one /tokenize a prompt after it.
    assert all(p["workload"]["tokenize_calls"] == 5 for p in got[1:4])


def test_a_shared_prefix_is_cached_on_purpose_and_not_flagged(tmp_path: Path) -> None:
    plan = {
        "workloads": [
            {"name": "pre", "input_tokens": 24, "shared_prefix_tokens": 16, "output_tokens": 2,
             "requests": 4},
        ],
        "concurrency": [1],
        "repetitions": 2,
    }  # fmt: skip
    with standin() as url:
        stdout, out = run_plan(tmp_path, url, plan)
    first, second = points(out)
    assert first["workload"]["shared_prefix_tokens"] == 16
    # The first prompt of the run found nothing; every later one its 16 shared words.
    assert first["cached_prompt_tokens"] >= 3 * 16 and second["cached_prompt_tokens"] >= 4 * 16
    assert first["cache_flag"] is False and second["cache_flag"] is False
    assert second["cached_tokens_max"] <= 16 + 4
    assert "CACHED" not in stdout


def test_a_dataset_sent_again_is_flagged_as_served_from_cache(tmp_path: Path) -> None:
    (tmp_path / "two.jsonl").write_text(
        json.dumps({"prompt": "how long does a slot keep the prompt of its last request"})
        + "\n"
        + json.dumps({"prompt": "which metric shows the queue of a busy inference server"})
        + "\n"
    )
    plan = {
        "workloads": [{"name": "two", "prompts": "two.jsonl", "output_tokens": 2, "requests": 4}],
        "concurrency": [1],
    }
    with standin() as url:
        stdout, out = run_plan(tmp_path, url, plan)
    (p,) = points(out)
    assert p["workload"]["dataset"] == {"layout": "jsonl", "entries": 2, "skipped": 0}
    assert p["workload"]["dataset_repeats"] == 2
    assert p["cache_flag"] is True and p["requests_over_cache"] == 2
    assert "CACHED: 2 of 4 request(s)" in stdout, stdout
    # The report says so beside the figures (Notes), not only the run's text view.
    loaded = aggregate.load([str(out)])
    assert [g.flags() for g in loaded.groups] == [["ungated", "cached"]]


def test_chat_counts_reasoning_as_output_and_no_role_only_token(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with standin("--reasoning", "2", "--ttft", "0.05") as url:
        proc = bench(
            "run", "--target", url, "--endpoint", "chat", "--concurrency", "2",
            "--input-tokens", "8", "--output-tokens", "5", "--requests", "3", "--out", str(out),
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (p,) = points(out)
    assert p["workload"]["endpoint"] == "chat"
    assert (p["reasoning_chunks"], p["content_chunks"]) == (6, 9)
    assert p["output_tokens"] == 15
    # The role-only chunk comes at once; the first token (reasoning) after the scripted delay.
    ttft = p["ttft_ms"]
    assert isinstance(ttft, dict) and ttft["p50"] >= 50
    # 8 words of the single user message and two template tokens.
    assert p["input_lengths"]["min"] == 10
    assert "output chunks: 9 content, 6 reasoning" in proc.stdout


def test_the_example_datasets_with_lengths_from_the_dataset_and_a_range(tmp_path: Path) -> None:
    plan = {
        "workloads": [
            {"name": "chat", "endpoint": "chat", "prompts": str(EXAMPLES / "ct200-chat.jsonl"),
             "output_tokens": "from-dataset", "input_tokens": "from-dataset", "requests": 6},
            {"name": "sharegpt", "prompts": str(EXAMPLES / "ct200-sharegpt.json"),
             "output_tokens": {"min": 2, "max": 6}, "requests": 8},
        ],
        "concurrency": [2],
    }  # fmt: skip
    with standin() as url:
        _, out = run_plan(tmp_path, url, plan)
    chat, sharegpt = points(out)
    assert chat["workload"]["output_length_method"] == "tokenize"
    asked = chat["workload"]["requested_output_tokens"]
    # The stand-in counts a word a token: the reference answers' word counts, as asked.
    assert chat["output_lengths"] == asked and 20 <= asked["min"] < asked["max"] <= 60, asked
    assert chat["workload"]["dataset"] == {"layout": "jsonl", "entries": 18, "skipped": 0}
    assert sharegpt["workload"]["dataset"] == {"layout": "sharegpt", "entries": 8, "skipped": 1}
    assert sharegpt["workload"]["output_length_method"] == "uniform"
    lengths = sharegpt["output_lengths"]
    assert 2 <= lengths["min"] <= lengths["max"] <= 6 and lengths["requests"] == 8
    assert sharegpt["cache_flag"] is False and chat["cache_flag"] is False


def test_input_and_output_ranges_are_drawn_per_request(tmp_path: Path) -> None:
    plan = {
        "workloads": [
            {"name": "spread", "input_tokens": {"min": 4, "max": 40},
             "output_tokens": {"min": 1, "max": 9}, "requests": 12},
        ],
        "concurrency": [4],
    }  # fmt: skip
    with standin() as url:
        _, out = run_plan(tmp_path, url, plan)
    (p,) = points(out)
    ins, outs = p["input_lengths"], p["output_lengths"]
    assert 4 <= ins["min"] < ins["max"] <= 40 and ins["stdev"] > 0
    assert 1 <= outs["min"] <= outs["max"] <= 9
    assert p["workload"]["requested_input_tokens"] == ins
    assert p["workload"]["input_tokens"] == {"min": 4, "max": 40}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--endpoint", "chats", "--concurrency", "1"], "'chats' is not one of"),
        (["plan.yml", "--endpoint", "chat"], "--endpoint with a PLAN"),
    ],
)
def test_a_bad_endpoint_option_is_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "plan.yml").write_text("workloads: []\n")
    args = [str(tmp_path / a) if a == "plan.yml" else a for a in args]
    proc = bench(
        "run", *args, "--target", "http://127.0.0.1:9", "--input-tokens", "4",
        "--output-tokens", "2", "--out", str(tmp_path / "o"),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_a_dataset_is_walked_across_points_and_a_resumed_point_draws_anew(tmp_path: Path) -> None:
    (tmp_path / "ten.jsonl").write_text(
        "".join(
            json.dumps({"prompt": f"question number {i} about slots"}) + "\n" for i in range(10)
        )
    )
    data = Workload("ten", 2, 4, prompts=str(tmp_path / "ten.jsonl"))
    made = Workload("made", 2, 2, input_tokens=6)
    # Nothing listens on port 9: no /tokenize, so the prompts are word-counted ("approximate").
    feed = Feed("http://127.0.0.1:9", "m", "run-1", 0, 0)

    async def prepare() -> list[Prepared]:
        return [
            await feed.point(data, "t/ten/c1/rep1"),
            await feed.point(data, "t/ten/c2/rep1"),
            await feed.point(made, "t/made/c1/rep1"),
        ]

    first, second, one = asyncio.run(prepare())
    sent = [r.prompt for p in (first, second) for r in p.requests]
    assert len(set(sent)) == 8  # no entry twice before the ten are used up
    assert (first.workload["dataset_offset"], second.workload["dataset_offset"]) == (0, 4)
    assert second.workload["dataset_repeats"] == 0
    assert one.workload["prompt_length_method"] == "approximate"
    resumed = Feed("http://127.0.0.1:9", "m", "run-1", 0, 0, "/resumed-after-2")
    again = asyncio.run(resumed.point(made, "t/made/c1/rep1"))
    assert again.workload["prompt_seed"] != one.workload["prompt_seed"]
    assert {r.prompt for r in again.requests}.isdisjoint({r.prompt for r in one.requests})


def test_content_parts_are_text_and_a_dataset_broken_since_the_plan_is_refused(
    tmp_path: Path,
) -> None:
    path = tmp_path / "parts.jsonl"
    parts = [{"type": "text", "text": "how many "}, {"type": "text", "text": "slots?"}]
    path.write_text(json.dumps({"messages": [{"role": "user", "content": parts}]}) + "\n")
    (entry,) = datasets.load(str(path)).entries
    assert entry.messages == (("user", "how many slots?"),)
    w = Workload("parts", 2, 1, prompts=str(path), endpoint="chat")
    path.write_text('{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}\n')
    with pytest.raises(PlanError) as err:
        asyncio.run(Feed("http://127.0.0.1:9", "m", "run-1", 0, 0).point(w, "t/parts/c1/rep1"))
    (issue,) = err.value.issues
    assert issue.path == "workloads[parts].prompts" and "line 1: messages[0]" in str(issue)
