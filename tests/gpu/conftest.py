"""GPU tests: run only where an NVIDIA driver and GPU exist (the lent GPU machine)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.gpu import nvsmi
from tests.gpu.carried import use_carried_wheels

use_carried_wheels()  # before any test module imports gguf or ct200_tools' xxhash/psutil


def _has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and Path("/dev/nvidiactl").exists()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU here: tests/gpu runs on the GPU machine")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smi_gpus() -> list[dict[str, str]]:
    return nvsmi.query_gpus()


def write_spec(path: Path, gpus: list[dict[str, str]], passthrough: str = "devn") -> Path:
    """A spec that truthfully describes this machine (from nvidia-smi, not from the doctor)."""
    name = gpus[0]["name"].removeprefix("NVIDIA ").strip()
    path.write_text(
        "ct200_site:\n"
        f"  pve: {{vmid: 200, passthrough: {passthrough}}}\n"
        f'  gpus:\n    count: {len(gpus)}\n    model: "{name}"\n'
        f"    pcie: {{gen: {gpus[0]['pcie.link.gen.max']}, "
        f"width: {gpus[0]['pcie.link.width.max']}}}\n"
        "  tuning: {numa_balancing: 0, pcie_max_read_request: null}\n",
        encoding="utf-8",
    )
    return path


@pytest.fixture
def machine_spec(tmp_path: Path, smi_gpus: list[dict[str, str]]) -> Path:
    return write_spec(tmp_path / "site.yml", smi_gpus)


@pytest.fixture
def raw_lxc_spec(tmp_path: Path, smi_gpus: list[dict[str, str]]) -> Path:
    return write_spec(tmp_path / "site-raw.yml", smi_gpus, passthrough="raw-lxc")
