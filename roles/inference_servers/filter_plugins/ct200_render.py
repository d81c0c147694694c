"""The filters of the server templates (templates/ct200-server.*.j2):
ct200_tools.serve.render's own, so Ansible and ct200_tools.serve.render write the same bytes; and
ct200_unit_files, every server's unit rendered by it for one ct200_files run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ct200_tools.serve.render import FILTERS, unit_files
from ct200_tools.untrusted import show


def show_line(value: object, limit: int = 400) -> str:
    """A journal line or message from the machine as one printable line (escaped, bounded)."""
    return show(value, limit)


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {**FILTERS, "ct200_unit_files": unit_files, "ct200_show": show_line}
