"""ct200-stage: parse options, call ct200_tools.stage, print, exit. No logic of its own."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import click

from ct200_tools import __version__
from ct200_tools.cli.options import internal_error, spec_option
from ct200_tools.exitcodes import Exit
from ct200_tools.stage.errors import StageError
from ct200_tools.stage.progress import NullProgress, ProgressSink, TtyProgress

EPILOG = """\b
Examples:
  ct200-stage manifest /tank/models/Kimi-K2.6       hash the persistent copy once
  ct200-stage stage /tank/models/Kimi-K2.6 /dev/shm/models/kimi-k2.6
  ct200-stage stage kimi-k2.6                        source and target from the site spec
  ct200-stage verify /dev/shm/models/kimi-k2.6       re-hash the staged copy
  ct200-stage status --json                          every model of the spec, staged or not

\b
Manifests live in /var/lib/ct200/manifests/<name>.json (env CT200_MANIFEST_DIR, or --manifest);
the source is never written to.
Exit codes: 0 done, 2 a check failed (verification, capacity, a refusal, a busy lock, bad input),
3 the tool itself broke, 130 interrupted (run the same command again: it resumes).
"""

SCHEMA_VERSION = 1
READ_MODES = ("auto", "direct", "buffered")


class _Out:
    """What a command reports: a JSON envelope with --json, short text otherwise."""

    def __init__(self, command: str, as_json: bool, quiet: bool) -> None:
        self.command = command
        self.as_json = as_json
        self.quiet = quiet

    def progress(self) -> ProgressSink:
        if self.quiet or not sys.stderr.isatty():
            return NullProgress()
        return TtyProgress(sys.stderr)

    def done(self, ok: bool, result: dict[str, object], lines: Sequence[str]) -> NoReturn:
        if self.as_json:
            envelope = {
                "schema_version": SCHEMA_VERSION,
                "command": self.command,
                "ok": ok,
                "result": result,
                "error": None,
            }
            click.echo(json.dumps(envelope, indent=1, default=str))
        elif not self.quiet or not ok:
            for line in lines:
                click.echo(line)
        sys.exit(Exit.OK if ok else Exit.FAILURES)


_current: _Out | None = None


def _common(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("-q", "--quiet", is_flag=True, help="No progress, no text on success.")(fn)
    return click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")(fn)


def _engine_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    from ct200_tools.stage.stager import default_jobs  # noqa: PLC0415

    fn = click.option(
        "--read-mode",
        type=click.Choice(READ_MODES),
        default="buffered",
        show_default=True,
        help="Source reads through the page cache (dropped behind us; measured fastest), or "
        "O_DIRECT (direct; auto: where the filesystem allows).",
    )(fn)
    return click.option(
        "-j",
        "--jobs",
        type=click.IntRange(1, 256),
        default=default_jobs(),
        show_default=True,
        help="Parallel chunk reads.",
    )(fn)


def _manifest_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--manifest",
        "manifest_path",
        metavar="PATH",
        help="Manifest file [default: $CT200_MANIFEST_DIR or /var/lib/ct200/manifests, "
        "then <name>.json].",
    )(fn)


def _out(command: str, as_json: bool, quiet: bool) -> _Out:
    global _current  # noqa: PLW0603 - main() needs it to report errors in the command's format
    _current = _Out(command, as_json, quiet)
    return _current


@click.group(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ct200-stage")
def cli() -> None:
    """Restage models from a persistent copy into /dev/shm: fast, verified, never half-done."""


@cli.command()
@click.argument("source", type=click.Path(file_okay=False))
@click.option("--name", help="Model name [default: the source directory's name].")
@_manifest_option
@click.option("--force", is_flag=True, help="Replace an existing manifest that differs.")
@click.option(
    "--lfs/--no-lfs",
    default=True,
    show_default=True,
    help="Also check sha256 against Hugging Face LFS metadata found in the source (slower).",
)
@click.option(
    "--model-info",
    type=click.Path(dir_okay=False, exists=True),
    help="Hub API model info JSON (/api/models/<id>?blobs=true) giving siblings[].lfs.sha256.",
)
@_engine_options
@_common
def manifest(
    source: str,
    name: str | None,
    manifest_path: str | None,
    force: bool,
    lfs: bool,
    model_info: str | None,
    jobs: int,
    read_mode: str,
    as_json: bool,
    quiet: bool,
) -> None:
    """Hash the model at SOURCE (read-only) and write its manifest."""
    from ct200_tools.stage import commands  # noqa: PLC0415

    out = _out("manifest", as_json, quiet)
    res = commands.make_manifest(
        source, name, manifest_path, force, lfs, model_info, jobs, read_mode, out.progress()
    )
    out.done(True, res.data, res.lines)


@cli.command()
@click.argument("target", nargs=-1, required=True, metavar="SRC DST | MODEL")
@spec_option
@_manifest_option
@click.option(
    "--name",
    help="Model name for messages and the manifest [default: from the spec "
    "or the source directory].",
)
@click.option(
    "--create-manifest",
    is_flag=True,
    help="With no manifest yet: build it from this copy (trusting the source as read).",
)
@click.option(
    "--replace",
    is_flag=True,
    help="Swap out what ct200-stage staged at DST (another model, or a copy that does not "
    "verify: it is re-hashed first) atomically once the new copy is verified. Never touches a "
    "directory ct200-stage did not make.",
)
@click.option(
    "--wait",
    type=click.FloatRange(0),
    default=0.0,
    metavar="SECONDS",
    help="Wait this long for another stage of the same target to finish.",
)
@click.option(
    "--reserve",
    metavar="SIZE",
    help="RAM to leave free, e.g. 64G [default: the spec's shm.reserve_ram, else 0].",
)
@_engine_options
@_common
def stage(
    target: tuple[str, ...],
    spec_path: str | None,
    manifest_path: str | None,
    name: str | None,
    create_manifest: bool,
    replace: bool,
    wait: float,
    reserve: str | None,
    jobs: int,
    read_mode: str,
    as_json: bool,
    quiet: bool,
) -> None:
    """Copy a model into place, verifying every chunk, and publish it atomically."""
    from ct200_tools.stage import commands  # noqa: PLC0415

    out = _out("stage", as_json, quiet)
    if len(target) > 2:
        raise click.UsageError("give SRC DST, or one MODEL name from the spec")
    res = commands.stage_model(
        target,
        spec_path=spec_path,
        manifest_path=manifest_path,
        name=name,
        create_manifest=create_manifest,
        replace=replace,
        wait=wait,
        reserve=reserve,
        jobs=jobs,
        read_mode=read_mode,
        progress=out.progress(),
    )
    out.done(True, res.data, res.lines)


@cli.command()
@click.argument("path")
@_manifest_option
@spec_option
@_engine_options
@_common
def verify(
    path: str,
    manifest_path: str | None,
    spec_path: str | None,
    jobs: int,
    read_mode: str,
    as_json: bool,
    quiet: bool,
) -> None:
    """Re-hash PATH (a staged copy, a source, or a model name) against its manifest."""
    from ct200_tools.stage import commands  # noqa: PLC0415

    out = _out("verify", as_json, quiet)
    res = commands.verify_path(path, manifest_path, spec_path, jobs, read_mode, out.progress())
    out.done(True, res.data, res.lines)


@cli.command()
@click.argument("paths", nargs=-1, metavar="[PATH]...")
@spec_option
@click.option("--deep", is_flag=True, help="Re-hash every staged file (reads it all).")
@_common
def status(
    paths: tuple[str, ...], spec_path: str | None, deep: bool, as_json: bool, quiet: bool
) -> None:
    """What is staged: every model of the spec (or the given PATHs). Exit 2 if any is not."""
    from ct200_tools.stage import commands  # noqa: PLC0415

    out = _out("status", as_json, quiet)
    res = commands.status(paths, spec_path, deep)
    out.done(res.ok, res.data, res.lines)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Console entry: every error becomes a message and an exit code, never a traceback."""
    from ct200_tools.spec import SpecError  # noqa: PLC0415

    try:
        cli.main(args=list(argv) if argv is not None else None, standalone_mode=False)
    except StageError as exc:
        _fail(
            exc.to_dict(),
            [
                f"ct200-stage: {exc.message}",
                *(f"  {d}" for d in exc.details),
                *([f"  fix: {exc.fix}"] if exc.fix else []),
            ],
        )
    except SpecError as exc:
        _fail(
            {
                "kind": "spec",
                "message": str(exc),
                "fix": "correct the site spec",
                "details": [str(i) for i in exc.issues],
            },
            [f"ct200-stage: {exc}", *(f"  error: {i}" for i in exc.issues)],
        )
    except (click.exceptions.Abort, KeyboardInterrupt):  # click turns Ctrl-C into Abort
        _fail(
            {
                "kind": "interrupted",
                "message": "interrupted",
                "fix": "run the same command again (it resumes)",
                "details": [],
            },
            ["ct200-stage: interrupted; run the same command again (it resumes)"],
            Exit.INTERRUPTED,
        )
    except click.ClickException as exc:
        exc.show()
        sys.exit(Exit.FAILURES)
    except BrokenPipeError:
        os._exit(Exit.OK)
    except OSError as exc:  # e.g. no permission to create the target's parent directory
        where = exc.filename or "a file"
        _fail(
            {
                "kind": "os",
                "message": f"{where}: {exc.strerror or exc}",
                "fix": "check the path, its permissions and free space",
                "details": [],
            },
            [
                f"ct200-stage: {where}: {exc.strerror or exc}",
                "  fix: check the path, its permissions and free space",
            ],
        )
    except Exception as exc:  # noqa: BLE001 - the last line of defence: no traceback by default
        internal_error("ct200-stage", exc, Exit.BROKE)
    sys.exit(Exit.OK)


def _fail(error: dict[str, object], lines: Sequence[str], code: Exit = Exit.FAILURES) -> NoReturn:
    for line in lines:
        click.echo(line, err=True)
    if _current is not None and _current.as_json:
        envelope = {
            "schema_version": SCHEMA_VERSION,
            "command": _current.command,
            "ok": False,
            "result": None,
            "error": error,
        }
        click.echo(json.dumps(envelope, indent=1, default=str))
    sys.exit(code)


if __name__ == "__main__":
    main()
