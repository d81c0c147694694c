"""The doctor on a real GPU: facts against nvidia-smi, CUDA init, and real injected faults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ct200_tools.doctor.probes import collect
from ct200_tools.doctor.probes.devices import parse_proc_devices
from ct200_tools.facts import Facts
from tests.gpu import faults, nvsmi

pytestmark = pytest.mark.gpu

CUINIT = "import ctypes; print(ctypes.CDLL('libcuda.so.1').cuInit(0))"
#: cuInit, then the primary context of device 0 (as the per-GPU child): the first error, or 0.
CONTEXT = (
    "import ctypes as c; d = c.CDLL('libcuda.so.1'); r = d.cuInit(0); v = c.c_int(); "
    "r = r or d.cuDeviceGet(c.byref(v), 0); x = c.c_void_p(); "
    "r = r or d.cuDevicePrimaryCtxRetain(c.byref(x), v); "
    "r = r or d.cuDevicePrimaryCtxRelease_v2(v); print(r)"
)


@pytest.fixture(scope="module")
def facts() -> Facts:
    return collect()


@pytest.fixture(params=["per-gpu", "all"])
def mode(request: pytest.FixtureRequest) -> str:
    """The CUDA probe's mode (--cuda-init): the tests below hold in both."""
    return str(request.param)


def uvm_major() -> int:
    return parse_proc_devices(Path("/proc/devices").read_text())["nvidia-uvm"]


def nvidia_major() -> int:
    """195 on every driver so far: /dev/nvidiactl and each /dev/nvidiaN."""
    return parse_proc_devices(Path("/proc/devices").read_text())["nvidia"]


def doctor(mode: str, *args: str) -> list[str]:
    """The doctor's command line with the CUDA mode under test (--cuda-init per-gpu|all)."""
    return faults.doctor_argv(*args, "--cuda-init", mode)


def doctor_json(result: subprocess.CompletedProcess[str]) -> dict[str, dict[str, object]]:
    assert result.stdout, result.stderr
    return {c["id"]: c for c in json.loads(result.stdout)["checks"]}


def test_gpus_match_nvidia_smi(facts: Facts, smi_gpus: list[dict[str, str]]) -> None:
    assert facts.nvml is not None, facts.unreadable
    assert len(facts.nvml.gpus) == len(smi_gpus)
    for g, s in zip(facts.nvml.gpus, smi_gpus, strict=True):
        assert g.index == int(s["index"])
        assert g.name == s["name"]
        assert g.pci_bus_id == nvsmi_bus(s["pci.bus_id"])
        assert g.uuid == s["uuid"]
        assert g.memory_total_bytes is not None
        assert g.memory_total_bytes // 2**20 == int(s["memory.total"])
        assert g.link_gen_max == int(s["pcie.link.gen.max"])
        assert g.link_width_max == int(s["pcie.link.width.max"])
        assert g.persistence_mode == (s["persistence_mode"] == "Enabled")


def nvsmi_bus(bus: str) -> str:
    domain, rest = bus.lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def test_topology_and_p2p_match_nvidia_smi(facts: Facts) -> None:
    assert facts.nvml is not None
    n = len(facts.nvml.gpus)
    links = {(link.a, link.b): link for link in facts.nvml.links}
    assert len(links) == n * (n - 1) // 2
    topo = nvsmi.parse_matrix(nvsmi.run("topo", "-m"))
    p2p_r = nvsmi.parse_matrix(nvsmi.run("topo", "-p2p", "r"))
    p2p_w = nvsmi.parse_matrix(nvsmi.run("topo", "-p2p", "w"))
    assert set(topo) == set(links)
    for pair, link in links.items():
        assert link.level == topo[pair], pair
        assert link.p2p_read == p2p_r[pair], pair
        assert link.p2p_write == p2p_w[pair], pair


def test_numa_node_matches_sysfs_and_nvidia_smi(facts: Facts) -> None:
    assert facts.nvml is not None and facts.pci is not None
    pci = {p.bdf: p for p in facts.pci}
    affinity = nvsmi.parse_numa_affinity(nvsmi.run("topo", "-m"))
    for g in facts.nvml.gpus:
        raw = int(Path(f"/sys/bus/pci/devices/{g.pci_bus_id}/numa_node").read_text())
        nodes = [n for n in os.listdir("/sys/devices/system/node") if n[4:].isdigit()]
        if raw >= 0:
            assert pci[g.pci_bus_id].numa_node == raw
        elif len(nodes) == 1:  # -1 on a one-node machine: that node, as nvidia-smi says too
            assert pci[g.pci_bus_id].numa_node == int(nodes[0][4:])
        else:
            assert pci[g.pci_bus_id].numa_node is None
        shown = affinity.get(g.index)
        if shown is not None and shown.isdigit():
            assert pci[g.pci_bus_id].numa_node == int(shown)


