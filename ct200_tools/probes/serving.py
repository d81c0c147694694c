"""The serving set: which servers run now, as the switch (`ct200-serve`, playbooks/serve.yml)
records it in /var/lib/ct200/serving.json: `{"servers": [NAME, ...], ...}`. Absent, the spec's
`enabled` flags decide.

A minimal private reader: the switch's own module (ct200_tools/serving.py) is to replace it, so
that one definition reads and writes the file.
"""

from __future__ import annotations

import json

from ct200_tools.facts import ServingFacts
from ct200_tools.probes.base import Reader

SERVING_PATH = "/var/lib/ct200/serving.json"
#: A serving set names a few servers; past this it is not one.
LIMIT = 1 << 20


def probe_serving(r: Reader, path: str = SERVING_PATH) -> ServingFacts:
    if not r.exists(path):
        return ServingFacts(path)
    try:
        with r.open_binary(path) as fh:
            raw = fh.read(LIMIT + 1)
    except OSError as exc:
        return ServingFacts(path, True, error=f"cannot read it: {exc.strerror or exc}")
    try:
        data = json.loads(raw[:LIMIT])
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return ServingFacts(path, True, error="not JSON")
    names = data.get("servers") if isinstance(data, dict) else None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return ServingFacts(path, True, error='no "servers" list of names in it')
    return ServingFacts(path, True, tuple(names))
