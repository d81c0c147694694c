"""Time `ct200-doctor check` in both CUDA modes against bare cuInit and `nvidia-smi -q`, at
1..N GPUs, interleaved.

    python3 benchmarks/doctor/run.py --spec SITE.yml --runs 15 --out DIR [--gpus 1,2,4,8]

Contenders, at each GPU count k (the first k GPUs in PCI bus order, through
CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER=PCI_BUS_ID; at k = every GPU nothing is set, so the
doctor takes its real path):
  ct200-doctor check                      per-GPU mode (the default): one CUDA child per GPU
  ct200-doctor check --cuda-init all      one cuInit over the k GPUs
  bare cuInit, all k GPUs                 python -c ctypes cuInit(0): the all-GPU floor
  bare cuInit, one GPU                    the same with CUDA_VISIBLE_DEVICES=0: the goal's unit
  bare cuInit+context, one proc per GPU   k python children side by side, each cuInit and a
                                          primary context on its GPU: the per-GPU floor
  nvidia-smi -q                           -i 0..k-1
Each round runs every contender once, in turn, so drift affects them alike. Reports median, min
and max wall time, each contender's ratio to one GPU's and to all k GPUs' bare cuInit, and per
count the per-GPU children's own cuInit and context times (from a per-GPU snapshot): children
whose cuInit grows with k would mean the driver serialises them.

Without an NVIDIA driver (libcuda.so.1 does not load: a machine with no GPU) there is no floor to
measure: the benchmark says so and times the doctor alone (both modes), no ratio. It fails when
the doctor itself breaks (exit 3, or JSON that does not parse), so a smoke run catches a broken
doctor.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # run as a script: benchmarks._cli from this tree

from benchmarks import _cli  # noqa: E402

SCHEMA_VERSION = 2
CUINIT = "import ctypes, sys; sys.exit(ctypes.CDLL('libcuda.so.1').cuInit(0))"
# One GPU: cuInit, device 0, primary context retained and released (as the doctor's child).
CONTEXT = (
    "import ctypes as c, sys; d = c.CDLL('libcuda.so.1'); r = d.cuInit(0); v = c.c_int(); "
    "r = r or d.cuDeviceGet(c.byref(v), 0); x = c.c_void_p(); "
    "r = r or d.cuDevicePrimaryCtxRetain(c.byref(x), v); "
    "r = r or d.cuDevicePrimaryCtxRelease_v2(v); sys.exit(r)"
)
# k children side by side (argv[1] = k), each with its own GPU; fails if any fails.
PARALLEL = (
    "import os, subprocess, sys; k = int(sys.argv[1]); "
    "ps = [subprocess.Popen([sys.executable, '-I', '-S', '-c', sys.argv[2]], "
    "env={**os.environ, 'CUDA_VISIBLE_DEVICES': str(i), 'CUDA_DEVICE_ORDER': 'PCI_BUS_ID'}) "
    "for i in range(k)]; sys.exit(max(p.wait() for p in ps))"
)
DOCTOR = "ct200-doctor check"
DOCTOR_ALL = "ct200-doctor check --cuda-init all"
CUINIT_ALL = "bare cuInit, all k GPUs"
CUINIT_ONE = "bare cuInit, one GPU"
PER_GPU_FLOOR = "bare cuInit+context, one proc per GPU"
SMI = "nvidia-smi -q"
#: The doctor's own verdicts (clean, warnings, failures); 3 and anything else: it broke.
DOCTOR_VERDICTS = (0, 1, 2)


def timed(argv: Sequence[str], env: dict[str, str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        list(argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False
    )
    return time.perf_counter() - t0, proc.returncode


def visible_gpus() -> int:
    """GPUs the NVIDIA module has bound (0 without it), as the doctor lists them."""
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def subset_env(k: int, n: int) -> dict[str, str]:
    env = {k_: v for k_, v in os.environ.items() if not k_.startswith("CUDA_")}
    if k < n:
        env |= {
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(k)),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        }
    return env


def contenders(
    doctor: list[str], k: int, n: int, gpu: bool
) -> dict[str, tuple[list[str], dict[str, str]]]:
    env = subset_env(k, n)
    out = {DOCTOR: (doctor, env), DOCTOR_ALL: ([*doctor, "--cuda-init", "all"], env)}
    if not gpu:
        return out
    py = sys.executable
    one = {**subset_env(n, n), "CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    out[CUINIT_ALL] = ([py, "-c", CUINIT], env)
    out[CUINIT_ONE] = ([py, "-c", CUINIT], one)
    out[PER_GPU_FLOOR] = ([py, "-c", PARALLEL, str(k), CONTEXT], subset_env(n, n))
    smi = shutil.which("nvidia-smi")
    if smi:
        ids = [] if k == n else ["-i", ",".join(str(i) for i in range(k))]
        out[SMI] = ([smi, "-q", *ids], subset_env(n, n))
    return out


def children_times(snapshot: list[str], env: dict[str, str]) -> list[dict[str, object]]:
    """The per-GPU children's own times, from one per-GPU snapshot."""
    snap = subprocess.run(snapshot, capture_output=True, text=True, env=env, check=False)
    try:
        cuda = json.loads(snap.stdout)["cuda"] or {}
    except (ValueError, KeyError):
        return []
    keys = ("index", "pci_bus_id", "code", "duration_s", "cuinit_s", "context_s")
    return [{k: g.get(k) for k in keys} for g in cuda.get("gpus", [])]


