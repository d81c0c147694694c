"""The inference servers, read and not judged: each server's unit, who listens on its port,
whether it answers (TCP, /v1/models, a 1-token completion), the GPUs its processes use, the
engine it would run, and its model's quantization format.

Which servers: the scope's one (gate, check --server), else the serving set, else the spec's
enabled ones. Every step has a deadline, so a hung server or systemd costs seconds, never the
doctor; the servers are read in parallel.
"""

from __future__ import annotations

import contextlib
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from ct200_tools.doctor.probes.base import Reader
from ct200_tools.doctor.probes.engine import probe_engine, probe_quant
from ct200_tools.doctor.probes.ports import probe_port
from ct200_tools.doctor.probes.systemd import probe_units
from ct200_tools.facts import (
    HttpFacts,
    ProcessGpuFacts,
    ServerFacts,
    ServingFacts,
    UnitFacts,
)
from ct200_tools.httpclient import HttpError, NotJson, Redirected, count, parse_json
from ct200_tools.serve import engines
from ct200_tools.serve.serving import selected
from ct200_tools.spec import ServerSpec, SiteSpec
from ct200_tools.untrusted import show

CONNECT_TIMEOUT_S = 1.0
MODELS_TIMEOUT_S = 2.0
#: A 1-token completion on an idle server takes well under a second, even for Kimi K2.6.
GENERATE_TIMEOUT_S = 5.0
#: The prompt of the 1-token completion.
PROMPT = "ping"
#: At most this many processes of a unit have their environment read.
MAX_PIDS = 64
WORKERS = 8


def chosen(spec: SiteSpec, serving: ServingFacts | None, only: str | None) -> list[ServerSpec]:
    """The servers to read: `only`; else the serving set's; else the enabled ones (the rule
    the checks judge by: ct200_tools.serve.serving.selected)."""
    return list(selected(spec, serving.servers if serving is not None else None, only))


def probe_servers(
    r: Reader,
    spec: SiteSpec,
    serving: ServingFacts | None,
    only: str | None = None,
    live: bool = True,
) -> tuple[ServerFacts, ...]:
    """Each server's facts. Without `live` (a start gate), only what decides whether it can
    start: its engine, its model's format and who holds its port; not its unit, HTTP or GPUs."""
    servers = chosen(spec, serving, only)
    if not servers:
        return ()
    units = (
        probe_units(
            r,
            [engines.unit_name(s.name) for s in servers],
            "servers.units",
            {
                engines.unit_name(s.name): (engines.env_path(s.name), engines.config_path(s.name))
                for s in servers
            },
        )
        if live
        else {}
    )

    def one(s: ServerSpec) -> ServerFacts:
        return _probe_one(r, spec, s, units.get(engines.unit_name(s.name)), live)

    with ThreadPoolExecutor(min(WORKERS, len(servers)), thread_name_prefix="probe-server") as ex:
        return tuple(ex.map(one, servers))


def _probe_one(
    r: Reader, spec: SiteSpec, s: ServerSpec, unit: UnitFacts | None, live: bool
) -> ServerFacts:
    key = f"servers.{s.name}"
    model = spec.model(s.model)
    out = ServerFacts(
        name=s.name,
        unit=unit,
        engine=probe_engine(r, s),
        quant=probe_quant(r, model.staged) if model is not None else None,
    )
    try:
        listeners = probe_port(r, s.host, s.port)
    except OSError as exc:
        r.note(f"{key}.listeners", str(exc))
        listeners = None
    out = replace(out, listeners=listeners)
    if not live:
        return out
    if unit is not None and unit.main_pid:
        out = replace(out, gpus=_process_gpus(r, unit))
    host = engines.connect_host(s.host)
    try:
        r.connect(host, s.port, CONNECT_TIMEOUT_S)
    except OSError as exc:
        return replace(out, connected=False, connect_error=_why(exc, CONNECT_TIMEOUT_S))
    out = replace(out, connected=True, connect_error=None)
    base = engines.base_url(s)
    models = _models(r, base)
    out = replace(out, models=models)
    if models.status == 200:
        out = replace(out, generation=generate(r, base, engines.served_name(s)))
    return out


def _why(exc: OSError, timeout_s: float) -> str:
    if isinstance(exc, HttpError):
        return str(exc)  # the client's own words, with what the server said escaped
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout_s:g} s"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nothing listens)"
    return exc.strerror or str(exc) or type(exc).__name__


def _call(
    r: Reader, method: str, url: str, payload: dict[str, Any] | None, timeout_s: float
) -> tuple[HttpFacts, Any]:
    """One request and its JSON. The facts keep what the server said exactly (body, served
    names); the checks escape it where they show it."""
    body = json.dumps(payload).encode() if payload is not None else None
    t0 = time.monotonic()
    try:
        status, data = r.request(method, url, body, timeout_s)
    except Redirected as exc:
        return HttpFacts(url, status=exc.status, duration_s=_since(t0), error=exc.note), None
    except OSError as exc:
        return HttpFacts(url, duration_s=_since(t0), error=_why(exc, timeout_s)), None
    got = HttpFacts(url, status=status, duration_s=_since(t0))
    try:
        return got, parse_json(data)
    except NotJson as exc:
        text = data[:300].decode(errors="replace")
        return _with(got, error=str(exc), body=text), None


