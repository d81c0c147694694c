"""ct200_step_seconds: recover.yml's timing summary, seconds per step from the marks it set."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any


def step_seconds(marks: Mapping[str, float], order: Sequence[str]) -> dict[str, float]:
    """Each step's seconds: from its mark to the next step's mark (the last mark ends the run).
    Steps without a mark (not run, e.g. on another host) are left out."""
    present = [name for name in order if name in marks]
    return {
        name: round(float(marks[after]) - float(marks[name]), 2)
        for name, after in itertools.pairwise(present)
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"ct200_step_seconds": step_seconds}
