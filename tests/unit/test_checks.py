"""Checks judged on facts recorded on real machines (and the CT200 cases derived from them)."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
import re
from collections.abc import Iterable
from pathlib import Path

import pytest

from ct200_tools.doctor import checks as checks_pkg
from ct200_tools.doctor.checks import (
    BY_ID,
    CHECK_IDS,
    CHECKS,
    SelectionError,
    UnknownCheckError,
    run_checks,
    select,
)
from ct200_tools.doctor.checks.base import Check, Context, Finding, Outcome, run_check
from ct200_tools.doctor.docs import render
from ct200_tools.doctor.report import Exit, exit_code, root_causes
from ct200_tools.facts import Facts, loads
from ct200_tools.spec import SiteSpec, load_spec
from tests.fixtures import derive_ct200
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
    assert cuda.remediation.command is None  # config lines, not commands
    assert list(cuda.remediation.config) == H200_BLOCK
    assert cuda.remediation.file == "/etc/pve/lxc/200.conf"
    assert cuda.remediation.tag == "lxc_passthrough"
    assert got["dev.open"].status == "fail"
    assert got["dev.majors"].status == "pass"
    raw = dataclasses.replace(h200, pve=dataclasses.replace(h200.pve, passthrough="raw-lxc"))
    fix = by_id(run_checks(facts("h200-uvm-denied"), raw))["gpu.cuda_init"].remediation
    assert fix is not None and fix.config == ("lxc.cgroup2.devices.allow: c 238:* rwm",)


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
    assert list(cuda.remediation.config) == CT200_BLOCK
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
        assert c.module == f"ct200_tools.doctor.checks.{prefix}", (c.id, c.module)
        assert c.needs and set(c.needs) <= FACT_SECTIONS, (c.id, c.needs)
    # The exact set of checks is kept by their example files (test_check_examples.py): a check
    # added without its <id>.yml, or dropped from the registry with it left behind, fails there.
    assert docs == render(), "docs/checks.md is stale: run make docs"
    # A unit is a module-level Check, or one of a module-level tuple of them (the tunings'
    # checks, made from ct200_tools.tunings in tune.py and host.py).
    units = {
        unit.id
        for module in pkgutil.iter_modules(checks_pkg.__path__)
        for obj in vars(
            importlib.import_module(f"ct200_tools.doctor.checks.{module.name}")
        ).values()
        for unit in (obj if isinstance(obj, tuple) else (obj,))
        if isinstance(unit, Check)
    }
    assert units == set(CHECK_IDS), "a check unit is defined but not in the registry"


# Each check's pass and fail examples are in ct200_tools/doctor/checks/examples/ (run by
# tests/unit/test_check_examples.py); this file keeps what is not one check's verdict: root
# causes across checks, exit codes, the registry, and every check on every fixture.
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
SPECS = {
    "ct200": ROOT / "inventory" / "ct200",
    "h200": ROOT / "benchmarks" / "doctor" / "h200-site.yml",
    "h200x2": ROOT / "benchmarks" / "doctor" / "h200x2-site.yml",
    "llama-cpu": sf.LLAMA_SPEC,
}


@functools.cache
def spec_named(name: str) -> SiteSpec:
    return load_spec(SPECS[name])


def only_sections(f: Facts, keep: Iterable[str]) -> Facts:
    """The facts with every section the check does not declare taken away."""
    return dataclasses.replace(f, **dict.fromkeys(FACT_SECTIONS - set(keep)))


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
        for k in ("ct-healthy", "ct-incident", "host-drift", "ct-c195-denied", "ct-with-host")
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