def _since(t0: float) -> float:
    return round(time.monotonic() - t0, 3)


def _with(h: HttpFacts, **changes: Any) -> HttpFacts:
    return replace(h, **changes)


def _models(r: Reader, base: str) -> HttpFacts:
    got, data = _call(r, "GET", f"{base}/v1/models", None, MODELS_TIMEOUT_S)
    if got.error is not None or got.status != 200:
        return got if got.status is None or got.status == 200 else _error_body(got, data)
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return _with(got, error="no data list in the answer", body=_body(data))
    # An id that is not a string (a number, a list) names no model: it is not listed.
    ids = tuple(m["id"] for m in items if isinstance(m, dict) and isinstance(m.get("id"), str))
    return _with(got, served=ids)


def generate(
    r: Reader, base: str, served: str, prompt: str = PROMPT, timeout_s: float = GENERATE_TIMEOUT_S
) -> HttpFacts:
    """A 1-token completion through the OpenAI API (the doctor's server.generate, and
    `ct200-serve smoke`): its status, tokens, or what went wrong."""
    payload = {"model": served, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    got, data = _call(r, "POST", f"{base}/v1/completions", payload, timeout_s)
    if got.error is not None or got.status != 200:
        return got if got.status is None or got.status == 200 else _error_body(got, data)
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices:
        return _with(got, error="no choices in the answer", body=_body(data))
    usage = data.get("usage") if isinstance(data, dict) else None
    raw = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if raw is None:
        return got  # no usage reported: the choice is the completion
    tokens = count(raw)
    if tokens is None:
        # true is a bool (an int to Python), 1.0 a float: neither is a token count.
        what = show(json.dumps(raw), 60)
        return _with(got, error=f"usage.completion_tokens is {what}, not a token count")
    return _with(got, tokens=tokens)


def _error_body(got: HttpFacts, data: Any) -> HttpFacts:
    """An error status's answer: its JSON, else the start of its text as _call kept it."""
    return got if data is None else _with(got, body=_body(data))


def _body(data: Any) -> str | None:
    return None if data is None else json.dumps(data)[:300]


def _unit_pids(r: Reader, unit: UnitFacts) -> tuple[int, ...]:
    """The unit's processes (its cgroup's cgroup.procs, cgroup v2), else its main PID."""
    main = (unit.main_pid,) if unit.main_pid else ()
    if unit.control_group:
        try:
            text = r.read_text(f"/sys/fs/cgroup{unit.control_group}/cgroup.procs")
        except OSError:
            return main
        pids = tuple(int(p) for p in text.split() if p.isdigit())
        return tuple(sorted(set(pids) | set(main)))[:MAX_PIDS] if pids else main
    return main


def visible_devices(environ: bytes) -> str | None:
    """CUDA_VISIBLE_DEVICES in a /proc/PID/environ (NUL-separated), or None when unset."""
    for item in environ.split(b"\0"):
        if item.startswith(b"CUDA_VISIBLE_DEVICES="):
            return item.partition(b"=")[2].decode(errors="replace")
    return None


def _process_gpus(r: Reader, unit: UnitFacts) -> ProcessGpuFacts:
    pids = _unit_pids(r, unit)
    visible: dict[str, str | None] = {}
    why_environ = None
    for pid in pids:
        try:
            visible[str(pid)] = visible_devices(r.read_bytes(f"/proc/{pid}/environ"))
        except OSError as exc:
            why_environ = f"cannot read /proc/{pid}/environ: {exc.strerror or exc}"
    nvml_gpus, nvml_pids, why_nvml = nvml_processes(set(pids))
    return ProcessGpuFacts(
        pids=pids,
        visible=visible,
        nvml_gpus=nvml_gpus,
        nvml_pids=nvml_pids,
        why_no_nvml=why_nvml,
        why_no_environ=why_environ if not visible else None,
    )


def nvml_processes(
    pids: set[int], nvml: Any = None
) -> tuple[tuple[int, ...] | None, tuple[int, ...], str | None]:
    """The GPUs NVML lists any of `pids` on, every pid it lists, and why it could not be asked.
    `nvml` is the pynvml module (a parameter so tests can pass a stand-in)."""
    try:
        if nvml is None:
            import pynvml  # noqa: PLC0415

            nvml = pynvml
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - no NVML (no driver, no GPU) is a fact, not a crash
        return None, (), f"NVML unavailable: {exc}"
    try:
        gpus: list[int] = []
        seen: list[int] = []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            listed = [int(p.pid) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
            seen += [p for p in listed if p not in seen]
            if pids & set(listed):
                gpus.append(i)
        return tuple(gpus), tuple(sorted(seen)), None
    except Exception as exc:  # noqa: BLE001
        return None, (), f"NVML: {exc}"
    finally:
        with contextlib.suppress(Exception):  # nothing to do about a failed shutdown
            nvml.nvmlShutdown()
