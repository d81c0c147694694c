"""The filters of the server templates (templates/ct200-server.*.j2):
ct200_tools.serve.render's own, so Ansible and ct200_tools.serve.render write the same bytes;
ct200_unit_files, every server's unit rendered by it for one ct200_files run; and
ct200_kept_files, the record of the files a failed run kept for debugging."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any

from ct200_tools.serve.render import FILTERS, unit_files
from ct200_tools.untrusted import show


def show_line(value: object, limit: int = 400) -> str:
    """A journal line or message from the machine as one printable line (escaped, bounded)."""
    return show(value, limit)


#: A record larger than this is no record of ours (a few hundred bytes a server).
KEPT_RECORD_MAX = 1 << 20


def kept_files(content: object) -> list[str]:
    """The paths in the kept-files record (slurp's base64 content; None: there is none). A
    record that is damaged or not a list of paths names nothing: nothing is removed by it."""
    if not isinstance(content, str) or len(content) > KEPT_RECORD_MAX:
        return []
    try:
        data = json.loads(base64.b64decode(content, validate=True))
    except (binascii.Error, ValueError):
        return []
    if not isinstance(data, list):
        return []
    return [p for p in data if isinstance(p, str)]


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {
            **FILTERS,
            "ct200_unit_files": unit_files,
            "ct200_show": show_line,
            "ct200_kept_files": kept_files,
        }
