"""Benchmark metrics exactly as vLLM's `bench serve` and SGLang's `bench_serving` define them.

Per request: TTFT (request sent -> first streamed token), TPOT ((E2EL - TTFT) / (output tokens
- 1), only for requests with more than one output token), ITL (every gap between consecutive
streamed chunks that carried text) and E2EL (request sent -> last token). Percentiles are taken
over requests for TTFT, TPOT and E2EL and over all gaps for ITL, with numpy's default (linear)
interpolation, so figures compare with the engines' own clients. Throughputs divide by the
benchmark's wall duration; goodput counts the requests that meet every SLO given.

Token counts come only from the server's `usage`: a request whose server sent none has an
unknown count (None), which is counted as such and never guessed from chunks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

#: The percentiles every distribution reports, as the engines' clients print them by default.
PERCENTILES: Final = (50, 90, 99)


@dataclass
class RequestResult:
    """One request as the client saw it; times in seconds from when it was sent."""

    ok: bool = False
    #: Its place among the point's requests (client.run_point): a point cut by max_seconds
    #: returns only the requests it sent, so per-request data is matched by this, not by order.
    index: int = 0
    #: Why it failed ("HTTP 500: ...", "timeout after 60 s", "connection closed mid-stream").
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    #: Gaps between consecutive chunks that carried text, in order.
    itl_s: list[float] = field(default_factory=list)
    #: From the server's usage; None when it sent none.
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    #: Chunks that carried text (not a token count: a chunk may carry several tokens).
    chunks: int = 0
    #: Of those, chunks that carried only reasoning text (a chat answer's reasoning_content).
    reasoning_chunks: int = 0
    #: usage.prompt_tokens_details.cached_tokens: prompt tokens the server took from its cache;
    #: None when it did not say.
    cached_tokens: int | None = None
    timed_out: bool = False
    #: The engine's own per-request timings where it sends them (llama-server's `timings`:
    #: predicted_n, predicted_ms, draft_n, draft_n_accepted, ...), numbers only.
    engine_timings: dict[str, float] = field(default_factory=dict)

    @property
    def tpot_s(self) -> float | None:
        n = self.output_tokens
        if not self.ok or n is None or n < 2 or self.e2e_s is None or self.ttft_s is None:
            return None
        return (self.e2e_s - self.ttft_s) / (n - 1)


@dataclass(frozen=True)
class Slo:
    """Service-level objectives in milliseconds; None means no bound on that metric."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def met(self, r: RequestResult) -> bool:
        if not r.ok:
            return False
        pairs = ((self.ttft_ms, r.ttft_s), (self.tpot_ms, r.tpot_s), (self.e2e_ms, r.e2e_s))
        for bound, value in pairs:
            if bound is None:
                continue
            # A metric that cannot be known (TPOT of a 1-token answer) does not break the SLO,
            # as in vLLM, which skips it.
            if value is not None and value * 1000.0 > bound:
                return False
        return True

    def is_set(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2e_ms))


