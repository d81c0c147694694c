"""The serving set: which servers run now, as the switch (`ct200-serve`, playbooks/serve.yml)
records it in /var/lib/ct200/serving.json. Absent, the spec's `enabled` flags decide.

Read through the Reader (so a recorded tree stands in for a machine) and parsed by
ct200_tools.serve.serving, the module that writes the file: one definition of its format.
"""

from __future__ import annotations

from ct200_tools.doctor.probes.base import Reader
from ct200_tools.facts import ServingFacts
from ct200_tools.serve import serving

SERVING_PATH = serving.STATE_PATH


def probe_serving(r: Reader, path: str = SERVING_PATH) -> ServingFacts:
    """The set's server names; a file that is not a serving set is recorded as such (and noted
    as unreadable), and the checks then judge the spec's enabled servers. Read as ct200-serve
    reads it (serving.read_state): a FIFO or a device there is refused, never waited on."""
    try:
        state = serving.read_state(r.path(path))
    except serving.ServingError as exc:
        return _broken(r, path, exc.reason)
    if state is None:
        return ServingFacts(path)
    return ServingFacts(path, True, state.servers)


def _broken(r: Reader, path: str, why: str) -> ServingFacts:
    r.note("serving", f"{path}: {why}; the spec's enabled servers are judged instead")
    return ServingFacts(path, True, error=why)
