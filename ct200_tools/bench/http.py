"""Small bounded JSON requests to the server under test (model list, tokenizer, engine info).

The answer is hostile: at most `max_bytes` are read, it must be UTF-8 JSON nested at most
MAX_DEPTH levels, and any failure is a value (`Answer.error`), never an exception.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Final

import aiohttp

from ct200_tools.untrusted import json_depth, show

MAX_DEPTH: Final = 32
MAX_BYTES: Final = 256 << 10


@dataclass(frozen=True)
class Answer:
    url: str
    status: int | None = None
    data: object = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


async def request_json(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    body: dict[str, object] | None = None,
    timeout_s: float = 5.0,
    max_bytes: int = MAX_BYTES,
) -> Answer:
    try:
        async with asyncio.timeout(timeout_s):
            async with session.request(method, url, json=body) as resp:
                raw = await resp.content.read(max_bytes + 1)
                status = resp.status
    except TimeoutError:
        return Answer(url, error=f"no answer within {timeout_s:g} s")
    except (aiohttp.ClientError, OSError) as exc:
        return Answer(url, error=f"{type(exc).__name__}: {show(exc, 200)}")
    if len(raw) > max_bytes:
        return Answer(url, status, error=f"answer longer than {max_bytes} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return Answer(url, status, error="answer is not UTF-8")
    if json_depth(text) > MAX_DEPTH:
        return Answer(url, status, error=f"answer nested deeper than {MAX_DEPTH} levels")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return Answer(url, status, error=f"answer is not JSON: {show(text, 120)}")
    if status != 200:
        return Answer(url, status, data, error=f"HTTP {status}")
    return Answer(url, status, data)


async def request_text(
    session: aiohttp.ClientSession, url: str, max_bytes: int, timeout_s: float = 5.0
) -> tuple[str | None, str | None]:
    """GET a text page (Prometheus /metrics): (text, None), or (None, why not). At most
    `max_bytes` are read; longer, not UTF-8 or not HTTP 200 is an error, never a partial page."""
    try:
        async with asyncio.timeout(timeout_s):
            async with session.get(url) as resp:
                raw = await resp.content.read(max_bytes + 1)
                status = resp.status
    except TimeoutError:
        return None, f"no answer within {timeout_s:g} s"
    except (aiohttp.ClientError, OSError) as exc:
        return None, f"{type(exc).__name__}: {show(exc, 200)}"
    if status != 200:
        return None, f"HTTP {status}"
    if len(raw) > max_bytes:
        return None, f"answer longer than {max_bytes} bytes"
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError:
        return None, "answer is not UTF-8"


def new_session(timeout_s: float = 10.0) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=timeout_s), auto_decompress=False
    )
