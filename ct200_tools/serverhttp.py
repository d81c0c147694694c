"""HTTP questions to an inference server, shared by the doctor's server probes and
`ct200-serve smoke`: one request through the one client (ct200_tools.httpclient, redirects
never followed), its served models, and a 1-token completion through the OpenAI API.

Here, below both, so that serve/ asks a server without importing the doctor (issue 30). The
facts keep what the server said exactly (body, served names); whoever shows them escapes them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Final

from ct200_tools import httpclient
from ct200_tools.facts import HttpFacts
from ct200_tools.httpclient import HttpError, NotJson, Redirected, count, parse_json
from ct200_tools.untrusted import show

MODELS_TIMEOUT_S: Final = 2.0
#: A 1-token completion on an idle server takes well under a second, even for Kimi K2.6.
GENERATE_TIMEOUT_S: Final = 5.0
#: The prompt of the 1-token completion.
PROMPT: Final = "ping"

#: (method, url, body, timeout_s) -> (status, whole body); OSError without a complete answer.
Request = Callable[[str, str, bytes | None, float], tuple[int, bytes]]


def request(method: str, url: str, body: bytes | None, timeout_s: float) -> tuple[int, bytes]:
    """One HTTP request: the status and the whole body, all within timeout_s. An OSError when
    there is no complete answer (httpclient.HttpTimeout past the deadline); Redirected for a
    3xx, which is never followed: the answer must come from the port that was asked."""
    got = httpclient.request(method, url, body, timeout_s=timeout_s)
    if got.redirect:
        raise httpclient.Redirected(got)
    return got.status, got.body


def why(exc: OSError, timeout_s: float) -> str:
    if isinstance(exc, HttpError):
        return str(exc)  # the client's own words, with what the server said escaped
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout_s:g} s"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nothing listens)"
    return exc.strerror or str(exc) or type(exc).__name__


def call(
    ask: Request, method: str, url: str, payload: dict[str, Any] | None, timeout_s: float
) -> tuple[HttpFacts, Any]:
    """One request and its JSON."""
    body = json.dumps(payload).encode() if payload is not None else None
    t0 = time.monotonic()
    try:
        status, data = ask(method, url, body, timeout_s)
    except Redirected as exc:
        return HttpFacts(url, status=exc.status, duration_s=_since(t0), error=exc.note), None
    except OSError as exc:
        return HttpFacts(url, duration_s=_since(t0), error=why(exc, timeout_s)), None
    got = HttpFacts(url, status=status, duration_s=_since(t0))
    try:
        return got, parse_json(data)
    except NotJson as exc:
        text = data[:300].decode(errors="replace")
        return _with(got, error=str(exc), body=text), None


def _since(t0: float) -> float:
    return round(time.monotonic() - t0, 3)


def _with(h: HttpFacts, **changes: Any) -> HttpFacts:
    return replace(h, **changes)


def models(ask: Request, base: str, timeout_s: float = MODELS_TIMEOUT_S) -> HttpFacts:
    """GET /v1/models: the ids it lists."""
    got, data = call(ask, "GET", f"{base}/v1/models", None, timeout_s)
    if got.error is not None or got.status != 200:
        return got if got.status is None or got.status == 200 else _error_body(got, data)
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return _with(got, error="no data list in the answer", body=_body(data))
    # An id that is not a string (a number, a list) names no model: it is not listed.
    ids = tuple(m["id"] for m in items if isinstance(m, dict) and isinstance(m.get("id"), str))
    return _with(got, served=ids)


def generate(
    ask: Request,
    base: str,
    served: str,
    prompt: str = PROMPT,
    timeout_s: float = GENERATE_TIMEOUT_S,
) -> HttpFacts:
    """A 1-token completion through the OpenAI API (the doctor's server.generate, and
    `ct200-serve smoke`): its status, tokens, or what went wrong."""
    payload = {"model": served, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    got, data = call(ask, "POST", f"{base}/v1/completions", payload, timeout_s)
    if got.error is not None or got.status != 200:
        return got if got.status is None or got.status == 200 else _error_body(got, data)
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices:
        return _with(got, error="no choices in the answer", body=_body(data))
    usage = data.get("usage") if isinstance(data, dict) else None
    raw = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if raw is None:
        return got  # no usage reported: the choice is the completion
    tokens = count(raw)
    if tokens is None:
        # true is a bool (an int to Python), 1.0 a float: neither is a token count.
        what = show(json.dumps(raw), 60)
        return _with(got, error=f"usage.completion_tokens is {what}, not a token count")
    return _with(got, tokens=tokens)


def _error_body(got: HttpFacts, data: Any) -> HttpFacts:
    """An error status's answer: its JSON, else the start of its text as call kept it."""
    return got if data is None else _with(got, body=_body(data))


def _body(data: Any) -> str | None:
    return None if data is None else json.dumps(data)[:300]
