"""The benchmark plan: a YAML file (or the ad-hoc options) -> a typed, frozen Plan.

Validated like the site spec, with the same bounded reader (ct200_tools.spec.files: size, UTF-8,
alias bombs, duplicate keys) and the same Section getters, so every problem is reported at once
with its field path and the fix, before anything is sent. `serving_sets` names servers of the
site spec: without --target each set is switched to and admitted by the doctor in turn
(managed.py, which checks the names against the spec); with --target a plan names at most one
one-server set, its label. A set of several servers is switched to at once (they serve side by
side, as on the machine), each admitted by the doctor, then benchmarked one after the other.

```yaml
serving_sets:                            # names from the site spec; a label with --target
  - qwen-tp4-ddtree                      # one server: the set is named after it
  - {name: qwen-pair, servers: [qwen-tp4-ddtree, qwen-tp4-base]}   # two side by side
workloads:
  - {name: short, input_tokens: 128, output_tokens: 64, requests: 32}
  - {name: chat, endpoint: chat, prompts: prompts.jsonl, output_tokens: from-dataset}
concurrency: [1, 4, 8, 16, 32]           # and/or request_rates: [2.0, 8.0] (Poisson arrivals)
repetitions: 3
warmup: 2                                # requests per point, sent first and not counted
slo: {ttft_ms: 2000, tpot_ms: 50, e2e_ms: 60000}
seed: 0
timeout_s: 600                           # per request
sweep: {stop_when: {gain_below: 0.05, goodput_below: 0.9}}   # stop at the knee (knee.py)
max_seconds: 300                         # each point sends no request after this
```
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Final

from ct200_tools.bench.knee import StopRule
from ct200_tools.bench.metrics import Slo
from ct200_tools.bench.workload import WORKLOAD, Workload
from ct200_tools.bench.workload import parse as _workload
from ct200_tools.spec.files import decode, parse_yaml
from ct200_tools.spec.model import SpecError, SpecIssue
from ct200_tools.spec.read import Issues, Section, entries, kind, section, show, subsection
from ct200_tools.untrusted import UntrustedInputError, read_bounded

__all__ = ["WORKLOAD", "Plan", "PlanError", "ServingSet", "Workload", "load_plan", "validate"]

MAX_PLAN_BYTES: Final = 256 << 10
MAX_CONCURRENCY: Final = 4096

ROOT: Final = {
    "serving_sets": "[qwen-tp4-ddtree, {name: qwen-pair, servers: [qwen-tp4-ddtree, "
    "qwen-tp4-base]}]",
    "workloads": "[{name: short, input_tokens: 128, output_tokens: 64, requests: 32}, {name: "
    "chat, endpoint: chat, prompts: examples/datasets/ct200-chat.jsonl, output_tokens: 128}]",
    "concurrency": "[1, 4, 8]",
    "request_rates": "[2.0, 8.0]",
    "repetitions": "3",
    "warmup": "2",
    "slo": "{ttft_ms: 2000, tpot_ms: 50}",
    "seed": "0",
    "timeout_s": "600",
    "model": "qwen3.6-27b",
    "sweep": "{stop_when: {gain_below: 0.05, goodput_below: 0.9}}",
    "max_seconds": "300",
}
SWEEP: Final = {"stop_when": "{gain_below: 0.05, goodput_below: 0.9}"}
STOP_WHEN: Final = {"gain_below": "0.05", "goodput_below": "0.9"}
SLO: Final = {"ttft_ms": "2000", "tpot_ms": "50", "e2e_ms": "60000"}
SERVING_SET: Final = {"name": "qwen-pair", "servers": "[qwen-tp4-ddtree, qwen-tp4-base]"}
#: Servers one set may switch to at once (CT200 has 8 GPUs: 8 one-GPU servers at most).
MAX_SET_SERVERS: Final = 16


class PlanError(SpecError):
    """A plan that cannot be run; `issues` carry each field path and its fix."""

    def __str__(self) -> str:
        where = f"{self.source}: " if self.source else ""
        return f"{where}{len(self.issues)} problem(s) in the benchmark plan"


@dataclass(frozen=True)
class ServingSet:
    """Servers of the site spec switched to together; each is benchmarked in turn."""

    name: str
    servers: tuple[str, ...]

    @classmethod
    def of(cls, server: str) -> ServingSet:
        """A set as the plan may write it: a server's name is the set of that one server."""
        return cls(server, (server,))

    @property
    def single(self) -> bool:
        """One server, the set named after it (the plain `- NAME` form)."""
        return self.servers == (self.name,)

    def label(self, server: str) -> str:
        """The configuration's name in results and reports: the server's in a plain set, else
        SET/SERVER."""
        return server if self.single else f"{self.name}/{server}"

    def as_plan(self) -> str | dict[str, object]:
        """As the plan writes it (provenance, and the comparison on --resume)."""
        return self.name if self.single else {"name": self.name, "servers": list(self.servers)}


