"""What a server runs, derived from the site spec alone: the one contract the server units
(render.py, templates/), `ct200-serve` and the doctor (probes and checks) share. Pure functions
of the spec: no I/O here (the probes and the preflight look at the machine).

Each engine kind is one module of ct200_tools.engines (sglang.py, vllm.py, command.py, ...):
what it is and accepts, its argv, readiness path, config file, served name, what the doctor
looks for and how a missing install is fixed; the registry there finds it by the spec's
`engine:`. What is the same for every kind lives here: start and stop timing, NUMA, systemd's
syntax, and where a server's pieces are (ct200_tools.engines.paths, re-exported).

- Unit: each server NAME runs as `ct200-server-NAME.service`.
- <python> is `$VIRTUAL_ENV/bin/python` when the server's env sets VIRTUAL_ENV (the engine's
  own venv: `env: {VIRTUAL_ENV: /opt/sglang}`), else /usr/bin/python3.
- Two servers of one model answer to the same served name, as a client of either expects.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Final

from ct200_tools.engines import ENGINES, sglang
from ct200_tools.engines.base import SYSTEM_PYTHON, Engine, model_path, python_of
from ct200_tools.engines.paths import (
    CACHE_ROOT,
    CONFIG_DIR,
    STAGE_UNIT_PREFIX,
    UNIT_PREFIX,
    cache_dir,
    config_path,
    env_path,
    server_of_unit,
    stage_unit,
    unit_name,
)
from ct200_tools.engines.vllm import VLLM_METHODS, arg_words, speculative_config
from ct200_tools.spec import ModelSpec, ServerSpec, SiteSpec

__all__ = [
    "CACHE_ROOT",
    "CONFIG_DIR",
    "ENGINES",
    "STAGE_UNIT_PREFIX",
    "SYSTEM_PYTHON",
    "UNIT_PREFIX",
    "VLLM_METHODS",  # what vLLM calls each algorithm: the spec validates against it
    "Engine",
    "arg_words",
    "cache_dir",
    "config_path",
    "env_path",
    "model_path",
    "python_of",
    "server_of_unit",
    "speculative_config",
    "stage_unit",
    "unit_name",
]

#: The service user the role creates; every engine runs as it (none needs root).
SERVICE_USER: Final = "ct200"
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

# Lifecycle. A failure is retried RESTART_SEC later, at most START_LIMIT_BURST starts in the
# interval that many starts can take; then the unit stays failed (a bad flag must not reload
# 595 GB in a loop). Each start that serves resets the count (ExecStartPost= `systemctl
# reset-failed`), so only failed starts in a row count: a server that crashes now and then comes
# back every time, and a crash loop stops after START_LIMIT_BURST starts.
RESTART_SEC: Final = 10
START_LIMIT_BURST: Final = 3
#: Debian 12 has /bin merged into /usr/bin.
SYSTEMCTL: Final = "/usr/bin/systemctl"
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


# -- the server's engine ----------------------------------------------------------------------


def kind(server: ServerSpec) -> Engine:
    """The server's engine module. The spec's grammar admits only names ENGINES has."""
    return ENGINES[server.engine]


def program(server: ServerSpec) -> str:
    """argv[0]: the engine's interpreter, or the command's program as the spec gives it."""
    return kind(server).program(server)


def argv(site: SiteSpec, server: ServerSpec) -> list[str]:
    """ExecStart='s argv."""
    return kind(server).argv(site, server)


def config(site: SiteSpec, server: ServerSpec) -> dict[str, object] | None:
    """The engine's config file beside its argv (at config_path), or None when it reads none."""
    return kind(server).config(site, server)


def sglang_config(site: SiteSpec, server: ServerSpec) -> dict[str, object]:
    """SGLang's --config YAML of the server, whatever its engine (the one-contract test)."""
    return sglang.ENGINE.options(site, server)


def served_name(server: ServerSpec) -> str:
    """What /v1/models lists and requests name (each engine's module says how it is set)."""
    return kind(server).served_name(server)


def ready_path(server: ServerSpec) -> str:
    """GET this answers 200 once the server serves: the spec's `health:`, else the engine's."""
    return server.health or kind(server).ready_path


def engine_python(server: ServerSpec) -> str | None:
    """The interpreter whose environment holds the engine (and its compressed-tensors): the
    Python engines' interpreter, or a command whose program is a Python; else None."""
    return kind(server).python(server)


def engine_module(server: ServerSpec) -> str | None:
    """The top-level package a Python engine's interpreter must find (finding it imports
    nothing: importing sglang takes seconds)."""
    module = kind(server).module
    return module.split(".")[0] if module else None


def engine_dist(server: ServerSpec) -> str | None:
    """The engine's distribution (pip name), whose metadata pins compressed-tensors."""
    return kind(server).dist


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


def models_of(site: SiteSpec, server: ServerSpec) -> tuple[ModelSpec, ...]:
    """The declared models the server loads (its model, its drafter), in spec order."""
    return site.needed_models([server])


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


def exec_words(line: str) -> list[str]:
    """How systemd splits an Exec*= line (systemd.service(5), "Command lines"), the inverse of
    exec_line: words separated by spaces, double or single quotes around a word, C escapes
    inside; then $$ -> $ and %% -> % (specifiers and variables are expanded before, so doubled
    ones stand for themselves). A trailing lone backslash stands for itself."""
    words: list[str] = []
    i = 0
    while i < len(line):
        if line[i] == " ":
            i += 1
            continue
        word, quote = "", ""
        while i < len(line) and (quote or line[i] != " "):
            c = line[i]
            if not quote and c in "\"'":
                quote = c
            elif c == quote:
                quote = ""
            elif c == "\\" and i + 1 < len(line):
                i += 1
                word += {"n": "\n", "t": "\t"}.get(line[i], line[i])
            else:
                word += c
            i += 1
        words.append(word.replace("$$", "$").replace("%%", "%"))
    return words


def exec_start(unit_text: str) -> list[str] | None:
    """The argv of a unit file's one ExecStart= line, its prefixes (@-:+!|) dropped; None when
    it has none or several (not a unit this project writes)."""
    key = "ExecStart="
    lines = [ln[len(key) :] for ln in unit_text.splitlines() if ln.startswith(key)]
    if len(lines) != 1:
        return None
    words = exec_words(lines[0].lstrip(_EXEC_PREFIXES))
    return words or None


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
