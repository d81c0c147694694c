"""A managed `ct200-bench run PLAN` (no --target), on the container: for each serving set of the
plan, managed.admit (switch, then the doctor's check, or --force), then its points against the
spec's target with GPU telemetry and /metrics around each; provenance of the machine beside.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Final

from ct200_tools.bench import identity, managed, provenance, telemetry
from ct200_tools.bench.plan import Plan, PlanError, ServingSet
from ct200_tools.bench.results import Store
from ct200_tools.bench.runner import BenchError, Sweep, pending, resolve_model
from ct200_tools.bench.session import (
    Echo,
    Outcome,
    Printer,
    ending,
    new_id,
    progress_line,
    repair_tail,
    resume_run,
)
from ct200_tools.bench.target import Auth
from ct200_tools.bench.watch import GpuWatch, MetricsWatch
from ct200_tools.facts import to_jsonable
from ct200_tools.serve import engines, serving
from ct200_tools.spec import SiteSpec
from ct200_tools.untrusted import UntrustedInputError, read_bounded, show

#: The label a managed run records in place of one --target's (compared on --resume).
MANAGED: Final = "(managed)"


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
    #: The API key of --api-key-env, sent to every server measured.
    auth: Auth | None = None


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
    for i, sset in enumerate(plan.serving_sets):
        found = []
        for j, name in enumerate(sset.servers):
            server = site.server(name)
            if server is None:
                issues.append(
                    SpecIssue(
                        f"serving_sets[{i}]" + ("" if sset.single else f".servers[{j}]"),
                        f"{show(name, 80)} is no server of the site spec {show(site.source, 120)}",
                        f"name one of its servers: {show(names, 400)}",
                    )
                )
            else:
                found.append(server)
        problems = serving.conflicts(found)
        if problems:
            issues.append(
                SpecIssue(
                    f"serving_sets[{i}].servers",
                    f"cannot serve side by side: {show('; '.join(problems), 400)}",
                    "put servers that share a GPU or a port in separate serving sets",
                )
            )
    if issues:
        raise PlanError(issues, plan.source)


def _managed_start(
    store: Store, plan: Plan, m: Managed, resume: bool, out_dir: str, argv: list[str]
) -> tuple[str, dict[str, object], frozenset[str]]:
    if resume:
        return resume_run(store, plan, None, MANAGED, out_dir, argv)
    run_id = new_id(store)
    prov = provenance.base_provenance(argv, None, run_id)
    prov.update(
        mode="managed",
        gated=True,
        api_key_env=m.auth.env if m.auth is not None else None,
        plan=plan.as_dict(),
        serving_set=MANAGED,
        force=m.force,
        spec=_spec_record(m.site, m.spec_path),
        sets={},
    )
    store.start(run_id, prov)
    return run_id, prov, frozenset()


def _run_set(
    sset: ServingSet,
    plan: Plan,
    m: Managed,
    store: Store,
    run_id: str,
    prov: dict[str, object],
    done: frozenset[str],
    printer: Printer,
) -> int:
    """One serving set: switched to and each server admitted (or refused: NotReady), then each
    server's points in turn; how many recorded."""
    sets = prov["sets"]
    if not isinstance(sets, dict):
        sets = prov["sets"] = {}
    # Servers with points still to measure (all of them, unless this is a --resume).
    todo = {n for n in sset.servers if pending(plan, sset.label(n), done, store, run_id)}
    if not todo:
        return 0
    try:
        admitted = managed.admit(
            m.site,
            sset,
            m.force,
            m.switcher or managed.switch_to,
            m.checker or managed.doctor_check,
        )
    except managed.NotReady as exc:
        sets[sset.name] = {"admitted": False, "refused": exc.message}
        prov.update(state="refused", finished=provenance.now_iso())
        store.write_provenance(run_id, prov)
        raise
    recorded = 0
    for admission in admitted:
        if admission.name in todo:
            label = sset.label(admission.name)
            recorded += _run_server(admission, label, plan, m, store, run_id, prov, printer, done)
    return recorded


def _run_server(
    admission: managed.Admission,
    label: str,
    plan: Plan,
    m: Managed,
    store: Store,
    run_id: str,
    prov: dict[str, object],
    printer: Printer,
    done: frozenset[str],
) -> int:
    """One admitted server's points, recorded under `label`; how many recorded."""
    name = admission.name
    wanted = plan.model or engines.served_name(admission.server)
    model, info = asyncio.run(resolve_model(admission.target, wanted, plan.timeout_s, m.auth))
    sampler = telemetry.Telemetry(admission.server.gpus, m.nvml)
    entry = admission.record()
    entry.update(
        admitted=True,
        model=model,
        engine=info,
        files=managed.server_files(name, m.unit_dir),
        gpu=sampler.sample(),
    )
    sets = prov["sets"]
    if isinstance(sets, dict):  # _run_set made it one
        sets[label] = entry
    # What each point measured (pooled as repetitions only with its like: aggregate.py).
    entry["identity"] = identity.for_run(prov, label)
    store.write_provenance(run_id, prov)
    echo = printer.echo
    if not printer.as_json:
        gate = "FORCED past the doctor" if admission.forced else "benchmark-ready"
        echo(
            f"ct200-bench: {show(label, 120)}: switched in {admission.switch_seconds:.1f} s, "
            f"{gate}; {show(admission.target)} ({provenance.describe_engine(info)}), model "
            f"{show(model, 80)}"
        )
        if admission.forced:
            echo(f"  {admission.readiness.verdict}")
    sweep = Sweep(
        plan,
        admission.target,
        store,
        run_id,
        model,
        done,
        label,
        printer,
        gated=True,
        extra={**admission.point_fields, "identity": entry["identity"]},
        watches=(
            GpuWatch(sampler),
            MetricsWatch(
                admission.target,
                admission.server.speculative is not None,
                plan.timeout_s,
                m.auth,
            ),
        ),
        auth=m.auth,
    )
    if printer.tty:
        sweep.progress = progress_line(echo)
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
    store.check()
    try:
        run_id, prov, done = _managed_start(store, plan, m, resume, out_dir, argv)
        repair_tail(store, echo)
        if not as_json:
            echo(
                f"ct200-bench: run {run_id}, managed: {show(', '.join(plan.set_names), 400)}"
                + (f"; resuming after {len(done)} point(s)" if resume else "")
            )
        printer = Printer(echo, as_json, tty)
        recorded = 0
        with ending(store, run_id, prov):
            for sset in plan.serving_sets:
                recorded += _run_set(sset, plan, m, store, run_id, prov, done, printer)
        if not as_json:
            echo(
                f"ct200-bench: {recorded} point(s) recorded, {printer.failed} failed request(s); "
                f"results {show(str(store.results))}, provenance {show(str(store.run_dir(run_id)))}"
            )
        return Outcome(run_id, recorded, printer.failed)
    finally:
        store.release()
