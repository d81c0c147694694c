"""Points read back from results directories, grouped by configuration and load, with the
repetitions folded into a mean and a standard deviation (the noise `compare` judges against).

Results files are untrusted input (they may come from another machine): read bounded through
results.read_lines, and each field used is type-checked here; a point missing one is skipped
and counted, never a crash.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ct200_tools.bench.results import Store
from ct200_tools.untrusted import UntrustedInputError, show

#: The figures folded across repetitions: (name, where in a point, higher is better).
FIGURES: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("output_tokens_per_s", ("output_tokens_per_s",), True),
    ("total_tokens_per_s", ("total_tokens_per_s",), True),
    ("request_throughput", ("request_throughput",), True),
    ("ttft_p50_ms", ("ttft_ms", "p50"), False),
    ("ttft_p99_ms", ("ttft_ms", "p99"), False),
    ("tpot_p50_ms", ("tpot_ms", "p50"), False),
    ("itl_p50_ms", ("itl_ms", "p50"), False),
    ("itl_p99_ms", ("itl_ms", "p99"), False),
    ("e2e_p50_ms", ("e2e_ms", "p50"), False),
    ("acceptance_length", ("speculative", "acceptance_length"), True),
)
HIGHER_IS_BETTER = {name: higher for name, _, higher in FIGURES}


@dataclass(frozen=True)
class Stat:
    mean: float
    stdev: float | None  # None with one repetition: the noise is not measured
    n: int


def stat(values: Sequence[float]) -> Stat | None:
    if not values:
        return None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return Stat(mean, None, 1)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return Stat(mean, math.sqrt(var), len(values))


@dataclass
class Group:
    """One configuration at one load, over its repetitions."""

    config: str
    workload: str
    concurrency: int
    request_rate: float | None
    points: list[dict[str, object]] = field(default_factory=list)

    @property
    def load(self) -> str:
        return f"c={self.concurrency}" + (
            f" @ {self.request_rate:g} req/s" if self.request_rate is not None else ""
        )

    def figure(self, name: str) -> Stat | None:
        path = next(p for n, p, _ in FIGURES if n == name)
        values = []
        for point in self.points:
            value: object = point
            for part in path:
                value = value.get(part) if isinstance(value, dict) else None
            if isinstance(value, int | float) and not isinstance(value, bool):
                values.append(float(value))
        return stat(values)

    def flags(self) -> list[str]:
        """What the reader must know about how these figures were taken: admitted past a
        failing doctor (forced), with a GPU throttled, or not admitted at all (ungated)."""
        out = []
        if any(p.get("forced") is True for p in self.points):
            out.append("forced")
        gpu = [p.get("gpu") for p in self.points]
        if any(isinstance(g, dict) and g.get("throttled") for g in gpu):
            out.append("throttled")
        if any(p.get("gated") is False for p in self.points):
            out.append("ungated")
        return out

    def total(self, key: str) -> int:
        return sum(
            v for p in self.points if isinstance(v := p.get(key), int) and not isinstance(v, bool)
        )


@dataclass
class Loaded:
    groups: list[Group]
    skipped: int
    runs: dict[str, dict[str, object]]


def _key(point: dict[str, object]) -> tuple[str, str, int, float | None] | None:
    s, w, c, r = (
        point.get("serving_set"),
        point.get("workload"),
        point.get("concurrency"),
        point.get("request_rate"),
    )
    name = w.get("name") if isinstance(w, dict) else None
    if not isinstance(s, str) or not isinstance(name, str):
        return None
    if not isinstance(c, int) or isinstance(c, bool):
        return None
    if r is not None and (not isinstance(r, int | float) or isinstance(r, bool)):
        return None
    return s, name, c, None if r is None else float(r)


def load(dirs: Iterable[str]) -> Loaded:
    groups: dict[tuple[str, str, int, float | None], Group] = {}
    skipped = 0
    runs: dict[str, dict[str, object]] = {}
    for d in dirs:
        store = Store(d)
        if not Path(d).is_dir():
            raise UntrustedInputError(
                f"{show(d)} is not a results directory",
                "pass the --out directory of ct200-bench run",
            )
        if not store.results.is_file():
            raise UntrustedInputError(
                f"{show(d)} has no {store.results.name}",
                "pass the --out directory of ct200-bench run",
            )
        for run_id in store.runs():
            try:
                runs[run_id] = store.provenance(run_id)
            except UntrustedInputError:
                runs[run_id] = {}
        for point in store.points():
            key = _key(point)
            if key is None:
                skipped += 1
                continue
            groups.setdefault(key, Group(*key)).points.append(point)
    ordered = sorted(
        groups.values(), key=lambda g: (g.config, g.workload, g.request_rate or 0.0, g.concurrency)
    )
    return Loaded(ordered, skipped, runs)
