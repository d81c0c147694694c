"""Sweep to the knee: stop raising concurrency once it no longer pays.

With a plan's `sweep: {stop_when: {gain_below: G, goodput_below: F}}`, the concurrency levels of
each configuration and workload run in increasing order, and after the last repetition of a
level the rule is judged on the means over its repetitions:

- gain: output tok/s grew by less than G (a fraction: 0.05 = 5 %) over the level before;
- goodput: the fraction of requests that met every SLO of the plan (requests_good over requests
  answered or failed: vLLM's goodput over request throughput) fell below F.

Either stops the sweep: the higher levels of that configuration and workload are not run, and
the point that ended the level carries `knee` (why, the knee: the last level that paid off, and
the levels not run), which the report and the text view read and --resume honours. Request-rate
(open-loop) points are not judged and always run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StopRule:
    #: Stop when output tok/s grows by less than this fraction over the level before.
    gain_below: float | None = None
    #: Stop when the fraction of requests meeting the SLO falls below this.
    goodput_below: float | None = None


def _num(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _mean(values: Sequence[float | None]) -> float | None:
    """The mean over repetitions; None when a repetition has no figure (no usage: unknown)."""
    if not values or any(v is None for v in values):
        return None
    known = [v for v in values if v is not None]
    return sum(known) / len(known)


def slo_fraction(record: Mapping[str, object]) -> float | None:
    """Requests that met every SLO over requests answered or failed (None without an SLO)."""
    good = _num(record.get("requests_good"))
    done = _num(record.get("requests_completed"))
    failed = _num(record.get("requests_failed"))
    if good is None or done is None or failed is None or done + failed <= 0:
        return None
    return good / (done + failed)


Key = tuple[str, str]


@dataclass
class Tracker:
    """Per (configuration, workload): the closed-loop levels measured so far, and where the
    sweep stopped."""

    rule: StopRule | None
    repetitions: int
    levels: Sequence[int]
    measured: dict[Key, list[tuple[int, list[Mapping[str, object]]]]] = field(default_factory=dict)
    stopped: set[Key] = field(default_factory=set)

    def skips(self, key: Key, request_rate: float | None) -> bool:
        return request_rate is None and key in self.stopped

    def seen(
        self, key: Key, concurrency: int, record: Mapping[str, object]
    ) -> dict[str, object] | None:
        """Count a finished closed-loop point (new, or recorded before a --resume); the knee
        record when it completes its level and the rule says stop."""
        if isinstance(record.get("knee"), dict):
            self.stopped.add(key)
            return None
        done = self.measured.setdefault(key, [])
        if not done or done[-1][0] != concurrency:
            done.append((concurrency, []))
        done[-1][1].append(record)
        if self.rule is None or len(done[-1][1]) < self.repetitions:
            return None
        knee = self._judge(done)
        if knee is not None:
            self.stopped.add(key)
        return knee

    def _judge(
        self, done: list[tuple[int, list[Mapping[str, object]]]]
    ) -> dict[str, object] | None:
        rule = self.rule
        assert rule is not None  # noqa: S101 - seen() judges only with a rule
        level, records = done[-1]
        before = done[-2] if len(done) > 1 else None
        tput = _mean([_num(r.get("output_tokens_per_s")) for r in records])
        prev = _mean([_num(r.get("output_tokens_per_s")) for r in before[1]]) if before else None
        frac = _mean([slo_fraction(r) for r in records])
        gain = tput / prev - 1 if tput is not None and prev else None
        low_slo = rule.goodput_below is not None and frac is not None and frac < rule.goodput_below
        low_gain = rule.gain_below is not None and gain is not None and gain < rule.gain_below
        reasons = []
        if low_slo:
            reasons.append(
                f"{frac:.0%} of requests met the SLO at c={level} (below {rule.goodput_below:.0%})"
            )
        if low_gain and before is not None:
            reasons.append(
                f"output tok/s gained {gain:+.1%} from c={before[0]} to c={level} (below "
                f"{rule.gain_below:.0%})"
            )
        if not reasons:
            return None
        at = before[0] if before else None
        not_run = [c for c in self.levels if c > level]
        message = "; ".join(reasons) + (
            f": the knee is c={at}" if at is not None else ": no level met the SLO"
        )
        if not_run:
            message += "; not run: " + ", ".join(f"c={c}" for c in not_run)
        return {
            "reason": "goodput" if low_slo else "gain",
            "level": level,
            "at": at,
            "output_tokens_per_s": tput,
            "previous_output_tokens_per_s": prev,
            "gain": gain,
            "gain_below": rule.gain_below,
            "slo_fraction": frac,
            "goodput_below": rule.goodput_below,
            "not_run": not_run,
            "message": message,
        }
