"""What a server runs, derived from the site spec alone: the one contract the server units
(render.py, templates/), `ct200-serve` and the doctor (probes and checks) share. Pure functions
of the spec: no I/O here (the probes and the preflight look at the machine).

- Unit: each server NAME runs as `ct200-server-NAME.service`.
- sglang: `<python> -m sglang.launch_server --config /etc/ct200/servers/NAME.yaml`; every
  argument goes through the YAML file, so no value needs shell or systemd quoting.
- vllm: `<python> -m vllm.entrypoints.openai.api_server --model ... --speculative-config JSON`.
- command: the spec's argv as given; a bare command[0] is looked up on systemd's fixed search
  path (SYSTEMD_PATH), never on the unit's PATH: that is where ExecStart= looks.
- <python> is `$VIRTUAL_ENV/bin/python` when the server's env sets VIRTUAL_ENV (the engine's
  own venv: `env: {VIRTUAL_ENV: /opt/sglang}`), else /usr/bin/python3.
- Served name (what `/v1/models` lists and requests name): `args.served-model-name` (or
  served_model_name) when set; for engine command the value of `--served-model-name`, `--alias`
  or `-a` in its command (llama.cpp's llama-server calls it --alias); otherwise the spec's model
  name. Two servers of one model then answer to the same name, as a client of either expects.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from typing import Final

from ct200_tools.spec import ModelSpec, ServerSpec, SiteSpec
from ct200_tools.spec.servers import VLLM_METHODS

__all__ = ["VLLM_METHODS"]  # what vLLM calls each algorithm: the spec validates against it

UNIT_PREFIX: Final = "ct200-server-"
STAGE_UNIT_PREFIX: Final = "ct200-stage@"
CONFIG_DIR: Final = "/etc/ct200/servers"
CACHE_ROOT: Final = "/var/cache/ct200/servers"
#: The service user the role creates; every engine runs as it (none needs root).
SERVICE_USER: Final = "ct200"
SYSTEM_PYTHON: Final = "/usr/bin/python3"
#: Where the tools role installs ct200-tools' commands (its venv's bin).
DEFAULT_TOOLS_BIN: Final = "/opt/ct200/venv/bin"
#: systemd's search path for an ExecStart= program given without a path (systemd.service(5)):
#: fixed at build time, not the unit's PATH. Debian 12's systemd 252 (PVE 8's) searches /sbin
#: and /bin too (`systemd-path search-binaries-default`); on a merged-/usr system they are
#: /usr/sbin and /usr/bin again, so this order finds what systemd finds on both.
SYSTEMD_PATH: Final = (
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
)
#: The same, as a PATH value for messages.
SYSTEMD_PATH_TEXT: Final = ":".join(SYSTEMD_PATH)
#: The module each Python engine runs, and so the top-level package the doctor and the preflight
#: look for (finding it imports nothing: importing sglang takes seconds).
ENGINE_MODULES: Final = {
    "sglang": "sglang.launch_server",
    "vllm": "vllm.entrypoints.openai.api_server",
}
#: The distribution (pip name) of each engine, whose metadata pins compressed-tensors.
ENGINE_DISTS: Final = {"sglang": "sglang", "vllm": "vllm"}
#: Flags that name the served model in a command's argv.
SERVED_NAME_FLAGS: Final = ("--served-model-name", "--alias", "-a")
_PYTHON_NAME = re.compile(r"^python[0-9.]*$")
#: GET PATH answers 200 once the server serves: SGLang's runs a 1-token generation; vLLM's
#: /health only reads an error flag, so /v1/models; llama.cpp's /health is 503 while loading.
READY_PATHS: Final = {"sglang": "/health_generate", "vllm": "/v1/models", "command": "/health"}

# Lifecycle. A failed start is retried RESTART_SEC later, at most START_LIMIT_BURST starts in
# the interval that many starts can take; then the unit stays failed (a bad flag must not reload
# 595 GB in a loop).
RESTART_SEC: Final = 10
START_LIMIT_BURST: Final = 3
STOP_TIMEOUT: Final = 120
#: Default start timeout, a pessimistic allowance rather than a measurement: a fixed start (the
#: engine's imports, CUDA graph capture) and 3 s per GiB of weights (tmpfs reads at GB/s; the
#: weights' processing on the way to the GPUs is the slow part). start_timeout overrides it.
START_BASE_S: Final = 300
START_S_PER_GIB: Final = 3
START_FLOOR_S: Final = 600
#: Without any declared model size.
START_UNKNOWN_S: Final = 1800

_SAFE_ARG = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")
_EXEC_PREFIXES = "@-:+!|"


def unit_name(name: str) -> str:
    return f"{UNIT_PREFIX}{name}.service"


def server_of_unit(unit: str) -> str | None:
    """The server a unit name belongs to, or None for any other unit."""
    if unit.startswith(UNIT_PREFIX) and unit.endswith(".service"):
        return unit.removeprefix(UNIT_PREFIX).removesuffix(".service") or None
    return None


def stage_unit(model: str) -> str:
    return f"{STAGE_UNIT_PREFIX}{model}.service"


def env_path(name: str) -> str:
    return f"{CONFIG_DIR}/{name}.env"


def config_path(name: str) -> str:
    """SGLang's --config file of the server (other engines have none)."""
    return f"{CONFIG_DIR}/{name}.yaml"


