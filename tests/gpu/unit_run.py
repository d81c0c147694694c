"""Start one server exactly as its rendered systemd unit would, on a machine without systemd as
PID 1 (the lent GPU machine), and report what happened as JSON.

``python -m tests.gpu.unit_run --site SITE --server NAME --report OUT.json [--sweep ARGV_JSON]``

Run as root. Everything happens in a private mount namespace, where empty directories are
bind-mounted over /etc/ct200, /var/lib/ct200 and /var/cache/ct200, so the unit's own paths
(/etc/ct200/site.yml, the EnvironmentFile, the manifests) are used as rendered, and the machine's
real directories are never written (they are created empty when absent, and removed again).

The sequence is the unit's, from the text `ct200_tools.serve.render` produces (the same bytes the
inference_servers role installs):

1. every ExecStartPre= argv, in order (`ct200-serve preflight`, `ct200-doctor gate`: a real
   cuInit on the server's GPUs), each must exit 0;
2. ExecStart='s argv with the unit's Environment= and EnvironmentFile= variables, in a fresh
   cgroup v2 child (the kernel's, as systemd would create for the unit);
3. ExecStartPost= (`ct200-serve wait-ready`, with $MAINPID) must exit 0: it serves;
4. `ct200-doctor check --server NAME --only server --only models --json`, with a *stand-in* for
   `systemctl show` (systemd is not PID 1 there: the stand-in reports the unit active with the
   real MainPID and the real cgroup above, in systemctl's own KEY=VALUE format; every other
   systemctl call fails), so the doctor reads the unit's processes from the kernel's cgroup and
   NVML's compute processes as it does under systemd;
5. `nvidia-smi --query-compute-apps` as ground truth for which GPU the process is on;
6. optionally a benchmark sweep (argv given as JSON, `{url}` replaced by the server's URL);
7. the cgroup killed and removed, the mounts gone with the namespace, and the staged copies this
   run made (absent before it) removed.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ct200_tools.serve import engines
from ct200_tools.serve.render import render
from ct200_tools.spec import load_spec
from testbed.units import unquote
from tests.gpu import nvsmi
from tests.gpu.faults import CLONE_NEWNS, MS_BIND, MS_PRIVATE, MS_REC, cgroup2_root, remove_cgroup

REPO = Path(__file__).resolve().parents[2]
PRIVATE_DIRS = ("/etc/ct200", "/var/lib/ct200", "/var/cache/ct200")
_libc = ctypes.CDLL(None, use_errno=True)


def directives(unit: str, key: str) -> list[str]:
    return [m.group(1) for m in re.finditer(rf"^{key}=(.*)$", unit, re.MULTILINE)]


def env_file(text: str) -> dict[str, str]:
    """KEY="value" lines as EnvironmentFile= reads them (the template writes only that form)."""
    out = {}
    for line in text.splitlines():
        m = re.match(r'^([A-Za-z_][A-Za-z0-9_]*)="(.*)"$', line)
        if m:
            out[m.group(1)] = re.sub(r"\\(.)", r"\1", m.group(2))
    return out


def private_mounts(scratch: Path) -> None:
    """Enter a private mount namespace with empty directories over PRIVATE_DIRS (which the
    outer process made sure exist)."""
    if _libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    if _libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "make / private")
    for d in PRIVATE_DIRS:
        src = scratch / d.strip("/").replace("/", "_")
        src.mkdir(parents=True)
        if _libc.mount(str(src).encode(), d.encode(), None, MS_BIND, None) != 0:
            raise OSError(ctypes.get_errno(), f"bind {src} over {d}")


def tools_bin(into: Path) -> Path:
    """ct200-doctor, ct200-serve and ct200-stage as this checkout's modules, like the venv's
    console scripts the unit names."""
    into.mkdir(parents=True, exist_ok=True)
    mains = {
        "ct200-doctor": "ct200_tools.cli.entry",
        "ct200-serve": "ct200_tools.cli.serve",
        "ct200-stage": "ct200_tools.cli.stage",
    }
    for name, module in mains.items():
        script = into / name
        script.write_text(
            f"#!{sys.executable} -P\nimport sys\nsys.path.insert(0, {str(REPO)!r})\n"
            f"from {module} import main\nsys.exit(main())\n"
        )
        script.chmod(0o755)
    return into


SYSTEMCTL_STANDIN = """#!{python} -P
# STAND-IN for systemctl (systemd is not PID 1 here): `systemctl show` of the one unit this
# run started, in systemctl's KEY=VALUE format, from {state}; every other call fails.
import json, sys
state = json.load(open({state!r}))
args = sys.argv[1:]
if not args or args[0] != "show":
    print("systemctl stand-in: only `show` is answered here", file=sys.stderr)
    sys.exit(1)
