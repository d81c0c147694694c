"""Benchmark plans: a valid plan runs; each mutation of it exits 2 naming the field and a fix."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from ct200_tools.bench.plan import PlanError, load_plan
from tests.unit.bench_helpers import bench, standin

pytestmark = pytest.mark.timeout(120)

GOOD = {
    "serving_sets": ["qwen-tp4-ddtree"],
    "workloads": [
        {"name": "short", "input_tokens": 8, "output_tokens": 3, "requests": 3},
        {"name": "file", "prompts": "prompts.jsonl", "output_tokens": 2, "requests": 2},
    ],
    "concurrency": [1, 2],
    "request_rates": [50.0],
    "repetitions": 2,
    "warmup": 1,
    "slo": {"ttft_ms": 5000, "tpot_ms": 1000},
    "seed": 7,
    "timeout_s": 30,
}


def write(tmp_path: Path, plan: object) -> Path:
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "one two three"}\n\n{"prompt": "four"}\n')
    path = tmp_path / "plan.yml"
    path.write_text(yaml.safe_dump(plan))
    return path


def test_a_plan_runs_every_point_with_goodput(tmp_path: Path) -> None:
    plan = write(tmp_path, GOOD)
    with standin() as url:
        proc = bench("run", str(plan), "--target", url, "--out", str(tmp_path / "o"), "--json")
    assert proc.returncode == 0, proc.stderr
    points = [json.loads(line) for line in proc.stdout.splitlines()]
    # 2 workloads x (2 levels + 1 rate) x 2 repetitions.
    assert len(points) == 12
    assert {p["serving_set"] for p in points} == {"qwen-tp4-ddtree"}
    assert {p["workload"]["prompt_length_method"] for p in points} == {"tokenize", "file"}
    assert all(p["warmup_requests"] == 1 and p["requests_good"] == p["requests"] for p in points)
    file_points = [p for p in points if p["workload"]["name"] == "file"]
    # The prompts file's two prompts, one word a token at the stand-in: 3 + 1.
    assert all(p["input_tokens"] == 4 for p in file_points)
    assert [p["request_rate"] for p in points[:6]] == [None] * 4 + [50.0] * 2
    (run_dir,) = (tmp_path / "o" / "runs").iterdir()
    prov = json.loads((run_dir / "provenance.json").read_text())
    assert prov["serving_set"] == "qwen-tp4-ddtree" and prov["plan"]["repetitions"] == 2


def mutate(path: str, value: object) -> dict[str, object]:
    plan = json.loads(json.dumps(GOOD))
    node = plan
    parts = path.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else node[part]
    last = parts[-1]
    if value is KeyError:
        del node[int(last) if last.isdigit() else last]
    elif last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value
    return plan


@pytest.mark.parametrize(
    ("path", "value", "field", "words"),
    [
        ("concurrency.1", 0, "concurrency[1]", "out of range"),
        ("concurrency.0", "4", "concurrency[0]", "expected an integer"),
        ("workloads.0.output_tokens", -1, "workloads[0].output_tokens", "out of range"),
        ("workloads.0.input_tokens", KeyError, "workloads[0]", "neither input_tokens nor"),
        ("workloads.1.input_tokens", 4, "workloads[1]", "both input_tokens and prompts"),
        ("workloads.0.nme", "x", "workloads[0].nme", "unknown key"),
        ("workloads.1.name", "short", "workloads[1].name", "used twice"),
        ("slo.ttft_ms", "fast", "slo.ttft_ms", "expected a number"),
        ("repetitions", 0, "repetitions", "out of range"),
        ("request_rates.0", 0, "request_rates[0]", "above 0"),
        ("serving_sets.0", "a\nb", "serving_sets[0]", "control character"),
        ("serving_sets.0", 5, "serving_sets[0]", "a server's name or {name, servers}"),
        ("serving_sets.0", {"name": "p"}, "serving_sets[0].servers", "required key is missing"),
        ("serving_sets.0", {"name": "p", "servers": []}, "serving_sets[0].servers", "no server"),
        (
            "serving_sets.0",
            {"name": "p", "servers": ["a", "a"]},
            "serving_sets[0].servers[1]",
            "listed twice",
        ),
        ("serving_sets.0", {"name": "p", "server": ["a"]}, "serving_sets[0].server", "unknown key"),
        ("workloads", KeyError, "workloads", "required key is missing"),
        ("workloads.0.input_tokens", {"min": 9, "max": 3}, "workloads[0].input_tokens", "above"),
        ("workloads.0.input_tokens", {"min": 2}, "workloads[0].input_tokens.max", "missing"),
        ("workloads.0.input_tokens", "lots", "workloads[0].input_tokens", "{min, max}"),
        (
            "workloads.0.output_tokens",
            {"min": 0, "max": 3},
            "workloads[0].output_tokens.min",
            "range",
        ),
        ("workloads.0.output_tokens", "from-dataset", "workloads[0].output_tokens", "without a"),
        ("workloads.0.input_tokens", "from-dataset", "workloads[0].input_tokens", "without a"),
        ("workloads.0.endpoint", "chats", "workloads[0].endpoint", "not one of"),
        ("workloads.0.shared_prefix_tokens", 8, "workloads[0].shared_prefix_tokens", "no fresh"),
        ("workloads.1.shared_prefix_tokens", 1, "workloads[1].shared_prefix_tokens", "dataset"),
        ("workloads.1.output_tokens", "from-dataset", "workloads[1].output_tokens", "reference"),
    ],
)
def test_a_mutated_plan_is_exit_2_with_the_field_path(
    tmp_path: Path, path: str, value: object, field: str, words: str
) -> None:
    plan = write(tmp_path, mutate(path, value))
    proc = bench("run", str(plan), "--target", "http://127.0.0.1:9", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"error: {field}: " in proc.stderr and words in proc.stderr, proc.stderr
    assert "(fix: " in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("a: [", "YAML error"),
        ("concurrency: [1]\nconcurrency: [2]\nworkloads: []", "duplicate key"),
        ("- 1\n- 2", "expected a mapping"),
        ("a: &a [*a, *a]", "alias"),
    ],
)
def test_a_plan_that_is_no_plan_is_refused(tmp_path: Path, content: str, words: str) -> None:
    path = tmp_path / "plan.yml"
    path.write_text(content)
    with pytest.raises(PlanError) as err:
        load_plan(str(path))
    assert words in " ".join(str(i) for i in err.value.issues)


def test_a_fifo_or_missing_prompts_file_is_exit_2(tmp_path: Path) -> None:
    plan = write(tmp_path, GOOD)
    (tmp_path / "prompts.jsonl").unlink()
    os.mkfifo(tmp_path / "prompts.jsonl")
    with standin() as url:
        proc = bench("run", str(plan), "--target", url, "--out", str(tmp_path / "o"))
    assert proc.returncode == 2, proc.stderr
    assert "FIFO" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("content", "where", "words"),
    [
        ('{"prompt": "a"}\n{"prompt": 3}\n', "line 2", "not a string"),
        ('{"prompt": "a"}\n\n{"text": "b"}\n', "line 3", "either a prompt or messages"),
        ('{"prompt": "a", "messages": []}\n', "line 1", "either a prompt or messages"),
        ('{"messages": [{"role": "bot", "content": "x"}]}\n', "line 1: messages[0]", "no role"),
        ('{"messages": [{"role": "assistant", "content": "x"}]}\n', "line 1", "nothing to answer"),
        ('{"prompt": "a", "output_tokens": -1}\n', "line 1", "not a number of tokens"),
        ('{"prompt": ' + "[" * 40 + "]" * 40 + "}\n", "line 1", "deeper than"),
        ('[{"conversations": []}, {"turns": []}]', "entry 1", "no conversations list"),
        (
            '[{"conversations": [{"from": "human", "value": 3}]}]',
            "entry 0: conversations[0]",
            "value",
        ),
        ('[{"conversations": [{"from": "gpt", "value": "x"}]}]', "prompts", "no conversation"),
        ("[1, 2", "prompts", "not JSON"),
        ("\xff", "prompts", "not UTF-8"),
    ],
)
def test_a_broken_dataset_is_refused_with_its_line_or_entry(
    tmp_path: Path, content: str, where: str, words: str
) -> None:
    plan = write(tmp_path, GOOD)
    # Latin-1: one byte a character, so "\xff" is a byte that is no UTF-8.
    (tmp_path / "prompts.jsonl").write_bytes(content.encode("latin-1"))
    with pytest.raises(PlanError) as err:
        load_plan(str(plan))
    (issue,) = err.value.issues
    assert issue.path == "workloads[1].prompts", issue
    assert where in str(issue) and words in str(issue) and issue.fix, str(issue)


def test_chat_messages_sent_to_completions_is_exit_2_naming_endpoint_chat(tmp_path: Path) -> None:
    plan = write(tmp_path, GOOD)
    (tmp_path / "prompts.jsonl").write_text(
        '{"prompt": "a"}\n{"messages": [{"role": "user", "content": "b"}]}\n'
    )
    proc = bench("run", str(plan), "--target", "http://127.0.0.1:9", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2, proc.stderr
    assert "error: workloads[1].prompts: line 2 is a list of chat messages" in proc.stderr
    assert "endpoint: chat" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()
    # The same file with endpoint: chat is a plan.
    fixed = write(tmp_path, mutate("workloads.1.endpoint", "chat"))
    (tmp_path / "prompts.jsonl").write_text(
        '{"prompt": "a"}\n{"messages": [{"role": "user", "content": "b"}]}\n'
    )
    assert load_plan(str(fixed)).workloads[1].endpoint == "chat"
