"""Each model's persistent copy (exists, size) and what is at its staged path, read through the
Reader and not judged. What is at the staged path is read by the stager's own reading
(stage/treefacts.read_staged_tree), so the doctor and `ct200-stage status` read it alike.
"""

from __future__ import annotations

import stat

from ct200_tools.doctor.probes.base import Reader
from ct200_tools.facts import ModelFacts
from ct200_tools.spec import ModelSpec
from ct200_tools.stage.manifest import default_manifest_path
from ct200_tools.stage.treefacts import read_staged_tree


def tree_bytes(r: Reader, p: str) -> int:
    """Bytes of the regular files under p, symlinks not followed (raises OSError)."""
    total = 0
    for name in r.listdir(p):
        full = f"{p.rstrip('/')}/{name}"
        st = r.lstat(full)
        if stat.S_ISDIR(st.st_mode):
            total += tree_bytes(r, full)
        elif stat.S_ISREG(st.st_mode):
            total += st.st_size
    return total


def _measure(r: Reader, key: str, p: str) -> tuple[bool | None, int | None]:
    try:
        if not r.is_dir(p):
            return False, None
        return True, tree_bytes(r, p)
    except OSError as exc:
        r.note(key, f"cannot read {p}: {exc.strerror}")
        return None, None


def probe_model(r: Reader, m: ModelSpec) -> ModelFacts:
    src_exists, src_bytes = _measure(r, f"models.{m.name}.source", m.source)
    st_exists, st_bytes = _measure(r, f"models.{m.name}.staged", m.staged)
    manifest = default_manifest_path(m.name)
    staged = read_staged_tree(
        r, m.staged, deep=r.deep, source_manifest=manifest if r.is_file(manifest) else None
    )
    return ModelFacts(m.name, src_exists, src_bytes, st_exists, st_bytes, staged_tree=staged)


def probe_models(r: Reader, models: tuple[ModelSpec, ...]) -> tuple[ModelFacts, ...]:
    return tuple(probe_model(r, m) for m in models)
