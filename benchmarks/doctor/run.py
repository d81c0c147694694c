"""Time `ct200-doctor check` against its floor (bare cuInit) and `nvidia-smi -q`, interleaved.

    python3 benchmarks/doctor/run.py --spec SITE.yml --runs 15 --out DIR

Each round runs the three commands once, in turn, so drift affects them alike. Reports the
median and min wall time of each and the doctor's per-probe times from its own JSON.

Without an NVIDIA driver (libcuda.so.1 does not load: a machine with no GPU) there is no floor to
measure: the benchmark says so and times the doctor alone, no ratio. It fails when the doctor
itself breaks (exit 3, or JSON that does not parse), so a smoke run catches a broken doctor.
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
FLOOR = "bare cuInit (python -c ctypes)"
DOCTOR = "ct200-doctor check"
#: The doctor's own verdicts (clean, warnings, failures); 3 and anything else: it broke.
DOCTOR_VERDICTS = (0, 1, 2)


def timed(argv: list[str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - t0, proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    doctor = [sys.executable, "-m", "ct200_tools.cli.entry", "check", "--spec", a.spec]
    contenders = {DOCTOR: doctor, FLOOR: [sys.executable, "-c", CUINIT]}
    smi = shutil.which("nvidia-smi")
    if smi:
        contenders["nvidia-smi -q"] = [smi, "-q"]
    gpu = True
    for name, argv in list(contenders.items()):  # warm the page cache and the driver once
        _seconds, rc = timed(argv)
        if name == FLOOR and rc != 0:
            gpu = False
            del contenders[FLOOR]
            print(
                "no GPU here: libcuda.so.1 does not load (no NVIDIA driver), so there is no "
                f"cuInit floor: timing {DOCTOR} alone, no ratio",
                file=sys.stderr,
            )
    times: dict[str, list[float]] = {k: [] for k in contenders}
    doctor_exits: set[int] = set()
    for _ in range(a.runs):
        for name, argv in contenders.items():
            seconds, rc = timed(argv)
            times[name].append(seconds)
            if name == DOCTOR:
                doctor_exits.add(rc)
    report = subprocess.run([*doctor, "--json"], capture_output=True, text=True, check=False)
    doctor_exits.add(report.returncode)
    broke = sorted(doctor_exits - set(DOCTOR_VERDICTS))
    if broke:
        sys.exit(f"benchmark: {DOCTOR} broke (exit {broke}): {report.stderr.strip()[-2000:]}")
    try:
        probes = json.loads(report.stdout)["probes"]
    except (ValueError, KeyError) as exc:
        sys.exit(f"benchmark: {DOCTOR} --json printed no report ({exc}): {report.stdout[:500]}")
    floor = statistics.median(times[FLOOR]) if gpu else None
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append(
            {
                "command": name,
                "median_s": round(med, 4),
                "min_s": round(min(ts), 4),
                "max_s": round(max(ts), 4),
                "vs_cuinit": round(med / floor, 2) if floor else None,
            }
        )
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "doctor.json").write_text(
        json.dumps(
            {
                "runs": a.runs,
                "gpu": gpu,
                "doctor_exit_codes": sorted(doctor_exits),
                "rows": rows,
                "probes": probes,
            },
            indent=2,
        )
    )
    lines = [f"{'command':<34} {'median s':>9} {'min s':>7} {'max s':>7} {'x cuInit':>9}"]
    lines += [
        f"{r['command']:<34} {r['median_s']:>9.3f} {r['min_s']:>7.3f} {r['max_s']:>7.3f} "
        + (f"{r['vs_cuinit']:>9.2f}" if r["vs_cuinit"] is not None else f"{'-':>9}")
        for r in rows
    ]
    if not gpu:
        lines += ["", "no GPU here (libcuda.so.1 does not load): no cuInit floor, no ratio"]
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
