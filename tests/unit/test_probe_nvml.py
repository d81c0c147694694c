"""probes/nvml.py through a stand-in that replays the H200 (tests/unit/nvml_standin.py)."""

from __future__ import annotations

import ctypes
import dataclasses
import re

import pytest

from ct200_tools.doctor.probes.base import Reader
from ct200_tools.doctor.probes.nvml import cpus_from_mask, normalise_bus_id, probe_nvml
from ct200_tools.facts import LATER_SECTIONS, TopoLink
from tests.unit import nvml_standin
from tests.unit.probe_helpers import (
    BDF,
    facts,
    raw,
)


def test_normalise_bus_id() -> None:
    assert normalise_bus_id("00000000:00:06.0") == "0000:00:06.0"
    assert normalise_bus_id(b"00000000:00:06.0") == "0000:00:06.0"
    assert normalise_bus_id("00000000:1A:00.0") == "0000:1a:00.0"  # nvidia-smi prints upper case
    # nvidia-smi-q.xml's bus id normalises to the sysfs directory name that was recorded.
    xml_bus_id = re.search(r"<pci_bus_id>(.*?)</pci_bus_id>", raw("nvidia-smi-q.xml"))
    assert xml_bus_id is not None and normalise_bus_id(xml_bus_id.group(1)) == BDF


def test_cpus_from_mask() -> None:
    assert cpus_from_mask([0xFFFF] + [0] * 15) == tuple(range(16))
    assert cpus_from_mask((ctypes.c_ulonglong * 16)(0xFFFF)) == tuple(range(16))
    assert cpus_from_mask([0, 1 << 3]) == (67,)
    assert cpus_from_mask([1 << 63, 1]) == (63, 64)
    assert cpus_from_mask([0] * 16) == ()


def test_probe_nvml_reproduces_h200_fixture() -> None:
    fx = facts("h200-healthy")
    nvml = nvml_standin.h200()
    r = Reader()
    got = probe_nvml(r, nvml=nvml)
    assert got is not None and fx.nvml is not None
    assert got.gpus[0] == fx.nvml.gpus[0]
    assert got == fx.nvml
    assert r.unreadable == {"nvml.gpu0.retired_pages_pending": "Not Supported"}
    assert r.unreadable.items() <= fx.unreadable.items()
    assert nvml.calls[0] == "nvmlInit" and nvml.calls[-1] == "nvmlShutdown"


def test_standin_values_agree_with_nvidia_smi_xml() -> None:
    """The stand-in's H200 against nvidia-smi -q (recorded on another lease of an H200)."""
    xml = raw("nvidia-smi-q.xml")

    def tag(name: str) -> str:
        m = re.search(rf"<{name}>(.*?)</{name}>", xml)
        assert m is not None, name
        return m.group(1)

    g = nvml_standin.H200_GPU
    assert tag("product_name") == g.name
    assert tag("pci_bus_id") == g.bus_id
    assert int(tag("pci_device_id"), 16) == g.pci_device_id
    assert tag("driver_version") == nvml_standin.NvmlStandin().driver_version
    assert tag("cuda_version") == "13.0"
    assert tag("max_link_gen") == str(g.link_gen_max)
    assert tag("current_link_gen") == str(g.link_gen_current)
    assert tag("max_device_link_gen") == str(g.device_link_gen_max)
    assert tag("max_link_width") == f"{g.link_width_max}x"
    assert tag("current_link_width") == f"{g.link_width_current}x"
    assert tag("persistence_mode") == "Enabled" and g.persistence_mode == 1
    assert tag("current_ecc") == "Enabled" and tag("pending_ecc") == "Enabled"
    assert g.ecc_mode == (1, 1)
    assert tag("total") == "143771 MiB"  # FB memory is the first <total>
    assert tag("remapped_row_corr") == "0" and tag("remapped_row_unc") == "0"
    assert tag("remapped_row_pending") == "No" and tag("remapped_row_failure") == "No"
    assert tag("clocks_event_reason_gpu_idle") == "Active"
    assert xml.count("<clocks_event_reason_") - 1 == xml.count("Not Active</clocks_event_reason_")
    assert tag("pending_retirement") == "N/A"
    assert "<nvlink" not in xml