@dataclass(frozen=True)
class Plan:
    workloads: tuple[Workload, ...]
    concurrency: tuple[int, ...] = ()
    request_rates: tuple[float, ...] = ()
    serving_sets: tuple[ServingSet, ...] = ()
    repetitions: int = 1
    warmup: int = 0
    slo: Slo = field(default_factory=Slo)
    seed: int = 0
    timeout_s: float = 600.0
    model: str | None = None
    source: str = "(options)"
    #: Stop raising concurrency at the knee (plan `sweep.stop_when`); None: run every level.
    stop: StopRule | None = None
    #: Each point sends no request after this many seconds (--max-seconds).
    max_seconds: float | None = None

    @property
    def set_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.serving_sets)

    def as_dict(self) -> dict[str, object]:
        """The plan as recorded in provenance (and compared on --resume)."""
        out = asdict(self)
        out.pop("source")
        for key in ("stop", "max_seconds"):  # absent when unset, as plans recorded before them
            if out[key] is None:
                out.pop(key)
        out["serving_sets"] = [s.as_plan() for s in self.serving_sets]
        plain: dict[str, object] = json.loads(json.dumps(out))  # tuples as lists, as in JSON
        return plain

    def loads(self) -> list[tuple[int, float | None]]:
        """(concurrency, request rate) of each point: the levels, then the rates (unbounded
        concurrency capped at the largest level or MAX_CONCURRENCY)."""
        out: list[tuple[int, float | None]] = [(c, None) for c in self.concurrency]
        cap = max(self.concurrency, default=MAX_CONCURRENCY)
        out += [(cap, r) for r in self.request_rates]
        return out


def _number(s: Section, key: str, lo: float, hi: float) -> float | None:
    value = s.raw(key, nullable=False)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        s.bad(key, value, "a number")
        return None
    if not lo < value <= hi:
        s.issues.error(
            s.where(key),
            f"{show(value)} is out of range (more than {lo:g}, at most {hi:g})",
            f"use a value in that range, e.g. {s.examples[key]}",
        )
        return None
    return float(value)


def _int_list(s: Section, key: str, lo: int, hi: int, most: int) -> tuple[int, ...]:
    out = []
    for i, value in enumerate(entries(s, key, most)):
        where = f"{s.where(key)}[{i}]"
        if isinstance(value, bool) or not isinstance(value, int):
            s.issues.error(
                where, f"expected an integer, got {kind(value)} {show(value)}", f"e.g. {ROOT[key]}"
            )
        elif not lo <= value <= hi:
            s.issues.error(where, f"{value} is out of range {lo}..{hi}", f"use {lo} to {hi}")
        elif value in out:
            s.issues.error(where, f"{value} is listed twice", "list each level once")
        else:
            out.append(value)
    return tuple(out)


def _rate_list(s: Section, key: str) -> tuple[float, ...]:
    out: list[float] = []
    for i, value in enumerate(entries(s, key, 64)):
        where = f"{s.where(key)}[{i}]"
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1e6:
            s.issues.error(
                where,
                f"expected a number of requests per second above 0, got {show(value)}",
                f"e.g. {ROOT[key]}",
            )
        else:
            out.append(float(value))
    return tuple(out)


def validate(data: object, source: str, base: Path) -> Plan:
    issues = Issues()
    s = section(issues, data, "", ROOT, required=("workloads",))
    if s is None:
        raise PlanError(issues.items, source)
    workloads: list[Workload] = []
    for i, value in enumerate(entries(s, "workloads", 64)):
        w = _workload(issues, value, f"workloads[{i}]", base)
        if w is not None:
            if any(other.name == w.name for other in workloads):
                issues.error(f"workloads[{i}].name", f"{w.name!r} is used twice", "rename one")
            workloads.append(w)
    if "workloads" in s.data and not entries(s, "workloads", 64) and not issues.items:
        issues.error("workloads", "is empty", f"list at least one, e.g. {ROOT['workloads']}")
    concurrency = _int_list(s, "concurrency", 1, MAX_CONCURRENCY, 64)
    rates = _rate_list(s, "request_rates")
    if not concurrency and not rates and not issues.items:
        issues.error(
            "concurrency",
            "no concurrency levels and no request_rates: nothing to measure",
            f"add concurrency: {ROOT['concurrency']} (or request_rates: {ROOT['request_rates']})",
        )
    sets: list[ServingSet] = []
    for i, value in enumerate(entries(s, "serving_sets", 64)):
        one = _serving_set(issues, value, f"serving_sets[{i}]")
        if one is None:
            continue
        if any(other.name == one.name for other in sets):
            issues.error(
                f"serving_sets[{i}]", f"{show(one.name)} is named twice", "name each set once"
            )
        sets.append(one)
    slo = Slo()
    slo_s = subsection(s, "slo", SLO)
    if slo_s is not None:
        slo = Slo(*(_number(slo_s, k, 0, 1e9) for k in ("ttft_ms", "tpot_ms", "e2e_ms")))
    repetitions = s.get_int("repetitions", 1, 100)
    warmup = s.get_int("warmup", 0, 10_000)
    seed = s.get_int("seed", 0, 2**63 - 1)
    timeout_s = _number(s, "timeout_s", 0, 86_400)
    model = s.get_str("model")
    stop = _stop_rule(s, concurrency, slo)
    max_seconds = _number(s, "max_seconds", 0, 7 * 86_400)
    if issues.items:
        raise PlanError(issues.items, source)
    return Plan(
        workloads=tuple(workloads),
        concurrency=concurrency,
        request_rates=rates,
        serving_sets=tuple(sets),
        repetitions=repetitions or 1,
        warmup=warmup or 0,
        slo=slo,
        seed=seed or 0,
        timeout_s=timeout_s or 600.0,
        model=model,
        source=source,
        stop=stop,
        max_seconds=max_seconds,
    )


