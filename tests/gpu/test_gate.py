"""The start gate on a real GPU: CUDA initialised on the server's GPUs only, go on a healthy
machine, and no-go with the incident's root cause and fix when the cgroup denies nvidia-uvm.

Run on the GPU machine: python -m pytest tests/gpu/test_gate.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.gpu import faults

STAGED = Path(f"/dev/shm/ct200-gpu-gate-{os.getpid()}")


def uvm_major() -> int:
    for line in Path("/proc/devices").read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] == "nvidia-uvm":
            return int(parts[0])
    raise AssertionError("nvidia-uvm not in /proc/devices")


@pytest.fixture
def site(tmp_path: Path, smi_gpus: list[dict[str, str]]) -> Iterator[tuple[Path, dict[str, str]]]:
    """A site with one server on the machine's last GPU (one model, staged for real)."""
    source = tmp_path / "models" / "bench"
    source.mkdir(parents=True)
    (source / "weights.bin").write_bytes(os.urandom(1 << 20))
    last = len(smi_gpus) - 1
    name = smi_gpus[0]["name"].removeprefix("NVIDIA ").strip()
    doc = {
        "ct200_site": {
            "pve": {"vmid": 200, "passthrough": "devn"},
            "gpus": {"count": len(smi_gpus), "model": name},
            "models": [{"name": "bench", "source": str(source), "staged": f"{STAGED}/bench"}],
            "servers": [
                {
                    "name": "bench",
                    "engine": "command",
                    "model": "bench",
                    "gpus": [last],
                    "port": 18099,
                    "command": [sys.executable, "-m", "http.server", "18099"],
                }
            ],
        }
    }
    path = tmp_path / "site.yml"
    path.write_text(yaml.safe_dump(doc))
    env = {**os.environ, "CT200_MANIFEST_DIR": str(tmp_path / "manifests")}
    stage = [sys.executable, "-m", "ct200_tools.cli.stage", "stage", "bench"]
    r = subprocess.run(
        [*stage, "--spec", str(path), "--create-manifest"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        yield path, env
    finally:
        subprocess.run(["rm", "-rf", str(STAGED)], check=False)


def gate(
    path: Path, env: dict[str, str], denied: int | None = None
) -> subprocess.CompletedProcess[str]:
    argv = faults.doctor_argv("gate", "bench", "--spec", str(path))
    if denied is not None:
        old = os.environ.get("CT200_MANIFEST_DIR")
        os.environ["CT200_MANIFEST_DIR"] = env["CT200_MANIFEST_DIR"]
        try:
            return faults.run_denied(argv, denied)
        finally:
            if old is None:
                del os.environ["CT200_MANIFEST_DIR"]
            else:
                os.environ["CT200_MANIFEST_DIR"] = old
    return subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=120)


def test_gate_goes_with_cuda_on_the_servers_gpu_only(site: tuple[Path, dict[str, str]]) -> None:
    path, env = site
    r = gate(path, env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1].startswith("ct200-doctor gate bench: go (")
    # cuInit in the gate sees the server's one GPU, however many the machine has.
    assert "a CUDA context on each of 1 GPU (one child per GPU)" in r.stdout, r.stdout


def test_gate_stops_a_server_whose_cgroup_denies_nvidia_uvm(
    site: tuple[Path, dict[str, str]],
) -> None:
    path, env = site
    major = uvm_major()
    r = gate(path, env, denied=major)
    assert r.returncode == 2, r.stdout + r.stderr
    last = r.stdout.splitlines()[-1]
    assert last.startswith("ct200-doctor gate bench: no-go: dev.open: "), last
    assert f"denies c {major}:0 (nvidia-uvm)" in last
    # In a container the fix is the devN block for the host; elsewhere the unit's DeviceAllow:
    # lines of a file, said as such.
    assert (
        "fix on host: in /etc/pve/lxc/" in last and ": dev0: /dev/nvidia0,mode=0666" in last
    ) or (
        "fix on this machine: in the [Service] section of the systemd unit that starts the "
        "program: DeviceAllow=char-nvidia-uvm rw" in last
    ), last
    assert "gpu.cuda_init" in r.stdout  # shown under its root, not as a second fault


def test_check_server_records_probe_times(site: tuple[Path, dict[str, str]]) -> None:
    """The probes a one-server check ran and how long each took (printed: the overhead figure's
    detail), with cuInit on the server's GPU."""
    path, env = site
    r = subprocess.run(
        faults.doctor_argv("check", "--server", "bench", "--spec", str(path), "--json"),
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )
    doc = json.loads(r.stdout)
    probes = {p["name"]: p["duration_s"] for p in doc["probes"]}
    print(f"\ncheck --server bench probes: {probes}")
    assert probes["cuda"] > 0
    cuda = {c["id"]: c for c in doc["checks"]}["gpu.cuda_init"]
    assert cuda["status"] == "pass" and "on each of 1 GPU" in cuda["summary"]
