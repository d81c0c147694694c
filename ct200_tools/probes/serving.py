"""The serving set: which servers run now, as the switch (`ct200-serve`, playbooks/serve.yml)
records it in /var/lib/ct200/serving.json. Absent, the spec's `enabled` flags decide.

Read through the Reader (so a recorded tree stands in for a machine) and parsed by
ct200_tools.serving, the module that writes the file: one definition of its format.
"""

from __future__ import annotations

from ct200_tools import serving
from ct200_tools.facts import ServingFacts
from ct200_tools.probes.base import Reader

SERVING_PATH = serving.STATE_PATH


def probe_serving(r: Reader, path: str = SERVING_PATH) -> ServingFacts:
    """The set's server names; a file that is not a serving set is recorded as such (and noted
    as unreadable), and the checks then judge the spec's enabled servers."""
    if not r.exists(path):
        return ServingFacts(path)
    try:
        with r.open_binary(path) as fh:
            raw = fh.read(serving.MAX_BYTES + 1)
    except OSError as exc:
        return _broken(r, path, f"cannot read it: {exc.strerror or exc}")
    if len(raw) > serving.MAX_BYTES:
        return _broken(r, path, f"larger than {serving.MAX_BYTES} bytes: not a serving set")
    try:
        state = serving.parse(raw.decode("utf-8"), path)
    except UnicodeDecodeError:
        return _broken(r, path, "not JSON")
    except serving.ServingError as exc:
        return _broken(r, path, exc.reason)
    return ServingFacts(path, True, state.servers)


def _broken(r: Reader, path: str, why: str) -> ServingFacts:
    r.note("serving", f"{path}: {why}; the spec's enabled servers are judged instead")
    return ServingFacts(path, True, error=why)
