"""What every engine kind declares, and what the Python engines share.

An engine module (sglang.py, vllm.py, command.py, ...) holds one `ENGINE`, an instance of a
subclass of Engine: what the spec's `engine:` calls it, what a server of that kind accepts
(command:, args:, speculative: and its keys, a CPU-only server, the args it reserves), how it
starts (argv), when it serves (readiness path), how it is installed, what the doctor and the
preflight look for, and how a missing install is fixed. The registry (ct200_tools.engines)
finds the modules; the spec grammar, the preflight, the doctor, the unit renderer and the
benchmark ask the ENGINE and never test a name.

No runtime import of the spec here: the spec reads this package while it validates.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal, Protocol

if TYPE_CHECKING:
    from ct200_tools.spec import ServerSpec, SiteSpec, SpeculativeSpec

SYSTEM_PYTHON: Final = "/usr/bin/python3"
_PYTHON_NAME = re.compile(r"^python[0-9.]*$")

#: Server args every engine renders from the server's own fields; a second copy would fight it.
COMMON_RESERVED: Final = frozenset({"model", "host", "port", "config"})

# Run as `python -I -c ENGINE_CHILD MODULE DIST`: stdlib only, one JSON line; exit status 1 when
# MODULE is not found. The doctor's engine probe runs it isolated; the preflight
# (ct200_tools/serve/preflight.py) runs the same script as the service user and needs only the
# status. Finding the module imports nothing of it (importing SGLang takes seconds).
ENGINE_CHILD: Final = r"""
import importlib.metadata as md, importlib.util, json, re, sys
module, dist = sys.argv[1], sys.argv[2]
out = {}
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
if module:
    try:
        out["module_found"] = importlib.util.find_spec(module) is not None
    except Exception:
        out["module_found"] = False
out["compressed_tensors"] = version("compressed-tensors")
if dist:
    out["dist_version"] = version(dist)
    try:
        reqs = md.requires(dist) or []
    except md.PackageNotFoundError:
        reqs = []
    ct = [r for r in reqs if re.match(r"compressed[-_.]tensors(?![-_.\w])", r, re.I)]
    out["ct_requirement"] = ct[0] if ct else None
print(json.dumps(out))
sys.exit(1 if out.get("module_found") is False else 0)
"""


@dataclass(frozen=True)
class Field:
    """One key of an engine's speculative: block besides algorithm and draft_model."""

    example: str
    type: Literal["int", "bool"] = "int"
    lo: int = 1
    hi: int = 1024


@dataclass(frozen=True)
class Speculative:
    """What an engine's speculative: block takes. The spec reads algorithm (one of
    `algorithms`), draft_model (an absolute path; required unless the algorithm is in
    no_draft_model) and each of `fields`; the engine's check() judges them together."""

    algorithms: tuple[str, ...]
    #: Written in any case, kept upper-case (SGLang's names); else exactly as listed.
    upper: bool = False
    no_draft_model: tuple[str, ...] = ()
    #: Algorithms for which a draft_model given is ignored (a warning).
    draft_model_ignored: tuple[str, ...] = ()
    fields: Mapping[str, Field] = field(default_factory=dict)
    #: An example of the block, for messages.
    example: str = ""


class Report(Protocol):
    """Where an engine's check records what is wrong (ct200_tools.spec.read.Issues)."""

    def error(self, path: str, message: str, fix: str) -> None: ...

    def warn(self, path: str, message: str, fix: str) -> None: ...


class Draft(Protocol):
    """A server as the spec read it so far (ct200_tools.spec.servers.Draft): every field may
    be missing where it was wrong, already reported."""

    @property
    def path(self) -> str: ...
    @property
    def port(self) -> int | None: ...
    @property
    def gpus(self) -> tuple[int, ...] | None: ...
    @property
    def args(self) -> dict[str, object]: ...
    @property
    def command(self) -> tuple[str, ...]: ...
    @property
    def speculative(self) -> SpeculativeSpec | None: ...


