"""ct200-bench: parse options, call ct200_tools.bench, print, exit. No logic of its own."""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

import click

from ct200_tools import __version__
from ct200_tools.cli.options import internal_error, spec_option
from ct200_tools.spec import SpecError
from ct200_tools.untrusted import UntrustedInputError, is_plain, show

if TYPE_CHECKING:
    from ct200_tools.bench.target import Auth

EPILOG = """\b
Examples:
  ct200-bench run plan.yml --out results/      on the container: each serving set of the plan
      switched to with ct200-serve switch, admitted by the doctor, then measured
  ct200-bench run plan.yml --out results/ --force   measure a set the doctor fails (recorded)
  ct200-bench run --target http://127.0.0.1:30000 --concurrency 1,4 \\
      --input-tokens 128 --output-tokens 64 --requests 32 --out results/
  ct200-bench run --target http://127.0.0.1:30000 --endpoint chat --concurrency 8 \\
      --input-tokens 128 --output-tokens 256 --out results/
  ct200-bench run plan.yml --target http://127.0.0.1:30000 --out results/ --json
  ct200-bench run plan.yml --target http://127.0.0.1:30000 --out results/ --resume
  ct200-bench run plan.yml --target https://gpu-1:8000 --api-key-env VLLM_API_KEY --out r/
      the server's --api-key, sent as Authorization: Bearer (never printed nor stored)
  ct200-bench report results/ --out report/
  ct200-bench report results/ --out report/ --baseline ar   speed-up over ar (speedup.tex)
  ct200-bench compare old-results/ new-results/

\b
Exit codes: 0 done, every request answered; 1 done, some requests failed or timed out (each
point says how many and why); 2 bad input, or a target that does not answer, redirects or wants
an API key, refused before any request; 3 the tool itself broke; 4 the results could not be
written (also: --out no directory, results.jsonl no regular file; the points written before are
whole; --resume continues);
5 a serving set is not benchmark-ready (its switch failed, or the doctor's check of it failed
and no --force): the doctor's root cause and fix are printed, the sets before it are kept.
"""


class Exit(enum.IntEnum):
    OK = 0
    FAILED = 1
    BAD_INPUT = 2
    INTERNAL = 3
    STORE = 4
    NOT_READY = 5
    INTERRUPTED = 130


def _csv(kind: type[int] | type[float], lo: float) -> Callable[..., tuple[float, ...] | None]:
    """A --option callback: a comma-separated list of distinct numbers of at least `lo`."""

    def convert(
        ctx: click.Context, param: click.Parameter, value: str | None
    ) -> tuple[float, ...] | None:
        if value is None:
            return None
        out: list[float] = []
        for part in value.split(","):
            try:
                number = kind(part.strip())
            except ValueError:
                raise click.BadParameter(
                    f"{show(part)} is not a number; write e.g. 1,4,8", ctx, param
                ) from None
            if number < lo or number in out:
                raise click.BadParameter(
                    f"{number} is below {lo:g} or listed twice; write e.g. 1,4,8", ctx, param
                )
            out.append(number)
        return tuple(out)

    return convert


