"""Stage one model: check, lock, copy with inline verification into a partial tree, publish whole.

Order matters and is the point of this module:
1. read-only checks: manifest, source against it, what the target holds (`target`), capacity;
2. the lock (nothing else of this target changes while we hold it);
3. the partial tree beside the target: resumed when its manifest matches, after re-hashing every
   chunk it keeps (tmpfs: memory bandwidth, not disk), else started afresh;
4. copy + hash + compare, journalling each chunk once verified and synced;
5. anything in the partial tree that is not the manifest's removed, the marker written inside it,
   then one rename publishes tree and marker together.
A kill at any point leaves either the old state or a partial tree that the next run resumes.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from dataclasses import dataclass, field

from ct200_tools.fsutil import fsync_dir, write_atomic
from ct200_tools.stage import capacity, tree
from ct200_tools.stage.engine import ChunkEngine, FileJob, ReadMode
from ct200_tools.stage.errors import RefusedError, SourceError, VerifyError
from ct200_tools.stage.hashing import default_algorithm
from ct200_tools.stage.identity import settled, stat_identity
from ct200_tools.stage.lock import target_lock
from ct200_tools.stage.manifest import (
    DEFAULT_CHUNK_SIZE,
    FileEntry,
    Manifest,
    SourceFile,
    compare_to_source,
    load_manifest,
    now_utc,
    scan_source,
    weight_warning,
)
from ct200_tools.stage.progress import NullProgress, ProgressSink
from ct200_tools.stage.resume import resume_partial
from ct200_tools.stage.target import TargetState, inspect, target_path
from ct200_tools.stage.verify import verify_tree


def default_jobs() -> int:
    # Enough reads in flight to keep a disk (or an NVMe RAID) busy while others hash and write;
    # each thread holds one 1 MiB buffer. On 2 cores, 4 threads and 16 measured alike (within the
    # noise of a shared VM), so the floor of 16 stays for slow disks. One per CPU above that: on
    # the 16-CPU GPU machine 16 threads beat 32 in every paired round (docs/staging.md), since
    # each thread is one more stream the disk interleaves.
    return min(64, max(16, os.cpu_count() or 1))


@dataclass(frozen=True)
class StageOptions:
    jobs: int = field(default_factory=default_jobs)
    read_mode: ReadMode = "buffered"
    reserve: int = 0
    replace: bool = False
    wait: float = 0.0
    create_manifest: bool = False
    #: None: the engine's choice for the read mode.
    buffer_size: int | None = None
    drop_cache: bool = True
    #: False only to measure what the engine's per-file write lock buys (benchmarks/stage).
    one_writer_per_file: bool = True
    #: The spec's shm.size (bytes), for the fix when the tmpfs is smaller; None: not known.
    shm_size: int | None = None


@dataclass(frozen=True)
class StageResult:
    outcome: str  # "staged" | "already-staged"
    name: str
    source: str
    target: str
    manifest_path: str
    manifest_digest: str
    algorithm: str
    files: int
    bytes: int
    files_copied: int = 0
    files_resumed: int = 0
    bytes_copied: int = 0
    seconds: float = 0.0
    read_mode: str = ""
    replaced: bool = False
    capacity: dict[str, object] | None = None
    notes: tuple[str, ...] = ()

    @property
    def rate(self) -> float:
        return self.bytes_copied / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, object]:
        out = dict(self.__dict__)
        out["bytes_per_second"] = round(self.rate)
        out["notes"] = list(self.notes)
        return out


def stage(
    source: str,
    target: str,
    *,
    manifest_path: str,
    name: str = "",
    options: StageOptions | None = None,
    progress: ProgressSink | None = None,
) -> StageResult:
    opts = options or StageOptions()
    sink = progress or NullProgress()
    src = os.path.realpath(source)
    name = name or os.path.basename(src)
    dst = target_path(target, name)
    _refuse_overlap(src, dst)

    manifest: Manifest | None
    if opts.create_manifest and not os.path.exists(manifest_path):
        manifest = None
    else:
        manifest = load_manifest(manifest_path)
    files = scan_source(src)
    if manifest is not None:
        compare_to_source(manifest, files, src)

    # Read-only first: a refusal, or "it will not fit", before creating so much as a directory.
    state = inspect(dst, manifest, replace=opts.replace, name=name)
    if state.kind != "staged":
        capacity.require(
            capacity.measure(dst, opts.reserve),
            _needed(files, manifest, dst),
            f"model {name}",
            _inodes(files),
            opts.shm_size,
        )

    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with target_lock(dst, f"{name} into {dst}", opts.wait):
        return _Stage(src, dst, name, manifest_path, manifest, files, opts, sink).run()


class _Stage:
    def __init__(
        self,
        src: str,
        dst: str,
        name: str,
        manifest_path: str,
        manifest: Manifest | None,
        files: list[SourceFile],
        opts: StageOptions,
        sink: ProgressSink,
    ) -> None:
        self.src, self.dst, self.name = src, dst, name
        self.manifest_path = manifest_path
        self.manifest = manifest
        self.files = files
        self.opts = opts
        self.sink = sink
        self.partial = tree.partial_path(dst)
        warning = weight_warning(src, files)
        self.notes: list[str] = [warning] if warning else []
        self.replacing = False

    def run(self) -> StageResult:
        # Again under the lock: another stage may have finished (or started) since the first look.
        state = inspect(self.dst, self.manifest, replace=self.opts.replace, name=self.name)
        if state.kind == "staged" and (not self.opts.replace or self._still_verifies()):
            self._clean_leftovers()
            return self._result("already-staged", copied=(), resumed=0, seconds=0.0, mode="")
        self._use_target(state)
        resume = self._prepare_partial()
        cap = capacity.measure(self.dst, self.opts.reserve)
        todo = [f for f in self.files if f.path not in resume.files]
        capacity.require(
            cap,
            _still_needed(todo, resume, self.manifest),
            f"model {self.name}",
            _inodes(todo),
            self.opts.shm_size,
        )
        t0 = time.monotonic()
        mode = self._copy(todo, resume, sync_writes=not cap.memory_backed)
        seconds = time.monotonic() - t0
        self._publish()
        self._clean_leftovers()
        return self._result("staged", todo, len(resume.files), seconds, mode, cap.to_dict())

    # --- what is there already ---------------------------------------------------------------

    def _still_verifies(self) -> bool:
        """--replace of a copy that looks staged: re-hash it (tmpfs: memory bandwidth) and swap it
        out only if it does not verify, so that the fix `verify` prints always works."""
        assert self.manifest is not None  # noqa: S101 - "staged" means a manifest matched
        try:
            verify_tree(self.dst, self.manifest, jobs=self.opts.jobs)
        except VerifyError as exc:
            self.notes.append(f"the staged copy did not verify ({exc.message}): restaged")
            self.replacing = True
            return False
        self.notes.append("--replace: the staged copy was re-hashed and verifies; kept it")
        return True

    def _use_target(self, state: TargetState) -> None:
        if state.kind == "empty":
            os.rmdir(self.dst)  # an empty directory holds nothing to protect
        elif state.kind == "replace":
            self.replacing = True
            self.notes.append(f"{self.dst} held {state.detail}")

    def _prepare_partial(self) -> tree.JournalState:
        """Resume our own partial tree of the same manifest; start afresh from anything else."""
        partial = self.partial
        if tree.owned(partial):
            resume, note = resume_partial(partial, self.manifest, self.opts.jobs)
            if resume is not None:
                self.notes.append(note)
                self._prune()
                return resume
            self.notes.append(f"discarded an unusable partial tree at {partial}")
            tree.remove(partial)
        elif os.path.lexists(partial):
            tree.remove_if_empty(partial)
        tree.claim(partial)
        if self.manifest is not None:
            write_atomic(os.path.join(partial, tree.MANIFEST_NAME), self.manifest.to_json())
        return tree.JournalState(set(), {})

    # --- the copy ----------------------------------------------------------------------------

    def _copy(self, todo: list[SourceFile], resume: tree.JournalState, *, sync_writes: bool) -> str:
        algorithm = self.manifest.algorithm if self.manifest else default_algorithm()
        chunk = self.manifest.chunk_size if self.manifest else DEFAULT_CHUNK_SIZE
        for f in todo:
            _create(os.path.join(self.partial, f.path), f.mode, keep=f.path in resume.chunks)
        journal = tree.Journal(self.partial)
        journal.open()
        lock = threading.Lock()

        def chunk_done(job: FileJob, index: int) -> None:
            with lock:
                journal.record_chunk(job.path, index)

        def file_done(job: FileJob, _digests: tuple[str, ...]) -> None:
            with lock:
                journal.record_file(job.path)

        jobs = [self._job(f, resume) for f in todo]
        engine = ChunkEngine(
            algorithm=algorithm,
            chunk_size=chunk,
            jobs=self.opts.jobs,
            read_mode=self.opts.read_mode,
            buffer_size=self.opts.buffer_size,
            drop_cache=self.opts.drop_cache,
            one_writer_per_file=self.opts.one_writer_per_file,
            progress=self.sink.advance,
            sync_writes=sync_writes,
        )
        left = sum(j.size for j in jobs) - sum(len(j.skip) * chunk for j in jobs)
        self.sink.start(f"staging {self.name}", max(0, left))
        try:
            result = engine.run(self.src, jobs, self.partial, file_done, chunk_done)
        finally:
            self.sink.finish()
            journal.close()
        if self.manifest is None:
            self._adopt_manifest(algorithm, chunk, result.digests)
        return "direct" if result.direct_reads else "buffered"

    def _job(self, f: SourceFile, resume: tree.JournalState) -> FileJob:
        entry = self.manifest.file(f.path) if self.manifest else None
        skip = frozenset(resume.chunks.get(f.path, ()))
        expected = entry.chunks if entry else None
        return FileJob(f.path, f.size, expected, skip=skip, identity=f.identity)

    def _adopt_manifest(
        self, algorithm: str, chunk: int, digests: dict[str, tuple[str, ...]]
    ) -> None:
        entries = tuple(FileEntry(f.path, f.size, digests[f.path]) for f in self.files)
        manifest = Manifest(self.name, algorithm, chunk, entries, self.src, now_utc())
        write_atomic(self.manifest_path, manifest.to_json())
        write_atomic(os.path.join(self.partial, tree.MANIFEST_NAME), manifest.to_json())
        self.manifest = manifest
        self.notes.append(
            f"no manifest existed: wrote {self.manifest_path} from this copy "
            "(the source was trusted as it was read)"
        )

    # --- publishing --------------------------------------------------------------------------

    def _prune(self) -> None:
        """Remove from our partial tree whatever is not the manifest's: what the server would
        see must be the model and nothing else (a kill's temporary file, anything put there)."""
        assert self.manifest is not None  # noqa: S101
        removed = tree.prune(self.partial, {f.path for f in self.manifest.files})
        if removed:
            shown = ", ".join(removed[:5]) + (" ..." if len(removed) > 5 else "")
            self.notes.append(f"removed from the partial tree what is not the model's: {shown}")

    def _publish(self) -> None:
        assert self.manifest is not None  # noqa: S101 - set by _copy when it was missing
        self._prune()
        for entry in self.manifest.files:
            st = os.lstat(os.path.join(self.partial, entry.path))
            if not stat.S_ISREG(st.st_mode) or st.st_size != entry.size:
                # Cannot happen unless something else writes into our tree.
                raise SourceError(
                    f"{entry.path}: {st.st_size} bytes after the copy, not {entry.size}",
                    "run the same command again",
                )
        tree.Journal(self.partial).remove()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.partial, tree.OWNER_NAME))  # the marker says it now
        tree.write_marker(
            self.partial,
            self.manifest,
            self.src,
            os.path.abspath(self.manifest_path),
            self._identities(),
        )
        fsync_dir(self.partial)
        if self.replacing and os.path.lexists(self.dst):
            tree.exchange(self.partial, self.dst)  # now the partial name holds the old tree
            self.notes.append(f"replaced the previous contents of {self.dst}")
        else:
            os.rename(self.partial, self.dst)
        fsync_dir(os.path.dirname(self.dst))

    def _identities(self) -> dict[str, tuple[int, int, int, int]]:
        """Each file's identity as published, once no write in the same clock tick as its last
        one could keep its ctime (identity.settled): a later write always shows. The tree's
        rename into place moves no file's ctime."""
        assert self.manifest is not None  # noqa: S101
        rels = [e.path for e in self.manifest.files]
        paths = [os.path.join(self.partial, rel) for rel in rels]
        settled_ids = settled(paths, [stat_identity(p) for p in paths])
        return {
            rel: (i.ino, i.size, i.mtime_ns, i.ctime_ns)
            for rel, i in zip(rels, settled_ids, strict=True)
        }

    def _clean_leftovers(self) -> None:
        # The old tree after a swap, or a partial tree nobody needs now; only ever ours.
        for path in (self.partial, tree.trash_path(self.dst)):
            if tree.owned(path):
                tree.remove(path)
            elif os.path.lexists(path):
                tree.remove_if_empty(path)

    def _result(
        self,
        outcome: str,
        copied: list[SourceFile] | tuple[()],
        resumed: int,
        seconds: float,
        mode: str,
        cap: dict[str, object] | None = None,
    ) -> StageResult:
        assert self.manifest is not None  # noqa: S101
        m = self.manifest
        return StageResult(
            outcome=outcome,
            name=self.name,
            source=self.src,
            target=self.dst,
            manifest_path=self.manifest_path,
            manifest_digest=m.digest,
            algorithm=m.algorithm,
            files=len(m.files),
            bytes=m.total_bytes,
            files_copied=len(copied),
            files_resumed=resumed,
            bytes_copied=sum(f.size for f in copied),
            seconds=round(seconds, 3),
            read_mode=mode,
            replaced=self.replacing,
            capacity=cap,
            notes=tuple(self.notes),
        )


