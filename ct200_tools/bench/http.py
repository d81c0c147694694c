"""Small bounded requests to the server under test (model list, tokenizer, engine info, /metrics).

The answer is hostile: it is read WHOLE (to its Content-Length or the end of its chunked body,
however small the segments it comes in) and at most `max_bytes` of it; an answer cut short is an
error that says so, never a partial page. A 3xx is never followed (the answer must come from the
target itself) and is an error naming its escaped Location. JSON must be UTF-8 nested at most
MAX_DEPTH levels. Every failure is a value (`Answer.error`), never an exception.

Each request waits at most INFO_TIMEOUT_S for its whole answer, or less: the session's own
timeout (the run's --timeout when smaller) and the time left of a `Deadline` bound it too.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeVar

import aiohttp

from ct200_tools.untrusted import json_depth, show

if TYPE_CHECKING:
    from ct200_tools.bench.target import Auth

MAX_DEPTH: Final = 32
MAX_BYTES: Final = 256 << 10
#: The longest any one info request waits for its whole answer (docs/bench.md).
INFO_TIMEOUT_S: Final = 10.0
#: The /tokenize search of one workload's prompts, in all (docs/bench.md).
PREPARE_S: Final = 60.0
#: What to do about a redirect, said in every message about one.
REDIRECT_FIX: Final = "not followed; point --target at the server itself"

T = TypeVar("T")


class NoAnswer(Exception):
    """The target took a preparation request but gave no whole answer in time; the run cannot
    go on with what it has (a cut /tokenize answer would make prompts of the wrong length)."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix


@dataclass(frozen=True)
class Deadline:
    """A moment by which a group of requests must be done (time.monotonic)."""

    end: float
    total_s: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds, seconds)

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())


@dataclass(frozen=True)
class Answer:
    url: str
    status: int | None = None
    data: object = None
    error: str | None = None
    #: The server took the request but gave no whole, direct answer: it timed out, was cut
    #: short or redirected. (A refused connection or an HTTP error status is not broken.)
    broken: bool = False

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


def redirect_error(status: int, location: str | None) -> str:
    where = show(location, 200) if location is not None else "nowhere (no Location)"
    return f"HTTP {status} redirect to {where}: {REDIRECT_FIX}"


def _limit(
    session: aiohttp.ClientSession, timeout_s: float, deadline: Deadline | None
) -> tuple[float, float]:
    """(seconds this request may take, the bound to name in a message: the nominal one, so
    requests sent together under one deadline say the same)."""
    limit = timeout_s
    if session.timeout.total is not None:
        limit = min(limit, session.timeout.total)
    if deadline is None:
        return limit, limit
    return min(limit, deadline.left()), min(limit, deadline.total_s)


async def _read_whole(resp: aiohttp.ClientResponse, max_bytes: int) -> bytes | None:
    """The whole body, or None past `max_bytes`. One read returns what has arrived, which
    behind a proxy is one TCP segment: read until the end."""
    raw = bytearray()
    while True:
        piece = await resp.content.read(max_bytes + 1 - len(raw))
        if not piece:
            return bytes(raw)
        raw += piece
        if len(raw) > max_bytes:
            return None


async def read_upto(resp: aiohttp.ClientResponse, n: int) -> bytes:
    """The first `n` bytes of the body (all of it when shorter), however it is segmented: for an
    error's message, where the rest is not needed."""
    raw = bytearray()
    while len(raw) < n and (piece := await resp.content.read(n - len(raw))):
        raw += piece
    return bytes(raw)


async def _fetch(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    body: dict[str, object] | None,
    timeout_s: float,
    shown_s: float,
    max_bytes: int,
) -> tuple[int | None, bytes, str | None, bool]:
    """(status, body, error, broken) of one request read whole."""
    if timeout_s <= 0:
        return None, b"", "not sent: the preparation's time was used up", True
    status: int | None = None
    try:
        async with asyncio.timeout(timeout_s):
            async with session.request(method, url, json=body, allow_redirects=False) as resp:
                status = resp.status
                if 300 <= status < 400:
                    return status, b"", redirect_error(status, resp.headers.get("Location")), True
                length = resp.content_length
                if length is not None and length > max_bytes:
                    return status, b"", f"answer longer than {max_bytes} bytes", False
                raw = await _read_whole(resp, max_bytes)
    except TimeoutError:
        what = "no answer" if status is None else f"HTTP {status} but not the whole answer"
        return status, b"", f"{what} within {round(shown_s, 2):g} s", True
    except aiohttp.ClientConnectorError as exc:
        return (
            None,
            b"",
            f"cannot connect: {show(exc.os_error.strerror or exc.os_error, 200)}",
            False,
        )
    except aiohttp.ClientPayloadError:
        return status, b"", "the answer was cut short (the connection closed before its end)", True
    except (aiohttp.ClientError, OSError, ValueError) as exc:  # ValueError: a URL it refuses
        return status, b"", f"{type(exc).__name__}: {show(exc, 200)}", False
    if raw is None:
        return status, b"", f"answer longer than {max_bytes} bytes", False
    if length is not None and len(raw) < length:
        return status, b"", f"the answer was cut short ({len(raw)} of {length} bytes)", True
    return status, raw, None, False


async def request_json(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    body: dict[str, object] | None = None,
    timeout_s: float = INFO_TIMEOUT_S,
    max_bytes: int = MAX_BYTES,
    deadline: Deadline | None = None,
) -> Answer:
    limit, shown = _limit(session, timeout_s, deadline)
    status, raw, error, broken = await _fetch(session, method, url, body, limit, shown, max_bytes)
    if error is not None:
        return Answer(url, status, error=error, broken=broken)
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
    session: aiohttp.ClientSession,
    url: str,
    max_bytes: int,
    timeout_s: float = INFO_TIMEOUT_S,
    deadline: Deadline | None = None,
) -> tuple[str | None, str | None]:
    """GET a text page (Prometheus /metrics): (text, None), or (None, why not). Read whole, at
    most `max_bytes`; longer, cut short, not UTF-8 or not HTTP 200 is an error, never a partial
    page."""
    limit, shown = _limit(session, timeout_s, deadline)
    status, raw, error, _ = await _fetch(session, "GET", url, None, limit, shown, max_bytes)
    if error is not None:
        return None, error
    if status != 200:
        return None, f"HTTP {status}"
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError:
        return None, "answer is not UTF-8"


async def bounded(work: Awaitable[T], seconds: float, what: str) -> T:
    """`work`, or NoAnswer naming `what` when it takes more than `seconds` in all."""
    try:
        async with asyncio.timeout(seconds):
            return await work
    except TimeoutError:
        raise NoAnswer(
            f"{what} did not finish within {seconds:g} s",
            "check that the server answers at --target (its load, its logs); the points "
            "recorded before are kept and --resume continues",
        ) from None


def new_session(
    timeout_s: float = INFO_TIMEOUT_S, auth: Auth | None = None
) -> aiohttp.ClientSession:
    """A session for info requests: each waits at most `timeout_s`, carries the API key if
    any, asks no proxy (trust_env off) and leaves bodies as sent (no decompression)."""
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        auto_decompress=False,
        headers=auth.headers() if auth is not None else None,
    )
