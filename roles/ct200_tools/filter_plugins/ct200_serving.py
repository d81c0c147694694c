"""ct200_serving_set: the serving set of a target, by ct200_tools.serve.serving (the same code as
ct200-serve and the doctor), from the base64 content of its serving.json (or none) and the spec
(the validated one, ct200_validated.site).
"""

from __future__ import annotations

import base64
from typing import Any

from ansible.errors import AnsibleFilterError

from ct200_tools.serve.render import site_of
from ct200_tools.serve.serving import ServingError, parse, serving_set


def ct200_serving_set(content: str | None, validated_site: dict[str, Any]) -> dict[str, Any]:
    site = site_of(validated_site)
    try:
        state = None if content is None else parse(base64.b64decode(content).decode("utf-8"))
    except (ServingError, UnicodeDecodeError, ValueError) as exc:
        fix = getattr(exc, "fix", "")
        raise AnsibleFilterError(f"{exc} (fix: {fix})" if fix else str(exc)) from None
    chosen = serving_set(site, state)
    return {
        "servers": list(chosen.names),
        "models": [m.name for m in site.needed_models(chosen.servers)],
        "source": chosen.source,
        "unknown": list(chosen.unknown),
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"ct200_serving_set": ct200_serving_set}
