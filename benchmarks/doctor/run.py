"""Time `ct200-doctor check` against its floor (bare cuInit) and `nvidia-smi -q`, interleaved.

    python3 benchmarks/doctor/run.py --spec SITE.yml --runs 15 --out DIR

Each round runs the three commands once, in turn, so drift affects them alike. Reports the
median and min wall time of each and the doctor's per-probe times from its own JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

CUINIT = "import ctypes; ctypes.CDLL('libcuda.so.1').cuInit(0)"


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    doctor = [sys.executable, "-m", "ct200_tools.cli.entry", "check", "--spec", a.spec]
    contenders = {
        "ct200-doctor check": doctor,
        "bare cuInit (python -c ctypes)": [sys.executable, "-c", CUINIT],
    }
    smi = shutil.which("nvidia-smi")
    if smi:
        contenders["nvidia-smi -q"] = [smi, "-q"]
    for argv in contenders.values():  # warm the page cache and the driver once
        timed(argv)
    times: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(a.runs):
        for name, argv in contenders.items():
            times[name].append(timed(argv))
    report = subprocess.run([*doctor, "--json"], capture_output=True, text=True, check=False)
    probes = json.loads(report.stdout)["probes"] if report.stdout else []
    floor = statistics.median(times["bare cuInit (python -c ctypes)"])
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append(
            {
                "command": name,
                "median_s": round(med, 4),
                "min_s": round(min(ts), 4),
                "max_s": round(max(ts), 4),
                "vs_cuinit": round(med / floor, 2),
            }
        )
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "doctor.json").write_text(
        json.dumps({"runs": a.runs, "rows": rows, "probes": probes}, indent=2)
    )
    lines = [f"{'command':<34} {'median s':>9} {'min s':>7} {'max s':>7} {'x cuInit':>9}"]
    lines += [
        f"{r['command']:<34} {r['median_s']:>9.3f} {r['min_s']:>7.3f} {r['max_s']:>7.3f} "
        f"{r['vs_cuinit']:>9.2f}"
        for r in rows
    ]
    lines += [
        "",
        "doctor probes (one run): "
        + ", ".join(f"{p['name']} {p['duration_s']:.3f}s" for p in probes),
    ]
    text = "\n".join(lines) + "\n"
    (a.out / "doctor.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
