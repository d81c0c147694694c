"""A stand-in OpenAI-compatible streaming server (it generates nothing: scripted chunks).

Stands in for vLLM/SGLang/llama-server where none can run: the benchmark of the client itself
(delays 0: it streams as fast as it can) and ct200-bench's tests (scripted delays are the ground
truth its TTFT and ITL are checked against). It serves /v1/models, /tokenize (one token per
word), /props (llama-server's shape) and a streaming /v1/completions and /v1/chat/completions:
one chunk per token, `--ttft` seconds before the first, `--itl` between the others, usage in the
last chunk. A chat answer opens with a role-only chunk (as the engines' do); `--reasoning N`
streams its first N tokens as `delta.reasoning_content`. Usage reports
`prompt_tokens_details.cached_tokens`: the longest word prefix the prompt shares with any prompt
served before (a prefix cache, as vLLM's and SGLang's; chat messages count two words each for
the template).

Faults, for the tests: --fail-every N answers every Nth completion with HTTP 500; --close-every
N closes every Nth stream after two tokens; --no-usage sends no usage; --die-after N exits the
process (os._exit) when the Nth completion starts; --stall-after N never answers a completion
after the Nth (a run that cannot end by itself, for a test that must interrupt it); --timings
adds llama-server's per-request `timings` (with draft counts) to the last chunk. --model-meta N
lists the model in /v1/models with llama-server's `meta` (N parameters, 2N bytes: a model's
size, for the report's pooling). --max-streams N serves N completions at a time and queues the
rest (an engine whose throughput saturates at N streams: the sweep's knee).
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


def _delta(delta: dict[str, str], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-standin",
        "object": "chat.completion.chunk",
        "model": "standin",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _token(chat: bool, reasoning: bool, finish: str | None, n: int = 1) -> bytes:
    """A chunk of `n` tokens (several: as a speculative server streams)."""
    if not chat:
        return _chunk(" tok" * n, finish)
    delta = {"reasoning_content": " think" * n} if reasoning else {"content": " tok" * n}
    return _delta(delta, finish)


def _words(body: dict[str, object]) -> list[str]:
    """The prompt as the stand-in's tokens: words, two more a chat message (its template)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        out: list[str] = []
        for m in messages:
            said = m if isinstance(m, dict) else {}
            out += [f"<|{said.get('role')}|>", "<|end|>", *str(said.get("content")).split()]
        return out
    return str(body.get("prompt", "")).split()


class PrefixCache:
    """The prompts served so far; a new prompt's cached tokens are its longest shared prefix."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def serve(self, words: list[str]) -> int:
        best = 0
        for old in self.seen:
            n = 0
            for a, b in zip(old, words, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        if len(self.seen) < 20_000:
            self.seen.append(words)
        # As llama-server, the last prompt token is always evaluated again.
        return min(best, max(len(words) - 1, 0))


def _stream_limit(most: int) -> Middleware:
    """At most `most` completions answered at a time (0: no limit); the others wait."""
    gate = asyncio.Semaphore(most or 1 << 30)

    @web.middleware
    async def limit(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "POST" or "completions" not in request.path:
            return await handler(request)
        async with gate:
            return await handler(request)

    return limit


def _guard(args: argparse.Namespace) -> list[Middleware]:
    """The scripted redirects, stalls and the API key check, before any route."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        completion = request.path.endswith("/completions")
        if args.stall_tokenize and request.path == "/tokenize":
            await asyncio.sleep(args.lifetime)
        where = args.redirect_to or (args.redirect_completions if completion else None)
        if where:
            return web.Response(status=302, headers={"Location": where})
        if args.api_key and request.headers.get("Authorization") != f"Bearer {args.api_key}":
            return web.json_response({"error": "invalid api key"}, status=401)
        return await handler(request)

    return [guard]


def app(args: argparse.Namespace) -> web.Application:  # noqa: PLR0915 - one server
    count = 0
    cache = PrefixCache()

    async def models(_: web.Request) -> web.Response:
        meta = {"n_params": args.model_meta, "size": 2 * args.model_meta}
        entry = {"id": args.model_id, **({"meta": meta} if args.model_meta else {})}
        return web.json_response({"object": "list", "data": [entry]})

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
        prompt = _words(body)
        prompt_tokens = len(prompt)
        cached = cache.serve(prompt)
        chat = request.path.endswith("/chat/completions")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if chat:
            await resp.write(_delta({"role": "assistant", "content": ""}))
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
            n_tokens = min(per_chunk, max_tokens - i)
            await resp.write(_token(chat, i < args.reasoning, finish, n_tokens))
        timings = {}
        if args.timings:
            # llama-server's shape; a draft that proposed two tokens for each one kept, kept half
            # the tokens after the first (which the prompt's evaluation samples, not a draft).
            kept = (max_tokens - 1) // 2
            timings = {
                "timings": {
                    "prompt_n": prompt_tokens,
                    "predicted_n": max_tokens,
                    "predicted_ms": 1000 * args.itl * max(max_tokens - 1, 0),
                    "predicted_per_token_ms": 1000 * args.itl,
                    "draft_n": 2 * kept,
                    "draft_n_accepted": kept,
                }
            }
        completion = max_tokens if args.usage_tokens is None else args.usage_tokens
        if not args.no_usage:
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion,
                "total_tokens": prompt_tokens + completion,
                "prompt_tokens_details": {"cached_tokens": cached},
            }
            tail = {"id": "cmpl-standin", "choices": [], "usage": usage, **timings}
            await resp.write(b"data: " + json.dumps(tail).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    application = web.Application(middlewares=[*_guard(args), _stream_limit(args.max_streams)])
    application.router.add_get("/v1/models", models)
    application.router.add_get("/props", props)
    application.router.add_post("/tokenize", tokenize)
    application.router.add_post("/v1/completions", completions)
    application.router.add_post("/v1/chat/completions", completions)
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
    p.add_argument("--reasoning", type=int, default=0, help="chat: first N tokens as reasoning")
    p.add_argument("--model-meta", type=int, default=0, help="/v1/models meta: N parameters")
    p.add_argument("--max-streams", type=int, default=0, help="answer N completions at once")
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
