"""The text view of points: one line per point, its errors under it. Values from the server
(error messages) were escaped where they were taken in (client.py); labels from the plan are
shown escaped here."""

from __future__ import annotations

from collections.abc import Mapping

from ct200_tools.untrusted import show


def _num(value: object, digits: int = 1) -> str:
    return f"{value:.{digits}f}" if isinstance(value, int | float) else "-"


def _dist(record: Mapping[str, object], key: str) -> str:
    d = record.get(key)
    if not isinstance(d, dict):
        return "-"
    return "/".join(_num(d.get(k)) for k in ("mean", "p50", "p90", "p99"))


def point_lines(record: Mapping[str, object]) -> list[str]:
    done, failed = record.get("requests_completed"), record.get("requests_failed")
    total = record.get("requests")
    head = f"  {show(record.get('key'), 120)}: {done}/{total} ok"
    if failed:
        head += f", {failed} FAILED"
    out_tps = record.get("output_tokens_per_s")
    head += (
        f", {_num(out_tps)} output tok/s"
        if out_tps is not None
        else ", output tok/s unknown (the server sent no usage)"
    )
    head += f", {_num(record.get('request_throughput'), 2)} req/s"
    if "goodput" in record:
        head += f", goodput {_num(record.get('goodput'), 2)} req/s"
    lines = [
        head,
        "    ms mean/p50/p90/p99  TTFT "
        + _dist(record, "ttft_ms")
        + "  TPOT "
        + _dist(record, "tpot_ms")
        + "  ITL "
        + _dist(record, "itl_ms")
        + "  E2EL "
        + _dist(record, "e2e_ms"),
    ]
    timed = record.get("engine_timings")
    if isinstance(timed, dict):
        rate = timed.get("acceptance_rate")
        lines.append(
            f"    engine: {_num(timed.get('predicted_per_token_ms_mean'), 2)} ms/token"
            + (f", draft acceptance {_num(100 * rate)} %" if isinstance(rate, float) else "")
        )
    spec = record.get("speculative")
    if isinstance(spec, dict):
        if spec.get("available") is False:
            lines.append(f"    speculative: no acceptance figure: {show(spec.get('reason'), 200)}")
        else:
            rate = spec.get("acceptance_rate")
            lines.append(
                f"    speculative ({show(spec.get('engine'), 20)}): acceptance length "
                f"{_num(spec.get('acceptance_length'), 2)}, rate "
                + (f"{_num(100 * rate)} %" if isinstance(rate, int | float) else "-")
            )
    lines += _gpu_lines(record.get("gpu"))
    if record.get("forced") is True:
        lines.append("    FORCED: measured past a failing doctor check (gate_failures)")
    errors = record.get("errors")
    if isinstance(errors, dict):
        for message, count in sorted(errors.items(), key=lambda kv: -int(kv[1])):
            lines.append(f"    {count}x {show(message, 200)}")
    lines += _cache_lines(record)
    missing = record.get("requests_without_usage")
    if isinstance(missing, int) and missing:
        lines.append(f"    {missing} request(s) without usage: their token counts are unknown")
    if record.get("cut") is True:
        lines.append(
            f"    CUT at max_seconds {_num(record.get('max_seconds'))}: "
            f"{show(record.get('requests_sent'))} of {show(total)} requests sent"
        )
    knee = record.get("knee")
    if isinstance(knee, dict):
        lines.append(f"    SWEEP STOPPED: {show(knee.get('message'), 300)}")
    return lines


def _gpu_lines(gpu: object) -> list[str]:
    """A point's GPU telemetry: the clocks after it, throttling, and the power limit apart."""
    if not isinstance(gpu, dict):
        return []
    lines = []
    after = gpu.get("after")
    if isinstance(after, dict) and isinstance(after.get("gpus"), list):
        shown = [
            f"GPU{g.get('index')} SM {_num(g.get('sm_clock_mhz'), 0)} MHz, "
            f"{_num(g.get('temperature_c'), 0)} C, {_num(g.get('power_w'), 0)} W"
            for g in after["gpus"][:8]
            if isinstance(g, dict)
        ]
        lines.append("    after: " + "; ".join(shown))
    throttled = gpu.get("throttled")
    if throttled:
        lines.append(f"    THROTTLED: {show('; '.join(map(str, throttled)), 200)}")
    capped = gpu.get("power_capped")
    if capped:
        at = show(", ".join(map(str, capped)), 200)
        lines.append(f"    at the power limit (SW power cap, not throttling): {at}")
    return lines


def _cache_lines(record: Mapping[str, object]) -> list[str]:
    """The prompt cache beyond what the workload asked for, and reasoning output, where seen."""
    lines = []
    if record.get("cache_flag") is True:
        w = record.get("workload")
        allowed = w.get("cache_allowed_tokens_max") if isinstance(w, dict) else None
        lines.append(
            f"    CACHED: {record.get('requests_over_cache')} of "
            f"{record.get('requests_with_cached_count')} request(s) had more prompt tokens "
            f"served from the server's cache than the workload shares on purpose (up to "
            f"{record.get('cached_tokens_max')} tokens, {allowed} allowed): TTFT and tok/s "
            "measure the cache, not the model"
        )
    reasoning = record.get("reasoning_chunks")
    if isinstance(reasoning, int) and reasoning:
        lines.append(
            f"    output chunks: {record.get('content_chunks')} content, {reasoning} reasoning"
        )
    return lines
