"""Recovery after a host reboot on the testbed: boot to serving by chain step against its floor,
and recover.yml on a good machine against Ansible's own floor.

    sudo .venv/bin/python -m benchmarks.recovery.bench [--runs 3] [--json] [--out DIR]

Boots its own `pve` and `ct` machines on a free test slot (1..8; slot 0 is left alone),
converges site.yml with the llama site (tests/server_sites.py: llama-server with a tiny GGUF,
serving `tiny`), and per run:

1. power-cycles both machines (`Harness.reboot`: pve boots, its pve-guests stand-in starts the
   container, ct boots) with no playbook, and times pve's power-on to the first completion, split
   by chain step (the boot report's own times);
2. the floor, on the same machine: the staging of the serving set's models alone (the staged
   copy removed, `systemctl start` of its staging unit), and the server's load alone
   (`systemctl start` of its unit with its model staged). Goal: boot to serving at most
   floor + load + 60 s;
3. recover.yml on the good machine against Ansible's own floor: per host, a play of as many
   no-op tasks as recover.yml had there, of the same kind (task_counts), counted from the
   callback's record of a first recover.yml run; interleaved run by run with recover.yml. Two
   floors, from the same record:
   - the issue's ("a play of the same number of no-op tasks"): every task recover.yml went
     through on the host, skipped ones included (a skipped task is a task of the play, even if
     its condition spared the round trip); a loop counts its items as the loop had them at run
     time (at least 1: a loop over nothing is still one task);
   - strict: only the tasks that executed (status ok or changed), loop items one by one; skipped
     tasks ran nothing and are not counted. A lower floor: recover.yml must beat a play that
     has none of its skipped tasks.
   In both, a task whose action runs on the controller alone (set_fact, debug, assert, fail,
   and the argument check a role's argument_specs adds: LOCAL_ACTIONS) becomes a
   controller-side `set_fact`, every other one (command, uri, the lxc_passthrough module,
   wait_for_connection, which is recorded on pve and delegated to ct) an
   `ansible.builtin.command: /bin/true` on that host; structure (include/import, meta:
   STRUCTURE) runs no module and is not counted. Every recover.yml run must report changed=0.
   Goal: recover.yml at most the issue's floor (ratio at most 1.0); the strict ratio is always
   reported beside it.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from benchmarks import _cli
from testbed import llama_build, ssh
from testbed.config import DEFAULT_MACHINES, MachineSpec, Settings
from testbed.harness import Harness, RebootReport, claim_test_slot
from tests.server_sites import prepare_ct

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
SCHEMA_VERSION = 2
BIN = "/opt/ct200/venv/bin"
SERVER, MODEL, PORT = "tiny", "tiny-a", 8081
#: Seconds the goal allows on top of the floor and the server's load.
SLACK_S = 60.0

#: On ct: one 1-token completion, the time it came back (epoch), and the container's systemd
#: start as an epoch (one kernel clock for controller and machines).
AFTER_BOOT = r"""
import json, subprocess, sys, time, urllib.request
port = sys.argv[1]
body = json.dumps({"prompt": "Hello", "max_tokens": 1}).encode()
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                             headers={"Content-Type": "application/json"})
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    with opener.open(req, timeout=60) as resp:
        status = resp.status
except Exception as exc:
    status = repr(exc)
done = time.time()
us = subprocess.run(["systemctl", "show", "--property=UserspaceTimestampMonotonic", "--value"],
                    capture_output=True, text=True, check=True).stdout.strip()