def cache_dir(name: str) -> str:
    return f"{CACHE_ROOT}/{name}"


def python_of(server: ServerSpec) -> str:
    venv = server.env.get("VIRTUAL_ENV")
    return f"{venv.rstrip('/')}/bin/python" if venv else SYSTEM_PYTHON


def program(server: ServerSpec) -> str:
    """argv[0]: the engine's interpreter, or the command's program as the spec gives it."""
    if server.engine == "command":
        return server.command[0] if server.command else ""
    return python_of(server)


def resolve_program(program: str, is_executable: Callable[[str], bool]) -> str | None:
    """Where ExecStart= finds `program`: itself when it has a slash, else the first directory of
    SYSTEMD_PATH where `is_executable` holds (the caller looks: a probe's Reader, or os)."""
    if "/" in program:
        return program
    for directory in SYSTEMD_PATH:
        candidate = f"{directory}/{program}"
        if is_executable(candidate):
            return candidate
    return None


def engine_python(server: ServerSpec) -> str | None:
    """The interpreter whose environment holds the engine (and its compressed-tensors): the
    Python engines' interpreter, or a command whose program is a Python; else None."""
    if server.engine != "command":
        return python_of(server)
    argv0 = program(server)
    return argv0 if _PYTHON_NAME.match(os.path.basename(argv0)) else None


def engine_module(server: ServerSpec) -> str | None:
    """The top-level package a Python engine's interpreter must find."""
    module = ENGINE_MODULES.get(server.engine)
    return module.split(".")[0] if module else None


def engine_dist(server: ServerSpec) -> str | None:
    return ENGINE_DISTS.get(server.engine)


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
    name = server.args.get("served-model-name", server.args.get("served_model_name"))
    return str(name) if isinstance(name, str | int | float) and str(name) else server.model


def models_of(site: SiteSpec, server: ServerSpec) -> tuple[ModelSpec, ...]:
    """The declared models the server loads (its model, its drafter), in spec order."""
    return site.needed_models([server])


def model_path(site: SiteSpec, server: ServerSpec) -> str:
    model = site.model(server.model)
    if model is None:  # validation refuses it; a caller passing a hand-made spec gets this
        raise ValueError(f"server {server.name}: model {server.model!r} is not in the spec")
    return model.staged


def ready_path(server: ServerSpec) -> str:
    return server.health or READY_PATHS[server.engine]


def connect_host(host: str) -> str:
    """Where to reach a server bound to `host`: a wildcard address means this machine."""
    if host in ("0.0.0.0", ""):  # noqa: S104 - a bind address read from the spec, not bound here
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def base_url(server: ServerSpec) -> str:
    host = connect_host(server.host)
    return f"http://[{host}]:{server.port}" if ":" in host else f"http://{host}:{server.port}"


def ready_url(server: ServerSpec) -> str:
    return base_url(server) + ready_path(server)


# -- timing -----------------------------------------------------------------------------------


def start_timeout(site: SiteSpec, server: ServerSpec) -> int:
    """TimeoutStartSec: the spec's start_timeout, else from the declared sizes of the server's
    models, in whole minutes (Kimi K2.6's 595 GiB: 35 min; a 54 GiB model: the 10 min floor)."""
    if server.start_timeout is not None:
        return server.start_timeout
    sizes = [m.size for m in models_of(site, server) if m.size is not None]
    if not sizes:
        return START_UNKNOWN_S
    gib = sum(sizes) / (1 << 30)
    seconds = max(START_FLOOR_S, START_BASE_S + START_S_PER_GIB * gib)
    return math.ceil(seconds / 60) * 60


