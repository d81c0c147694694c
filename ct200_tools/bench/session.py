"""One `ct200-bench run`: the plan, the store, the provenance, resume, and what is printed.

The run's provenance is written before the first request (state "running") and rewritten at the
end ("finished", or "interrupted" on Ctrl-C); a run killed outright stays "running", and --resume
continues it: the same plan and target, the points it recorded skipped.

run() measures one server given by --target (ungated); run_managed() switches to each serving
set of the plan and measures it only when the doctor passes it (or --force), see managed.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from ct200_tools import engines
from ct200_tools.bench import managed, provenance, telemetry
from ct200_tools.bench.metrics import Slo
from ct200_tools.bench.plan import Plan, PlanError, Workload, load_plan
from ct200_tools.bench.results import Store
from ct200_tools.bench.runner import BenchError, Sweep, points, resolve_model
from ct200_tools.bench.view import point_lines
from ct200_tools.bench.watch import GpuWatch, MetricsWatch
from ct200_tools.facts import to_jsonable
from ct200_tools.spec import SiteSpec
from ct200_tools.untrusted import UntrustedInputError, read_bounded, show

Echo = Callable[..., None]
#: The label a managed run records in place of one --target's (compared on --resume).
MANAGED: Final = "(managed)"


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
) -> Plan:
    workload = Workload("adhoc", output_tokens, requests, input_tokens=input_tokens)
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


def _progress(echo: Echo) -> Callable[[str, int, int], None]:
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
) -> Outcome:
    store = Store(out_dir)
    if plan.serving_sets:
        label = plan.serving_sets[0]
    if len(plan.serving_sets) > 1:
        raise BenchError(
            f"the plan names {len(plan.serving_sets)} serving sets, and --target is one server",
            "benchmark one serving set per --target run (serving_sets: [NAME]), or run the "
            "plan without --target on the container: it switches to each set in turn",
        )
    if resume:
        run_id, prov, done = _resume(store, plan, target, label, out_dir, argv)
    else:
        run_id, prov = _start(store, plan, target, label, argv)
        done = frozenset()
    model = str(prov.get("model"))
    cut = store.repair_tail()
    if cut:
        echo(
            f"ct200-bench: note: cut a torn last line of {cut} bytes from "
            f"{show(str(store.results))} (a write the machine did not finish)",
            err=True,
        )
    engine = prov.get("engine")
    if not as_json:
        what = provenance.describe_engine(engine) if isinstance(engine, dict) else "?"
        echo(
            f"ct200-bench: run {run_id} against {show(target)} ({what}), model "
            f"{show(model, 80)}, ungated (a --target run: not switched, not checked by the doctor)"
            + (f"; resuming after {len(done)} point(s)" if resume else "")
        )
    on_point = _Printer(echo, as_json, tty)
    sweep = Sweep(
        plan,
        target,
        store,
        run_id,
        model,
        done,
        label,
        on_point,
        watches=(MetricsWatch(target, False),),
    )
    if tty:
        sweep.progress = _progress(echo)
    try:
        records = asyncio.run(sweep.run())
    except KeyboardInterrupt:
        prov.update(state="interrupted", finished=provenance.now_iso())
        store.write_provenance(run_id, prov)
        raise
    prov.update(state="finished", finished=provenance.now_iso())
    store.write_provenance(run_id, prov)
    total = len(points(plan, label))
    failed = on_point.failed
    if not as_json:
        echo(
            f"ct200-bench: {len(records)} point(s) recorded ({total - len(records)} before), "
            f"{failed} failed request(s); results {show(str(store.results))}, provenance "
            f"{show(str(store.run_dir(run_id)))}"
        )
    return Outcome(run_id, len(records), failed)


def _new_id(store: Store) -> str:
    from ct200_tools.bench.results import new_run_id  # noqa: PLC0415

    run_id = new_run_id()
    # Run ids sort by start time; two runs in one second get distinct suffixes.
    if store.run_dir(run_id).exists():
        return _new_id(store)
    return run_id


def _resume(
    store: Store, plan: Plan, target: str | None, label: str, out_dir: str, argv: list[str]
) -> tuple[str, dict[str, object], frozenset[str]]:
    run_id = store.last_run()
    if run_id is None:
        raise BenchError(
            f"nothing to resume: {show(out_dir)} holds no run",
            "run without --resume to start one",
        )
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
    store: Store, plan: Plan, target: str, label: str, argv: list[str]
) -> tuple[str, dict[str, object]]:
    model, info = asyncio.run(resolve_model(target, plan.model))
    run_id = _new_id(store)
    prov = provenance.base_provenance(argv, target, run_id)
    prov.update(mode="target", plan=plan.as_dict(), model=model, engine=info, serving_set=label)
    store.start(run_id, prov)
    return run_id, prov


# -- the managed mode ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Managed:
    """What a managed run needs beyond the plan: the site spec and where it came from, --force,
    and (for tests) stand-ins for the switch, the doctor's check and NVML."""

    site: SiteSpec
    spec_path: str
    force: bool = False
    #: None: the real ones (managed.switch_to, managed.doctor_check, pynvml), looked up when
    #: the run starts.
    switcher: managed.Switcher | None = None
    checker: managed.Checker | None = None
    nvml: object = None
    unit_dir: str = managed.UNIT_DIR


