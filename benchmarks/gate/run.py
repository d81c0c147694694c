"""Time a server's start gate (`ct200-doctor gate NAME`, its unit's ExecStartPre) against the
whole doctor, its cuInit floor on the server's GPUs, and the server's own start, interleaved.

    PYTHONPATH=. python3 benchmarks/gate/run.py --gpus 0 --runs 20 --out DIR [--llama BINARY]

It builds its own site in a temporary directory: one model (a few MB of random bytes, staged by
ct200-stage into /dev/shm, so models.staged judges a real staged tree) and one server on the
given GPUs, on a free port. The server's engine is `command`: with --llama, llama.cpp's
llama-server serving the testbed's tiny model (and its start to a first 1-token completion is
timed too); without, python3 -m http.server (the gate only needs its program to be there).

Each round runs every contender once, in turn, so drift affects them alike. A gate that says
no-go (exit 2: no GPU here, say) is a verdict and is timed like a go; exit 3 or anything else
means the doctor broke, and the benchmark fails. Without an NVIDIA driver there is no cuInit
floor: it says so and gives no ratio to it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # run as a script: benchmarks._cli and ct200_tools from this tree

from benchmarks import _cli  # noqa: E402

GATE = "ct200-doctor gate"
CHECK = "ct200-doctor check"
FLOOR = "bare cuInit on the server's GPUs"
SERVE = "server start to first completion"
CUINIT = "import ctypes; ctypes.CDLL('libcuda.so.1').cuInit(0)"
VERDICTS = (0, 1, 2)
MODEL_BYTES = 8 << 20


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False
    )
    return time.perf_counter() - t0, proc.returncode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def serve_once(command: list[str], port: int, deadline_s: float = 120.0) -> float:
    """Start the server, time it to its first 1-token completion, stop it."""
    body = json.dumps({"model": "tiny", "prompt": "ping", "max_tokens": 1}).encode()
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while time.perf_counter() - t0 < deadline_s:
            if proc.poll() is not None:
                sys.exit(f"benchmark: the server exited with {proc.returncode} before it served")
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/completions",
                data=body,
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=5) as resp:  # noqa: S310
                    if resp.status == 200:
                        return time.perf_counter() - t0
            except OSError:
                time.sleep(0.01)
        sys.exit(f"benchmark: the server did not complete a token within {deadline_s:g} s")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def gpu_count() -> int:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 1
    out = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False).stdout
    return max(1, sum(1 for line in out.splitlines() if line.startswith("GPU ")))


def build_site(work: Path, gpus: list[int], llama: Path | None) -> tuple[Path, list[str], int]:
    """The site spec file, the server's command and its port; the model staged."""
    source = work / "models" / "bench"
    source.mkdir(parents=True)
    staged = f"/dev/shm/ct200-bench-gate-{os.getpid()}/bench"
    port = free_port()
    if llama is not None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from testbed import tiny_gguf  # noqa: PLC0415 - dev-only, with --llama

        tiny_gguf.write(source / "tiny.gguf")
        command = [str(llama), "--model", f"{staged}/tiny.gguf", "--alias", "tiny"]
        command += ["--port", str(port), "--ctx-size", "512", "--threads", "2"]
    else:
        (source / "weights.bin").write_bytes(os.urandom(MODEL_BYTES))
        command = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    doc = {
        "ct200_site": {
            "gpus": {"count": max(gpu_count(), max(gpus) + 1), "model": "bench"},
            "models": [{"name": "bench", "source": str(source), "staged": staged}],
            "servers": [
                {
                    "name": "bench",
                    "engine": "command",
                    "model": "bench",
                    "gpus": gpus,
                    "port": port,
                    "command": command,
                }
            ],
        }
    }
    site = work / "site.yml"
    site.write_text(yaml.safe_dump(doc))
    return site, command, port


