"""The copy engine: read a chunk, hash it, check it, write it; many chunks at once.

Work is cut into chunks (64 MiB) handed out in file order to a pool of threads, so one huge shard
uses every thread and a kill loses only the few files in flight. Each thread reads into its own
page-aligned buffer, hashes the bytes it holds (verification costs no second pass) and writes the
same buffer to the destination. Threads suffice: read, write and the hash release the GIL.
Writes to one destination file take turns on a lock of ours: the kernel runs them one at a time
anyway (tmpfs holds the inode's rwsem across a write), and a thread that waits for that rwsem
spins on a CPU while the holder runs, which with many threads per file cost more CPU than the
copy itself (issue 22; docs/staging.md). copy_file_range, sendfile and splice are not used: the
bytes would go from the source's page cache to the target without passing through our buffer, so
what is hashed (a read of our own) would not be what is written.

Reads go through the page cache by default, each thread streaming a run of chunks through one
descriptor so that readahead keeps the disk busy while the thread hashes and writes; each chunk's
pages are dropped (POSIX_FADV_DONTNEED) once it is done, because page cache is charged to the same
memory cgroup as the tmpfs we are filling. O_DIRECT ("direct", or "auto": where the filesystem
allows) skips the page cache entirely; on the virtio disks measured it was 10-15% slower, since each
thread then has one synchronous read in flight instead of readahead's asynchronous ones.
The source is opened O_RDONLY|O_NOATIME: staging never changes it, not even its atime.

A source file may change while it is read (a download still running, a writer in place). Where the
job gives the file's identity from before the reads (size, mtime, ctime, inode: see `identity`),
each descriptor is checked against it when opened and the path once more after the file's last
chunk; a file that changed is read again from the start, a few times at most, and then refused. So
the chunk hashes of a file (and the copy they describe) are always of one version of it.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from ct200_tools.stage.errors import CapacityError, SourceError, StageError, VerifyError
from ct200_tools.stage.hashing import Hasher, new_hasher
from ct200_tools.stage.identity import Identity, settled, stat_identity
from ct200_tools.stage.manifest import chunk_count

ReadMode = Literal["auto", "direct", "buffered"]
READ_MODES: tuple[ReadMode, ...] = ("auto", "direct", "buffered")
#: O_DIRECT wants offsets, lengths and buffers aligned to the logical block size (512 or 4096).
ALIGN = 4096
#: Per thread, for reads through the page cache: readahead, not the read size, keeps the disk
#: busy; a buffer that fits the core's L2 is copied in, hashed and copied out without a trip to
#: RAM in between, and 16 threads hold 16 MiB, not 256 (16 MiB measured no faster:
#: docs/staging.md).
DEFAULT_BUFFER = 1 << 20
#: Per thread, with O_DIRECT: each thread has one read in flight, so jobs x buffer is the queue
#: depth the disk sees; 16 threads x 16 MiB measured best on virtio (docs/staging.md).
DIRECT_BUFFER = 16 << 20

Progress = Callable[[int], None]
T = TypeVar("T")
FileDone = Callable[["FileJob", tuple[str, ...]], None]
ChunkDone = Callable[["FileJob", int], None]
#: Longest run of chunks one thread reads in a row (1 GiB of 64 MiB chunks).
MAX_RANGE_CHUNKS = 16
#: Reads of a file that keeps changing before it is refused (each one a whole pass over it).
MAX_READS = 3


@dataclass(frozen=True)
class FileJob:
    path: str
    size: int
    #: Chunk hashes to check against; None computes them (making a manifest).
    expected: tuple[str, ...] | None = None
    #: Also compute the whole file's sha256 (one sequential pass; for the LFS cross-check).
    sha256: bool = False
    #: Chunks verified by an earlier run (resume): neither read nor written again.
    skip: frozenset[int] = frozenset()
    #: The source file's identity before any read; None: do not check it (a staged copy).
    identity: Identity | None = None


@dataclass
class EngineResult:
    digests: dict[str, tuple[str, ...]] = field(default_factory=dict)
    sha256: dict[str, str] = field(default_factory=dict)
    bytes: int = 0
    direct_reads: bool = False


@dataclass
class _FileState:
    job: FileJob
    digests: list[str]
    remaining: int
    #: What the current read of the file is checked against (re-taken when it is read again).
    identity: Identity | None
    reads: int = 1
    #: A task of the current read saw the file differ from `identity`.
    changed: bool = False
    #: Held around each write to the destination file: the kernel serialises writes to one file
    #: anyway (tmpfs takes the inode's rwsem), and threads waiting for it there spin on a CPU;
    #: here they sleep (docs/staging.md, "Where the time goes").
    write_lock: AbstractContextManager[object] = field(default_factory=threading.Lock)


@dataclass(frozen=True)
class _Task:
    file: int
    first_chunk: int
    last_chunk: int  # exclusive


@dataclass
class _Run:
    src_root: str
    dst_root: str | None
    on_file_done: FileDone | None
    on_chunk_done: ChunkDone | None
    states: list[_FileState]
    tasks: deque[_Task]
    result: EngineResult


class _Abort(Exception):
    pass


class ChunkEngine:
    def __init__(
        self,
        *,
        algorithm: str,
        chunk_size: int,
        jobs: int,
        read_mode: ReadMode = "buffered",
        buffer_size: int | None = None,
        drop_cache: bool = True,
        progress: Progress | None = None,
        keep_going: bool = False,
        sync_writes: bool = False,
        one_writer_per_file: bool = True,
    ) -> None:
        if buffer_size is None:
            buffer_size = DEFAULT_BUFFER if read_mode == "buffered" else DIRECT_BUFFER
        if chunk_size % ALIGN or buffer_size % ALIGN:
            raise ValueError("chunk and buffer sizes must be multiples of 4096")
        new_hasher(algorithm)  # fail now, not in a thread
        self.algorithm = algorithm
        self.chunk_size = chunk_size
        self.jobs = max(1, jobs)
        self.read_mode: ReadMode = read_mode
        self.buffer_size = min(buffer_size, chunk_size)
        self.drop_cache = drop_cache
        self.progress = progress or (lambda _n: None)
        #: Report every mismatching chunk instead of stopping at the first (verification).
        self.keep_going = keep_going
        #: fdatasync each chunk before reporting it done (targets on disk; tmpfs needs none).
        self.sync_writes = sync_writes
        #: False only to measure what the per-file write lock buys (benchmarks: ct200-nolock).
        self.one_writer_per_file = one_writer_per_file
        self._mismatches: list[VerifyError] = []
        self._direct = read_mode != "buffered"
        self._lock = threading.Lock()
        self._abort = threading.Event()
        self._errors: list[BaseException] = []
        self._run_len = 1

    def run(
        self,
        src_root: str,
        files: Sequence[FileJob],
        dst_root: str | None = None,
        on_file_done: FileDone | None = None,
        on_chunk_done: ChunkDone | None = None,
    ) -> EngineResult:
        """Process every file; raises the first StageError (with the others as details).

        on_chunk_done(job, chunk) runs once a chunk matched and was written (and synced, with
        sync_writes); on_file_done(job, digests) once all of a file's chunks did.
        """
        self._abort.clear()
        self._errors = []
        self._mismatches = []
        states = [_FileState(j, _prefilled(j, self.chunk_size), 0, j.identity) for j in files]
        if not self.one_writer_per_file:
            for state in states:
                state.write_lock = contextlib.nullcontext()
        tasks = self._tasks(states)
        run = _Run(src_root, dst_root, on_file_done, on_chunk_done, states, tasks, EngineResult())
        pending = len(tasks)
        threads = [
            threading.Thread(target=self._worker, args=(run,), name=f"stage-{i}", daemon=True)
            for i in range(min(self.jobs, max(1, pending)))
        ]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(0.2)
        except BaseException:
            self._abort.set()
            for t in threads:
                t.join()
            raise
        if self._errors or self._mismatches:
            raise self._combined_error()
        if self._abort.is_set():
            raise StageError("cancelled", "run the same command again; verified files are kept")
        return run.result

    def _worker(self, run: _Run) -> None:
        buf = mmap.mmap(-1, self.buffer_size)  # page-aligned, as O_DIRECT requires
        view = memoryview(buf)
        try:
            while not self._abort.is_set():
                with self._lock:
                    task = run.tasks.popleft() if run.tasks else None
                if task is None:
                    return
                self._run_task(run, task, view)
        except _Abort:
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread, which raises it
            with self._lock:
                self._errors.append(exc)
            self._abort.set()
        finally:
            # A traceback held by a collected error may still reference slices of the buffer;
            # then the garbage collector frees it later instead.
            with contextlib.suppress(BufferError):
                view.release()
                buf.close()

    def _run_task(self, run: _Run, task: _Task, view: memoryview) -> None:
        state = run.states[task.file]
        read = self._do_task(run, state, task, view)
        with self._lock:
            if read is None:
                state.changed = True
            else:
                digests, sha, direct = read
                state.digests[task.first_chunk : task.last_chunk] = digests
                if sha is not None:
                    run.result.sha256[state.job.path] = sha
                run.result.direct_reads |= direct
                run.result.bytes += _task_bytes(state.job, task, self.chunk_size)
            state.remaining -= 1
            if state.remaining:
                return
        if not self._one_version(run, task.file):
            return  # read again
        with self._lock:
            done = tuple(state.digests)
            run.result.digests[state.job.path] = done
        if run.on_file_done is not None:
            run.on_file_done(state.job, done)

    def _one_version(self, run: _Run, index: int) -> bool:
        """After a file's last chunk: True when every read saw one version of it; else queue it to
        be read again (False), or raise when it keeps changing or changed size."""
        state = run.states[index]
        if state.identity is None:
            return True
        rel = state.job.path
        path = os.path.join(run.src_root, rel)
        try:
            now = stat_identity(path)
        except FileNotFoundError as exc:
            raise _disappeared(rel) from exc
        if not state.changed and now == state.identity:
            return True
        if now.size != state.job.size:
            raise SourceError(
                f"source file {rel} changed while it was read: {state.job.size} bytes when the "
                f"stage began, {now.size} now",
                "let whatever writes to it finish (or stop it), then run the same command again",
            )
        if state.reads >= MAX_READS:
            raise SourceError(
                f"source file {rel} changed while it was read, {state.reads} times in a row",
                "stop whatever writes to it, then run the same command again",
            )
        try:
            [identity] = settled([path], [now])
        except FileNotFoundError as exc:
            raise _disappeared(rel) from exc
        with self._lock:
            state.identity = identity
            state.reads += 1
            state.changed = False
            again = self._file_tasks(index, state)
            state.remaining = len(again)
            run.tasks.extend(again)
        return False

    def _tasks(self, states: list[_FileState]) -> deque[_Task]:
        # Runs of consecutive chunks, in file order: each thread reads a run sequentially through
        # one descriptor (readahead and the disk see a stream, as with N parallel cats), runs are
        # short enough to balance the threads at the end, and a file that needs a whole-file
        # sha256 is one run.
        total = sum(len(s.digests) - len(s.job.skip) for s in states)
        self._run_len = max(1, min(MAX_RANGE_CHUNKS, total // (2 * self.jobs)))
        plan: deque[_Task] = deque()
        for i, state in enumerate(states):
            tasks = self._file_tasks(i, state)
            state.remaining = len(tasks)
            plan.extend(tasks)
        return plan

    def _file_tasks(self, index: int, state: _FileState) -> list[_Task]:
        chunks = [c for c in range(len(state.digests)) if c not in state.job.skip]
        if not chunks or state.job.sha256:
            return [_Task(index, chunks[0] if chunks else 0, chunks[-1] + 1 if chunks else 0)]
        plan = []
        first = prev = chunks[0]
        for c in chunks[1:]:
            if c != prev + 1 or c - first >= self._run_len:
                plan.append(_Task(index, first, prev + 1))
                first = c
            prev = c
        plan.append(_Task(index, first, prev + 1))
        return plan

    def _do_task(
        self, run: _Run, state: _FileState, task: _Task, view: memoryview
    ) -> tuple[list[str], str | None, bool] | None:
        """Read, hash, check and write the task's chunks; None when the source file is no longer
        the version this read of it began with (it is read again)."""
        job = state.job
        dst_root = run.dst_root
        src_path = os.path.join(run.src_root, job.path)
        end = min(job.size, task.last_chunk * self.chunk_size)
        sha = _sha256() if job.sha256 else None
        digests: list[str] = []
        src = _Source(self, src_path, job.path)
        dst_fd = -1
        try:
            if state.identity is None:
                src.check_size(job.size)
            elif src.identity() != state.identity:
                return None
            if dst_root is not None:
                dst_fd = _write_call(
                    job.path, os.open, os.path.join(dst_root, job.path), os.O_WRONLY | os.O_CLOEXEC
                )
            for chunk in range(task.first_chunk, task.last_chunk):
                pos = chunk * self.chunk_size
                chunk_end = min(end, pos + self.chunk_size)
                digests.append(
                    self._chunk(src, view, pos, chunk_end, sha, dst_fd, state.write_lock)
                )
                try:
                    self._check(job, chunk, digests[-1])
                except VerifyError as exc:
                    if state.identity is not None and src.identity() != state.identity:
                        return None  # not damage: a writer; the file is read again
                    if not self.keep_going:
                        raise
                    with self._lock:
                        self._mismatches.append(exc)
                    continue
                if dst_fd >= 0 and self.sync_writes:
                    _write_call(job.path, os.fdatasync, dst_fd)
                if run.on_chunk_done is not None:
                    run.on_chunk_done(job, chunk)
        finally:
            src.close()
            if dst_fd >= 0:
                os.close(dst_fd)
        return digests, (sha.hexdigest() if sha is not None else None), src.direct

    def _chunk(
        self,
        src: _Source,
        view: memoryview,
        pos: int,
        end: int,
        sha: Hasher | None,
        dst_fd: int,
        write_lock: AbstractContextManager[object],
    ) -> str:
        """Copy bytes pos..end of one chunk (to dst_fd unless -1); return the chunk's hash."""
        start = pos
        hasher = new_hasher(self.algorithm)
        while pos < end:
            if self._abort.is_set():
                raise _Abort
            data = src.read(view, pos, min(self.buffer_size, end - pos))
            hasher.update(data)
            if sha is not None:
                sha.update(data)
            if dst_fd >= 0:
                with write_lock:
                    _write_call(src.rel, _pwrite_all, dst_fd, data, pos)
            pos += len(data)
            self.progress(len(data))
        src.done(start, end)
        return hasher.hexdigest()

    def _open_flags(self) -> int:
        direct = getattr(os, "O_DIRECT", 0) if self._direct else 0
        return os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOATIME", 0) | direct

    def _no_direct(self) -> bool:
        """O_DIRECT failed here: give it up for this run, unless the user insisted on it."""
        if self.read_mode == "direct":
            return False
        self._direct = False
        return True

    def _check(self, job: FileJob, chunk: int, digest: str) -> None:
        if job.expected is None or job.expected[chunk] == digest:
            return
        lo = chunk * self.chunk_size
        hi = min(job.size, lo + self.chunk_size)
        raise VerifyError(
            f"{job.path}: bytes {lo}-{hi} (chunk {chunk}) do not match the manifest",
            "the persistent copy is damaged or changed since the manifest: restore that file "
            "(e.g. download it again), check it with ct200-stage verify SRC, then stage again",
        )

    def _combined_error(self) -> BaseException:
        errors = [*self._errors, *self._mismatches]
        staged = [e for e in errors if isinstance(e, StageError)]
        if len(staged) != len(errors):
            return next(e for e in errors if not isinstance(e, StageError))
        first = staged[0]
        # A full destination is one fact, however many threads were writing when it filled up.
        rest = [e for e in staged[1:] if not isinstance(e, CapacityError)]
        others = tuple(dict.fromkeys(e.message for e in rest))
        if others:
            first.details = (*first.details, *others)
        return first


