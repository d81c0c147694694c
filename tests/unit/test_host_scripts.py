"""The boot scripts the host roles install (ct200-pcie-tune, ct200-host-devices), run for real
against a PCI tree built from the H200 recording (tests/fixtures/raw/h200) with GPUs in it.
ct200-pcie-tune is the role's template, rendered by real ansible-playbook after the validate play
(its sizes and codes come from ct200_validated.mrrs, i.e. ct200_tools.spec.MRRS_SIZES).

No GPU exists here, and the GPU machine's config space must never be written, so the masked
MRRS write is checked against a STAND-IN for setpci (below) that reads and writes the recorded
config space: it finds the PCIe capability the way the doctor's probe does and applies
``value:mask`` as setpci does. ``modprobe``, ``nvidia-modprobe`` and ``pgrep`` are stand-ins that
only record their calls. The scripts find the tree through CT200_SYSFS_PCI.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ct200_tools.doctor.probes.pci import PCI_CAP_ID_EXP, find_capability, parse_devctl
from ct200_tools.spec import MRRS_SIZES

ROOT = Path(__file__).resolve().parents[2]
PCIE_TUNE_TEMPLATE = ROOT / "roles/host_tuning/templates/ct200-pcie-tune.j2"
PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
HOST_DEVICES = ROOT / "roles/host_devices/files/ct200-host-devices"
RECORDED = bytes.fromhex((ROOT / "tests/fixtures/raw/h200/pcicfg_0000_00_06.0.hex").read_text())
GPU, GPU2, AUDIO, BRIDGE, NIC = (
    "0000:01:00.0",
    "0000:02:00.0",
    "0000:01:00.1",
    "0000:00:01.0",
    "0000:00:02.0",
)

#: setpci STAND-IN: `-s BDF CAP_EXP+8.w` prints the word, `-s BDF CAP_EXP+8.w=V:M` writes it
#: masked, on $CT200_SYSFS_PCI/<BDF>/config; every call is appended to $STANDIN_LOG/setpci.log.
SETPCI = r"""#!{python}
import os, sys
from ct200_tools.doctor.probes.pci import PCI_CAP_ID_EXP, find_capability
root = os.environ["CT200_SYSFS_PCI"]
with open(os.path.join(os.environ["STANDIN_LOG"], "setpci.log"), "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\n")
args = sys.argv[1:]
assert args[0] == "-s" and len(args) == 3, args
cfg_path = os.path.join(root, args[1], "config")
cfg = bytearray(open(cfg_path, "rb").read())
reg, _, assign = args[2].partition("=")
assert reg == "CAP_EXP+8.w", reg
cap = find_capability(bytes(cfg), PCI_CAP_ID_EXP)
if cap is None:
    sys.exit("setpci: Capability 0010 not found")
off = cap + 8
word = int.from_bytes(cfg[off:off + 2], "little")
if not assign:
    print(f"{word:04x}")
    sys.exit(0)