def main() -> None:
    ap = _cli.parser(__doc__, runs=15, out="write gate.json and gate.txt here", out_required=True)
    ap.add_argument("--gpus", default="0", help="the server's GPUs, e.g. 0,1,2,3")
    ap.add_argument("--llama", type=Path, help="llama-server: serve the tiny model, time its start")
    a = ap.parse_args()
    gpus = [int(g) for g in a.gpus.split(",") if g.strip()]
    doctor = [sys.executable, "-m", "ct200_tools.cli.entry"]
    with _cli.scratch("gate") as work:
        env = {**os.environ, "CT200_MANIFEST_DIR": str(work / "manifests")}
        site, command, port = build_site(work, gpus, a.llama)
        staged_root = Path(f"/dev/shm/ct200-bench-gate-{os.getpid()}")
        try:
            stage = [*doctor[:2], "ct200_tools.cli.stage", "stage", "bench", "--spec", str(site)]
            r = subprocess.run(
                [*stage, "--create-manifest"], capture_output=True, text=True, env=env, check=False
            )
            if r.returncode != 0:
                sys.exit(f"benchmark: staging the model failed: {r.stdout}{r.stderr}")
            report = run(a, doctor, site, env, gpus, command if a.llama else None, port)
        finally:
            shutil.rmtree(staged_root, ignore_errors=True)
    write(a.out, report)


def run(
    a: argparse.Namespace,
    doctor: list[str],
    site: Path,
    env: dict[str, str],
    gpus: list[int],
    serve: list[str] | None,
    port: int,
) -> dict[str, object]:
    gate = [*doctor, "gate", "bench", "--spec", str(site)]
    contenders = {GATE: gate, CHECK: [*doctor, "check", "--spec", str(site)]}
    floor_env = {**env, "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}
    gpu = timed([sys.executable, "-c", CUINIT], floor_env)[1] == 0
    for argv in contenders.values():  # warm the page cache and the driver once
        timed(argv, env)
    times: dict[str, list[float]] = {k: [] for k in [*contenders, FLOOR, SERVE]}
    exits: dict[str, set[int]] = {k: set() for k in contenders}
    for _ in range(a.runs):
        for name, argv in contenders.items():
            seconds, rc = timed(argv, env)
            times[name].append(seconds)
            exits[name].add(rc)
        if gpu:
            times[FLOOR].append(timed([sys.executable, "-c", CUINIT], floor_env)[0])
        if serve is not None:
            times[SERVE].append(serve_once(serve, port))
    for name, codes in exits.items():
        if broke := sorted(codes - set(VERDICTS)):
            out = subprocess.run(
                contenders[name], capture_output=True, text=True, env=env, check=False
            )
            sys.exit(f"benchmark: {name} broke (exit {broke}): {out.stderr.strip()[-2000:]}")
    verdict = subprocess.run(gate, capture_output=True, text=True, env=env, check=False)
    medians = {k: statistics.median(v) for k, v in times.items() if v}
    rows = [
        {
            "command": k,
            "median_s": round(medians[k], 4),
            "min_s": round(min(v), 4),
            "max_s": round(max(v), 4),
            "vs_gate": round(medians[k] / medians[GATE], 2),
        }
        for k, v in times.items()
        if v
    ]
    return {
        "runs": a.runs,
        "gpus": gpus,
        "gpu": gpu,
        "exit_codes": {k: sorted(v) for k, v in exits.items()},
        "gate_verdict": verdict.stdout.strip().splitlines()[-1] if verdict.stdout.strip() else "",
        "rows": rows,
        "gate_over_check": round(medians[GATE] / medians[CHECK], 2),
        "gate_over_cuinit": round(medians[GATE] / medians[FLOOR], 2) if gpu else None,
        "gate_share_of_start": (
            round(medians[GATE] / (medians[GATE] + medians[SERVE]), 3) if SERVE in medians else None
        ),
    }


def write(out: Path, report: dict[str, object]) -> None:
    rows = report["rows"]
    assert isinstance(rows, list)
    lines = [f"{'command':<36} {'median s':>9} {'min s':>7} {'max s':>7} {'x gate':>7}"]
    lines += [
        f"{r['command']:<36} {r['median_s']:>9.3f} {r['min_s']:>7.3f} {r['max_s']:>7.3f} "
        f"{r['vs_gate']:>7.2f}"
        for r in rows
    ]
    lines.append("")
    lines.append(f"gate / whole check: {report['gate_over_check']}")
    if report["gpu"]:
        lines.append(f"gate / bare cuInit on its GPUs: {report['gate_over_cuinit']}")
    else:
        lines.append("no GPU here (libcuda.so.1 does not load): no cuInit floor, no ratio")
    share = report["gate_share_of_start"]
    if share is not None:
        lines.append(f"gate's share of gate + server start: {100 * float(str(share)):.1f}%")
    lines.append(f"gate verdict: {report['gate_verdict']}")
    text = "\n".join(lines) + "\n"
    _cli.write_results(out, report, text, stem="gate")
    _cli.show(report, text)


if __name__ == "__main__":
    main()
