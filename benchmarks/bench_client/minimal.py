"""A minimal independent client: the witness ct200-bench's figures are checked against.

It shares no code with ct200-bench (standard library only: http.client in one process per
request in flight, no aiohttp, no asyncio) and measures what ct200-bench's docs define: TTFT =
request sent -> first streamed chunk with text, output tok/s = the server's usage
completion_tokens over the point's wall time. Every prompt is fresh: random letters and spaces
from this process's own random source (never the same text twice, so no prompt cache serves it),
`--input-chars` long. One connection per request, as ct200-bench does.

    python benchmarks/bench_client/minimal.py --url http://127.0.0.1:8080 --concurrency 8 \
        --requests 64 --input-chars 128 --output-tokens 256 --json
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import random
import statistics
import string
import time
import urllib.parse
from multiprocessing.synchronize import Barrier as BarrierType
from typing import Any

LETTERS = string.ascii_lowercase + " "


def connect(url: urllib.parse.SplitResult) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
    conn.connect()
    return conn


def one(conn: http.client.HTTPConnection, body: bytes) -> dict[str, Any]:
    sent = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        return {"ok": False, "error": f"HTTP {resp.status}"}
    ttft = None
    usage: dict[str, object] = {}
    done = False
    for raw in resp:  # http.client undoes the chunked encoding; SSE is one event per line
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            break
        chunk = json.loads(data)
        choices = chunk.get("choices") or [{}]
        if ttft is None and choices[0].get("text"):
            ttft = time.perf_counter() - sent
        usage = chunk.get("usage") or usage
    conn.close()
    return {"ok": done and ttft is not None, "ttft_s": ttft, "usage": usage}


def _worker(url_text: str, jobs: mp.Queue, out: mp.Queue, barrier: BarrierType) -> None:
    url = urllib.parse.urlsplit(url_text)
    # The first request's body and connection are ready before the start: the first wave
    # leaves together, not one process after another (32 processes drawing from the queue and
    # connecting after the barrier spread it over 0.6 s on the GPU machine).
    body = jobs.get()
    conn = connect(url) if body is not None else None
    barrier.wait()
    while body is not None and conn is not None:
        out.put(one(conn, body))
        body = jobs.get()
        conn = connect(url) if body is not None else None


def point(args: argparse.Namespace) -> dict[str, object]:
    rng = random.SystemRandom()
    bodies = [
        json.dumps(
            {
                "model": args.model,
                "prompt": "".join(rng.choice(LETTERS) for _ in range(args.input_chars)),
                "max_tokens": args.output_tokens,
                "temperature": 0.0,
                "stream": True,
                "stream_options": {"include_usage": True},
                "ignore_eos": True,
            }
        ).encode()
        for _ in range(args.requests)
    ]
    # One process per request in flight: no interpreter lock shared between the streams, so
    # one stream's parsing never delays another's first token (threads did: see README).
    ctx = mp.get_context("fork")
    jobs: mp.Queue = ctx.Queue()
    out: mp.Queue = ctx.Queue()
    for body in bodies:
        jobs.put(body)
    for _ in range(args.concurrency):
        jobs.put(None)
    barrier = ctx.Barrier(args.concurrency + 1)
    procs = [
        ctx.Process(target=_worker, args=(args.url, jobs, out, barrier))
        for _ in range(args.concurrency)
    ]
    for proc in procs:
        proc.start()
    barrier.wait()
    start = time.perf_counter()
    results = [out.get() for _ in bodies]
    duration = time.perf_counter() - start
    for proc in procs:
        proc.join()
    ok = [r for r in results if r["ok"]]
    ttfts = sorted(float(r["ttft_s"]) * 1000 for r in ok)
    out_tokens = sum(int(r["usage"].get("completion_tokens", 0)) for r in ok)
    in_tokens = [int(r["usage"].get("prompt_tokens", 0)) for r in ok]
    return {
        "client": "minimal",
        "concurrency": args.concurrency,
        "requests_ok": len(ok),
        "requests_failed": len(results) - len(ok),
        "duration_s": round(duration, 4),
        "ttft_p50_ms": round(statistics.median(ttfts), 3) if ttfts else None,
        "output_tokens_per_s": round(out_tokens / duration, 2),
        "output_tokens": out_tokens,
        "prompt_tokens_mean": round(statistics.mean(in_tokens), 2) if in_tokens else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--model", default="rand")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--input-chars", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=256)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    result = point(args)
    print(json.dumps(result) if args.json else result)


if __name__ == "__main__":
    main()
