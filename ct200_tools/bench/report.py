"""`ct200-bench report`: results directories -> one self-contained HTML file, PNG plots, a
Markdown table and a LaTeX table; against a baseline, the incident's table too (speedup.py).

Configurations sit side by side: one series per serving set (and workload, when there are
several), one column per load. Every label comes from results files, which are untrusted: it is
escaped for the format it lands in (HTML, LaTeX, Markdown), never written raw. The HTML draws its
plots as inline SVG (no dependency); the PNGs need matplotlib (the `report` extra) and are
skipped with a note when it is missing.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from dataclasses import dataclass

from ct200_tools.bench import identity
from ct200_tools.bench.aggregate import Group, Loaded, Stat
from ct200_tools.fsutil import write_atomic
from ct200_tools.untrusted import show

#: (file stem, title, y label, [(figure, legend suffix)]): the plots, in order.
PLOTS: tuple[tuple[str, str, str, tuple[tuple[str, str], ...]], ...] = (
    ("throughput", "Output tokens/s against concurrency", "output tok/s",
     (("output_tokens_per_s", ""),)),
    ("ttft", "TTFT percentiles against concurrency", "TTFT (ms)",
     (("ttft_p50_ms", " p50"), ("ttft_p99_ms", " p99"))),
    ("itl", "ITL percentiles against concurrency", "ITL (ms)",
     (("itl_p50_ms", " p50"), ("itl_p99_ms", " p99"))),
    ("acceptance", "Speculative acceptance length against concurrency", "acceptance length",
     (("acceptance_length", ""),)),
)  # fmt: skip
#: Plotted only when some point has the figure (a run without speculative decoding has none).
OPTIONAL_PLOTS = frozenset({"acceptance"})


def plots(loaded: Loaded) -> list[tuple[str, str, str, tuple[tuple[str, str], ...]]]:
    return [p for p in PLOTS if p[0] not in OPTIONAL_PLOTS or series(loaded, p[3])]


COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")

Series = dict[str, list[tuple[int, float]]]


@dataclass
class Written:
    files: list[str]
    notes: list[str]


def label(g: Group, many_workloads: bool) -> str:
    return f"{g.config} / {g.workload}" if many_workloads else g.config


def series(loaded: Loaded, figures: Sequence[tuple[str, str]]) -> Series:
    """Per configuration (and suffix), (concurrency, mean) of the closed-loop points."""
    many = len({g.workload for g in loaded.groups}) > 1
    out: Series = {}
    for g in loaded.groups:
        if g.request_rate is not None:
            continue
        for figure, suffix in figures:
            s = g.figure(figure)
            if s is not None:
                out.setdefault(label(g, many) + suffix, []).append((g.concurrency, s.mean))
    return {k: sorted(v) for k, v in out.items()}


def knees(loaded: Loaded) -> dict[tuple[str, str], set[int]]:
    """Per configuration and workload, the concurrency levels a sweep found to be its knee (the
    last level that paid off before it stopped: runner's `knee.at`)."""
    out: dict[tuple[str, str], set[int]] = {}
    for g in loaded.groups:
        for k in g.knees():
            at = k.get("at")
            if isinstance(at, int) and not isinstance(at, bool):
                out.setdefault((g.config, g.workload), set()).add(at)
    return out


def knee_marks(loaded: Loaded, figures: Sequence[tuple[str, str]]) -> Series:
    """The knee points of each plotted series (same names as series())."""
    many = len({g.workload for g in loaded.groups}) > 1
    at = knees(loaded)
    out: Series = {}
    for g in loaded.groups:
        if g.request_rate is not None or g.concurrency not in at.get((g.config, g.workload), ()):
            continue
        for figure, suffix in figures:
            s = g.figure(figure)
            if s is not None:
                out.setdefault(label(g, many) + suffix, []).append((g.concurrency, s.mean))
    return out


def _notes(g: Group, at: dict[tuple[str, str], set[int]]) -> list[str]:
    out = g.flags()
    if g.request_rate is None and g.concurrency in at.get((g.config, g.workload), ()):
        out.append("knee")
    for k in g.knees():
        reason = k.get("reason")
        out.append(f"sweep stopped ({reason if reason in ('gain', 'goodput') else '?'})")
    if any(p.get("cut") is True for p in g.points):
        out.append("cut")
    return out


def _fmt(s: Stat | None, digits: int = 1) -> str:
    if s is None:
        return "-"
    if s.stdev is None:
        return f"{s.mean:.{digits}f}"
    return f"{s.mean:.{digits}f} ± {s.stdev:.{digits}f}"


def rows(loaded: Loaded) -> list[list[str]]:
    """The table's cells (raw text; each format escapes them)."""
    many = len({g.workload for g in loaded.groups}) > 1
    at = knees(loaded)
    out = []
    for g in loaded.groups:
        ttft = f"{_fmt(g.figure('ttft_p50_ms'))} / {_fmt(g.figure('ttft_p99_ms'))}"
        itl = f"{_fmt(g.figure('itl_p50_ms'), 2)} / {_fmt(g.figure('itl_p99_ms'), 2)}"
        out.append(
            [
                show(label(g, many), 160),
                g.load,
                str(len(g.points)),
                f"{g.total('requests_completed')}/{g.total('requests_failed')}",
                _fmt(g.figure("output_tokens_per_s")),
                ttft,
                _fmt(g.figure("tpot_p50_ms"), 2),
                itl,
                _fmt(g.figure("e2e_p50_ms"), 0),
                _fmt(g.figure("acceptance_length"), 2),
                ", ".join(_notes(g, at)),
            ]
        )
    return out


HEAD = (
    "Configuration", "Load", "Reps", "OK/failed", "Output tok/s", "TTFT p50/p99 ms",
    "TPOT p50 ms", "ITL p50/p99 ms", "E2EL p50 ms", "Accept len", "Notes",
)  # fmt: skip


def markdown(loaded: Loaded) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows(loaded)]
    return "\n".join(lines) + "\n"


