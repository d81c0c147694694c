"""The two-GPU H200 machine (nvidia-h200-x2, NVLink NV18), recorded there, kept covered in CI:
the doctor's topology and P2P letters equal nvidia-smi's recorded on the same run."""

from __future__ import annotations

from pathlib import Path

from ct200_tools.doctor.checks import run_checks
from ct200_tools.facts import Facts, loads
from ct200_tools.spec import SiteSpec, validate
from tests.gpu import nvsmi

FIX = Path(__file__).parents[1] / "fixtures"
RAW = FIX / "raw" / "h200x2"


def facts(name: str) -> Facts:
    return loads((FIX / "facts" / f"h200x2-{name}.json").read_text())


def spec(group: list[int], numa: list[list[int]] | None = None) -> SiteSpec:
    gpus: dict[str, object] = {"count": 2, "model": "H200"}
    if numa is not None:
        gpus["numa"] = numa
    return validate(
        {
            "gpus": gpus,
            "models": [{"name": "m", "source": "/var/tmp/m", "staged": "/dev/shm/m"}],
            "servers": [
                {"name": "tp", "engine": "sglang", "model": "m", "gpus": group, "port": 30000}
            ],
        }
    )


def test_recorded_letters_equal_nvidia_smi() -> None:
    f = facts("healthy")
    assert f.nvml is not None
    links = {(x.a, x.b): x for x in f.nvml.links}
    topo = nvsmi.parse_matrix((RAW / "topo_m.txt").read_text())
    p2p_r = nvsmi.parse_matrix((RAW / "topo_p2p_r.txt").read_text())
    p2p_w = nvsmi.parse_matrix((RAW / "topo_p2p_w.txt").read_text())
    assert topo == {(0, 1): "NV18"}
    assert {k: v.level for k, v in links.items()} == topo
    assert {k: v.p2p_read for k, v in links.items()} == p2p_r
    assert {k: v.p2p_write for k, v in links.items()} == p2p_w


def test_numa_nodes_equal_recorded_sysfs() -> None:
    f = facts("healthy")
    assert f.pci is not None
    for p in f.pci:
        raw = int((RAW / f"sysfs_{p.bdf.replace(':', '_')}_numa_node.txt").read_text())
        # -1 on this one-node VM: the doctor reports that one node, as nvidia-smi does.
        assert p.numa_node == (raw if raw >= 0 else 0)


def test_tp2_group_passes_topology_checks() -> None:
    got = {x.id: x for x in run_checks(facts("healthy"), spec([0, 1]))}
    assert got["topo.tp_numa"].status == "pass"
    assert got["topo.p2p"].status == "pass"
    assert "GPU0-GPU1 NV18 read=OK write=OK" in " ".join(got["topo.p2p"].evidence)
    assert got["gpu.count"].status == "pass"


def test_spec_claiming_two_nodes_is_told_the_truth() -> None:
    got = {x.id: x for x in run_checks(facts("healthy"), spec([0, 1], numa=[[0], [1]]))}
    assert got["topo.numa_layout"].status == "warn"
    assert "GPU1: spec says node 1, sysfs says 0" in got["topo.numa_layout"].evidence


def test_two_gpu_uvm_denied_names_the_fix() -> None:
    got = {x.id: x for x in run_checks(facts("uvm-denied"), spec([0, 1]))}
    assert got["gpu.cuda_init"].status == "fail"
    assert "denies c 238:0 (nvidia-uvm)" in got["gpu.cuda_init"].summary
