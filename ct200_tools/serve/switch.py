"""Switch the serving set: stop what is in the way, stage, start behind the gates, persist.

`ct200-serve switch NAME...` serves NAME... and keeps every server of the current set that shares
no GPU and no port with them (`--exact`: serves NAME... alone). In order, each step timed:

1. plan: read the spec, the serving set, the units and the staged models; refuse a set whose
   servers share GPUs or ports, or a server whose unit is not installed (nothing changed);
2. stop: the running servers that hold a GPU or port of the new set, and only those;
3. drop: staged models no server of the new set (or a server left running) loads, largest
   first, only while the new set's models would not fit otherwise; a staged copy carries our
   marker, so a persistent copy is never touched;
4. stage: start each new model's staging unit (a no-op when staged);
5. start: each server of the new set not running, at once; each `systemctl start` returns when
   its unit's preflight, gate and readiness poll passed;
6. persist: enable exactly the new set's server units and their models' staging units, then
   write /var/lib/ct200/serving.json, so a reboot brings the same set back.

A step that fails stops the new servers and starts the ones it stopped again (restaging a
dropped model through their units); the report then says which servers serve and which do not.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Final

from ct200_tools.provisioned import playbook_command
from ct200_tools.serve import engines, running, serving
from ct200_tools.serve.serving import ServingError, ServingSet, ServingState
from ct200_tools.serve.systemd import Systemd, UnitState
from ct200_tools.spec import ModelSpec, ServerSpec, SiteSpec

LOCK_PATH: Final = "/run/ct200/serve.lock"
STOP_GRACE_S: Final = 60
#: A stage of the largest model at the staging units' pessimistic rate takes about this long.
STAGE_TIMEOUT_S: Final = 6 * 3600


@dataclass(frozen=True)
class Item:
    name: str
    seconds: float
    ok: bool = True
    detail: str = ""


@dataclass(frozen=True)
class Step:
    name: str
    seconds: float
    items: tuple[Item, ...] = ()
    ok: bool = True
    detail: str = ""

    def to_dict(self) -> dict[str, object]:
        return {
            "step": self.name,
            "seconds": round(self.seconds, 3),
            "ok": self.ok,
            "detail": self.detail,
            "items": [
                {"name": i.name, "seconds": round(i.seconds, 3), "ok": i.ok, "detail": i.detail}
                for i in self.items
            ],
        }


@dataclass(frozen=True)
class ModelState:
    """A model as the plan sees it: bytes staged (None: not staged by us) and bytes it needs."""

    staged: int | None = None
    need: int | None = None


@dataclass(frozen=True)
class Machine:
    """What the plan reads from the machine, so that planning is a pure function."""

    units: dict[str, UnitState]
    models: dict[str, ModelState] = field(default_factory=dict)
    #: Server units whose process runs an older configuration than their files (running.py):
    #: a switch that serves one restarts it, so it serves what its files say (issue 33).
    stale: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Plan:
    previous: ServingSet
    target: tuple[ServerSpec, ...]
    stop: tuple[ServerSpec, ...]
    start: tuple[ServerSpec, ...]
    keep: tuple[ServerSpec, ...]
    #: Running, not in the new set, in no one's way: left alone (and not enabled at boot).
    strays: tuple[ServerSpec, ...]
    stage: tuple[ModelSpec, ...]
    #: Staged models that may be dropped to make room (largest first).
    droppable: tuple[ModelSpec, ...]
    enable: tuple[str, ...]
    disable: tuple[str, ...]
    write_state: bool

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.target)

    @property
    def changed(self) -> bool:
        return bool(self.stop or self.start or self.enable or self.disable or self.write_state)


def _running(machine: Machine, server: ServerSpec) -> bool:
    state = machine.units.get(engines.unit_name(server.name))
    return state is not None and state.running


def _in_the_way(server: ServerSpec, target: Sequence[ServerSpec]) -> bool:
    return any(set(server.gpus) & set(t.gpus) or server.port == t.port for t in target)


def plan(
    site: SiteSpec,
    previous: ServingSet,
    requested: Sequence[str],
    machine: Machine,
    exact: bool = False,
) -> Plan:
    """What the switch will do; ServingError (nothing changed) for a set that cannot run."""
    wanted = serving.resolve(site, requested)
    if not wanted:
        raise ServingError("no server named", "name the servers to serve")
    serving.check_set(wanted)
    kept = () if exact else tuple(s for s in previous.servers if not _in_the_way(s, wanted))
    chosen = {s.name for s in (*wanted, *kept)}
    target = tuple(s for s in site.servers if s.name in chosen)
    missing = [
        engines.unit_name(s.name)
        for s in target
        if machine.units.get(engines.unit_name(s.name), UnitState("")).load != "loaded"
    ]
    if missing:
        raise ServingError(
            f"not installed: {', '.join(missing)}",
            "run the container playbook first, "
            f"{playbook_command('playbooks/container.yml')}: it installs a unit for every "
            "server of the spec",
        )
    others = [s for s in site.servers if s.name not in chosen and _running(machine, s)]
    stop = tuple(s for s in others if exact or _in_the_way(s, target))
    strays = tuple(s for s in others if s not in stop)
    # Only what was asked for is started: a server of the current set that is not running
    # (failed, stopped by hand) stays in the set, reported, but cannot block the switch.
    # A wanted server on an older configuration than its files is stopped and started again.
    restart = tuple(
        s for s in wanted if _running(machine, s) and engines.unit_name(s.name) in machine.stale
    )
    stop = (*stop, *restart)
    start = tuple(s for s in wanted if not _running(machine, s) or s in restart)
    keep = tuple(s for s in target if _running(machine, s) and s not in restart)
    needed = site.needed_models(target)
    busy = {m.name for m in site.needed_models((*target, *strays))}
    droppable = sorted(
        (
            m
            for m in site.models
            if m.name not in busy and machine.models.get(m.name, ModelState()).staged is not None
        ),
        key=lambda m: -(machine.models[m.name].staged or 0),
    )
    want_units = {engines.unit_name(s.name) for s in target}
    want_units |= {engines.stage_unit(m.name) for m in needed}
    all_units = {engines.unit_name(s.name) for s in site.servers}
    all_units |= {engines.stage_unit(m.name) for m in site.models}
    state = machine.units
    enable = sorted(u for u in want_units if not state.get(u, UnitState(u)).enabled)
    disable = sorted(u for u in all_units - want_units if state.get(u, UnitState(u)).enabled)
    names = tuple(s.name for s in target)
    write_state = previous.source == "spec" and names != previous.names
    write_state |= previous.source == "serving.json" and (
        names != previous.names or bool(previous.unknown)
    )
    return Plan(
        previous,
        target,
        stop,
        start,
        keep,
        strays,
        site.needed_models(start),
        tuple(droppable),
        tuple(enable),
        tuple(disable),
        write_state,
    )


def choose_drops(
    stage: Sequence[ModelSpec],
    droppable: Sequence[ModelSpec],
    models: dict[str, ModelState],
    room: int | None,
) -> tuple[tuple[ModelSpec, ...], int]:
    """The models to drop (in order) so the unstaged ones of `stage` fit in `room`, and the bytes
    still to stage. None when room is unknown: drop nothing (ct200-stage checks again)."""
    to_stage = sum(
        models.get(m.name, ModelState()).need or 0
        for m in stage
        if models.get(m.name, ModelState()).staged is None
    )
    if room is None or to_stage <= room:
        return (), to_stage
    drops: list[ModelSpec] = []
    for model in droppable:
        if to_stage <= room:
            break
        drops.append(model)
        room += models[model.name].staged or 0
    return tuple(drops), to_stage


# -- the machine ---------------------------------------------------------------------------------


def model_state(model: ModelSpec) -> ModelState:
    """Staged bytes by the doctor's own verdict; what staging it needs: its manifest's total
    (written at the first stage), else the persistent copy's files as ct200-stage would copy
    them (metadata only), else the spec's declared size."""
    from ct200_tools.stage.capacity import bytes_needed  # noqa: PLC0415
    from ct200_tools.stage.errors import StageError  # noqa: PLC0415
    from ct200_tools.stage.manifest import (  # noqa: PLC0415
        default_manifest_path,
        load_manifest,
        scan_tree,
    )
    from ct200_tools.stage.status import model_status  # noqa: PLC0415

    verdict = model_status(model.staged)
    staged = (verdict.bytes_actual or verdict.bytes_expected) if verdict.ok else None
    manifest = default_manifest_path(model.name)
    try:
        files = [f.size for f in load_manifest(manifest).files]
    except (StageError, OSError, ValueError):
        try:
            files = [f.size for f in scan_tree(model.source)]
        except (StageError, OSError):
            return ModelState(staged, model.size)  # no copy to measure: the stage will say so
    return ModelState(staged, bytes_needed(files))