class _Source:
    """One open source file: O_DIRECT when allowed, falling back to buffered reads."""

    def __init__(self, engine: ChunkEngine, path: str, rel: str) -> None:
        self.engine = engine
        self.path = path
        self.rel = rel
        self._flags = 0
        self.fd = self._open(engine._open_flags())

    @property
    def direct(self) -> bool:
        return bool(self._flags & getattr(os, "O_DIRECT", 0))

    def _open(self, flags: int) -> int:
        noatime = getattr(os, "O_NOATIME", 0)
        direct = getattr(os, "O_DIRECT", 0)
        while True:
            try:
                fd = os.open(self.path, flags)
            except FileNotFoundError as exc:
                raise _disappeared(self.rel) from exc
            except OSError as exc:
                if exc.errno == errno.EPERM and flags & noatime:
                    flags &= ~noatime  # O_NOATIME needs ownership of the file or CAP_FOWNER
                    continue
                if exc.errno == errno.EINVAL and flags & direct and self.engine._no_direct():
                    flags &= ~direct
                    continue
                raise SourceError(
                    f"cannot open source file {self.rel}: {exc.strerror}",
                    "check the file and its permissions",
                ) from exc
            self._flags = flags
            if not flags & direct:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            return fd

    def check_size(self, size: int) -> None:
        now = os.fstat(self.fd).st_size
        if now != size:
            raise SourceError(
                f"source file {self.rel} is {now} bytes, the manifest says {size} "
                "(it changed during the stage)",
                "restore the persistent copy or remake the manifest, then stage again",
            )

    def identity(self) -> Identity:
        return Identity.of(os.fstat(self.fd))

    def read(self, view: memoryview, pos: int, want: int) -> memoryview:
        direct = self.direct
        while True:
            try:
                n = os.preadv(self.fd, [view[: _align_up(want) if direct else want]], pos)
                break
            except OSError as exc:
                if direct and exc.errno == errno.EINVAL and self.engine._no_direct():
                    # Accepted O_DIRECT at open, refused it on read (some FUSE and network
                    # filesystems): continue buffered.
                    os.close(self.fd)
                    self.fd = self._open(self._flags & ~getattr(os, "O_DIRECT", 0))
                    direct = False
                    continue
                raise SourceError(
                    f"cannot read source file {self.rel} at byte {pos}: {exc.strerror}",
                    "check the source disk (dmesg, filesystem health), then run again",
                ) from exc
        if n <= 0:
            raise SourceError(
                f"source file {self.rel} ended at byte {pos}, before the manifest's size "
                "(it was truncated during the stage)",
                "restore the persistent copy and run the same command again",
            )
        return view[: min(n, want)]

    def done(self, start: int, end: int) -> None:
        # Buffered reads leave the source in the page cache, charged to our memory cgroup next to
        # the tmpfs we fill; we will not read it again.
        if self.engine.drop_cache and not self.direct and end > start:
            os.posix_fadvise(self.fd, start, end - start, os.POSIX_FADV_DONTNEED)

    def close(self) -> None:
        os.close(self.fd)


