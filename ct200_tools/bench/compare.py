"""`ct200-bench compare OLD NEW`: each configuration and load in both, figure by figure; a change
for the worse beyond the noise is a regression.

The noise is what the repetitions measured: the larger standard deviation of the two sides. A
change counts when it is worse by more than twice that noise and by more than `threshold` (a
fraction of the old mean, 5 % by default), so neither one noisy repetition nor a tiny but
consistent drift is flagged alone. With one repetition a side the noise is unknown and the
threshold alone decides; the result says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ct200_tools.bench.aggregate import HIGHER_IS_BETTER, Loaded
from ct200_tools.untrusted import show

#: acceptance_length only where both sides measured speculative decoding (vLLM, SGLang).
COMPARED = (
    "output_tokens_per_s",
    "ttft_p50_ms",
    "tpot_p50_ms",
    "itl_p50_ms",
    "e2e_p50_ms",
    "acceptance_length",
)


@dataclass(frozen=True)
class Change:
    config: str
    workload: str
    load: str
    figure: str
    old: float
    new: float
    #: Relative change, positive = better.
    better_by: float
    noise: float | None
    regression: bool


def compare(old: Loaded, new: Loaded, threshold: float = 0.05) -> list[Change]:
    olds = {(g.config, g.workload, g.load): g for g in old.groups}
    out = []
    for g in new.groups:
        o = olds.get((g.config, g.workload, g.load))
        if o is None:
            continue
        for figure in COMPARED:
            a, b = o.figure(figure), g.figure(figure)
            if a is None or b is None or a.mean == 0:
                continue
            sign = 1.0 if HIGHER_IS_BETTER[figure] else -1.0
            better_by = sign * (b.mean - a.mean) / abs(a.mean)
            devs = [s for s in (a.stdev, b.stdev) if s is not None]
            noise = max(devs) if devs else None
            worse = -sign * (b.mean - a.mean)
            beyond_noise = noise is None or worse > 2 * noise
            regression = better_by < -threshold and beyond_noise
            out.append(
                Change(g.config, g.workload, g.load, figure, a.mean, b.mean, better_by, noise,
                       regression)
            )  # fmt: skip
    return out


def lines(changes: list[Change]) -> list[str]:
    out = []
    for c in changes:
        if not c.regression:
            continue
        noise = f"noise {c.noise:.3g}" if c.noise is not None else "noise unknown (1 repetition)"
        out.append(
            f"  REGRESSION {show(c.config, 60)} / {show(c.workload, 40)} {c.load} {c.figure}: "
            f"{c.old:.4g} -> {c.new:.4g} ({c.better_by:+.1%} better), {noise}"
        )
    return out


def as_dicts(changes: list[Change]) -> list[dict[str, object]]:
    return [asdict(c) for c in changes]
