"""Wait until a server serves: its readiness path answers 200, within a deadline.

The unit's ExecStartPost runs this, so `systemctl start` returns when the server serves and fails
with a message that names the URL, what it last answered and the fix, rather than systemd's bare
"timeout". systemd lets ExecStartPost run on when the main process dies, so the poll watches it
($MAINPID) and gives up at once when the engine is gone (a bad flag exits in a second).
"""

from __future__ import annotations

import http.client
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

#: Early polls come fast (a small model is up in well under a second), later ones every half
#: second: connection refused costs nothing, and SGLang answers 503 at once while loading.
FIRST_INTERVAL_S: Final = 0.02
MAX_INTERVAL_S: Final = 0.5
#: One request may take this long (SGLang's /health_generate runs a generation).
REQUEST_TIMEOUT_S: Final = 20.0

#: GET url with a timeout -> HTTP status, or raises OSError (refused, timed out, reset).
Get = Callable[[str, float], int]

#: Requests go straight to the server: a proxy from the environment must not answer for it.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_status(url: str, timeout: float) -> int:
    try:
        # The status is in the head: a body (that may trickle in forever) is not waited for.
        with _OPENER.open(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, http.client.HTTPException) as exc:
        raise OSError(str(getattr(exc, "reason", exc))) from None


@dataclass(frozen=True)
class Readiness:
    ok: bool
    url: str
    seconds: float
    polls: int
    #: What the last poll got: "200", "503", "connection refused", ...
    last: str
    #: The engine's process ended before it served.
    exited: bool = False


def process_alive(pid: int) -> Callable[[], bool]:
    """Whether the process is still there (systemd reaps its main process at once)."""
    return lambda: os.path.exists(f"/proc/{pid}")


def wait_ready(
    url: str,
    deadline_s: float,
    get: Get = http_status,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    alive: Callable[[], bool] | None = None,
) -> Readiness:
    started = clock()
    polls, last, interval = 0, "no answer yet", FIRST_INTERVAL_S
    while True:
        if alive is not None and not alive():
            return Readiness(False, url, clock() - started, polls, last, exited=True)
        left = deadline_s - (clock() - started)
        polls += 1
        try:
            status = get(url, max(0.1, min(REQUEST_TIMEOUT_S, left)))
        except OSError as exc:
            last = str(exc) or type(exc).__name__
        else:
            last = str(status)
            if status == 200:
                return Readiness(True, url, clock() - started, polls, last)
        if clock() - started + interval > deadline_s:
            return Readiness(False, url, clock() - started, polls, last)
        sleep(interval)
        interval = min(MAX_INTERVAL_S, interval * 2)
