"""The servers of the site spec: each server's fields, and the rules between servers.

Every rule records an issue and carries on, so one run reports every problem with its path and
fix. The rest of the schema, and validate(), are in ct200_tools.spec.schema.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Final

from ct200_tools.engines import ENGINES as KINDS
from ct200_tools.engines.base import Engine as EngineKind
from ct200_tools.spec.model import Engine, GpuSpec, ServerSpec, SpeculativeSpec
from ct200_tools.spec.read import (
    Issues,
    Section,
    at,
    keyname,
    kind,
    listing,
    scalar_text,
    section,
    show,
)

#: The most GPUs a spec declares (gpus.count), and so the longest list of GPU indices.
MAX_GPUS: Final = 64
ENV_KEY_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ARG_KEY_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
#: One label of a host name (RFC 1123): letters, digits and inner hyphens, at most 63.
LABEL_RE: Final = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
#: The spec's engine names: the engine modules' own (ct200_tools.engines), never written here.
ENGINES: Final[tuple[Engine, ...]] = tuple(KINDS)
RESERVED_ENV: Final = frozenset({"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"})
#: The engines whose servers may run on the CPU (gpus: []), for messages.
CPU_ENGINES: Final = " or ".join(k.name for k in KINDS.values() if k.cpu_ok)
#: start_timeout bounds (seconds): a minute at least, a day at most.
START_TIMEOUT: Final = (60, 86_400)
HEALTH_RE: Final = re.compile(r"^/[A-Za-z0-9._~!$&'()*+,;=:@/?-]{0,199}$")

SERVER: Final = {
    "name": "name: qwen-tp4",
    "engine": "engine: sglang",
    "model": "model: qwen3.6-27b",
    "gpus": "gpus: [0, 1, 2, 3]",
    "tp": "tp: 4",
    "port": "port: 30000",
    "host": "host: 127.0.0.1",
    "enabled": "enabled: true",
    "speculative": "speculative: {algorithm: DFLASH, draft_model: /dev/shm/models/...}",
    "env": "env: {NCCL_PROTO: LL}",
    "args": "args: {mem-fraction-static: 0.85}",
    "command": "command: [/usr/bin/llama-server, --port, '30000']",
    "start_timeout": "start_timeout: 1800",
    "health": "health: /health",
}
SPECULATIVE_SHARED: Final = {
    "algorithm": "algorithm: EAGLE3",
    "draft_model": "draft_model: /dev/shm/models/kimi-k2.6-eagle3",
}


def index_list(
    issues: Issues, value: object, path: str, count: int | None, *, empty_ok: bool = False
) -> tuple[int, ...] | None:
    """Distinct GPU indices in 0..count-1; None when anything is wrong (already recorded).

    Empty only where empty_ok (an engine that runs on the CPU, such as the testbed's)."""
    if not isinstance(value, list) or not (value or empty_ok) or len(value) > MAX_GPUS:
        issues.error(
            path,
            f"expected a non-empty list of at most {MAX_GPUS} GPU indices, got {kind(value)} "
            f"{show(value)}",
            f"write a list like [0, 1, 2, 3] (an empty list only with engine: {CPU_ENGINES}, "
            "for a server that runs on the CPU)",
        )
        return None
    good: list[int] = []
    for i, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int):
            issues.error(at(path, i), f"{show(item)} is not a GPU index", "write whole numbers")
        elif count == 0:
            issues.error(
                at(path, i),
                f"GPU {show(item)}, but the site has no GPU (gpus.count is 0)",
                f"give the server gpus: [] (engine: {CPU_ENGINES}, on the CPU), or declare "
                "the GPUs in gpus.count",
            )
        elif count is not None and not 0 <= item < count:
            issues.error(
                at(path, i),
                f"GPU {show(item)} is out of range 0..{count - 1} (gpus.count is {count})",
                f"use an index from 0 to {count - 1}, or raise gpus.count",
            )
        elif item in good:
            issues.error(at(path, i), f"GPU {item} is listed twice", "list each GPU once")
        else:
            good.append(item)
    return tuple(good) if len(good) == len(value) else None


