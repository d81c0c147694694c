"""The doctor's side of the staged-tree verdict: a model's facts, as this doctor read them or as
an older doctor's snapshot recorded them. The verdict itself (states, messages) is the stager's,
in stage/verdict.py, shared with `ct200-stage status`.
"""

from __future__ import annotations

from typing import cast, get_args

from ct200_tools.facts import ModelFacts
from ct200_tools.stage.verdict import StageState, StageVerdict, stage_verdict


def model_verdict(f: ModelFacts) -> StageVerdict | None:
    """The verdict on a model's staged copy: judged from staged_tree, or, in a snapshot of an
    older doctor, as it recorded it; None when nothing was read."""
    if f.staged_tree is not None:
        return stage_verdict(f.staged_tree)
    if f.stage_state is None:
        return None
    known = f.stage_state in get_args(StageState)
    state = cast(StageState, f.stage_state if known else "unreadable")
    return StageVerdict("", state, f.stage_detail or "", deep=f.deep, stage_pid=f.stage_pid)
