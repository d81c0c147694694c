"""Any OpenAI-compatible server by argv: `command: [program, args...]`.

The spec's argv as given; a bare command[0] is looked up on systemd's fixed search path, never
on the unit's PATH (serve.engines.resolve_program). Ready: the spec's `health:`, else /health.
Served name: the value of `--served-model-name`, `--alias` or `-a` in the command, else the
spec's model name. It may run on the CPU (gpus: []). args: and speculative: are not used: the
flags go in the command.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ct200_tools.engines.base import Draft, Engine, Report, is_python

if TYPE_CHECKING:
    from ct200_tools.spec import ServerSpec, SiteSpec

#: Flags that name the served model in a command's argv.
SERVED_NAME_FLAGS: Final = ("--served-model-name", "--alias", "-a")


class Command(Engine):
    name = "command"
    summary = "any OpenAI-compatible server, by the argv in command:"
    ready_path = "/health"
    takes_command = "argv"
    takes_args = False
    cpu_ok = True
    install = "whatever provides the command's program"

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

    def served_name_fix(self, server: ServerSpec, want: str) -> str:
        return f"put --alias {want} (llama.cpp) or --served-model-name {want} in command"

    def missing_fix(self, server: ServerSpec, where: str, path: str) -> tuple[str, str | None]:
        return f"install {path}, or fix command[0] of server {server.name} in the spec", None

    def check(self, draft: Draft, report: Report) -> None:
        if not draft.command or draft.port is None:
            return
        port = str(draft.port)
        if not any(port == a or a.endswith(("=" + port, ":" + port)) for a in draft.command):
            # An error, not a warning: readiness would wait the whole start timeout on a port
            # nothing listens on, and the play would blame the timeout (issue 33).
            report.error(
                f"{draft.path}.command",
                f"no argument of the command is the port {port}: readiness and the doctor "
                f"would look for the server on port {port}, where it does not listen",
                f"pass the port in the command, e.g. --port {port}, or set port: to the one "
                "it listens on",
            )


ENGINE: Final = Command()
