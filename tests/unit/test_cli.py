"""ct200-doctor as a user runs it: exit codes, formats, and no traceback on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FIX = Path(__file__).parents[1] / "fixtures" / "facts"
ROOT = Path(__file__).parents[2]
CT200 = str(ROOT / "inventory" / "ct200")


def doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ct200_tools.cli.entry", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env=env,
        cwd=ROOT,
    )


def no_traceback(r: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in r.stderr + r.stdout, r.stderr


def test_check_on_this_driverless_machine_fails_driver_and_exits_2() -> None:
    r = doctor("check")
    no_traceback(r)
    assert r.returncode == 2
    assert "[✗] driver.module" in r.stdout
    assert "modprobe nvidia" in r.stdout


def test_json_report_schema() -> None:
    r = doctor("check", "--json", "--facts", str(FIX / "ct200-ct-incident.json"), "--spec", CT200)
    assert r.returncode == 2
    doc = json.loads(r.stdout)
    assert doc["schema_version"] == 1
    assert doc["exit_code"] == 2
    assert set(doc["summary"]) == {"pass", "warn", "fail", "skip", "error"}
    assert doc["summary"]["error"] == 0
    for c in doc["checks"]:
        assert set(c) >= {
            "id",
            "title",
            "status",
            "severity",
            "summary",
            "evidence",
            "remediation",
            "caused_by",
        }
        assert c["status"] in ("pass", "warn", "fail", "skip", "error")
    assert doc["checks"][0]["title"] == "NVIDIA kernel module loaded"
    cuda = next(c for c in doc["checks"] if c["id"] == "gpu.cuda_init")
    assert cuda["remediation"]["command"] == "devN: /dev/nvidia-uvm,mode=0666"
    assert cuda["remediation"]["where"] == "host"


def test_exit_codes_clean_and_strict() -> None:
    clean = doctor("check", "--facts", str(FIX / "ct200-ct-healthy.json"), "--spec", CT200)
    assert clean.returncode == 0, clean.stdout
    # Warnings only: the IOMMU warning alone, selected with --only.
    warn = doctor(
        "check",
        "--facts",
        str(FIX / "ct200-host-drift.json"),
        "--spec",
        CT200,
        "--only",
        "host.iommu",
    )
    assert warn.returncode == 0
    strict = doctor(
        "check",
        "--facts",
        str(FIX / "ct200-host-drift.json"),
        "--spec",
        CT200,
        "--only",
        "host.iommu",
        "--strict",
    )
    assert strict.returncode == 1


def test_prometheus_textfile(tmp_path: Path) -> None:
    out = tmp_path / "ct200.prom"
    r = doctor(
        "check",
        "--prometheus",
        "--textfile",
        str(out),
        "--facts",
        str(FIX / "ct200-ct-incident.json"),
        "--spec",
        CT200,
    )
    assert r.returncode == 2
    assert out.read_text().splitlines()[:2] == r.stdout.splitlines()[:2]
    lines = r.stdout.splitlines()
    assert 'ct200_doctor_check{check="gpu.cuda_init",severity="error",status="fail"} 1' in lines
    assert 'ct200_doctor_check{check="gpu.cuda_init",severity="error",status="pass"} 0' in lines
    assert "ct200_doctor_exit_code 2" in lines
    assert list(tmp_path.iterdir()) == [out]  # no temporary file left behind


def test_verbose_shows_evidence_of_passing_checks() -> None:
    args = ("check", "--facts", str(FIX / "ct200-ct-healthy.json"), "--spec", CT200)
    assert "idle downshift" not in doctor(*args).stdout
    assert "idle downshift" in doctor(*args, "-v").stdout


def test_snapshot_round_trips_through_check(tmp_path: Path) -> None:
    snap = doctor("snapshot")
    assert snap.returncode == 0
    path = tmp_path / "facts.json"
    path.write_text(snap.stdout)
    r = doctor("check", "--facts", str(path))
    assert r.returncode == 2 and "driver.module" in r.stdout


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"schema_version": 99}', "schema_version 99, this doctor reads 1"),
        ("not json", "not JSON"),
        ('{"a": 1}', "no schema_version"),
        ('{"schema_version": 1, "nvml": {"gpus": 5}}', "facts.nvml.gpus"),
    ],
)
def test_bad_facts_file(tmp_path: Path, content: str, message: str) -> None:
    p = tmp_path / "facts.json"
    p.write_text(content)
    r = doctor("check", "--facts", str(p))
    no_traceback(r)
    assert r.returncode == 2
    assert message in r.stderr


def test_missing_facts_file(tmp_path: Path) -> None:
    r = doctor("check", "--facts", str(tmp_path / "nope.json"))
    no_traceback(r)
    assert r.returncode == 2
    assert "cannot read facts file" in r.stderr


def test_malformed_spec(tmp_path: Path) -> None:
    bad = tmp_path / "site.yml"
    bad.write_text("ct200_site:\n  gpus: {count: 0, model: 5, colour: red}\n")
    for args in (("validate", str(bad)), ("check", "--spec", str(bad))):
        r = doctor(*args)
        no_traceback(r)
        assert r.returncode == 2, args
        assert "gpus.count" in r.stderr and "gpus.colour" in r.stderr


def test_validate_example_site() -> None:
    r = doctor("validate", CT200)
    assert r.returncode == 0, r.stderr
    assert "valid (8 GPUs" in r.stdout


def test_unknown_check_and_list_checks() -> None:
    r = doctor("check", "--only", "gpu.nope")
    no_traceback(r)
    assert r.returncode == 2 and "unknown check 'gpu.nope'" in r.stderr
    listed = doctor("list-checks").stdout.split()
    assert "gpu.cuda_init" in listed and "dev.open" in listed
    rows = json.loads(doctor("list-checks", "--json").stdout)
    assert rows[0]["id"] == "driver.module"
    assert rows[0]["needs"] == ["kernel", "pci"] and rows[0]["tags"] == ["host_devices"]
    lines = doctor("list-checks").stdout.splitlines()
    assert [r["id"] for r in rows] == [line.split()[0] for line in lines]  # registry order


def test_unreadable_sysfs_and_missing_shm_skip_not_crash(tmp_path: Path) -> None:
    """An empty root: no /sys, no /proc, no /dev/shm. Every probe notes why and goes on."""
    from ct200_tools.checks import run_checks  # noqa: PLC0415
    from ct200_tools.probes import collect  # noqa: PLC0415
    from ct200_tools.spec import load_spec  # noqa: PLC0415

    facts = collect(spec=load_spec(CT200), root=tmp_path, cuda=False, timeout_s=5)
    assert "pci" in facts.unreadable and "kernel.release" in facts.unreadable
    assert facts.memory is not None and facts.memory.shm_exists is False
    found = {f.id: f for f in run_checks(facts, load_spec(CT200))}
    assert found["mem.shm"].status == "fail" and "does not exist" in found["mem.shm"].summary
    assert found["tune.pcie_mrrs"].status == "skip"
    assert found["topo.tp_numa"].status == "skip"


def test_internal_error_is_exit_3_without_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ct200_tools.cli import doctor as cli_doctor  # noqa: PLC0415

    def broken(*_: object) -> None:
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(cli_doctor, "run_checks", broken)
    with pytest.raises(SystemExit) as exit_info:
        cli_doctor.main(["check", "--facts", str(FIX / "h200-healthy.json")])
    assert exit_info.value.code == 3
    err = capsys.readouterr().err
    assert "internal error: RuntimeError: simulated bug" in err
    assert "Traceback" not in err


def test_spec_warnings_are_shown(tmp_path: Path) -> None:
    import yaml  # noqa: PLC0415

    site = yaml.safe_load((ROOT / "inventory/ct200/group_vars/all/ct200_site.yml").read_text())
    for server in site["ct200_site"]["servers"]:
        server["enabled"] = server["name"] == "kimi-tp8"
    spec = tmp_path / "site.yml"
    spec.write_text(yaml.safe_dump(site))
    args = ("check", "--facts", str(FIX / "ct200-ct-healthy.json"), "--spec", str(spec))
    text = doctor(*args).stdout
    assert "spec warning: servers[2].gpus: the TP group spans NUMA nodes 0, 1" in text
    doc = json.loads(doctor(*args, "--json").stdout)
    assert any("spans NUMA nodes" in w for w in doc["spec_warnings"])


def test_a_broken_check_is_shown_as_error_and_exits_3(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 9: a check that raises is `error` in text (its own mark), JSON and Prometheus, and
    the run exits 3; the other checks still run and show. The raising function stands in for a
    check bug (no real check raises on valid facts)."""
    import dataclasses  # noqa: PLC0415

    from ct200_tools import checks  # noqa: PLC0415
    from ct200_tools.cli import doctor as cli_doctor  # noqa: PLC0415

    def boom(ctx: object) -> None:
        raise ZeroDivisionError("simulated check bug")

    broken = tuple(
        dataclasses.replace(c, fn=boom) if c.id == "gpu.clocks" else c for c in checks.CHECKS
    )
    monkeypatch.setattr(checks, "CHECKS", broken)
    args = ["check", "--facts", str(FIX / "h200-healthy.json"), "--only", "gpu"]
    outputs = {}
    for fmt in ((), ("--json",), ("--prometheus",)):
        with pytest.raises(SystemExit) as exit_info:
            cli_doctor.main([*args, *fmt])
        assert exit_info.value.code == 3, fmt
        outputs[fmt] = capsys.readouterr().out
    text = outputs[()]
    assert "[☠] gpu.clocks" in text
    assert "the check itself failed (ZeroDivisionError: simulated check bug)" in text
    assert "[✓] gpu.cuda_init" in text
    assert "1 broken (a doctor bug: please report it)" in text
    doc = json.loads(outputs[("--json",)])
    clocks = next(c for c in doc["checks"] if c["id"] == "gpu.clocks")
    assert clocks["status"] == "error" and doc["summary"]["error"] == 1
    assert doc["exit_code"] == 3
    prom = outputs[("--prometheus",)].splitlines()
    assert 'ct200_doctor_check{check="gpu.clocks",severity="warning",status="error"} 1' in prom
    assert 'ct200_doctor_check{check="gpu.cuda_init",severity="error",status="error"} 0' in prom
    assert "ct200_doctor_exit_code 3" in prom


