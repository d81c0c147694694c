"""Checks judged on facts recorded on real machines (and the CT200 cases derived from them)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ct200_tools.checks import CHECK_IDS, CHECKS, UnknownCheckError, run_checks, select
from ct200_tools.checks.base import Check, Context, Finding, Outcome, run_check
from ct200_tools.docs import render
from ct200_tools.facts import Facts, loads
from ct200_tools.report import Exit, exit_code
from ct200_tools.spec import SiteSpec, load_spec
from tests.fixtures import derive_ct200

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


def test_recorded_uvm_denied_names_cgroup_and_fix(h200: SiteSpec) -> None:
    got = by_id(run_checks(facts("h200-uvm-denied"), h200))
    cuda = got["gpu.cuda_init"]
    assert cuda.status == "fail"
    assert "denies c 238:0 (nvidia-uvm)" in cuda.summary
    assert "EPERM" in cuda.summary
    assert cuda.remediation is not None
    # The H200 machine reads as a container (/.dockerenv): the fix goes to the host config.
    assert cuda.remediation.where == "host"
    assert cuda.remediation.command == "devN: /dev/nvidia-uvm,mode=0666"
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
    got = by_id(run_checks(facts("nodriver-vm"), None))
    assert got["driver.module"].status == "fail"
    assert got["driver.module"].remediation is not None
    assert "modprobe nvidia" in (got["driver.module"].remediation.command or "")
    assert got["dev.nodes"].status == "skip"  # one root cause, not a cascade of failures
    assert got["gpu.count"].status == "skip"
    assert exit_code(list(got.values())) == Exit.FAILURES


def test_ct200_container_healthy(ct200: SiteSpec) -> None:
    got = by_id(run_checks(facts("ct200-ct-healthy"), ct200))
    assert {k: f.summary for k, f in got.items() if f.status in ("fail", "warn")} == {}
    assert got["tune.pcie_mrrs"].status == "skip"  # 64 readable bytes: says so, never guesses
    assert "on the host" in got["tune.pcie_mrrs"].summary
    link = got["gpu.pcie_link"]
    assert link.status == "pass"
    assert any("idle downshift is normal" in e for e in link.evidence)
    assert got["topo.tp_numa"].status == "pass"
    assert got["topo.p2p"].status == "pass"


def test_ct200_incident_gives_the_devn_line(ct200: SiteSpec) -> None:
    got = by_id(run_checks(facts("ct200-ct-incident"), ct200))
    cuda = got["gpu.cuda_init"]
    assert cuda.status == "fail"
    assert cuda.summary.startswith("cuInit returned 999 CUDA_ERROR_UNKNOWN")
    assert "denies c 511:0 (nvidia-uvm)" in cuda.summary
    assert cuda.remediation is not None
    assert cuda.remediation.command == "devN: /dev/nvidia-uvm,mode=0666"
    assert "/etc/pve/lxc/200.conf" in cuda.remediation.action
    assert "pct reboot 200" in cuda.remediation.action


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
    assert got.remediation.command == "ct200-stage stage qwen3.6-27b --spec /etc/ct200/site.yml"
    assert got.remediation.where == "container" and got.remediation.tag == "staging"


def test_models_staging_in_progress_warns_and_lost_source_says_so(ct200: SiteSpec) -> None:
    f = facts("ct200-ct-incident")
    assert f.models is not None
    running = tuple(dataclasses.replace(m, stage_state="partial", stage_pid=4242) for m in f.models)
    got = by_id(run_checks(dataclasses.replace(f, models=running), ct200))["models.staged"]
    assert got.status == "warn" and "pid 4242" in got.summary
    lost = tuple(dataclasses.replace(m, source_exists=False) for m in f.models)
    got = by_id(run_checks(dataclasses.replace(f, models=lost), ct200))["models.staged"]
    assert got.status == "fail" and "persistent copy is missing" in got.summary
    assert got.remediation is not None and "restore the persistent copy" in got.remediation.action


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


def test_ids_unique_well_formed_and_documented() -> None:
    assert len(set(CHECK_IDS)) == len(CHECK_IDS)
    docs = (ROOT / "docs" / "checks.md").read_text()
    for c in CHECKS:
        assert c.id.count(".") == 1 and c.id == c.id.lower(), c.id
        assert c.doc, c.id
        assert f"`{c.id}`" in docs, f"docs/checks.md lacks {c.id}: run make docs"
    assert len(CHECKS) == 22  # a new check needs its doc entry and this count bumped
    assert docs == render(), "docs/checks.md is stale: run make docs"
