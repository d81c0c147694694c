"""Is a model staged? `ct200-stage status` and the doctor's models.staged ask the same two
stager functions: stage/treefacts.read_staged_tree reads the target and never judges,
stage/verdict.stage_verdict judges it (the states are listed there). `model_status` is the two
together, so they can never disagree. It never raises on I/O problems and never writes: whatever
it cannot read becomes the "unreadable" state with the reason.
"""

from __future__ import annotations

import os

from ct200_tools.stage.reader import TreeReader
from ct200_tools.stage.treefacts import read_staged_tree
from ct200_tools.stage.verdict import StageState, StageVerdict, stage_verdict

#: The row `ct200-stage status` prints for a target (also its JSON shape).
ModelStageStatus = StageVerdict

__all__ = ["ModelStageStatus", "StageState", "model_status"]


def model_status(
    staged_path: str,
    deep: bool = False,
    *,
    manifest: str | None = None,
    jobs: int | None = None,
) -> ModelStageStatus:
    """The staging state of `staged_path`; `manifest` (a manifest file, normally the source's)
    makes "staged" also mean "of that exact content"."""
    tree = read_staged_tree(
        TreeReader(),
        os.path.abspath(staged_path),
        deep=deep,
        source_manifest=os.path.abspath(manifest) if manifest is not None else None,
        jobs=jobs,
    )
    return stage_verdict(tree)