def ready_timeout(site: SiteSpec, server: ServerSpec) -> int:
    """The readiness poll's own deadline: a tenth (at least 10 s) before TimeoutStartSec, so it
    reports what it waited for before systemd kills the start (the gate runs in that tenth)."""
    total = start_timeout(site, server)
    return total - max(10, total // 10)


def start_limit_interval(site: SiteSpec, server: ServerSpec) -> int:
    """Long enough to hold START_LIMIT_BURST starts of the longest kind, so the limit bites."""
    return START_LIMIT_BURST * (start_timeout(site, server) + RESTART_SEC)


# -- NUMA -------------------------------------------------------------------------------------


def numa_nodes(site: SiteSpec, server: ServerSpec) -> tuple[int, ...] | None:
    """The NUMA nodes of the server's GPUs (gpus.numa), or None when not known for every GPU
    (gpus.numa not declared) or the server has no GPUs: then nothing is pinned."""
    nodes = [site.gpus.numa_node_of(g) for g in server.gpus]
    if not nodes or any(n is None for n in nodes):
        return None
    return tuple(sorted({n for n in nodes if n is not None}))


# -- arguments --------------------------------------------------------------------------------


def sglang_config(site: SiteSpec, server: ServerSpec) -> dict[str, object]:
    """SGLang's arguments as its --config YAML takes them (long flag names, dashes)."""
    config: dict[str, object] = {
        "model-path": model_path(site, server),
        "tp-size": server.tp,
        "host": server.host,
        "port": server.port,
        "served-model-name": served_name(server),
    }
    spec = server.speculative
    if spec is not None:
        config["speculative-algorithm"] = spec.algorithm
        optional = {
            "speculative-draft-model-path": spec.draft_model,
            "speculative-num-steps": spec.num_steps,
            "speculative-eagle-topk": spec.eagle_topk,
            "speculative-num-draft-tokens": spec.num_draft_tokens,
            "speculative-ddtree-budget": spec.budget,
        }
        config.update({k: v for k, v in optional.items() if v is not None})
    for key, value in server.args.items():
        if key.replace("_", "-") not in config:  # served-model-name: written once, above
            config[key] = list(value) if isinstance(value, tuple) else value
    return config


def speculative_config(server: ServerSpec) -> dict[str, object] | None:
    """vLLM's --speculative-config: method, draft model, and num_steps as the tokens to propose."""
    spec = server.speculative
    if spec is None:
        return None
    config: dict[str, object] = {"method": VLLM_METHODS.get(spec.algorithm, spec.algorithm)}
    if spec.draft_model is not None:
        config["model"] = spec.draft_model
    if spec.num_steps is not None:
        config["num_speculative_tokens"] = spec.num_steps
    return config


def arg_words(key: str, value: object) -> list[str]:
    """One free-form argument as argv words: true is a bare flag, false vLLM's --no-KEY."""
    if value is True:
        return [f"--{key}"]
    if value is False:
        return [f"--no-{key}"]
    if isinstance(value, tuple | list):
        return [f"--{key}", *(str(v) for v in value)]
    return [f"--{key}", str(value)]


def argv(site: SiteSpec, server: ServerSpec) -> list[str]:
    """ExecStart='s argv."""
    if server.engine == "command":
        return list(server.command)
    python = python_of(server)
    if server.engine == "sglang":
        return [python, "-m", ENGINE_MODULES["sglang"], "--config", config_path(server.name)]
    words = [python, "-m", ENGINE_MODULES["vllm"], "--model", model_path(site, server)]
    words += ["--tensor-parallel-size", str(server.tp)]
    words += ["--host", server.host, "--port", str(server.port)]
    if not any(k.replace("_", "-") == "served-model-name" for k in server.args):
        words += ["--served-model-name", served_name(server)]
    spec = speculative_config(server)
    if spec is not None:
        words += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    for key, value in server.args.items():
        words += arg_words(key, value)
    return words


# -- systemd syntax ---------------------------------------------------------------------------


def exec_arg(arg: str, first: bool = False) -> str:
    """One argv word as an Exec*= line takes it literally: % and $ doubled (specifiers and
    variable expansion apply inside quotes too), quoted with \\ and " escaped unless plain."""
    text = arg.replace("%", "%%").replace("$", "$$")
    if _SAFE_ARG.match(text) and not (first and text[0] in _EXEC_PREFIXES):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def exec_line(words: list[str]) -> str:
    return " ".join(exec_arg(w, first=i == 0) for i, w in enumerate(words))


def environment_value(assignment: str) -> str:
    """An Environment= assignment (KEY=value): specifiers doubled, quoted unless plain; no $
    expansion happens there."""
    text = assignment.replace("%", "%%")
    if _SAFE_ARG.match(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def env_file_line(key: str, value: str) -> str:
    """KEY="value" as EnvironmentFile= reads it: in double quotes, \\ " ` $ are escaped."""
    escaped = re.sub(r'([\\"`$])', r"\\\1", value)
    return f'{key}="{escaped}"'
