"""Ansible on the testbed: a converged re-run of site.yml against a facts-only play, same machines,
same run; plus the testbed's warm start (and, with --cold, its cold build).

    sudo .venv/bin/python -m benchmarks.ansible.bench            # ~2 min, from the repo root
    sudo .venv/bin/python -m benchmarks.ansible.bench --cold     # + a from-scratch rootfs build

Uses a free test slot (1..8), so a testbed brought up by hand (slot 0) is left alone, and takes
it down at the end. Every site.yml re-run is checked to report changed=0 (else the figure would
not be a converged re-run).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import _cli
from testbed import rootfs
from testbed.config import DEFAULT_MACHINES, MachineSpec, Settings
from testbed.harness import Harness, claim_test_slot
from testbed.system import Runner

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
SPECS = [MachineSpec.parse(m) for m in DEFAULT_MACHINES]


def playbook(inventory: Path, path: str, report: Path, env: dict[str, str] | None = None) -> float:
    """Wall-clock seconds of one ansible-playbook run; fails unless it succeeded."""
    full_env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_CALLBACK_PLUGINS": str(REPO / "tests/testbed/callback_plugins"),
        "ANSIBLE_CALLBACKS_ENABLED": "ct200_report",
        "CT200_ANSIBLE_REPORT": str(report),
        **(env or {}),
    }
    argv = [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), path]
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, env=full_env, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit(f"bench: {path} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    return seconds


def changed(report: Path) -> int:
    stats = json.loads(report.read_text())["stats"]
    return sum(s["changed"] for s in stats.values())


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }


def main() -> int:
    parser = _cli.parser(
        __doc__, runs=5, runs_flag="--reps", runs_help="runs of each play", json=True
    )
    parser.add_argument(
        "--starts", type=_cli.count, default=3, help="warm starts to time (default 3)"
    )
    parser.add_argument("--cold", action="store_true", help="also time a from-scratch build")
    parser.add_argument(
        "--playbook",
        default="playbooks/site.yml",
        help="the playbook converged and re-run (default playbooks/site.yml; the smoke test's "
        "tiny size: playbooks/host.yml, the host's roles alone)",
    )
    args = parser.parse_args()
    settings = Settings.from_env()
    results: dict[str, object] = {
        "machines": [s.name for s in SPECS],
        "reps": args.runs,
        "playbook": args.playbook,
    }

    if args.cold:
        with _cli.scratch("cache", parent="/var/tmp") as tmp:
            cold = Settings.from_env({**os.environ, "CT200_TESTBED_CACHE": str(tmp)})
            _path, seconds = rootfs.ensure(cold, Runner())
            results["cold_build_s"] = round(seconds, 1)
            shutil.rmtree(tmp, ignore_errors=True)

    with contextlib.ExitStack() as stack:
        slot = claim_test_slot(settings, stack)
        if slot is None:
            sys.exit("bench: every test slot is in use")
        harness = Harness(slot)
        stack.callback(harness.down, True)
        rootfs.ensure(settings, Runner())  # a cold build is not a warm start

        starts, boots = [], []
        for _ in range(args.starts):
            report = harness.up(SPECS, fresh=True)
            starts.append(report.timings["total"])
            boots.append(report.timings["boot"])
        results["warm_start_s"] = summary(starts)
        results["warm_boot_s"] = summary(boots)
        inventory = report.inventory

        tmp = stack.enter_context(_cli.scratch("ansible"))
        results["first_converge_s"] = round(
            playbook(inventory, args.playbook, tmp / "first.json"), 2
        )
        site, facts, plain = [], [], []
        no_persist = {"ANSIBLE_PIPELINING": "False", "ANSIBLE_SSH_ARGS": "-o ControlMaster=no"}
        for i in range(args.runs):
            out = tmp / f"site-{i}.json"
            site.append(playbook(inventory, args.playbook, out))
            if changed(out):
                sys.exit(f"bench: {args.playbook} re-run {i} changed something: not converged")
            facts.append(playbook(inventory, "benchmarks/ansible/facts.yml", tmp / f"f-{i}.json"))
            plain.append(playbook(inventory, args.playbook, tmp / f"p-{i}.json", no_persist))
        results["site_rerun_s"] = summary(site)
        results["facts_only_s"] = summary(facts)
        results["ratio_site_rerun_to_facts"] = round(
            statistics.median(site) / statistics.median(facts), 2
        )
        results["site_rerun_without_pipelining_controlpersist_s"] = summary(plain)

    _cli.show(results, _cli.table(results, 50), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
