"""`ct200-doctor check --host pve` on the testbed against the obvious alternative run side by
side: a bare `ssh pve true` plus the same doctor check without --host (what an operator would
otherwise run: the local check, and a hop to the host).

    sudo .venv/bin/python -m benchmarks.hostdoctor.bench                  # ~1 min on 2 cores
    sudo .venv/bin/python -m benchmarks.hostdoctor.bench --reps 1 --ssh-config SLOT/ssh/config

Without --ssh-config it takes a free test slot (slot 0 is left alone), boots the pve machine and
takes it down at the end; with --ssh-config it uses that running testbed (the tests do). Each
round runs the three commands in turn (doctor with --host, ssh true, doctor without); times are
wall-clock of each whole process, medians. The doctor runs every check on this machine (the
controller has no GPU: its local findings fail, which costs what it costs either way) and, with
--host, reads pve over SSH beside its local probes.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import _cli
from testbed.config import MachineSpec, Settings
from testbed.harness import Harness, claim_test_slot

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "inventory" / "testbed"
HOST = "pve"


def timed(argv: list[str]) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        argv,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "NO_COLOR": "1"},
    )
    return time.perf_counter() - t0, proc.returncode, proc.stdout + proc.stderr


def host_read(out: str) -> bool:
    """Whether the doctor's JSON report names the host it read (a refused key prints none)."""
    try:
        return json.loads(out[out.find("{") :]).get("host") is not None
    except ValueError:
        return False


def measure(ssh_config: Path, spec: Path, reps: int) -> dict[str, Any]:
    doctor = [sys.executable, "-m", "ct200_tools.cli.entry", "check", "--json", "--spec", str(spec)]
    with_host = [*doctor, "--host", HOST, "--ssh-config", str(ssh_config)]
    ssh_true = ["ssh", "-F", str(ssh_config), "-o", "BatchMode=yes", HOST, "true"]
    times: dict[str, list[float]] = {"doctor_host": [], "ssh_true": [], "doctor_local": []}
    rcs: dict[str, int] = {}
    for _ in range(reps):
        for name, argv in (
            ("doctor_host", with_host),
            ("ssh_true", ssh_true),
            ("doctor_local", doctor),
        ):
            seconds, rc, out = timed(argv)
            times[name].append(seconds)
            rcs[name] = rc
            if name == "doctor_host" and not host_read(out):
                sys.exit(f"bench: `{' '.join(argv)}` did not read the host:\n{out[-2000:]}")
    if rcs["ssh_true"] != 0:
        sys.exit(f"bench: `{' '.join(ssh_true)}` failed (exit {rcs['ssh_true']})")
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "reps": reps,
        **{f"{k}_s": round(v, 3) for k, v in med.items()},
        "doctor_host_rc": rcs["doctor_host"],
        "doctor_local_rc": rcs["doctor_local"],
        "ratio_host_to_ssh_plus_local": round(
            med["doctor_host"] / (med["ssh_true"] + med["doctor_local"]), 3
        ),
        "host_overhead_s": round(med["doctor_host"] - med["doctor_local"], 3),
    }


def main() -> int:
    parser = _cli.parser(__doc__, runs=5, runs_flag="--reps", runs_help="rounds", json=True)
    parser.add_argument("--ssh-config", type=Path, help="a running testbed's ssh config")
    parser.add_argument("--spec", type=Path, default=SPEC, help="site spec (default: testbed's)")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        config = args.ssh_config
        if config is None:
            slot = claim_test_slot(Settings.from_env(), stack)
            if slot is None:
                sys.exit("bench: every test slot is in use")
            harness = Harness(slot)
            stack.callback(harness.down, True)
            harness.up([MachineSpec.parse("pve:pve")], fresh=True)
            config = slot.ssh_config
        results = measure(config, args.spec, args.runs)
    _cli.show(results, _cli.table(results, 30), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
