"""On the GPU machine: our MRRS/MPS reader (ct200_tools/doctor/probes/pci.py) agrees with
`lspci -vvv` for every NVIDIA GPU, and the host roles' boot scripts read the same values in
--check mode.

Read only: nothing here writes PCI config space (the scripts run with --check only, and every
GPU's config space is compared before and after).

The GPU machine has no network and maybe no pciutils: `bash tests/gpu/carry_pciutils.sh` puts
pciutils and its libraries as .deb files in .gpu-carry/debs/ (gitignored); pass
`carry: [".gpu-carry"]` to the device tool. The test unpacks them with `dpkg -x` into a temp
dir and runs that lspci and setpci with LD_LIBRARY_PATH; without the debs it uses the machine's
own lspci, and without either it skips, saying why.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ct200_tools.doctor.probes.base import Reader
from ct200_tools.doctor.probes.pci import probe_function

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
DEBS = ROOT / ".gpu-carry/debs"
PCI = Path("/sys/bus/pci/devices")
PCIE_TUNE = ROOT / "roles/host_tuning/files/ct200-pcie-tune"
HOST_DEVICES = ROOT / "roles/host_devices/files/ct200-host-devices"
#: DevCtl's line in `lspci -vvv` (DevCap's MaxPayload line has no MaxReadReq).
DEVCTL = re.compile(r"MaxPayload (\d+) bytes, MaxReadReq (\d+) bytes")


@dataclass(frozen=True)
class Pciutils:
    lspci: str
    setpci: str | None
    env: dict[str, str]
    ids: str | None
    source: str


def nvidia_gpus() -> list[str]:
    out = []
    for bdf in sorted(os.listdir(PCI)):
        vendor = (PCI / bdf / "vendor").read_text().strip()
        cls = (PCI / bdf / "class").read_text().strip()
        if vendor == "0x10de" and cls.startswith("0x03"):
            out.append(bdf)
    return out


def unpack(tmp: Path) -> Pciutils:
    if shutil.which("dpkg") is None:
        pytest.skip(f"{DEBS} is here but dpkg is not, to unpack it: lspci cannot run")
    for deb in sorted(DEBS.glob("*.deb")):
        subprocess.run(["dpkg", "-x", str(deb), str(tmp)], check=True, capture_output=True)
    libs = [str(p) for p in tmp.glob("**/lib/x86_64-linux-gnu") if p.is_dir()]
    lspci = next((str(p) for p in tmp.glob("**/bin/lspci")), None)
    setpci = next((str(p) for p in tmp.glob("**/bin/setpci")), None)
    ids = next((str(p) for p in tmp.glob("usr/share/misc/pci.ids")), None)
    if lspci is None:
        pytest.skip(f"no lspci in the .deb files of {DEBS}: run tests/gpu/carry_pciutils.sh")
    env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(libs)}
    return Pciutils(lspci, setpci, env, ids, f"unpacked from {DEBS}")


@pytest.fixture(scope="module")
def pciutils(tmp_path_factory: pytest.TempPathFactory) -> Pciutils:
    if os.geteuid() != 0:
        pytest.skip("reading PCIe capabilities needs root (lspci -vvv and sysfs config alike)")
    if sorted(DEBS.glob("*.deb")):
        tools = unpack(tmp_path_factory.mktemp("pciutils"))
    elif shutil.which("lspci"):
        tools = Pciutils(
            str(shutil.which("lspci")), shutil.which("setpci"), dict(os.environ), None, "system"
        )
    else:
        pytest.skip(
            f"no lspci here and no {DEBS}: run tests/gpu/carry_pciutils.sh and carry .gpu-carry"
        )
    probe = subprocess.run(
        [tools.lspci, "--version"], env=tools.env, capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        pytest.skip(f"lspci ({tools.source}) cannot run here: {probe.stderr.strip()[:300]}")
    return tools


@pytest.fixture(scope="module")
def gpus() -> list[str]:
    found = nvidia_gpus()
    if not found:
        pytest.skip("no NVIDIA GPU on the PCI bus")
    return found


@pytest.fixture(scope="module", autouse=True)
def config_untouched(gpus: list[str]) -> Iterator[None]:
    """Every GPU's config space, byte for byte, before and after this module."""
    before = {b: (PCI / b / "config").read_bytes() for b in gpus}
    yield
    after = {b: (PCI / b / "config").read_bytes() for b in gpus}
    assert after == before, "PCI config space changed during a read-only test"


def lspci_devctl(tools: Pciutils, bdf: str) -> tuple[int, int]:
    argv = [tools.lspci, "-vvv", "-s", bdf, *(["-i", tools.ids] if tools.ids else [])]
    proc = subprocess.run(argv, env=tools.env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    devctl = proc.stdout.split("DevCtl:", 1)
    assert len(devctl) == 2, f"no DevCtl in lspci -vvv -s {bdf}:\n{proc.stdout}"
    m = DEVCTL.search(devctl[1])
    assert m, f"no MaxPayload/MaxReadReq after DevCtl:\n{proc.stdout}"
    return int(m.group(1)), int(m.group(2))


def test_reader_agrees_with_lspci(pciutils: Pciutils, gpus: list[str]) -> None:
    reader = Reader()
    for bdf in gpus:
        ours = probe_function(reader, bdf)
        assert ours.max_read_request is not None, reader.unreadable
        mps, mrrs = lspci_devctl(pciutils, bdf)
        assert (ours.max_payload, ours.max_read_request) == (mps, mrrs), bdf


def test_pcie_tune_check_reads_the_same(pciutils: Pciutils, gpus: list[str]) -> None:
    if pciutils.setpci is None:
        pytest.skip(f"no setpci ({pciutils.source})")
    bindir = Path(pciutils.setpci).parent
    env = {**pciutils.env, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    current = {probe_function(Reader(), b).max_read_request for b in gpus}
    if len(current) != 1:
        pytest.skip(f"the GPUs have different MRRS ({sorted(current)}): no single value to check")
    value = current.pop()
    assert value is not None
    same = subprocess.run(
        ["/bin/bash", str(PCIE_TUNE), "--check", str(value)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert same.returncode == 0, same.stdout + same.stderr
    assert f"MRRS {value} already" in same.stdout
    other = 128 if value != 128 else 256
    drift = subprocess.run(
        ["/bin/bash", str(PCIE_TUNE), "--check", str(other)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert drift.returncode == 3, drift.stdout + drift.stderr
    for bdf in gpus:
        assert f"{bdf}: MRRS {value}, wanted {other}" in drift.stdout


def test_host_devices_check_matches_the_nodes(gpus: list[str]) -> None:
    nodes = [f"/dev/nvidia{i}" for i in range(len(gpus))]
    nodes += ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    uvm = any(
        line.split()[1:] == ["nvidia-uvm"]
        for line in Path("/proc/devices").read_text().splitlines()
    )
    ready = uvm and all(Path(n).is_char_device() for n in nodes)
    proc = subprocess.run(
        ["/bin/bash", str(HOST_DEVICES), "--check", "--", *nodes],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == (0 if ready else 3), proc.stdout + proc.stderr
    assert f"{len(gpus)} GPU(s)" in proc.stdout or not ready
