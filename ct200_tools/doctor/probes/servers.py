"""The inference servers, read and not judged: each server's unit, who listens on its port,
whether it answers (TCP, /v1/models, a 1-token completion), the GPUs its processes use, the
engine it would run, and its model's quantization format.

Which servers: the scope's one (gate, check --server), else the serving set, else the spec's
enabled ones. Every step has a deadline, so a hung server or systemd costs seconds, never the
doctor; the servers are read in parallel.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from ct200_tools import serverhttp
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
from ct200_tools.serve import engines
from ct200_tools.serve.serving import selected
from ct200_tools.spec import ServerSpec, SiteSpec

CONNECT_TIMEOUT_S = 1.0
MODELS_TIMEOUT_S = serverhttp.MODELS_TIMEOUT_S
GENERATE_TIMEOUT_S = serverhttp.GENERATE_TIMEOUT_S
PROMPT = serverhttp.PROMPT
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
        return replace(out, connected=False, connect_error=serverhttp.why(exc, CONNECT_TIMEOUT_S))
    out = replace(out, connected=True, connect_error=None)
    base = engines.base_url(s)
    models = serverhttp.models(r.request, base)
    out = replace(out, models=models)
    if models.status == 200:
        out = replace(out, generation=generate(r, base, engines.served_name(s)))
    return out


def generate(
    r: Reader, base: str, served: str, prompt: str = PROMPT, timeout_s: float = GENERATE_TIMEOUT_S
) -> HttpFacts:
    """A 1-token completion through the OpenAI API (ct200_tools.serverhttp.generate)."""
    return serverhttp.generate(r.request, base, served, prompt, timeout_s)


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