_TEX = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
    "±": r"$\pm$",
}  # fmt: skip


def tex_escape(text: str) -> str:
    return "".join(_TEX.get(ch, ch) for ch in text)


def latex(loaded: Loaded) -> str:
    """A booktabs table, as the incident's hand-written report had (\\usepackage{booktabs})."""
    lines = [
        r"\begin{table}[ht]",
        r"\centering",
        r"\small",
        r"\begin{tabular}{l" + "r" * (len(HEAD) - 1) + "}",
        r"\toprule",
        " & ".join(tex_escape(h) for h in HEAD) + r" \\",
        r"\midrule",
    ]
    lines += [" & ".join(tex_escape(c) for c in r) + r" \\" for r in rows(loaded)]
    lines += [
        r"\bottomrule",
        r"\end{tabular}",
        r"\caption{Throughput and latency per configuration and load (mean $\pm$ standard "
        r"deviation over repetitions).}",
        r"\end{table}",
    ]
    return "\n".join(lines) + "\n"


def svg(title: str, ylabel: str, data: Series, marks: Series | None = None) -> str:
    """A line chart as inline SVG; x positions are the concurrency levels, evenly spaced."""
    width, height, left, right, top, bottom = 640, 360, 70, 170, 30, 50
    xs = sorted({x for pts in data.values() for x, _ in pts})
    ymax = max((y for pts in data.values() for _, y in pts), default=1.0) or 1.0
    pw, ph = width - left - right, height - top - bottom

    def px(x: int) -> float:
        return left + (pw * xs.index(x) / (len(xs) - 1) if len(xs) > 1 else pw / 2)

    def py(y: float) -> float:
        return top + ph - ph * y / (ymax * 1.05)

    e = html.escape
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="{e(title)}" font-family="sans-serif" font-size="12">',
        f'<text x="{width / 2}" y="18" text-anchor="middle" font-size="14">{e(title)}</text>',
        f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="#000"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="#000"/>',
        f'<text x="{left + pw / 2}" y="{height - 10}" text-anchor="middle">concurrency</text>',
        f'<text x="15" y="{top + ph / 2}" transform="rotate(-90 15 {top + ph / 2})" '
        f'text-anchor="middle">{e(ylabel)}</text>',
    ]
    for x in xs:
        parts.append(f'<text x="{px(x):.1f}" y="{top + ph + 18}" text-anchor="middle">{x}</text>')
    for i in range(5):
        y = ymax * 1.05 * i / 4
        parts.append(
            f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.4g}</text>'
            f'<line x1="{left}" y1="{py(y):.1f}" x2="{left + pw}" y2="{py(y):.1f}" '
            'stroke="#ddd"/>'
        )
    for n, (name, pts) in enumerate(sorted(data.items())):
        color = COLORS[n % len(COLORS)]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        parts += [
            f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"/>' for x, y in pts
        ]
        parts += [
            f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="8" fill="none" stroke="{color}" '
            f'stroke-width="2"/><text x="{px(x):.1f}" y="{py(y) - 12:.1f}" '
            f'text-anchor="middle" fill="{color}">knee</text>'
            for x, y in (marks or {}).get(name, [])
            if x in xs
        ]
        ly = top + 14 * n + 6
        parts.append(
            f'<rect x="{left + pw + 10}" y="{ly - 8}" width="10" height="10" fill="{color}"/>'
            f'<text x="{left + pw + 24}" y="{ly + 1}">{e(show(name, 24))}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def html_table(head: Sequence[str], cells: Sequence[Sequence[str]]) -> list[str]:
    e = html.escape
    table = ["<table>", "<tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>"]
    table += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in cells]
    table.append("</table>")
    return table


