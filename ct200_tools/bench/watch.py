"""What is read around each point besides the requests: GPU telemetry, speculative acceptance.

A watch reads once before a point's counted requests (after its warm-up) and once after; what
it returns after is the point's field of its name (None: no field).
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from ct200_tools.bench import specdec, telemetry
from ct200_tools.bench.http import INFO_TIMEOUT_S, new_session, request_text
from ct200_tools.bench.target import Auth


class Watch(Protocol):
    name: str

    async def before(self) -> object: ...

    async def after(self, state: object) -> object | None: ...


class GpuWatch:
    """`gpu`: clocks, temperature, power and clock-event reasons before and after, throttling
    flagged. NVML calls can take milliseconds: they run off the event loop."""

    name = "gpu"

    def __init__(self, sampler: telemetry.Telemetry) -> None:
        self.sampler = sampler

    async def before(self) -> object:
        return await asyncio.to_thread(self.sampler.sample)

    async def after(self, state: object) -> object | None:
        after = await asyncio.to_thread(self.sampler.sample)
        before = state if isinstance(state, dict) else {"available": False, "reason": "?"}
        return telemetry.around(before, after)


class MetricsWatch:
    """`speculative`: acceptance from the engine's /metrics (vLLM counters, SGLang gauges).
    `expected`: the server decodes speculatively (the spec says so), so no figure is recorded
    as unavailable with the reason; otherwise an engine without them gets no field."""

    name = "speculative"

    def __init__(
        self,
        base_url: str,
        expected: bool,
        timeout_s: float = INFO_TIMEOUT_S,
        auth: Auth | None = None,
    ) -> None:
        self.url = base_url.rstrip("/") + "/metrics"
        self.expected = expected
        self.timeout_s, self.auth = min(timeout_s, INFO_TIMEOUT_S), auth

    async def _read(self) -> tuple[dict[specdec.Series, float] | None, str | None]:
        async with new_session(self.timeout_s, self.auth) as session:
            text, error = await request_text(session, self.url, specdec.MAX_METRICS_BYTES)
        return (specdec.parse(text), None) if text is not None else (None, error)

    async def before(self) -> object:
        samples, _ = await self._read()
        return samples

    async def after(self, state: object) -> object | None:
        samples, error = await self._read()
        before = state if isinstance(state, dict) else None
        found = specdec.acceptance(before, samples) if samples is not None else None
        if found is not None or not self.expected:
            return found
        why = f"GET {self.url}: {error}" if error else f"{self.url} has no acceptance metrics"
        return {"available": False, "reason": why}
