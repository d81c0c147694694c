"""The benchmark day (examples/benchmark-day/) in the managed mode on the testbed: the day's six
llama-server sets (CPU, the tiny model; sets.machine_raw) in the container's site spec,
playbooks/bench.yml runs the day's plan (small: fresh chat prompts, concurrency 1 and 2, two
repetitions) with the real `ct200-serve switch` and the real doctor between sets: every set
switched, gated, measured, acceptance recorded as each set asked; the fetched results report
with acceptance and the speed-up over `ar`. What a CT200 runs, with llama-server for SGLang.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from tbharness import AnsibleRun, Bed
from test_servers import CLEANUP

from benchmarks.day import checks, sets
from testbed import llama_build, llama_server
from testbed.machine import hostname
from tests.server_sites import SHM_SIZE, TESTBED_SPEC

pytestmark = pytest.mark.testbed

SITE = "playbooks/site.yml"
BENCH = "playbooks/bench.yml"
CT = hostname("ct")
LIMIT = ("--limit", f"{CT},localhost")
REPO = Path(__file__).resolve().parents[2]
MODEL = "day-1p5b"
REQUESTS, OUTPUT = 3, 24
SMALL = {"concurrency": [1, 2], "repetitions": 2, "warmup": 0, "timeout_s": 120}


def day_site() -> dict[str, Any]:
    base: dict[str, Any] = yaml.safe_load(TESTBED_SPEC.read_text())["ct200_site"]
    src = Path(llama_server.MODELS_ROOT) / MODEL  # both models: one persistent copy
    raw = sets.machine_raw(
        program=Path(llama_server.PROGRAM),
        source={MODEL: src, f"{MODEL}-draft": src},
        gpu=None,
        args={"parallel": 2, "ctx-size": 512, "threads": 1},
        port=8081,
    )
    for server in raw["servers"]:
        server["start_timeout"] = 120
    # The testbed's own GPU declaration stays (the servers use none).
    return {**base, "models": raw["models"], "servers": raw["servers"], "shm": {"size": SHM_SIZE}}


def day_plan() -> dict[str, Any]:
    plan = sets.set_plan(sets.BASELINE, SMALL)
    plan["serving_sets"] = sets.set_names()
    plan.pop("max_seconds", None)
    plan["workloads"] = [
        {**w, "requests": REQUESTS, "output_tokens": OUTPUT, "input_tokens": 16}
        for w in plan["workloads"]
        if "input_tokens" in w  # fresh prompts; the dataset is the llama test's
    ]
    return plan


@dataclass
class Day:
    converge: AnsibleRun
    run: AnsibleRun
    fetched: Path
    points: list[dict[str, Any]]
    provenance: dict[str, Any]


@pytest.fixture(scope="module")
def day(testbed: Bed) -> Iterator[Day]:
    bed = testbed
    built = llama_build.ensure()
    llama_server.install(bed.push, "ct", bed.workdir, built.binary, {MODEL: (0, 0)})
    site_file = bed.workdir / "day-site.yml"
    site_file.write_text(yaml.safe_dump({"ct200_site": day_site()}, sort_keys=False))
    shm_before = bed.ssh("ct", "findmnt", "--bytes", "-no", "SIZE", "/dev/shm").stdout.strip()
    try:
        converge = bed.ansible(SITE, *LIMIT, "-e", f"@{site_file}")
        assert converge.rc == 0, converge.describe()
        plan = bed.workdir / "day-plan.yml"
        plan.write_text(yaml.safe_dump(day_plan(), sort_keys=False))
        results = bed.workdir / "day-results"
        run = bed.ansible(
            BENCH,
            *LIMIT,
            *("-e", f"@{site_file}", "-e", f"ct200_bench_plan={plan}"),
            *("-e", f"ct200_bench_results={results}"),
        )
        fetched = results / CT / "results"
        prov = sorted(fetched.glob("runs/*/provenance.json"))
        points = [json.loads(x) for x in (fetched / "results.jsonl").read_text().splitlines()]
        yield Day(converge, run, fetched, points, json.loads(prov[0].read_text()) if prov else {})
    finally:
        bed.ssh("ct", "sh", "-c", CLEANUP)
        if shm_before:
            bed.ssh("ct", "mount", "-o", f"remount,size={shm_before}", "/dev/shm")


def test_every_set_is_switched_gated_and_measured(day: Day) -> None:
    assert day.run.rc == 0, day.run.describe()
    by_set: dict[str, list[dict[str, Any]]] = {}
    for p in day.points:
        by_set.setdefault(p["serving_set"], []).append(p)
    assert list(by_set) == sets.set_names()  # in the plan's order
    for name, got in by_set.items():
        assert len(got) == 2 * 2, name  # loads x repetitions
        for p in got:
            assert p["gated"] is True and p["forced"] is False
            assert (p["requests_completed"], p["requests_failed"]) == (REQUESTS, 0), p["errors"]
            assert p["output_tokens"] == REQUESTS * OUTPUT
    prov = day.provenance
    assert (prov["mode"], prov["gated"], prov["state"]) == ("managed", True, "finished")
    assert sorted(prov["sets"]) == sorted(sets.set_names())
    for name, entry in prov["sets"].items():
        assert entry["gate"]["passed"] is True, entry["gate"]
        assert entry["switch"]["ok"] is True
        unit = entry["files"]["unit"]["text"]
        if name != "ar":  # the speculative block rendered into the unit's ExecStart
            assert "--spec-type" in unit, unit


def test_acceptance_is_recorded_as_each_set_asked(day: Day) -> None:
    for p in day.points:
        name, timed = p["serving_set"], p["engine_timings"]
        if name == "ar":
            assert timed["acceptance_rate"] is None and timed["acceptance_length"] is None
        elif name.startswith("draft-self"):
            # Nearly every token (single-token drafting and batched verification may round
            # differently on some CPUs); the floor is the day's own (benchmarks/day/checks.py).
            assert timed["acceptance_rate"] >= checks.SELF_RATE_FLOOR, timed
        elif name.startswith("synth-"):
            want = float(name.split("-")[1])
            assert 0.5 * want <= timed["acceptance_length"] <= 1.5 * want, (name, timed)
        else:
            assert name == "ngram" and "draft_n" in timed


def test_the_fetched_results_report_acceptance_and_speed_up(day: Day, tmp_path: Path) -> None:
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "ct200_tools.cli.bench", "report", str(day.fetched), "--out",
         str(out), "--baseline", sets.BASELINE],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = (out / "speedup.md").read_text().splitlines()[2:]
    assert len(rows) == 6 * 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        if cells[0] == "ar":
            assert cells[4] == "-" and cells[5].startswith("1.00 ± ")
        elif cells[0] != "ngram":
            assert cells[4] != "-" and " ± " in cells[5], row
