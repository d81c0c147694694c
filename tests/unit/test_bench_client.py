"""ct200-bench's client against a real streaming server on 127.0.0.1 with scripted timings.

The server's own delays are the ground truth: a gap can only be longer than the delay scripted
for it (asyncio.sleep never wakes early), so each figure is checked against [delay, delay +
slack] with a slack of most of a delay, far above scheduling noise but below the next delay
step, so a client that measured the wrong gap (from the request, or across two tokens) fails.
"""

from __future__ import annotations

import asyncio

import pytest

from ct200_tools.bench import client
from ct200_tools.bench.client import Load, Request
from ct200_tools.bench.metrics import RequestResult, summarize
from tests.unit.bench_helpers import standin

pytestmark = pytest.mark.timeout(120)

TTFT = 0.4
ITL = 0.2
SLACK = 0.15


def run(
    url: str, n: int, concurrency: int, max_tokens: int = 5, timeout_s: float = 30.0
) -> tuple[list[RequestResult], float]:
    reqs = [Request(" ".join(["word"] * (10 + i)), max_tokens) for i in range(n)]
    return asyncio.run(client.run_point(url, "standin", reqs, Load(concurrency), timeout_s))


def test_ttft_itl_tpot_e2e_agree_with_the_scripted_delays() -> None:
    with standin("--ttft", str(TTFT), "--itl", str(ITL)) as url:
        results, duration = run(url, 4, 2, max_tokens=5)
    assert all(r.ok for r in results), [r.error for r in results]
    for r in results:
        assert r.ttft_s is not None and TTFT <= r.ttft_s < TTFT + SLACK
        assert len(r.itl_s) == 4
        assert all(ITL * 0.99 <= g < ITL + SLACK for g in r.itl_s), r.itl_s
        assert r.tpot_s is not None and ITL <= r.tpot_s < ITL + SLACK
        assert r.e2e_s is not None and TTFT + 4 * ITL <= r.e2e_s < TTFT + 4 * ITL + 2 * SLACK
    point = summarize(results, duration)
    ttft, itl = point["ttft_ms"], point["itl_ms"]
    assert isinstance(ttft, dict) and isinstance(itl, dict)
    assert TTFT * 1000 <= ttft["p50"] < (TTFT + SLACK) * 1000
    assert ITL * 990 <= itl["p50"] < (ITL + SLACK) * 1000
    # Two rounds of two concurrent requests: the duration is two requests long, not four.
    one = TTFT + 4 * ITL
    assert 2 * one <= duration < 3 * one


def test_token_counts_are_the_servers_usage() -> None:
    with standin() as url:
        results, duration = run(url, 6, 3, max_tokens=7)
    # The stand-in counts one prompt token per word: 10..15 words.
    assert [r.prompt_tokens for r in results] == [10, 11, 12, 13, 14, 15]
    assert [r.output_tokens for r in results] == [7] * 6
    point = summarize(results, duration)
    assert point["output_tokens"] == 42
    assert point["input_tokens"] == sum(range(10, 16))
    assert point["requests_completed"] == 6 and point["requests_failed"] == 0


def test_a_server_without_usage_leaves_the_count_unknown_not_guessed() -> None:
    with standin("--no-usage") as url:
        results, duration = run(url, 2, 1, max_tokens=4)
    assert all(r.ok and r.output_tokens is None and r.chunks == 4 for r in results)
    point = summarize(results, duration)
    assert point["output_tokens"] is None
    assert point["output_tokens_per_s"] is None
    assert point["requests_without_usage"] == 2


def test_http_500_is_a_counted_error() -> None:
    with standin("--fail-every", "2") as url:
        results, duration = run(url, 6, 2)
    point = summarize(results, duration)
    assert point["requests_completed"] == 3 and point["requests_failed"] == 3
    errors = point["errors"]
    assert isinstance(errors, dict) and list(errors.values()) == [3]
    assert next(iter(errors)).startswith("HTTP 500: ")


def test_a_stream_closed_midway_is_an_error_not_a_short_answer() -> None:
    with standin("--close-every", "2", "--itl", "0.01") as url:
        results, _ = run(url, 4, 1, max_tokens=6)
    bad = [r for r in results if not r.ok]
    assert len(bad) == 2
    assert all(r.error is not None and "closed" in r.error for r in bad), [r.error for r in bad]


def test_a_server_that_dies_fails_the_rest_and_returns() -> None:
    with standin("--die-after", "3") as url:
        results, _ = run(url, 6, 1)
    assert [r.ok for r in results] == [True, True, False, False, False, False]
    assert all(r.error for r in results[2:])


def test_a_request_past_its_timeout_is_counted_as_timed_out() -> None:
    with standin("--ttft", "5") as url:
        results, duration = run(url, 2, 2, timeout_s=0.5)
    point = summarize(results, duration)
    assert point["requests_timed_out"] == 2 and point["requests_failed"] == 2
    assert duration < 4


def test_hostile_chunks_are_errors_with_escaped_text() -> None:
    stream = client._Stream(RequestResult(), 0.0)
    with pytest.raises(client.StreamError) as err:
        stream.event(b'data: {"error": "boom\\u001b[2J"}', 1.0)
    assert "\x1b" not in str(err.value) and "\\x1b" in str(err.value)
    with pytest.raises(client.StreamError):
        stream.event(b"data: [[[", 1.0)


def test_engine_timings_and_draft_acceptance_are_kept() -> None:
    with standin("--timings", "--itl", "0.01") as url:
        results, duration = run(url, 3, 3, max_tokens=6)
    assert all(r.engine_timings["predicted_n"] == 6 for r in results)
    timed = summarize(results, duration)["engine_timings"]
    assert isinstance(timed, dict)
    assert timed["requests"] == 3 and timed["acceptance_rate"] == 0.5
    assert timed["predicted_per_token_ms_mean"] == 10.0


def test_an_endless_sse_line_is_cut_at_the_bound() -> None:
    with standin("--huge-line") as url:
        results, _ = run(url, 1, 1)
    (r,) = results
    assert not r.ok and r.error is not None and "longer than" in r.error
