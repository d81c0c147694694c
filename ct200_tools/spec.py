"""The site spec: one YAML description of what a site wants, loaded and validated here.

Ansible renders machines from it, the playbooks copy it to /etc/ct200/site.yml, and the doctor
judges the machine against it. Validation runs before anything changes and reports every problem
with its field path and the fix, not only the first.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from fractions import Fraction
from typing import Literal

Passthrough = Literal["devn", "raw-lxc"]
Engine = Literal["sglang", "vllm", "command"]
Severity = Literal["error", "warning"]

#: Where the playbooks install the spec on every target; the doctor's default.
DEFAULT_SPEC_PATH = "/etc/ct200/site.yml"
#: The top-level key in YAML files and Ansible group_vars.
SPEC_KEY = "ct200_site"


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


@dataclass(frozen=True)
class TuningSpec:
    numa_balancing: int | None = 0
    #: Bytes (128..4096, a power of two); None: not managed.
    pcie_max_read_request: int | None = None


@dataclass(frozen=True)
class ShmSpec:
    #: Size of /dev/shm in bytes; None: whatever the system gives.
    size: int | None = None
    #: RAM in bytes that staging must leave free for everything else.
    reserve_ram: int = 0


@dataclass(frozen=True)
class ModelSpec:
    name: str
    #: The persistent copy on local disk; never modified.
    source: str
    #: Where the model is served from (normally under /dev/shm).
    staged: str
    #: Declared size in bytes, if known before the source can be read.
    size: int | None = None


@dataclass(frozen=True)
class SpeculativeSpec:
    algorithm: str
    draft_model: str | None = None
    budget: int | None = None
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None


@dataclass(frozen=True)
class ServerSpec:
    name: str
    engine: Engine
    model: str
    gpus: tuple[int, ...]
    port: int
    tp: int
    enabled: bool = True
    host: str = "127.0.0.1"
    speculative: SpeculativeSpec | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    #: Extra engine arguments, passed through as --key value.
    args: Mapping[str, object] = field(default_factory=dict)
    #: engine "command" only: the argv to run.
    command: tuple[str, ...] = ()


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


# Binary like tmpfs's size= option, so a size here means the same as in the mount that uses it.
_SIZE_RE = re.compile(r"([0-9]{1,30}(?:\.[0-9]{1,30})?)\s*([kmgtpe]?)(i?b?)", re.IGNORECASE)
_SHIFTS = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40, "p": 50, "e": 60}


def parse_size(value: str | int) -> int:
    """Bytes from a size as tmpfs takes it: 1200G, 512M, 1.5T, 64GiB, 4096 or an int of bytes.

    K/M/G/T/P/E are powers of 1024; "GB" is refused as ambiguous. Fractions round up to a byte.
    Raises ValueError, with the accepted forms, on anything else.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"a size is a string like 1200G or an integer, not {type(value).__name__}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return value
    match = _SIZE_RE.fullmatch(value.strip())
    unit, suffix = (match.group(2).lower(), match.group(3).lower()) if match else ("", "")
    if match is None or (suffix in ("i", "ib") and not unit) or (suffix == "b" and unit):
        shown = value if len(value) <= 40 else value[:37] + "..."
        reason = (
            f"{unit.upper()}B is ambiguous (powers of 1000 or 1024?)" if match else "not a size"
        )
        raise ValueError(
            f"{shown!r}: {reason}; write e.g. 1200G, 1200GiB, 512M, 1.5T or 4096 (bytes); "
            "K/M/G/T are binary, as for tmpfs"
        )
    return math.ceil(Fraction(match.group(1)) * (1 << _SHIFTS[unit]))


def _plain(value: object) -> object:
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def spec_to_dict(spec: SiteSpec) -> dict[str, object]:
    """The canonical plain form, to write under ct200_site (e.g. in /etc/ct200/site.yml).

    Every field is written, defaults and nulls included, so a reader never needs our defaults;
    validate(spec_to_dict(s)) equals s apart from source.
    """
    skip = ("warnings", "source")
    return {f.name: _plain(getattr(spec, f.name)) for f in fields(spec) if f.name not in skip}


def validate(data: object, source: str = "") -> SiteSpec:
    """A SiteSpec from the mapping under ct200_site; warnings go into SiteSpec.warnings.

    Raises SpecError with every error found, each with its path (e.g. servers[1].gpus[2]) and
    fix; SpecError.issues holds errors only, so warnings show once the errors are fixed.
    """
    from ct200_tools import specload  # noqa: PLC0415 - specload imports this module

    return specload.validate(data, source)


def load_spec(path: str | os.PathLike[str]) -> SiteSpec:
    """The spec from a YAML file with a top-level ct200_site, or from an inventory directory.

    In a directory exactly one group_vars/**/*.yml|yaml file must define ct200_site. Raises
    SpecError for unreadable files, YAML errors (with line and column), Jinja in values, and
    everything validate() finds.
    """
    from ct200_tools import specfile  # noqa: PLC0415 - specfile imports this module

    return specfile.load_spec(path)
