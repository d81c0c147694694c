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
    # No NVIDIA GPU on this machine's PCI bus: it says so, and suggests no modprobe (issue 9).
    assert "not a GPU machine" in r.stdout
    assert "$ lspci -nn -d 10de:" in r.stdout
    assert "modprobe" not in r.stdout
    assert "1 root cause (3 failed checks): driver.module" in r.stdout


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
    assert doc["root_causes"] == ["dev.open", "models.staged"]
    cuda = next(c for c in doc["checks"] if c["id"] == "gpu.cuda_init")
    assert cuda["caused_by"] == "dev.open"
    # The devN lines are lines of the container's config, said apart from commands.
    assert cuda["remediation"]["command"] is None
    assert cuda["remediation"]["file"] == "/etc/pve/lxc/200.conf"
    assert cuda["remediation"]["config"][8:] == [
        "dev8: /dev/nvidiactl,mode=0666",
        "dev9: /dev/nvidia-uvm,mode=0666",
        "dev10: /dev/nvidia-uvm-tools,mode=0666",
    ]
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
    assert "ct200_doctor_root_causes 2" in lines  # dev.open, models.staged
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
    bad.write_text("ct200_site:\n  gpus: {count: -1, model: 5, colour: red}\n")
    for args in (("validate", str(bad)), ("check", "--spec", str(bad))):
        r = doctor(*args)
        no_traceback(r)
        assert r.returncode == 2, args
        assert "gpus.count" in r.stderr and "gpus.colour" in r.stderr


def test_validate_example_site() -> None:
    r = doctor("validate", CT200)
    assert r.returncode == 0, r.stderr
    assert "valid (8 GPUs, 4 models, 4 servers, 2 enabled)" in r.stdout


def test_validate_counts_one_gpu_in_the_singular(tmp_path: Path) -> None:
    site = tmp_path / "site.yml"
    site.write_text("ct200_site:\n  gpus: {count: 1, model: H200}\n", encoding="utf-8")
    r = doctor("validate", str(site))
    assert r.returncode == 0, r.stderr
    assert "valid (1 GPU, 0 models, 0 servers, 0 enabled)" in r.stdout


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
    from ct200_tools.doctor.checks import run_checks  # noqa: PLC0415
    from ct200_tools.doctor.probes import collect  # noqa: PLC0415
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

    from ct200_tools.cli import doctor as cli_doctor  # noqa: PLC0415
    from ct200_tools.doctor import checks  # noqa: PLC0415

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


# -- issue 9, section 4: facts files that must be refused, saying what and where ---------------
INCIDENT = str(FIX / "ct200-ct-incident.json")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            (FIX / "h200-healthy.json")
            .read_text()
            .replace('"vm"', '"caf\u00e9"', 1)
            .encode("latin-1"),
            "not UTF-8: byte 0xe9 at line 4, column 19",
        ),
        ((FIX / "h200-healthy.json").read_text().encode("utf-16"), "encoded as UTF-16LE"),
        (
            b'{"schema_version": 1,\n "memory": {"shm_size": ' + b"7" * 5000 + b"}}",
            "an integer of 5000 digits at line 2, column 25: no fact has more than 24",
        ),
        (
            (FIX / "h200-healthy.json")
            .read_text()
            .replace('"nvml": {', '"nvml": null, "x": {', 1)
            .encode(),
            "facts.nvml is null and facts.unreadable.nvml does not say why",
        ),
    ],
    ids=["latin-1", "utf-16", "5000-digits", "null-section"],
)
def test_facts_file_encoding_numbers_and_null_sections(
    tmp_path: Path, content: bytes, message: str
) -> None:
    p = tmp_path / "facts.json"
    p.write_bytes(content)
    r = doctor("check", "--facts", str(p))
    no_traceback(r)
    assert r.returncode == 2, r.stderr
    assert f"ct200-doctor: facts file {p}: {message}" in r.stderr
    assert "internal error" not in r.stderr and r.stdout == ""


def test_facts_from_dev_zero_ends_with_exit_2() -> None:
    r = doctor("check", "--facts", "/dev/zero")
    no_traceback(r)
    assert r.returncode == 2
    assert "a device, not a regular file" in r.stderr and "fix:" in r.stderr