@dataclass
class Draft:
    """A server as read so far: cross-server rules need its good parts even when others are bad."""

    path: str
    name: str | None = None
    engine: Engine | None = None
    model: str | None = None
    #: None until read without fault (an empty tuple is a CPU server's: an engine's cpu_ok).
    gpus: tuple[int, ...] | None = None
    tp: int | None = None
    port: int | None = None
    host: str = "127.0.0.1"
    enabled: bool = True
    speculative: SpeculativeSpec | None = None
    env: dict[str, str] = field(default_factory=dict)
    args: dict[str, object] = field(default_factory=dict)
    command: tuple[str, ...] = ()
    start_timeout: int | None = None
    health: str | None = None

    @property
    def label(self) -> str:
        return repr(self.name) if self.name else self.path

    @property
    def gpu_set(self) -> set[int]:
        return set(self.gpus or ())

    def build(self) -> ServerSpec | None:
        name, engine, model, port, gpus = self.name, self.engine, self.model, self.port, self.gpus
        if name is None or engine is None or model is None or port is None or gpus is None:
            return None
        return ServerSpec(
            name=name,
            engine=engine,
            model=model,
            gpus=gpus,
            port=port,
            tp=self.tp or len(gpus),
            enabled=self.enabled,
            host=self.host,
            speculative=self.speculative,
            env=self.env,
            args=self.args,
            command=self.command,
            start_timeout=self.start_timeout,
            health=self.health,
        )


def read_server(issues: Issues, value: object, path: str, gpus: GpuSpec | None) -> Draft | None:
    required = ("name", "engine", "model", "gpus", "port")
    server = section(issues, value, path, SERVER, required)
    if server is None:
        return None
    draft = Draft(path, server.get_name("name"))
    draft.engine = server.get_choice("engine", ENGINES)
    kind = KINDS.get(draft.engine or "")
    draft.model = server.get_str("model")
    if "gpus" in server.data:
        count = gpus.count if gpus else None
        cpu_ok = kind is not None and kind.cpu_ok
        where = server.where("gpus")
        draft.gpus = index_list(issues, server.data["gpus"], where, count, empty_ok=cpu_ok)
    draft.tp = server.get_int("tp", 0, MAX_GPUS)  # 0: a CPU server (gpus: []) written back
    if draft.tp is not None and draft.gpus is not None and draft.tp != len(draft.gpus):
        issues.error(
            server.where("tp"),
            f"tp is {draft.tp} but gpus lists {len(draft.gpus)} GPU(s)",
            f"set tp: {len(draft.gpus)} (or remove tp; it defaults to the number of GPUs), "
            f"or list {draft.tp} GPUs in gpus",
        )
    draft.port = server.get_int("port", 1, 65535)
    draft.host = read_host(server) or draft.host
    draft.enabled = server.get_bool("enabled") is not False
    draft.env = read_env(server)
    draft.args = read_args(server, kind)
    draft.command = read_command(server, kind)
    draft.speculative = read_speculative(server, kind)
    # null is how spec_to_dict writes "the default".
    draft.start_timeout = server.get_int("start_timeout", *START_TIMEOUT, nullable=True)
    draft.health = read_health(server)
    if kind is not None:
        kind.check(draft, server.issues)
    return draft


def read_health(server: Section) -> str | None:
    health = server.get_str("health", nullable=True)
    if health is None or HEALTH_RE.match(health):
        return health
    server.issues.error(
        server.where("health"),
        f"{show(health)} is not an HTTP path",
        "write the path alone, starting with /, e.g. health: /health (no scheme, host, port or "
        "spaces)",
    )
    return None


def host_problem(host: str) -> str | None:
    """Why host is neither an IP address nor a host name, or None: the engine binds to it."""
    if "%" not in host:  # an IPv6 zone (fe80::1%eth0) would be a specifier in a unit file
        try:
            ipaddress.ip_address(host)
        except ValueError:
            pass
        else:
            return None
    if "://" in host:
        return "has a scheme"
    if host.startswith("["):
        return "has brackets"
    if "%" in host:
        return "has a zone (%) or is no address"
    if host.count(":") == 1:
        return "has a port (host:port)"
    labels = host.removesuffix(".").split(".")
    if len(host) > 253 or not all(LABEL_RE.match(label) for label in labels):
        return "is not an IP address or a host name"
    if labels[-1].isdigit():  # 300.1.1.1: no top-level domain is all digits (RFC 3696)
        return "is not a valid IP address (and not a host name)"
    return None


def read_host(server: Section) -> str | None:
    host = server.get_str("host")
    problem = host_problem(host) if host is not None else None
    if host is None or problem is None:
        return host
    server.issues.error(
        server.where("host"),
        f"{show(host)} {problem}",
        "write an IP address or a host name only, e.g. host: 127.0.0.1 (this machine), "
        "0.0.0.0 or :: (every interface); the port goes in port:, and no scheme (http://), "
        "brackets or zone (%eth0)",
    )
    return None