userspace = time.time() - (time.clock_gettime(time.CLOCK_MONOTONIC) - int(us) / 1e6)
print(json.dumps({"status": status, "done": done, "userspace": userspace}))
"""
#: On ct: the staging of the model alone and the server's load alone (argv: server, model).
FLOOR = r"""
import json, shutil, subprocess, sys, time
server, model = sys.argv[1], sys.argv[2]
unit, stage = f"ct200-server-{server}.service", f"ct200-stage@{model}.service"
subprocess.run(["systemctl", "stop", unit, stage], check=True)
shutil.rmtree(f"/dev/shm/models/{model}")  # what a reboot wipes
t0 = time.monotonic()
subprocess.run(["systemctl", "start", stage], check=True)
t1 = time.monotonic()
subprocess.run(["systemctl", "start", unit], check=True)
t2 = time.monotonic()
print(json.dumps({"staging_alone_s": t1 - t0, "server_load_alone_s": t2 - t1}))
"""


def median(values: list[float]) -> float:
    return round(statistics.median(values), 3) + 0.0


def split(
    reboot: RebootReport, userspace: float, chain: dict[str, Any], done: float
) -> dict[str, float]:
    """Seconds per link, from the power-on of pve to the first completion: the host's boot and
    pve-guests (power-on of pve to power-on of ct), the container's boot up to its systemd, each
    step of the chain (by the boot report's times), and the completion itself."""
    out = {
        "host_boot_and_pve_guests": reboot.powered_on["ct"] - reboot.powered_on["pve"],
        "container_to_systemd": userspace - reboot.powered_on["ct"],
    }
    last = 0.0
    for step in chain["steps"]:
        active = float(step["active_s"])
        out[f"{step['kind']} {step['name']}"] = active - last
        last = active
    out["first_completion"] = done - (userspace + last)
    out["total"] = done - reboot.powered_on["pve"]
    return {k: round(v, 3) for k, v in out.items()}


class Bench:
    def __init__(self, harness: Harness, inventory: Path, workdir: Path) -> None:
        self.harness = harness
        self.inventory = inventory
        self.workdir = workdir
        self.addresses = {m.name: m.address for m in harness.machines()}
        self._runs = 0

    def remote(self, name: str, *command: str, ok: tuple[int, ...] = (0,)) -> str:
        proc = subprocess.run(
            ssh.argv(self.harness.slot, self.addresses[name], command),
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if proc.returncode not in ok:
            sys.exit(f"bench: {' '.join(command[:3])} failed ({proc.returncode}): {proc.stderr}")
        return proc.stdout

    def playbook(self, path: str, *args: str) -> tuple[float, dict[str, Any]]:
        """Wall-clock seconds of one run and its report (tests/testbed/callback_plugins)."""
        self._runs += 1
        report = self.workdir / f"run-{self._runs}.json"
        env = {
            **os.environ,
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "ANSIBLE_CALLBACK_PLUGINS": str(REPO / "tests/testbed/callback_plugins"),
            "ANSIBLE_CALLBACKS_ENABLED": "ct200_report",
            "CT200_ANSIBLE_REPORT": str(report),
        }
        argv = [str(VENV_BIN / "ansible-playbook"), "-i", str(self.inventory), path, *args]
        started = time.monotonic()
        proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
        seconds = time.monotonic() - started
        if proc.returncode != 0:
            sys.exit(f"bench: {path} failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}")
        return seconds, json.loads(report.read_text())

    def boot(self) -> dict[str, Any]:
        reboot = self.harness.reboot()
        if reboot.left_off:
            sys.exit(f"bench: the reboot left machines off: {reboot.left_off}")
        after = json.loads(self.remote("ct", "python3", "-c", AFTER_BOOT, str(PORT)))
        if after["status"] != 200:
            sys.exit(f"bench: no completion after the reboot: {after['status']}")
        chain = json.loads(self.remote("ct", f"{BIN}/ct200-serve", "chain", "--json"))["result"]
        if not chain["ok"]:
            sys.exit(f"bench: the boot chain stopped: {chain['stopped_at']}")
        floor = json.loads(self.remote("ct", "python3", "-c", FLOOR, SERVER, MODEL))
        return {
            "steps": split(reboot, after["userspace"], chain, after["done"]),
            "container_start_to_serving_s": round(
                after["userspace"] - reboot.powered_on["ct"] + chain["serving_seconds"], 3
            ),
            **floor,
        }


def noop_playbook(counts: dict[str, dict[str, int]], path: Path) -> None:
    """One play per host with as many no-op tasks as counted there (task_counts), of the same
    kind: a `/bin/true` for each remote task (a round trip), a controller-side `set_fact` for
    each that runs on the controller alone (set_fact, debug, assert, fail)."""
    plays = []
    for host, n in sorted(counts.items()):
        remote = [
            {"name": f"Remote no-op {i}.", "ansible.builtin.command": "/bin/true",
             "changed_when": False}
            for i in range(n.get("remote", 0))
        ]  # fmt: skip
        local = [
            {"name": f"Controller no-op {i}.", "ansible.builtin.set_fact": {"ct200_noop": i}}
            for i in range(n.get("controller", 0))
        ]
        play: dict[str, Any] = {
            "name": f"{n} no-op tasks on {host}",
            "hosts": host,
            "gather_facts": False,
            "tasks": remote + local,
        }
        if host == "localhost":
            play["connection"] = "local"
        plays.append(play)
    path.write_text(yaml.safe_dump(plays, sort_keys=False))


#: Actions that run on the controller alone (no round trip to the host): each is mirrored by a
#: controller-side no-op (set_fact), not by a `/bin/true` that would make the floor easier.
#: validate_argument_spec is the check a role's meta/argument_specs.yml adds before its tasks.
LOCAL_ACTIONS = frozenset(
    f"{prefix}{name}"
    for prefix in ("", "ansible.builtin.")
    for name in ("set_fact", "debug", "assert", "fail", "validate_argument_spec")
)
#: Structure, not work: imports are resolved at parse time and include_role/meta run no module.
STRUCTURE = frozenset(
    f"{prefix}{name}"
    for prefix in ("", "ansible.builtin.")
    for name in ("meta", "include_role", "import_role", "include_tasks", "import_tasks")
)


#: The two floors: the issue's counts every task recover.yml went through; strict only those
#: that executed.
FLOORS = ("issue", "strict")
EXECUTED = ("ok", "changed")


def task_counts(report: dict[str, Any], floor: str) -> dict[str, dict[str, int]]:
    """Per host, recover.yml's tasks: remote (a module on the host) and controller (on the
    controller alone: LOCAL_ACTIONS). floor "issue": every task the play went through, skipped
    ones included, a loop as many as its items at run time (at least 1); floor "strict": only
    the tasks that executed (ok or changed), a loop as many as its items. Structural tasks
    (STRUCTURE) run no module and are never counted."""
    if floor not in FLOORS:
        raise ValueError(f"floor {floor!r}: one of {FLOORS}")
    counts: dict[str, Counter[str]] = {}
    for r in report["results"]:
        action = r.get("action")
        if action in STRUCTURE or (floor == "strict" and r["status"] not in EXECUTED):
            continue
        kind = "controller" if action in LOCAL_ACTIONS else "remote"
        items = int(r.get("items", 1))
        if floor == "issue":
            items = max(items, 1)  # a loop over nothing is still one task
        counts.setdefault(r["host"], Counter())[kind] += items
    return {host: dict(c) for host, c in counts.items()}


def measure(runs: int, workdir: Path) -> dict[str, Any]:
    settings = Settings.from_env()
    with contextlib.ExitStack() as stack:
        slot = claim_test_slot(settings, stack)
        if slot is None:
            sys.exit("bench: every test slot is in use")
        harness = Harness(slot)
        stack.callback(harness.down, True)
        up = harness.up([MachineSpec.parse(m) for m in DEFAULT_MACHINES], fresh=True)
        bench = Bench(harness, up.inventory, workdir)
        site = prepare_ct(harness.push, workdir, llama_build.ensure().binary)
        extra = ("-e", f"@{site}")
        bench.playbook("playbooks/site.yml", *extra)
        boots = [bench.boot() for _ in range(runs)]
        recover_args = (*extra, "-e", "recover_doctor=servers")
        _, first = bench.playbook("playbooks/recover.yml", *recover_args)
        counts = {floor: task_counts(first, floor) for floor in FLOORS}
        plays = {floor: workdir / f"noop-{floor}.yml" for floor in FLOORS}
        for floor, path in plays.items():
            noop_playbook(counts[floor], path)
        recover_s: list[float] = []
        noop_s: dict[str, list[float]] = {floor: [] for floor in FLOORS}
        for _ in range(runs):
            seconds, report = bench.playbook("playbooks/recover.yml", *recover_args)
            changed = sum(s["changed"] for s in report["stats"].values())
            if changed:
                sys.exit(f"bench: recover.yml changed {changed} thing(s) on a good machine")
            recover_s.append(seconds)
            for floor, path in plays.items():
                noop_s[floor].append(bench.playbook(str(path))[0])
    (workdir / "recover-first-run.json").write_text(json.dumps(first, indent=1))
    return summarize(boots, recover_s, noop_s, counts, runs)


def summarize(
    boots: list[dict[str, Any]],
    recover_s: list[float],
    noop_s: dict[str, list[float]],
    counts: dict[str, dict[str, dict[str, int]]],
    runs: int,
) -> dict[str, Any]:
    steps = {k: median([b["steps"][k] for b in boots]) for k in boots[0]["steps"]}
    floor = median([b["staging_alone_s"] for b in boots])
    load = median([b["server_load_alone_s"] for b in boots])
    total = steps["total"]
    container = median([b["container_start_to_serving_s"] for b in boots])
    goal = round(floor + load + SLACK_S, 3)
    rec = median(recover_s)
    noop = {f: median(noop_s[f]) for f in FLOORS}
    ratio = {f: round(rec / noop[f], 3) if noop[f] else None for f in FLOORS}
    return {
        "schema_version": SCHEMA_VERSION,
        "runs": runs,
        "gate": "ct200-doctor gate",
        "boot_to_first_completion_by_step_s": steps,
        "container_start_to_serving_s": container,
        "floor_staging_alone_s": floor,
        "server_load_alone_s": load,
        "goal_floor_plus_load_plus_60_s": goal,
        "boot_within_goal": total <= goal,
        "recover_good_machine_s": rec,
        # The floor: every task recover.yml went through, skipped ones included.
        "noop_issue_s": noop["issue"],
        "noop_issue_tasks_per_host": counts["issue"],
        "ratio_recover_to_noop_issue": ratio["issue"],
        # The strict floor: only the tasks recover.yml executed (ok or changed).
        "noop_strict_s": noop["strict"],
        "noop_strict_tasks_per_host": counts["strict"],
        "ratio_recover_to_noop_strict": ratio["strict"],
        # The goal, judged against the floor; the strict one beside it.
        "recover_within_goal": rec <= noop["issue"],
        "recover_within_strict_floor": rec <= noop["strict"],
    }


def text(result: dict[str, Any]) -> str:
    lines = [f"benchmarks/recovery: {result['runs']} run(s) (medians), gate: {result['gate']}"]
    lines.append("boot to first completion, by step (s):")
    lines += [f"  {k}: {v}" for k, v in result["boot_to_first_completion_by_step_s"].items()]
    for key in (
        "container_start_to_serving_s",
        "floor_staging_alone_s",
        "server_load_alone_s",
        "goal_floor_plus_load_plus_60_s",
        "boot_within_goal",
        "recover_good_machine_s",
        "noop_issue_s",
        "noop_issue_tasks_per_host",
        "ratio_recover_to_noop_issue",
        "noop_strict_s",
        "noop_strict_tasks_per_host",
        "ratio_recover_to_noop_strict",
        "recover_within_goal",
        "recover_within_strict_floor",
    ):
        lines.append(f"{key}: {result[key]}")
    goal = "met" if result["recover_within_goal"] else "NOT met"
    lines.append(
        f"recover.yml {result['recover_good_machine_s']} s against the issue's floor "
        f"{result['noop_issue_s']} s (ratio {result['ratio_recover_to_noop_issue']}, goal 1.0: "
        f"{goal}); strict floor {result['noop_strict_s']} s (ratio "
        f"{result['ratio_recover_to_noop_strict']})"
    )
    lines.append(
        f"reproduce: sudo .venv/bin/python -m benchmarks.recovery.bench --runs {result['runs']}"
    )
    return "\n".join(lines) + "\n"


def main() -> int:
    args = _cli.parser(
        __doc__, runs=3, json=True, out="also write results.json and results.txt here"
    ).parse_args()
    with _cli.scratch("recovery") as tmp:
        result = measure(args.runs, tmp)
        if args.out is not None:
            _cli.write_results(args.out, result, text(result))
            # Where the seconds go: the callback's record of the run the floors were counted from.
            first = tmp / "recover-first-run.json"
            (args.out / first.name).write_bytes(first.read_bytes())
    _cli.show(result, text(result), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
