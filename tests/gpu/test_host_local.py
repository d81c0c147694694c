"""On the GPU machine: `ct200-doctor check --host local` runs the host checks on this machine
through the plain Reader (no SSH), and host.pcie_mrrs reads the same MRRS, GPU by GPU, as the
container-side tune.pcie_mrrs reads from the same config space. Read only.

The spec asks for the MRRS this machine has now (read with the pci probe first), so both checks
judge the same value; what is compared is their evidence, per GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ct200_tools.doctor.probes.base import Reader
from ct200_tools.doctor.probes.pci import probe_pci
from tests.gpu.conftest import write_spec

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


def doctor(*args: str) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "ct200_tools.cli.entry", "check", "--json", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def test_host_checks_run_locally_and_agree_on_mrrs(
    tmp_path: Path, smi_gpus: list[dict[str, str]]
) -> None:
    gpus = probe_pci(Reader())
    assert gpus, "no NVIDIA GPU on the PCI bus"
    mrrs = {g.max_read_request for g in gpus}
    if None in mrrs:
        pytest.skip("config space beyond the header is not readable here (not root?)")
    spec = write_spec(tmp_path / "site.yml", smi_gpus)
    text = spec.read_text().replace(
        "pcie_max_read_request: null", f"pcie_max_read_request: {max(mrrs)}"
    )
    spec.write_text(text)
    rc, report, err = doctor(
        "--spec", str(spec), "--host", "local", "--only", "tune.pcie_mrrs", "--only", "host"
    )
    assert report["host"] is not None and report["host"]["via"] == "local", (report, err)
    checks = {c["id"]: c for c in report["checks"]}
    host, here = checks["host.pcie_mrrs"], checks["tune.pcie_mrrs"]
    assert host["status"] in ("pass", "fail"), host
    assert host["status"] == here["status"], (host, here)
    # The same GPUs, the same MRRS and MPS, read once as the host and once as this machine.
    assert host["evidence"] == here["evidence"], (host, here)
    assert host["evidence"] == [
        f"{g.bdf}: MRRS {g.max_read_request} MPS {g.max_payload}" for g in gpus
    ]
    # No SSH was involved, and the host's own checks judged this machine's facts.
    assert "ssh" not in report["host"]["via"]
    assert checks["host.numa_balancing"]["status"] != "error"
    assert checks["host.acs"]["status"] != "error"
    assert rc in (0, 1, 2), err