def read_env(server: Section) -> dict[str, str]:
    value = server.data.get("env")
    if value is None:
        return {}
    if not isinstance(value, dict):
        server.bad("env", value, "a mapping")
        return {}
    env: dict[str, str] = {}
    for key, item in value.items():
        where, text = at(server.where("env"), keyname(key)), scalar_text(item)
        if not isinstance(key, str) or not ENV_KEY_RE.match(key):
            server.issues.error(where, "is not a valid variable name", "use [A-Za-z_][A-Za-z0-9_]*")
        elif key in RESERVED_ENV:
            server.issues.error(
                where, "is set from the server's gpus", "remove it; list the GPUs in gpus"
            )
        elif text is None:
            server.issues.error(
                where,
                f"expected a string or number, got {kind(item)} {show(item)}",
                "quote the value, e.g. 'true' or '1': environment values are text",
            )
        elif server.issues.one_line(where, text):
            env[key] = text
    return env


def read_args(server: Section, kind: EngineKind | None) -> dict[str, object]:
    value = server.data.get("args")
    if value is None or value == {}:  # {} is how spec_to_dict writes "no args"
        return {}
    if kind is not None and not kind.takes_args:
        server.issues.error(
            server.where("args"), f"is not used with engine: {kind.name}", "put them in command"
        )
    reserved = kind.reserved_args if kind is not None else frozenset()
    if not isinstance(value, dict):
        server.bad("args", value, "a mapping")
        return {}
    args: dict[str, object] = {}
    for key, item in value.items():
        where = at(server.where("args"), keyname(key))
        if not isinstance(key, str) or not ARG_KEY_RE.match(key):
            server.issues.error(
                where, "is not a valid argument name", "write it without dashes, e.g. page-size"
            )
        elif key.replace("_", "-").lower() in reserved:
            server.issues.error(
                where,
                "is set from the server's own fields",
                "remove it and use model, gpus, tp, host, port or speculative instead",
            )
        elif (arg := arg_value(item)) is None:
            server.issues.error(
                where,
                f"expected a string, number, boolean or list of them, got {show(item)}",
                "use true for a bare flag; pass JSON as a quoted string",
            )
        elif one_line(server.issues, where, arg):
            args[key] = arg
    return args


def one_line(issues: Issues, where: str, arg: object) -> bool:
    """An argument value, or each item of a list of them, without control characters."""
    items = list(enumerate(arg)) if isinstance(arg, tuple) else [(None, arg)]
    clean = [
        issues.one_line(where if i is None else at(where, i), text)
        for i, text in items
        if isinstance(text, str)
    ]
    return all(clean)


def arg_value(item: object) -> object | None:
    if isinstance(item, bool | int | float | str):
        return item
    if isinstance(item, list) and all(isinstance(i, int | float | str) for i in item):
        return tuple(item)  # frozen spec: no list that someone could append to
    return None


def read_command(server: Section, kind: EngineKind | None) -> tuple[str, ...]:
    value = server.data.get("command")
    takes = kind.takes_command if kind is not None else "argv"
    if value is None or value == []:  # [] is how spec_to_dict writes "no command"
        if takes == "argv" and kind is not None:
            server.issues.error(
                server.where("command"),
                f"engine: {kind.name} needs a command",
                f"add {SERVER['command']}",
            )
        return ()
    if kind is not None and takes == "none":
        takers = listing(k.name for k in KINDS.values() if k.takes_command != "none")
        server.issues.error(
            server.where("command"),
            f"command is not used with engine: {kind.name} (only with {takers})",
            f"remove command, or set engine: {takers}",
        )
    if kind is not None and takes == "program" and isinstance(value, list) and len(value) > 1:
        server.issues.error(
            server.where("command"),
            f"engine: {kind.name} takes only its program here, got {len(value)} words",
            "write command: [/path/to/program]; the engine's flags come from the server's "
            "fields and args (or use engine: command for a whole argv)",
        )
        return ()
    argv = [scalar_text(v) for v in value] if isinstance(value, list) else []
    if not argv or None in argv or not argv[0]:
        server.bad("command", value, "a non-empty list of strings")
        return ()
    command = tuple(a for a in argv if a is not None)
    program = command[0]
    if "/" in program and not program.startswith("/"):
        server.issues.error(
            at(server.where("command"), 0),
            f"{show(program)} is a relative path, which systemd refuses in ExecStart=",
            "write the program's absolute path (e.g. /usr/local/bin/llama-server), or a bare "
            "name that systemd finds in /usr/local/sbin, /usr/local/bin, /usr/sbin or /usr/bin",
        )
        return ()
    return command if one_line(server.issues, server.where("command"), command) else ()


