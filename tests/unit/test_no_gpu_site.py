"""A site with no NVIDIA GPU (`gpus: {count: 0}`, what the testbed is): the spec says so, the
doctor's checks of GPUs, their driver and their passthrough do not apply there (skip, with the
reason), and every other check judges as anywhere else, so a failure there means something.
Facts: the recording of llama-server serving on a machine without a GPU (tests/fixtures)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from ct200_tools.doctor.checks import CHECKS, run_checks
from ct200_tools.doctor.checks.base import NO_GPU_SITE
from ct200_tools.doctor.report import Exit, exit_code
from ct200_tools.facts import loads
from ct200_tools.spec import SpecError, validate

ROOT = Path(__file__).parents[2]
FACTS = loads((ROOT / "tests" / "fixtures" / "facts" / "llama-cpu-serving.json").read_text())
LLAMA_SITE: dict[str, Any] = yaml.safe_load(
    (ROOT / "tests" / "fixtures" / "llama-cpu-site.yml").read_text()
)["ct200_site"]


def site(count: int, server_gpus: list[int]) -> dict[str, Any]:
    data = copy.deepcopy(LLAMA_SITE)
    data["gpus"] = {"count": count} if count == 0 else {"count": count, "model": "NVIDIA H200"}
    data["servers"][0]["gpus"] = server_gpus
    return data


def test_a_site_without_gpus_validates() -> None:
    spec = validate(site(0, []))
    assert spec.gpus.count == 0
    assert spec.servers[0].gpus == ()


def test_a_server_on_a_gpu_the_site_does_not_have_is_refused() -> None:
    with pytest.raises(SpecError) as err:
        validate(site(0, [0]))
    (issue,) = err.value.issues
    assert issue.path == "servers[0].gpus[0]"
    assert "the site has no GPU" in issue.message and "gpus: []" in issue.fix


def test_gpu_checks_do_not_apply_and_the_rest_judge() -> None:
    findings = run_checks(FACTS, validate(site(0, [])))
    by_id = {f.id: f for f in findings}
    gpu_only = {c.id for c in CHECKS if c.gpu_only}
    assert {"driver.module", "dev.open", "gpu.cuda_init", "tune.pcie_mrrs", "lxc.nodes"} <= gpu_only
    for cid in gpu_only:
        assert (by_id[cid].status, by_id[cid].summary) == ("skip", NO_GPU_SITE), by_id[cid]
    # The server, its model and the machine are judged as anywhere else.
    for cid in ("server.engine", "server.port", "server.generate", "models.staged", "mem.shm"):
        assert by_id[cid].status == "pass", by_id[cid]
    # The one failure is this recording's own: its server ran by hand, outside its unit, so the
    # unit's port is taken. It is the only root cause: nothing GPU-shaped is left to blame.
    assert [f.id for f in findings if f.status == "fail"] == ["server.port_free"]
    assert exit_code(findings) == Exit.FAILURES


def test_the_same_machine_under_a_spec_that_declares_a_gpu_fails() -> None:
    """What the testbed's spec said before: one GPU it does not have, so the doctor failed
    there on every run, as expected, and a failure meant nothing."""
    findings = run_checks(FACTS, validate(site(1, [])))
    by_id = {f.id: f for f in findings}
    assert by_id["driver.module"].status == "fail"
    assert exit_code(findings) == Exit.FAILURES