def read_machine(site: SiteSpec, systemd: Systemd) -> Machine:
    units = [engines.unit_name(s.name) for s in site.servers]
    units += [engines.stage_unit(m.name) for m in site.models]
    files = {
        engines.unit_name(s.name): (engines.env_path(s.name), engines.config_path(s.name))
        for s in site.servers
    }
    stale = frozenset(u for u, r in running.read(systemd, files).items() if r.stale)
    return Machine(systemd.show(units), {m.name: model_state(m) for m in site.models}, stale)


def room_for(site: SiteSpec, models: Sequence[ModelSpec]) -> int | None:
    """Bytes staging may still take where these models go (tmpfs free, memory headroom, less the
    spec's reserve), by ct200-stage's own measure; None when unknown."""
    from ct200_tools.stage.capacity import measure  # noqa: PLC0415

    if not models:
        return None
    try:
        return measure(os.path.dirname(models[0].staged), site.shm.reserve_ram).available
    except OSError:
        return None


def drop_staged(model: ModelSpec) -> str:
    """Remove a staged copy we made: rename it aside at once (no half tree under its name), then
    delete. Refuses anything without our marker; the persistent copy is never this path."""
    from ct200_tools.stage.tree import read_marker, trash_path  # noqa: PLC0415

    marker = read_marker(model.staged)
    if marker is None:
        raise OSError(f"{model.staged} has no ct200-stage marker: not ours to remove")
    trash = trash_path(model.staged)
    shutil.rmtree(trash, ignore_errors=True)
    os.rename(model.staged, trash)
    shutil.rmtree(trash)
    return f"freed {marker.bytes} bytes"


