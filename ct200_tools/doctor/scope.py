"""A run about one server: what `ct200-doctor gate NAME` and `check --server NAME` look at.

Shared by the probes (cuInit with CUDA_VISIBLE_DEVICES set to the server's GPUs; only that
server's unit, port and engine read) and the checks (dev.* on its GPUs' nodes, models.staged on
its model and draft, server.* on it alone; checks about GPUs dropped for a server with none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ct200_tools.spec import SiteSpec

#: What a check judges, so a run scoped to one server (Scope) can tell whether it applies:
#: a check about GPUs does not apply to a server that has none.
About = Literal["gpus", "models", "servers"]


class UnknownServerError(ValueError):
    """A server name the spec does not have."""


@dataclass(frozen=True)
class Scope:
    """A run about one server (`ct200-doctor gate NAME`, `check --server NAME`): its GPUs,
    the models it loads (its model and draft) and its port. Checks that judge GPUs, models or
    servers consult it and judge only these; the probes read only these where it matters (cuInit
    runs with CUDA_VISIBLE_DEVICES set to the server's GPUs)."""

    server: str
    gpus: tuple[int, ...]
    models: tuple[str, ...]
    port: int
    #: Whether the run looks at the server serving (its unit, HTTP, its processes' GPUs); a
    #: gate looks only at what decides whether it can start, and skips those.
    serving: bool = True

    @classmethod
    def of(cls, spec: SiteSpec, name: str, serving: bool = True) -> Scope:
        """UnknownServerError, naming the servers there are, when the spec has no `name`."""
        server = next((s for s in spec.servers if s.name == name), None)
        if server is None:
            names = ", ".join(s.name for s in spec.servers) or "none"
            raise UnknownServerError(f"no server {name!r} in the spec (its servers: {names})")
        models = tuple(m.name for m in spec.needed_models([server]))
        return cls(server.name, server.gpus, models, server.port, serving)

    def applies(self, about: tuple[About, ...]) -> bool:
        """A check about GPUs applies only to a server with GPUs; every other check does."""
        return "gpus" not in about or bool(self.gpus)

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(g) for g in self.gpus)
