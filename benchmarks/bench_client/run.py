"""Is ct200-bench's client the bottleneck? Its own overhead against a server that streams
instantly, at concurrency 1 to 256, the client pinned to one core.

    python benchmarks/bench_client/run.py [--out /tmp/ct200-bench-client]

The stand-in server (standin.py, delays 0) runs on the other core (taskset), so the client has
its core to itself. With no delay on the server's side, every millisecond of TTFT and ITL
measured is overhead: the client's, the server's and the loopback's together, so it is an
upper bound of what the client adds. Beside it: the tokens per second sustained, and the
client's CPU use (its process CPU time over the wall time, 100 % = its one core full). Where
the client's core is not full, the client was not the limit; the server's was.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks import _cli  # noqa: E402
from ct200_tools.bench import client  # noqa: E402
from ct200_tools.bench.metrics import summarize  # noqa: E402


def start_server(core: int | None, itl_s: float) -> tuple[subprocess.Popen[str], str]:
    argv = [sys.executable, str(Path(__file__).with_name("standin.py")), "--port", "0"]
    argv += ["--itl", str(itl_s)]
    if core is not None:
        argv = ["taskset", "-c", str(core), *argv]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("port "):
        os.kill(proc.pid, signal.SIGKILL)
        raise SystemExit(f"the stand-in server did not start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"


def measure(
    url: str, mode: str, concurrency: int, requests: int, output_tokens: int
) -> dict[str, object]:
    reqs = [client.Request(f"prompt {i} " + "word " * 16, output_tokens) for i in range(requests)]
    cpu0 = time.process_time()
    results, duration = asyncio.run(
        client.run_point(url, "standin", reqs, client.Load(concurrency), 120.0)
    )
    cpu = time.process_time() - cpu0
    point = summarize(results, duration)
    tokens = point["output_tokens"]
    return {
        "mode": mode,
        "concurrency": concurrency,
        "requests": requests,
        "output_tokens_per_request": output_tokens,
        "requests_failed": point["requests_failed"],
        "output_tokens_per_s": point["output_tokens_per_s"],
        "ttft_ms": point["ttft_ms"],
        "itl_ms": point["itl_ms"],
        "duration_s": point["duration_s"],
        "client_cpu_s": round(cpu, 3),
        "client_core_use": round(cpu / duration, 3) if duration > 0 else None,
        # What one token costs the client in CPU: its ceiling on one core is 1e6 / this.
        "client_cpu_us_per_token": (
            round(cpu * 1e6 / tokens, 2) if isinstance(tokens, int) and tokens else None
        ),
    }


def main() -> None:
    p = _cli.parser(__doc__, out="write results.json here", out_default="/tmp/ct200-bench-client")
    p.add_argument("--concurrency", default="1,4,16,64,256")
    p.add_argument("--requests", type=int, default=0, help="per level [default: max(32, 2x c)]")
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--paced-itl-ms", type=float, default=20.0, help="the paced run's scripted ITL")
    p.add_argument("--client-core", type=int, default=0)
    p.add_argument("--server-core", type=int, default=1)
    args = p.parse_args()
    cores = os.sched_getaffinity(0)
    pin = args.client_core in cores and args.server_core in cores
    if pin:
        os.sched_setaffinity(0, {args.client_core})
    rows = []
    for mode, itl_s in (("instant", 0.0), ("paced", args.paced_itl_ms / 1000)):
        proc, url = start_server(args.server_core if pin else None, itl_s)
        try:
            for c in (int(x) for x in args.concurrency.split(",")):
                n = args.requests or max(32, 2 * c)
                measure(url, mode, c, min(n, 8), args.output_tokens)  # warm pool and imports
                rows.append(measure(url, mode, c, n, args.output_tokens))
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    report = {
        "pinned": pin,
        "client_core": args.client_core if pin else None,
        "server_core": args.server_core if pin else None,
        "python": sys.version.split()[0],
        "cpu": _cpu(),
        "paced_itl_ms": args.paced_itl_ms,
        "rows": rows,
    }
    written = _cli.write_results(args.out, report)
    print(
        "mode     concurrency  tok/s   TTFT p50/p99 ms    ITL p50/p99 ms   client core  "
        "CPU us/token  failed"
    )
    for r in rows:
        t, i = r["ttft_ms"], r["itl_ms"]
        assert isinstance(t, dict) and isinstance(i, dict)
        print(
            f"{r['mode']:<8} {r['concurrency']:>11}  {r['output_tokens_per_s']:>6.0f}  "
            f"{t['p50']:>7.2f}/{t['p99']:<8.2f}  {i['p50']:>7.3f}/{i['p99']:<8.3f}  "
            f"{100 * float(r['client_core_use'] or 0):>9.0f} %  "
            f"{r['client_cpu_us_per_token']:>12}  {r['requests_failed']}"
        )
    print(f"written: {written}")


def _cpu() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


if __name__ == "__main__":
    main()
