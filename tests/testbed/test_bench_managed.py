"""ct200-bench's managed mode on the testbed, for real: playbooks/bench.yml runs a plan on the
container, which switches between two serving sets with the real `ct200-serve switch` (systemd
units, staging units), admits each server by the real doctor (`ct200-doctor check --server
NAME`), and measures llama-server on the CPU (tests/server_sites.py: `tiny` and `tiny-b` share
port 8081, so each switch stops the other): `tiny-b`, then the set `pair` of `tiny` and
`tiny-port` (port 8087) switched to at once, serving side by side, measured one after the
other. Then the doctor refuses a set whose staged model changed since staging (exit 5, its root
cause and fix), and --force measures it anyway, recorded as forced.

Small on purpose (CI time): two requests of four tokens a point, one point a set.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from tbharness import AnsibleRun, Bed
from test_servers import CLEANUP, setup

from testbed.machine import hostname

pytestmark = pytest.mark.testbed

SITE = "playbooks/site.yml"
BENCH = "playbooks/bench.yml"
CT = hostname("ct")
LIMIT = ("--limit", f"{CT},localhost")
BENCH_CMD = "/usr/local/bin/ct200-bench"
ON_CT = "/var/lib/ct200/bench"
MODEL_FILE = "/dev/shm/models/tiny-a/model.gguf"
PAIR = {"name": "pair", "servers": ["tiny", "tiny-port"]}
PLAN = {
    "workloads": [{"name": "tiny", "input_tokens": 8, "output_tokens": 4, "requests": 2}],
    "concurrency": [1],
    "timeout_s": 120,
}


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@dataclass
class Run:
    rc: int
    stdout: str
    stderr: str
    points: list[dict[str, Any]]
    provenance: dict[str, Any]


def bench_on_ct(bed: Bed, plan: str, out: str, *args: str) -> Run:
    """ct200-bench run on the container, its results read back."""
    proc = bed.ssh("ct", BENCH_CMD, "run", plan, "--out", out, *args, timeout=600)
    results = bed.ssh("ct", "cat", f"{out}/results.jsonl").stdout
    prov = bed.ssh("ct", "sh", "-c", f"cat {out}/runs/*/provenance.json").stdout
    return Run(
        proc.returncode,
        proc.stdout,
        proc.stderr,
        [json.loads(x) for x in results.splitlines()],
        json.loads(prov) if prov.strip() else {},
    )


@dataclass
class Managed:
    playbook: AnsibleRun
    fetched: Path
    points: list[dict[str, Any]]
    provenance: dict[str, Any]
    serving_after: str
    refused: Run
    forced: Run


@pytest.fixture(scope="module")
def managed(testbed: Bed) -> Iterator[Managed]:
    bed = testbed
    s = setup(bed)
    try:
        converge = bed.ansible(SITE, *LIMIT, "-e", f"@{s.site_file}")
        assert converge.rc == 0, converge.describe()
        # The sweep: tiny-b first (switching stops tiny, which the converge started), then
        # tiny again beside tiny-port, through the playbook as a user runs it.
        plan = bed.workdir / "bench-plan.yml"
        plan.write_text(yaml.safe_dump({**PLAN, "serving_sets": ["tiny-b", PAIR]}))
        results = bed.workdir / "bench-results"
        run = bed.ansible(
            BENCH,
            *LIMIT,
            *("-e", f"@{s.site_file}", "-e", f"ct200_bench_plan={plan}"),
            *("-e", f"ct200_bench_results={results}"),
        )
        fetched = results / CT / "results"
        prov_files = sorted(fetched.glob("runs/*/provenance.json"))
        serving = bed.ssh("ct", "cat", "/var/lib/ct200/serving.json").stdout
        # The doctor's refusal: tiny serves, but its staged model changed since staging (the
        # switch finds tiny running and keeps it; the doctor's models.staged does not pass).
        one = bed.workdir / "bench-one.yml"
        one.write_text(yaml.safe_dump({**PLAN, "serving_sets": ["tiny"]}))
        bed.push("ct", one, f"{ON_CT}/one.yml", 0o644)
        touched = bed.ssh("ct", "touch", MODEL_FILE)
        assert touched.returncode == 0, touched.stderr
        refused = bench_on_ct(bed, f"{ON_CT}/one.yml", f"{ON_CT}/refused")
        forced = bench_on_ct(bed, f"{ON_CT}/one.yml", f"{ON_CT}/forced", "--force")
        yield Managed(
            run,
            fetched,
            lines(fetched / "results.jsonl"),
            json.loads(prov_files[0].read_text()) if prov_files else {},
            serving,
            refused,
            forced,
        )
    finally:
        bed.ssh("ct", "sh", "-c", CLEANUP)
        if s.shm_before:
            bed.ssh("ct", "mount", "-o", f"remount,size={s.shm_before}", "/dev/shm")


def test_the_playbook_runs_the_plan_and_fetches_the_results(managed: Managed) -> None:
    run = managed.playbook
    assert run.rc == 0, run.describe()
    assert run.stats[CT]["failures"] == 0, run.describe()
    # Unpacked on the controller, provenance beside the points.
    assert (managed.fetched / "results.jsonl").is_file()
    assert list(managed.fetched.glob("runs/*/provenance.json"))


def test_a_sweep_over_two_sets_switches_between_them(managed: Managed) -> None:
    points = managed.points
    got = [(p["serving_set"], p["server"], p["target"]) for p in points]
    assert got == [  # the targets from the spec
        ("tiny-b", "tiny-b", "http://127.0.0.1:8081"),
        ("pair/tiny", "tiny", "http://127.0.0.1:8081"),
        ("pair/tiny-port", "tiny-port", "http://127.0.0.1:8087"),
    ], managed.playbook.describe()
    for p in points:
        assert p["gated"] is True and p["forced"] is False
        assert p["requests_completed"] == 2 and p["requests_failed"] == 0
        assert p["output_tokens"] == 8  # the server's usage: 2 requests x 4 tokens
        assert p["gpu"]["before"] == {"available": False, "reason": "the server has no GPUs"}
        # The playbook names the host by its inventory name (CT200_BENCH_HOST): fetched
        # results of several hosts are so many configurations in the report.
        assert p["identity"]["host"] == CT
    prov = managed.provenance
    assert (prov["mode"], prov["gated"], prov["state"]) == ("managed", True, "finished")
    assert "tiny-b" in prov["spec"]["text"]
    assert sorted(prov["sets"]) == ["pair/tiny", "pair/tiny-port", "tiny-b"]
    for label, entry in prov["sets"].items():
        name = entry["server"]
        assert label.endswith(name) and entry["serving_set"] == label.split("/")[0]
        assert entry["gate"]["passed"] is True, entry["gate"]
        assert entry["switch"]["ok"] is True
        assert [s["step"] for s in entry["switch"]["steps"]][-2:] == ["start", "persist"]
        assert entry["files"]["unit"]["text"].startswith(f"# ct200-server-{name}.service")
        assert "ExecStart=" in entry["files"]["unit"]["text"]
        assert entry["files"]["environment_file"]["text"] is not None
        assert entry["engine"]["engine"]["name"] == "llama-server"
        assert entry["facts"]["servers"] is not None
    # One switch brought both servers of the pair up (tiny's steps then tiny-port's).
    pair = prov["sets"]["pair/tiny"]["switch"]
    assert pair == prov["sets"]["pair/tiny-port"]["switch"]
    assert json.loads(managed.serving_after)["servers"] == ["tiny", "tiny-port"]


def test_the_doctor_refuses_a_set_with_its_root_cause_and_fix(managed: Managed) -> None:
    r = managed.refused
    assert r.rc == 5, r.stdout + r.stderr
    assert "ct200-bench: refused: tiny is not benchmark-ready" in r.stderr
    assert "models.staged" in r.stderr and "ct200-stage stage tiny-a" in r.stderr
    assert "--force" in r.stderr
    assert r.points == []
    assert r.provenance["state"] == "refused"


def test_force_measures_anyway_and_records_it(managed: Managed) -> None:
    f = managed.forced
    assert f.rc == 0, f.stdout + f.stderr
    assert len(f.points) == 1
    (p,) = f.points
    assert p["forced"] is True and p["gated"] is True
    assert "models.staged" in [g["id"] for g in p["gate_failures"]]
    assert p["requests_completed"] == 2
    assert f.provenance["sets"]["tiny"]["forced"] is True
    assert "FORCED" in f.stdout