def load_site(spec_path: str | None) -> tuple[SiteSpec, str]:
    """The site spec a managed run switches by (--spec, $CT200_SPEC, /etc/ct200/site.yml)."""
    from ct200_tools.spec import find_spec, load_spec  # noqa: PLC0415

    choice = find_spec(spec_path)
    if choice.path is None:
        raise BenchError(
            f"a run without --target switches the site's servers, and {choice.describe()}",
            "run it on the container (the playbooks install /etc/ct200/site.yml), pass --spec "
            "PATH, or benchmark a server by --target URL",
        )
    return load_spec(choice.path), choice.path


def _spec_record(site: SiteSpec, path: str) -> dict[str, object]:
    text: str | None = None
    error: str | None = None
    if os.path.isdir(path):
        error = "an inventory directory: the parsed spec is recorded"
    else:
        try:
            text = read_bounded(path, "the site spec", 1 << 20, "").decode("utf-8", "replace")
        except UntrustedInputError as exc:
            error = exc.message
    return {"path": path, "text": text, "error": error, "parsed": to_jsonable(site)}


def check_sets(plan: Plan, site: SiteSpec) -> None:
    """Every serving set of the plan names a server of the spec: a PlanError before anything."""
    from ct200_tools.spec.model import SpecIssue  # noqa: PLC0415

    issues = []
    if not plan.serving_sets:
        issues.append(
            SpecIssue(
                "serving_sets",
                "is empty: a run without --target benchmarks the serving sets the plan names",
                "name the servers of the site spec to benchmark, e.g. serving_sets: "
                f"[{', '.join(s.name for s in site.servers[:2]) or 'qwen-tp4-ddtree'}]",
            )
        )
    names = ", ".join(s.name for s in site.servers) or "none"
    for i, name in enumerate(plan.serving_sets):
        if site.server(name) is None:
            issues.append(
                SpecIssue(
                    f"serving_sets[{i}]",
                    f"{show(name, 80)} is no server of the site spec {show(site.source, 120)}",
                    f"name one of its servers: {show(names, 400)}",
                )
            )
    if issues:
        raise PlanError(issues, plan.source)


class _Printer:
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


def _managed_start(
    store: Store, plan: Plan, m: Managed, resume: bool, out_dir: str, argv: list[str]
) -> tuple[str, dict[str, object], frozenset[str]]:
    if resume:
        return _resume(store, plan, None, MANAGED, out_dir, argv)
    run_id = _new_id(store)
    prov = provenance.base_provenance(argv, None, run_id)
    prov.update(
        mode="managed",
        gated=True,
        plan=plan.as_dict(),
        serving_set=MANAGED,
        force=m.force,
        spec=_spec_record(m.site, m.spec_path),
        sets={},
    )
    store.start(run_id, prov)
    return run_id, prov, frozenset()


