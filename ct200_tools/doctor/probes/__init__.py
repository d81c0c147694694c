"""Probes read the machine into Facts. They judge nothing.

All probes run at once: the CUDA children start first (the slowest: ~0.3 s per H200 for one
cuInit over every GPU; per-GPU mode runs one child per GPU side by side), the others run in
threads beside them, each with a deadline that names it when missed.
"""

from __future__ import annotations

import datetime as dt
import socket
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ct200_tools import __version__
from ct200_tools.doctor.probes.base import Reader
from ct200_tools.doctor.probes.cuda import CudaChild
from ct200_tools.doctor.probes.devices import probe_devices
from ct200_tools.doctor.probes.kernel import probe_kernel
from ct200_tools.doctor.probes.memory import probe_memory
from ct200_tools.doctor.probes.nvml import probe_nvml
from ct200_tools.doctor.probes.pci import probe_pci
from ct200_tools.doctor.probes.serving import probe_serving
from ct200_tools.doctor.scope import Scope
from ct200_tools.doctor.warmup import DEFAULT_MODE as DEFAULT_CUDA_MODE
from ct200_tools.facts import CudaFacts, Facts, ModelFacts, ProbeRun
from ct200_tools.spec import ModelSpec, SiteSpec

DEFAULT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Probe:
    """A named reader of one Facts field. A scoped probe also gets the run's Scope (None when
    the run is about the whole machine)."""

    name: str
    run: Callable[..., Any]
    scoped: bool = False


#: In registry order; the Facts field has the probe's name.
PROBES: tuple[Probe, ...] = (
    Probe("kernel", lambda r, s: probe_kernel(r)),
    Probe("devices", lambda r, s: probe_devices(r, s.gpus.count if s else None)),
    Probe("pci", lambda r, s: probe_pci(r)),
    Probe("nvml", lambda r, s: probe_nvml(r)),
    Probe("memory", lambda r, s: probe_memory(r)),
    Probe("models", lambda r, s: _probe_models(r, s.models if s else None)),
    Probe("serving", lambda r, s: probe_serving(r)),
    # A lambda, as its neighbours: _probe_servers is defined below.
    Probe("servers", lambda r, s, scope: _probe_servers(r, s, scope), scoped=True),  # noqa: PLW0108
)
PROBE_NAMES = ("cuda", *(p.name for p in PROBES))


#: Why a snapshot without a spec has no models: `check --facts` says so instead of guessing.
NO_SPEC_MODELS = (
    "no site spec when the facts were read, so no model was looked at: take the snapshot "
    "with --spec to judge models.staged"
)


def _probe_models(r: Reader, models: tuple[ModelSpec, ...] | None) -> tuple[ModelFacts, ...] | None:
    if models is None:
        r.note("models", NO_SPEC_MODELS)
        return None
    # Imported here: the staging modules it reads with are needed only when the spec has models.
    from ct200_tools.doctor.probes.models import probe_models  # noqa: PLC0415

    return probe_models(r, models)


#: Why a snapshot has no servers without a spec, or with one that declares none.
NO_SPEC_SERVERS = "no site spec when the facts were read, so no server was looked at"


def _probe_servers(r: Reader, spec: SiteSpec | None, scope: Scope | None) -> Any:
    if spec is None:
        r.note("servers", NO_SPEC_SERVERS)
        return None
    # Imported here: HTTP and the engine probe are needed only when the spec has servers.
    from ct200_tools.doctor.probes.servers import probe_servers  # noqa: PLC0415

    if scope is not None:  # one server, named: the serving set does not choose it
        return probe_servers(r, spec, None, scope.server, scope.serving)
    return probe_servers(r, spec, probe_serving(r), None, True)


#: Why a probe the selected checks do not need has nothing in the facts.
NOT_NEEDED = "not probed: no selected check reads it"


