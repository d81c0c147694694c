"""The verdict on one staged tree, from what stage/treefacts.py read: the one judgement behind
the doctor's models.staged and `ct200-stage status`, so the two can never disagree. The stager
owns it (it knows what its marker and manifest mean); the doctor's checks call into it.

States:

- staged:     marker present, matches the tree's manifest (and the source's, if one was found),
              every file there with its size (and, with --deep, every chunk re-hashed and matching);
- missing:    nothing at the path and no stage under way;
- partial:    no staged tree, but a partial one beside it (a stage is running or was interrupted);
- unmarked:   something is at the path but it has no marker: never staged by us, or not finished;
- mismatch:   a marker is there but the tree, its manifest or the source's manifest disagree;
- unreadable: the path or its files cannot be read (permissions, I/O errors).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Literal

from ct200_tools.facts import (
    ManifestFacts,
    RehashedFile,
    StagedTreeFacts,
    TreeEntry,
)
from ct200_tools.stage.errors import SourceError
from ct200_tools.stage.manifest import FileEntry, Manifest, compare_to_source
from ct200_tools.stage.target import changed_message

StageState = Literal["staged", "missing", "partial", "unmarked", "mismatch", "unreadable"]
#: A verdict lists at most this many differences (and says how many more there are).
MAX_ERRORS = 20


@dataclass(frozen=True)
class StageVerdict:
    path: str
    state: StageState
    detail: str
    files_expected: int = 0
    bytes_expected: int = 0
    bytes_actual: int = 0
    #: The digest the marker names (what was staged); None without a readable marker.
    manifest_digest: str | None = None
    #: The digest it was compared against (the source's manifest), when one was found.
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


def stage_verdict(t: StagedTreeFacts) -> StageVerdict:
    """Judge one staged tree; the order of the questions is the order of the states above."""
    pid = t.lock_pid
    running = f" (a stage is running now: pid {pid})" if pid else ""
    found = StageVerdict(t.path, "missing", f"nothing staged at {t.path}{running}", stage_pid=pid)
    if not t.exists:
        if not t.partial:
            return found
        then = "wait for it" if pid else "run the stage again: it resumes"
        return replace(
            found, state="partial", detail=f"only a partial copy exists{running}; {then}"
        )
    if t.error is not None:
        return replace(found, state="unreadable", detail=t.error)
    if not t.is_dir:
        return replace(found, state="unmarked", detail=f"{t.path} is not a directory")
    if t.marker_error is not None:
        return replace(found, state="mismatch", detail=f"its marker is damaged: {t.marker_error}")
    if t.marker is None:
        why = f"no .ct200-staged marker: not staged by ct200-stage, or not finished{running}"
        return replace(found, state="unmarked", detail=why)
    digest = t.marker.manifest_digest
    found = replace(
        found,
        state="mismatch",
        manifest_digest=digest,
        staged_at=t.marker.staged_at,
        source=t.marker.source,
        deep=t.deep,
    )
    m = t.manifest
    if t.manifest_error is not None:
        return replace(found, detail=t.manifest_error)
    if m is None or m.digest != digest:
        why = "its manifest is missing" if m is None else "marker and manifest disagree"
        return replace(found, detail=why)
    return _against_manifest(t, m, found)


def _against_manifest(t: StagedTreeFacts, m: ManifestFacts, found: StageVerdict) -> StageVerdict:
    entries = t.entries or ()
    sizes = {e.path: e.size for e in entries if e.size is not None}
    found = replace(
        found,
        files_expected=len(m.files),
        bytes_expected=sum(f.size for f in m.files),
        bytes_actual=sum(sizes.get(f.path, 0) for f in m.files),
    )
    if t.source_manifest is not None:
        if t.source_manifest_error is not None:
            why = f"cannot compare with the source's manifest: {t.source_manifest_error}"
            return replace(found, state="unreadable", detail=why)
        expected = t.source_manifest_digest
        found = replace(found, expected_digest=expected)
        if expected != m.digest:
            why = (
                f"staged content {m.digest} is not the source's {expected}: restage it (--replace)"
            )
            return replace(found, detail=why)
    differences = listing_differences(t.path, m, t)
    if differences:
        head = f"{t.path} does not match its manifest (files or sizes differ)"
        return _with_errors(found, "mismatch", head, differences)
    if t.rehashed is not None:
        rehashed = t.rehashed
        unread = [f.error for f in rehashed if f.error]
        if unread:
            return _with_errors(found, "unreadable", unread[0], tuple(unread[1:]))
        bad = chunk_differences(m, rehashed)
        if bad:
            head = (
                f"{t.path}: {len(bad)} {'chunk does' if len(bad) == 1 else 'chunks do'} not "
                "match the manifest"
            )
            return _with_errors(found, "mismatch", head, bad)
    recorded = (t.marker.identities or {}) if t.marker is not None else {}
    # Re-hashed (--deep), the content itself was judged; otherwise a file changed since staging
    # (its ctime moved) is not trusted, whatever its size.
    changed = changed_files(recorded, entries) if t.rehashed is None else ()
    if changed:
        more = f" (and {len(changed) - 1} more files)" if len(changed) > 1 else ""
        head = f"{t.path}/{changed[0]}{more}"
        return _with_errors(found, "mismatch", head, changed[1:])
    n = len(m.files)
    if t.rehashed is not None:
        how = "every chunk re-hashed"
    elif recorded:
        # Exactly what was checked: a write moves ctime, but the bytes were not read again.
        how = (
            f"sizes and change times of {n} files as staged; content not re-hashed: "
            f"ct200-stage verify {t.path} re-hashes"
        )
    else:
        how = (
            f"sizes of {n} files as staged (marker of an older ct200-stage: no change times); "
            f"content not re-hashed: ct200-stage verify {t.path} re-hashes"
        )
    detail = f"staged {found.staged_at} from {found.source}; {how}"
    return replace(found, state="staged", detail=detail)


def changed_files(
    recorded: dict[str, tuple[int, ...]], entries: tuple[TreeEntry, ...]
) -> tuple[str, ...]:
    """Files whose identity now is not the one the marker recorded at staging (a write moves
    ctime, which no user can set back; a replacement is another inode)."""
    now = {e.path: e.identity for e in entries}
    out = []
    for rel, was in sorted(recorded.items()):
        got = now.get(rel)
        if got is None or len(got) != 4 or len(was) != 4:
            continue  # missing files are the listing's to name; an odd record is ignored
        if tuple(got) != tuple(was):
            a, b = (got[0], got[1], got[2], got[3]), (was[0], was[1], was[2], was[3])
            out.append(changed_message(rel, b, a))
    return tuple(out)


@dataclass(frozen=True)
class _Listed:
    path: str
    size: int


def listing_differences(root: str, m: ManifestFacts, t: StagedTreeFacts) -> tuple[str, ...]:
    """Entries that are not plain files, else the files and sizes that differ from the
    manifest, in ct200-stage's words (stage/manifest.compare_to_source)."""
    entries = t.entries or ()
    problems = tuple(f"{e.path}: {e.problem}" for e in entries if e.problem)
    if problems:
        return problems
    manifest = Manifest(
        "", m.algorithm, m.chunk_size, tuple(FileEntry(f.path, f.size, f.chunks) for f in m.files)
    )
    files = [_Listed(e.path, e.size) for e in entries if e.size is not None]
    try:
        compare_to_source(manifest, files, root)
    except SourceError as exc:
        return exc.details
    return ()


def chunk_differences(m: ManifestFacts, rehashed: tuple[RehashedFile, ...]) -> tuple[str, ...]:
    """Every chunk whose hash now is not the manifest's, named by file and byte range."""
    now = {f.path: f.chunks for f in rehashed}
    out = []
    for f in m.files:
        pairs = itertools.zip_longest(f.chunks, now.get(f.path, ()))
        for chunk, (want, got) in enumerate(pairs):
            if want != got:
                lo = chunk * m.chunk_size
                hi = min(f.size, lo + m.chunk_size)
                out.append(f"{f.path}: bytes {lo}-{hi} (chunk {chunk}) do not match the manifest")
    return tuple(out)


def _with_errors(
    found: StageVerdict, state: StageState, head: str, details: tuple[str, ...]
) -> StageVerdict:
    errors = (head, *details)
    if len(errors) > MAX_ERRORS:
        errors = (*errors[:MAX_ERRORS], f"... and {len(errors) - MAX_ERRORS} more")
    return replace(found, state=state, detail=head, errors=errors)