def test_cuda_initialises(mode: str, smi_gpus: list[dict[str, str]]) -> None:
    cuda = collect(cuda_mode=mode).cuda
    assert cuda is not None
    assert cuda.code == 0, cuda
    assert cuda.device_count == len(smi_gpus)
    assert cuda.mode == mode


def test_per_gpu_children_are_nvidia_smis_gpus(smi_gpus: list[dict[str, str]]) -> None:
    """One child per GPU, in nvidia-smi's order: each opened its own GPU (the bus id CUDA
    reports is the one listed before cuInit), through its UUID, with a context."""
    cuda = collect(cuda_mode="per-gpu").cuda
    assert cuda is not None and cuda.mode == "per-gpu" and cuda.note is None, cuda
    assert len(cuda.gpus) == len(smi_gpus)
    for g, s in zip(cuda.gpus, smi_gpus, strict=True):
        assert g.index == int(s["index"])
        assert g.pci_bus_id == nvsmi_bus(s["pci.bus_id"]), (g, s)
        assert g.cuda_bus_id == g.pci_bus_id, g
        assert g.visible in (s["uuid"], s["index"]), g  # the UUID; the index where none shows
        assert g.code == 0 and g.step is None and not g.timed_out, g
        assert g.cuinit_s is not None and g.context_s is not None, g
        assert g.minor is not None and Path(f"/dev/nvidia{g.minor}").exists(), g


#: The fault policies of these tests, each as a runner of the doctor's command line.
FAULTS = ("healthy", "uvm-denied", "c195-denied", "uvm-stale")


def run_under(fault: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    if fault == "uvm-denied":
        return faults.run_denied(argv, uvm_major())
    if fault == "c195-denied":
        return faults.run_denied(argv, nvidia_major())
    if fault == "uvm-stale":
        return faults.run_with_node_replaced(argv, "/dev/nvidia-uvm", "/dev/null")
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)


@pytest.mark.parametrize("fault", FAULTS)
def test_per_gpu_and_all_gpu_modes_give_the_same_verdicts(fault: str, machine_spec: Path) -> None:
    """Issue 13: under every fault policy, both CUDA modes judge alike: the same status, root
    and fix for every check, the same exit code (a fault every GPU shares stays one root)."""
    got = {}
    for mode in ("per-gpu", "all"):
        r = run_under(fault, doctor(mode, "check", "--json", "--spec", str(machine_spec)))
        assert r.stdout, r.stderr
        doc = json.loads(r.stdout)
        got[mode] = (
            r.returncode,
            doc["root_causes"],
            {c["id"]: (c["status"], c["caused_by"], c["remediation"]) for c in doc["checks"]},
        )
    assert got["per-gpu"] == got["all"]
    assert got["all"][0] == (0 if fault == "healthy" else 2)


def test_one_gpu_node_denied_is_that_gpu(
    mode: str, machine_spec: Path, smi_gpus: list[dict[str, str]]
) -> None:
    """The cgroup denies one GPU's /dev/nvidiaN only (c 195:N; /dev/nvidiactl stays allowed):
    dev.open is the root and names the node; per GPU, gpu.cuda_init names that GPU alone."""
    last = smi_gpus[-1]
    bus = nvsmi_bus(last["pci.bus_id"])
    info = Path(f"/proc/driver/nvidia/gpus/{bus}/information").read_text()
    minor = int(next(ln for ln in info.splitlines() if ln.startswith("Device Minor")).split()[-1])
    node = f"/dev/nvidia{minor}"
    major = nvidia_major()
    # Ground truth: that GPU alone cannot start CUDA (cuInit, or its context) under the fault.
    truth = faults.run_denied(
        ["env", f"CUDA_VISIBLE_DEVICES={last['uuid']}", sys.executable, "-c", CONTEXT],
        major,
        deny_minor=minor,
    )
    assert truth.stdout.strip() not in ("", "0"), truth
    r = faults.run_denied(
        doctor(mode, "check", "--json", "--spec", str(machine_spec)), major, deny_minor=minor
    )
    assert r.returncode == 2, r.stderr
    doc = json.loads(r.stdout)
    checks = {c["id"]: c for c in doc["checks"]}
    assert "dev.open" in doc["root_causes"], doc["root_causes"]
    assert any(f"open({node}) = EPERM" in e for e in checks["dev.open"]["evidence"])
    if mode == "all":
        return  # one cuInit over every GPU cannot say which GPU: that is per-GPU mode's job
    cuda = checks["gpu.cuda_init"]
    assert cuda["status"] == "fail" and cuda["caused_by"] == "dev.open", cuda
    assert f"denies c {major}:{minor} (nvidia)" in cuda["summary"], cuda
    if len(smi_gpus) > 1:
        assert cuda["summary"].startswith(f"GPU{last['index']} {bus}: "), cuda
        others = [e for e in cuda["evidence"] if e.startswith("GPU") and bus not in e]
        assert len(others) == len(smi_gpus) - 1
        assert all(": context ok" in e for e in others), others


