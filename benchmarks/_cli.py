"""The command line every benchmark shares, written once: the parser with --runs (or the
benchmark's own name for it: --reps, --rounds), --json and --out; a scratch directory; the
results files (NAME.json, and NAME.txt, the text it prints); and how the figures are printed.

Each benchmark's main() adds its own arguments and says what it measures. Run from the
repository root; a benchmark run as a script (`python3 benchmarks/x/run.py`) puts the root on
sys.path before importing this. The standard library and ct200_tools.fsutil only: the staging
benchmark runs on machines that have nothing installed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ct200_tools.fsutil import write_atomic


def count(text: str) -> int:
    """A number of runs: a whole number, at least 1 (a median of nothing is no figure)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def parser(
    doc: str | None,
    *,
    runs: int | None = None,
    runs_flag: str = "--runs",
    runs_help: str = "rounds of each measure",
    json: bool = False,
    out: str | None = None,
    out_required: bool = False,
    out_default: str | None = None,
    **kwargs: Any,
) -> argparse.ArgumentParser:
    """The benchmark's parser: its description is the docstring's first line (kwargs go to
    ArgumentParser, e.g. a whole description); `runs` (the default) adds `runs_flag` as
    args.runs, `json` adds --json (args.json), `out` (its help) adds --out as a Path."""
    if doc is not None and "description" not in kwargs:
        kwargs["description"] = doc.strip().splitlines()[0]
    p = argparse.ArgumentParser(**kwargs)
    if runs is not None:
        p.add_argument(
            runs_flag,
            dest="runs",
            type=count,
            default=runs,
            metavar="N",
            help=f"{runs_help} (default {runs})",
        )
    if json:
        p.add_argument("--json", action="store_true", help="print the figures as JSON")
    if out is not None:
        default = Path(out_default) if out_default is not None else None
        p.add_argument("--out", type=Path, required=out_required, default=default, help=out)
    return p


@contextlib.contextmanager
def scratch(name: str, parent: str | None = None) -> Iterator[Path]:
    """A directory of this run's own (ct200-bench-NAME-*), removed afterwards whatever happens."""
    with tempfile.TemporaryDirectory(prefix=f"ct200-bench-{name}-", dir=parent) as tmp:
        yield Path(tmp)


def write_results(
    out: Path, report: Mapping[str, Any], text: str | None = None, *, stem: str = "results"
) -> Path:
    """out/STEM.json (and out/STEM.txt with `text`), each replaced atomically, so that a run cut
    short keeps the last complete one; returns the JSON's path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}.json"
    write_atomic(str(path), json_text(report))
    if text is not None:
        write_atomic(str(out / f"{stem}.txt"), text)
    return path


def json_text(report: Mapping[str, Any]) -> str:
    return json.dumps(report, indent=1) + "\n"


def table(figures: Mapping[str, Any], width: int) -> str:
    """One `key  value` line per figure, keys padded to `width`."""
    return "".join(f"{key:<{width}} {value}\n" for key, value in figures.items())


def show(figures: Mapping[str, Any], text: str, as_json: bool = False) -> None:
    """Print the figures: as JSON with --json (the last thing printed, so a caller finds it
    after whatever the harness printed before), else the text."""
    print(json_text(figures) if as_json else text, end="")