value, _, mask = assign.partition(":")
mask_v = int(mask or "ffff", 16)
word = (word & ~mask_v) | (int(value, 16) & mask_v)
cfg[off:off + 2] = word.to_bytes(2, "little")
open(cfg_path, "wb").write(bytes(cfg))
"""

#: What the scripts may run besides bash's builtins and the stand-ins.
SYSTEM_TOOLS = ("awk", "basename", "dirname", "readlink", "tr", "uname", "sh", "cat")

#: Records its name and arguments in $STANDIN_LOG/calls.log; exits with $STANDIN_RC (default 0).
RECORDER = """#!/bin/sh
echo "$(basename "$0") $*" >> "$STANDIN_LOG/calls.log"
exit "${STANDIN_RC:-0}"
"""


def with_devctl(cfg: bytes, devctl: int) -> bytes:
    cap = find_capability(cfg, PCI_CAP_ID_EXP)
    assert cap is not None
    out = bytearray(cfg)
    out[cap + 8 : cap + 10] = devctl.to_bytes(2, "little")
    return bytes(out)


def devctl_of(cfg: bytes) -> int:
    cap = find_capability(cfg, PCI_CAP_ID_EXP)
    assert cap is not None
    return int.from_bytes(cfg[cap + 8 : cap + 10], "little")


#: The recording's Device Control is 0x5134 (MRRS 4096, MPS 256); "after a GPU reset" the
#: firmware's MRRS 512 is back (bits 14:12 = 2), every other bit as recorded.
RESET = 0x5134 & ~0x7000 | 0x2000


class Tree:
    def __init__(self, base: Path, gpus: bool = True, setpci: bool = True) -> None:
        self.base = base
        self.devices = base / "bus/pci/devices"
        self.devices.mkdir(parents=True)
        self.bin = base / "bin"
        self.bin.mkdir()
        if gpus:
            # root port 00:01.0 -> GPU 01:00.0 (+ its audio function); a second GPU 02:00.0
            # directly on the root complex; a NIC that is not NVIDIA's.
            self.add(f"pci0000:00/{BRIDGE}", "0x8086", "0x060400", RECORDED)
            self.add(
                f"pci0000:00/{BRIDGE}/{GPU}", "0x10de", "0x030200", with_devctl(RECORDED, RESET)
            )
            self.add(f"pci0000:00/{BRIDGE}/{AUDIO}", "0x10de", "0x040300", RECORDED)
            self.add(f"pci0000:00/{GPU2}", "0x10de", "0x030000", with_devctl(RECORDED, RESET))
        self.add(f"pci0000:00/{NIC}", "0x15b3", "0x020000", RECORDED)
        # Only these system tools: never the real setpci, modprobe or nvidia-modprobe.
        for name in SYSTEM_TOOLS:
            found = shutil.which(name)
            assert found, f"{name} is needed to run the scripts"
            (self.bin / name).symlink_to(found)
        if setpci:
            self.tool("setpci", SETPCI.replace("{python}", sys.executable))
        for name in ("modprobe", "nvidia-modprobe", "pgrep"):
            self.tool(name, RECORDER)

    def add(self, rel: str, vendor: str, cls: str, cfg: bytes) -> None:
        d = self.base / "devices" / rel
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(cls + "\n")
        (d / "config").write_bytes(cfg)
        (self.devices / d.name).symlink_to(d)

    def tool(self, name: str, text: str) -> None:
        path = self.bin / name
        path.write_text(text)
        path.chmod(0o755)

    def config(self, bdf: str) -> bytes:
        return (self.devices / bdf / "config").read_bytes()

    def log(self, name: str) -> list[str]:
        path = self.base / name
        return path.read_text().splitlines() if path.exists() else []

    def run(self, script: Path, *args: str, rc: int = 0) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": str(self.bin),
            "CT200_SYSFS_PCI": str(self.devices),
            "STANDIN_LOG": str(self.base),
            "PYTHONPATH": str(ROOT),
            "STANDIN_RC": str(rc),
        }
        return subprocess.run(
            ["/bin/bash", str(script), *args], env=env, capture_output=True, text=True, check=False
        )


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    return Tree(tmp_path)


@pytest.fixture(scope="module")
def pcie_tune(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """ct200-pcie-tune as roles/host_tuning installs it: its template rendered by ansible-playbook
    with the role's vars, after the validate play of the example inventory."""
    if not PLAYBOOK.exists():
        pytest.skip("ansible-playbook not installed")
    work = tmp_path_factory.mktemp("pcie-tune")
    script = work / "ct200-pcie-tune"
    plays = [
        {
            "name": "Validate",
            "ansible.builtin.import_playbook": str(ROOT / "playbooks/validate.yml"),
        },
        {
            "name": "Render the MRRS script",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars_files": [str(ROOT / "roles/host_tuning/vars/main.yml")],
            "tasks": [
                {
                    "name": "Render it",
                    "ansible.builtin.template": {
                        "src": str(PCIE_TUNE_TEMPLATE),
                        "dest": str(script),
                        "mode": "0755",
                    },
                }
            ],
        },
    ]
    (work / "play.yml").write_text(json.dumps(plays))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    proc = subprocess.run(
        [str(PLAYBOOK), "-i", str(ROOT / "inventory/ct200"), str(work / "play.yml")],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        cwd=ROOT,
        env={**env, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_RETRY_FILES_ENABLED": "0"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    yield script


def test_check_reports_drift_and_writes_nothing(tree: Tree, pcie_tune: Path) -> None:
    before = {b: tree.config(b) for b in (GPU, GPU2, AUDIO, BRIDGE, NIC)}
    proc = tree.run(pcie_tune, "--check", "4096")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert f"{GPU}: MRRS 512, wanted 4096 (Device Control {RESET:04x})" in proc.stdout
    assert f"not set on {GPU} {GPU2}" in proc.stdout or f"not set on {GPU2} {GPU}" in proc.stdout
    assert {b: tree.config(b) for b in before} == before
    assert all("=" not in call for call in tree.log("setpci.log"))


def test_masked_write_sets_mrrs_and_nothing_else(tree: Tree, pcie_tune: Path) -> None:
    proc = tree.run(pcie_tune, "4096")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    writes = [c for c in tree.log("setpci.log") if "=" in c]
    assert sorted(writes) == sorted(f"-s {b} CAP_EXP+8.w=5000:7000" for b in (GPU, GPU2))
    for bdf in (GPU, GPU2):
        cfg = tree.config(bdf)
        # The doctor's probe reads back 4096; MPS and every other bit and byte as before.
        ctl = parse_devctl(cfg)
        assert ctl is not None and (ctl.max_read_request, ctl.max_payload) == (4096, 256)
        assert devctl_of(cfg) == 0x5134
        assert cfg == RECORDED
        assert f"{bdf}: MRRS 512 -> 4096 (Device Control {RESET:04x} -> 5134)" in proc.stdout
    # Not the audio function, not the bridge (no --bridges), not the NIC.
    assert tree.config(AUDIO) == RECORDED and tree.config(NIC) == RECORDED
    assert "MRRS 4096 on 2 function(s)" in proc.stdout
    again = tree.run(pcie_tune, "--check", "4096")
    assert again.returncode == 0, again.stdout


def test_smaller_value_and_bridges(tree: Tree, pcie_tune: Path) -> None:
    proc = tree.run(pcie_tune, "--bridges", "1024")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for bdf in (GPU, GPU2, BRIDGE):
        ctl = parse_devctl(tree.config(bdf))
        assert ctl is not None and ctl.max_read_request == 1024, bdf
    assert f"-s {BRIDGE} CAP_EXP+8.w=3000:7000" in tree.log("setpci.log")
    assert tree.config(NIC) == RECORDED


def test_every_size_of_the_spec_is_the_scripts_with_its_code(tree: Tree, pcie_tune: Path) -> None:
    """The script's table is the spec's (MRRS_SIZES, index = code), rendered in: each size is
    accepted and written with its own code; the usage line lists exactly those sizes."""
    for code, size in enumerate(MRRS_SIZES):
        proc = tree.run(pcie_tune, str(size))
        assert proc.returncode == 0, (size, proc.stdout + proc.stderr)
        assert f"-s {GPU} CAP_EXP+8.w={code}000:7000" in tree.log("setpci.log"), size
        ctl = parse_devctl(tree.config(GPU))
        assert ctl is not None and ctl.max_read_request == size
    usage = tree.run(pcie_tune, "x").stderr
    assert f"BYTES ({', '.join(map(str, MRRS_SIZES))})" in usage, usage


@pytest.mark.parametrize("bad", ["4097", "64", "8192", "x"])
def test_bad_size_is_a_usage_error(tree: Tree, pcie_tune: Path, bad: str) -> None:
    proc = tree.run(pcie_tune, bad)
    assert proc.returncode == 2 and "usage:" in proc.stderr
    assert not tree.log("setpci.log")


def test_no_gpu_says_so_and_exits_0(tmp_path: Path, pcie_tune: Path) -> None:
    t = Tree(tmp_path, gpus=False)
    for script, args in ((pcie_tune, ["4096"]), (HOST_DEVICES, ["--", "/dev/nvidia0"])):
        proc = t.run(script, *args)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "no NVIDIA GPU on the PCI bus" in proc.stdout
    assert not t.log("calls.log")


def test_missing_setpci_is_named(tmp_path: Path, pcie_tune: Path) -> None:
    t = Tree(tmp_path, setpci=False)
    proc = t.run(pcie_tune, "4096")
    assert proc.returncode == 1 and "install pciutils" in proc.stdout


def test_host_devices_loads_creates_and_names_missing_nodes(tree: Tree, tmp_path: Path) -> None:
    nodes = [str(tmp_path / "dev" / n) for n in ("nvidia0", "nvidia1", "nvidiactl")]
    proc = tree.run(HOST_DEVICES, "--modules", "nvidia,nvidia_uvm", "--persistenced", "--", *nodes)
    # The stand-in nvidia-modprobe creates nothing: the script must fail, naming the nodes.
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "MISSING nodes the container expects: " + " ".join(nodes) in proc.stdout
    assert tree.log("calls.log") == [
        "modprobe nvidia",
        "modprobe nvidia_uvm",
        "nvidia-modprobe -u -c0",
        "nvidia-modprobe -c 1",
        "pgrep -x nvidia-persistenced",
    ]
    assert "2 NVIDIA GPU(s)" in proc.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a character device needs root")
def test_host_devices_passes_when_the_nodes_exist(tree: Tree, tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    nodes = []
    for name in ("nvidia0", "nvidiactl"):
        path = tmp_path / "dev" / name
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        nodes.append(str(path))
    proc = tree.run(HOST_DEVICES, "--", *nodes)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"all 2 nodes the container expects exist: {' '.join(nodes)}" in proc.stdout


def test_host_devices_fails_when_a_module_does_not_load(tree: Tree) -> None:
    proc = tree.run(HOST_DEVICES, "--", "/dev/nvidia0", rc=1)
    assert proc.returncode == 1
    assert "cannot load nvidia: is the NVIDIA driver installed" in proc.stdout
