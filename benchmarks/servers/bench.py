"""Inference server units on the testbed: `systemctl start` to the first completion, what the
units' ExecStartPre (preflight and the doctor's gate) and ExecStartPost (readiness) cost against
the server's own start, and a switch between two serving sets, by step.

    sudo .venv/bin/python -m benchmarks.servers.bench [--runs 5] [--json] [--out DIR]

Boots its own `ct` machine on a free test slot (1..8; slot 0 is left alone) and takes it down at
the end. The server is llama.cpp's llama-server with a tiny GGUF (tests/server_sites.py), the
`llamacpp` engine under the very unit template of the SGLang servers; the obvious alternative to
a gated unit, the same unit without its ExecStartPre and ExecStartPost (a runtime drop-in), runs
interleaved with it, the client polling /health itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks import _cli
from testbed import llama_build, ssh
from testbed.config import MachineSpec, Settings
from testbed.harness import Harness, claim_test_slot
from tests.server_sites import prepare_ct

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
UNIT = "ct200-server-tiny.service"
SCHEMA_VERSION = 1

#: Runs on the machine (as root): argv[1] runs, argv[2] port. Interleaves a gated start (the
#: unit as rendered) and a bare one (ExecStartPre= and ExecStartPost= emptied by a runtime
#: drop-in), each to its first completion; then the gate, the preflight and the readiness poll
#: alone. Prints one JSON object.
MEASURE = r"""
import json, os, subprocess, sys, time, urllib.request
runs, port, unit = int(sys.argv[1]), sys.argv[2], sys.argv[3]
base = f"http://127.0.0.1:{port}"
dropin = f"/run/systemd/system/{unit}.d/bench-bare.conf"
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

def sh(*argv):
    subprocess.run(argv, check=True, capture_output=True)