def gpu_counts(arg: str | None, n: int, gpu: bool) -> list[int]:
    if not gpu:
        return [0]  # no subset to take: the doctor as it runs here
    if not arg:
        return sorted({c for c in (1, 2, 4, 8, n) if 1 <= c <= n})
    counts = sorted({int(c) for c in arg.split(",")})
    if not all(1 <= c <= n for c in counts):
        sys.exit(f"benchmark: --gpus {arg}: this machine has {n} GPUs")
    return counts


class Results:
    def __init__(self) -> None:
        self.rows: list[dict[str, object]] = []
        self.children: dict[str, list[dict[str, object]]] = {}
        self.goal: dict[str, dict[str, float | None]] = {}
        self.doctor_exits: set[int] = set()


def measure(entry: list[str], spec: str, k: int, n: int, gpu: bool, runs: int, r: Results) -> None:
    """Every contender at k GPUs, `runs` interleaved rounds after one warm-up each."""
    cs = contenders([*entry, "check", "--spec", spec], k, n, gpu)
    for argv, env in cs.values():  # warm the page cache and the driver once
        timed(argv, env)
    times: dict[str, list[float]] = {name: [] for name in cs}
    for _ in range(runs):
        for name, (argv, env) in cs.items():
            seconds, rc = timed(argv, env)
            times[name].append(seconds)
            if name in (DOCTOR, DOCTOR_ALL):
                r.doctor_exits.add(rc)
    one = statistics.median(times[CUINIT_ONE]) if gpu else None
    every = statistics.median(times[CUINIT_ALL]) if gpu else None
    for name, ts in times.items():
        med = statistics.median(ts)
        r.rows.append(
            {
                "gpus": k or None,
                "command": name,
                "median_s": round(med, 4),
                "min_s": round(min(ts), 4),
                "max_s": round(max(ts), 4),
                "vs_cuinit_one_gpu": round(med / one, 2) if one else None,
                "vs_cuinit_all_gpus": round(med / every, 2) if every else None,
            }
        )
    if gpu and one and every:
        r.children[str(k)] = children_times([*entry, "snapshot", "--spec", spec], cs[DOCTOR][1])
        med = statistics.median(times[DOCTOR])
        r.goal[str(k)] = {
            "doctor_vs_one_gpu_cuinit": round(med / one, 2),
            "doctor_vs_all_gpu_cuinit": round(med / every, 2),
        }


