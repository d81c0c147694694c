"""What is at a staged path, read and not judged: the marker, the manifest the tree carries,
the tree's files and sizes, the partial tree and the stage lock beside it, the source's manifest,
and with `deep` the hash of every chunk. stage/verdict.py turns that into the verdict (staged,
missing, partial, ...). The stager owns this reading; the doctor's models probe and
`ct200-stage status` both call it, through a TreeReader (the doctor's Reader is one).
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from ct200_tools.facts import (
    ManifestFacts,
    ManifestFile,
    MarkerFacts,
    RehashedFile,
    StagedTreeFacts,
    TreeEntry,
)
from ct200_tools.stage import tree
from ct200_tools.stage.errors import SourceError
from ct200_tools.stage.hashing import new_hasher
from ct200_tools.stage.lock import lock_path_for
from ct200_tools.stage.manifest import (
    EXCLUDED_TOP_DIRS,
    MAX_MANIFEST_BYTES,
    OWN_PREFIX,
    Manifest,
    parse_manifest,
)
from ct200_tools.stage.reader import TreeReader

#: Bytes read per call while re-hashing (one buffer per thread), as the staging engine does.
READ_SIZE = 16 << 20
#: Consecutive chunks one re-hash task reads through one descriptor.
RUN_CHUNKS = 16


def read_staged_tree(
    r: TreeReader,
    path: str,
    *,
    deep: bool = False,
    source_manifest: str | None = None,
    jobs: int | None = None,
) -> StagedTreeFacts:
    """Read what is at `path` (never raises on I/O errors: they become `error` fields).

    What is read depends only on what is there: the tree is walked when it carries a marker,
    and re-hashed (deep) only when marker, manifest and source manifest name the same content,
    since otherwise the chunks would be compared with nothing that decides anything."""
    pid = r.lock_holder(lock_path_for(path))
    found = StagedTreeFacts(
        path,
        lock_pid=None if pid is None else (int(pid) if pid.isascii() and pid.isdigit() else -1),
        deep=deep,
    )
    try:
        r.lstat(path)
    except FileNotFoundError:
        return replace(found, partial=r.is_dir(tree.partial_path(path)))
    except OSError as exc:
        return replace(found, exists=True, error=_why(exc, path))
    found = replace(found, exists=True, is_dir=r.is_dir(path))
    if not found.is_dir:
        return found
    try:
        found = _read_tree(r, found, source_manifest)
    except OSError as exc:
        return replace(found, error=_why(exc, path))
    if deep and found.manifest is not None and _same_content(found) and found.entries is not None:
        present = {e.path: e.size for e in found.entries if e.size is not None}
        # (sizes as found: a file of another size fails the listing before its chunks matter)
        found = replace(found, rehashed=_rehash(r, path, found.manifest, present, jobs))
    return found


def _read_tree(r: TreeReader, found: StagedTreeFacts, source: str | None) -> StagedTreeFacts:
    path = found.path
    r.listdir(path)  # an unreadable directory says so before anything inside it
    text = _read_optional(r, f"{path}/{tree.MARKER_NAME}", tree.MAX_MARKER_BYTES)
    if text is None:
        return found
    try:
        found = replace(found, marker=parse_marker(text))
    except DAMAGED as exc:
        return replace(found, marker_error=str(exc) or type(exc).__name__)
    manifest_path = f"{path}/{tree.MANIFEST_NAME}"
    text = _read_optional(r, manifest_path, MAX_MANIFEST_BYTES)
    if text is not None:
        try:
            parsed = parse_manifest(text, manifest_path)
        except SourceError as exc:
            return replace(found, manifest_error=exc.message)
        except DAMAGED as exc:  # what parse_manifest does not catch itself (e.g. Infinity)
            why = f"manifest {manifest_path} is not valid: {exc or type(exc).__name__}"
            return replace(found, manifest_error=why)
        found = replace(found, manifest=manifest_facts(parsed, chunks=found.deep))
    found = replace(found, entries=walk_tree(r, path))
    if source is not None:
        digest, error = _source_digest(r, source)
        found = replace(
            found,
            source_manifest=source,
            source_manifest_digest=digest,
            source_manifest_error=error,
        )
    return found


#: What parsing a damaged marker or manifest raises: JSON that is not one (ValueError,
#: KeyError, TypeError), a number like Infinity (OverflowError), nesting too deep to parse.
DAMAGED = (ValueError, KeyError, TypeError, ArithmeticError, RecursionError)


def parse_marker(text: str) -> MarkerFacts:
    """A marker's fields, parsed by stage/tree.parse_marker (as ct200-stage reads them); raises
    one of DAMAGED when the text is not a marker."""
    m = tree.parse_marker(text)
    return MarkerFacts(
        m.manifest_digest,
        m.name,
        m.source,
        m.staged_at,
        m.files,
        m.bytes,
        dict(m.identities) or None,
    )


def manifest_facts(m: Manifest, chunks: bool) -> ManifestFacts:
    files = tuple(ManifestFile(f.path, f.size, f.chunks if chunks else ()) for f in m.files)
    return ManifestFacts(m.digest, m.algorithm, m.chunk_size, files)


def walk_tree(r: TreeReader, root: str) -> tuple[TreeEntry, ...]:
    """Every entry under root as ct200-stage's scan sees one (stage/manifest.scan_tree)."""
    out: list[TreeEntry] = []
    todo = [""]
    while todo:
        rel_dir = todo.pop()
        here = f"{root}/{rel_dir}" if rel_dir else root
        try:
            names = r.listdir(here)
        except OSError as exc:
            out.append(TreeEntry(rel_dir, problem=f"cannot list it: {exc.strerror}"))
            continue
        for name in names:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            entry, descend = _entry(r, rel, f"{root}/{rel}", top=not rel_dir)
            if descend:
                todo.append(rel)
            elif entry is not None:
                out.append(entry)
    return tuple(sorted(out, key=lambda e: e.path))


