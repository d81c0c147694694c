"""ct200-bench against an independent client on the same real server, in alternating order.

Starts llama-server (a given binary and GGUF; on the GPU machine the CUDA build and the 1.5 GB
random-weight model of tests/gpu) and, for each concurrency level and round, runs ct200-bench's
ad-hoc sweep and the minimal client (minimal.py: standard library only, fresh random prompts),
swapping which goes first every round. Both send fresh prompts of the same length (the minimal
client's character count is set so the server's usage counts the same prompt tokens). Writes
witness.json (every figure), the server's log, and a Markdown table; the server's own
`prompt eval time = X ms / N tokens` lines are counted to show no prompt was served from cache.

    python -m benchmarks.bench_client.witness --binary BUILD/llama-server --model M.gguf \
        --out /tmp/witness [--levels 1,8,32] [--rounds 2] [--requests 32] [--ngl 99]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = Path(__file__).with_name("minimal.py")
EVAL = re.compile(rb"prompt eval time =\s+([\d.]+) ms /\s+(\d+) tokens")
#: llama-server's log: `M.SS.mmm.uuu I slot launch_slot_: id N | task T | ...` when a request
#: starts, `... print_timing: ... | task T |       total time = ...` when it ends.
LAUNCH = re.compile(
    rb"^(\d+)\.(\d+)\.(\d+)\.(\d+) I slot launch_slot_: id +\d+ \| task (\d+) ", re.M
)
ENDED = re.compile(
    rb"^(\d+)\.(\d+)\.(\d+)\.(\d+) I slot print_timing: .*\| task (\d+) \| +total time", re.M
)
#: Requests the minimal client sends before the first row (not counted).
WARM = 2


def _stamps(pattern: re.Pattern[bytes], log: bytes) -> dict[int, float]:
    out = {}
    for m, s, ms, us, task in pattern.findall(log):
        out[int(task)] = int(m) * 60 + int(s) + int(ms) / 1e3 + int(us) / 1e6
    return out


def server_spans(log: bytes, rows: list[dict[str, object]], requests: int) -> None:
    """The server's own view of each row: from its first request's start to its last one's
    end by llama-server's log, and the output tokens over that span. Rows ran one after the
    other, so the log's requests in start order are the warm-up, then `requests` a row."""
    started, ended = _stamps(LAUNCH, log), _stamps(ENDED, log)
    tasks = sorted(started, key=started.__getitem__)[WARM:]
    for i, row in enumerate(rows):
        seg = tasks[i * requests : (i + 1) * requests]
        if len(seg) != requests or any(t not in ended for t in seg) or "error" in row:
            row["server_span_s"] = None
            continue
        span = max(ended[t] for t in seg) - min(started[t] for t in seg)
        row["server_span_s"] = round(span, 4)
        # How far apart the server launched the first wave (one request a slot): the shape of
        # the load the client made, which both clients must share for their figures to agree.
        level = row.get("concurrency")
        if isinstance(level, int) and level > 1:
            wave = sorted(started[t] for t in seg)[:level]
            row["server_first_wave_spread_ms"] = round((wave[-1] - wave[0]) * 1000, 1)
        tokens = row.get("output_tokens")
        if isinstance(tokens, int) and span > 0:
            row["server_output_tokens_per_s"] = round(tokens / span, 2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def server(args: argparse.Namespace, log: Path) -> Iterator[str]:
    port = free_port()
    slots = max(args.levels)
    ctx = slots * (args.input_tokens + args.output_tokens + 64)
    argv = [
        *(str(args.binary), "--model", str(args.model), "--alias", "rand"),
        *("--host", "127.0.0.1", "--port", str(port), "-np", str(slots)),
        *("--ctx-size", str(ctx), "-ngl", str(args.ngl)),
    ]
    with log.open("wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"llama-server exited {proc.returncode}; log {log}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(base + "/health", timeout=2) as r,  # noqa: S310
            ):
                if r.status == 200:
                    break
            time.sleep(0.5)
        else:
            raise SystemExit(f"llama-server did not answer /health in 300 s; log {log}")
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def run_bench(args: argparse.Namespace, base: str, level: int, out: Path) -> dict[str, object]:
    argv = [
        *(sys.executable, "-m", "ct200_tools.cli.bench", "run", "--target", base),
        *("--concurrency", str(level), "--input-tokens", str(args.input_tokens)),
        *("--output-tokens", str(args.output_tokens), "--requests", str(args.requests)),
        *("--out", str(out), "--json"),
    ]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    points = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or len(points) != 1:
        return {"client": "ct200-bench", "error": proc.stderr[-2000:], "rc": proc.returncode}
    p = points[0]
    return {
        "client": "ct200-bench",
        "concurrency": level,
        "requests_ok": p["requests_completed"],
        "requests_failed": p["requests_failed"],
        "duration_s": p["duration_s"],
        "ttft_p50_ms": p["ttft_ms"]["p50"],
        "output_tokens_per_s": p["output_tokens_per_s"],
        "output_tokens": p["output_tokens"],
        "prompt_tokens_mean": (p["input_tokens"] or 0) / max(1, p["requests_completed"]),
        "cached_prompt_tokens": p.get("cached_prompt_tokens"),
        "engine_predicted_per_token_ms": (p.get("engine_timings") or {}).get(
            "predicted_per_token_ms_mean"
        ),
        "tpot_p50_ms": p["tpot_ms"]["p50"],
    }


def run_minimal(args: argparse.Namespace, base: str, level: int) -> dict[str, object]:
    argv = [
        *(sys.executable, str(MINIMAL), "--url", base, "--concurrency", str(level)),
        *("--requests", str(args.requests), "--input-chars", str(args.input_chars)),
        *("--output-tokens", str(args.output_tokens), "--json"),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return {"client": "minimal", "error": proc.stderr[-2000:], "rc": proc.returncode}
    result: dict[str, object] = json.loads(proc.stdout)
    return result


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.0f}"  # NaN: no figure (one request a wave)


def table(rows: list[dict[str, object]], levels: list[int]) -> list[str]:
    out = [
        "| c | ct200-bench TTFT p50 ms | minimal TTFT p50 ms | diff | ct200-bench tok/s | "
        "minimal tok/s | ratio | server's own tok/s (bench / minimal) | "
        "prompt tokens (bench / minimal) | first wave launched within ms (bench / minimal) |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for level in levels:

        def med(client: str, key: str, level: int = level) -> float:
            vals = [
                float(r[key])  # type: ignore[arg-type]
                for r in rows
                if r.get("client") == client and r.get("concurrency") == level and r.get(key)
            ]
            return statistics.median(vals) if vals else float("nan")

        bt, mt = med("ct200-bench", "ttft_p50_ms"), med("minimal", "ttft_p50_ms")
        bs, ms = med("ct200-bench", "output_tokens_per_s"), med("minimal", "output_tokens_per_s")
        bp, mp = med("ct200-bench", "prompt_tokens_mean"), med("minimal", "prompt_tokens_mean")
        key = "server_output_tokens_per_s"
        bv, mv = med("ct200-bench", key), med("minimal", key)
        key = "server_first_wave_spread_ms"
        bw, mw = med("ct200-bench", key), med("minimal", key)
        out.append(
            f"| {level} | {bt:.2f} | {mt:.2f} | {bt - mt:+.2f} ms ({(bt - mt) / mt:+.1%}) | "
            f"{bs:.1f} | {ms:.1f} | {bs / ms:.3f} | {bv:.1f} / {mv:.1f} | {bp:.1f} / {mp:.1f} | "
            f"{_ms(bw)} / {_ms(mw)} |"
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--binary", type=Path, required=True)
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--levels", default="1,8,32")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--input-tokens", type=int, default=128)
    p.add_argument("--input-chars", type=int, default=0, help="default: --input-tokens - 1")
    p.add_argument("--output-tokens", type=int, default=256)
    p.add_argument("--ngl", default="99")
    args = p.parse_args()
    args.levels = [int(x) for x in args.levels.split(",")]
    # The character vocabulary of the testbed's model: one token a character, plus BOS.
    args.input_chars = args.input_chars or args.input_tokens - 1
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "llama-server.log"
    rows: list[dict[str, object]] = []
    with server(args, log) as base:
        # One request first, not counted: CUDA graphs and allocations warm for both clients.
        warm = argparse.Namespace(**{**vars(args), "requests": WARM})
        run_minimal(warm, base, 1)
        for level in args.levels:
            for rnd in range(args.rounds):
                order = ("bench", "minimal") if rnd % 2 == 0 else ("minimal", "bench")
                for who in order:
                    t0 = time.monotonic()
                    if who == "bench":
                        row = run_bench(args, base, level, args.out / "bench")
                    else:
                        row = run_minimal(args, base, level)
                    row.update(round=rnd, order=order.index(who), wall_s=time.monotonic() - t0)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    server_spans(log.read_bytes(), rows, args.requests)
    evals = [int(n) for _, n in EVAL.findall(log.read_bytes())]
    summary = {
        "rows": rows,
        "server_prompt_evals": {
            "count": len(evals),
            "min_tokens": min(evals, default=None),
            "median_tokens": statistics.median(evals) if evals else None,
            "below_half": sum(1 for n in evals if n < args.input_tokens // 2),
        },
        "table": table(rows, args.levels),
    }
    (args.out / "witness.json").write_text(json.dumps(summary, indent=1))
    (args.out / "witness.md").write_text("\n".join(summary["table"]) + "\n")  # type: ignore[arg-type]
    print("\n".join(summary["table"]))  # type: ignore[arg-type]
    print(json.dumps(summary["server_prompt_evals"]))


if __name__ == "__main__":
    main()
