"""What can be known of a run: the command, this tool, this host, the times, and the engine.

The engine is asked what it is through the endpoints each one has: GET /v1/models (all), /version
(vLLM), /get_server_info (SGLang), /props (llama-server), all four at once within one deadline (a
silent server costs one timeout, not four). Every answer is untrusted: read whole and bounded
(ct200_tools.bench.http), stored exactly as JSON (a machine reader loses nothing) and shown only
through untrusted.show. A missing endpoint is recorded with its error, never guessed around.
"""

from __future__ import annotations

import asyncio
import platform
import socket
import sys
import time
from importlib import metadata
from typing import Final

import aiohttp

from ct200_tools import __version__
from ct200_tools.bench.http import INFO_TIMEOUT_S, Answer, Deadline, request_json
from ct200_tools.untrusted import show

#: Each engine's self-description; which of them answer tells the engine apart.
ENGINE_ENDPOINTS: Final = {
    "models": "/v1/models",
    "version": "/version",
    "server_info": "/get_server_info",
    "props": "/props",
}
#: llama-server's /props carries its whole chat template and more; a few KiB are kept of each.
MAX_ANSWER: Final = 256 << 10


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _answer(a: Answer) -> dict[str, object]:
    return {"url": a.url, "status": a.status, "data": a.data, "error": a.error}


async def engine_info(
    session: aiohttp.ClientSession, base_url: str, deadline: Deadline | None = None
) -> dict[str, object]:
    """Every endpoint's answer by name, and `engine`; each request is bounded by the session's
    timeout and `deadline`."""
    base = base_url.rstrip("/")
    answers = await asyncio.gather(
        *(
            request_json(session, "GET", base + path, max_bytes=MAX_ANSWER, deadline=deadline)
            for path in ENGINE_ENDPOINTS.values()
        )
    )
    out: dict[str, object] = {
        name: _answer(a) for name, a in zip(ENGINE_ENDPOINTS, answers, strict=True)
    }
    out["engine"] = guess_engine(out)
    return out


def refusal(target: str, info: dict[str, object], key_env: str | None) -> tuple[str, str] | None:
    """(what, fix) when the target cannot be measured: it gave no HTTP answer at all, redirects
    its API, or wants an API key (`key_env`: the variable of the one it refused); else None."""
    entries = {
        path: entry
        for name, path in ENGINE_ENDPOINTS.items()
        if isinstance(entry := info.get(name), dict)
    }
    if all(e.get("status") is None for e in entries.values()):
        errors = {str(e.get("error")) for e in entries.values()}
        said = (
            f"GET {', '.join(entries)}: {errors.pop()}"
            if len(errors) == 1
            else "; ".join(f"GET {p}: {e.get('error')}" for p, e in entries.items())
        )
        return (
            f"{show(target)} did not answer: {said}",
            "check that the server runs and listens at --target (host, port, http or https), "
            f"or give a slow server more time with --timeout (at most {INFO_TIMEOUT_S:g} s an "
            "info request)",
        )
    models = entries.get("/v1/models", {})
    status = models.get("status")
    if isinstance(status, int) and 300 <= status < 400:
        return (
            f"GET {show(target)}/v1/models: {models.get('error')}",
            "give as --target the server's own base URL (the one that answers /v1/models)",
        )
    if status in (401, 403):
        return (
            f"GET {show(target)}/v1/models: HTTP {status}, the server wants an API key"
            + (f" and refused the one in {key_env}" if key_env is not None else ""),
            "put the server's key in an environment variable and pass --api-key-env VARIABLE "
            "(sent as Authorization: Bearer)",
        )
    return None


def _data(info: dict[str, object], name: str) -> dict[str, object] | None:
    entry = info.get(name)
    if isinstance(entry, dict) and entry.get("status") == 200 and isinstance(entry["data"], dict):
        return entry["data"]
    return None


def guess_engine(info: dict[str, object]) -> dict[str, object]:
    """{name, version} as far as the answers tell; None where they do not."""
    sglang = _data(info, "server_info")
    if sglang is not None:
        return {"name": "sglang", "version": sglang.get("version")}
    props = _data(info, "props")
    if props is not None and ("default_generation_settings" in props or "build_info" in props):
        return {"name": "llama-server", "version": props.get("build_info")}
    version = _data(info, "version")
    if version is not None:
        return {"name": "vllm", "version": version.get("version")}
    return {"name": None, "version": None}


def served_models(info: dict[str, object]) -> list[str]:
    models = _data(info, "models")
    data = models.get("data") if models is not None else None
    if not isinstance(data, list):
        return []
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


def describe_engine(info: dict[str, object]) -> str:
    """One escaped line for the text view."""
    engine = info.get("engine")
    name = version = None
    if isinstance(engine, dict):
        name, version = engine.get("name"), engine.get("version")
    what = show(name, 40) if name else "unknown engine"
    if version is not None:
        what += f" {show(version, 60)}"
    models = served_models(info)
    return what + (f", serving {show(', '.join(models), 120)}" if models else "")


def base_provenance(argv: list[str], target: str | None, run_id: str) -> dict[str, object]:
    try:
        aiohttp_version: str | None = metadata.version("aiohttp")
    except metadata.PackageNotFoundError:
        aiohttp_version = None
    return {
        "schema_version": 1,
        "run_id": run_id,
        "command": argv,
        "ct200_tools_version": __version__,
        "python": sys.version.split()[0],
        "aiohttp": aiohttp_version,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "target": target,
        # Managed runs pass ct200-doctor's gate first; a --target run does not.
        "gated": False,
        "started": now_iso(),
        "finished": None,
        "state": "running",
        "resumed": [],
    }
