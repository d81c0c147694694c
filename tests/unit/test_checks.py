"""Checks judged on facts recorded on real machines (and the CT200 cases derived from them)."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ct200_tools import checks as checks_pkg
from ct200_tools.checks import (
    BY_ID,
    CHECK_IDS,
    CHECKS,
    SelectionError,
    UnknownCheckError,
    run_checks,
    select,
)
from ct200_tools.checks.base import Check, Context, Finding, Outcome, run_check
from ct200_tools.docs import render
from ct200_tools.facts import Facts, RemappedRows, StagedTreeFacts, loads
from ct200_tools.report import Exit, exit_code, root_causes
from ct200_tools.spec import SiteSpec, load_spec
from tests.fixtures import derive_ct200
from tests.unit import host_helpers as hh
from tests.unit import server_facts as sf

FIX = Path(__file__).parents[1] / "fixtures"
ROOT = Path(__file__).parents[2]


def facts(name: str) -> Facts:
    return loads((FIX / "facts" / f"{name}.json").read_text())


def by_id(findings: list[Finding]) -> dict[str, Finding]:
    return {f.id: f for f in findings}


@pytest.fixture(scope="module")
def ct200() -> SiteSpec:
    return load_spec(ROOT / "inventory" / "ct200")


@pytest.fixture(scope="module")
def h200() -> SiteSpec:
    return load_spec(ROOT / "benchmarks" / "doctor" / "h200-site.yml")


def with_servers(spec: SiteSpec, enabled: set[str]) -> SiteSpec:
    servers = tuple(dataclasses.replace(s, enabled=s.name in enabled) for s in spec.servers)
    return dataclasses.replace(spec, servers=servers)


def test_fixtures_are_current() -> None:
    for name, f in derive_ct200.derived().items():
        assert loads((FIX / "facts" / name).read_text()) == f, f"regenerate {name}"


def test_recorded_healthy_h200_has_no_failure(h200: SiteSpec) -> None:
    got = by_id(run_checks(facts("h200-healthy"), h200))
    assert {k: f.summary for k, f in got.items() if f.status == "fail"} == {}
    for cid in (
        "driver.module",
        "driver.versions",
        "dev.nodes",
        "dev.majors",
        "dev.open",
        "gpu.cuda_init",
        "gpu.count",
        "gpu.model",
        "gpu.pcie_link",
    ):
        assert got[cid].status == "pass", got[cid]
    assert exit_code(list(got.values())) == Exit.OK


H200_BLOCK = [
    "dev0: /dev/nvidia0,mode=0666",
    "dev1: /dev/nvidiactl,mode=0666",
    "dev2: /dev/nvidia-uvm,mode=0666",
    "dev3: /dev/nvidia-uvm-tools,mode=0666",
]


def test_recorded_uvm_denied_names_cgroup_and_fix(h200: SiteSpec) -> None:
    got = by_id(run_checks(facts("h200-uvm-denied"), h200))
    cuda = got["gpu.cuda_init"]
    assert cuda.status == "fail"
    assert "denies c 238:0 (nvidia-uvm)" in cuda.summary
    assert "EPERM" in cuda.summary
    assert cuda.caused_by == "dev.open"
    assert cuda.remediation is not None
    assert cuda.remediation == got["dev.open"].remediation  # the root's fix, not its own
    # The H200 machine reads as a container (/.dockerenv): the fix goes to the host config.
    assert cuda.remediation.where == "host"
    # Both uvm nodes are denied: the block passes every node through, numbered to paste once.
    assert cuda.remediation.command is not None
    assert cuda.remediation.command.splitlines() == H200_BLOCK
    assert cuda.remediation.tag == "lxc_passthrough"
    assert got["dev.open"].status == "fail"
    assert got["dev.majors"].status == "pass"
    raw = dataclasses.replace(h200, pve=dataclasses.replace(h200.pve, passthrough="raw-lxc"))
    fix = by_id(run_checks(facts("h200-uvm-denied"), raw))["gpu.cuda_init"].remediation
    assert fix is not None and fix.command == "lxc.cgroup2.devices.allow: c 238:* rwm"


def test_recorded_stale_node_names_the_major(h200: SiteSpec) -> None:
    got = by_id(run_checks(facts("h200-uvm-stale"), h200))
    want = "/dev/nvidia-uvm is c 1:3 but /proc/devices gives nvidia-uvm major 238"
    assert got["dev.majors"].status == "fail"
    assert any(want in e for e in got["dev.majors"].evidence)
    assert got["gpu.cuda_init"].status == "fail"
    assert want in got["gpu.cuda_init"].summary


def test_no_driver_machine_fails_driver_check_with_fix() -> None:
    """The recorded VM has no NVIDIA GPU on its PCI bus either: the finding says it is not a GPU
    machine, and suggests no modprobe that could not work (issue 9)."""
    got = by_id(run_checks(facts("nodriver-vm"), None))
    module = got["driver.module"]
    assert module.status == "fail"
    assert module.summary == (
        "no NVIDIA GPU on the PCI bus and no NVIDIA kernel module: not a GPU machine"
    )
    assert module.remediation is not None
    assert module.remediation.command == "lspci -nn -d 10de:"
    assert "modprobe" not in module.remediation.action + (module.remediation.command or "")
    assert got["dev.nodes"].status == "skip"  # one root cause, not a cascade of failures
    assert got["gpu.count"].status == "skip"
    for cid in ("driver.nvml", "gpu.cuda_init"):
        assert got[cid].status == "fail" and got[cid].caused_by == "driver.module", got[cid]
        assert got[cid].remediation == module.remediation
    assert root_causes(list(got.values())) == ["driver.module"]
    assert exit_code(list(got.values())) == Exit.FAILURES


CT200_BLOCK = [
    *(f"dev{i}: /dev/nvidia{i},mode=0666" for i in range(8)),
    "dev8: /dev/nvidiactl,mode=0666",
    "dev9: /dev/nvidia-uvm,mode=0666",
    "dev10: /dev/nvidia-uvm-tools,mode=0666",
]


def test_ct200_incident_gives_the_devn_block(ct200: SiteSpec) -> None:
    got = by_id(run_checks(facts("ct200-ct-incident"), ct200))
    cuda = got["gpu.cuda_init"]
    assert cuda.status == "fail"
    assert cuda.summary.startswith("cuInit returned 999 CUDA_ERROR_UNKNOWN")
    assert "denies c 511:0 (nvidia-uvm)" in cuda.summary
    assert cuda.caused_by == "dev.open"
    assert cuda.remediation is not None
    assert cuda.remediation.command is not None
    assert cuda.remediation.command.splitlines() == CT200_BLOCK
    assert "/etc/pve/lxc/200.conf" in cuda.remediation.action
    assert "pct reboot 200" in cuda.remediation.action
    # The reboot wiped /dev/shm too: a second, independent root cause.
    assert root_causes(list(got.values())) == ["dev.open", "models.staged"]


def test_tp8_across_sockets_warns_with_cost(ct200: SiteSpec) -> None:
    spec = with_servers(ct200, {"kimi-tp8"})
    got = by_id(run_checks(facts("ct200-ct-healthy"), spec))
    assert got["topo.tp_numa"].status == "warn"
    assert "TP4" in got["topo.tp_numa"].summary
    assert got["topo.p2p"].status == "warn"  # the derived fixture's cross-socket pairs
    # Kimi is not staged in this fixture: that is the one failure; the rest only warns.
    assert got["models.staged"].status == "fail"
    assert "kimi-k2.6 is missing" in got["models.staged"].summary
    rest = [f for f in got.values() if f.id != "models.staged"]
    assert exit_code(rest) == Exit.OK
    assert exit_code(rest, strict=True) == Exit.WARNINGS


def test_models_staged_after_reboot_names_the_restage(ct200: SiteSpec) -> None:
    got = by_id(run_checks(facts("ct200-ct-incident"), ct200))["models.staged"]
    assert got.status == "fail"
    assert got.summary == "qwen3.6-27b is missing; qwen3.6-27b-dflash is missing"
    assert got.remediation is not None
    assert (
        got.remediation.command
        == "ct200-stage stage qwen3.6-27b --spec /etc/ct200/site.yml --replace"
    )
    assert got.remediation.where == "container" and got.remediation.tag == "staging"


def test_models_staging_in_progress_warns_and_lost_source_says_so(ct200: SiteSpec) -> None:
    f = facts("ct200-ct-incident")
    assert f.models is not None
    running = tuple(
        dataclasses.replace(
            m, staged_tree=StagedTreeFacts(m.staged_tree.path, partial=True, lock_pid=4242)
        )
        for m in f.models
        if m.staged_tree is not None
    )
    got = by_id(run_checks(dataclasses.replace(f, models=running), ct200))["models.staged"]
    assert got.status == "warn" and "pid 4242" in got.summary
    lost = tuple(dataclasses.replace(m, source_exists=False) for m in f.models)
    got = by_id(run_checks(dataclasses.replace(f, models=lost), ct200))["models.staged"]
    assert got.status == "fail" and "persistent copy is missing" in got.summary
    assert got.remediation is not None and "restore the persistent copy" in got.remediation.action
    # The command is the action's sequence, to paste once the copy is back: verify, then stage.
    assert got.remediation.command == (
        "ct200-stage verify /tank/models/Qwen3.6-27B "
        "--manifest /var/lib/ct200/manifests/qwen3.6-27b.json && "
        "ct200-stage stage qwen3.6-27b --spec /etc/ct200/site.yml --replace"
    )
    assert got.remediation.tag == "staging"


def test_models_in_a_snapshot_of_an_older_doctor_are_judged_as_recorded(ct200: SiteSpec) -> None:
    """Snapshots taken before the probe read raw staged trees carry ct200-stage's verdict in
    stage_state/stage_pid: they load with the same schema_version and are judged as recorded."""
    f = facts("ct200-ct-incident")
    assert f.models is not None
    old = tuple(
        dataclasses.replace(m, staged_tree=None, stage_state="partial", stage_pid=4242)
        for m in f.models
    )
    got = by_id(run_checks(dataclasses.replace(f, models=old), ct200))["models.staged"]
    assert got.status == "warn" and "pid 4242" in got.summary
    gone = tuple(dataclasses.replace(m, staged_tree=None) for m in f.models)
    got = by_id(run_checks(dataclasses.replace(f, models=gone), ct200))["models.staged"]
    assert got.status == "skip" and "cannot tell whether" in got.summary


def test_kimi_staging_needs_room(ct200: SiteSpec) -> None:
    spec = with_servers(ct200, {"kimi-tp8"})
    f = facts("ct200-ct-healthy")
    assert f.memory is not None
    small = dataclasses.replace(f, memory=dataclasses.replace(f.memory, memory_max=400 * 2**30))
    got = by_id(run_checks(small, spec))["mem.headroom"]
    assert got.status == "fail"
    assert "pct set 200 --memory" in (got.remediation.command or "")  # type: ignore[union-attr]


def test_host_drift_mrrs_numa_balancing_iommu(ct200: SiteSpec) -> None:
    got = by_id(run_checks(facts("ct200-host-drift"), ct200))
    mrrs = got["tune.pcie_mrrs"]
    assert mrrs.status == "fail"
    assert mrrs.remediation is not None
    assert mrrs.remediation.command is not None
    assert mrrs.remediation.command.splitlines() == [
        f"setpci -s {b} CAP_EXP+8.w=5000:7000"
        for b in ("0000:81:00.0", "0000:a1:00.0", "0000:c1:00.0", "0000:e1:00.0")
    ]
    nb = got["tune.numa_balancing"]
    assert nb.status == "fail"
    assert (
        nb.remediation is not None and nb.remediation.command == "sysctl -w kernel.numa_balancing=0"
    )
    assert got["host.iommu"].status == "warn"


def test_shm_smaller_than_spec(ct200: SiteSpec) -> None:
    f = facts("ct200-ct-healthy")
    assert f.memory is not None
    small = dataclasses.replace(f, memory=dataclasses.replace(f.memory, shm_size=64 * 2**30))
    got = by_id(run_checks(small, ct200))["mem.shm"]
    assert got.status == "fail"
    assert "remount,size=" in (got.remediation.command or "")  # type: ignore[union-attr]


def test_missing_shm() -> None:
    f = facts("ct200-ct-healthy")
    assert f.memory is not None
    gone = dataclasses.replace(
        f, memory=dataclasses.replace(f.memory, shm_exists=False, shm_size=None, shm_free=None)
    )
    spec = load_spec(ROOT / "inventory" / "ct200")
    got = by_id(run_checks(gone, spec))["mem.shm"]
    assert got.status == "fail"
    assert "does not exist" in got.summary


def test_version_mismatch(h200: SiteSpec) -> None:
    f = facts("h200-healthy")
    assert f.nvml is not None
    bad = dataclasses.replace(f, nvml=dataclasses.replace(f.nvml, driver_version="575.51.03"))
    got = by_id(run_checks(bad, h200))["driver.versions"]
    assert got.status == "fail"
    assert "580.159.04" in got.summary and "575.51.03" in got.summary


def test_gpu_count_and_model_mismatch(ct200: SiteSpec) -> None:
    got = by_id(run_checks(facts("h200-healthy"), ct200))
    assert got["gpu.count"].status == "fail"
    assert "expected 8" in got["gpu.count"].summary
    assert got["gpu.model"].status == "fail"


def test_unreadable_facts_skip_never_fail(ct200: SiteSpec) -> None:
    empty = Facts(unreadable={"kernel": "probe kernel did not finish within 10 s"})
    for f in run_checks(empty, ct200):
        assert f.status == "skip", f


def test_a_broken_check_is_an_error_not_a_skip() -> None:
    """Issue 9: a check that raises is reported as `error` (never a skip or a pass) and the run
    exits 3, whatever else passed or failed."""

    def boom(ctx: Context) -> Outcome:
        raise KeyError("x")

    f = run_check(Check("t.boom", "t", "error", boom), Context(Facts(), None))
    assert f.status == "error"
    assert "the check itself failed" in f.summary
    assert f.summary == "the check itself failed (KeyError: 'x'); please report this"
    assert f.evidence and f.evidence[0].startswith("raised at test_checks.py:")
    assert exit_code([f]) == Exit.DOCTOR_BROKE
    fail = Finding("t.fail", "t", "fail", "error", "broken machine")
    assert exit_code([fail, f]) == Exit.DOCTOR_BROKE


def test_select_by_prefix_and_unknown() -> None:
    assert [c.id for c in select(["dev"])] == ["dev.nodes", "dev.majors", "dev.open"]
    assert "gpu.cuda_init" not in [c.id for c in select(skip=["gpu.cuda_init"])]
    with pytest.raises(UnknownCheckError):
        select(["nope"])


def test_selecting_nothing_is_an_error() -> None:
    with pytest.raises(SelectionError, match="--only gpu --skip gpu selects no check"):
        select(["gpu"], ["gpu"])
    with pytest.raises(SelectionError):
        select(
            skip=["driver", "dev", "gpu", "topo", "tune", "host", "lxc", "mem", "models", "server"]
        )


def test_nothing_judged_is_not_clean() -> None:
    skip = Finding("t.a", "t", "skip", "error", "cannot read it")
    ok = Finding("t.b", "t", "pass", "error", "fine")
    assert exit_code([skip]) == Exit.FAILURES
    assert exit_code([]) == Exit.FAILURES
    assert exit_code([skip, ok]) == Exit.OK
    blocked = dataclasses.replace(skip, caused_by="t.c")
    assert exit_code([blocked, ok]) == Exit.FAILURES


def test_ids_unique_well_formed_and_documented() -> None:
    """The registry's rules (as ansible-lint's for its rules): id format, unique ids, a doc for
    each, the exact count, each check in the module named by its id prefix, none left out."""
    assert len(set(CHECK_IDS)) == len(CHECK_IDS)
    docs = (ROOT / "docs" / "checks.md").read_text()
    for c in CHECKS:
        assert c.id.count(".") == 1 and c.id == c.id.lower(), c.id
        assert re.fullmatch(r"[a-z]+\.[a-z][a-z0-9_]*", c.id), c.id
        assert c.doc, c.id
        assert c.title and c.severity in ("error", "warning"), c.id
        assert f"`{c.id}`" in docs, f"docs/checks.md lacks {c.id}: run make docs"
        prefix = c.id.split(".")[0]
        assert c.module == f"ct200_tools.checks.{prefix}", (c.id, c.module)
        assert c.needs and set(c.needs) <= FACT_SECTIONS, (c.id, c.needs)
    assert len(CHECKS) == 37  # a new check needs its doc entry and this count bumped
    assert docs == render(), "docs/checks.md is stale: run make docs"
    units = {
        obj.id
        for module in pkgutil.iter_modules(checks_pkg.__path__)
        for obj in vars(importlib.import_module(f"ct200_tools.checks.{module.name}")).values()
        if isinstance(obj, Check)
    }
    assert units == set(CHECK_IDS), "a check unit is defined but not in the registry"


# =============================================================================================
# Pass and fail examples beside every check (ansible-lint style): recorded or derived facts,
# each with the smallest edit that makes the point. test_every_check_has_examples keeps the
# table complete; each example also proves the check reads only the facts it declares.
# =============================================================================================
FACT_SECTIONS = {
    "kernel",
    "devices",
    "pci",
    "nvml",
    "cuda",
    "memory",
    "models",
    "serving",
    "servers",
    "host",
}


@dataclass(frozen=True)
class Example:
    facts: str
    spec: str | None
    status: str
    edit: Callable[[Facts], Facts] = lambda f: f
    spec_edit: Callable[[SiteSpec], SiteSpec] = lambda s: s


def _gpu0(**changes: Any) -> Callable[[Facts], Facts]:
    def edit(f: Facts) -> Facts:
        assert f.nvml is not None
        gpus = (dataclasses.replace(f.nvml.gpus[0], **changes), *f.nvml.gpus[1:])
        return dataclasses.replace(f, nvml=dataclasses.replace(f.nvml, gpus=gpus))

    return edit


def _nvml(**changes: Any) -> Callable[[Facts], Facts]:
    def edit(f: Facts) -> Facts:
        assert f.nvml is not None
        return dataclasses.replace(f, nvml=dataclasses.replace(f.nvml, **changes))

    return edit


def _memory(**changes: Any) -> Callable[[Facts], Facts]:
    def edit(f: Facts) -> Facts:
        assert f.memory is not None
        return dataclasses.replace(f, memory=dataclasses.replace(f.memory, **changes))

    return edit


def _no_uvm_node(f: Facts) -> Facts:
    assert f.devices is not None
    nodes = tuple(
        dataclasses.replace(n, exists=False, is_char=False, major=None, minor=None)
        if n.path == "/dev/nvidia-uvm"
        else n
        for n in f.devices.nodes
    )
    return dataclasses.replace(f, devices=dataclasses.replace(f.devices, nodes=nodes))


def _no_uvm_driver(f: Facts) -> Facts:
    """nvidia_uvm not loaded: no nvidia-uvm in /proc/devices (its nodes stay as they were)."""
    assert f.devices is not None
    majors = {k: v for k, v in f.devices.majors.items() if k != "nvidia-uvm"}
    return dataclasses.replace(f, devices=dataclasses.replace(f.devices, majors=majors))


def _gpu0_numa(node: int) -> Callable[[Facts], Facts]:
    def edit(f: Facts) -> Facts:
        assert f.pci is not None
        return dataclasses.replace(
            f, pci=(dataclasses.replace(f.pci[0], numa_node=node), *f.pci[1:])
        )

    return edit


def _mrrs_all(size: int) -> Callable[[Facts], Facts]:
    def edit(f: Facts) -> Facts:
        assert f.pci is not None
        return dataclasses.replace(
            f, pci=tuple(dataclasses.replace(p, max_read_request=size) for p in f.pci)
        )

    return edit


def _kimi(spec: SiteSpec) -> SiteSpec:
    return with_servers(spec, {"kimi-tp8"})


EXAMPLES: dict[str, tuple[Example, ...]] = {
    "driver.module": (
        Example("h200-healthy", None, "pass"),
        Example("nodriver-vm", None, "fail"),
    ),
    "driver.nvml": (
        Example("h200-healthy", None, "pass"),
        Example("nodriver-vm", None, "fail"),
        Example("h200-c195-denied", None, "fail"),
    ),
    "driver.versions": (
        Example("h200-healthy", None, "pass"),
        Example("h200-healthy", None, "fail", _nvml(driver_version="575.51.03")),
    ),
    "dev.nodes": (
        Example("h200-healthy", "h200", "pass"),
        Example("h200-healthy", "h200", "fail", _no_uvm_node),
    ),
    "dev.majors": (
        Example("h200-healthy", "h200", "pass"),
        Example("h200-uvm-stale", "h200", "fail"),
        Example("h200x2-uvm-stale", "h200x2", "fail"),
        Example("h200-healthy", "h200", "fail", _no_uvm_driver),
    ),
    "dev.open": (
        Example("h200-healthy", "h200", "pass"),
        Example("h200-uvm-denied", "h200", "fail"),
        Example("ct200-ct-incident", "ct200", "fail"),
        Example("h200-c195-denied", "h200", "fail"),
        Example("ct200-ct-c195-denied", "ct200", "fail"),
    ),
    "gpu.cuda_init": (
        Example("h200-healthy", "h200", "pass"),
        Example("h200x2-healthy", "h200x2", "pass"),
        Example("h200-uvm-denied", "h200", "fail"),
        Example("h200-uvm-stale", "h200", "fail"),
        Example("nodriver-vm", None, "fail"),
        Example("h200-c195-denied", "h200", "fail"),
    ),
    "gpu.count": (
        Example("h200-healthy", "h200", "pass"),
        Example("h200-healthy", "ct200", "fail"),
    ),
    "gpu.model": (
        Example("h200-healthy", "h200", "pass"),
        Example("h200-healthy", "ct200", "fail"),
    ),
    "gpu.pcie_link": (
        Example("ct200-ct-healthy", "ct200", "pass"),
        Example("ct200-ct-healthy", "ct200", "fail", _gpu0(link_gen_max=4)),
    ),
    "gpu.persistence": (
        Example("h200-healthy", None, "pass"),
        Example("h200-healthy", None, "warn", _gpu0(persistence_mode=False)),
    ),
    "gpu.memory_health": (
        Example("h200-healthy", None, "pass"),
        Example("h200-healthy", None, "fail", _gpu0(remapped_rows=RemappedRows(0, 3, False, True))),
        Example("h200-healthy", None, "warn", _gpu0(retired_pages_pending=True)),
    ),
    "gpu.clocks": (
        Example("h200-healthy", None, "pass"),
        Example("h200-healthy", None, "warn", _gpu0(clocks_event_reasons=0x40)),
    ),
    "topo.numa_layout": (
        Example("ct200-ct-healthy", "ct200", "pass"),
        Example("ct200-ct-healthy", "ct200", "warn", _gpu0_numa(1)),
    ),
    "topo.tp_numa": (
        Example("ct200-ct-healthy", "ct200", "pass"),
        Example("ct200-ct-healthy", "ct200", "warn", spec_edit=_kimi),
    ),
    "topo.p2p": (
        Example("ct200-ct-healthy", "ct200", "pass"),
        Example("h200x2-healthy", "h200x2", "pass"),
        Example("ct200-ct-healthy", "ct200", "warn", spec_edit=_kimi),
    ),
    "tune.numa_balancing": (
        Example("ct200-ct-healthy", "ct200", "pass"),
        Example("ct200-host-drift", "ct200", "fail"),
    ),
    "tune.pcie_mrrs": (
        Example("ct200-host-drift", "ct200", "pass", _mrrs_all(4096)),
        Example("ct200-host-drift", "ct200", "fail"),
    ),
    "host.iommu": (
        Example("h200-healthy", None, "pass"),
        Example("ct200-host-drift", "ct200", "warn"),
        Example("ct200-host-drift", "ct200", "pass", hh.on()),
    ),
    "host.nodes": (
        Example("ct200-ct-healthy", "ct200", "pass", hh.on()),
        Example("ct200-ct-healthy", "ct200", "fail", hh.on(hh.HostCase(uvm=None))),
        Example("ct200-ct-healthy", "ct200", "fail", hh.on(hh.HostCase(nvidia=False, module=None))),
        Example("ct200-ct-healthy", "ct200", "fail", hh.on(hh.HostCase(missing=("/dev/nvidia3",)))),
        Example(
            "ct200-ct-healthy",
            "ct200",
            "fail",
            hh.on(hh.HostCase(gpus=(), nvidia=False, module=None)),
        ),
    ),
    "lxc.nodes": (
        Example("ct200-ct-healthy", "ct200", "pass", hh.on()),
        Example("ct200-ct-healthy", "ct200", "fail", hh.on(hh.HostCase(conf="fresh-pve8.conf"))),
        Example("ct200-ct-healthy", "ct200", "fail", hh.on(hh.HostCase(conf=None))),
    ),
    "lxc.majors": (
        Example("ct200-ct-healthy", "ct200", "fail", hh.on()),
        Example(
            "ct200-ct-healthy", "ct200", "pass", hh.on(hh.HostCase(conf_text=hh.INCIDENT_FIXED))
        ),
        Example("ct200-ct-healthy", "ct200", "pass", hh.on(hh.HostCase(conf_text=hh.DEVN))),
        Example("ct200-ct-healthy", "ct200", "warn", hh.on(hh.HostCase(conf_text=hh.DEVN_STALE))),
    ),
    "host.driver": (
        Example("ct200-ct-healthy", "ct200", "pass", hh.on()),
        Example("ct200-ct-healthy", "ct200", "fail", hh.on(hh.HostCase(module="590.44.01"))),
        Example("ct200-ct-healthy", "ct200", "fail", hh.userspace("575.64.05", hh.HostCase())),
    ),
    "host.pcie_mrrs": (
        Example("ct200-ct-healthy", "ct200", "pass", hh.on()),
        Example("ct200-ct-healthy", "ct200", "fail", hh.on(hh.HostCase(mrrs_code=2))),
    ),
    "host.numa_balancing": (
        Example("ct200-ct-healthy", "ct200", "pass", hh.on()),
        Example("ct200-ct-healthy", "ct200", "fail", hh.on(hh.HostCase(numa_balancing=1))),
    ),
    "host.acs": (
        Example("ct200-ct-healthy", "ct200", "pass", hh.on()),
        Example("ct200-ct-healthy", "ct200", "pass", hh.on(hh.HostCase(acs="none"))),
        Example("ct200-ct-healthy", "ct200", "pass", hh.on(hh.HostCase(acs=None))),
        Example("ct200-ct-healthy", "ct200", "warn", hh.on(hh.HostCase(acs=hh.ACS_LINUX_DEFAULT))),
    ),
    "mem.shm": (
        Example("ct200-ct-healthy", "ct200", "pass"),
        Example("ct200-ct-healthy", "ct200", "fail", _memory(shm_size=64 * 2**30)),
        Example("ct200-ct-healthy", "ct200", "fail", _memory(shm_fstype="ext4")),
    ),
    "models.staged": (
        Example("ct200-ct-healthy", "ct200", "pass"),
        Example("ct200-ct-incident", "ct200", "fail"),
    ),
    "mem.headroom": (
        Example("ct200-ct-healthy", "ct200", "pass"),
        Example(
            "ct200-ct-healthy", "ct200", "fail", _memory(memory_max=400 * 2**30), spec_edit=_kimi
        ),
    ),
    # The llama-cpu recordings (tests/unit/server_facts.py says what each edit stands for).
    "server.engine": (
        Example("llama-cpu-serving", "llama-cpu", "pass"),
        Example("llama-cpu-serving", "llama-cpu", "fail", sf.no_engine),
        Example("llama-cpu-serving", "llama-cpu", "fail", sf.engine(exists=True, executable=False)),
    ),
    "server.port_free": (
        Example("llama-cpu-stopped", "llama-cpu", "pass"),
        Example("llama-cpu-serving", "llama-cpu", "pass", sf.own_port),
        Example("llama-cpu-serving", "llama-cpu", "fail"),
    ),
    "server.quant": (
        Example(
            "llama-cpu-serving",
            "llama-cpu",
            "pass",
            sf.chain(sf.nvfp4_model, sf.python_engine("0.18.0", "compressed-tensors==0.18.0")),
        ),
        Example(
            "llama-cpu-serving",
            "llama-cpu",
            "fail",
            sf.chain(sf.nvfp4_model, sf.python_engine("0.9.4")),
        ),
        Example(
            "llama-cpu-serving",
            "llama-cpu",
            "fail",
            sf.chain(sf.nvfp4_model, sf.python_engine("0.10.0", "compressed-tensors==0.18.0")),
        ),
    ),
    "server.unit": (
        Example("llama-cpu-serving", "llama-cpu", "pass", sf.with_unit("ok")),
        Example("llama-cpu-stopped", "llama-cpu", "fail", sf.with_unit("fail")),
        Example("llama-cpu-stopped", "llama-cpu", "fail", sf.with_unit("limit")),
        Example("llama-cpu-stopped", "llama-cpu", "fail", sf.with_unit("none")),
        Example("llama-cpu-stopped", "llama-cpu", "fail", sf.with_unit("dead")),
        Example("llama-cpu-stopped", "llama-cpu", "warn", sf.with_unit("start")),
    ),
    "server.port": (
        Example("llama-cpu-serving", "llama-cpu", "pass"),
        Example("llama-cpu-stopped", "llama-cpu", "fail"),
    ),
    "server.models": (
        Example("llama-cpu-serving", "llama-cpu", "pass"),
        Example("llama-cpu-serving", "llama-cpu", "fail", sf.serves("other")),
    ),
    "server.generate": (
        Example("llama-cpu-serving", "llama-cpu", "pass"),
        Example("llama-cpu-serving", "llama-cpu", "fail", sf.generation_timed_out),
    ),
    "server.gpus": (
        Example("llama-cpu-serving", "llama-cpu", "pass", sf.on_gpus("0")),
        Example("llama-cpu-serving", "llama-cpu", "fail", sf.on_gpus("0,1")),
        Example("llama-cpu-serving", "llama-cpu", "fail", sf.on_gpus(None)),
    ),
}
SPECS = {
    "ct200": ROOT / "inventory" / "ct200",
    "h200": ROOT / "benchmarks" / "doctor" / "h200-site.yml",
    "h200x2": ROOT / "benchmarks" / "doctor" / "h200x2-site.yml",
    "llama-cpu": sf.LLAMA_SPEC,
}


@functools.cache
def spec_named(name: str) -> SiteSpec:
    return load_spec(SPECS[name])


def example_context(ex: Example) -> Context:
    spec = ex.spec_edit(spec_named(ex.spec)) if ex.spec else None
    return Context(ex.edit(facts(ex.facts)), spec)


def only_sections(f: Facts, keep: Iterable[str]) -> Facts:
    """The facts with every section the check does not declare taken away."""
    return dataclasses.replace(f, **dict.fromkeys(FACT_SECTIONS - set(keep)))


def test_every_check_has_pass_and_fail_examples() -> None:
    assert set(EXAMPLES) == set(CHECK_IDS)
    for cid, examples in EXAMPLES.items():
        statuses = {ex.status for ex in examples}
        assert "pass" in statuses, cid
        assert statuses & {"fail", "warn"}, cid


@pytest.mark.parametrize(
    ("cid", "ex"),
    [(cid, ex) for cid, examples in EXAMPLES.items() for ex in examples],
    ids=[f"{cid}-{ex.status}-{ex.facts}" for cid, examples in EXAMPLES.items() for ex in examples],
)
def test_check_example(cid: str, ex: Example) -> None:
    c = BY_ID[cid]
    ctx = example_context(ex)
    got = run_check(c, ctx)
    assert got.status == ex.status, got
    assert (got.id, got.title, got.severity) == (c.id, c.title, c.severity)
    if got.status != "pass":
        assert got.remediation is not None, got
        assert got.remediation.tag is None or got.remediation.tag in c.tags, got.remediation
    # `needs` is the truth: without the other sections the verdict is the same.
    alone = run_check(c, Context(only_sections(ctx.facts, c.needs), ctx.spec))
    assert alone == got


def test_needs_hold_on_every_fixture() -> None:
    """Every check on every recorded or derived fixture, with and without the facts it does
    not declare: the same finding; and every caused_by names a registered check."""
    runs = [
        (name, s)
        for name in ("h200-healthy", "h200-uvm-denied", "h200-uvm-stale")
        for s in ("h200",)
    ]
    runs += [(f"h200x2-{k}", "h200x2") for k in ("healthy", "uvm-denied", "uvm-stale")]
    runs += [
        (f"ct200-{k}", "ct200")
        for k in ("ct-healthy", "ct-incident", "host-drift", "ct-c195-denied")
    ]
    runs += [("h200-c195-denied", "h200"), ("h200-c195-denied", None)]
    runs += [("nodriver-vm", None), ("nodriver-vm", "ct200")]
    runs += [(f"llama-cpu-{k}", "llama-cpu") for k in ("serving", "stopped")]
    for name, spec in runs:
        ctx = Context(facts(name), spec_named(spec) if spec else None)
        for c in CHECKS:
            got = run_check(c, ctx)
            assert got.status != "error", (name, got)
            assert got.caused_by is None or got.caused_by in BY_ID, got
            alone = run_check(c, Context(only_sections(ctx.facts, c.needs), ctx.spec))
            assert alone == got, (name, c.id)
