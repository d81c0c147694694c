"""Speculative decoding acceptance from an engine's Prometheus /metrics, around a point.

The exposition text is untrusted: fetched bounded through the bench HTTP client, parsed line by
line (a line that is not a sample is skipped, a value that is not a number is skipped), never
evaluated. The metric names are the engines' own:

- vLLM (vllm/v1/spec_decode/metrics.py, SpecDecodingProm): the counters
  `vllm:spec_decode_num_drafts`, `vllm:spec_decode_num_draft_tokens`,
  `vllm:spec_decode_num_accepted_tokens` and `vllm:spec_decode_num_accepted_tokens_per_pos`
  (label `position`), exposed by prometheus_client with the `_total` suffix, one series per
  engine. Over a point: acceptance rate = accepted / draft tokens, acceptance length =
  1 + accepted / drafts (vLLM's own definition: the bonus token included), per position =
  accepted at that position / drafts.
- SGLang (python/sglang/srt/metrics/collector.py, SchedulerMetricsCollector): the gauges
  `sglang:spec_accept_length` and `sglang:spec_accept_rate`, the scheduler's most recent
  average (multiprocess_mode "mostrecent"), not counters: the value after the point is
  recorded as the engine reports it, averaged over its series (TP ranks, DP ranks).
"""

from __future__ import annotations

import math
import re
from typing import Final

#: Bounded: a vLLM or SGLang /metrics page is tens of KiB; histograms make it grow with buckets.
MAX_METRICS_BYTES: Final = 4 << 20
MAX_LINES: Final = 200_000

VLLM_DRAFTS: Final = "vllm:spec_decode_num_drafts"
VLLM_DRAFT_TOKENS: Final = "vllm:spec_decode_num_draft_tokens"
VLLM_ACCEPTED: Final = "vllm:spec_decode_num_accepted_tokens"
VLLM_PER_POS: Final = "vllm:spec_decode_num_accepted_tokens_per_pos"
SGLANG_LENGTH: Final = "sglang:spec_accept_length"
SGLANG_RATE: Final = "sglang:spec_accept_rate"
WANTED: Final = (VLLM_DRAFTS, VLLM_DRAFT_TOKENS, VLLM_ACCEPTED, VLLM_PER_POS)
GAUGES: Final = (SGLANG_LENGTH, SGLANG_RATE)

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"^({_NAME})(?:\{{(.*)\}})?[ \t]+(\S+)(?:[ \t]+\S+)?[ \t]*$")
_LABEL = re.compile(rf'\s*({_NAME})\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')

#: One series: the metric's name and its labels; its value.
Series = tuple[str, tuple[tuple[str, str], ...]]


def _labels(text: str) -> tuple[tuple[str, str], ...] | None:
    out = []
    pos = 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if m is None or m.end() == pos:
            return None
        out.append((m.group(1), m.group(2)))
        pos = m.end()
    return tuple(out)


def parse(text: str) -> dict[Series, float]:
    """The samples of the metrics we read (others skipped), by name without a counter's
    `_total` suffix and by labels. Malformed lines are skipped, never guessed at."""
    out: dict[Series, float] = {}
    for number, line in enumerate(text.splitlines()):
        if number >= MAX_LINES:
            break
        if not line.startswith(("vllm:spec_decode", "sglang:spec_accept")):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        name = m.group(1).removesuffix("_total")
        if name not in WANTED and name not in GAUGES:
            continue  # e.g. the `_created` timestamps prometheus_client adds
        labels = _labels(m.group(2) or "")
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if labels is None or not math.isfinite(value):
            continue
        out[(name, labels)] = value
    return out


def _sum(samples: dict[Series, float], name: str) -> float | None:
    values = [v for (n, _), v in samples.items() if n == name]
    return sum(values) if values else None


def _per_position(samples: dict[Series, float]) -> dict[int, float]:
    out: dict[int, float] = {}
    for (name, labels), value in samples.items():
        pos = dict(labels).get("position")
        if name == VLLM_PER_POS and pos is not None and pos.isdigit():
            out[int(pos)] = out.get(int(pos), 0.0) + value
    return out


def acceptance(
    before: dict[Series, float] | None, after: dict[Series, float]
) -> dict[str, object] | None:
    """The point's acceptance, or None when the engine exposes none of these metrics."""
    if _sum(after, VLLM_DRAFTS) is not None:
        if before is None:
            return {
                "engine": "vllm",
                "available": False,
                "reason": "/metrics could not be read before the point: the counters' "
                "difference is unknown",
            }
        prior = before

        def delta(name: str) -> float:
            return (_sum(after, name) or 0.0) - (_sum(prior, name) or 0.0)

        drafts, draft_tokens, accepted = (
            delta(VLLM_DRAFTS),
            delta(VLLM_DRAFT_TOKENS),
            delta(VLLM_ACCEPTED),
        )
        pos_before, pos_after = _per_position(prior), _per_position(after)
        per_pos = [
            round((pos_after[p] - pos_before.get(p, 0.0)) / drafts, 4) if drafts > 0 else None
            for p in sorted(pos_after)
        ]
        return {
            "engine": "vllm",
            "source": "/metrics counters, after - before the point",
            "drafts": drafts,
            "draft_tokens": draft_tokens,
            "accepted_tokens": accepted,
            "acceptance_rate": round(accepted / draft_tokens, 4) if draft_tokens > 0 else None,
            "acceptance_length": round(1 + accepted / drafts, 4) if drafts > 0 else None,
            "per_position": per_pos,
        }
    lengths = [v for (n, _), v in after.items() if n == SGLANG_LENGTH]
    rates = [v for (n, _), v in after.items() if n == SGLANG_RATE]
    if lengths or rates:
        return {
            "engine": "sglang",
            "source": "/metrics gauges after the point (the scheduler's most recent average)",
            "acceptance_length": round(sum(lengths) / len(lengths), 4) if lengths else None,
            "acceptance_rate": round(sum(rates) / len(rates), 4) if rates else None,
        }
    return None