def html_page(loaded: Loaded, notes: Sequence[str], against: Sequence[str] = ()) -> str:
    e = html.escape
    table = html_table(HEAD, rows(loaded))
    charts = [
        svg(
            title,
            ylabel,
            series(loaded, figs),
            knee_marks(loaded, figs) if stem == "throughput" else None,
        )
        for stem, title, ylabel, figs in plots(loaded)
    ]
    runs = [f"<li>{e(line)}</li>" for line in run_lines(loaded)]
    shown = {g.config: identity.describe(g.identity) for g in loaded.groups}
    configs = [f"<li>{e(show(c, 160))}: {e(show(d, 400))}</li>" for c, d in sorted(shown.items())]
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8"><title>ct200-bench report</title>',
            "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
            "td:first-child,th:first-child{text-align:left}</style></head><body>",
            "<h1>ct200-bench report</h1>",
            *charts,
            "<h2>Results</h2>",
            *table,
            "<p>Mean ± standard deviation over the repetitions; latencies in milliseconds. "
            "Metrics as vLLM bench serve and SGLang bench_serving define them. Notes: forced = "
            "measured past a failing doctor check (--force); throttled = a GPU clock-event "
            "reason (power cap, thermal or hardware slowdown) was active before or after a "
            "point; ungated = a --target run, not admitted by the doctor; knee = the last "
            "concurrency level that paid off before the sweep stopped (plan `sweep.stop_when`); "
            "sweep stopped = the level at which it stopped (gain: output tok/s gained less than "
            "the bound; goodput: too few requests met the SLO), higher levels were not run; "
            "cut = the point reached its max_seconds before sending every request.</p>",
            *against,
            "<h2>Configurations</h2><p>Points pool as repetitions only when they measured the "
            "same host, server, engine version, model and server arguments.</p><ul>",
            *configs,
            "</ul>",
            "<h2>Runs</h2><ul>",
            *runs,
            "</ul>",
            *(f"<p>Note: {e(n)}</p>" for n in notes),
            "</body></html>",
        ]
    )


def _engine_name(info: object) -> object:
    engine = info.get("engine") if isinstance(info, dict) else None
    return engine.get("name") if isinstance(engine, dict) else None


