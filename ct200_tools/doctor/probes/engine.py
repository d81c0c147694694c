"""What a server would run (its interpreter or program) and what its model needs: the engine's
own environment read by its own interpreter, and the staged model's quantization_config.

The engine's interpreter runs a few lines of stdlib (importlib): find the engine's package
without importing it (importing sglang takes seconds), and read the versions of the engine and
of compressed-tensors, and the engine's declared requirement on it, from their metadata.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import replace

from ct200_tools.doctor.probes.base import Reader
from ct200_tools.engines import ENGINE_CHILD
from ct200_tools.facts import EngineFacts, QuantFacts
from ct200_tools.serve import engines
from ct200_tools.spec import ServerSpec

ENGINE_TIMEOUT_S = 5.0
#: A model's config.json is a few KB; past this it is not one.
CONFIG_LIMIT = 1 << 20


def probe_engine(r: Reader, server: ServerSpec) -> EngineFacts:
    program = engines.program(server)
    resolved = engines.resolve_program(program, r.is_file)
    base = EngineFacts(path=program, resolved=resolved, module=engines.engine_module(server))
    if resolved is None:
        return base
    try:
        st = r.stat(resolved)
    except OSError:
        return base
    executable = stat.S_ISREG(st.st_mode) and bool(st.st_mode & 0o111)
    found = EngineFacts(
        program,
        resolved,
        exists=True,
        executable=executable,
        module=base.module,
        dist=engines.engine_dist(server),
    )
    python = engines.engine_python(server)
    if not executable or python is None:
        return found
    return _read_environment(r, replace(found, python=resolved), r.path(resolved).as_posix())


def _read_environment(r: Reader, found: EngineFacts, python: str) -> EngineFacts:
    argv = [python, "-I", "-c", ENGINE_CHILD, found.module or "", found.dist or ""]
    # Its own locale and nothing of ours: PYTHON* variables would change what it finds.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    try:
        ran = r.run(argv, ENGINE_TIMEOUT_S, env)
    except OSError as exc:
        return _with_error(found, f"{python} could not run: {exc}")
    line = (ran.stdout.strip().splitlines() or [""])[-1]
    try:
        data = json.loads(line)
    except json.JSONDecodeError:
        data = None
    # 1 with its JSON line: the engine's package is not found, which the line says.
    if ran.returncode not in (0, 1) or not isinstance(data, dict):
        tail = (ran.stderr.strip().splitlines() or [f"exit status {ran.returncode}"])[-1]
        return _with_error(found, f"{python} failed: {tail}")
    return EngineFacts(
        found.path,
        found.resolved,
        exists=True,
        executable=True,
        module=found.module,
        python=found.python,
        module_found=_bool(data.get("module_found")),
        dist=found.dist,
        dist_version=_str(data.get("dist_version")),
        compressed_tensors=_str(data.get("compressed_tensors")),
        ct_requirement=_str(data.get("ct_requirement")),
    )


def _with_error(found: EngineFacts, why: str) -> EngineFacts:
    return replace(found, error=why)


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def probe_quant(r: Reader, staged: str) -> QuantFacts:
    """The model's quantization_config (compression_config in models of compressed-tensors
    before 0.6), from its staged config.json."""
    config = f"{staged.rstrip('/')}/config.json"
    try:
        raw = r.read_regular(config, CONFIG_LIMIT)  # a FIFO or a device there: refused at once
    except FileNotFoundError:
        # Said as a fact only when the model itself is there; else it is not staged.
        if r.is_dir(staged):
            return QuantFacts(config, exists=False)
        return QuantFacts(config, error=f"cannot read {config}: the model is not there")
    except OSError as exc:
        return QuantFacts(config, error=f"cannot read {config}: {exc.strerror or exc}")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return QuantFacts(config, error=f"{config} is not JSON")
    if not isinstance(data, dict):
        return QuantFacts(config, error=f"{config} is not a JSON object")
    q = data.get("quantization_config") or data.get("compression_config")
    if not isinstance(q, dict):
        return QuantFacts(config)
    groups = q.get("config_groups")
    formats: list[str] = []
    for g in groups.values() if isinstance(groups, dict) else ():
        fmt = g.get("format") if isinstance(g, dict) else None
        if isinstance(fmt, str) and fmt not in formats:
            formats.append(fmt)
    return QuantFacts(
        config,
        exists=True,
        quant_method=_str(q.get("quant_method")),
        format=_str(q.get("format")),
        group_formats=tuple(formats),
        written_by=_str(q.get("version")),
    )
