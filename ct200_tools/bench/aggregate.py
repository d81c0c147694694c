"""Points read back from results directories, grouped by configuration and load, with the
repetitions folded into a mean and a standard deviation (the noise `compare` judges against).

Points are repetitions of one thing only when their identity agrees (identity.py: host, server,
engine and version, model and its size, the server's arguments): a serving set whose points
measured different things is split into configurations named by what differs, with a note.

Results files are untrusted input (they may come from another machine): read bounded through
results.read_lines, and each field used is type-checked here; a point missing one is skipped
and counted, never a crash.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ct200_tools.bench import identity
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
    ("acceptance_rate", ("speculative", "acceptance_rate"), True),
)
HIGHER_IS_BETTER = {name: higher for name, _, higher in FIGURES}
#: Where a point without the first path has the figure still: llama-server reports acceptance
#: per request (`engine_timings`, summed over the point), vLLM and SGLang on /metrics
#: (`speculative`). A point has one or the other.
FALLBACK: dict[str, tuple[str, ...]] = {
    "acceptance_length": ("engine_timings", "acceptance_length"),
    "acceptance_rate": ("engine_timings", "acceptance_rate"),
}


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


def _at(point: dict[str, object], path: tuple[str, ...]) -> float | None:
    value: object = point
    for part in path:
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


@dataclass
class Group:
    """One configuration at one load, over its repetitions."""

    config: str
    workload: str
    concurrency: int
    request_rate: float | None
    points: list[dict[str, object]] = field(default_factory=list)
    #: The serving set as the plan named it (`config` adds a suffix when the set is split).
    base: str = ""
    identity: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.base = self.base or self.config

    @property
    def load(self) -> str:
        return f"c={self.concurrency}" + (
            f" @ {self.request_rate:g} req/s" if self.request_rate is not None else ""
        )

    def figure(self, name: str) -> Stat | None:
        path = next(p for n, p, _ in FIGURES if n == name)
        values = []
        for point in self.points:
            value = _at(point, path)
            if value is None and name in FALLBACK:
                value = _at(point, FALLBACK[name])
            if value is not None:
                values.append(value)
        return stat(values)

    def flags(self) -> list[str]:
        """What the reader must know about how these figures were taken: admitted past a
        failing doctor (forced), with a GPU throttled, not admitted at all (ungated), or served
        more from the server's prompt cache than the workload asked for (cached)."""
        out = []
        if any(p.get("forced") is True for p in self.points):
            out.append("forced")
        gpu = [p.get("gpu") for p in self.points]
        if any(isinstance(g, dict) and g.get("throttled") for g in gpu):
            out.append("throttled")
        if any(p.get("gated") is False for p in self.points):
            out.append("ungated")
        if any(p.get("cache_flag") is True for p in self.points):
            out.append("cached")
        return out

    def total(self, key: str) -> int:
        return sum(
            v for p in self.points if isinstance(v := p.get(key), int) and not isinstance(v, bool)
        )

    def knees(self) -> list[dict[str, object]]:
        """The sweep's stop records among these points (runner: the point that ended a sweep)."""
        return [k for p in self.points if isinstance(k := p.get("knee"), dict)]


@dataclass
class Loaded:
    groups: list[Group]
    skipped: int
    runs: dict[str, dict[str, object]]
    #: Why serving sets were split into several configurations.
    notes: list[str] = field(default_factory=list)


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


def _identity(point: dict[str, object], runs: dict[str, dict[str, object]]) -> dict[str, object]:
    """The point's own identity, or (recorded before there was one) its run's provenance's."""
    own = identity.clean(point.get("identity"))
    if own is not None:
        return own
    run = point.get("run_id")
    return identity.of_provenance(
        runs.get(run) if isinstance(run, str) else None, point.get("serving_set")
    )


def split(groups: Collection[Group]) -> list[str]:
    """Name each configuration: a serving set whose points have several identities becomes one
    configuration per identity, `SET [what differs]`; the notes say why."""
    by_base: dict[str, list[dict[str, object]]] = {}
    for g in groups:
        seen = by_base.setdefault(g.base, [])
        if g.identity not in seen:
            seen.append(g.identity)
    names: dict[tuple[str, str], str] = {}
    notes = []
    for base, ids in sorted(by_base.items()):
        if len(ids) < 2:
            continue
        ids.sort(key=lambda i: json.dumps(i, sort_keys=True))
        for i, suffix in zip(ids, identity.suffixes(ids), strict=True):
            names[base, json.dumps(i, sort_keys=True)] = base + suffix
        notes.append(
            f"{show(base, 120)} is split into {len(ids)} configurations: its points differ in "
            f"{', '.join(identity.differing(ids))}, and points pool as repetitions only when "
            "they measured the same host, server, engine version, model and server arguments"
        )
    for g in groups:
        g.config = names.get((g.base, json.dumps(g.identity, sort_keys=True)), g.base)
    return notes


def load(dirs: Iterable[str]) -> Loaded:
    groups: dict[tuple[str, str, str, int, float | None], Group] = {}
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
            ident = _identity(point, runs)
            s, w, c, r = key
            group = groups.setdefault(
                (s, json.dumps(ident, sort_keys=True), w, c, r), Group(*key, identity=ident)
            )
            group.points.append(point)
    notes = split(groups.values())
    unknown = sum(len(g.points) for g in groups.values() if not any(g.identity.values()))
    if unknown:
        notes.append(
            f"{unknown} point(s) carry no identity and their run has no provenance: they pool "
            "by serving set alone (whatever server they measured)"
        )
    ordered = sorted(
        groups.values(), key=lambda g: (g.config, g.workload, g.request_rate or 0.0, g.concurrency)
    )
    return Loaded(ordered, skipped, runs, notes)