def _entry(r: TreeReader, rel: str, full: str, top: bool) -> tuple[TreeEntry | None, bool]:
    """The entry for one name, or none (left out), and whether to walk into it."""
    try:
        st: os.stat_result | None = r.stat(full)
    except OSError as exc:
        st, error = None, exc.strerror or str(exc)
    if st is not None and stat.S_ISDIR(st.st_mode):
        if top and rel in EXCLUDED_TOP_DIRS:
            return None, False
        if stat.S_ISLNK(r.lstat(full).st_mode):
            return TreeEntry(rel, problem="a symlink to a directory"), False
        return None, True
    if top and rel.startswith(OWN_PREFIX):
        return None, False
    if st is None:
        return TreeEntry(rel, problem=error), False
    if not stat.S_ISREG(st.st_mode):
        return TreeEntry(rel, problem="not a regular file"), False
    return TreeEntry(rel, size=st.st_size, identity=tree.file_identity(st)), False


def _source_digest(r: TreeReader, path: str) -> tuple[str | None, str | None]:
    """The source manifest's digest, or why it cannot be compared (load_manifest's words)."""
    try:
        text = r.read_regular(path, MAX_MANIFEST_BYTES).decode("utf-8")
    except FileNotFoundError:
        return None, f"no manifest at {path}"
    except OSError as exc:
        return None, f"cannot read manifest {path}: {exc.strerror or exc}"
    except UnicodeDecodeError as exc:
        return None, f"cannot read manifest {path}: {exc}"
    try:
        return parse_manifest(text, path).digest, None
    except SourceError as exc:
        return None, exc.message


def _same_content(t: StagedTreeFacts) -> bool:
    digest = t.manifest.digest if t.manifest else None
    return (
        t.marker is not None
        and t.marker.manifest_digest == digest
        and t.source_manifest_error is None
        and t.source_manifest_digest in (None, digest)
    )


@dataclass(frozen=True)
class _Task:
    file: int
    first: int
    last: int


def _rehash(
    r: TreeReader,
    root: str,
    m: ManifestFacts,
    present: Mapping[str, int],
    jobs: int | None,
) -> tuple[RehashedFile, ...]:
    """Hash every chunk of the manifest's files present in the tree, in parallel, by runs of
    consecutive chunks (each a sequential read through one descriptor)."""
    from ct200_tools.stage.stager import default_jobs  # noqa: PLC0415 - the engine, when re-hashing

    files = [f for f in m.files if f.path in present]
    try:
        new_hasher(m.algorithm)
    except LookupError as exc:
        return tuple(RehashedFile(f.path, error=f"cannot re-hash {f.path}: {exc}") for f in files)
    sizes = [present[f.path] for f in files]
    tasks = list(_plan(sizes, m.chunk_size))
    local = threading.local()

    def run(task: _Task) -> tuple[list[str], str | None]:
        if not hasattr(local, "buf"):
            local.buf = memoryview(bytearray(min(READ_SIZE, m.chunk_size)))
        rel = files[task.file].path
        return _hash_run(r, f"{root}/{rel}", rel, sizes[task.file], task, m, local.buf)

    with ThreadPoolExecutor(max_workers=max(1, min(jobs or default_jobs(), len(tasks) or 1))) as ex:
        results = list(ex.map(run, tasks))
    chunks: list[list[str]] = [[] for _ in files]
    errors: list[str | None] = [None for _ in files]
    for task, (digests, error) in zip(tasks, results, strict=True):
        chunks[task.file].extend(digests)
        errors[task.file] = errors[task.file] or error
    return tuple(
        RehashedFile(f.path, tuple(c), e) for f, c, e in zip(files, chunks, errors, strict=True)
    )


def _plan(sizes: list[int], chunk_size: int) -> Iterator[_Task]:
    for i, size in enumerate(sizes):
        n = -(-size // chunk_size)
        for first in range(0, n, RUN_CHUNKS):
            yield _Task(i, first, min(n, first + RUN_CHUNKS))


def _hash_run(
    r: TreeReader,
    full: str,
    rel: str,
    size: int,
    task: _Task,
    m: ManifestFacts,
    buf: memoryview,
) -> tuple[list[str], str | None]:
    """Digests of chunks task.first..task.last-1 of one file, and why it stopped early if so."""
    digests: list[str] = []
    pos = task.first * m.chunk_size
    try:
        with r.open_binary(full) as fh:
            fh.seek(pos)
            for chunk in range(task.first, task.last):
                end = min(size, (chunk + 1) * m.chunk_size)
                hasher = new_hasher(m.algorithm)
                while pos < end:
                    n = fh.readinto(buf[: min(len(buf), end - pos)])
                    if not n:
                        return digests, (
                            f"{rel} ended at byte {pos}, before its size {size} "
                            "(it changed while being read)"
                        )
                    hasher.update(buf[:n])
                    pos += n
                digests.append(hasher.hexdigest())
    except OSError as exc:
        return digests, f"cannot read {rel} at byte {pos}: {exc.strerror or exc}"
    return digests, None


def _read_optional(r: TreeReader, p: str, max_bytes: int) -> str | None:
    """A marker's or manifest's text, None when absent; other errors (a FIFO or a device there,
    a file too large) raise OSError."""
    try:
        return r.read_regular(p, max_bytes).decode("utf-8", errors="replace")
    except FileNotFoundError:
        return None


def _why(exc: OSError, path: str) -> str:
    return f"{exc.filename or path}: {exc.strerror or exc}"
