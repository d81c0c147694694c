"""The metrics' arithmetic against the engines' definitions (domain.md section 10)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ct200_tools.bench.metrics import (
    CACHE_SLACK,
    RequestResult,
    Slo,
    cache_slack,
    percentile,
    summarize,
    workload_figures,
)


@given(
    st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=200),
    st.sampled_from([50, 90, 99]),
)
def test_percentile_is_numpys_linear_default(values: list[float], q: int) -> None:
    assert abs(percentile(values, q) - float(np.percentile(values, q))) <= 1e-6 * (1 + max(values))


def ok(ttft: float, gaps: list[float], out: int | None, prompt: int | None = 10) -> RequestResult:
    return RequestResult(
        ok=True,
        ttft_s=ttft,
        itl_s=gaps,
        e2e_s=ttft + sum(gaps),
        output_tokens=out,
        prompt_tokens=prompt,
        chunks=len(gaps) + 1,
    )


def test_tpot_is_decode_time_over_tokens_after_the_first() -> None:
    # Two chunks carrying 5 tokens (speculative decoding): TPOT counts tokens, ITL chunks.
    r = ok(0.1, [0.4], out=5)
    assert r.tpot_s is not None and abs(r.tpot_s - 0.1) < 1e-12
    assert ok(0.1, [], out=1).tpot_s is None  # one token: no TPOT, as vLLM


def test_summary_counts_failures_and_goodput_under_slos() -> None:
    results = [
        ok(0.1, [0.01] * 9, out=10),
        ok(0.5, [0.01] * 9, out=10),  # TTFT 500 ms breaks the 200 ms SLO
        RequestResult(error="HTTP 500: boom"),
        RequestResult(error="timeout after 1 s", timed_out=True),
    ]
    point = summarize(results, 2.0, Slo(ttft_ms=200))
    assert point["requests_completed"] == 2
    assert point["requests_failed"] == 2
    assert point["requests_timed_out"] == 1
    assert point["errors"] == {"HTTP 500: boom": 1, "timeout after 1 s": 1}
    assert point["output_tokens"] == 20
    assert point["output_tokens_per_s"] == 10.0
    assert point["total_tokens_per_s"] == 20.0
    assert point["request_throughput"] == 1.0
    assert point["requests_good"] == 1 and point["goodput"] == 0.5
    itl = point["itl_ms"]
    assert isinstance(itl, dict) and abs(float(itl["p50"]) - 10.0) < 1e-9


def test_no_completed_request_gives_no_figures_not_zeroes() -> None:
    point = summarize([RequestResult(error="cannot connect: refused")], 0.01)
    assert point["output_tokens"] is None
    assert point["ttft_ms"] == {"mean": None, "p50": None, "p90": None, "p99": None}
    assert point["requests_failed"] == 1


def test_cache_flag_is_unknown_without_reports_and_set_beyond_what_is_allowed() -> None:
    def done(cached: int | None, prompt: int = 30) -> RequestResult:
        return RequestResult(ok=True, prompt_tokens=prompt, output_tokens=4, cached_tokens=cached)

    unknown = workload_figures([done(None), done(None)], [4, 4])
    assert unknown["cache_flag"] is None and unknown["cached_prompt_tokens"] is None
    assert unknown["requests_with_cached_count"] == 0
    fine = workload_figures([done(1), done(4), done(None)], [4, 4, 4])
    assert fine["cache_flag"] is False and fine["cached_prompt_tokens"] == 5
    assert fine["requests_with_cached_count"] == 2
    served = workload_figures([done(1), done(29), RequestResult(error="x")], [4, 4, 4])
    assert served["cache_flag"] is True and served["requests_over_cache"] == 1
    assert served["cached_tokens_max"] == 29
    lengths = workload_figures([done(0, 10), done(0, 20)], [4, 4])["input_lengths"]
    assert lengths == {"requests": 2, "mean": 15, "min": 10, "max": 20, "stdev": 5}


def test_the_cache_slack_is_two_words_of_the_tokenizer() -> None:
    assert cache_slack(1.0) == CACHE_SLACK == 4
    assert cache_slack(1.3) == 4  # a word is never less than one token
    assert cache_slack(0.2) == 2 + 10  # five characters a word
