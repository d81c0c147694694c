"""Every benchmark's one-line command, run at a tiny size, so that a refactor cannot break one
unnoticed. The figures of a smoke run mean nothing; what is checked is that each command runs to
the end and writes a complete report of the right shape.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=570,
        check=False,
    )


@pytest.fixture
def shm_dst() -> Iterator[Path]:
    """A destination on tmpfs, as the staging benchmark's default, of this test's own."""
    dst = Path("/dev/shm") / f"ct200-bench-smoke-{uuid.uuid4().hex[:8]}"
    yield dst
    shutil.rmtree(dst, ignore_errors=True)


def test_stage_benchmark(tmp_path: Path, shm_dst: Path) -> None:
    """benchmarks/stage/run.sh: every contender on 4 MiB in 1 MiB shards, one round."""
    out, data = tmp_path / "out", tmp_path / "data"
    proc = run(
        [
            "bash",
            "benchmarks/stage/run.sh",
            "--out",
            str(out),
            "--size",
            "4M",
            "--shard-size",
            "1M",
            "--rounds",
            "1",
            "--data",
            str(data),
            "--dst",
            str(shm_dst),
            "--remove-data",
        ],
        env={"PYTHON": sys.executable},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "results.json").read_text())
    assert report["schema_version"] == 1
    assert report["rounds"] == 1
    # 4 shards of 1 MiB, and the small JSON files of a checkpoint (index, config, tokenizer).
    assert 4 << 20 <= report["bytes"] < 5 << 20 and report["files"] == 7, report
    ran = set(report["mb_per_s"])
    assert {"ct200-stage", "ct200-stage-direct", "cp", "cat-parallel", "write-parallel"} <= ran
    assert ran | set(report["skipped"]) >= {"rsync"}
    assert all(v["median"] > 0 and len(v["runs"]) == 1 for v in report["mb_per_s"].values())
    assert {"ct200-stage/cp", "ct200-stage/cat-parallel"} <= set(report["ratios"])
    assert report["machine"]["dst_fs"] == "tmpfs"
    text = (out / "results.txt").read_text()
    assert text.startswith("ct200-stage benchmark:") and "reproduce:" in text
    assert (out / "manifest.json").is_file()
    assert not data.exists(), "--remove-data left the generated data"
    assert not shm_dst.exists(), "the benchmark left its destination behind"


def test_stage_breakdown_benchmark(tmp_path: Path, shm_dst: Path) -> None:
    """The breakdown command of docs/staging.md ("where the time goes"), at a tiny size: every
    --only contender, with ct200-threadtime's share of the threads' time in the report."""
    from benchmarks.stage.__main__ import BREAKDOWN  # noqa: PLC0415

    out = tmp_path / "out"
    only = ["ct200-stage", "cat-parallel", "ct200-jobs2", *BREAKDOWN]
    argv = [sys.executable, "-m", "benchmarks.stage", "--out", str(out), "--size", "4M"]
    argv += ["--shard-size", "1M", "--rounds", "2", "--data", str(tmp_path / "data")]
    argv += ["--dst", str(shm_dst), "--only", ",".join(only), "--jobs", "4"]
    proc = run(argv)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "results.json").read_text())
    assert set(report["mb_per_s"]) == set(only)
    assert all(len(v["runs"]) == 2 for v in report["mb_per_s"].values())
    share = report["thread_time"]["median_share"]
    assert set(share) == {"read", "hash", "write", "drop", "other"}
    assert share["read"] > 0 and share["write"] > 0 and share["hash"] > 0
    assert 0.99 <= sum(share.values()) <= 1.01, share
    # Up to --jobs threads read: on a busy machine the last to start may find no work left.
    assert all(1 <= t["threads"] <= 4 for t in report["thread_time"]["runs"]), report
    assert "ct200-threadtime, share of the threads' wall time" in (out / "results.txt").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "results.json", "results.txt"]


def test_gate_benchmark(tmp_path: Path) -> None:
    """benchmarks/gate/run.py: the start gate against the whole doctor (and the cuInit floor on
    a GPU machine; with llama-server built, the server's own start), one round. No GPU here: the
    gate says no-go, which is a verdict, timed like a go; it fails only if the doctor broke."""
    from testbed import llama_build  # noqa: PLC0415

    llama = llama_build.cached()
    argv = [sys.executable, "benchmarks/gate/run.py", "--gpus", "0", "--runs", "1"]
    argv += ["--out", str(tmp_path)]
    if llama is not None:
        argv += ["--llama", str(llama)]
    proc = run(argv, env={"PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "gate.json").read_text())
    rows = {r["command"]: r for r in report["rows"]}
    assert rows["ct200-doctor gate"]["median_s"] > 0 and rows["ct200-doctor gate"]["vs_gate"] == 1
    assert rows["ct200-doctor check"]["median_s"] > 0
    assert set(report["exit_codes"]["ct200-doctor gate"]) <= {0, 2}
    assert report["gate_verdict"].startswith("ct200-doctor gate bench: ")
    assert ("server start to first completion" in rows) is (llama is not None)
    if not report["gpu"]:
        assert report["gate_over_cuinit"] is None
        assert "no GPU here" in (tmp_path / "gate.txt").read_text()
    assert not list(Path("/dev/shm").glob("ct200-bench-gate-*/bench/*.bin")), "left in /dev/shm"


def test_doctor_benchmark(tmp_path: Path) -> None:
    """benchmarks/doctor/run.py: the doctor in both CUDA modes against bare cuInit (all GPUs
    and one) and nvidia-smi -q, two rounds. Without a GPU (here) it times the doctor alone and
    says so; it fails if the doctor broke."""
    proc = run(
        [
            sys.executable,
            "benchmarks/doctor/run.py",
            "--spec",
            "benchmarks/doctor/h200-site.yml",
            "--runs",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "doctor.json").read_text())
    assert report["schema_version"] == 2
    doctors = ("ct200-doctor check", "ct200-doctor check --cuda-init all")
    for k in report["gpu_counts"] or [None]:
        rows = {r["command"]: r for r in report["rows"] if r["gpus"] == k}
        for name in doctors:
            assert rows[name]["median_s"] > 0, rows
        if report["gpu"]:
            assert rows["bare cuInit, one GPU"]["vs_cuinit_one_gpu"] == 1.0
            assert rows["bare cuInit, all k GPUs"]["vs_cuinit_all_gpus"] == 1.0
            assert rows["bare cuInit+context, one proc per GPU"]["median_s"] > 0
            assert len(report["cuda_children"][str(k)]) == k
        else:
            assert set(rows) == set(doctors)
            assert all(r["vs_cuinit_one_gpu"] is None for r in rows.values())
    assert set(report["doctor_exit_codes"]) <= {0, 1, 2}
    assert {p["name"] for p in report["probes"]} >= {"cuda", "nvml", "pci", "devices"}
    text = (tmp_path / "doctor.txt").read_text()
    if not report["gpu"]:
        assert report["gpu_counts"] == [] and report["goal"] == {}
        assert "no GPU here" in text and "no GPU here" in proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.testbed
def test_ansible_benchmark(testbed_requirements: None) -> None:
    """benchmarks/ansible: one warm start, the first converge, one re-run of each play, on a
    test slot of its own (booted and taken down by the benchmark). Tiny size: host.yml (the
    host's roles) instead of site.yml, the same code paths at a third of the time."""
    argv = [sys.executable, "-m", "benchmarks.ansible.bench", "--reps", "1", "--starts", "1"]
    proc = run([*argv, "--playbook", "playbooks/host.yml", "--json"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # The figures are the last thing it prints: one JSON object (the harness may print before).
    figures = json.loads(proc.stdout[proc.stdout.rfind("\n{\n") + 1 :])
    for key in ("warm_start_s", "warm_boot_s", "site_rerun_s", "facts_only_s"):
        assert figures[key]["median"] > 0, figures
    assert figures["first_converge_s"] > 0 and figures["playbook"] == "playbooks/host.yml"
    assert figures["ratio_site_rerun_to_facts"] > 0
    assert figures["site_rerun_without_pipelining_controlpersist_s"]["median"] > 0


@pytest.mark.testbed
def test_hostdoctor_benchmark(testbed_requirements: None) -> None:
    """benchmarks/hostdoctor: one round, on a test slot of its own (booted and taken down by the
    benchmark); tests/testbed/test_host_doctor.py runs it on its converged host too."""
    proc = run([sys.executable, "-m", "benchmarks.hostdoctor.bench", "--reps", "1", "--json"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = json.loads(proc.stdout[proc.stdout.rfind("\n{\n") + 1 :])
    assert figures["reps"] == 1
    for key in ("doctor_host_s", "ssh_true_s", "doctor_local_s", "ratio_host_to_ssh_plus_local"):
        assert figures[key] > 0, figures
    # The host was read (the doctor did not stop at the connection): exit 0-2, not bad input.
    assert figures["doctor_host_rc"] in (0, 1, 2), figures


@pytest.mark.testbed
def test_servers_benchmark(testbed_requirements: None, tmp_path: Path) -> None:
    """benchmarks/servers: one round of each measure, on a test slot of its own."""
    proc = run(
        [sys.executable, "-m", "benchmarks.servers.bench", "--runs", "1", "--out", str(tmp_path)]
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "results.json").read_text())
    assert report["schema_version"] == 1 and report["runs"] == 1
    starts = report["start_to_first_completion_s"]
    assert starts["gated_unit"] > 0 and starts["bare_unit"] > 0
    assert report["gated_unit"]["exec_start_pre_s"] > 0
    assert set(report["alone_s"]) == {
        "ct200-doctor gate",
        "ct200-serve preflight",
        "ct200-serve wait-ready (serving)",
    }
    assert report["ratio_exec_start_pre_to_server_own_start"] > 0
    steps = report["switch_steps_s"]
    assert set(steps) == {"tiny -> tiny-b", "tiny-b -> tiny"}
    for direction in steps.values():
        assert {"plan", "stop", "start", "persist", "total"} <= set(direction)
    text = (tmp_path / "results.txt").read_text()
    assert text.startswith("benchmarks/servers:") and "reproduce:" in text


@pytest.mark.testbed
def test_recovery_benchmark(testbed_requirements: None, tmp_path: Path) -> None:
    """benchmarks/recovery: one reboot and one recover.yml against its no-op play."""
    proc = run(
        [sys.executable, "-m", "benchmarks.recovery.bench", "--runs", "1", "--out", str(tmp_path)]
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "results.json").read_text())
    assert report["schema_version"] == 2 and report["runs"] == 1
    steps = report["boot_to_first_completion_by_step_s"]
    assert list(steps) == [
        "host_boot_and_pve_guests",
        "container_to_systemd",
        "stage tiny-a",
        "server tiny",
        "first_completion",
        "total",
    ]
    assert report["floor_staging_alone_s"] > 0 and report["server_load_alone_s"] > 0
    assert report["recover_good_machine_s"] > 0
    for floor in ("issue", "strict"):
        assert report[f"noop_{floor}_s"] > 0 and report[f"ratio_recover_to_noop_{floor}"] > 0
        assert {"ct200-pve", "ct200-ct"} <= set(report[f"noop_{floor}_tasks_per_host"])
    # The issue's floor counts the skipped tasks too: never fewer tasks than the strict one.
    issue, strict = report["noop_issue_tasks_per_host"], report["noop_strict_tasks_per_host"]
    for host, kinds in strict.items():
        assert all(issue[host].get(kind, 0) >= n for kind, n in kinds.items()), (issue, strict)
    assert report["recover_within_goal"] == (
        report["recover_good_machine_s"] <= report["noop_issue_s"]
    )
    text = (tmp_path / "results.txt").read_text()
    assert text.startswith("benchmarks/recovery:") and "reproduce:" in text


@pytest.mark.parametrize("mode", ["per-gpu", "all"])
def test_doctor_phases(mode: str) -> None:
    """benchmarks/doctor/phases.py: the doctor's own path, phase by phase, one run; the phases
    end in order (each stamp after the one before)."""
    proc = subprocess.run(
        [
            sys.executable,
            "benchmarks/doctor/phases.py",
            "--spec",
            "benchmarks/doctor/h200-site.yml",
            "--runs",
            "1",
            "--cuda-init",
            mode,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    ends = {
        line[:14].strip(): float(line[14:].split()[0])
        for line in proc.stdout.splitlines()[1:]
        if line.startswith("  ")
    }
    order = ["prestarted", "imported", "spec", "probed", "judged", "rendered"]
    assert [ends[p] for p in order] == sorted(ends[p] for p in order)
    assert ends["process"] >= ends["rendered"]


def test_fleet_benchmark(tmp_path: Path) -> None:
    """benchmarks/fleet/bench.py: doctor.yml on 3 local inventory hosts against the no-op floor
    and one host alone, and with the stand-in doctor; one run each, one forks value."""
    proc = run(
        [
            sys.executable,
            "-m",
            "benchmarks.fleet.bench",
            "--hosts",
            "3",
            "--reps",
            "1",
            "--forks",
            "3",
            "--standin-seconds",
            "0.1",
            "--out",
            str(tmp_path),
        ]
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "fleet.json").read_text())
    assert report["schema_version"] == 1 and report["hosts"] == 3 and report["forks"] == [3]
    assert report["cpus"] >= 1 and report["slowest_host_s"] > 0
    rows = report["rows"]
    assert set(rows) == {
        "one host",
        "no-op floor, forks 3, linear",
        "fleet, forks 3, linear",
        "no-op floor, forks 3, free",
        "fleet, forks 3, free",
        "stand-in 0.1 s, forks 3, linear",
        "stand-in 0.1 s, forks 3, free",
    }
    assert all(r["median_s"] > 0 and len(r["runs_s"]) == 1 for r in rows.values())
    assert rows["fleet, forks 3, linear"]["vs_floor_plus_slowest"] > 0
    assert rows["stand-in 0.1 s, forks 3, free"]["vs_floor_plus_slowest"] > 0
    # Three hosts judged: the healthy snapshot ok, the incident ones failing, none broken.
    assert report["fleet_summary"]["ok"] == 1 and report["fleet_summary"]["fail"] == 2
    assert report["fleet_summary"]["broke"] == 0
    text = (tmp_path / "fleet.txt").read_text()
    assert text.startswith("fleet doctor benchmark: 3 inventory hosts") and "reproduce:" in text


def test_bench_client_benchmark(tmp_path: Path) -> None:
    """benchmarks/bench_client/run.py: both modes at two small levels, 4 requests each."""
    proc = run(
        [
            sys.executable,
            "benchmarks/bench_client/run.py",
            "--out",
            str(tmp_path),
            "--concurrency",
            "1,2",
            "--requests",
            "4",
            "--output-tokens",
            "4",
            "--paced-itl-ms",
            "1",
        ]
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "results.json").read_text())
    rows = report["rows"]
    assert [(r["mode"], r["concurrency"]) for r in rows] == [
        ("instant", 1),
        ("instant", 2),
        ("paced", 1),
        ("paced", 2),
    ]
    assert all(r["requests_failed"] == 0 and r["output_tokens_per_s"] > 0 for r in rows)
    assert all(set(r["itl_ms"]) == {"mean", "p50", "p90", "p99"} for r in rows)
    assert "written:" in proc.stdout
