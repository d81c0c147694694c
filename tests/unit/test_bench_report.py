"""ct200-bench report and compare on results made by real runs against the stand-in server."""

from __future__ import annotations

import json
import re
from pathlib import Path
from xml.etree import ElementTree

import pytest

from ct200_tools.bench import aggregate, compare
from tests.unit.bench_helpers import bench, standin

pytestmark = pytest.mark.timeout(180)

RUN = ("--input-tokens", "4", "--output-tokens", "4", "--requests", "3", "--repetitions", "3")


@pytest.fixture(scope="module")
def two_configs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two serving sets (labels), one fast and one slow per token, at concurrency 1 and 2."""
    base = tmp_path_factory.mktemp("runs")
    fast, slow = base / "fast", base / "slow"
    # Ten times apart and far above a loaded machine's scheduling delays: the regression must
    # stand out of the noise the repetitions measure however busy the machine is.
    for out, itl, name in ((fast, "0.03", "fast&<b>"), (slow, "0.3", "slow_set")):
        with standin("--itl", itl) as url:
            proc = bench(
                "run",
                "--target",
                url,
                "--concurrency",
                "1,2",
                *RUN,
                "--out",
                str(out),
                "--label",
                name,
            )
        assert proc.returncode == 0, proc.stderr
    return fast, slow


def test_report_writes_html_png_markdown_latex(
    two_configs: tuple[Path, Path], tmp_path: Path
) -> None:
    out = tmp_path / "report"
    proc = bench("report", *map(str, two_configs), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    page = (out / "report.html").read_text()
    # Self-contained: three inline SVG plots, nothing fetched.
    assert page.count("<svg") == 3 and "src=" not in page and "href=" not in page
    for svg in re.findall(r"<svg.*?</svg>", page, re.S):
        ElementTree.fromstring(svg)  # noqa: S314 - our own output: well-formed, label escaped
    assert "fast&amp;&lt;b&gt;" in page and "<b>" not in page
    for name in ("throughput", "ttft", "itl"):
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "table.md").read_text().splitlines()
    assert len(md) == 2 + 4  # header, rule, 2 configurations x 2 loads
    assert any(line.startswith("| slow_set | c=2 | 3 | 9/0 |") for line in md)
    tex = (out / "table.tex").read_text()
    assert r"slow\_set & c=1 & 3 & 9/0 &" in tex and r"fast\&<b>" in tex
    assert tex.count(r"\\") == 5 and "$\\pm$" in tex


def test_compare_flags_the_slow_set_as_a_regression_of_the_fast_one(
    two_configs: tuple[Path, Path],
) -> None:
    fast, slow = two_configs
    old, new = aggregate.load([str(fast)]), aggregate.load([str(slow)])
    for g in new.groups:  # compare configurations: same label on both sides
        g.config = "x"
    for g in old.groups:
        g.config = "x"
    changes = compare.compare(old, new)
    flagged = {(c.load, c.figure) for c in changes if c.regression}
    assert ("c=1", "output_tokens_per_s") in flagged and ("c=1", "itl_p50_ms") in flagged
    assert all(c.noise is not None for c in changes)  # 3 repetitions measured it
    # And no regression of a run against itself.
    assert not any(c.regression for c in compare.compare(old, old))


def test_compare_cli_exit_codes(two_configs: tuple[Path, Path]) -> None:
    fast, slow = two_configs
    same = bench("compare", str(fast), str(fast), "--json")
    assert same.returncode == 0, same.stderr
    doc = json.loads(same.stdout)
    assert doc["schema_version"] == 1 and doc["changes"]
    disjoint = bench("compare", str(fast), str(slow))  # other labels: nothing in common
    assert disjoint.returncode == 2 and "nothing to compare" in disjoint.stderr


def test_noise_beyond_the_threshold_is_no_regression() -> None:
    def group(values: list[float]) -> aggregate.Group:
        g = aggregate.Group("s", "w", 1, None)
        g.points = [{"output_tokens_per_s": v} for v in values]
        return g

    old = aggregate.Loaded([group([100.0, 60.0, 140.0])], 0, {})
    new = aggregate.Loaded([group([90.0, 50.0, 130.0])], 0, {})
    (change,) = [c for c in compare.compare(old, new) if c.figure == "output_tokens_per_s"]
    assert change.better_by < -0.05 and not change.regression  # 10 % down, noise 40


def test_report_of_a_directory_without_results_is_exit_2(tmp_path: Path) -> None:
    proc = bench("report", str(tmp_path), "--out", str(tmp_path / "r"))
    assert proc.returncode == 2 and "fix:" in proc.stderr and "Traceback" not in proc.stderr