def _disappeared(rel: str) -> SourceError:
    return SourceError(
        f"source file {rel} disappeared (it was there when the stage began)",
        "restore the persistent copy and run the same command again",
    )


def _sha256() -> Hasher:
    import hashlib  # noqa: PLC0415 - only the LFS cross-check needs it

    return hashlib.sha256()


def _task_bytes(job: FileJob, task: _Task, chunk_size: int) -> int:
    return max(0, min(job.size, task.last_chunk * chunk_size) - task.first_chunk * chunk_size)


def _prefilled(job: FileJob, chunk_size: int) -> list[str]:
    digests = [""] * chunk_count(job.size, chunk_size)
    if job.skip:
        if job.expected is None:
            raise ValueError(f"{job.path}: chunks can only be skipped against expected hashes")
        for c in job.skip:
            digests[c] = job.expected[c]
    return digests


def _align_up(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _pwrite_all(fd: int, data: memoryview, pos: int) -> None:
    while data:
        n = os.pwrite(fd, data, pos)
        data = data[n:]
        pos += n


def _write_call(rel: str, fn: Callable[..., T], *args: object) -> T:
    try:
        return fn(*args)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise CapacityError(
                f"the destination filled up while writing {rel}",
                "free space on the destination (raise the tmpfs size or memory limit) and run the "
                "same command again; verified files are kept",
            ) from exc
        if exc.errno == errno.ENOMEM:
            raise CapacityError(
                f"out of memory while writing {rel} (the memory cgroup limit?)",
                "raise the container's memory limit or stage fewer models, then run again",
            ) from exc
        raise StageError(
            f"cannot write {rel} to the destination: {exc.strerror or exc}",
            "check the destination filesystem, then run the same command again",
        ) from exc
