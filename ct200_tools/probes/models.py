"""Sizes of each model's persistent copy and staged copy (stat only, never reads data)."""

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


def probe_models(r: Reader, models: tuple[ModelSpec, ...]) -> tuple[ModelFacts, ...]:
    out = []
    for m in models:
        src_exists, src_bytes = _measure(r, f"models.{m.name}.source", m.source)
        st_exists, st_bytes = _measure(r, f"models.{m.name}.staged", m.staged)
        out.append(ModelFacts(m.name, src_exists, src_bytes, st_exists, st_bytes))
    return tuple(out)
