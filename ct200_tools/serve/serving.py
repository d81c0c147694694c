"""The serving set: which servers of the site spec run, kept across reboots.

`ct200-serve switch` writes it to /var/lib/ct200/serving.json (whole or not at all: temp file,
fsync, rename); the inference_servers role enables exactly its units, so a reboot brings the same
set back. Absent, the spec's `enabled` flags are the serving set. The doctor reads it through
read_state()/serving_set() to judge the servers that should run, and nothing else.

A set is usable when its servers share no GPU and no port (check_set); the spec's validation
checks the same of the enabled servers, since they are the default set.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from ct200_tools.fsutil import write_atomic
from ct200_tools.spec import ServerSpec, SiteSpec
from ct200_tools.spec.read import did_you_mean
from ct200_tools.untrusted import (
    FieldError,
    Fields,
    UntrustedInputError,
    parse_json,
    read_bounded,
    show,
)

STATE_PATH: Final = "/var/lib/ct200/serving.json"
#: Names the file's format; a reader refuses a version it does not know.
KIND: Final = "ct200-serving-set"
SCHEMA_VERSION: Final = 1
#: A serving set lists server names; anything this large is not one.
MAX_BYTES: Final = 1 << 20

Source = Literal["serving.json", "spec"]


class ServingError(Exception):
    """A serving set that cannot be used, with what to do about it; `reason` says what is wrong
    without the path (the doctor's facts record it beside the path)."""

    def __init__(self, message: str, fix: str, reason: str | None = None) -> None:
        self.message = message
        self.fix = fix
        self.reason = reason or message
        super().__init__(message)


@dataclass(frozen=True)
class ServingState:
    """What serving.json holds: the servers, when and by what they were chosen."""

    servers: tuple[str, ...]
    switched_at: str = ""
    by: str = "ct200-serve switch"

    def to_json(self) -> str:
        data = {
            "kind": KIND,
            "schema_version": SCHEMA_VERSION,
            "servers": list(self.servers),
            "switched_at": self.switched_at,
            "by": self.by,
        }
        return json.dumps(data, indent=1) + "\n"


@dataclass(frozen=True)
class ServingSet:
    """The servers that should run, where that choice came from, and names the state file
    lists that the spec no longer has (ignored: the spec was changed since the switch)."""

    servers: tuple[ServerSpec, ...]
    source: Source
    unknown: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.servers)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def damaged_fix(path: str) -> str:
    # The command in backquotes is whole (pasted, it repairs); NAME is for the reader to choose.
    return (
        f"choose the serving set again with ct200-serve switch NAME... (it rewrites {path}), "
        f"or `rm -f {shlex.quote(path)}` to serve the spec's enabled servers"
    )


def parse(text: str | bytes, path: str = STATE_PATH) -> ServingState:
    """The state in `text`; ServingError naming the path and the fix when it is not one."""
    fix = damaged_fix(path)
    try:
        data = parse_json(text, show(path), fix)
    except UntrustedInputError as exc:
        raise ServingError(exc.message, fix, _why(exc)) from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        why = f'not a serving set (no "kind": "{KIND}")'
        raise ServingError(f"{path} is {why}", fix, why)
    if data.get("schema_version") != SCHEMA_VERSION:
        why = (
            f"schema_version {show(data.get('schema_version'), 40)}; this ct200-tools reads "
            f"{SCHEMA_VERSION}"
        )
        raise ServingError(
            f"{path} has {why}", "install the ct200-tools that wrote it, or " + fix, why
        )
    servers = data.get("servers")
    if not isinstance(servers, list) or not all(isinstance(s, str) for s in servers):
        why = 'no "servers" list of names in it'
        raise ServingError(f'{path}: "servers" is not a list of server names', fix, why)
    fields = Fields(data)
    try:
        switched_at, by = fields.opt_text("switched_at"), fields.opt_text("by")
    except FieldError as exc:
        raise ServingError(f"{path}: {exc}", fix, str(exc)) from None
    return ServingState(tuple(servers), switched_at or "", by or "")


