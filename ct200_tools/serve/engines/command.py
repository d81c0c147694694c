"""Any OpenAI-compatible server by argv (the testbed runs llama.cpp's llama-server so).

The spec's argv as given; a bare command[0] is looked up on systemd's fixed search path, never
on the unit's PATH (engines.resolve_program). Ready: the spec's `health:`, else /health
(llama.cpp's is 503 while loading). Served name: the value of `--served-model-name`, `--alias`
or `-a` in the command (llama-server calls it --alias), else the spec's model name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ct200_tools.serve.engines.base import is_python

if TYPE_CHECKING:
    from ct200_tools.spec import ServerSpec, SiteSpec

#: Flags that name the served model in a command's argv.
SERVED_NAME_FLAGS: Final = ("--served-model-name", "--alias", "-a")


class Command:
    name: Final = "command"
    ready_path: Final = "/health"
    module: Final = None
    dist: Final = None
    config_file: Final = False

    def program(self, server: ServerSpec) -> str:
        return server.command[0] if server.command else ""

    def python(self, server: ServerSpec) -> str | None:
        """The command's program when it is a Python (its environment holds the engine)."""
        argv0 = self.program(server)
        return argv0 if is_python(argv0) else None

    def argv(self, site: SiteSpec, server: ServerSpec) -> list[str]:
        return list(server.command)

    def served_name(self, server: ServerSpec) -> str:
        argv = list(server.command)
        for i, arg in enumerate(argv):
            for flag in SERVED_NAME_FLAGS:
                if arg == flag and i + 1 < len(argv):
                    return argv[i + 1]
                if arg.startswith(flag + "=") and flag.startswith("--"):
                    return arg.split("=", 1)[1]
        return server.model

    def config(self, site: SiteSpec, server: ServerSpec) -> dict[str, object] | None:
        return None


ENGINE: Final = Command()
