"""The site spec as typed, frozen values: what a site wants, once validated.

Ansible renders machines from the spec, the playbooks copy it to /etc/ct200/site.yml, and the
doctor judges the machine against it. This module holds only the values and their plain form;
the rules that build them are in ct200_tools.spec.schema, reading files in ct200_tools.spec.files.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Final, Literal

from ct200_tools.spec.sizes import format_size
from ct200_tools.tunings import BY_KEY, TUNINGS, Value

Passthrough = Literal["devn", "raw-lxc"]
#: An engine kind's name: one of ct200_tools.engines.ENGINES, which validation checks. Not a
#: Literal: the kinds are the modules found there at run time, which a type checker cannot
#: see, and a Literal written here would be a second list to keep (issue 30).
Engine = str
Severity = Literal["error", "warning"]

#: Where the playbooks install the spec on every target; the doctor's default.
DEFAULT_SPEC_PATH: Final = "/etc/ct200/site.yml"
#: The top-level key in YAML files and Ansible group_vars.
SPEC_KEY: Final = "ct200_site"
#: The NVIDIA nodes every container with GPUs needs besides one /dev/nvidiaN per GPU.
NVIDIA_CORE_NODES: Final = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
#: Marks a field that holds bytes: its plain form is written with a unit (1200G), as a spec must.
SIZE: Final = {"size": True}


@dataclass(frozen=True)
class SpecIssue:
    """One problem in a spec: where (dotted path), what, and how to fix it."""

    path: str
    message: str
    fix: str
    severity: Severity = "error"

    def __str__(self) -> str:
        return f"{self.path}: {self.message} (fix: {self.fix})"


class SpecError(Exception):
    """A spec that cannot be used; carries every issue found."""

    def __init__(self, issues: list[SpecIssue], source: str = "") -> None:
        self.issues = issues
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{len(issues)} problem(s) in the site spec")


@dataclass(frozen=True)
class PveSpec:
    vmid: int
    passthrough: Passthrough = "devn"


@dataclass(frozen=True)
class PcieSpec:
    gen: int
    width: int


@dataclass(frozen=True)
class GpuSpec:
    count: int
    model: str
    pcie: PcieSpec | None = None
    #: GPU indices per NUMA node, e.g. ((0, 1, 2, 3), (4, 5, 6, 7)); empty when not declared.
    numa: tuple[tuple[int, ...], ...] = ()

    def numa_node_of(self, index: int) -> int | None:
        for node, members in enumerate(self.numa):
            if index in members:
                return node
        return None

    @property
    def device_nodes(self) -> tuple[str, ...]:
        """The host's nodes the container is given: one per GPU, then the control and UVM nodes
        (host_devices checks them at boot, lxc_passthrough passes them: ct200_validated)."""
        return (*(f"/dev/nvidia{i}" for i in range(self.count)), *NVIDIA_CORE_NODES)


@dataclass(frozen=True)
class TuningSpec:
    """Each host tuning of ct200_tools.tunings.TUNINGS with its value (None: not managed), in
    the table's order; read as attributes (spec.tuning.numa_balancing). The table is the one
    list: a tuning added there is a field here."""

    values: tuple[tuple[str, Value | None], ...] = tuple((t.key, t.default) for t in TUNINGS)

    def __getattr__(self, key: str) -> Value | None:
        if key in BY_KEY:
            return self.value(key)
        raise AttributeError(f"TuningSpec has no {key!r} (not a tuning of ct200_tools.tunings)")

    def value(self, key: str) -> Value | None:
        """The spec's value of tuning.<key>; the table's default when this spec has none."""
        values = dict(self.values)
        return values[key] if key in values else BY_KEY[key].default

    def plain(self) -> dict[str, Value | None]:
        return {t.key: self.value(t.key) for t in TUNINGS}


@dataclass(frozen=True)
class ShmSpec:
    #: Size of /dev/shm in bytes; None: whatever the system gives.
    size: int | None = field(default=None, metadata=SIZE)
    #: RAM in bytes that staging must leave free for everything else.
    reserve_ram: int = field(default=0, metadata=SIZE)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    #: The persistent copy on local disk; never modified.
    source: str
    #: Where the model is served from (normally under /dev/shm).
    staged: str
    #: Declared size in bytes, if known before the source can be read.
    size: int | None = field(default=None, metadata=SIZE)


@dataclass(frozen=True)
class SpeculativeSpec:
    algorithm: str
    draft_model: str | None = None
    budget: int | None = None
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None
    #: The engine's own keys beyond these (its module's Speculative.fields), written inline.
    options: Mapping[str, object] = field(default_factory=dict, metadata={"inline": True})


@dataclass(frozen=True)
class ServerSpec:
    name: str
    engine: Engine
    model: str
    #: GPU indices (NVML/nvidia-smi order); empty only for an engine that runs on the CPU.
    gpus: tuple[int, ...]
    port: int
    #: Tensor-parallel size: len(gpus) (0 for a CPU server).
    tp: int
    enabled: bool = True
    host: str = "127.0.0.1"
    speculative: SpeculativeSpec | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    #: Extra engine arguments, passed through as --key value.
    args: Mapping[str, object] = field(default_factory=dict)
    #: The argv to run, for an engine that takes one (command).
    command: tuple[str, ...] = ()
    #: Seconds from `systemctl start` to serving before systemd gives up (TimeoutStartSec);
    #: None: from the model's size (ct200_tools.serve.engines.start_timeout).
    start_timeout: int | None = None
    #: The HTTP path that answers 200 once the server serves; None: the engine's own
    #: (its module's ready_path).
    health: str | None = None


@dataclass(frozen=True)
class SiteSpec:
    gpus: GpuSpec
    pve: PveSpec | None = None
    tuning: TuningSpec = field(default_factory=TuningSpec)
    shm: ShmSpec = field(default_factory=ShmSpec)
    models: tuple[ModelSpec, ...] = ()
    servers: tuple[ServerSpec, ...] = ()
    #: Non-fatal findings from validation (e.g. a TP group spanning NUMA nodes).
    warnings: tuple[SpecIssue, ...] = ()
    #: Where it was loaded from, for messages.
    source: str = ""

    @property
    def enabled_servers(self) -> tuple[ServerSpec, ...]:
        return tuple(s for s in self.servers if s.enabled)

    def model(self, name: str) -> ModelSpec | None:
        return next((m for m in self.models if m.name == name), None)

    def server(self, name: str) -> ServerSpec | None:
        return next((s for s in self.servers if s.name == name), None)

    def needed_models(self, servers: Iterable[ServerSpec] | None = None) -> tuple[ModelSpec, ...]:
        """The models the given servers (default: the enabled ones) need, in spec order: each
        one's model, and the declared models whose staged path a server names as its
        speculative.draft_model.

        The one definition of "needed": staging stages these (Ansible reads them from the
        validate play), validation checks that they fit in shm.size, the doctor checks them, and
        a switch of the serving set (ct200_tools.serve.serving) passes the servers it serves.
        A disabled server's model (595 GB for Kimi) must not take RAM at every boot.
        """
        chosen = self.enabled_servers if servers is None else tuple(servers)
        names = {s.model for s in chosen}
        drafts = {s.speculative.draft_model for s in chosen if s.speculative}
        return tuple(m for m in self.models if m.name in names or m.staged in drafts)


def _plain(value: object) -> object:
    if isinstance(value, TuningSpec):
        return value.plain()
    if is_dataclass(value) and not isinstance(value, type):
        out: dict[str, object] = {}
        for f in fields(value):
            item = _field(f.metadata, getattr(value, f.name))
            if f.metadata.get("inline") and isinstance(item, dict):
                out.update(item)  # an engine's own keys sit beside the shared ones
            else:
                out[f.name] = item
        return out
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _field(metadata: Mapping[str, object], value: object) -> object:
    if metadata.get("size") and isinstance(value, int):
        return format_size(value)
    return _plain(value)


def model_to_dict(model: ModelSpec) -> dict[str, object]:
    """One model's plain form, as under ct200_site.models (sizes with their unit)."""
    return {f.name: _field(f.metadata, getattr(model, f.name)) for f in fields(model)}


def spec_to_dict(spec: SiteSpec) -> dict[str, object]:
    """The canonical plain form, to write under ct200_site (e.g. in /etc/ct200/site.yml).

    Every field is written, defaults and nulls included, so a reader never needs our defaults;
    sizes carry their unit (1200G). validate(spec_to_dict(s)) equals s apart from source.
    """
    skip = ("warnings", "source")
    return {f.name: _plain(getattr(spec, f.name)) for f in fields(spec) if f.name not in skip}