def read_state(path: str | os.PathLike[str] = STATE_PATH) -> ServingState | None:
    """The recorded serving set, or None when there is none (the spec's enabled flags rule).

    Read as a file from outside (untrusted.read_bounded): a FIFO, a device or a link to one, or
    a file larger than any serving set is refused at once with the fix, never read or waited on.
    """
    name = os.fspath(path)
    try:
        data = read_bounded(path, "the serving set", MAX_BYTES, damaged_fix(name))
    except UntrustedInputError as exc:
        if exc.problem == "missing":
            return None
        fix = "run as root, or check the file's mode" if exc.problem == "unreadable" else exc.fix
        raise ServingError(exc.message, fix, _why(exc)) from None
    return parse(data, name)


def _why(exc: UntrustedInputError) -> str:
    """The doctor's short reason: "not JSON", "a FIFO (named pipe), not a regular file"..."""
    return exc.reason.removeprefix("is ").split(":")[0]


def write_state(state: ServingState, path: str = STATE_PATH) -> None:
    """Atomically: a crash leaves the old set or the new one, never half a file."""
    write_atomic(path, state.to_json(), 0o644)


def remove_state(path: str = STATE_PATH) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def selected(
    site: SiteSpec, names: Iterable[str] | None, only: str | None = None
) -> tuple[ServerSpec, ...]:
    """The one rule for which servers should run, in spec order: server `only` when one is
    asked about (a gate, `check --server`); else those a recorded serving set names; else
    (names None: no set recorded) the spec's enabled servers. The doctor's probes and checks
    and the switch all choose through here."""
    if only is not None:
        return tuple(s for s in site.servers if s.name == only)
    if names is None:
        return site.enabled_servers
    chosen = set(names)
    return tuple(s for s in site.servers if s.name in chosen)


def serving_set(site: SiteSpec, state: ServingState | None) -> ServingSet:
    """The servers that should run: those the state names (in spec order), else the enabled."""
    if state is None:
        return ServingSet(selected(site, None), "spec")
    known = {s.name for s in site.servers}
    unknown = tuple(n for n in state.servers if n not in known)
    return ServingSet(selected(site, state.servers), "serving.json", unknown)


def current(site: SiteSpec, path: str = STATE_PATH) -> ServingSet:
    return serving_set(site, read_state(path))


def require_known(site: SiteSpec, chosen: ServingSet) -> ServingSet:
    """``chosen``, unless serving.json names servers and the spec has none of them: then there
    is nothing to smoke-test, and calling that a pass would hide that the set is stale."""
    if chosen.servers or not chosen.unknown:
        return chosen
    names = ", ".join(show(n, 80) for n in chosen.unknown)
    known = ", ".join(s.name for s in site.servers) or "it has none"
    raise ServingError(
        f"the serving set in {STATE_PATH} names only servers the site spec lacks: {names}",
        f"choose the set again from the spec's servers ({known}) with "
        f"ct200-serve switch NAME..., or `rm -f {STATE_PATH}` to serve the spec's enabled "
        "servers",
    )


def resolve(site: SiteSpec, names: Iterable[str]) -> tuple[ServerSpec, ...]:
    """The spec's servers of these names, in spec order; ServingError for a name it lacks."""
    wanted = list(dict.fromkeys(names))
    known = [s.name for s in site.servers]
    missing = [n for n in wanted if n not in known]
    if missing:
        hint = did_you_mean(missing[0], known)
        raise ServingError(
            f"no server {', '.join(repr(n) for n in missing)} in the site spec{hint}",
            f"name servers of the spec: {', '.join(known) or 'it has none'}",
        )
    return tuple(s for s in site.servers if s.name in wanted)


def conflicts(servers: Sequence[ServerSpec]) -> list[str]:
    """Why these servers cannot run together: shared GPUs or ports, one line per pair."""
    found: list[str] = []
    for j, server in enumerate(servers):
        for other in servers[:j]:
            if shared := sorted(set(server.gpus) & set(other.gpus)):
                gpus = ", ".join(map(str, shared))
                found.append(f"{other.name} and {server.name} both use GPUs {gpus}")
            if server.port == other.port:
                found.append(f"{other.name} and {server.name} both listen on port {server.port}")
    return found


def check_set(servers: Sequence[ServerSpec]) -> None:
    """ServingError when the servers cannot all run at once."""
    problems = conflicts(servers)
    if problems:
        raise ServingError(
            "these servers cannot run together: " + "; ".join(problems),
            "serve one of each pair: each GPU and each port can belong to one server at a time",
        )