def complete():
    body = json.dumps({"prompt": "Hello", "max_tokens": 1}).encode()
    req = urllib.request.Request(base + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with opener.open(req, timeout=30) as resp:
        assert resp.status == 200 and json.load(resp)["usage"]["completion_tokens"] == 1

def healthy():
    try:
        with opener.open(base + "/health", timeout=2) as resp:
            return resp.status == 200
    except Exception:
        return False

def stamps():
    keys = ["InactiveExitTimestampMonotonic", "ExecMainStartTimestampMonotonic",
            "ActiveEnterTimestampMonotonic"]
    out = subprocess.run(["systemctl", "show", "-p", ",".join(keys), unit], check=True,
                         capture_output=True, text=True).stdout
    v = {k: int(x) / 1e6 for k, x in (l.split("=", 1) for l in out.splitlines())}
    return (v[keys[1]] - v[keys[0]], v[keys[2]] - v[keys[1]])

def start(bare):
    if bare:
        os.makedirs(os.path.dirname(dropin), exist_ok=True)
        with open(dropin, "w") as fh:
            fh.write("[Service]\nExecStartPre=\nExecStartPost=\n")
    elif os.path.exists(dropin):
        os.unlink(dropin)
    sh("systemctl", "daemon-reload")
    sh("systemctl", "stop", unit)
    t0 = time.monotonic()
    sh("systemctl", "start", unit)
    t1 = time.monotonic()
    while bare and not healthy():
        time.sleep(0.005)
    complete()
    t2 = time.monotonic()
    pre, post = stamps()
    return {"start_returned_s": t1 - t0, "first_completion_s": t2 - t0,
            "exec_start_pre_s": pre, "main_to_active_s": post}

def alone(argv):
    t0 = time.monotonic()
    subprocess.run(argv, check=True, capture_output=True)
    return time.monotonic() - t0

gated, bare, gate, preflight, ready = [], [], [], [], []
try:
    for _ in range(runs):
        gated.append(start(False))
        bare.append(start(True))
finally:
    if os.path.exists(dropin):
        os.unlink(dropin)
    sh("systemctl", "daemon-reload")
    sh("systemctl", "restart", unit)
name = unit.removeprefix("ct200-server-").removesuffix(".service")
spec = ["--spec", "/etc/ct200/site.yml"]
for _ in range(runs):
    gate.append(alone(["/opt/ct200/venv/bin/ct200-doctor", "gate", name, *spec]))
    preflight.append(alone(["runuser", "-u", "ct200", "--", "/opt/ct200/venv/bin/ct200-serve",
                            "preflight", name, *spec]))
    ready.append(alone(["/opt/ct200/venv/bin/ct200-serve", "wait-ready", name, *spec]))
print(json.dumps({"gated": gated, "bare": bare, "gate_s": gate, "preflight_s": preflight,
                  "wait_ready_s": ready}))
"""


def median(values: list[float]) -> float:
    return round(statistics.median(values), 3) + 0.0  # no -0.0 from a difference of stamps


def playbook(inventory: Path, *args: str) -> None:
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
    }
    argv = [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), *args]
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(
            f"bench: {' '.join(args[:1])} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}"
        )


def remote(harness: Harness, address: str, *command: str, timeout: float = 600) -> str:
    proc = subprocess.run(
        ssh.argv(harness.slot, address, command),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode not in (0,):
        sys.exit(
            f"bench: {' '.join(command[:3])} failed ({proc.returncode}): {proc.stderr[-2000:]}"
        )
    return proc.stdout


def switch(harness: Harness, address: str, name: str) -> dict[str, Any]:
    out = remote(harness, address, "/opt/ct200/venv/bin/ct200-serve", "switch", name, "--json")
    report: dict[str, Any] = json.loads(out)["result"]
    return report


def measure(runs: int, workdir: Path) -> dict[str, Any]:
    settings = Settings.from_env()
    with contextlib.ExitStack() as stack:
        slot = claim_test_slot(settings, stack)
        if slot is None:
            sys.exit("bench: every test slot is in use")
        harness = Harness(slot)
        stack.callback(harness.down, True)
        up = harness.up([MachineSpec.parse("ct:ct")], fresh=True)
        address = up.machines[0].address
        site = prepare_ct(harness.push, workdir, llama_build.ensure().binary)
        limit = ["--limit", "ct200-ct,localhost", "-e", f"@{site}"]
        playbook(up.inventory, "playbooks/container.yml", *limit, "--tags", "tools")
        gate = subprocess.run(
            ssh.argv(slot, address, ["/opt/ct200/venv/bin/ct200-doctor", "gate", "--help"]),
            capture_output=True,
            check=False,
        )
        if gate.returncode != 0:
            sys.exit("bench: the installed ct200-doctor has no `gate`: the units could not start")
        playbook(up.inventory, "playbooks/container.yml", *limit)
        raw = json.loads(
            remote(harness, address, "python3", "-c", MEASURE, str(runs), "8081", UNIT)
        )
        switches: dict[str, list[dict[str, Any]]] = {"tiny -> tiny-b": [], "tiny-b -> tiny": []}
        for _ in range(runs):
            switches["tiny -> tiny-b"].append(switch(harness, address, "tiny-b"))
            switches["tiny-b -> tiny"].append(switch(harness, address, "tiny"))
    return summarize(raw, switches, runs)


def summarize(
    raw: dict[str, Any], switches: dict[str, list[dict[str, Any]]], runs: int
) -> dict[str, Any]:
    def col(rows: list[dict[str, float]], key: str) -> float:
        return median([r[key] for r in rows])

    gated, bare = raw["gated"], raw["bare"]
    own = col(bare, "first_completion_s")
    pre = col(gated, "exec_start_pre_s")
    steps: dict[str, dict[str, float]] = {}
    for direction, reports in switches.items():
        names = [s["step"] for s in reports[0]["steps"]]
        steps[direction] = {
            n: median([next(s["seconds"] for s in r["steps"] if s["step"] == n) for r in reports])
            for n in names
        }
        steps[direction]["total"] = median([r["total_seconds"] for r in reports])
    return {
        "schema_version": SCHEMA_VERSION,
        "runs": runs,
        "gate": "ct200-doctor gate",
        "start_to_first_completion_s": {
            "gated_unit": col(gated, "first_completion_s"),
            "bare_unit": own,
        },
        "gated_unit": {
            "systemctl_start_returned_s": col(gated, "start_returned_s"),
            "exec_start_pre_s": pre,
            "main_process_to_active_s": col(gated, "main_to_active_s"),
        },
        "bare_unit_exec_start_pre_s": col(bare, "exec_start_pre_s"),
        "alone_s": {
            "ct200-doctor gate": median(raw["gate_s"]),
            "ct200-serve preflight": median(raw["preflight_s"]),
            "ct200-serve wait-ready (serving)": median(raw["wait_ready_s"]),
        },
        "ratio_exec_start_pre_to_server_own_start": round(pre / own, 2) if own else None,
        "switch_steps_s": steps,
    }


def text(result: dict[str, Any]) -> str:
    lines = [f"benchmarks/servers: {result['runs']} run(s), gate: {result['gate']}"]
    for key in ("start_to_first_completion_s", "gated_unit", "alone_s", "switch_steps_s"):
        lines.append(f"{key}:")
        for name, value in result[key].items():
            lines.append(f"  {name}: {value}")
    lines.append(f"bare_unit_exec_start_pre_s: {result['bare_unit_exec_start_pre_s']}")
    lines.append(
        "ratio_exec_start_pre_to_server_own_start: "
        f"{result['ratio_exec_start_pre_to_server_own_start']}"
    )
    lines.append(
        f"reproduce: sudo .venv/bin/python -m benchmarks.servers.bench --runs {result['runs']}"
    )
    return "\n".join(lines) + "\n"


def main() -> int:
    args = _cli.parser(
        __doc__, runs=5, json=True, out="also write results.json and results.txt here"
    ).parse_args()
    with _cli.scratch("servers") as tmp:
        result = measure(args.runs, tmp)
    if args.out is not None:
        _cli.write_results(args.out, result, text(result))
    _cli.show(result, text(result), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