def _target(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    from ct200_tools.bench.target import check_target  # noqa: PLC0415

    if value is None:
        return None
    try:
        return check_target(value)
    except ValueError as exc:
        raise click.BadParameter(
            f"{exc}; write a server's base URL, e.g. http://127.0.0.1:30000", ctx, param
        ) from None


def _api_key_env(ctx: click.Context, param: click.Parameter, value: str | None) -> object:
    from ct200_tools.bench.target import Auth  # noqa: PLC0415

    if value is None:
        return None
    try:
        return Auth.from_env(value)
    except ValueError as exc:
        raise click.BadParameter(
            f"{exc}; export the server's API key in it first (e.g. read -rs {show(value, 60)}; "
            f"export {show(value, 60)})",
            ctx,
            param,
        ) from None


def _label(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not value.strip() or not is_plain(value) or len(value) > 200:
        raise click.BadParameter(
            f"{show(value, 60)} is no name: write one printable line, e.g. qwen-tp4-ddtree",
            ctx,
            param,
        )
    return value


@click.group(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ct200-bench")
def cli() -> None:
    """Benchmark OpenAI-compatible inference servers: run sweeps, keep results, report."""


AD_HOC = ("concurrency", "request_rate", "input_tokens", "output_tokens", "requests")


@cli.command()
@click.argument("plan_path", metavar="[PLAN]", required=False)
@click.option("--target", callback=_target, help="The server's base URL (no switch, no gate).")
@click.option(
    "--api-key-env",
    "auth",
    metavar="VAR",
    callback=_api_key_env,
    help="Send the API key in environment variable VAR as Authorization: Bearer.",
)
@spec_option
@click.option(
    "--force",
    is_flag=True,
    help="Without --target: benchmark a serving set the doctor's check fails (recorded).",
)
@click.option("--out", "out_dir", required=True, help="Results directory (appended to).")
@click.option(
    "--concurrency", callback=_csv(int, 1), help="Ad hoc: concurrency levels, e.g. 1,4,8."
)
@click.option("--request-rate", callback=_csv(float, 0.001), help="Ad hoc: requests/s.")
@click.option("--input-tokens", type=click.IntRange(1, 1 << 20), help="Ad hoc: prompt length.")
@click.option("--output-tokens", type=click.IntRange(1, 1 << 20), help="Ad hoc: answer length.")
@click.option("--requests", type=click.IntRange(1, 1_000_000), help="Ad hoc: requests a point.")
@click.option(
    "--endpoint",
    type=click.Choice(["completions", "chat"]),
    help="Ad hoc: /v1/completions (default) or /v1/chat/completions.",
)
@click.option("--repetitions", type=click.IntRange(1, 100), help="Each point this many times.")
@click.option("--warmup", type=click.IntRange(0, 10_000), help="Uncounted requests first.")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0.1),
    help="Per request, s (an info request: at most 10 s).",
)
@click.option(
    "--max-seconds",
    type=click.FloatRange(min=0.1, max=7 * 86_400),
    help="Each point sends no request after this many seconds (recorded as cut).",
)
@click.option("--model", help="The model name to ask for [default: the first of /v1/models].")
@click.option(
    "--label", default="target", show_default=True, callback=_label, help="Name of the serving set."
)
@click.option("--resume", is_flag=True, help="Continue the last run in --out where it stopped.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per point on stdout.")
def run(
    plan_path: str | None,
    target: str | None,
    auth: Auth | None,
    spec_path: str | None,
    force: bool,
    out_dir: str,
    concurrency: tuple[int, ...] | None,
    request_rate: tuple[float, ...] | None,
    input_tokens: int | None,
    output_tokens: int | None,
    requests: int | None,
    endpoint: str | None,
    repetitions: int | None,
    warmup: int | None,
    timeout_s: float | None,
    max_seconds: float | None,
    model: str | None,
    label: str,
    resume: bool,
    as_json: bool,
) -> None:
    """Run PLAN (a YAML file): on the container each serving set switched to and admitted by
    the doctor; with --target against that server (ungated). Or one ad-hoc sweep from the
    options against --target."""
    from ct200_tools.bench import managed_run, session  # noqa: PLC0415

    given = {
        "concurrency": concurrency,
        "request_rate": request_rate,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "requests": requests,
        "endpoint": endpoint,
    }
    if target is None and plan_path is None:
        raise click.UsageError(
            "give a PLAN (run on the container: each serving set switched to and admitted by "
            "the doctor), or --target URL for a server this machine does not manage"
        )
    if target is None and label != "target":
        raise click.UsageError(
            "--label names the server of a --target run; a run without --target measures the "
            "plan's serving_sets under their own names"
        )
    if target is not None and (force or spec_path is not None):
        raise click.UsageError(
            "--force and --spec belong to a managed run (no --target): a --target run is "
            "never switched nor gated"
        )
    if plan_path is not None:
        both = [f"--{k.replace('_', '-')}" for k, v in given.items() if v is not None]
        if both:
            raise click.UsageError(
                f"{', '.join(both)} with a PLAN: the plan says what to run; put it there, or "
                "drop the PLAN for an ad-hoc run"
            )
        plan = session.plan_from_file(plan_path, model, repetitions, warmup, timeout_s)
    else:
        if not concurrency and not request_rate:
            raise click.UsageError("give a PLAN, or --concurrency LIST (and/or --request-rate)")
        if output_tokens is None or input_tokens is None:
            raise click.UsageError("an ad-hoc run needs --input-tokens N and --output-tokens N")
        plan = session.adhoc_plan(
            concurrency or (),
            request_rate or (),
            input_tokens,
            output_tokens,
            requests or 32,
            repetitions or 1,
            warmup or 0,
            timeout_s or 600.0,
            model,
            "chat" if endpoint == "chat" else "completions",
        )
    if max_seconds is not None:
        plan = dataclasses.replace(plan, max_seconds=max_seconds)
    argv = ["ct200-bench", *sys.argv[1:]]
    tty = sys.stderr.isatty() and not as_json
    if target is None:
        site, source = managed_run.load_site(spec_path)
        outcome = managed_run.run_managed(
            plan,
            managed_run.Managed(site, source, force, auth=auth),
            out_dir,
            resume=resume,
            as_json=as_json,
            argv=argv,
            echo=click.echo,
            tty=tty,
        )
    else:
        outcome = session.run(
            plan,
            target,
            out_dir,
            label=label,
            resume=resume,
            as_json=as_json,
            argv=argv,
            echo=click.echo,
            tty=tty,
            auth=auth,
        )
    sys.exit(Exit.FAILED if outcome.failed_requests else Exit.OK)


@cli.command()
@click.argument("dirs", nargs=-1, required=True, metavar="DIR...")
@click.option("--out", "out_dir", required=True, help="Directory for the report's files.")
@click.option(
    "--baseline",
    help="A configuration (e.g. ar): every other one's speed-up over it, per workload and load.",
)
def report(dirs: tuple[str, ...], out_dir: str, baseline: str | None) -> None:
    """Write report.html (self-contained), PNG plots, table.md, table.tex, speedup.md and
    speedup.tex (a standalone LaTeX document) from DIR..."""
    from ct200_tools.bench import aggregate, speedup  # noqa: PLC0415
    from ct200_tools.bench import report as rep  # noqa: PLC0415

    loaded = aggregate.load(dirs)
    if not loaded.groups:
        raise click.UsageError(f"no point in {', '.join(show(d) for d in dirs)}: nothing to report")
    if baseline is not None and baseline not in speedup.configs(loaded):
        raise click.BadParameter(
            f"{show(baseline, 80)} is no configuration of these results; they have "
            + ", ".join(show(c, 80) for c in speedup.configs(loaded)),
            param_hint="--baseline",
        )
    written = rep.write(loaded, out_dir, baseline)
    for note in written.notes:
        click.echo(f"ct200-bench report: note: {note}", err=True)
    for path in written.files:
        click.echo(f"ct200-bench report: wrote {show(path)}")
    sys.exit(Exit.OK)


@cli.command()
@click.argument("old_dir", metavar="OLD")
@click.argument("new_dir", metavar="NEW")
@click.option(
    "--threshold",
    type=click.FloatRange(0, 10),
    default=0.05,
    show_default=True,
    help="The smallest relative change for the worse that counts (also beyond 2x the noise).",
)
@click.option("--json", "as_json", is_flag=True, help="Every change as JSON.")
def compare(old_dir: str, new_dir: str, threshold: float, as_json: bool) -> None:
    """Flag regressions of NEW against OLD beyond the noise the repetitions measured.

    Exit 0 when none, 1 when some (listed), 2 when OLD and NEW share no configuration and load.
    """
    from ct200_tools.bench import aggregate  # noqa: PLC0415
    from ct200_tools.bench import compare as cmp  # noqa: PLC0415

    old, new = aggregate.load([old_dir]), aggregate.load([new_dir])
    changes = cmp.compare(old, new, threshold)
    notes = cmp.notes(old, new)
    if not changes:
        raise click.UsageError(
            "OLD and NEW share no serving set, workload and load: nothing to compare"
        )
    regressions = [c for c in changes if c.regression]
    if as_json:
        doc = {
            "schema_version": 1,
            "threshold": threshold,
            "changes": cmp.as_dicts(changes),
            "notes": notes,
        }
        click.echo(json.dumps(doc, indent=1, sort_keys=True))
    else:
        click.echo(
            f"ct200-bench compare: {len(changes)} figure(s) compared, "
            f"{len(regressions)} regression(s)"
        )
        for line in cmp.lines(changes):
            click.echo(line)
        for note in notes:
            click.echo(f"  note: {note}")
    sys.exit(Exit.FAILED if regressions else Exit.OK)


def _fail(lines: Sequence[str], code: Exit) -> NoReturn:
    for line in lines:
        click.echo(line, err=True)
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Console entry: every error becomes a message and an exit code, never a traceback."""
    from ct200_tools.bench.http import NoAnswer  # noqa: PLC0415
    from ct200_tools.bench.managed import NotReady  # noqa: PLC0415
    from ct200_tools.bench.plan import PlanError  # noqa: PLC0415
    from ct200_tools.bench.results import StoreError  # noqa: PLC0415
    from ct200_tools.bench.runner import BenchError  # noqa: PLC0415

    try:
        cli.main(args=list(argv) if argv is not None else None, standalone_mode=False)
    except PlanError as exc:
        _fail(
            [f"ct200-bench: {exc}", *(f"  error: {i}" for i in exc.issues)],
            Exit.BAD_INPUT,
        )
    except SpecError as exc:
        _fail([f"ct200-bench: {exc}", *(f"  error: {i}" for i in exc.issues)], Exit.BAD_INPUT)
    except NotReady as exc:
        _fail(
            [
                *exc.lines,
                f"ct200-bench: refused: {exc.message}",
                f"  fix: {exc.fix}",
                "  the points of the sets before it are kept (--resume continues after the fix)",
            ],
            Exit.NOT_READY,
        )
    except (BenchError, NoAnswer, UntrustedInputError) as exc:
        _fail([f"ct200-bench: {exc.message}", f"  fix: {exc.fix}"], Exit.BAD_INPUT)
    except StoreError as exc:
        _fail([f"ct200-bench: {exc.message}", f"  fix: {exc.fix}"], Exit.STORE)
    except (click.exceptions.Abort, KeyboardInterrupt):
        _fail(
            ["ct200-bench: interrupted; the finished points are kept (run again with --resume)"],
            Exit.INTERRUPTED,
        )
    except click.ClickException as exc:
        exc.show()
        sys.exit(Exit.BAD_INPUT)
    except BrokenPipeError:
        os._exit(Exit.OK)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: no traceback by default
        internal_error("ct200-bench", exc, Exit.INTERNAL)
    sys.exit(Exit.OK)


if __name__ == "__main__":
    main()