def _stop_rule(s: Section, concurrency: tuple[int, ...], slo: Slo) -> StopRule | None:
    """`sweep: {stop_when: {gain_below, goodput_below}}`: the knee rule (knee.py)."""
    sweep = subsection(s, "sweep", SWEEP, required=("stop_when",))
    when = subsection(sweep, "stop_when", STOP_WHEN) if sweep is not None else None
    if when is None:
        return None
    rule = StopRule(_number(when, "gain_below", -1, 10), _number(when, "goodput_below", 0, 1))
    where = when.path
    if not when.data:
        s.issues.error(where, "names no condition", f"give e.g. {SWEEP['stop_when']}")
    if rule.goodput_below is not None and not slo.is_set():
        s.issues.error(
            f"{where}.goodput_below",
            "needs an SLO: the fraction of requests meeting it is what it bounds",
            f"add slo: {ROOT['slo']}, or drop goodput_below",
        )
    if list(concurrency) != sorted(concurrency):
        s.issues.error(
            "concurrency",
            f"{list(concurrency)} is not in increasing order, and sweep.stop_when stops at the "
            "first level that no longer pays",
            f"list the levels from low to high: {sorted(concurrency)}",
        )
    return rule


def _serving_set(issues: Issues, value: object, where: str) -> ServingSet | None:
    """`- NAME` (a server of the spec) or `- {name: SET, servers: [NAME, ...]}`."""
    if isinstance(value, str):
        if not value.strip():
            issues.error(where, "is empty", "write a server name of the site spec")
            return None
        return ServingSet.of(value) if issues.one_line(where, value) else None
    if not isinstance(value, dict):
        issues.error(
            where,
            f"expected a server's name or {{name, servers}}, got {kind(value)} {show(value)}",
            f"write a server name of the site spec, or {{name: {SERVING_SET['name']}, servers: "
            f"{SERVING_SET['servers']}}}",
        )
        return None
    s = section(issues, value, where, SERVING_SET, required=("name", "servers"))
    if s is None:
        return None
    name = s.get_str("name")
    listed = entries(s, "servers", MAX_SET_SERVERS)
    servers: list[str] = []
    for j, server in enumerate(listed):
        at = f"{where}.servers[{j}]"
        if not isinstance(server, str) or not server.strip():
            issues.error(
                at,
                f"expected a server's name, got {kind(server)} {show(server)}",
                "write a server name of the site spec",
            )
        elif server in servers:
            issues.error(at, f"{show(server)} is listed twice", "list each server once")
        elif issues.one_line(at, server):
            servers.append(server)
    if "servers" in s.data and not listed and isinstance(s.data["servers"], list | None):
        issues.error(
            f"{where}.servers",
            "lists no server",
            f"list the servers switched to together, e.g. {SERVING_SET['servers']}",
        )
    if name is None or not servers or len(servers) != len(listed):
        return None
    return ServingSet(name, tuple(servers))


def load_plan(path: str) -> Plan:
    """The plan file at `path`, read bounded and validated; PlanError names every problem."""
    fix = "pass a benchmark plan: a YAML file of a few KiB (docs/bench.md)"
    try:
        data = read_bounded(path, "the plan", MAX_PLAN_BYTES, fix)
    except UntrustedInputError as exc:
        raise PlanError([SpecIssue("plan", exc.message, exc.fix)], path) from None
    try:
        doc = parse_yaml(decode(data, path), path)
    except SpecError as exc:
        raise PlanError([SpecIssue("plan", i.message, i.fix) for i in exc.issues], path) from None
    return validate(doc, path, Path(path).resolve().parent)
