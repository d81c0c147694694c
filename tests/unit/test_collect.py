"""collect(): every probe on a root rebuilt from the H200 recordings, and its deadlines."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import ct200_tools.doctor.probes as probes_pkg
from ct200_tools.doctor import warmup
from ct200_tools.doctor.probes import NO_SPEC_MODELS, NO_SPEC_SERVERS, PROBE_NAMES, Probe, collect
from ct200_tools.doctor.probes.base import Reader
from ct200_tools.doctor.probes.kernel import probe_kernel
from ct200_tools.doctor.probes.nvml import probe_nvml
from ct200_tools.facts import LATER_SECTIONS
from tests.unit import nvml_standin
from tests.unit.probe_helpers import (
    H200_FIXTURES,
    facts,
    h200_root,
)


@pytest.fixture
def no_prestart(monkeypatch: pytest.MonkeyPatch) -> None:
    """No child prestarted by warmup.start() in this process may leak into a test."""
    monkeypatch.setattr(warmup, "_prestarted", None)


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at teardown so a "hung" probe thread ends instead of lingering."""
    event = threading.Event()
    yield event
    event.set()


def with_standin_nvml(monkeypatch: pytest.MonkeyPatch, nvml: nvml_standin.NvmlStandin) -> None:
    monkeypatch.setattr(probes_pkg, "probe_nvml", lambda r: probe_nvml(r, nvml=nvml))


def test_collect_rebuilds_h200_fixture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_prestart: None
) -> None:
    """All probes on a root rebuilt from the H200 recordings, NVML from the stand-in: every
    probed section equals h200-healthy.json (the CUDA child needs the GPU and is left out)."""
    with_standin_nvml(monkeypatch, nvml_standin.h200())
    fx = facts("h200-healthy")
    got = collect(reader=h200_root(tmp_path), cuda=False)
    for name in ("kernel", "devices", "pci", "nvml", "memory"):
        assert getattr(got, name) == getattr(fx, name), name
    # Without a spec no model is looked at, and the facts now say so (the recording, from
    # before that, holds an empty list), so `check --facts` explains the skip (issue 9); and
    # so does a collect without the CUDA child.
    assert fx.models == ()
    assert got.models is None
    # The recording predates the servers probes: without a spec, no server is looked at either.
    assert got.serving is not None and not got.serving.exists
    assert got.unreadable == {
        **{k: v for k, v in fx.unreadable.items() if k not in LATER_SECTIONS},
        "models": NO_SPEC_MODELS,
        "servers": NO_SPEC_SERVERS,
        "cuda": "cuInit not probed (collect(cuda=False))",
    }
    assert [p.name for p in got.probes] == list(PROBE_NAMES[1:])
    assert all(p.outcome == "ok" for p in got.probes)


def test_collect_every_probe_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_prestart: None
) -> None:
    with_standin_nvml(monkeypatch, nvml_standin.h200())
    got = collect(reader=Reader(root=tmp_path), timeout_s=10)
    assert [p.name for p in got.probes] == list(PROBE_NAMES)
    assert PROBE_NAMES[0] == "cuda"
    recorded = {p.name for p in facts("h200-healthy").probes}
    assert recorded == set(PROBE_NAMES) - set(LATER_SECTIONS)


def test_collect_hung_probe_times_out(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    release: threading.Event,
    no_prestart: None,
) -> None:
    quick = Probe("kernel", lambda r, s: probe_kernel(r))
    # The stuck probe waits for an hour: collect() returning at all, with the probe still
    # stuck, is the proof that the deadline cut it off (no wall-clock bound to break on a busy
    # machine; pytest-timeout catches a collect() that waits).
    stuck = Probe("pci", lambda r, s: release.wait(3600))
    monkeypatch.setattr(probes_pkg, "PROBES", (quick, stuck))
    got = collect(reader=Reader(root=tmp_path), timeout_s=0.5, cuda=False)
    assert not release.is_set()
    assert "probe-pci" in {t.name for t in threading.enumerate() if t.is_alive()}
    run = {p.name: p for p in got.probes}
    assert run["kernel"].outcome == "ok"
    assert run["pci"].outcome == "timeout"
    assert run["pci"].error == "probe pci did not finish within 0.5 s"
    assert "pci" in (run["pci"].error or "")
    assert got.unreadable["pci"] == run["pci"].error
    assert got.pci is None and got.kernel is not None
    assert run["pci"].duration_s >= 0.4


def test_collect_raising_probe_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_prestart: None
) -> None:
    def boom(r: Reader, s: object) -> None:
        raise RuntimeError("boom")

    quick = Probe("kernel", lambda r, s: probe_kernel(r))
    monkeypatch.setattr(probes_pkg, "PROBES", (Probe("memory", boom), quick))
    got = collect(reader=Reader(root=tmp_path), cuda=False)
    run = {p.name: p for p in got.probes}
    assert run["memory"].outcome == "error"
    assert run["memory"].error == "RuntimeError: boom"
    assert got.unreadable["memory"] == "probe failed: RuntimeError: boom"
    assert got.memory is None
    assert run["kernel"].outcome == "ok" and got.kernel is not None


def test_collect_cuda_child_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_prestart: None
) -> None:
    # A child that sleeps for an hour: collect() returns only by killing it at the deadline.
    monkeypatch.setattr(warmup, "CUDA_CHILD", "import time\ntime.sleep(3600)\n")
    monkeypatch.setattr(probes_pkg, "PROBES", ())
    got = collect(reader=Reader(root=tmp_path), timeout_s=0.5)
    assert got.cuda is not None
    assert got.cuda.timed_out is True
    assert got.cuda.code is None
    assert got.cuda.error == "cuInit did not return within 0.5 s (driver hung?)"
    assert got.probes[0].name == "cuda" and got.probes[0].outcome == "timeout"
    assert got.unreadable["cuda"] == got.cuda.error


def _libcuda_loadable() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_libcuda_loadable(), reason="this machine has libcuda (a GPU machine)")
def test_collect_real_child_without_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_prestart: None
) -> None:
    """The real cuInit child on a machine without the driver, as recorded in nodriver-vm.json."""
    monkeypatch.setattr(probes_pkg, "PROBES", ())
    got = collect(reader=Reader(root=tmp_path), timeout_s=10)
    assert got.cuda is not None
    assert not got.cuda.timed_out and got.cuda.code is None
    assert got.cuda.error is not None and "libcuda.so.1" in got.cuda.error
    assert got.cuda.error.startswith("libcuda.so.1 not found: ")
    assert got.probes[0].outcome == "ok"
    want = facts("nodriver-vm").cuda
    assert want is not None and want.error is not None
    assert want.error.startswith("libcuda.so.1 not found: ")


def test_collect_survives_child_printing_non_object(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_prestart: None
) -> None:
    monkeypatch.setattr(warmup, "CUDA_CHILD", "print(0)\n")
    monkeypatch.setattr(probes_pkg, "PROBES", ())
    got = collect(reader=Reader(root=tmp_path), timeout_s=10)
    assert got.cuda is not None and got.cuda.error is not None


def test_recorded_fixtures_list_every_probe() -> None:
    """The recordings were made with today's registry: same names, same order, but for the
    probes added after them (serving, servers), which their facts say are not in them."""
    earlier = [n for n in PROBE_NAMES if n not in LATER_SECTIONS]
    for name in (*H200_FIXTURES, "nodriver-vm"):
        assert [p.name for p in facts(name).probes] == earlier, name
        assert all(name_ in facts(name).unreadable for name_ in LATER_SECTIONS)
