"""A stand-in OpenAI-compatible streaming server (it generates nothing: scripted chunks).

Stands in for vLLM/SGLang/llama-server where none can run: the benchmark of the client itself
(delays 0: it streams as fast as it can) and ct200-bench's tests (scripted delays are the ground
truth its TTFT and ITL are checked against). It serves /v1/models, /tokenize (one token per
word), /props (llama-server's shape) and a streaming /v1/completions: one chunk per token,
`--ttft` seconds before the first, `--itl` between the others, usage in the last chunk.

Faults, for the tests: --fail-every N answers every Nth completion with HTTP 500; --close-every
N closes every Nth stream after two tokens; --no-usage sends no usage; --die-after N exits the
process (os._exit) when the Nth completion starts; --stall-after N never answers a completion
after the Nth (a run that cannot end by itself, for a test that must interrupt it); --timings
adds llama-server's per-request `timings` (with draft counts) to the last chunk.
--usage-tokens N reports N completion tokens whatever was streamed; --tokens-per-chunk K streams
K tokens in each chunk (as a speculative server does); --redirect-to URL answers every request
with HTTP 302 to URL, --redirect-completions URL only the completions; --api-key KEY answers
HTTP 401 to a request without `Authorization: Bearer KEY`, as vLLM's --api-key does;
--stall-tokenize never answers /tokenize.
It prints "port N" once it listens.

    python benchmarks/bench_client/standin.py --port 0 --ttft 0.05 --itl 0.02
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware


def _chunk(text: str, finish: str | None = None) -> bytes:
    body = {
        "id": "cmpl-standin",
        "object": "text_completion",
        "model": "standin",
        "choices": [{"index": 0, "text": text, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _guard(args: argparse.Namespace) -> list[Middleware]:
    """The scripted redirects, stalls and the API key check, before any route."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        completion = request.path == "/v1/completions"
        if args.stall_tokenize and request.path == "/tokenize":
            await asyncio.sleep(args.lifetime)
        where = args.redirect_to or (args.redirect_completions if completion else None)
        if where:
            return web.Response(status=302, headers={"Location": where})
        if args.api_key and request.headers.get("Authorization") != f"Bearer {args.api_key}":
            return web.json_response({"error": "invalid api key"}, status=401)
        return await handler(request)

    return [guard]


def app(args: argparse.Namespace) -> web.Application:
    count = 0

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": args.model_id}]})

    async def props(_: web.Request) -> web.Response:
        return web.json_response({"default_generation_settings": {}, "build_info": "standin"})

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        text = body.get("prompt") or body.get("content") or ""
        return web.json_response({"tokens": list(range(len(text.split())))})

    async def completions(request: web.Request) -> web.StreamResponse:
        nonlocal count
        count += 1
        n = count
        body = await request.json()
        if args.die_after and n >= args.die_after:
            os._exit(0)
        if args.stall_after and n > args.stall_after:
            await asyncio.sleep(args.lifetime)
        if args.fail_every and n % args.fail_every == 0:
            return web.json_response({"error": "scripted failure"}, status=500)
        max_tokens = int(body.get("max_tokens", 16))
        if args.huge_line:
            # One SSE line that never ends: the client must give up at its bound.
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for _ in range(64):
                await resp.write(b"x" * (64 << 10))
            await resp.write_eof()
            return resp
        prompt_tokens = len(str(body.get("prompt", "")).split())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        per_chunk = max(1, args.tokens_per_chunk)
        for i in range(0, max_tokens, per_chunk):
            delay = args.ttft if i == 0 else args.itl
            if delay:
                await asyncio.sleep(delay)
            if args.close_every and n % args.close_every == 0 and i >= 2:
                # Drop the connection mid-stream: the chunked body never ends.
                assert request.transport is not None
                request.transport.abort()
                return resp
            finish = "length" if i + per_chunk >= max_tokens else None
            await resp.write(_chunk(" tok" * min(per_chunk, max_tokens - i), finish))
        timings = {}
        if args.timings:
            # llama-server's shape; a draft that proposed two tokens for each one kept.
            timings = {
                "timings": {
                    "prompt_n": prompt_tokens,
                    "predicted_n": max_tokens,
                    "predicted_ms": 1000 * args.itl * max(max_tokens - 1, 0),
                    "predicted_per_token_ms": 1000 * args.itl,
                    "draft_n": 2 * max_tokens,
                    "draft_n_accepted": max_tokens,
                }
            }
        completion = max_tokens if args.usage_tokens is None else args.usage_tokens
        if not args.no_usage:
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion,
                "total_tokens": prompt_tokens + completion,
            }
            tail = {"id": "cmpl-standin", "choices": [], "usage": usage, **timings}
            await resp.write(b"data: " + json.dumps(tail).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    application = web.Application(middlewares=_guard(args))
    application.router.add_get("/v1/models", models)
    application.router.add_get("/props", props)
    application.router.add_post("/tokenize", tokenize)
    application.router.add_post("/v1/completions", completions)
    return application


async def serve(args: argparse.Namespace) -> None:
    runner = web.AppRunner(app(args), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port)
    await site.start()
    server = site._server
    port = server.sockets[0].getsockname()[1] if server is not None else args.port
    print(f"port {port}", flush=True)
    await asyncio.sleep(args.lifetime)
    await runner.cleanup()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft", type=float, default=0.0, help="seconds before the first token")
    p.add_argument("--itl", type=float, default=0.0, help="seconds between tokens")
    p.add_argument("--fail-every", type=int, default=0)
    p.add_argument("--close-every", type=int, default=0)
    p.add_argument("--die-after", type=int, default=0)
    p.add_argument("--stall-after", type=int, default=0)
    p.add_argument("--no-usage", action="store_true")
    p.add_argument("--model-id", default="standin", help="the id /v1/models lists")
    p.add_argument("--huge-line", action="store_true", help="4 MiB without a newline")
    p.add_argument("--timings", action="store_true", help="llama-server's timings, with a draft")
    p.add_argument("--usage-tokens", type=int, default=None, help="completion_tokens to report")
    p.add_argument("--tokens-per-chunk", type=int, default=1, help="tokens in each chunk")
    p.add_argument("--redirect-to", default="", help="answer every request with 302 to this")
    p.add_argument("--redirect-completions", default="", help="302 completions to this")
    p.add_argument("--api-key", default="", help="require Authorization: Bearer KEY")
    p.add_argument("--stall-tokenize", action="store_true", help="never answer /tokenize")
    p.add_argument("--lifetime", type=float, default=600.0, help="exit after this many seconds")
    args = p.parse_args()
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