class _Runner(threading.Thread):
    def __init__(
        self, probe: Probe, reader: Reader, spec: SiteSpec | None, scope: Scope | None = None
    ) -> None:
        # Daemon: a probe stuck in a driver call must not keep the doctor from exiting.
        super().__init__(name=f"probe-{probe.name}", daemon=True)
        self.probe, self.reader, self.spec, self.scope = probe, reader, spec, scope
        self.value: Any = None
        self.error: str | None = None
        self.duration = 0.0

    def run(self) -> None:
        t0 = time.monotonic()
        try:
            extra = (self.scope,) if self.probe.scoped else ()
            self.value = self.probe.run(self.reader, self.spec, *extra)
        except Exception as exc:  # noqa: BLE001 - a probe bug becomes a recorded fact, not a crash
            self.error = f"{type(exc).__name__}: {exc}"
        self.duration = time.monotonic() - t0


def collect(
    spec: SiteSpec | None = None,
    root: Path | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    reader: Reader | None = None,
    cuda: bool = True,
    deep: bool = False,
    scope: Scope | None = None,
    only: Collection[str] | None = None,
    cuda_mode: str = DEFAULT_CUDA_MODE,
    cuda_gpus: Sequence[int] | None = None,
) -> Facts:
    """Run every probe (or those named in `only`) in parallel; a probe past its deadline is
    recorded as timed out. With a scope, CUDA is initialised on the scope's GPUs only and the
    servers probe reads only its server. cuda_mode: "per-gpu" (one CUDA child per GPU) or "all"
    (one cuInit over every GPU); cuda_gpus: only these GPUs (nvidia-smi's indices), not all."""
    r = reader or Reader(root=root or Path("/"), deep=deep)
    t0 = time.monotonic()
    cuda = cuda and (only is None or "cuda" in only)
    if scope is not None and cuda_gpus is None:
        cuda_gpus = scope.gpus
    child = CudaChild(timeout_s, cuda_mode, r.root, cuda_gpus) if cuda else None
    for p in PROBES:
        if only is not None and p.name not in only:
            r.note(p.name, NOT_NEEDED)
    runners = [_Runner(p, r, spec, scope) for p in PROBES if only is None or p.name in only]
    for t in runners:
        t.start()
    deadline = t0 + timeout_s
    fields: dict[str, Any] = {}
    runs: list[ProbeRun] = []
    for t in runners:
        t.join(max(0.0, deadline - time.monotonic()))
        name = t.probe.name
        if t.is_alive():
            why = f"probe {name} did not finish within {timeout_s:g} s"
            r.note(name, why)
            runs.append(ProbeRun(name, round(time.monotonic() - t0, 3), "timeout", why))
        elif t.error:
            r.note(name, f"probe failed: {t.error}")
            runs.append(ProbeRun(name, round(t.duration, 3), "error", t.error))
        else:
            fields[name] = t.value
            runs.append(ProbeRun(name, round(t.duration, 3)))
    if child is None:
        why = NOT_NEEDED if only is not None else "cuInit not probed (collect(cuda=False))"
        r.note("cuda", why)
    else:
        try:
            facts_cuda = child.result()
        except Exception as exc:  # noqa: BLE001 - like the threads: a probe bug is a fact
            facts_cuda = CudaFacts(error=f"cuInit probe failed: {type(exc).__name__}: {exc}")
        fields["cuda"] = facts_cuda
        outcome = "timeout" if facts_cuda.timed_out else "ok"
        runs.insert(0, ProbeRun("cuda", facts_cuda.duration_s or 0.0, outcome, facts_cuda.error))
        if facts_cuda.timed_out and facts_cuda.error:
            r.note("cuda", facts_cuda.error)
    return Facts(
        collected_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        hostname=socket.gethostname(),
        doctor_version=__version__,
        probes=tuple(runs),
        unreadable=dict(sorted(r.unreadable.items())),
        **fields,
    )


def stuck_probes() -> list[str]:
    """Probe threads still running (for the CLI: exit hard rather than wait on a hung driver)."""
    return [t.name for t in threading.enumerate() if t.name.startswith("probe-") and t.is_alive()]
