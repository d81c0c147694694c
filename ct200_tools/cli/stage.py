"""ct200-stage: parse options, call ct200_tools.stage, print, exit. No logic of its own."""

from __future__ import annotations

import dataclasses
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
from ct200_tools.stage.options import (
    ManifestCommand,
    Spelling,
    StageCommand,
    StatusCommand,
    VerifyCommand,
)
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


#: Options the CLIs share (cli/options.py), named by stage/options.Spelling.shared.
_SHARED: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {"spec": spec_option}


def _options(command: type) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The click options of one command's options dataclass (stage/options.py), in its field
    order; the command's function receives them as keyword arguments named after the fields."""

    def apply(fn: Callable[..., Any]) -> Callable[..., Any]:
        for f in reversed(dataclasses.fields(command)):
            how: Spelling = f.metadata["cli"]
            if how.shared is not None:
                fn = _SHARED[how.shared](fn)
                continue
            missing = f.default is dataclasses.MISSING
            default = f.default_factory() if missing else f.default
            kwargs: dict[str, Any] = {"help": how.help}
            if isinstance(default, bool) and not any("/" in d for d in how.decls):
                kwargs["is_flag"] = True
            kwargs["default"] = default
            if how.metavar is not None:
                kwargs["metavar"] = how.metavar
            if how.show_default:
                kwargs["show_default"] = True
            if how.choices:
                kwargs["type"] = click.Choice(how.choices)
            elif how.min is not None or how.max is not None:
                rng = click.IntRange if isinstance(default, int) else click.FloatRange
                kwargs["type"] = rng(how.min, how.max)
            elif how.existing_file:
                kwargs["type"] = click.Path(dir_okay=False, exists=True)
            fn = click.option(*how.decls, f.name, **kwargs)(fn)
        return fn

    return apply


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
@_options(ManifestCommand)
@_common
def manifest(source: str, as_json: bool, quiet: bool, **given: Any) -> None:
    """Hash the model at SOURCE (read-only) and write its manifest."""
    from ct200_tools.stage import commands  # noqa: PLC0415

    out = _out("manifest", as_json, quiet)
    res = commands.make_manifest(source, ManifestCommand(**given), out.progress())
    out.done(True, res.data, res.lines)


@cli.command()
@click.argument("target", nargs=-1, required=True, metavar="SRC DST | MODEL")
@_options(StageCommand)
@_common
def stage(target: tuple[str, ...], as_json: bool, quiet: bool, **given: Any) -> None:
    """Copy a model into place, verifying every chunk, and publish it atomically."""
    from ct200_tools.stage import commands  # noqa: PLC0415

    out = _out("stage", as_json, quiet)
    if len(target) > 2:
        raise click.UsageError("give SRC DST, or one MODEL name from the spec")
    res = commands.stage_model(target, StageCommand(**given), out.progress())
    out.done(True, res.data, res.lines)


@cli.command()
@click.argument("path")
@_options(VerifyCommand)
@_common
def verify(path: str, as_json: bool, quiet: bool, **given: Any) -> None:
    """Re-hash PATH (a staged copy, a source, or a model name) against its manifest."""
    from ct200_tools.stage import commands  # noqa: PLC0415

    out = _out("verify", as_json, quiet)
    res = commands.verify_path(path, VerifyCommand(**given), out.progress())
    out.done(True, res.data, res.lines)


@cli.command()
@click.argument("paths", nargs=-1, metavar="[PATH]...")
@_options(StatusCommand)
@_common
def status(paths: tuple[str, ...], as_json: bool, quiet: bool, **given: Any) -> None:
    """What is staged: every model of the spec (or the given PATHs). Exit 2 if any is not."""
    from ct200_tools.stage import commands  # noqa: PLC0415

    out = _out("status", as_json, quiet)
    res = commands.status(paths, StatusCommand(**given))
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
