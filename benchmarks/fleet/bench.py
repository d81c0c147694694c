"""The fleet doctor (playbooks/doctor.yml) on many inventory hosts, against Ansible's floor.

    .venv/bin/python -m benchmarks.fleet.bench [--hosts 50] [--reps 3] [--forks 10,50] [--out DIR]

Every inventory host is this machine through `ansible_connection: local`, each with its own
recorded snapshot (tests/fixtures/facts, cycled) judged by the real doctor against the CT200 spec
(`ct200-doctor check --json --facts F --spec inventory/ct200`, through ct200_doctor_args), so
each host's doctor runs for real and the fleet is a mix of healthy and failing hosts. Timed,
wall-clock of the whole ansible-playbook process, medians of --reps, side by side:
  doctor alone     each snapshot's doctor run directly (the slowest is "the slowest host")
  one host         doctor.yml limited to one host
  no-op floor      benchmarks/fleet/noop.yml: one ping task on the same hosts (no facts)
  fleet            doctor.yml on every host, per forks value and strategy (linear, free)
  stand-in         doctor.yml on every host with a stand-in doctor that sleeps --standin-seconds
                   and prints a report the real doctor wrote: a remote host's doctor, whose time
                   is spent on its own machine (the largest forks value)
The goal: fleet <= about no-op floor + the slowest host. Every host here shares this machine's
CPUs, so the doctors' CPU time also counts (doctor CPU / CPUs is reported beside it): on a real
fleet each host's doctor runs on its own machine, which the stand-in rows show. No root, no
testbed.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import _cli

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
FACTS = REPO / "tests/fixtures/facts"
SPEC = REPO / "inventory/ct200"
SNAPSHOTS = (
    "ct200-ct-healthy.json",
    "ct200-ct-incident.json",
    "ct200-ct-c195-denied.json",
    "pergpu-ct200-ct-healthy.json",
    "pergpu-ct200-ct-gpu-lost.json",
)
SCHEMA_VERSION = 1


def inventory(path: Path, hosts: int) -> list[str]:
    names = [f"fleet{i:03d}" for i in range(hosts)]
    members = {
        name: {
            "ct200_doctor_args": [
                "--facts",
                str(FACTS / SNAPSHOTS[i % len(SNAPSHOTS)]),
                "--spec",
                str(SPEC),
            ]
        }
        for i, name in enumerate(names)
    }
    doc = {
        "all": {
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "ct200_doctor_command": str(VENV_BIN / "ct200-doctor"),
            },
            "children": {"ct": {"hosts": members}},
        }
    }
    path.write_text(json.dumps(doc, indent=1))
    return names


def timed(argv: list[str], ok: tuple[int, ...]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds of the process tree, exit code."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = subprocess.run(
        argv,
        cwd=REPO,
        env={
            **os.environ,
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "ANSIBLE_NOCOLOR": "1",
        },
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode not in ok:
        sys.exit(
            f"bench: {' '.join(argv)} exited {proc.returncode}:\n"
            f"{(proc.stdout + proc.stderr)[-3000:]}"
        )
    return wall, cpu, proc.returncode


def stats(runs: list[tuple[float, float, int]]) -> dict[str, Any]:
    return {
        "median_s": round(statistics.median(r[0] for r in runs), 3),
        "min_s": round(min(r[0] for r in runs), 3),
        "cpu_s": round(statistics.median(r[1] for r in runs), 3),
        "runs_s": [round(r[0], 3) for r in runs],
    }


def standin(tmp: Path, seconds: float) -> Path:
    """A stand-in doctor: sleeps, then prints a report the real doctor wrote (recorded now) and
    exits with its code: a remote host's doctor as the controller sees it, its time spent on
    its own machine and none of this one's CPU."""
    argv = [str(VENV_BIN / "ct200-doctor"), "check", "--json", "--facts"]
    argv += [str(FACTS / SNAPSHOTS[1]), "--spec", str(SPEC)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    report = tmp / "recorded.json"
    report.write_text(proc.stdout)
    script = tmp / "standin-doctor"
    script.write_text(
        f"#!/bin/sh\n# stand-in doctor (benchmarks/fleet)\nsleep {seconds}\n"
        f"cat {report}\nexit {proc.returncode}\n"
    )
    script.chmod(0o755)
    return script


def measure(
    hosts: int, reps: int, forks: list[int], sleep_s: float
) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, Any]]:
    """Doctor alone per snapshot, then the plays; and the last fleet run's saved document."""
    playbook = [str(VENV_BIN / "ansible-playbook")]
    with _cli.scratch("fleet") as tmp:
        inv = tmp / "hosts.yml"
        names = inventory(inv, hosts)
        saved = tmp / "fleet.json"
        common = ["-i", str(inv), "-e", "ct200_doctor_hosts=ct"]
        doctor_yml = [*playbook, *common, "playbooks/doctor.yml"]
        noop_yml = [*playbook, *common, "benchmarks/fleet/noop.yml"]
        alone = {}
        for snap in sorted({SNAPSHOTS[i % len(SNAPSHOTS)] for i in range(hosts)}):
            argv = [str(VENV_BIN / "ct200-doctor"), "check", "--json", "--facts", str(FACTS / snap)]
            argv += ["--spec", str(SPEC)]
            alone[snap] = stats([timed(argv, (0, 1, 2)) for _ in range(reps)])
        rows: dict[str, dict[str, Any]] = {}
        one = [*doctor_yml, "--limit", names[0]]
        rows["one host"] = stats([timed(one, (0, 2)) for _ in range(reps)])
        for f in forks:
            for strategy in ("linear", "free"):
                extra = ["-f", str(f), "-e", f"ct200_doctor_strategy={strategy}"]
                rows[f"no-op floor, forks {f}, {strategy}"] = stats(
                    [timed([*noop_yml, *extra], (0,)) for _ in range(reps)]
                )
                # A fleet with failing hosts: doctor.yml exits 2 by design.
                fleet = [*doctor_yml, *extra, "-e", f"ct200_doctor_fleet_file={saved}"]
                rows[f"fleet, forks {f}, {strategy}"] = stats(
                    [timed(fleet, (2,)) for _ in range(reps)]
                )
        doc: dict[str, Any] = json.loads(saved.read_text())
        # Every host as slow as a remote doctor of sleep_s, costing this machine no CPU.
        script = standin(tmp, sleep_s)
        for strategy in ("linear", "free"):
            extra = ["-f", str(max(forks)), "-e", f"ct200_doctor_strategy={strategy}"]
            extra += ["-e", f"ct200_doctor_command={script}"]
            rows[f"stand-in {sleep_s:g} s, forks {max(forks)}, {strategy}"] = stats(
                [timed([*doctor_yml, *extra], (2,)) for _ in range(reps)]
            )
    if len(doc["hosts"]) != hosts or any(h["status"] == "broke" for h in doc["hosts"]):
        sys.exit(f"bench: the fleet table is not complete or a doctor broke: {doc['summary']}")
    return alone, rows, doc


