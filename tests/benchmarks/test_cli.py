"""benchmarks/_cli.py, the command line every benchmark shares, and every benchmark's main()
parsing through it (no testbed is booted: a refused --runs 0 exits before anything runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import _cli

REPO = Path(__file__).resolve().parents[2]

#: Every benchmark's one-line command (as its README gives it) and its name for --runs.
BENCHMARKS = [
    (["-m", "benchmarks.ansible.bench"], "--reps"),
    (["-m", "benchmarks.host.bench"], "--reps"),
    (["-m", "benchmarks.hostdoctor.bench"], "--reps"),
    (["-m", "benchmarks.recovery.bench"], "--runs"),
    (["-m", "benchmarks.servers.bench"], "--runs"),
    (["-m", "benchmarks.fleet.bench"], "--reps"),
    (["-m", "benchmarks.stage", "--out", "unused"], "--rounds"),
    (["benchmarks/gate/run.py", "--out", "unused"], "--runs"),
    (["benchmarks/doctor/run.py", "--out", "unused", "--spec", "unused"], "--runs"),
    (["benchmarks/doctor/phases.py", "--spec", "unused"], "--runs"),
]


def test_runs_default_and_given() -> None:
    p = _cli.parser("A benchmark.\nMore.", runs=3, runs_flag="--reps", json=True, out="here")
    a = p.parse_args([])
    assert (a.runs, a.json, a.out) == (3, False, None)
    assert p.description == "A benchmark."
    a = p.parse_args(["--reps", "2", "--json", "--out", "d"])
    assert (a.runs, a.json, a.out) == (2, True, Path("d"))


@pytest.mark.parametrize("given", ["0", "-1", "two"])
def test_runs_that_are_no_count_exit_2(given: str, capsys: pytest.CaptureFixture[str]) -> None:
    p = _cli.parser(None, runs=3)
    with pytest.raises(SystemExit) as exc:
        p.parse_args(["--runs", given])
    assert exc.value.code == 2
    assert "argument --runs:" in capsys.readouterr().err


def test_out_required_and_default() -> None:
    with pytest.raises(SystemExit):
        _cli.parser(None, out="dir", out_required=True).parse_args([])
    assert _cli.parser(None, out="dir", out_default="/x").parse_args([]).out == Path("/x")
    assert not hasattr(_cli.parser(None).parse_args([]), "out")


def test_write_results_replaces_both_files(tmp_path: Path) -> None:
    out = tmp_path / "new" / "dir"
    path = _cli.write_results(out, {"a": 1}, "first\n", stem="gate")
    assert path == out / "gate.json" and json.loads(path.read_text()) == {"a": 1}
    _cli.write_results(out, {"a": 2}, "second\n", stem="gate")
    assert json.loads(path.read_text()) == {"a": 2}
    assert (out / "gate.txt").read_text() == "second\n"
    assert sorted(p.name for p in out.iterdir()) == ["gate.json", "gate.txt"]  # no temp files
    _cli.write_results(tmp_path / "j", {"b": 1})
    assert sorted(p.name for p in (tmp_path / "j").iterdir()) == ["results.json"]


def test_scratch_is_removed_even_on_failure() -> None:
    with pytest.raises(RuntimeError), _cli.scratch("unit") as tmp:
        assert tmp.is_dir() and tmp.name.startswith("ct200-bench-unit-")
        (tmp / "f").write_text("x")
        raise RuntimeError
    assert not tmp.exists()


def test_show_prints_json_or_text(capsys: pytest.CaptureFixture[str]) -> None:
    figures = {"x_s": 1.5, "n": 2}
    _cli.show(figures, _cli.table(figures, 6), as_json=False)
    assert capsys.readouterr().out == "x_s    1.5\nn      2\n"
    _cli.show(figures, "unused", as_json=True)
    assert json.loads(capsys.readouterr().out) == figures


@pytest.mark.parametrize(
    ("argv", "flag"), BENCHMARKS, ids=[b[0][1] if b[0][0] == "-m" else b[0][0] for b in BENCHMARKS]
)
def test_every_benchmark_parses_through_the_helper(argv: list[str], flag: str) -> None:
    """A count of 0 is refused by _cli.count, in its words, before the benchmark starts."""
    proc = subprocess.run(
        [sys.executable, *argv, flag, "0"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"argument {flag}: must be at least 1, got 0" in proc.stderr
