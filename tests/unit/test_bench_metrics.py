"""The metrics' arithmetic against the engines' definitions (domain.md section 10)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ct200_tools.bench.metrics import RequestResult, Slo, percentile, summarize


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