def test_standin_matches_real_pynvml_api() -> None:
    """Every function the stand-in provides exists in the installed nvidia-ml-py, and its error
    strings are pynvml's."""
    pynvml = pytest.importorskip("pynvml")
    missing = [n for n in nvml_standin.api_names() if not callable(getattr(pynvml, n, None))]
    assert missing == []
    for code in (3, 12, 15):
        assert str(nvml_standin.NVMLError(code)) == str(pynvml.NVMLError(code))
    assert pynvml.NVML_ERROR_NOT_SUPPORTED == nvml_standin.NVML_ERROR_NOT_SUPPORTED
    assert pynvml.NVML_ERROR_LIBRARY_NOT_FOUND == nvml_standin.NVML_ERROR_LIBRARY_NOT_FOUND


def test_probe_nvml_library_not_found_reproduces_nodriver_fixture() -> None:
    nvml = nvml_standin.no_driver()
    r = Reader()
    assert probe_nvml(r, nvml=nvml) is None
    recorded = facts("nodriver-vm").unreadable
    # The sections added after the recording (serving, servers) are the facts', not NVML's.
    assert r.unreadable == {k: v for k, v in recorded.items() if k not in LATER_SECTIONS}
    assert r.unreadable == {"nvml": "nvmlInit failed: NVML Shared Library Not Found"}
    assert "nvmlShutdown" not in nvml.calls


def test_probe_nvml_pair_topology_derived() -> None:
    """DERIVED (not recorded: the H200 machine had one GPU): two GPUs under one NUMA node
    (NVML_TOPOLOGY_NODE = 40), P2P read OK (0), write GPU_NOT_SUPPORTED (2)."""
    nvml = nvml_standin.derived_pair(level=40, p2p_read=0, p2p_write=2)
    r = Reader()
    got = probe_nvml(r, nvml=nvml)
    assert got is not None
    assert got.links == (TopoLink(0, 1, "NODE", "OK", "GNS"),)
    assert [g.pci_bus_id for g in got.gpus] == ["0000:00:06.0", "0000:00:07.0"]
    assert set(r.unreadable) == {f"nvml.gpu{i}.retired_pages_pending" for i in (0, 1)}


def test_probe_nvml_pair_unknown_level_derived() -> None:
    """DERIVED: a level NVML did not define and a refused P2P query keep the raw value / None."""
    nvml = nvml_standin.derived_pair(level=60, p2p_read=0, p2p_write=2)
    nvml.p2p.pop((0, 1, 1))
    r = Reader()
    got = probe_nvml(r, nvml=nvml)
    assert got is not None
    assert got.links == (TopoLink(0, 1, "?60", "OK", None),)
    assert r.unreadable["nvml.link0-1.p2p_write"] == "Not Supported"


def test_probe_nvml_older_nvidia_ml_py() -> None:
    """DERIVED: an nvidia-ml-py before 12.535 (no ClocksEventReasons, no GpuMaxPcieLink)."""
    nvml = nvml_standin.NvmlStandin(
        missing=frozenset(
            {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetGpuMaxPcieLinkGeneration"}
        )
    )
    r = Reader()
    got = probe_nvml(r, nvml=nvml)
    assert got is not None
    gpu = got.gpus[0]
    assert gpu.clocks_event_reasons == 1  # through the ThrottleReasons name
    assert gpu.device_link_gen_max is None
    assert r.unreadable["nvml.gpu0.device_link_gen_max"] == "not in this nvidia-ml-py version"
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" in nvml.calls


def test_probe_nvml_query_failure_shuts_down() -> None:
    """DERIVED: the GPU falls off the bus after nvmlInit (NVML_ERROR_GPU_IS_LOST on a required
    query): no facts, the reason, and nvmlShutdown still called."""
    nvml = nvml_standin.NvmlStandin(failing={"nvmlDeviceGetName": 15})
    r = Reader()
    assert probe_nvml(r, nvml=nvml) is None
    assert r.unreadable["nvml"] == "NVML query failed: GPU is lost"
    assert nvml.calls[-1] == "nvmlShutdown"


def test_probe_nvml_optional_field_refused() -> None:
    """DERIVED: ECC mode refused (NOT_SUPPORTED): that field is None with its reason, the rest
    stays as recorded."""
    nvml = nvml_standin.NvmlStandin(failing={"nvmlDeviceGetEccMode": 3})
    r = Reader()
    got = probe_nvml(r, nvml=nvml)
    assert got is not None and facts("h200-healthy").nvml is not None
    assert got.gpus[0] == dataclasses.replace(
        facts("h200-healthy").nvml.gpus[0],  # type: ignore[union-attr]
        ecc_mode_current=None,
    )
    assert r.unreadable["nvml.gpu0.ecc_mode"] == "Not Supported"
