"""Each model's persistent copy (size) and staged copy (ct200-stage's verdict on it).

Sizes come from stat alone; the staged verdict compares the marker and manifest and, with
`--deep`, re-hashes every chunk.
"""

from __future__ import annotations

import os

from ct200_tools.facts import ModelFacts
from ct200_tools.probes.base import Reader
from ct200_tools.spec import ModelSpec


def tree_bytes(r: Reader, p: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(r.path(p)):
        for name in files:
            total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _measure(r: Reader, key: str, p: str) -> tuple[bool | None, int | None]:
    try:
        if not r.path(p).is_dir():
            return False, None
        return True, tree_bytes(r, p)
    except OSError as exc:
        r.note(key, f"cannot read {p}: {exc.strerror}")
        return None, None


def probe_model(r: Reader, m: ModelSpec) -> ModelFacts:
    # Imported here: the staging engine is only needed when the spec has models.
    from ct200_tools.stage.manifest import default_manifest_path  # noqa: PLC0415
    from ct200_tools.stage.status import model_status  # noqa: PLC0415

    src_exists, src_bytes = _measure(r, f"models.{m.name}.source", m.source)
    st_exists, st_bytes = _measure(r, f"models.{m.name}.staged", m.staged)
    manifest = r.path(default_manifest_path(m.name))
    status = model_status(
        str(r.path(m.staged)),
        deep=r.deep,
        manifest=str(manifest) if manifest.is_file() else None,
    )
    return ModelFacts(
        m.name,
        src_exists,
        src_bytes,
        st_exists,
        st_bytes,
        stage_state=status.state,
        stage_detail=status.detail,
        deep=status.deep,
        stage_pid=status.stage_pid,
    )


def probe_models(r: Reader, models: tuple[ModelSpec, ...]) -> tuple[ModelFacts, ...]:
    return tuple(probe_model(r, m) for m in models)
