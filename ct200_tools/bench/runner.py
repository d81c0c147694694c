"""A sweep: every point of a plan against one target, each recorded as soon as it finishes.

Points run in plan order (serving set, workload, load, repetition). A point whose key the run
already recorded is skipped (--resume). A server that dies mid-run turns the rest of the point
into failed requests, recorded like any other point, and the sweep goes on to the next one.
With the plan's `sweep.stop_when`, a configuration's levels above its knee are not run
(knee.py); the point that found the knee says so, and a resumed run stops there too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from ct200_tools.bench import client, knee, provenance
from ct200_tools.bench.feed import Feed, Prepared
from ct200_tools.bench.http import INFO_TIMEOUT_S, PREPARE_S, Deadline, bounded, new_session
from ct200_tools.bench.metrics import summarize, workload_figures
from ct200_tools.bench.plan import Plan, Workload
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


def pending(plan: Plan, label: str, done: frozenset[str], store: Store, run_id: str) -> bool:
    """Whether a resumed run has points of `label` left to measure: not recorded, and not past
    a knee its recorded points found (a managed run then switches to the server again)."""
    todo = [p for p in points(plan, label) if p.key not in done]
    if not todo or plan.stop is None:
        return bool(todo)
    stopped = set()
    for r in store.points(run_id):
        w = r.get("workload")
        if isinstance(r.get("knee"), dict) and isinstance(w, dict):
            stopped.add((r.get("serving_set"), w.get("name")))
    return any(
        p.request_rate is not None or (p.serving_set, p.workload.name) not in stopped for p in todo
    )


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

    async def _requests(self, p: Point, feed: Feed) -> Prepared:
        """The point's warm-up plus counted requests, fresh for this point and run; the
        /tokenize search for them bounded in all (PREPARE_S)."""
        return await bounded(
            feed.point(p.workload, p.key),
            PREPARE_S,
            f"the /tokenize search for the prompts of {show(p.key, 120)}",
        )

    def _progress(self, p: Point) -> client.Progress | None:
        report = self.progress
        if report is None:
            return None
        return lambda done, total: report(p.key, done, total)

    async def run(self) -> list[dict[str, object]]:
        attempt = f"/resumed-after-{len(self.done)}" if self.done else ""
        feed = Feed(
            self.target,
            self.model,
            self.run_id,
            self.plan.seed,
            self.plan.warmup,
            attempt,
            timeout_s=min(self.plan.timeout_s, INFO_TIMEOUT_S),
            auth=self.auth,
        )
        records = []
        plan = self.plan
        tracker = knee.Tracker(plan.stop, plan.repetitions, plan.concurrency)
        # A resumed sweep counts the levels it measured before, and stops where it stopped.
        before = (
            {str(r.get("key")): r for r in self.store.points(self.run_id)}
            if (self.done and plan.stop)
            else {}
        )
        for p in points(self.plan, self.label):
            series = (p.serving_set, p.workload.name)
            if tracker.skips(series, p.request_rate):
                continue
            if p.key in self.done:
                feed.skip(p.workload)
                if p.key in before and p.request_rate is None:
                    tracker.seen(series, p.concurrency, before[p.key])
                continue
            prepared = await self._requests(p, feed)
            reqs = prepared.requests
            warm, counted = reqs[: self.plan.warmup], reqs[self.plan.warmup :]
            load = client.Load(p.concurrency, p.request_rate, self.plan.seed, plan.max_seconds)
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
                "workload": prepared.workload,
                "concurrency": p.concurrency,
                "request_rate": p.request_rate,
                "repetition": p.repetition,
                "requests": len(counted),
                "warmup_requests": len(warm),
                "warmup_failed": warm_failed,
                "started": started,
                "finished": provenance.now_iso(),
                **summarize(results, duration, self.plan.slo),
                **workload_figures(results, prepared.cache_allowed),
                **watched,
            }
            if plan.max_seconds is not None:
                cut = len(results) < len(counted)
                record.update(max_seconds=plan.max_seconds, requests_sent=len(results), cut=cut)
            if p.request_rate is None:
                stop = tracker.seen(series, p.concurrency, record)
                if stop is not None:
                    record["knee"] = stop
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