def _needed(files: list[SourceFile], manifest: Manifest | None, dst: str) -> int:
    partial = tree.partial_path(dst)
    resume = tree.JournalState(set(), {})
    if manifest is not None and os.path.isdir(partial):
        resume = tree.Journal(partial).read()  # unlocked peek: only lowers the estimate
    todo = [f for f in files if f.path not in resume.files]
    return _still_needed(todo, resume, manifest)


def _still_needed(todo: list[SourceFile], resume: tree.JournalState, m: Manifest | None) -> int:
    """Bytes the copy will still add: chunks a partial tree holds are already charged."""
    chunk = m.chunk_size if m is not None else DEFAULT_CHUNK_SIZE
    need = capacity.bytes_needed([f.size for f in todo])
    held = sum(min(len(resume.chunks.get(f.path, ())) * chunk, f.size) for f in todo)
    return max(0, need - held)


def _inodes(files: list[SourceFile]) -> int:
    """Inodes the copy takes: files, their directories, our own files and a temporary one."""
    dirs = {os.path.dirname(f.path) for f in files} - {""}
    parents = {"/".join(d.split("/")[:i]) for d in dirs for i in range(1, d.count("/") + 2)}
    return len(files) + len(parents) + 1 + len(tree.OWN_NAMES) + 1


def _refuse_overlap(src: str, dst: str) -> None:
    if dst == src or dst.startswith(src + os.sep) or src.startswith(dst + os.sep):
        raise RefusedError(
            f"source {src} and target {dst} overlap",
            "stage into a directory outside the source (and the source outside the target)",
        )


def _create(path: str, mode: int, *, keep: bool = False) -> None:
    # No posix_fallocate: done up front it allocates every page in this one thread (measured
    # ~0.1 s/GB here, as long as the copy itself at NVMe RAID speed), while the writers allocate
    # in parallel. The capacity check has already answered "will it fit"; a later ENOSPC is a
    # CapacityError and the next run resumes.
    # keep: verified chunks of an interrupted run are in it; everything else is rewritten.
    os.makedirs(os.path.dirname(path), exist_ok=True)
    trunc = 0 if keep else os.O_TRUNC
    flags = os.O_WRONLY | os.O_CREAT | trunc | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, mode | 0o400)
    finally:
        os.close(fd)
