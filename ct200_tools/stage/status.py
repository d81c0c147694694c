"""Is a model staged? `ct200-stage status` asks the doctor's own probe and verdict.

The probe (probes/models.probe_staged_tree) reads the target through a Reader and never judges;
the verdict (checks/staged.stage_verdict) is pure. `model_status` is the two together, so
`ct200-stage status` and the doctor's models.staged can never disagree. It never raises on I/O
problems and never writes: whatever it cannot read becomes the "unreadable" state with the
reason. The states are listed in checks/staged.py.
"""

from __future__ import annotations

import os

from ct200_tools.checks.staged import StageState, StageVerdict, stage_verdict
from ct200_tools.probes.base import Reader
from ct200_tools.probes.models import probe_staged_tree

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
    tree = probe_staged_tree(
        Reader(),
        os.path.abspath(staged_path),
        deep=deep,
        source_manifest=os.path.abspath(manifest) if manifest is not None else None,
        jobs=jobs,
    )
    return stage_verdict(tree)