def test_healthy_machine_has_no_failure(mode: str, machine_spec: Path) -> None:
    r = subprocess.run(
        doctor(mode, "check", "--json", "--spec", str(machine_spec)),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    checks = doctor_json(r)
    failing = {k: v["summary"] for k, v in checks.items() if v["status"] == "fail"}
    assert failing == {}
    assert r.returncode == 0, r.stderr
    for must_pass in (
        "driver.module",
        "driver.nvml",
        "driver.versions",
        "dev.nodes",
        "dev.majors",
        "dev.open",
        "gpu.cuda_init",
        "gpu.count",
        "gpu.model",
        "gpu.pcie_link",
    ):
        assert checks[must_pass]["status"] == "pass", (must_pass, checks[must_pass])


def test_cgroup_denying_uvm_is_diagnosed(mode: str, machine_spec: Path, raw_lxc_spec: Path) -> None:
    major = uvm_major()
    # Ground truth first: the injected fault really breaks CUDA the way the incident did.
    truth = faults.run_denied([sys.executable, "-c", CUINIT], major)
    assert truth.stdout.strip() not in ("", "0"), truth
    r = faults.run_denied(doctor(mode, "check", "--json", "--spec", str(machine_spec)), major)
    assert r.returncode == 2, r.stderr
    checks = doctor_json(r)
    cuda = checks["gpu.cuda_init"]
    assert cuda["status"] == "fail"
    assert f"denies c {major}:0 (nvidia-uvm)" in str(cuda["summary"])
    assert "EPERM" in str(cuda["summary"])
    assert cuda["caused_by"] == "dev.open"
    fix = cuda["remediation"]
    assert isinstance(fix, dict)
    assert fix == checks["dev.open"]["remediation"]
    assert fix["where"] == "host"
    # Lines of the container's config (never commands to paste: issue 19's config + file).
    assert fix["file"] == "/etc/pve/lxc/200.conf" and fix["command"] is None, fix
    lines = list(fix["config"])
    for node in ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"):  # both denied, both passed through
        assert any(line.endswith(f": {node},mode=0666") for line in lines), lines
    assert checks["dev.open"]["status"] == "fail"
    assert checks["dev.majors"]["status"] == "pass"  # the node is right; the cgroup is not
    raw = doctor_json(
        faults.run_denied(doctor(mode, "check", "--json", "--spec", str(raw_lxc_spec)), major)
    )
    raw_fix = raw["gpu.cuda_init"]["remediation"]
    assert isinstance(raw_fix, dict)
    assert f"lxc.cgroup2.devices.allow: c {major}:* rwm" in raw_fix["config"], raw_fix


def test_cgroup_denying_c195_is_one_root_cause_with_one_complete_fix(
    mode: str, machine_spec: Path, raw_lxc_spec: Path, smi_gpus: list[dict[str, str]]
) -> None:
    """Issue 9: with c 195:* denied (nvidiactl and every GPU node), dev.open is the one root
    cause; cuInit and NVML failing are its consequences, carrying its fix, not leads of their
    own; and that fix passes through every denied node, so applying it once is enough. The
    denial applies to a child cgroup only: the machine's GPU still works afterwards."""
    major = nvidia_major()
    truth = faults.run_denied([sys.executable, "-c", CUINIT], major)
    assert truth.stdout.strip() not in ("", "0"), truth  # the fault really breaks CUDA
    r = faults.run_denied(doctor(mode, "check", "--json", "--spec", str(machine_spec)), major)
    assert r.returncode == 2, r.stderr
    doc = json.loads(r.stdout)
    checks = {c["id"]: c for c in doc["checks"]}
    assert doc["root_causes"] == ["dev.open"], doc["root_causes"]
    root = checks["dev.open"]
    assert root["status"] == "fail" and root["caused_by"] is None
    nodes = ["/dev/nvidiactl", *(f"/dev/nvidia{g['index']}" for g in smi_gpus)]
    for node in nodes:
        assert any(f"open({node}) = EPERM" in e for e in root["evidence"]), (node, root)
    for cid, c in checks.items():
        if c["status"] == "fail" and cid != "dev.open":
            assert c["caused_by"] == "dev.open", (cid, c)
            assert c["remediation"] == root["remediation"], cid  # no contradicting fix
    assert checks["gpu.cuda_init"]["status"] == "fail"
    assert checks["gpu.cuda_init"]["caused_by"] == "dev.open"
    assert "denies c 195:" in checks["gpu.cuda_init"]["summary"]
    assert checks["driver.nvml"]["status"] == "pass" or checks["driver.nvml"]["caused_by"] == (
        "dev.open"
    )
    fix = root["remediation"]
    assert fix["where"] == "host" and fix["tag"] == "lxc_passthrough"
    assert fix["file"] == "/etc/pve/lxc/200.conf" and fix["command"] is None, fix
    lines = list(fix["config"])
    for node in nodes:  # every denied node, numbered devK lines to paste once
        assert any(line.endswith(f": {node},mode=0666") for line in lines), (node, lines)
    assert [line.split(":")[0] for line in lines] == [f"dev{i}" for i in range(len(lines))]
    text = faults.run_denied(doctor(mode, "check", "--spec", str(machine_spec)), major)
    assert "1 root cause (" in text.stdout and "): dev.open" in text.stdout, text.stdout
    assert "(because of dev.open)" in text.stdout
    assert "read the host's kernel log" not in text.stdout  # the wrong lead of issue 9
    raw = json.loads(
        faults.run_denied(
            doctor(mode, "check", "--json", "--spec", str(raw_lxc_spec)), major
        ).stdout
    )
    raw_fix = next(c for c in raw["checks"] if c["id"] == "dev.open")["remediation"]
    assert f"lxc.cgroup2.devices.allow: c {major}:* rwm" in raw_fix["config"], raw_fix
    # The denial stayed in its cgroup: the machine's GPU works as before.
    after = subprocess.run(
        [sys.executable, "-c", CUINIT], capture_output=True, text=True, check=False, timeout=120
    )
    assert after.stdout.strip() == "0", after


def test_stale_uvm_node_is_diagnosed(mode: str, machine_spec: Path) -> None:
    major = uvm_major()
    truth = faults.run_with_node_replaced(
        [sys.executable, "-c", CUINIT], "/dev/nvidia-uvm", "/dev/null"
    )
    assert truth.stdout.strip() not in ("", "0"), truth
    r = faults.run_with_node_replaced(
        doctor(mode, "check", "--json", "--spec", str(machine_spec)),
        "/dev/nvidia-uvm",
        "/dev/null",
    )
    assert r.returncode == 2, r.stderr
    checks = doctor_json(r)
    assert checks["dev.majors"]["status"] == "fail"
    want = f"/dev/nvidia-uvm is c 1:3 but /proc/devices gives nvidia-uvm major {major}"
    assert any(want in e for e in checks["dev.majors"]["evidence"])  # type: ignore[union-attr]
    assert checks["gpu.cuda_init"]["status"] == "fail"
    assert want in str(checks["gpu.cuda_init"]["summary"])


def test_snapshot_judged_elsewhere_gives_same_findings(
    mode: str, machine_spec: Path, tmp_path: Path
) -> None:
    snap = subprocess.run(
        doctor(mode, "snapshot", "--spec", str(machine_spec)),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    path = tmp_path / "facts.json"
    path.write_text(snap.stdout)
    live = doctor_json(
        subprocess.run(
            doctor(mode, "check", "--json", "--spec", str(machine_spec)),
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
    )
    saved = doctor_json(
        subprocess.run(
            faults.doctor_argv(
                "check", "--json", "--spec", str(machine_spec), "--facts", str(path)
            ),
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
            env={**os.environ},
        )
    )
    assert {k: v["status"] for k, v in live.items()} == {k: v["status"] for k, v in saved.items()}
