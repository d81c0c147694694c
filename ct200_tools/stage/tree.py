"""The names and small files that make a directory a staged model, and the resume journal.

A staged tree `DST` holds the model plus `.ct200-manifest.json` (a copy of the manifest it was
checked against) and `.ct200-staged` (the marker: the manifest's digest, when and from where).
It is built in `.DST.ct200-partial` beside it and renamed into place whole; a directory whose marker
is missing or does not match its manifest is never "staged".

Ownership: the tool deletes or swaps out only trees it made, and says so by a file of its own at
their top: a partial tree gets `.ct200-owner` the moment it is created, a staged tree carries its
marker and manifest. Anything else (a directory of other models, files someone put there) is
refused, not removed.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import os
import shutil
import socket
import stat
from dataclasses import dataclass, field

from ct200_tools import __version__
from ct200_tools.fsutil import fsync_dir, write_atomic
from ct200_tools.stage.errors import RefusedError
from ct200_tools.stage.manifest import Manifest, now_utc
from ct200_tools.untrusted import UntrustedInputError, parse_json, read_bounded

MANIFEST_NAME = ".ct200-manifest.json"
MARKER_NAME = ".ct200-staged"
JOURNAL_NAME = ".ct200-journal"
OWNER_NAME = ".ct200-owner"
MARKER_KIND = "ct200-stage-marker"
#: The files of ours that may sit at the top of a tree; their presence is the claim of ownership.
OWN_NAMES = (MANIFEST_NAME, MARKER_NAME, JOURNAL_NAME, OWNER_NAME)
#: A marker is a few hundred bytes; a journal a line per chunk (about 1.5 MB for 1 TB in 64 MiB
#: chunks). Larger files are not ours: refused unread.
MAX_MARKER_BYTES = 1 << 20
MAX_JOURNAL_BYTES = 64 << 20


def partial_path(target: str) -> str:
    parent, name = os.path.split(os.path.abspath(target))
    return os.path.join(parent, f".{name}.ct200-partial")


def trash_path(target: str) -> str:
    parent, name = os.path.split(os.path.abspath(target))
    return os.path.join(parent, f".{name}.ct200-trash")


def owned(path: str) -> bool:
    """True for a real directory (not a link) that carries one of our own files at its top."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return False
    except OSError:
        return False
    return any(os.path.lexists(os.path.join(path, n)) for n in OWN_NAMES)


def claim(path: str) -> None:
    """Create the directory and mark it ours at once: a kill between the two leaves it empty."""
    os.mkdir(path, 0o755)
    fd = os.open(os.path.join(path, OWNER_NAME), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, json.dumps({"kind": "ct200-stage-partial", "pid": os.getpid()}).encode())
    finally:
        os.close(fd)


def prune(root: str, keep: set[str]) -> list[str]:
    """Remove everything under root but the relative paths in `keep` (and their directories) and
    our own top-level files; return what was removed. Links are removed, never followed."""
    dirs = {"/".join(p.split("/")[:i]) for p in keep for i in range(1, p.count("/") + 1)}
    removed: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            path = os.path.join(dirpath, name)
            if (rel in keep and stat.S_ISREG(os.lstat(path).st_mode)) or (
                not rel_dir and name in OWN_NAMES
            ):
                continue
            os.unlink(path)
            removed.append(rel)
        if rel_dir and rel_dir not in dirs:
            os.rmdir(dirpath)  # its files went above, its subdirectories before it
            removed.append(rel_dir + "/")
    return removed


@dataclass(frozen=True)
class Marker:
    manifest_digest: str
    name: str
    source: str
    staged_at: str
    files: int
    bytes: int
    #: The source's manifest it was staged with, so that a restage command can be printed whole.
    manifest_path: str = ""
    #: Each published file's (st_ino, st_size, st_mtime_ns, st_ctime_ns) as staged: any later
    #: write moves its ctime, which no user can set back, so one stat per file tells a copy
    #: changed since staging (same size included) without re-hashing it. Empty: an older marker.
    identities: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)


def file_identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def write_marker(
    tree: str,
    manifest: Manifest,
    source: str,
    manifest_path: str = "",
    identities: dict[str, tuple[int, int, int, int]] | None = None,
) -> Marker:
    marker = Marker(
        manifest.digest,
        manifest.name,
        source,
        now_utc(),
        len(manifest.files),
        manifest.total_bytes,
        manifest_path,
        dict(identities or {}),
    )
    body = {"kind": MARKER_KIND, **marker.__dict__, "host": socket.gethostname()}
    body["tool"] = f"ct200-tools {__version__}"
    write_atomic(os.path.join(tree, MARKER_NAME), json.dumps(body, indent=1) + "\n")
    return marker