def run_lines(loaded: Loaded) -> list[str]:
    """One escaped line per run: what it measured, where, when. A managed run's engine and
    model are its servers' (provenance `sets`), a --target run's its own."""
    out = []
    for run_id, prov in sorted(loaded.runs.items()):
        sets = prov.get("sets")
        if isinstance(sets, dict) and sets:
            what = "; ".join(
                f"{show(label, 60)}: engine {show(_engine_name(entry.get('engine')), 40)}, "
                f"model {show(entry.get('model'), 80)}"
                if isinstance(entry, dict)
                else show(label, 60)
                for label, entry in sorted(sets.items())[:32]
            )
        else:
            what = (
                f"engine {show(_engine_name(prov.get('engine')), 40)}, "
                f"model {show(prov.get('model'), 80)}"
            )
        out.append(
            f"{show(run_id, 60)}: {show(prov.get('target') or prov.get('mode'), 120)}, {what}, "
            f"{show(prov.get('started'), 30)} to {show(prov.get('finished'), 30)}, "
            f"host {show(prov.get('host'), 60)}, "
            f"{'gated' if prov.get('gated') is True else 'ungated'}"
        )
    return out


def pngs(loaded: Loaded, out_dir: str) -> tuple[list[str], list[str]]:
    try:
        import matplotlib  # noqa: PLC0415 - an optional extra, only for these files

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt  # noqa: PLC0415
    except ImportError:
        return [], [
            "PNG plots skipped: matplotlib is not installed (pip install 'ct200-tools[report]')"
        ]
    files = []
    for stem, title, ylabel, figs in plots(loaded):
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, pts in sorted(series(loaded, figs).items()):
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=show(name, 40))
        marks = knee_marks(loaded, figs) if stem == "throughput" else {}
        for pts in marks.values():
            ax.scatter([x for x, _ in pts], [y for _, y in pts], s=150, facecolors="none",
                       edgecolors="black", zorder=3)  # fmt: skip
            for x, y in pts:
                ax.annotate("knee", (x, y), textcoords="offset points", xytext=(0, 10),
                            ha="center", fontsize=8)  # fmt: skip
        levels = sorted({x for pts in series(loaded, figs).values() for x, _ in pts})
        if levels:
            # Concurrency doubles from level to level in most sweeps: a log2 axis spaces them.
            ax.set_xscale("log", base=2)
            ax.set_xticks(levels, [str(x) for x in levels])
        ax.set_title(title)
        ax.set_xlabel("concurrency")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        path = os.path.join(out_dir, f"{stem}.png")
        fig.savefig(path, dpi=100, bbox_inches="tight", metadata={"Software": None})
        plt.close(fig)
        files.append(path)
    return files, []


def write(loaded: Loaded, out_dir: str, baseline: str | None = None) -> Written:
    # speedup builds on this module's labels and escaping: imported here, not at the top.
    from ct200_tools.bench import speedup  # noqa: PLC0415

    os.makedirs(out_dir, exist_ok=True)
    png_files, notes = pngs(loaded, out_dir)
    notes += loaded.notes
    if loaded.skipped:
        notes.append(f"{loaded.skipped} point(s) without a configuration or load were skipped")
    what = (
        f"aggregate output tok/s over {show(baseline, 80)}'s at the same workload and "
        "concurrency (mean ± the noise of both sides' repetitions)"
        if baseline is not None
        else "no baseline given (ct200-bench report --baseline CONFIG)"
    )
    against = [
        "<h2>Against the baseline</h2>",
        *html_table(speedup.HEAD, speedup.rows(loaded, baseline)),
        f"<p>Speed-up: {html.escape(what)}. Per-request tok/s: output tokens over end-to-end "
        "latency of the point's mean request. Accept len: tokens per target-model step, the "
        "bonus token included (vLLM's and SGLang's /metrics, llama-server's per-request "
        "timings; docs/bench.md).</p>",
    ]
    files = []
    for name, text in (
        ("report.html", html_page(loaded, notes, against)),
        ("table.md", markdown(loaded)),
        ("table.tex", latex(loaded)),
        ("speedup.md", speedup.markdown(loaded, baseline)),
        ("speedup.tex", speedup.latex_document(loaded, baseline)),
    ):
        path = os.path.join(out_dir, name)
        write_atomic(path, text)
        files.append(path)
    return Written(files + png_files, notes)