def main() -> int:
    parser = _cli.parser(
        __doc__,
        runs=3,
        runs_flag="--reps",
        runs_help="runs of each",
        out="also write fleet.json and fleet.txt here",
    )
    parser.add_argument("--hosts", type=_cli.count, default=50, help="inventory hosts (default 50)")
    parser.add_argument("--forks", default="10,50", help="forks values to try (default 10,50)")
    parser.add_argument(
        "--standin-seconds",
        type=float,
        default=2.0,
        help="how long the stand-in doctor takes on every host (default 2)",
    )
    args = parser.parse_args()
    try:
        forks = [int(f) for f in args.forks.split(",") if f.strip()]
    except ValueError:
        parser.error(f"--forks {args.forks!r}: give numbers separated by commas, e.g. 10,50")
    if not forks or min(forks) < 1 or args.standin_seconds < 0:
        parser.error("--forks must be at least 1 and --standin-seconds not negative")
    alone, rows, doc = measure(args.hosts, args.runs, forks, args.standin_seconds)
    slowest = max(a["median_s"] for a in alone.values())
    doctor_cpu = sum(alone[SNAPSHOTS[i % len(SNAPSHOTS)]]["cpu_s"] for i in range(args.hosts))
    cpus = os.cpu_count() or 1
    for name, row in rows.items():
        if name.startswith("fleet"):
            floor = rows[name.replace("fleet", "no-op floor")]["median_s"]
            row["vs_floor_plus_slowest"] = round(row["median_s"] / (floor + slowest), 2)
            row["vs_floor_plus_doctor_cpu_per_cpu"] = round(
                row["median_s"] / (floor + doctor_cpu / cpus), 2
            )
            row["vs_one_host"] = round(row["median_s"] / rows["one host"]["median_s"], 2)
        elif name.startswith("stand-in"):
            # The goal as on a real fleet: the floor plus the slowest host (every host here).
            strategy = name.rsplit(", ", 1)[1]
            floor = rows[f"no-op floor, forks {max(forks)}, {strategy}"]["median_s"]
            goal = floor + args.standin_seconds
            row["vs_floor_plus_slowest"] = round(row["median_s"] / goal, 2)
    best = min((r for n, r in rows.items() if n.startswith("fleet")), key=lambda r: r["median_s"])
    report = {
        "schema_version": SCHEMA_VERSION,
        "hosts": args.hosts,
        "reps": args.runs,
        "cpus": cpus,
        "forks": forks,
        "doctor_alone": alone,
        "slowest_host_s": slowest,
        "doctor_cpu_total_s": round(doctor_cpu, 2),
        "rows": rows,
        "best_fleet_vs_floor_plus_slowest": best["vs_floor_plus_slowest"],
        "standin_seconds": args.standin_seconds,
        "fleet_summary": doc["summary"],
    }
    lines = [
        f"fleet doctor benchmark: {args.hosts} inventory hosts (local connections), "
        f"{cpus} CPUs, medians of {args.runs}",
        f"doctor alone, slowest snapshot: {slowest:.2f} s; doctor CPU over all hosts "
        f"{doctor_cpu:.1f} s ({doctor_cpu / cpus:.1f} s per CPU)",
        f"{'what':<32} {'wall s':>7} {'cpu s':>7}  vs floor+slowest  vs floor+cpu/CPUs",
    ]
    for name, row in rows.items():
        ratios = f"  {row['vs_floor_plus_slowest']:>16}" if "vs_floor_plus_slowest" in row else ""
        if "vs_floor_plus_doctor_cpu_per_cpu" in row:
            ratios += f"  {row['vs_floor_plus_doctor_cpu_per_cpu']:>17}"
        lines.append(f"{name:<32} {row['median_s']:>7.2f} {row['cpu_s']:>7.1f}{ratios}")
    lines.append(f"hosts judged: {doc['summary']}")
    lines.append(f"reproduce: .venv/bin/python -m benchmarks.fleet.bench --hosts {args.hosts}")
    text = "\n".join(lines) + "\n"
    if args.out is not None:
        _cli.write_results(args.out, report, text, stem="fleet")
    _cli.show(report, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