def read_marker(tree: str) -> Marker | None:
    """The marker, or None when absent; raises ValueError when present but unreadable as one."""
    try:
        data = read_bounded(os.path.join(tree, MARKER_NAME), "marker", MAX_MARKER_BYTES, "")
    except UntrustedInputError as exc:
        if exc.problem == "missing":
            return None
        raise ValueError(exc.message) from None  # a FIFO or a device: refused, never waited on
    return parse_marker(data)


def parse_marker(text: str | bytes) -> Marker:
    """A marker file's text: the one reading of its format (the doctor's probe reads the file
    through its Reader and parses it here). Raises ValueError (or KeyError, TypeError) when it
    is not a marker."""
    try:
        raw = parse_json(text, "marker", "", max_depth=4)
    except UntrustedInputError as exc:
        raise ValueError(exc.reason.removeprefix("is ")) from None
    if not isinstance(raw, dict) or raw.get("kind") != MARKER_KIND:
        raise ValueError("not a ct200-stage marker")
    return Marker(
        str(raw["manifest_digest"]),
        str(raw.get("name", "")),
        str(raw.get("source", "")),
        str(raw.get("staged_at", "")),
        int(raw.get("files", 0)),
        int(raw.get("bytes", 0)),
        str(raw.get("manifest_path", "")),
        _identities(raw.get("identities", {})),
    )


def _identities(raw: object) -> dict[str, tuple[int, int, int, int]]:
    """The marker's file identities; ValueError when present but not {path: [4 ints]}."""
    if not isinstance(raw, dict):
        raise ValueError("its identities are not an object")
    out: dict[str, tuple[int, int, int, int]] = {}
    for path, value in raw.items():
        if not isinstance(value, list) or len(value) != 4 or not all(type(v) is int for v in value):
            raise ValueError(f"its identity of {path!r} is not four integers")
        out[str(path)] = (value[0], value[1], value[2], value[3])
    return out


@dataclass
class JournalState:
    #: Files whose every chunk was verified (and synced).
    files: set[str]
    #: Chunks verified (and synced) per file, for files not yet complete.
    chunks: dict[str, set[int]]


class Journal:
    """Append-only record of chunks and files fully written and verified in a partial tree.

    A line is appended (and fsynced) only after a chunk matched the manifest and its data was
    written (and, on a disk target, synced), so after a kill every recorded chunk is good and every
    other chunk is redone; a torn last line is simply not a record.
    """

    def __init__(self, tree: str) -> None:
        self.path = os.path.join(tree, JOURNAL_NAME)
        self._fd = -1

    def read(self) -> JournalState:
        state = JournalState(set(), {})
        try:
            data = read_bounded(self.path, "journal", MAX_JOURNAL_BYTES, "")
        except UntrustedInputError:
            # Absent, or not a file we wrote (a FIFO, a device, too large): nothing is vouched
            # for, so every chunk is copied again.
            return state
        for line in data.decode("utf-8", errors="replace").split("\n")[:-1]:
            suppressed = (ValueError, TypeError, KeyError, AttributeError, RecursionError)
            with contextlib.suppress(*suppressed):
                rec = json.loads(line)
                if "chunk" in rec:
                    state.chunks.setdefault(str(rec["path"]), set()).add(int(rec["chunk"]))
                else:
                    state.files.add(str(rec["path"]))
        return state

    def open(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def record_chunk(self, path: str, chunk: int) -> None:
        self._append({"path": path, "chunk": chunk})

    def record_file(self, path: str) -> None:
        self._append({"path": path})

    def _append(self, record: dict[str, object]) -> None:
        # One write(2) per line: a kill lands before or after it, never inside a line.
        os.write(self._fd, (json.dumps(record) + "\n").encode())
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def remove(self) -> None:
        self.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        fsync_dir(os.path.dirname(self.path))


def remove(path: str) -> None:
    """Remove one of our trees (the caller checked `owned`), or a file or link of our names."""
    if os.path.islink(path) or not os.path.isdir(path):
        os.unlink(path)
    else:
        shutil.rmtree(path)


def remove_if_empty(path: str) -> None:
    """A directory at one of our names that we did not make: used if empty, else refused."""
    try:
        os.rmdir(path)
    except OSError as exc:
        raise RefusedError(
            f"{path} exists and was not made by ct200-stage ({exc.strerror}); refusing to touch it",
            f"move it away yourself: mv {path} {path}.old",
        ) from exc


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(a: str, b: str) -> None:
    """Swap two directories in one step (renameat2 RENAME_EXCHANGE): a server looking at b sees
    the old tree or the new, never nothing. Falls back to two renames where unsupported."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is not None:
        rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
        if rc == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), b)
    trash = trash_path(b)
    os.rename(b, trash)
    os.rename(a, b)
    os.rename(trash, a)