props = next((a.split("=", 1)[1].split(",") for a in args if a.startswith("--property=")), [])
units = [a for a in args[1:] if not a.startswith("-")]
for i, unit in enumerate(units):
    known = unit == state["Id"]
    values = dict(state) if known else {{"Id": unit, "LoadState": "not-found",
        "ActiveState": "inactive", "SubState": "dead", "MainPID": "0"}}
    if i:
        print()
    for p in props or values:
        print(f"{{p}}={{values.get(p, '')}}")
"""


#: How much of a step's output the report keeps (the doctor's JSON is a few tens of KB).
KEEP_CHARS = 1 << 20


def run(argv: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    t0 = time.monotonic()
    proc = subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    return {
        "argv": argv,
        "rc": proc.returncode,
        "stdout": proc.stdout[-KEEP_CHARS:],
        "stderr": proc.stderr[-KEEP_CHARS:],
        "seconds": round(time.monotonic() - t0, 3),
    }


def drive(args: argparse.Namespace, scratch: Path, report: dict[str, Any]) -> None:
    site_text = Path(args.site).read_text()
    Path("/etc/ct200/site.yml").write_text(site_text)
    spec = load_spec(Path("/etc/ct200/site.yml"))
    server = next(s for s in spec.servers if s.name == args.server)
    bin_dir = tools_bin(scratch / "bin")
    files = render(spec, server.name, tools_bin=str(bin_dir))
    report["unit"] = files.unit
    report["env_file"] = files.env
    for path, text in files.files(server.name, unit_dir=str(scratch / "units")).items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    for line in directives(files.unit, "Environment"):
        key, _, value = unquote(line)[0].partition("=")
        env[key] = value
    env |= env_file(files.env)
    Path(env.get("HOME", scratch / "home")).mkdir(parents=True, exist_ok=True)
    report["environment"] = env

    # Stage the models as the unit's Wants=ct200-stage@ units would (manifests created here):
    # the served one and a draft model declared under models (its stage_units).
    for model in engines.models_of(spec, server):
        if not os.path.lexists(model.staged):
            # Staged by this run alone: removed when it ends (main), since the manifest it
            # creates lives under the private /var/lib/ct200 and goes with it: a later run would
            # find the copy without its manifest, and the stage would rightly refuse it.
            report.setdefault("staged_here", []).append(model.staged)
        report["stage"] = run(
            [
                str(bin_dir / "ct200-stage"),
                "stage",
                model.name,
                "--spec",
                "/etc/ct200/site.yml",
                "--create-manifest",
            ],
            dict(os.environ),
            600,
        )
        if report["stage"]["rc"] != 0:
            return

    report["exec_start_pre"] = []
    for line in directives(files.unit, "ExecStartPre"):
        argv = unquote(line.lstrip("+-!@:"))
        got = run(argv, {**os.environ, **env}, 300)
        report["exec_start_pre"].append(got)
        if got["rc"] != 0:
            return

    (argv,) = [unquote(line) for line in directives(files.unit, "ExecStart")]
    report["exec_start"] = argv
    # A cgroup named as systemd names the unit's (the doctor tells the unit's own processes from
    # others by it), under a slice of this run's own, so nothing else is touched.
    slice_ = cgroup2_root() / f"ct200-unit-run-{os.getpid()}.slice"
    slice_.mkdir()
    cg = slice_ / engines.unit_name(server.name)
    cg.mkdir()
    report["cgroup"] = "/" + str(cg.relative_to(cgroup2_root()))
    log = open(scratch / "server.log", "wb")  # noqa: SIM115 - closed in finally below
    procs = str(cg / "cgroup.procs")

    def enter() -> None:
        with open(procs, "w") as fh:
            fh.write(str(os.getpid()))

    cwd = env.get("HOME", str(scratch))
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=enter,  # noqa: PLW1509 - this process runs one thread
        cwd=cwd,
    )
    report["main_pid"] = proc.pid
    try:
        # The first is the readiness wait; the second (`systemctl reset-failed` of the unit, once
        # it serves) needs the real systemd and is left out here.
        post = directives(files.unit, "ExecStartPost")[0]
        post_argv = [w.replace("$MAINPID", str(proc.pid)) for w in unquote(post)]
        report["exec_start_post"] = run(
            post_argv, {**os.environ, **env, "MAINPID": str(proc.pid)}, 600
        )
        if report["exec_start_post"]["rc"] != 0:
            return
        state = scratch / "unit-state.json"
        state.write_text(
            json.dumps(
                {
                    "Id": engines.unit_name(server.name),
                    "LoadState": "loaded",
                    "ActiveState": "active",
                    "SubState": "running",
                    "Result": "success",
                    "NRestarts": "0",
                    "MainPID": str(proc.pid),
                    "ExecMainStatus": "0",
                    "ControlGroup": report["cgroup"],
                }
            )
        )
        standin = scratch / "standin-bin"
        standin.mkdir()
        (standin / "systemctl").write_text(
            SYSTEMCTL_STANDIN.format(python=sys.executable, state=str(state))
        )
        (standin / "systemctl").chmod(0o755)
        doctor_env = {**os.environ, "PATH": f"{standin}:{os.environ.get('PATH', '')}"}
        report["doctor"] = run(
            [
                str(bin_dir / "ct200-doctor"),
                "check",
                "--server",
                server.name,
                "--only",
                "server",
                "--only",
                "models",
                "--json",
                "--spec",
                "/etc/ct200/site.yml",
            ],
            doctor_env,
            120,
        )
        report["compute_apps"] = nvsmi.query("compute-apps", ["pid", "gpu_bus_id", "used_memory"])
        report["gpu_bus_ids"] = [gpu["pci.bus_id"] for gpu in nvsmi.query_gpus()]
        if args.sweep:
            sweep = [w.replace("{url}", engines.base_url(server)) for w in json.loads(args.sweep)]
            report["sweep"] = run(sweep, dict(os.environ), 540)
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        remove_cgroup(cg)
        slice_.rmdir()
        log.close()
        report["server_log_tail"] = (
            (scratch / "server.log").read_bytes()[-6000:].decode("utf-8", "replace")
        )


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.gpu.unit_run")
    parser.add_argument("--site", required=True)
    parser.add_argument("--server", required=True)
    parser.add_argument("--report", required=True)
    parser.add_argument("--sweep", help="JSON argv of a benchmark to run against {url}")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.inner:
        # The mount points must exist on the machine; make the missing ones (empty), run the
        # sequence in a child that enters the namespace, then remove what was made here.
        created = [d for d in PRIVATE_DIRS if not os.path.isdir(d)]
        for d in created:
            os.makedirs(d)
        try:
            argv = [sys.executable, "-m", "tests.gpu.unit_run", *sys.argv[1:], "--inner"]
            return subprocess.run(argv, check=False, cwd=REPO).returncode
        finally:
            for d in reversed(created):
                with contextlib.suppress(OSError):
                    os.removedirs(d)
    report: dict[str, Any] = {}
    scratch = Path(tempfile.mkdtemp(prefix="ct200-unit-run-"))
    try:
        private_mounts(scratch / "mounts")
        drive(args, scratch, report)
    except Exception as exc:  # noqa: BLE001 - reported to the test, which fails with it
        report["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        Path(args.report).write_text(json.dumps(report, indent=1))
        shutil.rmtree(scratch, ignore_errors=True)
        for staged in report.get("staged_here", []):
            shutil.rmtree(staged, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
