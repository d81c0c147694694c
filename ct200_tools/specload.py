"""The site spec's schema and rules; import the public names from ct200_tools.spec.

Every rule records an issue and carries on, so one run reports every problem with its path and fix.
All the schema lives in this one module on purpose: a rule and its neighbours are read together.
The typed reading is in ct200_tools.specread, reading files and inventories in ct200_tools.specfile.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

from ct200_tools.spec import (
    Engine,
    GpuSpec,
    ModelSpec,
    Passthrough,
    PcieSpec,
    PveSpec,
    ServerSpec,
    ShmSpec,
    SiteSpec,
    SpecError,
    SpeculativeSpec,
    TuningSpec,
)
from ct200_tools.specread import (
    Issues,
    Section,
    at,
    did_you_mean,
    entries,
    keyname,
    kind,
    listing,
    scalar_text,
    section,
    show,
    subsection,
    within,
)

ENV_KEY_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ARG_KEY_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
ENGINES: Final[dict[str, Engine]] = {"sglang": "sglang", "vllm": "vllm", "command": "command"}
PASSTHROUGH: Final[dict[str, Passthrough]] = {"devn": "devn", "raw-lxc": "raw-lxc"}
ALGORITHMS: Final = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DDTREE")
#: NEXTN drafts with the model's own MTP layers and NGRAM from the prompt: no separate drafter.
NO_DRAFT_MODEL: Final = ("NGRAM", "NEXTN")
EAGLE_FLAGS: Final = ("num_steps", "eagle_topk", "num_draft_tokens")
SHM_ROOT: Final = "/dev/shm"
GIB: Final = 1 << 30
#: The server unit renders these from the server's own fields; a second copy would fight it.
RESERVED_ARGS: Final = frozenset(
    {"model", "model-path", "tp", "tp-size", "tensor-parallel-size", "host", "port"}
    | {f"speculative-{k}" for k in ("config", "algorithm", "draft-model-path", "num-steps")}
    | {f"speculative-{k}" for k in ("eagle-topk", "num-draft-tokens", "ddtree-budget")}
)
RESERVED_ENV: Final = frozenset({"CUDA_VISIBLE_DEVICES"})

# Each section's keys, with the example that fix texts quote.
ROOT: Final = {
    "pve": "pve: {vmid: 200, passthrough: devn}",
    "gpus": "gpus: {count: 8, model: RTX PRO 6000}",
    "tuning": "tuning: {numa_balancing: 0, pcie_max_read_request: 4096}",
    "shm": "shm: {size: 1200G, reserve_ram: 64G}",
    "models": "models: [{name: ..., source: ..., staged: ...}]",
    "servers": "servers: [{name: ..., engine: sglang, model: ..., gpus: [0, 1], port: 30000}]",
}
PVE: Final = {"vmid": "vmid: 200", "passthrough": "passthrough: devn"}
GPUS: Final = {
    "count": "count: 8",
    "model": "model: RTX PRO 6000",
    "pcie": "pcie: {gen: 5, width: 16}",
    "numa": "numa: [[0, 1, 2, 3], [4, 5, 6, 7]]",
}
PCIE: Final = {"gen": "gen: 5", "width": "width: 16"}
TUNING: Final = {
    "numa_balancing": "numa_balancing: 0",
    "pcie_max_read_request": "pcie_max_read_request: 4096",
}
SHM: Final = {"size": "size: 1200G", "reserve_ram": "reserve_ram: 64G"}
MODEL: Final = {
    "name": "name: qwen3.6-27b",
    "source": "source: /tank/models/Qwen3.6-27B",
    "staged": "staged: /dev/shm/models/qwen3.6-27b",
    "size": "size: 54G",
}
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
}
SPECULATIVE: Final = {
    "algorithm": "algorithm: EAGLE3",
    "draft_model": "draft_model: /dev/shm/models/kimi-k2.6-eagle3",
    "budget": "budget: 15",
    "num_steps": "num_steps: 3",
    "eagle_topk": "eagle_topk: 1",
    "num_draft_tokens": "num_draft_tokens: 4",
}


# --- sections --------------------------------------------------------------------------------


def read_pve(root: Section) -> PveSpec | None:
    pve = subsection(root, "pve", PVE, required=("vmid",))
    if pve is None:
        return None
    vmid = pve.get_int("vmid", 100, 999_999_999)
    passthrough = PASSTHROUGH.get(pve.get_choice("passthrough", tuple(PASSTHROUGH)) or "devn")
    return None if vmid is None or passthrough is None else PveSpec(vmid, passthrough)


def read_gpus(root: Section) -> GpuSpec | None:
    if "gpus" not in root.data:
        return None  # the root section already reported it missing
    gpus = section(root.issues, root.data["gpus"], "gpus", GPUS, required=("count", "model"))
    if gpus is None:
        return None
    count = gpus.get_int("count", 1, 64)
    model = gpus.get_str("model")
    pcie = subsection(gpus, "pcie", PCIE, required=("gen", "width"))
    gen = pcie.get_int("gen", 1, 6) if pcie else None
    width = pcie.get_int("width", 1, 32, choices=(1, 2, 4, 8, 16, 32)) if pcie else None
    numa = read_numa(gpus, count)
    if count is None or model is None:
        return None
    link = PcieSpec(gen, width) if gen is not None and width is not None else None
    return GpuSpec(count, model, link, numa)


def read_numa(gpus: Section, count: int | None) -> tuple[tuple[int, ...], ...]:
    """GPUs per NUMA node; each GPU in exactly one node, so TP groups can be judged."""
    path = gpus.where("numa")
    node_of: dict[int, int] = {}
    nodes: list[tuple[int, ...]] = []
    for n, members in enumerate(entries(gpus, "numa")):
        if not isinstance(members, list):
            gpus.issues.error(at(path, n), f"expected a list, got {kind(members)}", "e.g. [0, 1]")
            continue
        for i, gpu in enumerate(members):
            if isinstance(gpu, bool) or not isinstance(gpu, int):
                gpus.issues.error(at(at(path, n), i), f"{show(gpu)} is not a GPU index", "e.g. 0")
            elif count is not None and not 0 <= gpu < count:
                gpus.issues.error(
                    at(at(path, n), i),
                    f"GPU {show(gpu)} is out of range 0..{count - 1}",
                    f"list only GPUs 0 to {count - 1}, or raise gpus.count",
                )
            elif gpu in node_of:
                gpus.issues.error(
                    at(at(path, n), i),
                    f"GPU {gpu} is already in node {node_of[gpu]}",
                    "list each GPU in exactly one node",
                )
            else:
                node_of[gpu] = n
        nodes.append(tuple(g for g in members if isinstance(g, int) and node_of.get(g) == n))
    missing = [g for g in range(count or 0) if g not in node_of]
    if nodes and missing:
        gpus.issues.error(
            path,
            f"GPUs {listing(missing)} are in no NUMA node",
            "add each GPU to its node's list (cat /sys/bus/pci/devices/<bdf>/numa_node)",
        )
    return tuple(nodes)


def index_list(issues: Issues, value: object, path: str, count: int | None) -> tuple[int, ...]:
    """Distinct GPU indices in 0..count-1; empty when anything is wrong (already recorded)."""
    if not isinstance(value, list) or not value:
        issues.error(
            path,
            f"expected a non-empty list of GPU indices, got {kind(value)} {show(value)}",
            "write a list like [0, 1, 2, 3]",
        )
        return ()
    good: list[int] = []
    for i, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int):
            issues.error(at(path, i), f"{show(item)} is not a GPU index", "write whole numbers")
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
    return tuple(good) if len(good) == len(value) else ()


def read_tuning(root: Section) -> TuningSpec:
    tuning = subsection(root, "tuning", TUNING)
    if tuning is None:
        return TuningSpec()
    # Absent means the default (0); an explicit null means "leave the host's setting alone".
    balancing = tuning.get_int("numa_balancing", 0, 1, nullable=True)
    if "numa_balancing" not in tuning.data:
        balancing = 0
    mrrs = tuning.get_int(
        "pcie_max_read_request", 128, 4096, choices=(128, 256, 512, 1024, 2048, 4096), nullable=True
    )
    return TuningSpec(balancing, mrrs)


def read_shm(root: Section) -> ShmSpec:
    shm = subsection(root, "shm", SHM)
    if shm is None:
        return ShmSpec()
    size = shm.get_size("size")
    if size == 0:
        shm.issues.error(shm.where("size"), "is 0", "give /dev/shm a size, e.g. size: 1200G")
    return ShmSpec(size or None, shm.get_size("reserve_ram", nullable=False) or 0)


def read_model(issues: Issues, value: object, path: str) -> ModelSpec | None:
    model = section(issues, value, path, MODEL, required=("name", "source", "staged"))
    if model is None:
        return None
    name, source = model.get_name("name"), model.get_path("source")
    staged, size = model.get_path("staged"), model.get_size("size")
    if source is not None and staged is not None:
        if within(staged, source) or within(source, staged):
            issues.error(
                model.where("staged"),
                f"staged {staged} and source {source} overlap",
                "stage to a separate directory under /dev/shm: the source is the persistent "
                "copy that restages the model after a reboot and must never be touched",
            )
        if staged in ("/", SHM_ROOT):
            issues.error(
                model.where("staged"),
                f"{staged} is a whole filesystem",
                f"use a directory of its own, e.g. {SHM_ROOT}/models/{name or 'NAME'}",
            )
            staged = None  # kept out of the overlap checks, where it would clash with everything
        elif not within(staged, SHM_ROOT):
            issues.warn(
                model.where("staged"),
                f"{staged} is not under {SHM_ROOT}",
                f"stage under {SHM_ROOT} (tmpfs) so loading reads RAM; elsewhere it loads at "
                "disk speed",
            )
    if name is None or source is None or staged is None:
        return None
    return ModelSpec(name, source, staged, size)


def read_models(root: Section) -> tuple[list[tuple[str, ModelSpec]], set[str]]:
    """Models with their paths, and every declared name (even of broken entries)."""
    models: list[tuple[str, ModelSpec]] = []
    names: set[str] = set()
    for i, value in enumerate(entries(root, "models")):
        path = at("models", i)
        model = read_model(root.issues, value, path)
        if isinstance(value, dict) and isinstance(value.get("name"), str):
            names.add(value["name"])
        if model is None:
            continue
        for other_path, other in models:
            check_model_pair(root.issues, path, model, other_path, other)
        models.append((path, model))
    return models, names


def check_model_pair(
    issues: Issues, path: str, model: ModelSpec, other_path: str, other: ModelSpec
) -> None:
    if model.name == other.name:
        issues.error(
            at(path, "name"),
            f"model name {model.name!r} is already used by {other_path}",
            "give each model its own name",
        )
    if within(model.staged, other.staged) or within(other.staged, model.staged):
        issues.error(
            at(path, "staged"),
            f"staged path {model.staged} overlaps {other_path}.staged ({other.staged})",
            "give each model its own directory: staging one would replace the other",
        )


# --- servers ---------------------------------------------------------------------------------


@dataclass
class Draft:
    """A server as read so far: cross-server rules need its good parts even when others are bad."""

    path: str
    name: str | None = None
    engine: Engine | None = None
    model: str | None = None
    gpus: tuple[int, ...] = ()
    tp: int | None = None
    port: int | None = None
    host: str = "127.0.0.1"
    enabled: bool = True
    speculative: SpeculativeSpec | None = None
    env: dict[str, str] = field(default_factory=dict)
    args: dict[str, object] = field(default_factory=dict)
    command: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return repr(self.name) if self.name else self.path

    def build(self) -> ServerSpec | None:
        name, engine, model, port = self.name, self.engine, self.model, self.port
        if name is None or engine is None or model is None or port is None or not self.gpus:
            return None
        return ServerSpec(
            name=name,
            engine=engine,
            model=model,
            gpus=self.gpus,
            port=port,
            tp=self.tp or len(self.gpus),
            enabled=self.enabled,
            host=self.host,
            speculative=self.speculative,
            env=self.env,
            args=self.args,
            command=self.command,
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
        draft.gpus = index_list(issues, server.data["gpus"], server.where("gpus"), count)
    draft.tp = server.get_int("tp", 1, 64)
    if draft.tp is not None and draft.gpus and draft.tp != len(draft.gpus):
        issues.error(
            server.where("tp"),
            f"tp is {draft.tp} but gpus lists {len(draft.gpus)} GPU(s)",
            f"set tp: {len(draft.gpus)} (or remove tp; it defaults to the number of GPUs), "
            f"or list {draft.tp} GPUs in gpus",
        )
    draft.port = server.get_int("port", 1, 65535)
    draft.host = server.get_str("host") or draft.host
    draft.enabled = server.get_bool("enabled") is not False
    draft.env = read_env(server)
    draft.args = read_args(server, draft.engine)
    draft.command = read_command(server, draft.engine)
    draft.speculative = read_speculative(server, draft.engine)
    return draft


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
        else:
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
        else:
            args[key] = arg
    return args


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
    return tuple(a for a in argv if a is not None)


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
            if shared := sorted(set(server.gpus) & set(other.gpus)):
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
    nodes = sorted({n for g in server.gpus if (n := gpus.numa_node_of(g)) is not None})
    if len(nodes) > 1:
        issues.warn(
            at(server.path, "gpus"),
            f"the TP group spans NUMA nodes {listing(nodes)}: TP across the inter-socket link was "
            "measured slower than TP4 on CT200 for single requests",
            "keep a server's GPUs within one node (e.g. [0, 1, 2, 3]) unless the model needs "
            "the memory of more GPUs than one node has",
        )


def check_models(
    issues: Issues,
    drafts: list[Draft],
    models: list[tuple[str, ModelSpec]],
    names: set[str],
    shm: ShmSpec,
) -> None:
    """Server references resolve, and what the enabled servers load fits in /dev/shm."""
    by_staged = {m.staged: m for _, m in models}
    used: dict[str, ModelSpec] = {}
    for server in drafts:
        if server.model is not None and server.model not in names:
            issues.error(
                at(server.path, "model"),
                f"unknown model {server.model!r}{did_you_mean(server.model, names)}",
                f"declare it under models, or use one of: {listing(sorted(names)) or 'none'}",
            )
        draft_path = server.speculative.draft_model if server.speculative else None
        if draft_path and within(draft_path, SHM_ROOT) and draft_path not in by_staged:
            issues.warn(
                at(server.path, "speculative.draft_model"),
                f"{draft_path} is in {SHM_ROOT} but no model is staged there, so a reboot "
                "loses it for good",
                "declare the drafter under models with this path as its staged path",
            )
        if server.enabled:
            for model in (
                *(m for _, m in models if m.name == server.model),
                by_staged.get(draft_path or ""),
            ):
                if model is not None:
                    used[model.name] = model
    check_fit(issues, list(used.values()), shm)


def check_fit(issues: Issues, used: list[ModelSpec], shm: ShmSpec) -> None:
    sized = [m for m in used if m.size is not None]
    total = sum(m.size or 0 for m in sized)
    if shm.size is None or total <= shm.size:
        return
    unsized = len(used) - len(sized)
    issues.error(
        "shm.size",
        f"the models of the enabled servers need {total / GIB:.1f} GiB "
        f"({listing(f'{m.name} {(m.size or 0) / GIB:.1f} GiB' for m in sized)}"
        + (f"; {unsized} without a size not counted" if unsized else "")
        + f") but shm.size is {shm.size / GIB:.1f} GiB",
        f"raise shm.size to at least {-(-total // GIB)}G, or disable servers so fewer models "
        "are staged at once",
    )


# --- the whole spec ----------------------------------------------------------------------------


def validate(data: object, source: str = "") -> SiteSpec:
    issues = Issues()
    root = section(issues, data, "", ROOT, required=("gpus",))
    if root is None:
        raise SpecError(issues.items, source)
    gpus = read_gpus(root)
    pve, tuning, shm = read_pve(root), read_tuning(root), read_shm(root)
    models, names = read_models(root)
    drafts = [
        draft
        for i, value in enumerate(entries(root, "servers"))
        if (draft := read_server(issues, value, at("servers", i), gpus)) is not None
    ]
    check_servers(issues, drafts, gpus)
    check_models(issues, drafts, models, names, shm)
    if gpus is None or issues.of("error"):
        raise SpecError(issues.of("error"), source)
    return SiteSpec(
        gpus=gpus,
        pve=pve,
        tuning=tuning,
        shm=shm,
        models=tuple(m for _, m in models),
        servers=tuple(s for d in drafts if (s := d.build()) is not None),
        warnings=tuple(issues.of("warning")),
        source=source,
    )