def _run_set(
    name: str,
    plan: Plan,
    m: Managed,
    store: Store,
    run_id: str,
    prov: dict[str, object],
    done: frozenset[str],
    printer: _Printer,
) -> int:
    """One serving set: admitted (or refused: NotReady), then its points; how many recorded."""
    sets = prov["sets"]
    if not isinstance(sets, dict):
        sets = prov["sets"] = {}
    one = dataclasses.replace(plan, serving_sets=(name,))
    if all(p.key in done for p in points(one, name)):
        return 0
    try:
        admission = managed.admit(
            m.site,
            name,
            m.force,
            m.switcher or managed.switch_to,
            m.checker or managed.doctor_check,
        )
    except managed.NotReady as exc:
        sets[name] = {"admitted": False, "refused": exc.message}
        prov.update(state="refused", finished=provenance.now_iso())
        store.write_provenance(run_id, prov)
        raise
    wanted = plan.model or engines.served_name(admission.server)
    model, info = asyncio.run(resolve_model(admission.target, wanted))
    sampler = telemetry.Telemetry(admission.server.gpus, m.nvml)
    entry = admission.record()
    entry.update(
        admitted=True,
        model=model,
        engine=info,
        files=managed.server_files(name, m.unit_dir),
        gpu=sampler.sample(),
    )
    sets[name] = entry
    store.write_provenance(run_id, prov)
    echo = printer.echo
    if not printer.as_json:
        gate = "FORCED past the doctor" if admission.forced else "benchmark-ready"
        echo(
            f"ct200-bench: {name}: switched in {admission.switch_seconds:.1f} s, {gate}; "
            f"{show(admission.target)} ({provenance.describe_engine(info)}), model "
            f"{show(model, 80)}"
        )
        if admission.forced:
            echo(f"  {admission.readiness.verdict}")
    sweep = Sweep(
        one,
        admission.target,
        store,
        run_id,
        model,
        done,
        name,
        printer,
        gated=True,
        extra=admission.point_fields,
        watches=(
            GpuWatch(sampler),
            MetricsWatch(admission.target, admission.server.speculative is not None),
        ),
    )
    if printer.tty:
        sweep.progress = _progress(echo)
    try:
        return len(asyncio.run(sweep.run()))
    finally:
        sampler.close()


def run_managed(
    plan: Plan,
    m: Managed,
    out_dir: str,
    *,
    resume: bool,
    as_json: bool,
    argv: list[str],
    echo: Echo,
    tty: bool,
) -> Outcome:
    """Each serving set in turn: switch, the doctor's check (or --force), then its points."""
    check_sets(plan, m.site)
    store = Store(out_dir)
    run_id, prov, done = _managed_start(store, plan, m, resume, out_dir, argv)
    cut = store.repair_tail()
    if cut:
        echo(f"ct200-bench: note: cut a torn last line of {cut} bytes", err=True)
    if not as_json:
        echo(
            f"ct200-bench: run {run_id}, managed: {', '.join(plan.serving_sets)}"
            + (f"; resuming after {len(done)} point(s)" if resume else "")
        )
    printer = _Printer(echo, as_json, tty)
    recorded = 0
    try:
        for name in plan.serving_sets:
            recorded += _run_set(name, plan, m, store, run_id, prov, done, printer)
    except KeyboardInterrupt:
        prov.update(state="interrupted", finished=provenance.now_iso())
        store.write_provenance(run_id, prov)
        raise
    prov.update(state="finished", finished=provenance.now_iso())
    store.write_provenance(run_id, prov)
    if not as_json:
        echo(
            f"ct200-bench: {recorded} point(s) recorded, {printer.failed} failed request(s); "
            f"results {show(str(store.results))}, provenance {show(str(store.run_dir(run_id)))}"
        )
    return Outcome(run_id, recorded, printer.failed)
