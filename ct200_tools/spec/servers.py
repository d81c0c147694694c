"""The servers of the site spec: each server's fields, and the rules between servers.

Every rule records an issue and carries on, so one run reports every problem with its path and
fix. The rest of the schema, and validate(), are in ct200_tools.spec.schema.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Final

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
    subsection,
)

#: The most GPUs a spec declares (gpus.count), and so the longest list of GPU indices.
MAX_GPUS: Final = 64
ENV_KEY_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ARG_KEY_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
#: One label of a host name (RFC 1123): letters, digits and inner hyphens, at most 63.
LABEL_RE: Final = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
ENGINES: Final[dict[str, Engine]] = {"sglang": "sglang", "vllm": "vllm", "command": "command"}
ALGORITHMS: Final = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DDTREE")
#: NEXTN drafts with the model's own MTP layers and NGRAM from the prompt: no separate drafter.
NO_DRAFT_MODEL: Final = ("NGRAM", "NEXTN")
EAGLE_FLAGS: Final = ("num_steps", "eagle_topk", "num_draft_tokens")
#: The server unit renders these from the server's own fields; a second copy would fight it.
RESERVED_ARGS: Final = frozenset(
    {"model", "model-path", "tp", "tp-size", "tensor-parallel-size", "host", "port", "config"}
    | {f"speculative-{k}" for k in ("config", "algorithm", "draft-model-path", "num-steps")}
    | {f"speculative-{k}" for k in ("eagle-topk", "num-draft-tokens", "ddtree-budget")}
)
RESERVED_ENV: Final = frozenset({"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"})
#: What vLLM's --speculative-config calls each algorithm; DFLASH and DDTREE are SGLang's only.
VLLM_METHODS: Final = {
    "EAGLE": "eagle",
    "EAGLE3": "eagle3",
    "NEXTN": "mtp",
    "STANDALONE": "draft_model",
    "NGRAM": "ngram",
}
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
SPECULATIVE: Final = {
    "algorithm": "algorithm: EAGLE3",
    "draft_model": "draft_model: /dev/shm/models/kimi-k2.6-eagle3",
    "budget": "budget: 15",
    "num_steps": "num_steps: 3",
    "eagle_topk": "eagle_topk: 1",
    "num_draft_tokens": "num_draft_tokens: 4",
}


def index_list(
    issues: Issues, value: object, path: str, count: int | None, *, empty_ok: bool = False
) -> tuple[int, ...] | None:
    """Distinct GPU indices in 0..count-1; None when anything is wrong (already recorded).

    Empty only where empty_ok (engine command: a server on the CPU, such as the testbed's)."""
    if not isinstance(value, list) or not (value or empty_ok) or len(value) > MAX_GPUS:
        issues.error(
            path,
            f"expected a non-empty list of at most {MAX_GPUS} GPU indices, got {kind(value)} "
            f"{show(value)}",
            "write a list like [0, 1, 2, 3] (an empty list only with engine: command, for a "
            "server that runs on the CPU)",
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
                "give the server gpus: [] (engine: command, on the CPU), or declare the GPUs "
                "in gpus.count",
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
    #: None until read without fault (an empty tuple is a CPU server's, engine command only).
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
    draft.engine = ENGINES.get(server.get_choice("engine", tuple(ENGINES)) or "")
    draft.model = server.get_str("model")
    if "gpus" in server.data:
        count = gpus.count if gpus else None
        cpu_ok = draft.engine == "command"
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
    draft.args = read_args(server, draft.engine)
    draft.command = read_command(server, draft.engine)
    draft.speculative = read_speculative(server, draft.engine)
    # null is how spec_to_dict writes "the default".
    draft.start_timeout = server.get_int("start_timeout", *START_TIMEOUT, nullable=True)
    draft.health = read_health(server)
    check_engine(server, draft)
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


def check_engine(server: Section, draft: Draft) -> None:
    """What one engine cannot do with the rest of the server's fields."""
    spec, where = draft.speculative, server.where("speculative")
    if draft.engine == "vllm" and spec is not None:
        if spec.algorithm not in VLLM_METHODS:
            server.issues.error(
                at(where, "algorithm"),
                f"vLLM has no {spec.algorithm} method in --speculative-config (it is SGLang's)",
                f"use engine: sglang, or one of {listing(VLLM_METHODS)} with vLLM",
            )
        if spec.eagle_topk not in (None, 1):
            server.issues.error(
                at(where, "eagle_topk"),
                f"vLLM's --speculative-config drafts one chain; eagle_topk {spec.eagle_topk} is "
                "SGLang's tree",
                "set eagle_topk: 1 (num_steps becomes num_speculative_tokens), or use sglang",
            )
    page = draft.args.get("page-size", draft.args.get("page_size"))
    if spec is not None and spec.algorithm == "DDTREE" and page not in (None, 1, "1"):
        server.issues.error(
            at(server.where("args"), "page-size"),
            f"DDTREE requires page size 1, got {show(page)}",
            "set args: {page-size: 1} (SGLang PR #29907), or another algorithm",
        )
    if draft.engine == "command" and draft.command and draft.port is not None:
        port = str(draft.port)
        if not any(port == a or a.endswith(("=" + port, ":" + port)) for a in draft.command):
            # An error, not a warning: readiness would wait the whole start timeout on a port
            # nothing listens on, and the play would blame the timeout (issue 33).
            server.issues.error(
                server.where("command"),
                f"no argument of the command is the port {port}: readiness and the doctor "
                f"would look for the server on port {port}, where it does not listen",
                f"pass the port in the command, e.g. --port {port}, or set port: to the one "
                "it listens on",
            )


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


def read_args(server: Section, engine: Engine | None) -> dict[str, object]:
    value = server.data.get("args")
    if value is None or value == {}:  # {} is how spec_to_dict writes "no args"
        return {}
    if engine == "command":
        server.issues.error(
            server.where("args"), "is not used with engine: command", "put them in command"
        )
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
        elif key.replace("_", "-").lower() in RESERVED_ARGS:
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


def read_command(server: Section, engine: Engine | None) -> tuple[str, ...]:
    value = server.data.get("command")
    if value is None or value == []:  # [] is how spec_to_dict writes "no command"
        if engine == "command":
            server.issues.error(
                server.where("command"),
                "engine: command needs a command",
                f"add {SERVER['command']}",
            )
        return ()
    if engine in ("sglang", "vllm"):
        server.issues.error(
            server.where("command"),
            f"command is only used with engine: command, not {engine}",
            "remove command, or set engine: command",
        )
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


def read_speculative(server: Section, engine: Engine | None) -> SpeculativeSpec | None:
    spec = subsection(server, "speculative", SPECULATIVE, required=("algorithm",))
    if spec is None:
        return None
    if engine == "command":
        server.issues.error(
            spec.path, "is not used with engine: command", "put the flags in command instead"
        )
    algorithm = spec.get_choice("algorithm", ALGORITHMS, upper=True)
    draft_model = spec.get_path("draft_model", nullable=True)
    budget = spec.get_int("budget", 1, 1024, nullable=True)
    steps, topk, tokens = (spec.get_int(k, 1, 1024, nullable=True) for k in EAGLE_FLAGS)
    check_speculative(spec, algorithm, steps, topk)
    if algorithm is None:
        return None
    return SpeculativeSpec(algorithm, draft_model, budget, steps, topk, tokens)


def check_speculative(
    spec: Section, algorithm: str | None, steps: int | None, topk: int | None
) -> None:
    issues, given = spec.issues, [k for k in EAGLE_FLAGS if spec.has(k)]
    if 0 < len(given) < len(EAGLE_FLAGS):
        issues.error(
            spec.path,
            f"sets {listing(given)} but not {listing(k for k in EAGLE_FLAGS if k not in given)}: "
            "setting some is the classic SGLang launch AssertionError",
            "set all three of num_steps, eagle_topk and num_draft_tokens, or none (SGLang then "
            "chooses them)",
        )
    if algorithm is None:
        return
    if algorithm not in NO_DRAFT_MODEL and not spec.has("draft_model"):
        issues.error(
            spec.where("draft_model"),
            f"{algorithm} needs a draft model (without one SGLang fails at launch or later)",
            "set draft_model to the drafter's absolute path, normally a model's staged path",
        )
    if algorithm == "NGRAM" and spec.has("draft_model"):
        issues.warn(spec.where("draft_model"), "is ignored by NGRAM", "remove draft_model")
    if algorithm != "DDTREE" and spec.has("budget"):
        issues.error(
            spec.where("budget"),
            f"budget only applies to DDTREE, not {algorithm}",
            "remove budget, or set algorithm: DDTREE",
        )
    if algorithm == "DDTREE" and not spec.has("budget"):
        issues.warn(
            spec.path,
            "DDTREE without budget runs with the build's default tree budget",
            "set budget (15 was best for Qwen3.6 on CT200; larger trees leak state on hybrid "
            "Mamba models)",
        )
    for key, value in (("num_steps", steps), ("eagle_topk", topk)):
        if algorithm == "DFLASH" and value not in (None, 1):
            issues.error(spec.where(key), f"DFLASH forces {key} to 1, got {value}", f"set {key}: 1")


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
