"""Speed-up over a baseline configuration, and the incident's table: configuration,
concurrency, aggregate tok/s, per-request tok/s, acceptance length, speed-up over the baseline.

The baseline is a configuration of the same results (`ct200-bench report --baseline ar`): each
other configuration's output tok/s at a load is divided by the baseline's at the same workload
and load. The noise is what the repetitions measured, carried through the ratio (first-order:
the relative standard deviations of both sides added in quadrature); with one repetition a
side it is unknown and shown as such.

Per-request tok/s is one request's view: its output tokens over its end-to-end latency, for the
point's mean request (output tokens / completed requests over the mean E2EL), the figure a
single user sees where aggregate tok/s is the server's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ct200_tools.bench.aggregate import Group, Loaded, Stat, stat
from ct200_tools.bench.report import label, tex_escape
from ct200_tools.untrusted import show


@dataclass(frozen=True)
class Ratio:
    value: float
    #: None with one repetition on either side: the noise is not measured.
    noise: float | None


def _num(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def per_request_tps(g: Group) -> Stat | None:
    values = []
    for p in g.points:
        e2e = p.get("e2e_ms")
        out, done = _num(p.get("output_tokens")), _num(p.get("requests_completed"))
        mean = _num(e2e.get("mean")) if isinstance(e2e, dict) else None
        if out is not None and done and mean:
            values.append(out / done / (mean / 1000.0))
    return stat(values)


def ratio(new: Stat, base: Stat) -> Ratio | None:
    if base.mean <= 0:
        return None
    value = new.mean / base.mean
    if new.stdev is None or base.stdev is None or new.mean == 0:
        return Ratio(value, None)
    rel = math.hypot(new.stdev / new.mean, base.stdev / base.mean)
    return Ratio(value, abs(value) * rel)


def configs(loaded: Loaded) -> list[str]:
    return sorted({g.config for g in loaded.groups})


def speedups(loaded: Loaded, baseline: str) -> dict[tuple[str, str, str], Ratio]:
    """(configuration, workload, load) -> output tok/s over the baseline's at the same workload
    and load; the baseline's own entry is 1 (with its noise). Loads the baseline did not run
    have none."""
    base = {(g.workload, g.load): g for g in loaded.groups if g.config == baseline}
    out = {}
    for g in loaded.groups:
        b = base.get((g.workload, g.load))
        new, old = g.figure("output_tokens_per_s"), b.figure("output_tokens_per_s") if b else None
        if new is None or old is None:
            continue
        r = ratio(new, old)
        if r is not None:
            out[g.config, g.workload, g.load] = r
    return out


def fmt_ratio(r: Ratio | None) -> str:
    if r is None:
        return "-"
    return f"{r.value:.2f}" + (f" ± {r.noise:.2f}" if r.noise is not None else "")


def fmt(s: Stat | None, digits: int = 1) -> str:
    if s is None:
        return "-"
    return f"{s.mean:.{digits}f}" + (f" ± {s.stdev:.{digits}f}" if s.stdev is not None else "")


HEAD = (
    "Configuration", "Concurrency", "Aggregate tok/s", "Per-request tok/s", "Accept len",
    "Speed-up",
)  # fmt: skip


def rows(loaded: Loaded, baseline: str | None) -> list[list[str]]:
    """The incident's table, closed-loop points only (raw text; each format escapes it)."""
    many = len({g.workload for g in loaded.groups}) > 1
    ups = speedups(loaded, baseline) if baseline is not None else {}
    out = []
    # The baseline's rows first, as a reader compares every other configuration with them.
    for g in sorted(loaded.groups, key=lambda g: g.config != baseline):
        if g.request_rate is not None:
            continue
        out.append(
            [
                show(label(g, many), 160),
                str(g.concurrency),
                fmt(g.figure("output_tokens_per_s")),
                fmt(per_request_tps(g)),
                fmt(g.figure("acceptance_length"), 2),
                fmt_ratio(ups.get((g.config, g.workload, g.load))),
            ]
        )
    return out


def latex_document(loaded: Loaded, baseline: str | None) -> str:
    """A standalone LaTeX document holding the table (pdflatex; booktabs and longtable, both in
    TeX Live's base and recommended sets), so it compiles as written. longtable spans pages (a
    day is some 70 rows) and settles its column widths on the second pdflatex pass."""
    caption = (
        "Output tokens/s per configuration and concurrency (mean $\\pm$ standard deviation over "
        "repetitions). Per-request tok/s: output tokens over end-to-end latency of the mean "
        "request. Accept len: tokens per target-model step, the bonus token included. "
        + (
            f"Speed-up: aggregate tok/s over {tex_escape(show(baseline, 80))}'s at the same "
            "workload and concurrency."
            if baseline is not None
            else "No baseline given (ct200-bench report --baseline CONFIG)."
        )
    )
    lines = [
        r"\documentclass[10pt]{article}",
        r"\usepackage[margin=2cm]{geometry}",
        r"\usepackage{booktabs}",
        r"\usepackage{longtable}",
        r"\begin{document}",
        r"\section*{ct200-bench: speculative against autoregressive}",
        r"\begin{longtable}{lrrrrr}",
        r"\caption{" + caption + r"}\\",
        r"\toprule",
        " & ".join(tex_escape(h) for h in HEAD) + r" \\",
        r"\midrule",
        r"\endhead",
    ]
    previous = None
    for r in rows(loaded, baseline):
        if previous is not None and r[0] != previous:
            lines.append(r"\addlinespace")  # booktabs: a gap between configurations
        previous = r[0]
        lines.append(" & ".join(tex_escape(c) for c in r) + r" \\")
    lines += [r"\bottomrule", r"\end{longtable}", r"\end{document}"]
    return "\n".join(lines) + "\n"


def markdown(loaded: Loaded, baseline: str | None) -> str:
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    lines += [
        "| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows(loaded, baseline)
    ]
    return "\n".join(lines) + "\n"