class Engine:
    """An engine kind. Subclasses set the class attributes and implement argv()."""

    #: The spec's `engine:` value.
    name: str = ""
    #: One line: what it is.
    summary: str = ""
    #: GET this answers 200 once the server serves (the spec's `health:` overrides).
    ready_path: str = "/health"
    #: The module its interpreter runs (None: not a Python engine).
    module: str | None = None
    #: The distribution (pip name) whose metadata pins compressed-tensors (None: unknown).
    dist: str | None = None
    #: Whether it reads a config file beside its argv (at paths.config_path).
    config_file: bool = False
    #: What command: is to it: "argv" the whole argv (required), "program" its program alone
    #: (optional: [/path/to/binary]; else the engine's default), "none" refused.
    takes_command: Literal["argv", "program", "none"] = "none"
    #: args: are passed to it (as --key value), else refused.
    takes_args: bool = True
    #: A server may have no GPU (gpus: []), running on the CPU.
    cpu_ok: bool = False
    #: args: keys it renders from the server's own fields (compared lower-case, - for _).
    reserved_args: frozenset[str] = COMMON_RESERVED
    #: What its speculative: block takes; None: it has none.
    speculative: Speculative | None = None
    #: How it is installed, for docs and fixes.
    install: str = ""

    def program(self, server: ServerSpec) -> str:
        """ExecStart='s argv[0] as the spec gives it."""
        raise NotImplementedError

    def argv(self, site: SiteSpec, server: ServerSpec) -> list[str]:
        """ExecStart='s argv."""
        raise NotImplementedError

    def python(self, server: ServerSpec) -> str | None:
        """The interpreter whose environment holds the engine (and its compressed-tensors)."""
        return None

    def served_name(self, server: ServerSpec) -> str:
        """What /v1/models lists and requests name."""
        return server.model

    def config(self, site: SiteSpec, server: ServerSpec) -> dict[str, object] | None:
        """The config file's content beside the argv (SGLang's --config YAML), or None."""
        return None

    def served_name_fix(self, server: ServerSpec, want: str) -> str:
        """How to make it serve under `want` (the doctor's server.models fix)."""
        return (
            f"the unit serves it under the spec's model name ({server.model}): restart it from "
            "its unit"
        )

    def check(self, draft: Draft, report: Report) -> None:
        """What this engine cannot do with the server's fields together (after each field
        was read): field paths and fixes, as the spec reports them."""

    def missing_fix(self, server: ServerSpec, where: str, path: str) -> tuple[str, str | None]:
        """How to fix a program that is not there: (what to do, a command or None). `where` is
        the server's path in the spec (servers[N])."""
        return (
            f"install the server's program at {path} ({self.install}), or correct "
            f"{where}.command[0]",
            None,
        )


def python_of(server: ServerSpec) -> str:
    """`$VIRTUAL_ENV/bin/python` when the server's env sets VIRTUAL_ENV, else the system's."""
    venv = server.env.get("VIRTUAL_ENV")
    return f"{venv.rstrip('/')}/bin/python" if venv else SYSTEM_PYTHON


def is_python(program: str) -> bool:
    return bool(_PYTHON_NAME.match(os.path.basename(program)))


def args_served_name(server: ServerSpec) -> str:
    """A Python engine's served name: args.served-model-name (or _) when set, else the model."""
    name = server.args.get("served-model-name", server.args.get("served_model_name"))
    return str(name) if isinstance(name, str | int | float) and str(name) else server.model


def arg_words(key: str, value: object) -> list[str]:
    """One free-form argument as argv words: true is a bare flag, false --no-KEY."""
    if value is True:
        return [f"--{key}"]
    if value is False:
        return [f"--no-{key}"]
    if isinstance(value, tuple | list):
        return [f"--{key}", *(str(v) for v in value)]
    return [f"--{key}", str(value)]


class PythonEngine(Engine):
    """What every Python engine shares: `<python> -m module`, the interpreter whose
    environment holds it, and the served name from args.served-model-name."""

    def program(self, server: ServerSpec) -> str:
        return python_of(server)

    def python(self, server: ServerSpec) -> str | None:
        return python_of(server)

    def served_name(self, server: ServerSpec) -> str:
        return args_served_name(server)

    def served_name_fix(self, server: ServerSpec, want: str) -> str:
        return (
            "the unit passes --served-model-name from the spec (args.served-model-name, else "
            "the model name)"
        )

    def missing_fix(self, server: ServerSpec, where: str, path: str) -> tuple[str, str | None]:
        venv = server.env.get("VIRTUAL_ENV")
        dist = self.dist or self.name
        if venv:
            return (
                f"create the engine's venv at {venv} with {dist} in it, or set "
                f"{where}.env.VIRTUAL_ENV to the venv that has it",
                f"python3 -m venv {venv} && {path} -m pip install {dist}",
            )
        return (
            f"set {where}.env.VIRTUAL_ENV to the venv that has {dist} (the unit runs "
            f"$VIRTUAL_ENV/bin/python), or install Python 3 at {path}",
            None,
        )


def model_path(site: SiteSpec, server: ServerSpec) -> str:
    model = site.model(server.model)
    if model is None:  # validation refuses it; a caller passing a hand-made spec gets this
        raise ValueError(f"server {server.name}: model {server.model!r} is not in the spec")
    return model.staged


def draft_model_path(site: SiteSpec, server: ServerSpec) -> str | None:
    """The drafter's path as the spec gives it (a declared model's staged copy, normally)."""
    spec = server.speculative
    return None if spec is None else spec.draft_model
