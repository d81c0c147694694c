"""The one small interface every engine kind implements (sglang.py, vllm.py, command.py).

An engine says how its server starts (argv[0] and the argv), which GET path answers 200 once it
serves, which config file it reads besides its argv (SGLang's --config YAML), the name clients
ask it for, and what the doctor and the preflight look for on the machine (the Python module and
the distribution that must be installed). Pure functions of the spec: no I/O.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:
    from ct200_tools.spec import ServerSpec, SiteSpec

SYSTEM_PYTHON: Final = "/usr/bin/python3"
_PYTHON_NAME = re.compile(r"^python[0-9.]*$")


class Engine(Protocol):
    @property
    def name(self) -> str:
        """The spec's `engine:` value."""
        ...

    @property
    def ready_path(self) -> str:
        """GET this path answers 200 once the server serves (the spec's `health:` overrides)."""
        ...

    @property
    def module(self) -> str | None:
        """The module the engine's interpreter runs (None: not a Python engine)."""
        ...

    @property
    def config_file(self) -> bool:
        """Whether it reads a config file beside its argv (at engines.config_path)."""
        ...

    @property
    def dist(self) -> str | None:
        """The distribution (pip name) whose metadata pins compressed-tensors (None: unknown)."""
        ...

    def program(self, server: ServerSpec) -> str:
        """ExecStart='s argv[0] as the spec gives it."""
        ...

    def argv(self, site: SiteSpec, server: ServerSpec) -> list[str]:
        """ExecStart='s argv."""
        ...

    def served_name(self, server: ServerSpec) -> str:
        """What /v1/models lists and requests name."""
        ...

    def config(self, site: SiteSpec, server: ServerSpec) -> dict[str, object] | None:
        """The config file's content beside the argv (SGLang's --config YAML), or None."""
        ...

    def python(self, server: ServerSpec) -> str | None:
        """The interpreter whose environment holds the engine (and its compressed-tensors)."""
        ...


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


class PythonEngine:
    """What every Python engine shares: `<python> -m module`, the interpreter whose
    environment holds it, and the served name from args.served-model-name."""

    def program(self, server: ServerSpec) -> str:
        return python_of(server)

    def python(self, server: ServerSpec) -> str | None:
        return python_of(server)

    def served_name(self, server: ServerSpec) -> str:
        return args_served_name(server)


def model_path(site: SiteSpec, server: ServerSpec) -> str:
    model = site.model(server.model)
    if model is None:  # validation refuses it; a caller passing a hand-made spec gets this
        raise ValueError(f"server {server.name}: model {server.model!r} is not in the spec")
    return model.staged
