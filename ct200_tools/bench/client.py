"""The built-in load generator: an asynchronous streaming client of OpenAI's /v1/completions
and /v1/chat/completions.

Each request streams (`stream: true`) with `stream_options: {include_usage: true}`, so the server
reports its own token counts in the last chunk; `ignore_eos: true` asks for exactly max_tokens
(vLLM, SGLang and llama-server honour it). Everything the server sends is hostile: each SSE line,
each response and each error body is bounded, and a broken answer is a failed request with its
reason, never an exception out of the sweep. A request fails unless it got HTTP 200, at least one
chunk with text, and the closing `data: [DONE]`: a server that dies or closes mid-stream is an
error, counted, and the sweep goes on. A chat answer's first chunk that carries only the role is
no token; reasoning text (`reasoning_content`, vLLM's newer `reasoning`) is output and counts.
A redirect is never followed (the answer would be another server's, recorded as the target's):
it fails the request, naming its Location. Usage that contradicts the stream (fewer completion
tokens than text chunks, more than max_tokens, none after text) fails the request too: it is no
figure to turn into tok/s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import aiohttp

from ct200_tools.bench.http import read_upto, redirect_error
from ct200_tools.bench.metrics import RequestResult
from ct200_tools.bench.target import Auth
from ct200_tools.untrusted import show

#: The longest SSE line accepted: a token chunk is a few hundred bytes; 1 MiB is no chunk.
MAX_LINE: Final = 1 << 20
#: The most bytes one streamed answer may have (a 64k-token answer is a few MB of SSE).
MAX_STREAM: Final = 64 << 20
#: The most bytes of an error body kept for the message.
MAX_ERROR_BODY: Final = 4096
#: The engine timings kept per request (llama-server's `timings`), the rest ignored.
TIMINGS: Final = (
    "prompt_n",
    "prompt_ms",
    "predicted_n",
    "predicted_ms",
    "predicted_per_token_ms",
    "draft_n",
    "draft_n_accepted",
)
#: Counts above this are no count (a hostile or broken server), and are dropped.
MAX_COUNT: Final = 1 << 40


COMPLETIONS: Final = "/v1/completions"
CHAT: Final = "/v1/chat/completions"


@dataclass(frozen=True)
class Request:
    prompt: str
    max_tokens: int
    #: Chat messages ({role, content}): the request goes to /v1/chat/completions.
    messages: tuple[tuple[str, str], ...] | None = None

    @property
    def path(self) -> str:
        return CHAT if self.messages is not None else COMPLETIONS


@dataclass(frozen=True)
class Load:
    """How one point sends its requests: a fixed number in flight, or arrivals at a rate."""

    concurrency: int
    #: Requests per second with Poisson arrivals (as vLLM's --request-rate); None: send as fast
    #: as `concurrency` allows.
    request_rate: float | None = None
    seed: int = 0
    #: No request is sent after this many seconds from the first (the plan's max_seconds).
    max_seconds: float | None = None


class StreamError(Exception):
    """The answer broke a rule of the protocol or a bound; the message says which."""


def payload(model: str, req: Request) -> dict[str, object]:
    if req.messages is not None:
        said: dict[str, object] = {
            "messages": [{"role": role, "content": content} for role, content in req.messages]
        }
    else:
        said = {"prompt": req.prompt}
    return {
        "model": model,
        **said,
        "max_tokens": req.max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }


def _int_or_none(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT:
        return value
    return None


def _cached(usage: dict[str, object]) -> int | None:
    """usage.prompt_tokens_details.cached_tokens (vLLM, SGLang, llama-server), None if absent."""
    details = usage.get("prompt_tokens_details")
    return _int_or_none(details.get("cached_tokens")) if isinstance(details, dict) else None


def _timings(value: object) -> dict[str, float]:
    if not isinstance(value, dict):
        return {}
    out = {}
    for key in TIMINGS:
        v = value.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= MAX_COUNT:
            out[key] = float(v)
    return out


def _text(choice: dict[str, object]) -> tuple[bool, bool]:
    """(Carries answer text, carries reasoning text) of a chunk's first choice: `text` of a
    completion; `delta.content` of a chat chunk (a role alone is no token), or its reasoning
    (`reasoning_content`: llama-server, SGLang, older vLLM; `reasoning`: newer vLLM)."""
    text = choice.get("text")
    delta = choice.get("delta")
    reasoning = None
    if text is None and isinstance(delta, dict):
        text = delta.get("content")
        reasoning = delta.get("reasoning_content", delta.get("reasoning"))
    return isinstance(text, str) and bool(text), isinstance(reasoning, str) and bool(reasoning)


class _Stream:
    """Reads one SSE answer into a RequestResult, timestamping each chunk that carries text."""

    def __init__(self, result: RequestResult, sent: float) -> None:
        self.result = result
        self.sent = sent
        self.last: float | None = None
        self.done = False

    def event(self, line: bytes, now: float) -> None:
        line = line.strip()
        if not line.startswith(b"data:"):
            return  # comments (": ping"), event names, blank separators
        data = line[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(data)
        except (ValueError, RecursionError):
            raise StreamError(f"a chunk is not JSON: {show(data[:120])}") from None
        if not isinstance(chunk, dict):
            raise StreamError(f"a chunk is not a JSON object: {show(data[:120])}")
        if "error" in chunk:
            raise StreamError(f"the server sent an error: {show(chunk['error'], 200)}")
        choices = chunk.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            text, reasoning = _text(choices[0])
            # As SGLang's bench_serving: a chunk counts when it carries text (an empty closing
            # chunk with finish_reason is no token); a chat chunk's reasoning is output too.
            if text or reasoning:
                r = self.result
                if not text:
                    r.reasoning_chunks += 1
                if self.last is None:
                    r.ttft_s = now - self.sent
                else:
                    r.itl_s.append(now - self.last)
                self.last = now
                r.e2e_s = now - self.sent
                r.chunks += 1
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.result.output_tokens = _int_or_none(usage.get("completion_tokens"))
            self.result.prompt_tokens = _int_or_none(usage.get("prompt_tokens"))
            self.result.cached_tokens = _cached(usage)
        timings = _timings(chunk.get("timings"))
        if timings:
            self.result.engine_timings = timings


def usage_contradiction(result: RequestResult, max_tokens: int) -> str | None:
    """Why the server's completion_tokens cannot be true of what it streamed, or None. A chunk
    carries at least one token and may carry several (speculative decoding), so more tokens than
    chunks is fine, fewer is not; more than max_tokens was not asked for."""
    n, chunks = result.output_tokens, result.chunks
    if n is None:
        return None
    if n == 0:
        return f"usage says 0 completion tokens after {chunks} text chunk(s)"
    if n < chunks:
        return f"usage says {n} completion tokens, fewer than the {chunks} text chunks streamed"
    if n > max_tokens:
        return f"usage says {n} completion tokens, more than the {max_tokens} max_tokens asked"
    return None


async def one_request(
    session: aiohttp.ClientSession, url: str, model: str, req: Request, timeout_s: float
) -> RequestResult:
    result = RequestResult()
    sent = time.perf_counter()
    stream = _Stream(result, sent)
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, json=payload(model, req), allow_redirects=False) as resp:
                if 300 <= resp.status < 400:
                    raise StreamError(redirect_error(resp.status, resp.headers.get("Location")))
                if resp.status != 200:
                    body = await read_upto(resp, MAX_ERROR_BODY)
                    raise StreamError(f"HTTP {resp.status}: {show(body, 200)}")
                await _read_events(resp, stream)
        if not stream.done:
            raise StreamError("the stream ended without data: [DONE] (server closed it)")
        if result.chunks == 0:
            raise StreamError("no token streamed")
        contradiction = usage_contradiction(result, req.max_tokens)
        if contradiction is not None:
            raise StreamError(contradiction)
        result.ok = True
    except TimeoutError:
        result.timed_out = True
        result.error = f"timeout after {timeout_s:g} s"
    except StreamError as exc:
        result.error = str(exc)
    except aiohttp.ClientPayloadError:
        result.error = "connection closed mid-stream"
    except aiohttp.ClientConnectorError as exc:
        result.error = f"cannot connect: {show(exc.os_error.strerror or exc.os_error, 200)}"
    except (aiohttp.ClientError, OSError) as exc:
        result.error = f"{type(exc).__name__}: {show(exc, 200)}"
    return result


async def _read_events(resp: aiohttp.ClientResponse, stream: _Stream) -> None:
    # A bytearray and a search of each new piece only: a server that trickles a byte at a time
    # costs linear time, not quadratic.
    buf = bytearray()
    total = 0
    async for piece in resp.content.iter_any():
        now = time.perf_counter()
        total += len(piece)
        if total > MAX_STREAM:
            raise StreamError(f"the answer is longer than {MAX_STREAM} bytes")
        start = 0
        newline = piece.find(b"\n")
        while newline >= 0:
            buf += piece[start:newline]
            stream.event(bytes(buf), now)
            buf.clear()
            start = newline + 1
            newline = piece.find(b"\n", start)
        buf += piece[start:]
        if len(buf) > MAX_LINE:
            raise StreamError(f"an SSE line is longer than {MAX_LINE} bytes")
    if buf.strip():
        stream.event(bytes(buf), time.perf_counter())


Progress = Callable[[int, int], None]


async def run_point(
    base_url: str,
    model: str,
    requests: Sequence[Request],
    load: Load,
    timeout_s: float,
    progress: Progress | None = None,
    auth: Auth | None = None,
) -> tuple[list[RequestResult], float]:
    """Send every request; return their results in order and the point's wall duration. With
    `load.max_seconds`, none is sent after that many seconds (those in flight finish): only
    the results of those sent are returned."""
    base = base_url.rstrip("/")
    results: list[RequestResult | None] = [None] * len(requests)
    finished = 0
    limit = load.concurrency
    # One connection per request, as SGLang's bench_serving opens a session per request: a
    # kept-alive connection that the server closes as the next request goes out (llama-server's
    # keep-alive limit) would fail that request for nothing, and TTFT includes the connect in
    # both clients alike.
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit, force_close=True)
    # Per-request bounds are ours (asyncio.timeout); aiohttp's own would cut long sweeps.
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(timeout_s, 30.0))
    async with aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        auto_decompress=False,
        headers=auth.headers() if auth is not None else None,
    ) as session:
        gate = asyncio.Semaphore(limit)

        unsent: set[int] = set()
        deadline_s = load.max_seconds

        async def send(i: int) -> None:
            nonlocal finished
            async with gate:
                if deadline_s is not None and time.perf_counter() - start >= deadline_s:
                    unsent.add(i)  # the point's time is up: not sent, not a failure
                    return
                url = base + requests[i].path
                result = await one_request(session, url, model, requests[i], timeout_s)
                result.index = i
                results[i] = result
            finished += 1
            if progress is not None:
                progress(finished, len(requests))

        start = time.perf_counter()
        tasks: list[asyncio.Task[None]] = []
        rng = random.Random(load.seed)  # noqa: S311 - arrival times, not secrets
        try:
            for i in range(len(requests)):
                if load.request_rate is not None and i:
                    await asyncio.sleep(rng.expovariate(load.request_rate))
                    if deadline_s is not None and time.perf_counter() - start >= deadline_s:
                        unsent.update(range(i, len(requests)))
                        break
                tasks.append(asyncio.create_task(send(i)))
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks, return_exceptions=True)
        duration = time.perf_counter() - start
    return [
        r if r is not None else RequestResult(error="not sent", index=i)
        for i, r in enumerate(results)
        if i not in unsent
    ], duration
