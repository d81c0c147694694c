"""Is a model staged? A pure reading of one target, for `ct200-stage status` and the doctor.

`model_status` never raises on I/O problems and never writes: whatever it cannot read becomes the
"unreadable" state with the reason. States:

- staged:     marker present, matches the tree's manifest (and the expected one, if given), every
              file there with its size (and, with deep=True, every chunk re-hashed and matching);
- missing:    nothing at the path and no stage under way;
- partial:    no staged tree, but a partial one beside it (a stage is running or was interrupted);
- unmarked:   something is at the path but it has no marker: never staged by us, or not finished;
- mismatch:   a marker is there but the tree, its manifest or the expected manifest disagree;
- unreadable: the path or its files cannot be read (permissions, I/O errors).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, replace
from typing import Literal

from ct200_tools.stage import tree
from ct200_tools.stage.errors import StageError
from ct200_tools.stage.lock import holder_pid
from ct200_tools.stage.manifest import load_manifest
from ct200_tools.stage.stager import default_jobs
from ct200_tools.stage.verify import check_listing, embedded_manifest, verify_tree

StageState = Literal["staged", "missing", "partial", "unmarked", "mismatch", "unreadable"]
STATES: tuple[StageState, ...] = (
    "staged",
    "missing",
    "partial",
    "unmarked",
    "mismatch",
    "unreadable",
)
_MAX_ERRORS = 20


@dataclass(frozen=True)
class ModelStageStatus:
    path: str
    state: StageState
    detail: str
    files_expected: int = 0
    bytes_expected: int = 0
    bytes_actual: int = 0
    #: The digest the marker names (what was staged); None without a readable marker.
    manifest_digest: str | None = None
    #: The digest it was compared against (the source's manifest), when one was given.
    expected_digest: str | None = None
    deep: bool = False
    staged_at: str = ""
    source: str = ""
    #: The pid of a stage running on this target now, if any.
    stage_pid: int | None = None
    errors: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.state == "staged"

    def to_dict(self) -> dict[str, object]:
        out = dict(self.__dict__)
        out["errors"] = list(self.errors)
        return out


def model_status(
    staged_path: str,
    deep: bool = False,
    *,
    manifest: str | None = None,
    jobs: int | None = None,
) -> ModelStageStatus:
    """The staging state of `staged_path`; `manifest` (a manifest file, normally the source's)
    makes "staged" also mean "of that exact content"."""
    try:
        return _status(os.path.abspath(staged_path), deep, manifest, jobs or default_jobs())
    except (OSError, ValueError, StageError) as exc:  # anything left is a bug, not a state
        return ModelStageStatus(
            os.path.abspath(staged_path), "unreadable", f"cannot read it: {_why(exc)}"
        )


def _status(path: str, deep: bool, expected_path: str | None, jobs: int) -> ModelStageStatus:
    pid = holder_pid(path)
    running = f" (a stage is running now: pid {pid})" if pid else ""
    found = ModelStageStatus(path, "missing", f"nothing staged at {path}{running}", stage_pid=pid)
    if not os.path.lexists(path):
        partial = tree.partial_path(path)
        if not os.path.isdir(partial):
            return found
        then = "wait for it" if pid else "run the stage again: it resumes"
        return replace(
            found, state="partial", detail=f"only a partial copy exists{running}; {then}"
        )
    if not os.path.isdir(path):
        return replace(found, state="unmarked", detail=f"{path} is not a directory")
    try:
        os.listdir(path)
        marker = tree.read_marker(path)
    except PermissionError as exc:
        return replace(found, state="unreadable", detail=_why(exc))
    except (ValueError, KeyError, TypeError) as exc:
        return replace(found, state="mismatch", detail=f"its marker is damaged: {exc}")
    if marker is None:
        why = f"no {tree.MARKER_NAME} marker: not staged by ct200-stage, or not finished{running}"
        return replace(found, state="unmarked", detail=why)
    found = replace(
        found,
        state="mismatch",
        manifest_digest=marker.manifest_digest,
        staged_at=marker.staged_at,
        source=marker.source,
        deep=deep,
    )
    return _against_manifest(found, marker.manifest_digest, expected_path, jobs)


def _against_manifest(
    found: ModelStageStatus, digest: str, expected_path: str | None, jobs: int
) -> ModelStageStatus:
    path = found.path
    try:
        embedded = embedded_manifest(path)
    except StageError as exc:
        return replace(found, detail=exc.message)
    if embedded is None or embedded.digest != digest:
        why = "its manifest is missing" if embedded is None else "marker and manifest disagree"
        return replace(found, detail=why)
    found = replace(
        found,
        files_expected=len(embedded.files),
        bytes_expected=embedded.total_bytes,
        bytes_actual=_bytes_present(path, [f.path for f in embedded.files]),
    )
    if expected_path is not None:
        try:
            expected = load_manifest(expected_path).digest
        except StageError as exc:
            why = f"cannot compare with the source's manifest: {exc.message}"
            return replace(found, state="unreadable", detail=why)
        found = replace(found, expected_digest=expected)
        if expected != digest:
            why = f"staged content {digest} is not the source's {expected}: restage it (--replace)"
            return replace(found, detail=why)
    try:
        if found.deep:
            verify_tree(path, embedded, jobs=jobs)
        else:
            check_listing(path, embedded)
    except StageError as exc:
        errors = (exc.message, *exc.details)
        if len(errors) > _MAX_ERRORS:
            errors = (*errors[:_MAX_ERRORS], f"... and {len(errors) - _MAX_ERRORS} more")
        state: StageState = "mismatch" if exc.kind == "verification" else "unreadable"
        return replace(found, state=state, detail=exc.message, errors=errors)
    how = "every chunk re-hashed" if found.deep else "marker, manifest and sizes match"
    detail = f"staged {found.staged_at} from {found.source}; {how}"
    return replace(found, state="staged", detail=detail)


def _bytes_present(root: str, paths: list[str]) -> int:
    total = 0
    for p in paths:
        with contextlib.suppress(OSError):
            total += os.stat(os.path.join(root, p)).st_size
    return total


def _why(exc: BaseException) -> str:
    if isinstance(exc, StageError):
        return exc.message
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename or ''}: {exc.strerror}".lstrip(": ")
    return str(exc)
