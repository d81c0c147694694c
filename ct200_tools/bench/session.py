"""One `ct200-bench run`: the plan, the store, the provenance, resume, and what is printed.

The run's provenance is written before the first request (state "running") and rewritten at the
end ("finished", or "interrupted" on Ctrl-C); a run killed outright stays "running", and --resume
continues it: the same plan and target, the points it recorded skipped.

run() measures one server given by --target (ungated); managed_run.run_managed() switches to
each serving set of the plan first and measures it only when the doctor passes it (or --force).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ct200_tools.bench import identity, provenance
from ct200_tools.bench.metrics import Slo
from ct200_tools.bench.plan import Plan, Workload, load_plan
from ct200_tools.bench.results import Store
from ct200_tools.bench.runner import BenchError, Sweep, points, resolve_model
from ct200_tools.bench.target import Auth
from ct200_tools.bench.view import point_lines
from ct200_tools.bench.watch import MetricsWatch
from ct200_tools.bench.workload import Endpoint
from ct200_tools.untrusted import show

Echo = Callable[..., None]


@dataclass
class Outcome:
    run_id: str
    points: int
    failed_requests: int


def plan_from_file(
    path: str,
    model: str | None,
    repetitions: int | None,
    warmup: int | None,
    timeout_s: float | None,
) -> Plan:
    plan = load_plan(path)
    changes: dict[str, object] = {}
    for key, value in (
        ("model", model),
        ("repetitions", repetitions),
        ("warmup", warmup),
        ("timeout_s", timeout_s),
    ):
        if value is not None:
            changes[key] = value
    return dataclasses.replace(plan, **changes)  # type: ignore[arg-type]


def adhoc_plan(
    concurrency: tuple[int, ...],
    request_rates: tuple[float, ...],
    input_tokens: int,
    output_tokens: int,
    requests: int,
    repetitions: int,
    warmup: int,
    timeout_s: float,
    model: str | None,
    endpoint: Endpoint = "completions",
) -> Plan:
    workload = Workload(
        "adhoc", output_tokens, requests, input_tokens=input_tokens, endpoint=endpoint
    )
    return Plan(
        workloads=(workload,),
        concurrency=concurrency,
        request_rates=request_rates,
        repetitions=repetitions,
        warmup=warmup,
        slo=Slo(),
        timeout_s=timeout_s,
        model=model,
    )


def progress_line(echo: Echo) -> Callable[[str, int, int], None]:
    def show_progress(key: str, done: int, total: int) -> None:
        echo(f"\r\x1b[K  {show(key, 80)}: {done}/{total} requests", nl=False, err=True)

    return show_progress


def run(
    plan: Plan,
    target: str,
    out_dir: str,
    *,
    label: str,
    resume: bool,
    as_json: bool,
    argv: list[str],
    echo: Echo,
    tty: bool,
    auth: Auth | None = None,
) -> Outcome:
    store = Store(out_dir)
    store.check()
    try:
        if len(plan.serving_sets) > 1 or any(not s.single for s in plan.serving_sets):
            raise BenchError(
                f"the plan names {len(plan.serving_sets)} serving set(s) of "
                f"{sum(len(s.servers) for s in plan.serving_sets)} server(s), and --target is one "
                "server",
                "benchmark one server per --target run (serving_sets: [NAME]), or run the plan "
                "without --target on the container: it switches to each set in turn",
            )
        if plan.serving_sets:
            label = plan.serving_sets[0].name
        if resume:
            run_id, prov, done = resume_run(store, plan, target, label, out_dir, argv)
        else:
            run_id, prov = _start(store, plan, target, label, argv, auth)
            done = frozenset()
        model = str(prov.get("model"))
        repair_tail(store, echo)
        engine = prov.get("engine")
        if not as_json:
            what = provenance.describe_engine(engine) if isinstance(engine, dict) else "?"
            echo(
                f"ct200-bench: run {run_id} against {show(target)} ({what}), model "
                f"{show(model, 80)}, ungated (a --target run: not switched, not checked by "
                "the doctor)" + (f"; resuming after {len(done)} point(s)" if resume else "")
            )
        on_point = Printer(echo, as_json, tty)
        sweep = Sweep(
            plan,
            target,
            store,
            run_id,
            model,
            done,
            label,
            on_point,
            extra={"identity": identity.for_run(prov)},
            watches=(MetricsWatch(target, False, plan.timeout_s, auth),),
            auth=auth,
        )
        if tty:
            sweep.progress = progress_line(echo)
        with ending(store, run_id, prov):
            records = asyncio.run(sweep.run())
        past_knee = len(points(plan, label)) - len(records) - len(done)
        failed = on_point.failed
        if not as_json:
            knee = f", {past_knee} not run past the knee" if past_knee else ""
            echo(
                f"ct200-bench: {len(records)} point(s) recorded ({len(done)} before{knee}), "
                f"{failed} failed request(s); results {show(str(store.results))}, provenance "
                f"{show(str(store.run_dir(run_id)))}"
            )
        return Outcome(run_id, len(records), failed)
    finally:
        store.release()


def repair_tail(store: Store, echo: Echo) -> None:
    """Cut a torn last line of the results file before appending to it, and say so."""
    cut = store.repair_tail()
    if cut:
        echo(
            f"ct200-bench: note: cut a torn last line of {cut} bytes from "
            f"{show(str(store.results))} (a write the machine did not finish)",
            err=True,
        )


@contextlib.contextmanager
def ending(store: Store, run_id: str, prov: dict[str, object]) -> Iterator[None]:
    """The run's provenance says how it ended: "interrupted" on Ctrl-C (raised on), else
    "finished"; a run killed outright stays "running"."""
    try:
        yield
    except KeyboardInterrupt:
        prov.update(state="interrupted", finished=provenance.now_iso())
        store.write_provenance(run_id, prov)
        raise
    prov.update(state="finished", finished=provenance.now_iso())
    store.write_provenance(run_id, prov)


def new_id(store: Store) -> str:
    from ct200_tools.bench.results import new_run_id  # noqa: PLC0415

    run_id = new_run_id()
    # Run ids sort by start time; two runs in one second get distinct suffixes.
    if store.run_dir(run_id).exists():
        return new_id(store)
    return run_id


def resume_run(
    store: Store, plan: Plan, target: str | None, label: str, out_dir: str, argv: list[str]
) -> tuple[str, dict[str, object], frozenset[str]]:
    run_id = store.last_run()
    if run_id is None:
        raise BenchError(
            f"nothing to resume: {show(out_dir)} holds no run",
            "run without --resume to start one",
        )
    store.claim(run_id)  # before its points are read: no other process adds to them now
    prov = store.provenance(run_id)
    same = (prov.get("plan"), prov.get("target"), prov.get("serving_set"))
    if same != (plan.as_dict(), target, label):
        raise BenchError(
            f"the last run in {show(out_dir)} ({show(run_id)}) had another plan, target or label",
            "give the same PLAN and options as that run (its command is in "
            f"runs/{show(run_id)}/provenance.json), or run without --resume",
        )
    done = frozenset(str(r.get("key")) for r in store.points(run_id))
    resumed = prov.get("resumed")
    prov["resumed"] = [
        *(resumed if isinstance(resumed, list) else []),
        {"at": provenance.now_iso(), "command": argv, "points_done": len(done)},
    ]
    prov["state"] = "running"
    store.write_provenance(run_id, prov)
    return run_id, prov, done


def _start(
    store: Store, plan: Plan, target: str, label: str, argv: list[str], auth: Auth | None
) -> tuple[str, dict[str, object]]:
    model, info = asyncio.run(resolve_model(target, plan.model, plan.timeout_s, auth))
    run_id = new_id(store)
    prov = provenance.base_provenance(argv, target, run_id)
    prov.update(mode="target", plan=plan.as_dict(), model=model, engine=info, serving_set=label)
    # The variable's name only: the key itself is never stored.
    prov["api_key_env"] = auth.env if auth is not None else None
    store.start(run_id, prov)
    return run_id, prov


class Printer:
    """Prints each finished point (a JSON line, or the text view) and counts failed requests."""

    def __init__(self, echo: Echo, as_json: bool, tty: bool) -> None:
        self.echo, self.as_json, self.tty = echo, as_json, tty
        self.failed = 0

    def __call__(self, record: dict[str, object]) -> None:
        self.failed += int(record.get("requests_failed") or 0)  # type: ignore[call-overload]
        if self.tty:
            self.echo("\r\x1b[K", nl=False, err=True)
        if self.as_json:
            self.echo(json.dumps(record, sort_keys=True))
        else:
            for line in point_lines(record):
                self.echo(line)
        sys.stdout.flush()
