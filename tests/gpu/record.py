"""Record facts on the GPU machine (healthy and under each real fault) as CPU-test fixtures.

python3 -m tests.gpu.record OUTDIR
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
from pathlib import Path

from ct200_tools.probes.devices import parse_proc_devices
from tests.gpu import faults, nvsmi


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    snap = faults.doctor_argv("snapshot")
    (out / "h200-healthy.json").write_text(
        subprocess.run(snap, capture_output=True, text=True, check=True).stdout
    )
    major = parse_proc_devices(Path("/proc/devices").read_text())["nvidia-uvm"]
    (out / "h200-uvm-denied.json").write_text(faults.run_denied(snap, major).stdout)
    nvidia = parse_proc_devices(Path("/proc/devices").read_text())["nvidia"]
    (out / "h200-c195-denied.json").write_text(faults.run_denied(snap, nvidia).stdout)
    (out / "h200-uvm-stale.json").write_text(
        faults.run_with_node_replaced(snap, "/dev/nvidia-uvm", "/dev/null").stdout
    )
    raw = out / "raw"
    raw.mkdir(exist_ok=True)
    (raw / "proc_devices.txt").write_text(Path("/proc/devices").read_text())
    (raw / "nvidia_version.txt").write_text(Path("/proc/driver/nvidia/version").read_text())
    (raw / "topo_m.txt").write_text(nvsmi.run("topo", "-m"))
    (raw / "topo_p2p_r.txt").write_text(nvsmi.run("topo", "-p2p", "r"))
    for dev in Path("/sys/bus/pci/devices").iterdir():
        if (dev / "vendor").read_text().strip() == "0x10de":
            name = dev.name.replace(":", "_")
            (raw / f"pcicfg_{name}.hex").write_text((dev / "config").read_bytes().hex())
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
                    (raw / f"sysfs_{name}_{f}.txt").write_text((dev / f).read_text())
    shutil.make_archive(str(out / "fixtures"), "gztar", out, ".")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
