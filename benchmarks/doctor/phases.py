"""Where a `ct200-doctor check` spends its time: the doctor's own path, phase by phase.

    python3 benchmarks/doctor/phases.py --spec SITE.yml [--runs 10] [--cuda-init per-gpu|all]
        [--no-nvml-prestart]

Each run is a fresh interpreter that walks the path `ct200-doctor check` takes (prestart the CUDA
children, import the doctor, load the spec, probe, judge, render) and stamps the time after each
step; the parent adds the process's whole wall time, so interpreter start and exit show too.
Prints the median time at which each phase ended (seconds from the start of the process) and the
CUDA child's own duration: when `probed` ends near `cuda child`, the doctor waits on CUDA; when it
ends later, something of the doctor's own is on the critical path.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # run as a script: benchmarks._cli from this tree

from benchmarks import _cli  # noqa: E402

# Runs in the child: the doctor's own steps, each stamped (perf_counter from interpreter start is
# not available, so the parent's spawn time is the origin and the child reports deltas).
CHILD = r"""
import json, os, sys, time
t = {"start": time.perf_counter()}
from ct200_tools.doctor import warmup
if sys.argv[3] == "1":
    warmup.start(["check", "--cuda-init", sys.argv[2]])
else:  # the CUDA children alone: NVML initialises in the nvml probe, after the imports
    warmup._prestarted = warmup.spawn(sys.argv[2])
t["prestarted"] = time.perf_counter()
import ct200_tools.cli.doctor
t["imported"] = time.perf_counter()
from ct200_tools.spec import load_spec
spec = load_spec(sys.argv[1])
t["spec"] = time.perf_counter()
from ct200_tools.doctor.probes import collect
facts = collect(spec=spec, cuda_mode=sys.argv[2])
t["probed"] = time.perf_counter()
from ct200_tools.doctor.checks import run_checks
findings = run_checks(facts, spec)
t["judged"] = time.perf_counter()
from ct200_tools.doctor.report import Header, render_text
render_text(findings, Header(facts, sys.argv[1]))
t["rendered"] = time.perf_counter()
cuda = facts.cuda.duration_s if facts.cuda else None
print(json.dumps({"t": {k: v - t["start"] for k, v in t.items()}, "cuda": cuda,
                  "probes": {p.name: p.duration_s for p in facts.probes}}))
sys.stdout.flush()
os._exit(0)  # as the console entry leaves (ct200_tools/cli/entry.py)
"""

PHASES = ("prestarted", "imported", "spec", "probed", "judged", "rendered")


def run_once(spec: str, mode: str, nvml_prestart: bool) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, spec, mode, "1" if nvml_prestart else "0"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"phases: the run failed: {proc.stderr.strip()[-500:]}")
    data: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    data["wall"] = wall
    return data


def main() -> None:
    ap = _cli.parser(__doc__, runs=10, runs_help="runs")
    ap.add_argument("--spec", required=True)
    ap.add_argument("--cuda-init", default="per-gpu", choices=("per-gpu", "all"))
    ap.add_argument(
        "--no-nvml-prestart",
        action="store_true",
        help="start only the CUDA children early (does nvmlInit beside cuInit slow it down?)",
    )
    args = ap.parse_args()
    prestart = not args.no_nvml_prestart
    runs = [run_once(args.spec, args.cuda_init, prestart) for _ in range(args.runs)]

    def med(values: list[float]) -> float:
        return statistics.median(values)

    nvml = "with" if prestart else "without"
    print(
        f"{len(runs)} runs, --cuda-init {args.cuda_init}, {nvml} the NVML prestart: "
        "median seconds from process start"
    )
    for phase in PHASES:
        times = [float(r["t"][phase]) for r in runs]  # type: ignore[index]
        print(f"  {phase:<12} {med(times):.3f}")
    cuda = [float(c) for r in runs if isinstance(c := r["cuda"], int | float)]
    if cuda:
        print(f"  {'cuda child':<12} {med(cuda):.3f}  (its own wall time, from its start)")
    print(f"  {'process':<12} {med([float(r['wall']) for r in runs]):.3f}  (start and exit)")  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
