"""Server facts for the check and root-cause tests: the llama-cpu recordings, units as real
systemd showed them, and the edits that make each case (each named `derived: ...`).

Recorded (tests/fixtures/README.md): facts/llama-cpu-serving.json and llama-cpu-stopped.json,
`ct200-doctor snapshot --spec tests/fixtures/llama-cpu-site.yml` on a machine without systemd
or a GPU, with llama-server running and stopped; raw/systemd/show-six-units.txt, `systemctl show`
of six transient or installed units on a testbed machine (systemd 252).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path

from ct200_tools.doctor.probes.systemd import parse_show
from ct200_tools.facts import (
    EngineFacts,
    Facts,
    HttpFacts,
    ProcessGpuFacts,
    QuantFacts,
    ServerFacts,
    UnitFacts,
    loads,
)
from ct200_tools.serve import engines

FIX = Path(__file__).parents[1] / "fixtures"
LLAMA_SPEC = FIX / "llama-cpu-site.yml"
UNIT = engines.unit_name("llama")
#: The recorded units, by what they show.
RECORDED_UNITS = {
    "ok": "ct200-server-rec-ok.service",  # active (running)
    "fail": "ct200-server-rec-fail.service",  # failed, exit status 2
    "limit": "ct200-server-rec-limit.service",  # failed after 3 restarts
    "start": "ct200-server-rec-start.service",  # activating (start): Type=notify, not ready
    "none": "ct200-server-rec-none.service",  # not-found
    "dead": "ct200-server-rec-dead.service",  # installed, never started: inactive (dead)
}


@functools.cache
def show_text() -> str:
    return (FIX / "raw" / "systemd" / "show-six-units.txt").read_text()


def recorded_unit(kind: str) -> UnitFacts:
    """One recorded unit, renamed to the llama server's unit."""
    units = list(RECORDED_UNITS.values())
    got = parse_show(show_text(), units)[RECORDED_UNITS[kind]]
    group = got.control_group.replace(RECORDED_UNITS[kind], UNIT) if got.control_group else None
    return dataclasses.replace(got, name=UNIT, control_group=group)


@functools.cache
def llama(state: str) -> Facts:
    """llama-cpu-serving or llama-cpu-stopped, as recorded."""
    return loads((FIX / "facts" / f"llama-cpu-{state}.json").read_text())


def server(f: Facts, **changes: object) -> Facts:
    """The facts with the llama server's facts changed."""
    assert f.servers is not None
    (s,) = f.servers
    return dataclasses.replace(f, servers=(dataclasses.replace(s, **changes),))


def the_server(f: Facts) -> ServerFacts:
    assert f.servers is not None
    return f.servers[0]


Edit = Callable[[Facts], Facts]


def with_unit(kind: str) -> Edit:
    """derived: the server under systemd, its unit as the recorded one of that kind shows."""
    return lambda f: server(f, unit=recorded_unit(kind))


def older_configuration(f: Facts) -> Facts:
    """derived: the active unit's process runs an older configuration than its files (issue
    33: its port changed in the unit)."""
    unit = the_server(f).unit
    assert unit is not None
    reason = f"/etc/systemd/system/{UNIT} was written 40 s after the process started"
    return server(f, unit=dataclasses.replace(unit, older_configuration=(reason,)))


def own_port(f: Facts) -> Facts:
    """derived: the recorded listener in the server's own unit (as under systemd)."""
    s = the_server(f)
    assert s.listeners is not None
    mine = tuple(dataclasses.replace(h, unit=UNIT) for h in s.listeners)
    return server(f, listeners=mine)


def on_gpus(visible: str | None) -> Edit:
    """derived: the unit's main process (the recorded llama-server pid) with this
    CUDA_VISIBLE_DEVICES, NVML unavailable as on the recording machine."""

    def edit(f: Facts) -> Facts:
        s = the_server(f)
        assert s.listeners and s.listeners[0].pid is not None
        pid = s.listeners[0].pid
        gpus = ProcessGpuFacts(
            pids=(pid,),
            visible={str(pid): visible},
            why_no_nvml="NVML unavailable: NVML Shared Library Not Found",
        )
        unit = dataclasses.replace(recorded_unit("ok"), main_pid=pid)
        return server(own_port(f), unit=unit, gpus=gpus)

    return edit


