"""benchmarks/day/ off the GPU: the site the GPU runner writes is valid and renders every set
for the GPU, the plans it sizes for a device session (and the full one) validate, a set it does
not know is refused, and its report step turns results into the report and, with pdflatex, the
PDF and its first page as PNG (the stand-in server measured as `ar` and a faster `spec`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from benchmarks.day import gpu, sets
from ct200_tools.bench import session
from ct200_tools.serve import engines
from ct200_tools.spec import validate
from tests.unit.bench_helpers import bench, standin

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]


def test_the_gpu_site_renders_every_set_on_the_gpu(tmp_path: Path) -> None:
    src = tmp_path / "models" / gpu.MODEL
    raw = sets.machine_raw(
        program=Path("/tmp/llama-cuda/llama-server"),
        source={gpu.MODEL: src, f"{gpu.MODEL}-draft": src},
        gpu="H200",
        port=gpu.PORT,
    )
    # Written as YAML and read back, as unit_run reads the file.
    site = validate(yaml.safe_load(yaml.safe_dump({"ct200_site": raw}))["ct200_site"])
    assert [s.name for s in site.servers] == sets.set_names()
    for server in site.servers:
        argv = engines.argv(site, server)
        assert argv[0] == "/tmp/llama-cuda/llama-server"
        assert argv[argv.index("-ngl") + 1] == "99" and argv[argv.index("--port") + 1] == "18180"
        if server.speculative is not None and server.name != "ngram":
            assert argv[argv.index("-md") + 1] == "/dev/shm/models/day-1p5b-draft/model.gguf"
            assert argv[argv.index("--spec-draft-ngl") + 1] == "99"
    assert {m.name: m.source for m in site.models} == {
        gpu.MODEL: str(src),
        f"{gpu.MODEL}-draft": str(src),
    }


@pytest.mark.parametrize("size", [gpu.SIZE, None], ids=["session", "full"])
def test_every_set_plan_validates(size: dict[str, object] | None, tmp_path: Path) -> None:
    for name in sets.set_names():
        path = sets.write_plan(tmp_path / f"plan-{name}.yml", sets.set_plan(name, size))
        plan = session.plan_from_file(str(path), None, None, None, None)
        assert [s.name for s in plan.serving_sets] == [name]
        assert plan.concurrency == (1, 2, 4, 8, 16, 32) and plan.repetitions == 3


def test_an_unknown_set_is_refused_before_anything_runs(tmp_path: Path) -> None:
    # Before the carried source is looked at (a build takes minutes).
    proc = subprocess.run(
        [sys.executable, "benchmarks/day/gpu.py", "--out", str(tmp_path / "o"), "--work",
         str(tmp_path / "w"), "--sets", "nope"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 1 and "--sets: no serving set ['nope']; the day has" in proc.stderr
    assert not (tmp_path / "w" / "models").exists()


def test_the_report_step_writes_the_report_and_the_pdf(tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    out.mkdir()
    results = work / "results"
    for name, itl in (("ar", "0.02"), ("spec", "0.01")):
        with standin("--itl", itl, "--timings") as url:
            proc = bench(
                "run", "--target", url, "--concurrency", "1,2", "--input-tokens", "4",
                "--output-tokens", "7", "--requests", "2", "--repetitions", "2", "--out",
                str(results), "--label", name,
            )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    (work / "site.yml").write_text("ct200_site: {}\n")
    assert gpu.report(work, out) == 0
    rep = work / "report"
    assert (rep / "report.html").is_file() and (rep / "speedup.tex").is_file()
    with tarfile.open(out / "day.tar.gz") as tar:  # the one file that comes back
        names = set(tar.getnames())
    assert {"results/results.jsonl", "report/speedup.tex", "site.yml"} <= names
    if shutil.which("pdflatex") is None:
        (pytest.fail if os.environ.get("CI") else pytest.skip)("no pdflatex: bash scripts/setup.sh")
    assert (rep / "speedup.pdf").read_bytes()[:5] == b"%PDF-"
    if shutil.which("pdftoppm") is not None:  # poppler-utils, which setup.sh installs too
        assert (rep / "page-1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
