"""Wait until a server serves: its readiness path answers 200, within a deadline.

The unit's ExecStartPost runs this, so `systemctl start` returns when the server serves and fails
with a message that names the URL, what it last answered and the fix, rather than systemd's bare
"timeout". systemd lets ExecStartPost run on when the main process dies, so the poll watches it
($MAINPID) and gives up at once when the engine is gone (a bad flag exits in a second).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from ct200_tools import httpclient
from ct200_tools.httpclient import Answer

#: Early polls come fast (a small model is up in well under a second), later ones every half
#: second: connection refused costs nothing, and SGLang answers 503 at once while loading.
FIRST_INTERVAL_S: Final = 0.02
MAX_INTERVAL_S: Final = 0.5
#: One request may take this long (SGLang's /health_generate runs a generation).
REQUEST_TIMEOUT_S: Final = 20.0
#: What a redirect is told it is not (Answer.summary).
WHAT: Final = "a readiness answer"

#: GET url within a deadline -> the complete answer, or raises OSError (refused, timed out,
#: cut off: httpclient.HttpError).
Get = Callable[[str, float], Answer]


def http_get(url: str, timeout: float) -> Answer:
    """The readiness GET: one complete answer within `timeout` in all (head and body), no
    redirect followed, no proxy asked (ct200_tools.httpclient)."""
    return httpclient.request("GET", url, timeout_s=timeout)


@dataclass(frozen=True)
class Readiness:
    ok: bool
    url: str
    seconds: float
    polls: int
    #: What the last poll got, for people (what the server said escaped): "200 OK",
    #: "503 Service Unavailable", "connection refused", "302 Found, a redirect to ...".
    last: str
    #: The engine's process ended before it served.
    exited: bool = False
    #: The last answer's status and reason phrase, exactly as the server sent them (for JSON);
    #: None when the last poll got no complete answer.
    status: int | None = None
    reason: str | None = None


def process_alive(pid: int) -> Callable[[], bool]:
    """Whether the process is still there (systemd reaps its main process at once)."""
    return lambda: os.path.exists(f"/proc/{pid}")


def wait_ready(
    url: str,
    deadline_s: float,
    get: Get = http_get,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    alive: Callable[[], bool] | None = None,
) -> Readiness:
    started = clock()
    polls, last, interval = 0, "no answer yet", FIRST_INTERVAL_S
    answer: Answer | None = None

    def result(ok: bool, exited: bool = False) -> Readiness:
        status, reason = (answer.status, answer.reason) if answer is not None else (None, None)
        return Readiness(ok, url, clock() - started, polls, last, exited, status, reason)

    while True:
        if alive is not None and not alive():
            return result(False, exited=True)
        # Each request ends at the deadline at the latest: the client bounds the whole of it.
        left = deadline_s - (clock() - started)
        if left <= 0:
            return result(False)
        polls += 1
        try:
            answer = get(url, min(REQUEST_TIMEOUT_S, left))
        except OSError as exc:
            answer, last = None, str(exc) or type(exc).__name__
        else:
            last = answer.summary(WHAT)
            if answer.status == 200:
                return result(True)
        if clock() - started + interval > deadline_s:
            return result(False)
        sleep(interval)
        interval = min(MAX_INTERVAL_S, interval * 2)
