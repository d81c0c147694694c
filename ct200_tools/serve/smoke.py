"""The smoke test of recover.yml (and of a person after a repair): each server of the serving set
answers its readiness path, then a real 1-token completion through its OpenAI API.

One process for every server, so recover.yml proves health and a completion per server in one
task instead of a readiness wait, a status read and a request per server (each its own SSH
round trip). The completion is the doctor's own (ct200_tools.serverhttp.generate).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ct200_tools import serverhttp
from ct200_tools.facts import HttpFacts
from ct200_tools.serve import engines
from ct200_tools.serve.ready import Readiness, wait_ready
from ct200_tools.spec import ServerSpec
from ct200_tools.untrusted import show

Ready = Callable[[str, float], Readiness]
Complete = Callable[[str, str, str, float], HttpFacts]


def _complete(base: str, served: str, prompt: str, timeout_s: float) -> HttpFacts:
    return serverhttp.generate(serverhttp.request, base, served, prompt, timeout_s)


@dataclass(frozen=True)
class Smoke:
    name: str
    ready: Readiness
    #: None: not asked, because the server never answered its readiness path.
    completion: HttpFacts | None

    @property
    def ok(self) -> bool:
        c = self.completion
        return (
            self.ready.ok
            and c is not None
            and c.status == 200
            and c.error is None
            and (c.tokens is None or c.tokens >= 1)
        )

    @property
    def why(self) -> str:
        """What went wrong, in one line ("" when ok)."""
        if not self.ready.ok:
            return (
                f"does not serve after {self.ready.seconds:.0f} s: GET {self.ready.url} last got "
                f"{self.ready.last}"
            )
        c = self.completion
        if c is None or self.ok:
            return ""
        # c.error is the probe's own sentence (what the server said in it escaped); the body
        # excerpt is the server's exact text, escaped here.
        said = [f"HTTP {c.status}"] if c.status is not None and c.status != 200 else []
        said += [c.error] if c.error else []
        what = ", ".join(said) or f"{c.tokens} tokens"
        return f"POST {c.url} answered without a completion: {what}" + (
            f" ({show(c.body, 300)})" if c.body else ""
        )

    def to_dict(self) -> dict[str, object]:
        c = self.completion
        return {
            "name": self.name,
            "ok": self.ok,
            "ready_url": self.ready.url,
            "ready_seconds": round(self.ready.seconds, 3),
            "ready_last": self.ready.last,
            "ready_status": self.ready.status,
            "ready_reason": self.ready.reason,
            "completion_url": None if c is None else c.url,
            "completion_status": None if c is None else c.status,
            "completion_tokens": None if c is None else c.tokens,
            "completion_seconds": None if c is None else c.duration_s,
            "error": self.why or None,
        }


def smoke(
    servers: Sequence[ServerSpec],
    ready_timeout_s: float,
    completion_timeout_s: float,
    prompt: str,
    ready: Ready = wait_ready,
    complete: Complete = _complete,
) -> list[Smoke]:
    """Each server in order: wait for its readiness path, then ask for a 1-token completion."""
    out = []
    for s in servers:
        got = ready(engines.ready_url(s), ready_timeout_s)
        answer = (
            complete(engines.base_url(s), engines.served_name(s), prompt, completion_timeout_s)
            if got.ok
            else None
        )
        out.append(Smoke(s.name, got, answer))
    return out