def engine(**changes: object) -> Edit:
    def edit(f: Facts) -> Facts:
        e = the_server(f).engine
        assert e is not None
        return server(f, engine=dataclasses.replace(e, **changes))

    return edit


def python_engine(ct: str | None, requirement: str | None = None) -> Edit:
    """derived: engine sglang in a venv (as test_server_probes builds for real), with this
    compressed-tensors and sglang's own pin (sglang 0.5.23 requires ==0.18.0)."""
    return engine(
        path="/opt/sglang/bin/python",
        resolved="/opt/sglang/bin/python",
        python="/opt/sglang/bin/python",
        module="sglang",
        module_found=True,
        dist="sglang",
        dist_version="0.5.23",
        compressed_tensors=ct,
        ct_requirement=requirement,
    )


def nvfp4_model(f: Facts) -> Facts:
    """derived: the staged model's config.json says compressed-tensors nvfp4-pack-quantized
    (Kimi K2.6's format in the incident)."""
    s = the_server(f)
    assert s.quant is not None
    q = QuantFacts(
        s.quant.config,
        quant_method="compressed-tensors",
        format="nvfp4-pack-quantized",
        group_formats=("nvfp4-pack-quantized",),
    )
    return server(f, quant=q)


def generation_timed_out(f: Facts) -> Facts:
    """derived: the completion did not answer within its deadline."""
    g = the_server(f).generation
    assert g is not None
    return server(f, generation=HttpFacts(g.url, duration_s=5.0, error="no answer within 5 s"))


def serves(*names: str) -> Edit:
    """derived: /v1/models lists these names instead."""

    def edit(f: Facts) -> Facts:
        m = the_server(f).models
        assert m is not None
        return server(f, models=dataclasses.replace(m, served=names))

    return edit


def not_staged(f: Facts) -> Facts:
    """derived: the model's staged copy is gone (as after a reboot)."""
    assert f.models is not None and f.models[0].staged_tree is not None
    tree = dataclasses.replace(f.models[0].staged_tree, exists=False, is_dir=False, marker=None)
    models = (dataclasses.replace(f.models[0], staged_tree=tree), *f.models[1:])
    return dataclasses.replace(f, models=models)


def shm_too_small(f: Facts) -> Facts:
    """derived: /dev/shm mounted at 64 KiB (its fstab line shrunk), far below the model."""
    assert f.memory is not None
    small = dataclasses.replace(f.memory, shm_size=64 << 10, shm_free=64 << 10)
    return dataclasses.replace(f, memory=small)


def no_engine(f: Facts) -> Facts:
    """derived: command[0] is not there (the llama-server build was removed)."""
    e = the_server(f).engine
    assert e is not None
    gone = EngineFacts(e.path, e.resolved)
    return server(f, engine=gone)


@functools.cache
def _h200() -> Facts:
    return loads((FIX / "facts" / "h200-healthy.json").read_text())


def on_h200(f: Facts) -> Facts:
    """derived: the server's facts on the healthy H200 (its kernel, devices, PCI, NVML and CUDA
    sections), so that only the server's own faults fail."""
    h = _h200()
    grafted = ("kernel", "devices", "pci", "nvml", "cuda")

    def section(key: str) -> str:
        return key.split(".", maxsplit=1)[0]

    return dataclasses.replace(
        f,
        **{name: getattr(h, name) for name in grafted},
        unreadable={
            **{k: v for k, v in f.unreadable.items() if section(k) not in grafted},
            **{k: v for k, v in h.unreadable.items() if section(k) in grafted},
        },
    )


def chain(*edits: Edit) -> Edit:
    def edit(f: Facts) -> Facts:
        for e in edits:
            f = e(f)
        return f

    return edit


def cuda_hung(f: Facts) -> Facts:
    """derived: cuInit hangs (a root of its own: no node explains a hang)."""
    from ct200_tools.facts import CudaFacts  # noqa: PLC0415

    return dataclasses.replace(
        f, cuda=CudaFacts(timed_out=True, duration_s=10.0, error="cuInit did not return")
    )


__all__ = ["UnitFacts"]
