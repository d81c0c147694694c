"""Options both CLIs share, so they read the site spec the same way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ct200_tools.spec import DEFAULT_SPEC_PATH


def spec_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--spec",
        "spec_path",
        metavar="PATH",
        envvar="CT200_SPEC",
        help=f"Site spec: a YAML file or an Ansible inventory dir [default: {DEFAULT_SPEC_PATH} "
        "if present; env CT200_SPEC].",
    )(fn)
