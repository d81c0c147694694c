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
    assert set(doc["summary"]) == {"pass", "warn", "fail", "skip"}
    for c in doc["checks"]:
        assert set(c) >= {"id", "status", "severity", "summary", "evidence", "remediation"}
        assert c["status"] in ("pass", "warn", "fail", "skip")
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
