"""Resume an interrupted stage: keep what the last run verified, after proving it again.

The journal says which chunks of the partial tree were verified and synced before the kill. That
was true then; the tree has sat in RAM since, where anything may have written to it. So every chunk
the journal vouches for is hashed again before it is kept (a tmpfs read: memory bandwidth, far
cheaper than the disk read it saves), and a chunk that no longer matches is copied again.
"""

from __future__ import annotations

import os
import stat

from ct200_tools.stage import tree
from ct200_tools.stage.engine import ChunkEngine, FileJob
from ct200_tools.stage.errors import SourceError, StageError, VerifyError
from ct200_tools.stage.manifest import Manifest, parse_manifest, read_manifest_file


def resume_partial(
    partial: str, manifest: Manifest | None, jobs: int
) -> tuple[tree.JournalState | None, str]:
    """(What to keep, a note for the user); None when the tree is of another manifest (or none)."""
    if manifest is None:
        return None, ""  # nothing to check kept chunks against: start afresh
    try:
        data = read_manifest_file(os.path.join(partial, tree.MANIFEST_NAME))
        if data is None:
            return None, ""
        theirs = parse_manifest(data, partial)
    except SourceError:
        return None, ""
    if theirs.digest != manifest.digest:
        return None, ""
    recorded = tree.Journal(partial).read()
    claimed: dict[str, set[int]] = {}
    for entry in manifest.files:
        try:
            st = os.lstat(os.path.join(partial, entry.path))
        except OSError:
            continue  # recorded or not, a file that is gone is redone
        if not stat.S_ISREG(st.st_mode) or st.st_size != entry.size:
            continue
        every = set(range(len(entry.chunks)))
        if entry.path in recorded.files:
            claimed[entry.path] = every
        elif entry.path in recorded.chunks:
            claimed[entry.path] = recorded.chunks[entry.path] & every
    return _reprove(partial, manifest, claimed, jobs)


def _reprove(
    partial: str, m: Manifest, claimed: dict[str, set[int]], jobs: int
) -> tuple[tree.JournalState | None, str]:
    good: dict[str, set[int]] = {}

    def matched(job: FileJob, chunk: int) -> None:
        good.setdefault(job.path, set()).add(chunk)

    work = []
    for path, chunks in claimed.items():
        entry = m.file(path)
        assert entry is not None  # noqa: S101 - claimed comes from the manifest
        skip = frozenset(range(len(entry.chunks))) - chunks
        work.append(FileJob(path, entry.size, entry.chunks, skip=skip))
    engine = ChunkEngine(
        algorithm=m.algorithm,
        chunk_size=m.chunk_size,
        jobs=min(jobs, os.cpu_count() or 1),  # a RAM read: CPU work, no disk to keep busy
        drop_cache=False,
        keep_going=True,
    )
    try:
        engine.run(partial, work, on_chunk_done=matched)
    except VerifyError:
        pass  # the chunks that did not match are simply not in `good`
    except StageError:
        return None, ""  # cannot even read our own partial tree: start afresh
    kept = tree.JournalState(set(), {})
    for path in claimed:
        entry = m.file(path)
        assert entry is not None  # noqa: S101
        ok = good.get(path, set())
        if len(ok) == len(entry.chunks):  # every chunk (and empty files, which have none)
            kept.files.add(path)
        elif ok:
            kept.chunks[path] = ok
    damaged = sum(len(c) for c in claimed.values()) - sum(len(c) for c in good.values())
    partly = sum(len(c) for c in kept.chunks.values())
    note = (
        f"resumed: re-hashed what the last run verified and kept {len(kept.files)} file(s) "
        f"and {partly} chunk(s) of others"
    )
    if damaged:
        note += f"; {damaged} damaged chunk(s) will be copied again"
    return kept, note
