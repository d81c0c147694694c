"""The filters of the server templates (templates/ct200-server.*.j2):
ct200_tools.serve.render's own, so Ansible and ct200_tools.serve.render write the same bytes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ct200_tools.serve.render import FILTERS


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return dict(FILTERS)
