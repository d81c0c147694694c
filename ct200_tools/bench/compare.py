"""`ct200-bench compare OLD NEW`: each configuration and load in both, figure by figure; a change
for the worse beyond the noise is a regression.

The noise is what the repetitions measured: the larger standard deviation of the two sides. A
change counts when it is worse by more than twice that noise and by more than `threshold` (a
fraction of the old mean, 5 % by default), so neither one noisy repetition nor a tiny but
consistent drift is flagged alone. With one repetition a side the noise is unknown and the
threshold alone decides; the result says so.

Configurations are matched by serving set, workload and load. Where a side split a serving set
into several configurations (aggregate: points that measured different hosts or models), each is
matched with the one of the other side that measured the same host and model (identity.WHAT),
and one that has no such partner is named in a note instead of being compared with the wrong one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ct200_tools.bench.aggregate import HIGHER_IS_BETTER, Group, Loaded
from ct200_tools.bench.identity import WHAT
from ct200_tools.untrusted import show

#: acceptance_length only where both sides measured speculative decoding (vLLM's or SGLang's
#: /metrics, llama-server's per-request timings: aggregate.FALLBACK).
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
    #: OLD's name of the configuration, where it differs from NEW's (a split side).
    old_config: str | None = None


def _same_what(a: Group, b: Group) -> bool:
    return all(a.identity.get(k) == b.identity.get(k) for k in WHAT)


def pairs(old: Loaded, new: Loaded) -> tuple[list[tuple[Group, Group]], list[str]]:
    """(OLD, NEW) groups that measured the same configuration at the same load: the same name,
    else (a side split a serving set) the one configuration of that set with the same host and
    model; notes on the split configurations that found no partner."""
    named = {(g.config, g.workload, g.load): g for g in old.groups}
    olds: dict[tuple[str, str, str], list[Group]] = {}
    for g in old.groups:
        olds.setdefault((g.base, g.workload, g.load), []).append(g)
    out, notes = [], []
    for g in new.groups:
        same = named.get((g.config, g.workload, g.load))
        cands = olds.get((g.base, g.workload, g.load), [])
        match = [o for o in cands if _same_what(o, g)]
        if same is not None:
            out.append((same, g))
        elif len(match) == 1:
            out.append((match[0], g))
        elif cands:
            notes.append(
                f"{show(g.config, 120)} / {show(g.workload, 40)} {g.load}: not compared, OLD has "
                f"{len(match) or 'no'} configuration(s) of the same host and model among "
                + ", ".join(show(o.config, 80) for o in cands)
            )
    return out, notes


def compare(old: Loaded, new: Loaded, threshold: float = 0.05) -> list[Change]:
    out = []
    for o, g in pairs(old, new)[0]:
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
                       regression, o.config if o.config != g.config else None)
            )  # fmt: skip
    return out


def notes(old: Loaded, new: Loaded) -> list[str]:
    """Why configurations were split (each side) and which split ones were not compared."""
    return [f"OLD: {n}" for n in old.notes] + [f"NEW: {n}" for n in new.notes] + pairs(old, new)[1]


def lines(changes: list[Change]) -> list[str]:
    out = []
    for c in changes:
        if not c.regression:
            continue
        noise = f"noise {c.noise:.3g}" if c.noise is not None else "noise unknown (1 repetition)"
        was = f" (OLD: {show(c.old_config, 100)})" if c.old_config else ""
        out.append(
            f"  REGRESSION {show(c.config, 100)}{was} / {show(c.workload, 40)} {c.load} "
            f"{c.figure}: {c.old:.4g} -> {c.new:.4g} ({c.better_by:+.1%} better), {noise}"
        )
    return out


def as_dicts(changes: list[Change]) -> list[dict[str, object]]:
    return [asdict(c) for c in changes]