@contextlib.contextmanager
def locked(path: str = LOCK_PATH) -> Iterator[None]:
    """One switch at a time on a machine."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a+", encoding="utf-8") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            raise ServingError(
                f"another ct200-serve switch is running (pid {holder})",
                "wait for it to finish, then run this one again",
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        yield


# -- running it ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    ok: bool
    changed: bool
    dry_run: bool
    previous: tuple[str, ...]
    target: tuple[str, ...]
    steps: tuple[Step, ...]
    #: Servers of the intended set (the target, or after a failure the previous one) and
    #: whether each serves, with why not.
    serving: dict[str, str] = field(default_factory=dict)
    failure: str = ""
    restored: bool | None = None
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {
            "warnings": list(self.warnings),
            "ok": self.ok,
            "changed": self.changed,
            "dry_run": self.dry_run,
            "previous": list(self.previous),
            "target": list(self.target),
            "serving": dict(self.serving),
            "failure": self.failure or None,
            "restored": self.restored,
            "steps": [s.to_dict() for s in self.steps],
            "total_seconds": round(sum(s.seconds for s in self.steps), 3),
        }


Clock = Callable[[], float]


class Switch:
    def __init__(
        self,
        site: SiteSpec,
        systemd: Systemd | None = None,
        state_path: str = serving.STATE_PATH,
        clock: Clock = time.monotonic,
        machine: Callable[[SiteSpec, Systemd], Machine] = read_machine,
        room: Callable[[SiteSpec, Sequence[ModelSpec]], int | None] = room_for,
        drop: Callable[[ModelSpec], str] = drop_staged,
    ) -> None:
        self.site = site
        self.systemd = systemd or Systemd()
        self.state_path = state_path
        self.clock = clock
        self.read_machine = machine
        self.room = room
        self.drop = drop

    def run(self, requested: Sequence[str], exact: bool = False, dry_run: bool = False) -> Report:
        began = self.clock()
        serving.check_set(serving.resolve(self.site, requested))  # bad input: before anything
        previous = serving.current(self.site, self.state_path)
        machine = self.read_machine(self.site, self.systemd)
        p = plan(self.site, previous, requested, machine, exact)
        steps = [Step("plan", self.clock() - began, detail=describe(p))]
        warned = warnings(self.site, p)
        if dry_run:
            return Report(
                True, p.changed, True, previous.names, p.names, tuple(steps), warnings=warned
            )
        stopped = self._stop(p, steps)
        if stopped is not None:
            drops = self._drop(p, machine, steps)
            if drops is not None and self._stage(p, steps) and self._start(p, steps):
                self._persist(p, steps)
                idle = {s.name for s in p.target if s not in p.start and s not in p.keep}
                serving_now = {
                    s.name: "not serving: not running, and not asked to start"
                    if s.name in idle
                    else "serving"
                    for s in p.target
                }
                return Report(
                    True,
                    p.changed,
                    False,
                    previous.names,
                    p.names,
                    tuple(steps),
                    serving_now,
                    warnings=warned,
                )
        failed = next(s for s in reversed(steps) if not s.ok)
        restore = self._restore(p, steps)
        return replace(
            restore,
            steps=tuple(steps),
            previous=previous.names,
            target=p.names,
            failure=f"{failed.name}: {failed.detail}",
            warnings=warned,
        )

    # -- steps ----------------------------------------------------------------------------------

    def _timed(
        self, name: str, steps: list[Step], items: list[Item], ok: bool, t0: float, detail: str
    ) -> None:
        steps.append(Step(name, self.clock() - t0, tuple(items), ok, detail))

    def _stop(self, p: Plan, steps: list[Step]) -> tuple[ServerSpec, ...] | None:
        if not p.stop:
            return ()
        t0 = self.clock()
        units = [engines.unit_name(s.name) for s in p.stop]
        timeout = engines.STOP_TIMEOUT + STOP_GRACE_S
        ok, err = self.systemd.stop(units, timeout)
        items = [Item(s.name, self.clock() - t0, ok) for s in p.stop]
        self._timed("stop", steps, items, ok, t0, ", ".join(s.name for s in p.stop) if ok else err)
        return p.stop if ok else None

    def _drop(self, p: Plan, machine: Machine, steps: list[Step]) -> tuple[ModelSpec, ...] | None:
        room = self.room(self.site, p.stage)
        drops, to_stage = choose_drops(p.stage, p.droppable, machine.models, room)
        if not drops:
            return ()
        t0 = self.clock()
        items: list[Item] = []
        for model in drops:
            t1 = self.clock()
            try:
                self.systemd.stop([engines.stage_unit(model.name)], engines.STOP_TIMEOUT)
                detail = self.drop(model)
            except OSError as exc:
                items.append(Item(model.name, self.clock() - t1, False, str(exc)))
                self._timed("drop", steps, items, False, t0, f"cannot drop {model.name}: {exc}")
                return None
            items.append(Item(model.name, self.clock() - t1, True, detail))
        why = f"{to_stage} bytes to stage, {room} bytes of room: dropped"
        self._timed("drop", steps, items, True, t0, f"{why} {', '.join(m.name for m in drops)}")
        return drops

    def _stage(self, p: Plan, steps: list[Step]) -> bool:
        if not p.stage:
            return True
        t0 = self.clock()
        items: list[Item] = []
        units = [engines.stage_unit(m.name) for m in p.stage]
        self.systemd.quick("reset-failed", units)
        for model, unit in zip(p.stage, units, strict=True):
            t1 = self.clock()
            ok, err = self.systemd.start(unit, STAGE_TIMEOUT_S)
            detail = "" if ok else self._why(unit, err)
            items.append(Item(model.name, self.clock() - t1, ok, detail))
            if not ok:
                self._timed("stage", steps, items, False, t0, f"{model.name}: {detail}")
                return False
        self._timed("stage", steps, items, True, t0, ", ".join(m.name for m in p.stage))
        return True

    def _start(self, p: Plan, steps: list[Step]) -> bool:
        if not p.start:
            return True
        t0 = self.clock()
        items = self._start_all(p.start)
        ok = all(i.ok for i in items)
        failed = "; ".join(f"{i.name}: {i.detail}" for i in items if not i.ok)
        self._timed(
            "start", steps, items, ok, t0, ", ".join(i.name for i in items) if ok else failed
        )
        return ok

    def _start_all(self, servers: Sequence[ServerSpec]) -> list[Item]:
        """Every server at once (each has its own GPUs), each timed on its own."""
        units = [engines.unit_name(s.name) for s in servers]
        self.systemd.quick("reset-failed", units)

        def one(server: ServerSpec) -> Item:
            t1 = self.clock()
            unit = engines.unit_name(server.name)
            timeout = engines.start_timeout(self.site, server) + STOP_GRACE_S
            ok, err = self.systemd.start(unit, timeout)
            return Item(server.name, self.clock() - t1, ok, "" if ok else self._why(unit, err))

        with ThreadPoolExecutor(max_workers=max(1, len(servers))) as pool:
            return list(pool.map(one, servers))

    def _persist(self, p: Plan, steps: list[Step]) -> None:
        t0 = self.clock()
        items: list[Item] = []
        for verb, units in (("enable", p.enable), ("disable", p.disable)):
            if units:
                ok, err = self.systemd.quick(verb, units)
                items.append(Item(f"{verb} {' '.join(units)}", self.clock() - t0, ok, err))
        if p.write_state:
            serving.write_state(ServingState(p.names, serving.now()), self.state_path)
            items.append(Item(f"write {self.state_path}", self.clock() - t0))
        ok = all(i.ok for i in items)
        self._timed("persist", steps, items, ok, t0, "" if ok else "enable/disable failed")

    def _why(self, unit: str, err: str) -> str:
        """systemctl's own line says little ("see journalctl"); the unit's journal says why."""
        tail = [line for line in self.systemd.journal(unit) if line.strip()]
        return " | ".join(tail[-6:]) or err or "failed"

    def _restore(self, p: Plan, steps: list[Step]) -> Report:
        """Stop the new servers, start the stopped ones again; say who serves."""
        t0 = self.clock()
        new = [engines.unit_name(s.name) for s in p.start]
        self.systemd.stop(new, engines.STOP_TIMEOUT + STOP_GRACE_S)
        items = self._start_all(p.stop) if p.stop else []
        states = self.systemd.show([engines.unit_name(s.name) for s in p.previous.servers])
        status = {}
        for server in p.previous.servers:
            unit = engines.unit_name(server.name)
            state = states.get(unit, UnitState(unit))
            item = next((i for i in items if i.name == server.name), None)
            if state.active == "active":
                status[server.name] = "serving"
            elif item is not None:
                status[server.name] = f"not serving: {item.detail or state.describe()}"
            else:
                status[server.name] = f"not serving: {state.describe()} (was not running before)"
        running_before = {s.name for s in p.stop} | {s.name for s in p.keep}
        restored = all(status.get(n) == "serving" for n in running_before if n in status)
        ok = all(i.ok for i in items)
        detail = "stopped " + (", ".join(s.name for s in p.start) or "nothing")
        detail += "; started again " + (", ".join(s.name for s in p.stop) or "nothing")
        self._timed("restore", steps, items, ok, t0, detail)
        return Report(False, True, False, (), (), (), status, "", restored)


def warnings(site: SiteSpec, p: Plan) -> tuple[str, ...]:
    """What validation warns about the enabled servers, for the set being switched to: a TP
    group across NUMA nodes."""
    found = []
    for server in p.target:
        nodes = engines.numa_nodes(site, server)
        if nodes is not None and len(nodes) > 1:
            found.append(
                f"{server.name}: GPUs {', '.join(map(str, server.gpus))} span NUMA nodes "
                f"{', '.join(map(str, nodes))}: TP across the inter-socket link was measured "
                "slower than TP4 on CT200 for single requests"
            )
    return tuple(found)


def describe(p: Plan) -> str:
    parts = []
    if p.stop:
        parts.append("stop " + ", ".join(s.name for s in p.stop))
    if p.stage:
        parts.append("stage " + ", ".join(m.name for m in p.stage))
    if p.start:
        parts.append("start " + ", ".join(s.name for s in p.start))
    if p.keep:
        parts.append("keep " + ", ".join(s.name for s in p.keep))
    if p.strays:
        parts.append("leave running (not in the set) " + ", ".join(s.name for s in p.strays))
    if p.enable or p.disable:
        parts.append(f"enable {len(p.enable)}, disable {len(p.disable)} unit(s)")
    if p.write_state:
        parts.append("record the set")
    return "; ".join(parts) or "nothing to do: the set serves already"
