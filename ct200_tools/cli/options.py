"""Options both CLIs share, so they find and read the site spec the same way."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

import click

from ct200_tools.spec import DEFAULT_SPEC_PATH, SPEC_ENV


def _one_spec(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> str | None:
    # click would silently keep the last of two --spec; which one was meant is a guess.
    if len(values) > 1:
        raise click.BadParameter(
            f"given {len(values)} times ({', '.join(values)}); give one site spec", ctx, param
        )
    if values and not values[0].strip():
        raise click.BadParameter("is empty; give the path of a site spec", ctx, param)
    return values[0] if values else None


def spec_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--spec PATH; the command resolves it with ct200_tools.spec.find_spec (--spec, then
    $CT200_SPEC, then /etc/ct200/site.yml if present), so both CLIs choose alike."""
    return click.option(
        "--spec",
        "spec_path",
        metavar="PATH",
        multiple=True,
        callback=_one_spec,
        help=f"Site spec: a YAML file or an Ansible inventory dir [default: ${SPEC_ENV} if set, "
        f"else {DEFAULT_SPEC_PATH} if present].",
    )(fn)


def internal_error(tool: str, exc: Exception, code: int) -> NoReturn:
    """The last line of defence of every command: a bug is one line and exit `code` (3), with
    the traceback only when CT200_DEBUG is set. Called from the command's `except` block, so
    the traceback printed is that exception's."""
    click.echo(f"{tool}: internal error: {type(exc).__name__}: {exc}", err=True)
    if os.environ.get("CT200_DEBUG"):
        traceback.print_exc()
    else:
        click.echo("  (set CT200_DEBUG=1 for the traceback; please report it)", err=True)
    sys.exit(code)
