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