def percentile(values: Sequence[float], q: float) -> float:
    """numpy.percentile(values, q) with its default linear interpolation; values non-empty."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def distribution_ms(values_s: Sequence[float]) -> dict[str, float | None]:
    """{mean, p50, p90, p99} in milliseconds; every value None when there is no sample."""
    if not values_s:
        return {"mean": None, **{f"p{q}": None for q in PERCENTILES}}
    ms = [v * 1000.0 for v in values_s]
    out: dict[str, float | None] = {"mean": round(sum(ms) / len(ms), 4)}
    for q in PERCENTILES:
        out[f"p{q}"] = round(percentile(ms, q), 4)
    return out


def summarize(
    results: Sequence[RequestResult], duration_s: float, slo: Slo | None = None
) -> dict[str, object]:
    """One point's metrics (the `--json` schema's metric fields; docs/bench.md)."""
    done = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    out_known = [r.output_tokens for r in done if r.output_tokens is not None]
    in_known = [r.prompt_tokens for r in done if r.prompt_tokens is not None]
    unknown_usage = sum(1 for r in done if r.output_tokens is None)
    out_tokens = sum(out_known)
    in_tokens = sum(in_known)
    # Throughput over a zero duration (no request ever sent) is no figure, not infinity.
    per_s = (lambda x: round(x / duration_s, 4)) if duration_s > 0 else (lambda x: None)
    complete_usage = unknown_usage == 0
    errors: dict[str, int] = {}
    for r in failed:
        key = (r.error or "unknown error")[:200]
        errors[key] = errors.get(key, 0) + 1
    summary: dict[str, object] = {
        "requests_completed": len(done),
        "requests_failed": len(failed),
        "requests_timed_out": sum(1 for r in failed if r.timed_out),
        "requests_without_usage": unknown_usage,
        "errors": errors,
        "duration_s": round(duration_s, 6),
        "input_tokens": in_tokens if done and len(in_known) == len(done) else None,
        "output_tokens": out_tokens if done and complete_usage else None,
        "request_throughput": per_s(len(done)),
        # With some usage missing, the token throughputs would undercount: no figure instead.
        "output_tokens_per_s": per_s(out_tokens) if complete_usage else None,
        "total_tokens_per_s": (
            per_s(out_tokens + in_tokens) if complete_usage and len(in_known) == len(done) else None
        ),
        "ttft_ms": distribution_ms([r.ttft_s for r in done if r.ttft_s is not None]),
        "tpot_ms": distribution_ms([t for r in done if (t := r.tpot_s) is not None]),
        "itl_ms": distribution_ms([g for r in done for g in r.itl_s]),
        "e2e_ms": distribution_ms([r.e2e_s for r in done if r.e2e_s is not None]),
    }
    timed = engine_timings(done)
    if timed is not None:
        summary["engine_timings"] = timed
    if slo is not None and slo.is_set():
        good = sum(1 for r in done if slo.met(r))
        summary["slo"] = {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "e2e_ms": slo.e2e_ms}
        summary["requests_good"] = good
        summary["goodput"] = per_s(good)
    return summary


def engine_timings(done: Sequence[RequestResult]) -> dict[str, object] | None:
    """The engine's own view of the point, where it reported one per request: its decode time
    per token (to set beside the client's ITL) and, with a draft model, the acceptance rate."""
    timed = [r.engine_timings for r in done if r.engine_timings]
    if not timed:
        return None
    per_token = [t["predicted_per_token_ms"] for t in timed if "predicted_per_token_ms" in t]
    drafted = sum(t.get("draft_n", 0.0) for t in timed)
    accepted = sum(t.get("draft_n_accepted", 0.0) for t in timed)
    return {
        "requests": len(timed),
        "predicted_per_token_ms_mean": (
            round(sum(per_token) / len(per_token), 4) if per_token else None
        ),
        "draft_n": drafted,
        "draft_n_accepted": accepted,
        "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
        "acceptance_length": acceptance_length(timed) if drafted else None,
    }


def acceptance_length(timed: Sequence[dict[str, float]]) -> float | None:
    """Tokens per decoding step of the target model, the bonus token included, over the
    requests' steps after their first token (which the prompt's evaluation samples): each step
    yields its accepted draft tokens and one of its own, so a request of predicted_n tokens took
    predicted_n - 1 - draft_n_accepted steps after the first. This is llama-server's own `mean
    len` (its log's `draft acceptance` line: 1 + accepted / drafting steps) wherever every step
    drafts (a draft model; --spec-synth-len asks for this figure), and lower where some steps
    draft nothing (n-gram lookup finding no match), which count as steps of one token.
    None without a request that reported predicted_n."""
    steps = tokens = 0.0
    for t in timed:
        n, acc = t.get("predicted_n"), t.get("draft_n_accepted", 0.0)
        if n is None or n < 1 or acc > n - 1:
            continue  # no count, or one no step could have produced: not guessed at
        tokens += n - 1
        steps += n - 1 - acc
    return round(tokens / steps, 4) if steps > 0 else None


#: Prompt tokens a server may take from its cache beyond what a workload shares on purpose, with
#: one token a word: the BOS token, a leading-space token, and a chance first word or two of
#: fresh prompts (cache_slack scales the words by the tokenizer's tokens per word).
CACHE_SLACK: Final = 4
CACHE_SLACK_WORDS: Final = 2


def cache_slack(words_per_token: float) -> int:
    """CACHE_SLACK for a tokenizer of `words_per_token` (learnt by /tokenize): a character-level
    vocabulary's first two words are a dozen tokens, and two fresh prompts share their first
    letters by chance as often as a word-level vocabulary's prompts share nothing."""
    per_word = 1.0 / words_per_token if words_per_token > 0 else 1.0
    return CACHE_SLACK - CACHE_SLACK_WORDS + math.ceil(CACHE_SLACK_WORDS * max(per_word, 1.0))


def spread(values: Sequence[int]) -> dict[str, float | int | None]:
    """{requests, mean, min, max, stdev} of a length distribution (population stdev)."""
    if not values:
        return {"requests": 0, "mean": None, "min": None, "max": None, "stdev": None}
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / len(values)
    return {
        "requests": len(values),
        "mean": round(mean, 4),
        "min": min(values),
        "max": max(values),
        "stdev": round(math.sqrt(var), 4),
    }


#: Tokens a chat template puts around a message (`<|im_start|>user\n ... <|im_end|>\n`): the
#: same in every chat request, so a prefix cache serves them.
CHAT_TEMPLATE_SLACK: Final = 8


def workload_figures(results: Sequence[RequestResult], allowed: Sequence[int]) -> dict[str, object]:
    """What the point's prompts and answers really were: lengths from usage (mean and spread),
    content against reasoning chunks, and the prompt tokens the server served from its cache,
    flagged where a request's is more than the workload shares on purpose (`allowed`, one a
    request: the shared prefix or system message, the template, and the slack)."""
    done_allowed = [(r, allowed[r.index]) for r in results if r.ok]
    done = [r for r, _ in done_allowed]
    cached = [r.cached_tokens for r in done if r.cached_tokens is not None]
    over = [r for r, a in done_allowed if r.cached_tokens is not None and r.cached_tokens > a]
    return {
        "input_lengths": spread([r.prompt_tokens for r in done if r.prompt_tokens is not None]),
        "output_lengths": spread([r.output_tokens for r in done if r.output_tokens is not None]),
        "content_chunks": sum(r.chunks - r.reasoning_chunks for r in done),
        "reasoning_chunks": sum(r.reasoning_chunks for r in done),
        "cached_prompt_tokens": sum(cached) if cached else None,
        "requests_with_cached_count": len(cached),
        # None: no request said (unknown), never "no cache".
        "cache_flag": bool(over) if cached else None,
        "requests_over_cache": len(over),
        "cached_tokens_max": max(cached) if cached else None,
    }