def main() -> None:
    ap = _cli.parser(
        __doc__, runs=15, out="write doctor.json and doctor.txt here", out_required=True
    )
    ap.add_argument("--spec", required=True)
    ap.add_argument(
        "--gpus",
        help="GPU counts to measure, e.g. 1,2,4,8 [default: 1, 2, 4, 8 and all, up to all]",
    )
    a = ap.parse_args()
    entry = [sys.executable, "-m", "ct200_tools.cli.entry"]
    n = visible_gpus()
    gpu = timed([sys.executable, "-c", CUINIT], dict(os.environ))[1] == 0
    if not gpu:
        print(
            "no GPU here: libcuda.so.1 does not load or cuInit fails (no NVIDIA driver), so "
            f"there is no cuInit floor: timing {DOCTOR} alone, both modes, no ratio",
            file=sys.stderr,
        )
    counts = gpu_counts(a.gpus, n, gpu)
    r = Results()
    for k in counts:
        measure(entry, a.spec, k, n, gpu, a.runs, r)
    doctor = [*entry, "check", "--spec", a.spec]
    report = subprocess.run([*doctor, "--json"], capture_output=True, text=True, check=False)
    r.doctor_exits.add(report.returncode)
    broke = sorted(r.doctor_exits - set(DOCTOR_VERDICTS))
    if broke:
        sys.exit(f"benchmark: {DOCTOR} broke (exit {broke}): {report.stderr.strip()[-2000:]}")
    try:
        probes = json.loads(report.stdout)["probes"]
    except (ValueError, KeyError) as exc:
        sys.exit(f"benchmark: {DOCTOR} --json printed no report ({exc}): {report.stdout[:500]}")
    report = {
        "schema_version": SCHEMA_VERSION,
        "runs": a.runs,
        "gpu": gpu,
        "gpus_visible": n,
        "gpu_counts": [c for c in counts if c],
        "doctor_exit_codes": sorted(r.doctor_exits),
        "rows": r.rows,
        "goal": r.goal,
        "cuda_children": r.children,
        "probes": probes,
    }
    text = render(r.rows, r.goal, r.children, probes, gpu, a.runs)
    _cli.write_results(a.out, report, text, stem="doctor")
    _cli.show(report, text)


def render(
    rows: list[dict[str, object]],
    goal: dict[str, dict[str, float | None]],
    children: dict[str, list[dict[str, object]]],
    probes: list[dict[str, object]],
    gpu: bool,
    runs: int,
) -> str:
    def num(v: object, spec: str) -> str:
        return format(v, spec) if isinstance(v, int | float) else "-"

    lines = [
        f"{runs} interleaved rounds per GPU count; median wall time",
        f"{'GPUs':>4}  {'command':<38} {'median s':>9} {'min s':>7} {'max s':>7} "
        f"{'x 1 cuInit':>10} {'x k cuInit':>10}",
    ]
    lines += [
        f"{num(r['gpus'], 'd'):>4}  {r['command']!s:<38} {num(r['median_s'], '.3f'):>9} "
        f"{num(r['min_s'], '.3f'):>7} {num(r['max_s'], '.3f'):>7} "
        f"{num(r['vs_cuinit_one_gpu'], '.2f'):>10} {num(r['vs_cuinit_all_gpus'], '.2f'):>10}"
        for r in rows
    ]
    if not gpu:
        lines += ["", "no GPU here (libcuda.so.1 does not load): no cuInit floor, no ratio"]
    for k, g in goal.items():
        lines.append(
            f"goal at {k} GPUs: doctor {num(g['doctor_vs_one_gpu_cuinit'], '.2f')}x one GPU's "
            f"cuInit (<= 1.2), {num(g['doctor_vs_all_gpu_cuinit'], '.2f')}x all GPUs' cuInit "
            "(< 1 from 2 GPUs)"
        )
    for k, gs in children.items():
        lines.append(
            f"per-GPU children at {k} GPUs (cuInit s / context s / wall s): "
            + ", ".join(
                f"GPU{c['index']} {num(c['cuinit_s'], '.3f')}/{num(c['context_s'], '.3f')}/"
                f"{num(c['duration_s'], '.3f')}"
                for c in gs
            )
        )
    lines += [
        "",
        "doctor probes (one run): "
        + ", ".join(f"{p['name']} {num(p['duration_s'], '.3f')}s" for p in probes),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
