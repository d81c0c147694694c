"""ct200-bench's client against a real streaming server on 127.0.0.1 with scripted timings.

The server's own delays are the ground truth, checked without timing assertions that a busy
machine could break: the server sleeps at least the scripted delays (asyncio.sleep never wakes
early), so TTFT and the sum of the gaps are at least theirs (one gap alone may look shorter when
the token before it was read late); the figures are consistent by
construction (TTFT plus the gaps is the end-to-end latency, one gap fewer than tokens); and the
first token's delay is ten times a gap's, so a gap measured from the request instead of the
previous token would exceed a bound that only a stall of most of a second could reach.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from ct200_tools.bench import client
from ct200_tools.bench.client import Load, Request
from ct200_tools.bench.metrics import RequestResult, summarize
from tests.unit.bench_helpers import standin

pytestmark = pytest.mark.timeout(120)

TTFT = 1.0
ITL = 0.1


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
        assert r.ttft_s is not None and r.ttft_s >= TTFT
        assert len(r.itl_s) == 4  # one gap fewer than the 5 tokens
        # A gap may look a little short when the token before it was read late; their sum
        # cannot (the server slept 4 gaps after the first token).
        assert all(ITL / 2 <= g < TTFT - ITL for g in r.itl_s), r.itl_s
        assert sum(r.itl_s) >= 4 * ITL * 0.99
        assert r.e2e_s is not None
        assert r.e2e_s == pytest.approx(r.ttft_s + sum(r.itl_s), abs=1e-6)
        assert r.tpot_s == pytest.approx((r.e2e_s - r.ttft_s) / 4)
    point = summarize(results, duration)
    ttft, itl = point["ttft_ms"], point["itl_ms"]
    assert isinstance(ttft, dict) and isinstance(itl, dict)
    assert ttft["p50"] >= TTFT * 1000
    assert ITL * 500 <= itl["p50"] < (TTFT - ITL) * 1000
    # Two rounds of two concurrent requests: the duration is two requests long, not four.
    one = TTFT + 4 * ITL
    assert 2 * one <= duration < 4 * one


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
    with standin("--ttft", "30") as url:
        results, duration = run(url, 2, 2, timeout_s=0.5)
    point = summarize(results, duration)
    assert point["requests_timed_out"] == 2 and point["requests_failed"] == 2
    assert duration < 30  # it did not wait for the server's first token


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


def _chat(delta: dict[str, object], usage: dict[str, object] | None = None) -> bytes:
    chunk: dict[str, object] = {"choices": [{"index": 0, "delta": delta}]}
    if usage is not None:
        chunk = {"choices": [], "usage": usage}
    return b"data: " + json.dumps(chunk).encode()


def test_a_role_only_chat_chunk_is_no_token_and_reasoning_is() -> None:
    stream = client._Stream(RequestResult(), 0.0)
    stream.event(_chat({"role": "assistant", "content": ""}), 0.5)
    assert stream.result.ttft_s is None and stream.result.chunks == 0
    stream.event(_chat({"reasoning_content": "think"}), 1.0)
    stream.event(_chat({"reasoning": "more"}), 1.5)  # newer vLLM's name
    stream.event(_chat({"content": "answer"}), 2.0)
    r = stream.result
    assert r.ttft_s == 1.0 and r.itl_s == [0.5, 0.5]
    assert (r.chunks, r.reasoning_chunks) == (3, 2)


@pytest.mark.parametrize(
    ("details", "cached"),
    [
        ({"cached_tokens": 7}, 7),
        ({"cached_tokens": -1}, None),
        ({"cached_tokens": True}, None),
        ({"cached_tokens": 10**15}, None),
        ("7", None),
        (None, None),
    ],
)
def test_cached_tokens_are_kept_only_as_a_bounded_count(
    details: object, cached: int | None
) -> None:
    stream = client._Stream(RequestResult(), 0.0)
    usage: dict[str, object] = {"prompt_tokens": 9, "completion_tokens": 2}
    if details is not None:
        usage["prompt_tokens_details"] = details
    stream.event(_chat({}, usage), 1.0)
    assert stream.result.cached_tokens == cached and stream.result.prompt_tokens == 9


def test_chat_requests_go_to_chat_completions_with_messages() -> None:
    req = Request("hi", 3, (("system", "be brief"), ("user", "hi")))
    body = client.payload("m", req)
    assert req.path == "/v1/chat/completions" and "prompt" not in body
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    assert body["stream_options"] == {"include_usage": True}
    with standin("--reasoning", "1") as url:
        results, _ = asyncio.run(client.run_point(url, "standin", [req] * 2, Load(2), 30.0))
    assert all(r.ok and r.chunks == 3 and r.reasoning_chunks == 1 for r in results)
    # Two template words a message at the stand-in: 2 + 2 + 2 + 1.
    assert [r.prompt_tokens for r in results] == [7, 7]
    # The same messages twice: the second found all but the last token in the stand-in's cache.
    assert sorted(r.cached_tokens or 0 for r in results) == [0, 6]


@pytest.mark.parametrize(
    ("usage", "reason"),
    [
        ("0", "usage says 0 completion tokens after 5 text chunk(s)"),
        ("3", "usage says 3 completion tokens, fewer than the 5 text chunks streamed"),
        (str(10**12), "usage says 1000000000000 completion tokens, more than the 5 max_tokens"),
    ],
)
def test_usage_that_contradicts_the_stream_fails_the_request(usage: str, reason: str) -> None:
    with standin("--usage-tokens", usage) as url:
        results, duration = run(url, 3, 1, max_tokens=5)
    assert all(not r.ok and r.error is not None and r.error.startswith(reason) for r in results)
    point = summarize(results, duration)
    assert point["requests_completed"] == 0 and point["requests_failed"] == 3
    errors = point["errors"]
    assert isinstance(errors, dict) and list(errors.values()) == [3]
    # No figure is made of it.
    assert not point["output_tokens"] and not point["output_tokens_per_s"]


def test_several_tokens_a_chunk_as_a_speculative_server_sends_are_no_contradiction() -> None:
    # 8 tokens in chunks of 3: 3 chunks, usage 8 (more tokens than chunks, within max_tokens).
    with standin("--tokens-per-chunk", "3") as url:
        results, duration = run(url, 2, 1, max_tokens=8)
    assert all(r.ok and r.chunks == 3 and r.output_tokens == 8 for r in results), [
        r.error for r in results
    ]
    assert summarize(results, duration)["output_tokens"] == 16
