"""Speculative acceptance from /metrics: the parser on the engines' exposition text, and the
watch against a real HTTP server on 127.0.0.1 whose counters move during a point."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from ct200_tools.bench import specdec
from ct200_tools.bench.watch import MetricsWatch

pytestmark = pytest.mark.timeout(60)

METRICS = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"


def text(name: str) -> str:
    return (METRICS / name).read_text()


def test_vllm_acceptance_is_the_counters_difference_over_the_point() -> None:
    before, after = specdec.parse(text("vllm-before.prom")), specdec.parse(text("vllm-after.prom"))
    got = specdec.acceptance(before, after)
    # Six drafts of 3 tokens during the point, accepting 3,3,2,1,0,3: 12 of 18.
    assert got == {
        "engine": "vllm",
        "source": "/metrics counters, after - before the point",
        "drafts": 6.0,
        "draft_tokens": 18.0,
        "accepted_tokens": 12.0,
        "acceptance_rate": 0.6667,
        "acceptance_length": 3.0,  # vLLM's: 1 + accepted / drafts, the bonus token included
        "per_position": [0.8333, 0.6667, 0.5],
    }


def test_the_created_timestamps_are_not_taken_for_counters() -> None:
    names = {name for name, _ in specdec.parse(text("vllm-after.prom"))}
    assert names == set(specdec.WANTED)


def test_vllm_without_a_reading_before_is_unavailable_not_the_total_since_start() -> None:
    got = specdec.acceptance(None, specdec.parse(text("vllm-after.prom")))
    assert got is not None and got["available"] is False
    assert "before the point" in str(got["reason"])


def test_sglang_gauges_are_recorded_as_the_engine_reports_them() -> None:
    got = specdec.acceptance({}, specdec.parse(text("sglang.prom")))
    assert got is not None
    assert (got["engine"], got["acceptance_length"], got["acceptance_rate"]) == (
        "sglang",
        3.42,
        0.605,
    )


def test_an_engine_without_them_gets_no_figure() -> None:
    page = "# HELP llamacpp:tokens_predicted_total x\nllamacpp:tokens_predicted_total 12\n"
    assert specdec.acceptance({}, specdec.parse(page)) is None


def test_malformed_and_hostile_lines_are_skipped() -> None:
    page = "\n".join(
        [
            'vllm:spec_decode_num_drafts_total{engine="0"} 4',
            'vllm:spec_decode_num_drafts_total{engine="1" 9',  # unclosed labels
            'vllm:spec_decode_num_drafts_total{engine="2"} NaN',
            'vllm:spec_decode_num_drafts_total{engine="3"} 1e400',  # inf
            'vllm:spec_decode_num_drafts_total{engine="4"} __import__("os")',
            'vllm:spec_decode_num_drafts_total{engine="5\\"x"} 2',  # an escaped quote: valid
        ]
    )
    got = specdec.parse(page)
    assert sorted(got.values()) == [2.0, 4.0]


@given(st.text(max_size=400))
def test_the_parser_takes_any_text(page: str) -> None:
    for (name, _), value in specdec.parse(page).items():
        assert name in specdec.WANTED or name in specdec.GAUGES
        assert isinstance(value, float)


async def _serve(pages: list[str]) -> tuple[web.AppRunner, str]:
    served = iter(pages)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=next(served))

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


def test_the_watch_reads_before_and_after_over_http() -> None:
    async def main() -> object:
        runner, url = await _serve([text("vllm-before.prom"), text("vllm-after.prom")])
        try:
            watch = MetricsWatch(url, expected=True)
            return await watch.after(await watch.before())
        finally:
            await runner.cleanup()

    got = asyncio.run(main())
    assert isinstance(got, dict) and got["acceptance_length"] == 3.0


def test_a_metrics_page_over_the_bound_is_refused_not_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(specdec, "MAX_METRICS_BYTES", 1000)
    page = text("vllm-after.prom")
    assert len(page.encode()) > 1000

    async def main() -> tuple[str, object]:
        runner, url = await _serve([page, page])
        try:
            watch = MetricsWatch(url, expected=True)
            return url, await watch.after(await watch.before())
        finally:
            await runner.cleanup()

    url, got = asyncio.run(main())
    assert got == {
        "available": False,
        "reason": f"GET {url}/metrics: answer longer than 1000 bytes",
    }


def test_a_speculative_server_without_metrics_says_why() -> None:
    async def main() -> tuple[object, object]:
        runner, url = await _serve(["x 1\n", "x 1\n", "x 1\n", "x 1\n"])
        try:
            expected = MetricsWatch(url, expected=True)
            plain = MetricsWatch(url, expected=False)
            return (
                await expected.after(await expected.before()),
                await plain.after(await plain.before()),
            )
        finally:
            await runner.cleanup()

    expected, plain = asyncio.run(main())
    assert isinstance(expected, dict) and expected["available"] is False
    assert str(expected["reason"]).endswith("/metrics has no acceptance metrics")
    assert plain is None