def read_speculative(server: Section, kind: EngineKind | None) -> SpeculativeSpec | None:
    """The server's speculative: block as its engine declares it (Speculative in
    ct200_tools.engines.base); the engine's check() judges the values together."""
    value = server.data.get("speculative")
    if value is None:
        return None
    grammar = kind.speculative if kind is not None else None
    if kind is not None and grammar is None:
        takers = listing(k.name for k in KINDS.values() if k.speculative is not None)
        server.issues.error(
            server.where("speculative"),
            f"is not used with engine: {kind.name}",
            f"remove it (put the engine's own flags where it takes them), or use engine: {takers}",
        )
        return None
    if grammar is None:  # the engine is unknown (reported): nothing to read it by
        return None
    if isinstance(value, dict):  # null is how spec_to_dict writes a key the block leaves unset
        value = {k: v for k, v in value.items() if v is not None}
    examples = {**SPECULATIVE_SHARED, **{k: f.example for k, f in grammar.fields.items()}}
    spec = section(server.issues, value, server.where("speculative"), examples, ("algorithm",))
    if spec is None:
        return None
    if kind is not None and another_engines_algorithm(spec, kind):
        return None
    algorithm = spec.get_choice("algorithm", grammar.algorithms, upper=grammar.upper)
    draft_model = spec.get_path("draft_model", nullable=True)
    values: dict[str, object] = {}
    for key, f in grammar.fields.items():
        got = spec.get_bool(key) if f.type == "bool" else spec.get_int(key, f.lo, f.hi)
        if got is not None:
            values[key] = got
    if algorithm is None:
        return None
    if algorithm not in grammar.no_draft_model and not spec.has("draft_model"):
        spec.issues.error(
            spec.where("draft_model"),
            f"{algorithm} needs a draft model (without one the engine fails at launch or later)",
            "set draft_model to the drafter's absolute path, normally a model's staged path",
        )
    if algorithm in grammar.draft_model_ignored and spec.has("draft_model"):
        spec.issues.warn(spec.where("draft_model"), f"is ignored by {algorithm}", "remove it")
    budget, steps, topk, tokens = (_int(values.pop(k, None)) for k in ("budget", *SIZES))
    return SpeculativeSpec(algorithm, draft_model, budget, steps, topk, tokens, options=values)


def another_engines_algorithm(spec: Section, kind: EngineKind) -> bool:
    """An algorithm this engine lacks but another has (DFLASH with vLLM) is said so, with the
    engines that have it; True when it was."""
    raw, grammar = spec.data.get("algorithm"), kind.speculative
    if not isinstance(raw, str) or grammar is None:
        return False
    norm = raw.upper() if grammar.upper else raw
    if norm in grammar.algorithms:
        return False
    others = [
        k.name
        for k in KINDS.values()
        if k.speculative is not None
        and (raw.upper() if k.speculative.upper else raw) in k.speculative.algorithms
    ]
    if not others:
        return False
    spec.issues.error(
        spec.where("algorithm"),
        f"engine: {kind.name} has no {show(raw)} algorithm (it is {listing(others)}'s)",
        f"use one of {listing(grammar.algorithms)} with {kind.name}, or engine: "
        f"{' or '.join(others)}",
    )
    return True


#: SpeculativeSpec's own sizing fields after budget (SGLang's names); other keys go in options.
SIZES: Final = ("num_steps", "eagle_topk", "num_draft_tokens")


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_servers(issues: Issues, drafts: list[Draft], gpus: GpuSpec | None) -> None:
    """Rules between servers: names, and ports and GPUs among those that run together."""
    for j, server in enumerate(drafts):
        for other in drafts[:j]:
            if server.name is not None and server.name == other.name:
                issues.error(
                    at(server.path, "name"),
                    f"server name {server.name!r} is already used by {other.path}",
                    "give each server its own name (it names the systemd unit)",
                )
            if not (server.enabled and other.enabled):
                continue
            if server.port is not None and server.port == other.port:
                issues.error(
                    at(server.path, "port"),
                    f"port {server.port} is already used by enabled server {other.path}",
                    "give each enabled server its own port",
                )
            if shared := sorted(server.gpu_set & other.gpu_set):
                issues.error(
                    at(server.path, "gpus"),
                    f"enabled servers {other.label} ({other.path}) and {server.label} both use "
                    f"GPUs {listing(shared)}",
                    f"give each enabled server its own GPUs, or set enabled: false on "
                    f"{other.label} or {server.label} (only one can run at a time)",
                )
        if gpus is not None and server.enabled:
            check_numa(issues, server, gpus)


def check_numa(issues: Issues, server: Draft, gpus: GpuSpec) -> None:
    nodes = sorted({n for g in server.gpu_set if (n := gpus.numa_node_of(g)) is not None})
    if len(nodes) > 1:
        issues.warn(
            at(server.path, "gpus"),
            f"the TP group spans NUMA nodes {listing(nodes)}: TP across the inter-socket link was "
            "measured slower than TP4 on CT200 for single requests",
            "keep a server's GPUs within one node (e.g. [0, 1, 2, 3]) unless the model needs "
            "the memory of more GPUs than one node has",
        )
