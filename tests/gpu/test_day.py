"""The benchmark day on a real GPU (examples/benchmark-day/), cut to a test's size.

benchmarks/day/gpu.py --size smoke runs three of the day's sets (the baseline, the model as its
own draft, a synthetic acceptance length) each as its rendered unit would start it (unit_run:
preflight, `ct200-doctor gate`, ExecStart, wait-ready), measures each with `ct200-bench run PLAN
--target`, and reports against `ar`. Judged by the day's own checks (benchmarks/day/checks.py):
every request answered whole, the server's per-token time beside the client's, acceptance
recorded on every speculative point (about 1.0 drafting for itself, about what was asked under
--spec-synth-len, none autoregressive); and the report's speed-up has its noise.

Run on the GPU machine, after `bash tests/gpu/carry_llama.sh` here (carry .gpu-carry):
    python3 -m pytest tests/gpu/test_day.py -q
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from benchmarks.day import checks
from tests.gpu import llama_cuda

pytestmark = pytest.mark.timeout(llama_cuda.BUILD_TIMEOUT_S + 900)

ROOT = Path(__file__).resolve().parents[2]
SETS = ["ar", "draft-self-4", "synth-2"]


def test_the_day_on_the_gpu(tmp_path: Path) -> None:
    reason = llama_cuda.missing()
    if reason is not None:
        pytest.fail(reason)  # on the GPU machine, a missing build is a broken test, not a pass
    work, out = tmp_path / "work", tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "benchmarks/day/gpu.py", "--out", str(out), "--work", str(work),
         "--sets", ",".join(SETS), "--size", "smoke"],
        cwd=ROOT, capture_output=True, text=True, timeout=llama_cuda.BUILD_TIMEOUT_S + 800,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    points = [json.loads(x) for x in (work / "results" / "results.jsonl").read_text().splitlines()]
    assert checks.problems(points, requests=8, output_tokens=64, want_sets=SETS) == []
    assert {p["serving_set"] for p in points} == set(SETS)
    assert len(points) == len(SETS) * 2 * 2  # sets x loads x repetitions
    # The gate admitted each set before it served (unit_run's ExecStartPre, rc 0 each).
    for name in SETS:
        unit = json.loads((work / f"unit-{name}.json").read_text())
        assert [step["rc"] for step in unit["exec_start_pre"]] == [0, 0], name
    md = (work / "report" / "speedup.md").read_text()
    for name in SETS[1:]:
        # "| set |" with one workload, "| set / workload |" with several.
        rows = [r for r in md.splitlines() if r.startswith((f"| {name} |", f"| {name} / "))]
        assert len(rows) == 2, md  # one a load
        assert all(" ± " in r for r in rows), rows  # two repetitions: the noise
    with tarfile.open(out / "day.tar.gz") as tar:
        assert "report/speedup.tex" in tar.getnames()