def test_only_dev_without_the_driver_is_not_clean() -> None:
    """Issue 9: on a machine without the driver, `--only dev` skips all three checks. They skip
    because driver.module fails, so the run names it and exits 2, though it was not selected."""
    args = ("check", "--facts", str(FIX / "nodriver-vm.json"), "--only", "dev")
    r = doctor(*args)
    no_traceback(r)
    assert r.returncode == 2, r.stdout
    assert "[✗]" not in r.stdout  # nothing it ran failed: the blocked skips carry the exit code
    assert (
        "driver.module fails (not selected), so dev.nodes, dev.majors, dev.open could not be "
        "checked: see it with `ct200-doctor check --only driver.module`"
    ) in r.stdout
    doc = json.loads(doctor(*args, "--json").stdout)
    assert doc["exit_code"] == 2
    assert {c["id"]: (c["status"], c["caused_by"]) for c in doc["checks"]} == {
        "dev.nodes": ("skip", "driver.module"),
        "dev.majors": ("skip", "driver.module"),
        "dev.open": ("skip", "driver.module"),  # through dev.nodes, itself blocked
    }
    # Selected together, the root cause shows as the failure and the dependants point at it.
    both = json.loads(doctor(*args, "--only", "driver.module", "--json").stdout)
    assert both["exit_code"] == 2 and both["summary"]["fail"] == 1
    assert both["checks"][0]["id"] == "driver.module" and both["checks"][0]["status"] == "fail"