# -- section 5: output plumbing ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("{tmp}/typo/ct200.prom", "{tmp}/typo does not exist; the doctor creates no directories"),
        ("{tmp}/file/ct200.prom", "{tmp}/file is not a directory"),
        ("/proc/ct200.prom", "cannot create files in /proc (a kernel filesystem)"),
        ("/sys/ct200.prom", "cannot create files in /sys (a kernel filesystem)"),
        ("{tmp}", "is a directory"),
    ],
    ids=["missing-dir", "file-as-dir", "proc", "sys", "a-directory"],
)
def test_textfile_target_refused_before_anything(tmp_path: Path, target: str, message: str) -> None:
    (tmp_path / "file").write_text("x")
    before = sorted(tmp_path.rglob("*"))
    t = target.format(tmp=tmp_path)
    r = doctor("check", "--facts", INCIDENT, "--textfile", t)
    no_traceback(r)
    assert r.returncode == 2
    assert message.format(tmp=tmp_path) in r.stderr, r.stderr
    assert "--textfile" in r.stderr and t in r.stderr  # names the target, no temporary file
    assert ".tmp-" not in r.stderr and r.stdout == ""
    assert sorted(tmp_path.rglob("*")) == before  # no directory created, nothing left


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--json", "--prometheus"), "--json and --prometheus both choose what is printed"),
        (("--facts", INCIDENT), "--facts given 2 times: give it once"),
        (("--spec", CT200, "--spec", CT200), "Invalid value for '--spec': given 2 times"),
        (("--textfile=/tmp/a.prom", "--textfile", "/tmp/b.prom"), "--textfile given 2 times"),
        (("--deep",), "--deep changes how this machine is probed, and --facts probes nothing"),
        (("--timeout", "5"), "--timeout changes how this machine is probed"),
        (("--cuda-init", "all"), "take the snapshot with `ct200-doctor snapshot --cuda-init all`"),
    ],
    ids=[
        "json-prometheus",
        "facts-twice",
        "spec-twice",
        "textfile-twice",
        "deep",
        "timeout",
        "cuda-init",
    ],
)
def test_conflicting_or_ignored_flags_are_usage_errors(args: tuple[str, ...], message: str) -> None:
    r = doctor("check", "--facts", INCIDENT, *args)
    no_traceback(r)
    assert r.returncode == 2
    assert message in r.stderr, r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "-inf", "1e9", "soon"])
def test_timeout_must_be_a_sane_number_of_seconds(value: str) -> None:
    for command in ("check", "snapshot"):
        r = doctor(command, f"--timeout={value}")
        no_traceback(r)
        assert r.returncode == 2, (command, r.stdout)
        assert "Invalid value for '--timeout'" in r.stderr
        assert "driver hung" not in r.stdout + r.stderr


def test_spec_from_the_environment_and_the_flag_is_no_repeat() -> None:
    import os  # noqa: PLC0415

    r = doctor(
        "check", "--facts", INCIDENT, "--spec", CT200, env={**os.environ, "CT200_SPEC": CT200}
    )
    assert r.returncode == 2 and "given 2 times" not in r.stderr


def test_a_reader_leaving_early_keeps_the_exit_code() -> None:
    """`ct200-doctor check | head -1`: the pipe closes before the report is written; the exit
    code is still the verdict's (was 1, click's EPIPE code) and nothing is printed about it."""
    import os  # noqa: PLC0415

    for facts, want in ((INCIDENT, 2), (str(FIX / "ct200-ct-healthy.json"), 0)):
        for fmt in ((), ("--json",)):
            read, write = os.pipe()
            os.close(read)  # the reader is gone before the doctor writes
            try:
                r = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "ct200_tools.cli.entry",
                        "check",
                        "--facts",
                        facts,
                        "--spec",
                        CT200,
                        *fmt,
                    ],
                    stdout=write,
                    stderr=subprocess.PIPE,
                    text=True,
                    check=False,
                    timeout=60,
                    cwd=ROOT,
                )
            finally:
                os.close(write)
            assert r.returncode == want, (facts, fmt, r.stderr)
            assert r.stderr == "", r.stderr


