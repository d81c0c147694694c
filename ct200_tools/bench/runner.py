"""A sweep: every point of a plan against one target, each recorded as soon as it finishes.

Points run in plan order (serving set, workload, load, repetition). A point whose key the run
already recorded is skipped (--resume). A server that dies mid-run turns the rest of the point
into failed requests, recorded like any other point, and the sweep goes on to the next one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from ct200_tools.bench import client, prompts, provenance
from ct200_tools.bench.http import INFO_TIMEOUT_S, PREPARE_S, Deadline, bounded, new_session
from ct200_tools.bench.metrics import summarize
from ct200_tools.bench.plan import Plan, Workload, read_prompts
from ct200_tools.bench.results import Store
from ct200_tools.bench.target import Auth
from ct200_tools.bench.watch import Watch
from ct200_tools.untrusted import show

#: The schema of a point (results.jsonl lines and --json output), docs/bench.md.
POINT_SCHEMA: Final = 1


class BenchError(Exception):
    """The sweep cannot start; the message names what, `fix` says what to do."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix


@dataclass(frozen=True)
class Point:
    serving_set: str
    workload: Workload
    concurrency: int
    request_rate: float | None
    repetition: int

    @property
    def key(self) -> str:
        load = f"c{self.concurrency}" + (
            f"-r{self.request_rate:g}" if self.request_rate is not None else ""
        )
        return f"{self.serving_set}/{self.workload.name}/{load}/rep{self.repetition}"


def points(plan: Plan, label: str) -> list[Point]:
    """One configuration's points (a server, named `label` in the results): every workload at
    every load, each repetition."""
    return [
        Point(label, w, c, r, rep)
        for w in plan.workloads
        for c, r in plan.loads()
        for rep in range(1, plan.repetitions + 1)
    ]


OnPoint = Callable[[dict[str, object]], None]


@dataclass
class Sweep:
    plan: Plan
    target: str
    store: Store
    run_id: str
    model: str
    done: frozenset[str] = frozenset()
    #: The serving set's name when the plan names none (--label).
    label: str = "target"
    on_point: OnPoint | None = None
    #: Called with the point's key, requests finished and requests in all (a TTY's live line).
    progress: Callable[[str, int, int], None] | None = None
    #: Admitted by the doctor's gate (managed mode); `extra` adds the admission's fields.
    gated: bool = False
    extra: dict[str, object] = field(default_factory=dict)
    #: Read before and after each point's counted requests (GPU telemetry, /metrics).
    watches: tuple[Watch, ...] = ()
    #: The API key sent with every request (--api-key-env), if any.
    auth: Auth | None = None

    async def _requests(
        self, w: Workload, cache: dict[str, tuple[list[client.Request], str]]
    ) -> tuple[list[client.Request], str]:
        """The workload's warm-up plus counted requests (same for every point), and how their
        length was made."""
        if w.name in cache:
            return cache[w.name]
        total = self.plan.warmup + w.requests
        if w.prompts is not None:
            texts = read_prompts(w.prompts, f"workloads[{w.name}].prompts")
            reqs = [client.Request(texts[i % len(texts)], w.output_tokens) for i in range(total)]
            cache[w.name] = (reqs, "file")
            return cache[w.name]
        async with new_session(min(self.plan.timeout_s, INFO_TIMEOUT_S), self.auth) as session:
            made = await bounded(
                prompts.make_prompts(
                    session, self.target, self.model, w.input_tokens or 1, total, self.plan.seed
                ),
                PREPARE_S,
                f"the /tokenize search for workload {show(w.name, 60)}'s prompts",
            )
        reqs = [client.Request(p.text, w.output_tokens) for p in made]
        cache[w.name] = (reqs, made[0].method if made else "approximate")
        return cache[w.name]

    def _progress(self, p: Point) -> client.Progress | None:
        report = self.progress
        if report is None:
            return None
        return lambda done, total: report(p.key, done, total)

    async def run(self) -> list[dict[str, object]]:
        cache: dict[str, tuple[list[client.Request], str]] = {}
        records = []
        for p in points(self.plan, self.label):
            if p.key in self.done:
                continue
            reqs, method = await self._requests(p.workload, cache)
            warm, counted = reqs[: self.plan.warmup], reqs[self.plan.warmup :]
            load = client.Load(p.concurrency, p.request_rate, self.plan.seed)
            started = provenance.now_iso()
            warm_failed = 0
            if warm:
                warm_results, _ = await client.run_point(
                    self.target, self.model, warm, load, self.plan.timeout_s, auth=self.auth
                )
                warm_failed = sum(1 for r in warm_results if not r.ok)
            states = [await w.before() for w in self.watches]
            results, duration = await client.run_point(
                self.target,
                self.model,
                counted,
                load,
                self.plan.timeout_s,
                self._progress(p),
                auth=self.auth,
            )
            watched = {}
            for w, state in zip(self.watches, states, strict=True):
                value = await w.after(state)
                if value is not None:
                    watched[w.name] = value
            record: dict[str, object] = {
                "schema_version": POINT_SCHEMA,
                "run_id": self.run_id,
                "key": p.key,
                "serving_set": p.serving_set,
                "target": self.target,
                "model": self.model,
                "gated": self.gated,
                **self.extra,
                "workload": {
                    "name": p.workload.name,
                    "input_tokens": p.workload.input_tokens,
                    "output_tokens": p.workload.output_tokens,
                    "prompts": p.workload.prompts,
                    "prompt_length_method": method,
                },
                "concurrency": p.concurrency,
                "request_rate": p.request_rate,
                "repetition": p.repetition,
                "requests": len(counted),
                "warmup_requests": len(warm),
                "warmup_failed": warm_failed,
                "started": started,
                "finished": provenance.now_iso(),
                **summarize(results, duration, self.plan.slo),
                **watched,
            }
            self.store.add_point(record)
            records.append(record)
            if self.on_point is not None:
                self.on_point(record)
        return records


async def resolve_model(
    target: str, wanted: str | None, timeout_s: float = INFO_TIMEOUT_S, auth: Auth | None = None
) -> tuple[str, dict[str, object]]:
    """The model to ask for and the engine's self-description. BenchError when the target does
    not answer at all, redirects, wants an API key, or names no model where the plan names none.
    Its four requests go out at once, each bounded by min(timeout_s, INFO_TIMEOUT_S)."""
    limit = min(timeout_s, INFO_TIMEOUT_S)
    async with new_session(limit, auth) as session:
        info = await provenance.engine_info(session, target, Deadline.after(limit))
    refused = provenance.refusal(target, info, auth.env if auth is not None else None)
    if refused is not None:
        raise BenchError(*refused)
    if wanted is not None:
        return wanted, info
    served = provenance.served_models(info)
    if served:
        return served[0], info
    models = info.get("models")
    why = models.get("error") if isinstance(models, dict) else None
    raise BenchError(
        f"GET {show(target)}/v1/models named no model ({why or 'an empty list'})",
        "check that the server runs and answers at --target, or pass --model NAME",
    )


def run_sweep(sweep: Sweep) -> list[dict[str, object]]:
    return asyncio.run(sweep.run())
