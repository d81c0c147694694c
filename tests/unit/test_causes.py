"""Root causes (checks/causes.py): one fault, one root, one fix.

Judged on facts recorded on the real H200 (uvm denied, c 195 denied, stale uvm node, no
driver), the CT200 cases derived from them, their per-GPU versions (pergpu-*, derived by
tests/fixtures/derive_per_gpu.py), and faults derived here from the healthy recording with each
edit spelled out (named `derived: ...`). Every rule of the table links in
at least one case, and the cases where a rule must not link are tested too.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from ct200_tools.doctor.checks import run_checks
from ct200_tools.doctor.checks.base import Finding
from ct200_tools.doctor.checks.causes import CAUSES
from ct200_tools.doctor.checks.tune import JUDGES
from ct200_tools.doctor.probes.cuda import summarise
from ct200_tools.doctor.report import Exit, Header, exit_code, render_text, root_causes
from ct200_tools.facts import CudaFacts, DevNode, Facts, loads
from ct200_tools.spec import SiteSpec, TuningSpec, load_spec
from ct200_tools.tunings import TUNINGS, Tuning
from tests.unit import host_helpers as hh
from tests.unit import server_facts as sf

ROOT = Path(__file__).parents[2]
FACTS = ROOT / "tests" / "fixtures" / "facts"
SPECS = {
    "ct200": ROOT / "inventory" / "ct200",
    "h200": ROOT / "benchmarks" / "doctor" / "h200-site.yml",
    "h200x2": ROOT / "benchmarks" / "doctor" / "h200x2-site.yml",
    "llama-cpu": sf.LLAMA_SPEC,
}


@functools.cache
def recorded(name: str) -> Facts:
    return loads((FACTS / f"{name}.json").read_text())


@functools.cache
def spec(name: str) -> SiteSpec:
    return load_spec(SPECS[name])


# -- derived faults: each a few edits of the healthy H200 recording ---------------------------
def _nodes(f: Facts, edit: Callable[[DevNode], DevNode]) -> Facts:
    assert f.devices is not None
    nodes = tuple(edit(n) for n in f.devices.nodes)
    return dataclasses.replace(f, devices=dataclasses.replace(f.devices, nodes=nodes))


def _gone(*paths: str) -> Callable[[DevNode], DevNode]:
    def edit(n: DevNode) -> DevNode:
        if n.path in paths:
            return DevNode(n.path, exists=False)
        return n

    return edit


def _cuda(f: Facts, code: int, name: str) -> Facts:
    assert f.cuda is not None
    return dataclasses.replace(
        f, cuda=dataclasses.replace(f.cuda, code=code, name=name, device_count=None)
    )


def _no_nvml(f: Facts, why: str) -> Facts:
    return dataclasses.replace(f, nvml=None, unreadable={**f.unreadable, "nvml": why})


def module_unloaded(f: Facts) -> Facts:
    """derived: the host booted without the nvidia module: no version file, no majors, no
    nodes, NVML "Driver Not Loaded", cuInit 100 (GPUs still on the PCI bus)."""
    assert f.kernel is not None and f.devices is not None
    f = dataclasses.replace(
        f,
        kernel=dataclasses.replace(f.kernel, nvidia_module_version=None),
        devices=dataclasses.replace(
            f.devices, majors={k: v for k, v in f.devices.majors.items() if "nvidia" not in k}
        ),
    )
    f = _nodes(f, _gone(*(n.path for n in f.devices.nodes if n.path.startswith("/dev/nvidia"))))
    return _cuda(_no_nvml(f, "nvmlInit failed: Driver Not Loaded"), 100, "CUDA_ERROR_NO_DEVICE")


def uvm_unloaded(f: Facts) -> Facts:
    """derived: nvidia loaded, nvidia_uvm not (a headless host at boot): no nvidia-uvm in
    /proc/devices, no uvm nodes, cuInit 999."""
    assert f.devices is not None
    majors = {k: v for k, v in f.devices.majors.items() if k != "nvidia-uvm"}
    f = dataclasses.replace(f, devices=dataclasses.replace(f.devices, majors=majors))
    f = _nodes(f, _gone("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"))
    return _cuda(f, 999, "CUDA_ERROR_UNKNOWN")


def uvm_node_missing(f: Facts) -> Facts:
    """derived: nvidia_uvm loaded but its node never made (no nvidia-modprobe -u): cuInit 999."""
    return _cuda(_nodes(f, _gone("/dev/nvidia-uvm")), 999, "CUDA_ERROR_UNKNOWN")


def ctl_missing(f: Facts) -> Facts:
    """derived: /dev/nvidiactl not passed through: NVML and cuInit fail as with c 195 denied."""
    f = _nodes(f, _gone("/dev/nvidiactl"))
    return _cuda(_no_nvml(f, "nvmlInit failed: Unknown Error"), 100, "CUDA_ERROR_NO_DEVICE")


def ctl_stale(f: Facts) -> Facts:
    """derived: /dev/nvidiactl is c 1:3 (a leftover node), as the recorded stale uvm node."""

    def edit(n: DevNode) -> DevNode:
        return dataclasses.replace(n, major=1, minor=3) if n.path == "/dev/nvidiactl" else n

    f = _nodes(f, edit)
    return _cuda(_no_nvml(f, "nvmlInit failed: Unknown Error"), 999, "CUDA_ERROR_UNKNOWN")


def versions_differ(f: Facts) -> Facts:
    """derived: a container's userspace driver older than the host module: cuInit 803."""
    assert f.nvml is not None
    f = dataclasses.replace(f, nvml=dataclasses.replace(f.nvml, driver_version="575.51.03"))
    return _cuda(f, 803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH")


def nvml_library_missing(f: Facts) -> Facts:
    """derived: the uvm-denied recording where NVML's library is not installed either: two
    faults, so two roots (a missing library is no node's fault)."""
    return _no_nvml(f, "nvmlInit failed: NVML Shared Library Not Found")


def cuda_timed_out(f: Facts) -> Facts:
    """derived: the uvm-denied recording where cuInit hung: a hang is not what a denied node
    does, so gpu.cuda_init stays a root of its own."""
    return dataclasses.replace(
        f, cuda=CudaFacts(timed_out=True, duration_s=10.0, error="cuInit did not return")
    )


@dataclass(frozen=True)
class Case:
    facts: str
    spec: str | None
    roots: tuple[str, ...]
    #: Every failing consequence and its root.
    links: dict[str, str]
    edit: Callable[[Facts], Facts] = lambda f: f

    def run(self) -> list:  # type: ignore[type-arg]
        return run_checks(self.edit(recorded(self.facts)), spec(self.spec) if self.spec else None)


CASES = {
    "h200-uvm-denied": Case(
        "h200-uvm-denied", "h200", ("dev.open",), {"gpu.cuda_init": "dev.open"}
    ),
    "h200x2-uvm-denied": Case(
        "h200x2-uvm-denied", "h200x2", ("dev.open",), {"gpu.cuda_init": "dev.open"}
    ),
    "h200-c195-denied": Case(
        "h200-c195-denied",
        "h200",
        ("dev.open",),
        {"driver.nvml": "dev.open", "gpu.cuda_init": "dev.open"},
    ),
    "ct200-ct-c195-denied": Case(
        "ct200-ct-c195-denied",
        "ct200",
        ("dev.open",),
        {"driver.nvml": "dev.open", "gpu.cuda_init": "dev.open"},
    ),
    "h200-uvm-stale": Case(
        "h200-uvm-stale", "h200", ("dev.majors",), {"gpu.cuda_init": "dev.majors"}
    ),
    "h200x2-uvm-stale": Case(
        "h200x2-uvm-stale", "h200x2", ("dev.majors",), {"gpu.cuda_init": "dev.majors"}
    ),
    "ct200-ct-incident": Case(
        "ct200-ct-incident", "ct200", ("dev.open", "models.staged"), {"gpu.cuda_init": "dev.open"}
    ),
    "nodriver-vm": Case(
        "nodriver-vm",
        None,
        ("driver.module",),
        {"driver.nvml": "driver.module", "gpu.cuda_init": "driver.module"},
    ),
    "nodriver-vm-with-spec": Case(
        "nodriver-vm",
        "h200",
        ("driver.module",),
        {
            "driver.nvml": "driver.module",
            "gpu.cuda_init": "driver.module",
            "gpu.count": "driver.module",
        },
    ),
    "derived-module-unloaded": Case(
        "h200-healthy",
        "h200",
        ("driver.module",),
        {"driver.nvml": "driver.module", "gpu.cuda_init": "driver.module"},
        module_unloaded,
    ),
    "derived-uvm-unloaded": Case(
        "h200-healthy",
        "h200",
        ("dev.majors",),
        {"dev.nodes": "dev.majors", "gpu.cuda_init": "dev.majors"},
        uvm_unloaded,
    ),
    "derived-uvm-node-missing": Case(
        "h200-healthy", "h200", ("dev.nodes",), {"gpu.cuda_init": "dev.nodes"}, uvm_node_missing
    ),
    "derived-ctl-missing": Case(
        "h200-healthy",
        "h200",
        ("dev.nodes",),
        {"driver.nvml": "dev.nodes", "gpu.cuda_init": "dev.nodes"},
        ctl_missing,
    ),
    "derived-ctl-stale": Case(
        "h200-healthy",
        "h200",
        ("dev.majors",),
        {"driver.nvml": "dev.majors", "gpu.cuda_init": "dev.majors"},
        ctl_stale,
    ),
    "derived-versions-differ": Case(
        "h200-healthy",
        "h200",
        ("driver.versions",),
        {"gpu.cuda_init": "driver.versions"},
        versions_differ,
    ),
    "derived-nvml-library-missing": Case(
        "h200-uvm-denied",
        "h200",
        ("driver.nvml", "dev.open"),
        {"gpu.cuda_init": "dev.open"},
        nvml_library_missing,
    ),
    "derived-cuda-timed-out": Case(
        "h200-uvm-denied", "h200", ("dev.open", "gpu.cuda_init"), {}, cuda_timed_out
    ),
    # The llama server's recordings on the healthy H200's GPU sections (server_facts.on_h200),
    # its unit as recorded on a testbed machine: only the server's own faults fail.
    "derived-server-gate-cuda": Case(
        "llama-cpu-stopped",
        "llama-cpu",
        ("gpu.cuda_init",),
        {"server.unit": "gpu.cuda_init", "server.port": "gpu.cuda_init"},
        sf.chain(sf.on_h200, sf.cuda_hung, sf.with_unit("fail")),
    ),
    "derived-server-gate-not-staged": Case(
        "llama-cpu-stopped",
        "llama-cpu",
        ("models.staged",),
        {"server.unit": "models.staged", "server.port": "models.staged"},
        sf.chain(sf.on_h200, sf.not_staged, sf.with_unit("fail")),
    ),
    # /dev/shm too small (issue 19's fault matrix): restaging, models.staged's own fix, fails
    # the same way; the remount is the one fix.
    "derived-server-gate-shm-too-small": Case(
        "llama-cpu-stopped",
        "llama-cpu",
        ("mem.shm",),
        {"models.staged": "mem.shm", "server.unit": "mem.shm", "server.port": "mem.shm"},
        sf.chain(sf.on_h200, sf.not_staged, sf.shm_too_small, sf.with_unit("fail")),
    ),
    "derived-server-gate-no-engine": Case(
        "llama-cpu-stopped",
        "llama-cpu",
        ("server.engine",),
        {"server.unit": "server.engine", "server.port": "server.engine"},
        sf.chain(sf.on_h200, sf.no_engine, sf.with_unit("fail")),
    ),
    "derived-server-gate-port-taken": Case(
        "llama-cpu-serving",
        "llama-cpu",
        ("server.port_free",),
        {"server.unit": "server.port_free"},
        sf.chain(sf.on_h200, sf.with_unit("fail")),
    ),
    "derived-server-stopped": Case(
        "llama-cpu-stopped",
        "llama-cpu",
        ("server.unit",),
        {"server.port": "server.unit"},
        sf.chain(sf.on_h200, sf.with_unit("dead")),
    ),
    # Issue 33: the port moved in the unit and the process still runs the old one: the
    # silent port's cause is the older configuration, whose fix (the restart) it carries.
    "derived-server-older-configuration-port-silent": Case(
        "llama-cpu-stopped",
        "llama-cpu",
        ("server.unit",),
        {"server.port": "server.unit"},
        sf.chain(sf.on_h200, sf.with_unit("ok"), sf.older_configuration),
    ),
    "derived-server-port-answered-by-another": Case(
        "llama-cpu-serving",
        "llama-cpu",
        ("server.port_free",),
        {"server.models": "server.port_free", "server.generate": "server.port_free"},
        sf.chain(sf.on_h200, sf.serves("other"), sf.generation_timed_out),
    ),
}


def uvm_tools_denied(f: Facts) -> Facts:
    """derived: on top of a per-GPU fault of one GPU, the cgroup also denies
    /dev/nvidia-uvm-tools (which cuInit does not open, so the other GPUs still start): two
    faults, two roots; the node problem explains no single GPU failing beside healthy ones."""

    def edit(n: DevNode) -> DevNode:
        return dataclasses.replace(n, open_errno=1) if n.path == "/dev/nvidia-uvm-tools" else n

    return _nodes(f, edit)


def gpu5_node_missing(f: Facts) -> Facts:
    """derived: on top of GPU3 fallen off the bus, /dev/nvidia5 is not passed through and GPU5's
    child gets 100 CUDA_ERROR_NO_DEVICE (as derive_per_gpu.gpu_node_missing does for GPU3): two
    faults, two roots; GPU5 is dev.nodes', GPU3 alone gpu.cuda_init's."""
    assert f.cuda is not None
    gpus = tuple(
        dataclasses.replace(
            g, code=100, name="CUDA_ERROR_NO_DEVICE", step="cuInit", cuda_bus_id=None
        )
        if g.index == 5
        else g
        for g in f.cuda.gpus
    )
    f = dataclasses.replace(f, cuda=summarise(gpus, f.cuda.driver_version))
    return _nodes(f, _gone("/dev/nvidia5"))


#: Per-GPU mode (tests/fixtures/derive_per_gpu.py): a fault every GPU shares is still ONE root
#: cause with the same links as the one all-GPU cuInit, however many GPUs fail with it; a fault
#: of one GPU is that GPU (or its own node).
PER_GPU_CASES = {
    f"pergpu-{name}": dataclasses.replace(CASES[name], facts=f"pergpu-{CASES[name].facts}")
    for name in (
        "h200-uvm-denied",
        "h200x2-uvm-denied",
        "h200-c195-denied",
        "ct200-ct-c195-denied",
        "h200-uvm-stale",
        "h200x2-uvm-stale",
        "ct200-ct-incident",
    )
}
PER_GPU_CASES |= {
    "pergpu-ct200-ct-gpu-lost": Case(
        "pergpu-ct200-ct-gpu-lost", "ct200", ("gpu.cuda_init",), {"gpu.count": "gpu.cuda_init"}
    ),
    "pergpu-ct200-ct-gpu-hung": Case(
        "pergpu-ct200-ct-gpu-hung", "ct200", ("gpu.cuda_init",), {"gpu.count": "gpu.cuda_init"}
    ),
    "pergpu-ct200-ct-gpu-node-missing": Case(
        "pergpu-ct200-ct-gpu-node-missing",
        "ct200",
        ("dev.nodes",),
        {"gpu.cuda_init": "dev.nodes", "gpu.count": "dev.nodes"},
    ),
    "derived-pergpu-gpu-lost-and-gpu5-node-missing": Case(
        "pergpu-ct200-ct-gpu-lost",
        "ct200",
        ("dev.nodes", "gpu.cuda_init"),
        {"gpu.count": "gpu.cuda_init"},
        gpu5_node_missing,
    ),
    "derived-pergpu-gpu-lost-and-uvm-tools-denied": Case(
        "pergpu-ct200-ct-gpu-lost",
        "ct200",
        ("dev.open", "gpu.cuda_init"),
        {"gpu.count": "gpu.cuda_init"},
        uvm_tools_denied,
    ),
}
CASES |= PER_GPU_CASES


# -- the host's side (check --host): the container's failures point at what the host shows ----
H200_HOST = hh.HostCase(gpus=("0000:00:06.0",), uvm=238, acs="none", conf_text=hh.DEVN)


def _then_host(
    edit: Callable[[Facts], Facts], case: hh.HostCase, name: str = "h200"
) -> Callable[[Facts], Facts]:
    return lambda f: hh.with_host(edit(f), case, spec(name))


#: DERIVED: the devN config without its /dev/nvidia-uvm entry.
DEVN_NO_UVM = "".join(
    line for line in hh.DEVN.splitlines(keepends=True) if "/dev/nvidia-uvm," not in line
)

HOST_CASES = {
    # The incident, with the host read: the stale allow rule is the root, not dev.open.
    "derived-host-incident": Case(
        "ct200-ct-incident",
        "ct200",
        ("lxc.majors", "models.staged"),
        {"dev.open": "lxc.majors", "gpu.cuda_init": "lxc.majors"},
        hh.on(),
    ),
    "derived-host-uvm-unloaded": Case(
        "h200-healthy",
        "h200",
        ("host.nodes",),
        {"dev.majors": "host.nodes", "dev.nodes": "host.nodes", "gpu.cuda_init": "host.nodes"},
        _then_host(uvm_unloaded, dataclasses.replace(H200_HOST, uvm=None)),
    ),
    "derived-host-module-unloaded": Case(
        "h200-healthy",
        "h200",
        ("host.nodes",),
        {"driver.module": "host.nodes", "driver.nvml": "host.nodes", "gpu.cuda_init": "host.nodes"},
        _then_host(module_unloaded, dataclasses.replace(H200_HOST, nvidia=False, module=None)),
    ),
    "derived-host-uvm-node-missing": Case(
        "h200-healthy",
        "h200",
        ("host.nodes",),
        {"dev.nodes": "host.nodes", "gpu.cuda_init": "host.nodes"},
        _then_host(uvm_node_missing, dataclasses.replace(H200_HOST, missing=("/dev/nvidia-uvm",))),
    ),
    "derived-uvm-not-passed": Case(
        "h200-healthy",
        "h200",
        ("lxc.nodes",),
        {"dev.nodes": "lxc.nodes", "gpu.cuda_init": "lxc.nodes"},
        _then_host(uvm_node_missing, dataclasses.replace(H200_HOST, conf_text=DEVN_NO_UVM)),
    ),
    "derived-host-versions-differ": Case(
        "h200-healthy",
        "h200",
        ("host.driver",),
        {"driver.versions": "host.driver", "gpu.cuda_init": "host.driver"},
        _then_host(versions_differ, H200_HOST),
    ),
    "derived-host-drift": Case(
        "ct200-host-drift",
        "ct200",
        ("host.numa_balancing", "host.pcie_mrrs"),
        {"tune.pcie_mrrs": "host.pcie_mrrs", "tune.numa_balancing": "host.numa_balancing"},
        hh.on(hh.HostCase(conf_text=hh.DEVN, mrrs_code=2, numa_balancing=1)),
    ),
}
CASES |= HOST_CASES


@pytest.mark.parametrize("name", CASES)
def test_one_root_per_fault_and_the_roots_fix(name: str) -> None:
    case = CASES[name]
    findings = case.run()
    got = {f.id: f for f in findings}
    assert root_causes(findings) == list(case.roots)
    failing = {f.id: f.caused_by for f in findings if f.status == "fail" and f.caused_by}
    assert failing == case.links
    for effect, root in case.links.items():
        # A consequence carries its root's fix: never one of its own that leads elsewhere.
        assert got[effect].remediation == got[root].remediation, effect
        assert got[root].caused_by is None
    for f in findings:  # every blocked skip points at a root, never at a consequence
        if f.status == "skip" and f.caused_by:
            assert f.caused_by in case.roots, f
    assert exit_code(findings) == Exit.FAILURES


def drift(t: Tuning) -> list[Finding]:
    """A tuning read generically (sysfs, or a sysctl without a fact of its own) wrong both in
    the container and on the host (ct200-ct-with-host.json, at another of its values than the
    spec's): the run's findings."""
    f = recorded("ct200-ct-with-host")
    assert f.kernel is not None and f.host is not None and f.host.kernel is not None
    want, other = t.values[0], t.values[1]
    items = {t.sysctl: str(other)} if t.sysctl else {"item0": str(other), "item1": str(other)}
    wrong = {t.key: items}
    f = dataclasses.replace(
        f,
        kernel=dataclasses.replace(f.kernel, tunings=wrong),
        host=dataclasses.replace(f.host, kernel=dataclasses.replace(f.host.kernel, tunings=wrong)),
    )
    values = {**spec("ct200").tuning.plain(), t.key: want}
    site = dataclasses.replace(spec("ct200"), tuning=TuningSpec(tuple(values.items())))
    return run_checks(f, site)


#: The tunings judged by their kind's generic judgement from kernel.tunings: their rules need
#: no case of their own.
GENERIC = [t for t in TUNINGS if t.key not in JUDGES and t.fact is None]


@pytest.mark.parametrize("t", GENERIC, ids=[t.key for t in GENERIC])
def test_a_tuning_wrong_on_the_host_is_the_containers_root(t: Tuning) -> None:
    got = {f.id: f for f in drift(t)}
    here, host = got[f"tune.{t.check}"], got[f"host.{t.check}"]
    assert (here.status, host.status) == ("fail", "fail"), (here, host)
    assert host.caused_by is None and here.caused_by == f"host.{t.check}"
    assert here.remediation == host.remediation and host.remediation is not None
    assert host.remediation.where == "host"


def test_every_rule_links_in_some_case() -> None:
    """The table is data: each rule is shown to link, on recorded or derived facts."""
    linked = {
        (f.id, f.caused_by)
        for findings in [*(case.run() for case in CASES.values()), *map(drift, GENERIC)]
        for f in findings
        if f.status == "fail" and f.caused_by
    }
    # A link through a chain names the end root; rules whose root is itself a consequence
    # there (dev.nodes <- dev.majors) show as the direct pair in the chain's own case.
    assert {(c.effect, c.root) for c in CAUSES} <= linked | {("dev.nodes", "dev.majors")}
    assert ("dev.nodes", "dev.majors") in linked


def test_c195_denied_fix_passes_every_denied_node_through(ct200: SiteSpec) -> None:
    got = {f.id: f for f in CASES["ct200-ct-c195-denied"].run()}
    root = got["dev.open"]
    denied = ["/dev/nvidiactl", *(f"/dev/nvidia{i}" for i in range(8))]
    for node in denied:
        assert any(f"open({node}) = EPERM" in e for e in root.evidence), node
    assert root.remediation is not None
    assert list(root.remediation.config) == [
        *(f"dev{i}: /dev/nvidia{i},mode=0666" for i in range(8)),
        "dev8: /dev/nvidiactl,mode=0666",
        "dev9: /dev/nvidia-uvm,mode=0666",
        "dev10: /dev/nvidia-uvm-tools,mode=0666",
    ]
    raw = dataclasses.replace(ct200, pve=dataclasses.replace(ct200.pve, passthrough="raw-lxc"))
    raw_got = {f.id: f for f in run_checks(recorded("ct200-ct-c195-denied"), raw)}
    fix = raw_got["dev.open"].remediation
    assert fix is not None and fix.config == ("lxc.cgroup2.devices.allow: c 195:* rwm",)
    assert raw_got["driver.nvml"].remediation == fix


def _text(case: str) -> list[str]:
    c = CASES[case]
    f = c.edit(recorded(c.facts))
    out = render_text(c.run(), Header(f, c.spec))
    return out.splitlines()


def test_text_puts_consequences_under_their_root() -> None:
    lines = _text("h200-c195-denied")
    marks = [line for line in lines if "[✗]" in line]
    assert [m.split()[1] if not m.startswith(" ") else "  " + m.split()[1] for m in marks] == [
        "dev.open",
        "  driver.nvml",
        "  gpu.cuda_init",
    ]
    assert marks[1].startswith("    [✗] driver.nvml")
    assert marks[1].endswith(
        "NVML unavailable: nvmlInit failed: Unknown Error (because of dev.open)"
    )
    assert "(because of dev.open)" in marks[2]
    # One fix, the root's; not the consequence's "read the host's kernel log".
    assert sum(1 for line in lines if "→ fix" in line) == 1
    assert not any("kernel log" in line for line in lines)
    assert "1 root cause (3 failed checks): dev.open" in lines


@pytest.fixture(scope="module")
def ct200() -> SiteSpec:
    return spec("ct200")


@pytest.mark.parametrize("name", [n for n in PER_GPU_CASES if n.removeprefix("pergpu-") in CASES])
def test_per_gpu_and_all_gpu_modes_judge_a_shared_fault_alike(name: str) -> None:
    """Every GPU failing with the same fault: the same statuses, links and fixes as the one
    all-GPU cuInit, so eight failing GPUs are still one root cause with one fix."""
    per_gpu, whole = CASES[name].run(), CASES[name.removeprefix("pergpu-")].run()
    assert [(f.id, f.status, f.caused_by, f.remediation) for f in per_gpu] == [
        (f.id, f.status, f.caused_by, f.remediation) for f in whole
    ]
    got = {f.id: f for f in per_gpu}
    want = {f.id: f for f in whole}
    assert got["gpu.cuda_init"].summary.startswith(want["gpu.cuda_init"].summary.split(":")[0])


def test_ct200_c195_denied_per_gpu_is_one_root_not_eight() -> None:
    findings = CASES["pergpu-ct200-ct-c195-denied"].run()
    assert root_causes(findings) == ["dev.open"]
    cuda = next(f for f in findings if f.id == "gpu.cuda_init")
    assert cuda.summary.startswith("cuInit returned 100 CUDA_ERROR_NO_DEVICE on every GPU: ")
    assert (
        sum(1 for e in cuda.evidence if e.endswith("cuInit returned 100 CUDA_ERROR_NO_DEVICE")) == 8
    )


def test_two_gpus_failing_for_two_reasons_are_two_roots() -> None:
    got = {f.id: f for f in CASES["derived-pergpu-gpu-lost-and-gpu5-node-missing"].run()}
    cuda = got["gpu.cuda_init"]
    assert cuda.summary.startswith(
        "GPU3 0000:61:00.0: cuInit returned 999 CUDA_ERROR_UNKNOWN, while 6 other GPUs started;"
    )
    assert "GPU5" not in cuda.summary  # its own node explains it: dev.nodes names it
    assert got["dev.nodes"].evidence[0] == "/dev/nvidia5 does not exist"
