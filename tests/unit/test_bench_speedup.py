"""Acceptance from llama-server's per-request timings, in the report as vLLM's and SGLang's is,
and the speed-up over a baseline configuration (ct200_tools/bench/speedup.py)."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ct200_tools.bench import aggregate, speedup
from ct200_tools.bench.metrics import acceptance_length
from tests.unit.bench_helpers import bench, standin

pytestmark = pytest.mark.timeout(180)

RUN = ("--input-tokens", "4", "--output-tokens", "7", "--requests", "3", "--repetitions", "3")


def test_acceptance_length_is_llama_servers_mean_len() -> None:
    # Seen on the CPU llama-server (tiny model, 64 tokens a request), its log's `mean len`
    # beside its timings: self-draft 50 of 50 drafted -> 4.85; --spec-synth-len 2: 31 of 126
    # -> 1.97, 33 of 117 -> 2.10.
    assert acceptance_length([{"predicted_n": 64, "draft_n": 50, "draft_n_accepted": 50}]) == (
        round(63 / 13, 4)
    )
    assert acceptance_length([{"predicted_n": 64, "draft_n_accepted": 31}]) == round(63 / 32, 4)
    both = [
        {"predicted_n": 64, "draft_n_accepted": 31},
        {"predicted_n": 64, "draft_n_accepted": 33},
    ]
    assert acceptance_length(both) == round(126 / 62, 4)  # over all steps, not a mean of means
    # A count no step could produce (more accepted than tokens after the first) is no figure.
    assert acceptance_length([{"predicted_n": 4, "draft_n_accepted": 4}]) is None
    assert acceptance_length([{"draft_n_accepted": 3}]) is None


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two configurations against the stand-in: `ar` (no timings) and `spec` (llama-server's
    timings with draft counts), the latter faster per token, at concurrency 1 and 2."""
    out = tmp_path_factory.mktemp("runs") / "results"
    for name, extra in (("ar", ("--itl", "0.02")), ("spec", ("--itl", "0.01", "--timings"))):
        with standin(*extra) as url:
            proc = bench(
                "run", "--target", url, "--concurrency", "1,2", *RUN, "--out", str(out),
                "--label", name,
            )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    return out


def test_the_report_reads_acceptance_from_engine_timings(day: Path, tmp_path: Path) -> None:
    loaded = aggregate.load([str(day)])
    spec = [g for g in loaded.groups if g.config == "spec"]
    assert len(spec) == 2
    for g in spec:
        length, rate = g.figure("acceptance_length"), g.figure("acceptance_rate")
        # 7 tokens: 3 accepted of 6 drafted, 6 tokens after the first in 3 steps.
        assert length is not None and (length.mean, length.n) == (2.0, 3)
        assert rate is not None and rate.mean == 0.5
    for g in loaded.groups:
        if g.config == "ar":
            assert g.figure("acceptance_length") is None
    out = tmp_path / "report"
    proc = bench("report", str(day), "--out", str(out), "--baseline", "ar")
    assert proc.returncode == 0, proc.stderr
    md = (out / "table.md").read_text().splitlines()
    accept = md[0].split(" | ").index("Accept len")
    cells = {r.split(" | ")[0].lstrip("| "): r.split(" | ")[accept] for r in md[2:]}
    assert cells == {"ar": "-", "spec": "2.00 ± 0.00"}, md
    page = (out / "report.html").read_text()
    assert "Speculative acceptance length" in page and "Against the baseline" in page


def test_speed_up_over_the_baseline_with_its_noise(day: Path, tmp_path: Path) -> None:
    loaded = aggregate.load([str(day)])
    ups = speedup.speedups(loaded, "ar")
    for c in ("c=1", "c=2"):
        base = next(g for g in loaded.groups if g.config == "ar" and g.load == c)
        spec = next(g for g in loaded.groups if g.config == "spec" and g.load == c)
        a, b = base.figure("output_tokens_per_s"), spec.figure("output_tokens_per_s")
        assert a is not None and b is not None and a.stdev is not None and b.stdev is not None
        r = ups["spec", "tiny", c] if ("spec", "tiny", c) in ups else ups["spec", base.workload, c]
        assert math.isclose(r.value, b.mean / a.mean)
        assert r.noise is not None
        assert math.isclose(r.noise, r.value * math.hypot(a.stdev / a.mean, b.stdev / b.mean))
        assert r.value > 1  # half the time a token: faster, whatever the machine's noise
        assert ups["ar", base.workload, c].value == 1.0
    rows = speedup.rows(loaded, "ar")
    assert [r[:2] for r in rows] == [["ar", "1"], ["ar", "2"], ["spec", "1"], ["spec", "2"]]
    # The baseline's rows come first, whatever its name.
    assert [r[0] for r in speedup.rows(loaded, "spec")] == ["spec", "spec", "ar", "ar"]
    assert all(r[5].startswith("1.00 ± ") for r in rows[:2])
    assert all(r[4] == "-" for r in rows[:2]) and all(r[4].startswith("2.00") for r in rows[2:])
    # Without a baseline the column is empty; a baseline the results lack is refused (exit 2).
    assert all(r[5] == "-" for r in speedup.rows(loaded, None))
    proc = bench("report", str(day), "--out", str(tmp_path / "r"), "--baseline", "nope")
    assert proc.returncode == 2 and "--baseline" in proc.stderr and "ar, spec" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_latex_table_compiles_to_a_pdf(day: Path, tmp_path: Path) -> None:
    if shutil.which("pdflatex") is None:
        # scripts/setup.sh installs TeX Live's base and recommended sets: CI must have them.
        (pytest.fail if os.environ.get("CI") else pytest.skip)("no pdflatex: bash scripts/setup.sh")
    out = tmp_path / "report"
    assert bench("report", str(day), "--out", str(out), "--baseline", "ar").returncode == 0
    tex = (out / "speedup.tex").read_text()
    assert r"\begin{longtable}{lrrrrr}" in tex and "spec & 2 &" in tex
    proc = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "-no-shell-escape",
         "speedup.tex"],
        cwd=out, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert (out / "speedup.pdf").read_bytes()[:5] == b"%PDF-"
    if shutil.which("pdftotext"):
        text = subprocess.run(
            ["pdftotext", "-layout", "speedup.pdf", "-"], cwd=out, capture_output=True,
            text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        assert "Speed-up" in text and "spec" in text and "Accept len" in text
