"""Record facts on the GPU machine (healthy and under each real fault) as CPU-test fixtures.

python3 -m tests.gpu.record OUTDIR

Both CUDA modes: <machine>-<case>.json with --cuda-init all (the recordings' format before
per-GPU mode) and <machine>-pergpu-<case>.json with one child per GPU; <machine> is h200 on one
H200, h200x2 on two, and so on. The cases: healthy, uvm-denied, c195-denied, uvm-stale, and
gpu-node-denied (the last GPU's /dev/nvidiaN alone). Raw files beside them (raw/): /proc/devices,
the driver's version and per-GPU information, nvidia-smi's topology and P2P matrices, PCI config
space and sysfs. Everything is also packed into OUTDIR/fixtures.tar.gz.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from ct200_tools.doctor.probes.devices import parse_proc_devices
from tests.gpu import faults, nvsmi

MODES = {"all": "", "per-gpu": "pergpu-"}


def machine_name(gpus: list[dict[str, str]]) -> str:
    """'h200' for one NVIDIA H200, 'h200x2' for two, 'rtx-pro-6000-blackwell-...x8'."""
    model = "-".join(gpus[0]["name"].removeprefix("NVIDIA ").lower().split())
    return model if len(gpus) == 1 else f"{model}x{len(gpus)}"


def minor_of(bus: str) -> int:
    info = Path(f"/proc/driver/nvidia/gpus/{bus}/information").read_text()
    return int(next(ln for ln in info.splitlines() if ln.startswith("Device Minor")).split()[-1])


def cases(gpus: list[dict[str, str]]) -> dict[str, Callable[[list[str]], str]]:
    majors = parse_proc_devices(Path("/proc/devices").read_text())
    last = gpus[-1]["pci.bus_id"].lower()
    domain, rest = last.split(":", 1)
    last_minor = minor_of(f"{int(domain, 16):04x}:{rest}")

    def healthy(argv: list[str]) -> str:
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout

    return {
        "healthy": healthy,
        "uvm-denied": lambda argv: faults.run_denied(argv, majors["nvidia-uvm"]).stdout,
        "c195-denied": lambda argv: faults.run_denied(argv, majors["nvidia"]).stdout,
        "uvm-stale": lambda argv: (
            faults.run_with_node_replaced(argv, "/dev/nvidia-uvm", "/dev/null").stdout
        ),
        "gpu-node-denied": lambda argv: (
            faults.run_denied(argv, majors["nvidia"], deny_minor=last_minor).stdout
        ),
    }


def main(out: Path) -> None:
    if shutil.which("nvidia-smi") is None or not Path("/proc/driver/nvidia/gpus").is_dir():
        sys.exit("record: no NVIDIA GPU here (nvidia-smi, /proc/driver/nvidia): run it there")
    out.mkdir(parents=True, exist_ok=True)
    gpus = nvsmi.query_gpus()
    name = machine_name(gpus)
    for case, run in cases(gpus).items():
        for mode, infix in MODES.items():
            snap = faults.doctor_argv("snapshot", "--cuda-init", mode)
            (out / f"{name}-{infix}{case}.json").write_text(run(snap))
    raw = out / "raw"
    raw.mkdir(exist_ok=True)
    (raw / "proc_devices.txt").write_text(Path("/proc/devices").read_text())
    (raw / "nvidia_version.txt").write_text(Path("/proc/driver/nvidia/version").read_text())
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        bus = info.parent.name.replace(":", "_")
        (raw / f"proc_gpus_{bus}_information.txt").write_text(info.read_text())
    (raw / "topo_m.txt").write_text(nvsmi.run("topo", "-m"))
    (raw / "topo_p2p_r.txt").write_text(nvsmi.run("topo", "-p2p", "r"))
    (raw / "topo_p2p_w.txt").write_text(nvsmi.run("topo", "-p2p", "w"))
    for dev in Path("/sys/bus/pci/devices").iterdir():
        if (dev / "vendor").read_text().strip() == "0x10de":
            bdf = dev.name.replace(":", "_")
            (raw / f"pcicfg_{bdf}.hex").write_text((dev / "config").read_bytes().hex())
            for f in (
                "numa_node",
                "local_cpulist",
                "max_link_speed",
                "max_link_width",
                "current_link_speed",
                "current_link_width",
                "class",
                "device",
            ):
                with contextlib.suppress(OSError):
                    (raw / f"sysfs_{bdf}_{f}.txt").write_text((dev / f).read_text())
    # Packed beside OUTDIR first: an archive written inside the tree it packs would hold a
    # part of itself.
    with tempfile.TemporaryDirectory() as tmp:
        packed = shutil.make_archive(str(Path(tmp) / "fixtures"), "gztar", out, ".")
        shutil.move(packed, out / "fixtures.tar.gz")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
