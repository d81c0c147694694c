"""ct200-bench against the real llama-server (CPU, the tiny model): its token counts are the
server's own, and its ITL agrees with the server's own per-request timings."""

from __future__ import annotations

import asyncio

import pytest

from ct200_tools.bench import client, prompts
from ct200_tools.bench.http import new_session
from ct200_tools.bench.metrics import summarize
from testbed import llama_build
from testbed.llama_server import DEFAULT_ALIAS, Server

pytestmark = [pytest.mark.llama, pytest.mark.timeout(llama_build.BUILD_TIMEOUT_S)]

OUTPUT = 48
INPUT = 32


async def _run(base: str, n: int, concurrency: int) -> tuple[list[client.Request], list[object]]:
    async with new_session() as session:
        made = await prompts.make_prompts(session, base, DEFAULT_ALIAS, INPUT, n, seed=3)
    reqs = [client.Request(p.text, OUTPUT) for p in made]
    results, duration = await client.run_point(
        base, DEFAULT_ALIAS, reqs, client.Load(concurrency), 120.0
    )
    return reqs, [made, results, duration]


def test_token_counts_and_itl_agree_with_llama_servers_own(server: Server) -> None:
    _, (made, results, duration) = asyncio.run(_run(server.base, 4, 1))
    assert [(p.method, p.tokens) for p in made] == [("tokenize", INPUT)] * 4
    assert all(r.ok for r in results), [r.error for r in results]
    for r in results:
        t = r.engine_timings
        # The counts are the server's: usage and its own timings say the same.
        assert r.output_tokens == OUTPUT == t["predicted_n"]
        assert r.prompt_tokens is not None and r.prompt_tokens >= t["prompt_n"]
        # llama-server times generation from its first sampled token to its last: the same
        # span as the client's gaps, so the sums agree up to the streaming's own cost.
        client_ms = 1000 * sum(r.itl_s)
        assert abs(client_ms - t["predicted_ms"]) <= 0.1 * t["predicted_ms"] + 10, (
            client_ms,
            t,
        )
    point = summarize(results, duration)
    assert point["output_tokens"] == 4 * OUTPUT
    timed = point["engine_timings"]
    assert isinstance(timed, dict) and timed["requests"] == 4
