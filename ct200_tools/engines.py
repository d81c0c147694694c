"""What a server runs, derived from its spec: the contract the server units and the doctor share.

- Unit: each server NAME runs as `ct200-server-NAME.service`.
- Interpreter (engines sglang and vllm): `$VIRTUAL_ENV/bin/python` when the server's `env` sets
  VIRTUAL_ENV (the engine's venv: `env: {VIRTUAL_ENV: /opt/sglang}`), else /usr/bin/python3.
  The unit runs `<interpreter> -m sglang.launch_server` / `-m vllm.entrypoints.openai.api_server`.
- Program (engine command): `command[0]`; a bare name is looked up on the server's `env` PATH,
  else on systemd's default PATH (what ExecStart searches).
- Served name (what `/v1/models` lists and requests name): `args.served-model-name` when set;
  for engine command the value of `--served-model-name`, `--alias` or `-a` in its command
  (llama.cpp's llama-server calls it --alias); otherwise the spec's model name. Two servers of one
  model then answer to the same name, as a client of either expects.

Pure functions of the spec: no I/O here (the probes look at the machine).
"""

from __future__ import annotations

import os
import re
from typing import Final

from ct200_tools.spec import ServerSpec

UNIT_PREFIX: Final = "ct200-server-"
#: The interpreter when the server's env names no venv.
SYSTEM_PYTHON: Final = "/usr/bin/python3"
#: systemd's search path for ExecStart= commands that are not absolute paths (systemd.exec(5)).
SYSTEMD_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: The module each Python engine runs, and the top-level package the doctor looks for (finding
#: it imports nothing: importing sglang takes seconds).
ENGINE_MODULES: Final = {
    "sglang": "sglang.launch_server",
    "vllm": "vllm.entrypoints.openai.api_server",
}
#: The distribution (pip name) of each engine, whose metadata pins compressed-tensors.
ENGINE_DISTS: Final = {"sglang": "sglang", "vllm": "vllm"}
#: Flags that name the served model in a command's argv.
SERVED_NAME_FLAGS: Final = ("--served-model-name", "--alias", "-a")
_PYTHON_NAME = re.compile(r"^python[0-9.]*$")


def unit_name(server: str) -> str:
    return f"{UNIT_PREFIX}{server}.service"


def server_of_unit(unit: str) -> str | None:
    """The server a unit name belongs to, or None for any other unit."""
    if unit.startswith(UNIT_PREFIX) and unit.endswith(".service"):
        return unit.removeprefix(UNIT_PREFIX).removesuffix(".service") or None
    return None


def served_name(server: ServerSpec) -> str:
    if server.engine == "command":
        argv = list(server.command)
        for i, arg in enumerate(argv):
            for flag in SERVED_NAME_FLAGS:
                if arg == flag and i + 1 < len(argv):
                    return argv[i + 1]
                if arg.startswith(flag + "=") and flag.startswith("--"):
                    return arg.split("=", 1)[1]
        return server.model
    name = server.args.get("served-model-name")
    return str(name) if isinstance(name, str | int | float) and str(name) else server.model


def program(server: ServerSpec) -> str:
    """argv[0] as the spec gives it: the interpreter, or the command's program."""
    if server.engine == "command":
        return server.command[0] if server.command else ""
    venv = server.env.get("VIRTUAL_ENV")
    return f"{venv.rstrip('/')}/bin/python" if venv else SYSTEM_PYTHON


def search_path(server: ServerSpec) -> str:
    """Where a bare program name is looked up: the server's env PATH, else systemd's."""
    return server.env.get("PATH") or SYSTEMD_PATH


def engine_python(server: ServerSpec) -> str | None:
    """The interpreter whose environment holds the engine (and its compressed-tensors): the
    Python engines' interpreter, or a command whose program is a Python; else None."""
    if server.engine != "command":
        return program(server)
    argv0 = program(server)
    return argv0 if _PYTHON_NAME.match(os.path.basename(argv0)) else None


def engine_module(server: ServerSpec) -> str | None:
    """The top-level package a Python engine's interpreter must find."""
    module = ENGINE_MODULES.get(server.engine)
    return module.split(".")[0] if module else None


def engine_dist(server: ServerSpec) -> str | None:
    return ENGINE_DISTS.get(server.engine)


def connect_host(host: str) -> str:
    """Where to reach a server bound to `host`: the wildcard addresses mean this machine."""
    if host in ("0.0.0.0", ""):  # noqa: S104 - a bind address read from the spec, not bound here
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def base_url(server: ServerSpec) -> str:
    host = connect_host(server.host)
    return f"http://[{host}]:{server.port}" if ":" in host else f"http://{host}:{server.port}"