def test_a_skip_whose_cause_passes_is_only_a_skip() -> None:
    """caused_by is kept only when the named check really fails: with the module loaded and
    NVML readable, nothing blocks the dev checks of the healthy H200."""
    r = doctor("check", "--facts", str(FIX / "h200-healthy.json"), "--only", "dev", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 0
    assert all(c["caused_by"] is None for c in doc["checks"])


def test_selecting_no_check_is_a_usage_error() -> None:
    r = doctor("check", "--facts", str(FIX / "h200-healthy.json"), "--only", "gpu", "--skip", "gpu")
    no_traceback(r)
    assert r.returncode == 2
    assert "--only gpu --skip gpu selects no check" in r.stderr
    assert r.stdout == ""


def test_a_run_that_checks_nothing_is_not_clean() -> None:
    """Every selected check skipped (MRRS cannot be read in an unprivileged container): the
    run says nothing was checked and exits 2, never 0."""
    r = doctor(
        "check",
        "--facts",
        str(FIX / "ct200-ct-healthy.json"),
        "--spec",
        CT200,
        "--only",
        "tune.pcie_mrrs",
    )
    assert r.returncode == 2, r.stdout
    assert "[-] tune.pcie_mrrs" in r.stdout
    assert "nothing was checked: every selected check was skipped" in r.stdout