def test_list_checks_into_a_closed_pipe_exits_0() -> None:
    import os  # noqa: PLC0415

    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run(
            [sys.executable, "-m", "ct200_tools.cli.entry", "list-checks"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
            timeout=60,
            cwd=ROOT,
        )
    finally:
        os.close(write)
    assert (r.returncode, r.stderr) == (0, "")


def test_a_closed_stdout_keeps_the_exit_code_and_says_so() -> None:
    for facts, want in ((INCIDENT, 2), (str(FIX / "ct200-ct-healthy.json"), 0)):
        r = subprocess.run(
            [
                "sh",
                "-c",
                'exec "$@" >&-',
                "sh",
                sys.executable,
                "-m",
                "ct200_tools.cli.entry",
                "check",
                "--facts",
                facts,
                "--spec",
                CT200,
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
            cwd=ROOT,
        )
        assert r.returncode == want, r.stderr
        no_traceback(r)
        assert "standard output is closed: the report is not shown" in r.stderr


# -- section 6: messages -------------------------------------------------------------------------
def test_no_spec_is_said_once() -> None:
    from ct200_tools.doctor.checks import CHECKS  # noqa: PLC0415 - beside its use

    r = doctor("check", "--facts", str(FIX / "nodriver-vm.json"))
    assert r.stdout.count("pass --spec FILE") == 1, r.stdout
    # The registry's count, so a check added (a tuning's two) changes no figure here.
    needing = sum(c.needs_spec for c in CHECKS)
    assert needing > 20
    assert r.stdout.splitlines()[1] == (
        f"no site spec, so {needing} checks that need one are skipped: pass --spec FILE or an "
        "inventory dir, or install /etc/ct200/site.yml (playbooks/site.yml does)"
    )
    assert "[-] gpu.count            needs the site spec" in r.stdout


def test_snapshot_without_spec_explains_the_models_check(tmp_path: Path) -> None:
    snap = doctor("snapshot")
    assert snap.returncode == 0
    path = tmp_path / "facts.json"
    path.write_text(snap.stdout)
    r = doctor("check", "--facts", str(path), "--spec", CT200, "--only", "models.staged")
    assert "[-] models.staged" in r.stdout
    assert "models not probed" in r.stdout
    assert "no site spec when the facts were read" in r.stdout  # the reason, from the snapshot
    # An older snapshot (an empty list, no reason recorded) still gets a reason, not a guess.
    old = doctor(
        "check", "--facts", str(FIX / "nodriver-vm.json"), "--spec", CT200, "--only", "models"
    )
    assert "a snapshot taken without a site spec looks at none" in old.stdout


def test_cuda_init_says_the_libcuda_error_once() -> None:
    r = doctor("check", "--facts", str(FIX / "nodriver-vm.json"), "--json")
    cuda = next(c for c in json.loads(r.stdout)["checks"] if c["id"] == "gpu.cuda_init")
    assert cuda["summary"] == (
        "CUDA unavailable: libcuda.so.1 not found (cannot open shared object file: No such file "
        "or directory); the NVIDIA kernel module is not loaded"
    )


def test_no_plural_slips_on_any_fixture() -> None:
    """ "1 GPUs", "2 device node(s)": counts agree with their nouns in every report."""
    import re  # noqa: PLC0415

    bad = re.compile(r"\(s\)|\b1 (GPUs|devices|nodes|device nodes|models|warnings|checks|chunks)\b")
    for path in sorted(FIX.glob("*.json")):
        for spec in ((), ("--spec", CT200)):
            out = doctor("check", "--facts", str(path), "-v", *spec).stdout
            assert not bad.search(out), (path.name, bad.search(out))


def test_cuda_init_modes_on_this_driverless_machine() -> None:
    """Both modes run here; per-GPU mode, with no GPU to list, runs the one all-GPU child and
    the snapshot says why. A mode that does not exist is a usage error."""
    for mode in ("per-gpu", "all"):
        r = doctor("snapshot", "--cuda-init", mode)
        no_traceback(r)
        assert r.returncode == 0, r.stderr
        cuda = json.loads(r.stdout)["cuda"]
        assert cuda["mode"] == "all" and "gpus" not in cuda
        assert cuda["error"].startswith("libcuda.so.1 not found")
        if mode == "per-gpu":
            assert cuda["note"].startswith("cannot list /proc/driver/nvidia/gpus")
        else:
            assert "note" not in cuda
    r = doctor("check", "--cuda-init", "both")
    no_traceback(r)
    assert r.returncode == 2
    assert "Invalid value for '--cuda-init': 'both' is not one of 'per-gpu', 'all'" in r.stderr
