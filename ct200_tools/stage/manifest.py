"""The manifest: a model's files, their sizes and content hashes, and one digest over it all.

A file's content is hashed in fixed-size chunks (64 MiB by default) and the manifest keeps every
chunk's hash. Chunking is what lets the copy engine split one huge shard across all threads and
still check every byte inline; a whole-file hash would have to be computed in order.

The digest (`sha256:` over a canonical JSON of the algorithm, chunk size and files) names the
content: two manifests of the same bytes have the same digest wherever the model sits and whoever
made them, which is what the marker in a staged tree records.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import PurePosixPath
from typing import Any, Protocol

from ct200_tools.stage.errors import SourceError
from ct200_tools.stage.hashing import ALGORITHMS
from ct200_tools.stage.identity import Identity, settled
from ct200_tools.untrusted import UntrustedInputError, parse_json, read_bounded, show

SCHEMA_VERSION = 1
KIND = "ct200-stage-manifest"
DEFAULT_CHUNK_SIZE = 64 << 20
#: Where manifests live, so that the persistent copy itself is never written to.
DEFAULT_MANIFEST_DIR = "/var/lib/ct200/manifests"
MANIFEST_DIR_ENV = "CT200_MANIFEST_DIR"
#: Our own files inside a staged tree; never part of a model.
OWN_PREFIX = ".ct200-"
#: The most a manifest file may be: a 1 TB model in the default 64 MiB chunks is about 1.1 MB of
#: hashes; this bound holds one in 1 MiB chunks.
MAX_MANIFEST_BYTES = 256 << 20
#: A manifest nests three levels ({files: [{chunks: [...]}]}); anything deeper is not one.
MAX_MANIFEST_DEPTH = 8
#: Top-level directories of a model checkout that are bookkeeping, not model: Hugging Face's
#: download cache (`.cache/huggingface`) and a git clone's object store (twice the model's size).
EXCLUDED_TOP_DIRS = (".cache", ".git")
#: What model weights are stored as; a "model" with none of these is probably the wrong directory.
WEIGHT_SUFFIXES = (
    ".safetensors",
    ".bin",
    ".gguf",
    ".ggml",
    ".pt",
    ".pth",
    ".ckpt",
    ".h5",
    ".msgpack",
    ".onnx",
    ".npz",
    ".nemo",
)


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    chunks: tuple[str, ...]
    #: Set when the file was checked against Hugging Face's LFS sha256 while the manifest was made.
    sha256: str | None = None

    def identity(self) -> dict[str, object]:
        return {"path": self.path, "size": self.size, "chunks": list(self.chunks)}


@dataclass(frozen=True)
class Manifest:
    name: str
    algorithm: str
    chunk_size: int
    files: tuple[FileEntry, ...]
    source: str = ""
    created: str = ""
    schema_version: int = SCHEMA_VERSION

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @cached_property
    def digest(self) -> str:
        identity = {
            "schema_version": self.schema_version,
            "algorithm": self.algorithm,
            "chunk_size": self.chunk_size,
            "files": [f.identity() for f in self.files],
        }
        canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()

    @cached_property
    def _index(self) -> dict[str, FileEntry]:
        return {f.path: f for f in self.files}

    def file(self, path: str) -> FileEntry | None:
        return self._index.get(path)

    def to_dict(self) -> dict[str, object]:
        files: list[dict[str, object]] = []
        for f in self.files:
            entry = f.identity()
            if f.sha256:
                entry["sha256"] = f.sha256
            files.append(entry)
        return {
            "schema_version": self.schema_version,
            "kind": KIND,
            "name": self.name,
            "source": self.source,
            "created": self.created,
            "hash": {"algorithm": self.algorithm, "chunk_size": self.chunk_size},
            "file_count": len(self.files),
            "total_bytes": self.total_bytes,
            "files": files,
            "digest": self.digest,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=False) + "\n"


def chunk_count(size: int, chunk_size: int) -> int:
    return -(-size // chunk_size)


def now_utc() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_relpath(path: str) -> str:
    """A manifest path must stay inside the tree: no absolute paths, no '..', no our own names."""
    pure = PurePosixPath(path)
    if (
        not path
        or pure.is_absolute()
        or any(part in ("", ".", "..") for part in path.split("/"))
        or pure.parts[0].startswith(OWN_PREFIX)
    ):
        raise ValueError(f"unsafe or reserved path in manifest: {path!r}")
    return path


def parse_manifest(text: str | bytes, origin: str) -> Manifest:
    """Parse and check a manifest; anything off (including a wrong digest) is a SourceError."""
    fix = f"recreate it: ct200-stage manifest SRC --manifest {origin} --force"
    try:
        raw: Any = parse_json(text, f"manifest {show(origin)}", fix, MAX_MANIFEST_DEPTH)
    except UntrustedInputError as exc:
        raise SourceError(exc.message, fix) from None
    try:
        if raw.get("kind") != KIND:
            raise ValueError("not a ct200-stage manifest")
        if raw.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"schema_version {raw.get('schema_version')} is not {SCHEMA_VERSION}")
        algorithm = str(raw["hash"]["algorithm"])
        chunk_size = int(raw["hash"]["chunk_size"])
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown hash algorithm {algorithm!r}")
        if chunk_size <= 0 or chunk_size % 4096:
            raise ValueError(f"chunk_size {chunk_size} is not a positive multiple of 4096")
        files = []
        for item in raw["files"]:
            size = int(item["size"])
            chunks = tuple(str(c) for c in item["chunks"])
            if size < 0 or len(chunks) != chunk_count(size, chunk_size):
                raise ValueError(f"{item['path']}: {len(chunks)} chunk hashes for {size} bytes")
            sha = item.get("sha256")
            files.append(FileEntry(check_relpath(str(item["path"])), size, chunks, sha))
        paths = [f.path for f in files]
        if paths != sorted(set(paths)):
            raise ValueError("file paths are not sorted and unique")
        manifest = Manifest(
            name=str(raw.get("name", "")),
            algorithm=algorithm,
            chunk_size=chunk_size,
            files=tuple(files),
            source=str(raw.get("source", "")),
            created=str(raw.get("created", "")),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SourceError(f"manifest {origin} is not valid: {exc}", fix) from exc
    if raw.get("digest") != manifest.digest:
        raise SourceError(
            f"manifest {origin} does not match its own digest (edited or damaged)", fix
        )
    return manifest


def load_manifest(path: str) -> Manifest:
    data = read_manifest_file(path)
    if data is None:
        raise SourceError(
            f"no manifest at {show(path)}",
            "make one from the persistent copy: ct200-stage manifest SRC "
            "(or pass --manifest PATH); stage --create-manifest builds it during the copy",
        )
    return parse_manifest(data, path)


def read_manifest_file(path: str) -> bytes | None:
    """A manifest file's bytes, None when there is none. Read as a file from outside
    (untrusted.read_bounded): a FIFO, a device or a file larger than any manifest is a
    SourceError at once, never read or waited on."""
    try:
        return read_bounded(path, "manifest", MAX_MANIFEST_BYTES, "")
    except UntrustedInputError as exc:
        if exc.problem == "missing":
            return None
        fix = (
            "check the path and its permissions"
            if exc.problem == "unreadable"
            else "pass the manifest ct200-stage wrote (a regular JSON file), or recreate it: "
            f"ct200-stage manifest SRC --manifest {path} --force"
        )
        raise SourceError(exc.message, fix) from None


def manifest_dir() -> str:
    return os.environ.get(MANIFEST_DIR_ENV) or DEFAULT_MANIFEST_DIR


def default_manifest_path(name: str) -> str:
    return os.path.join(manifest_dir(), f"{name}.json")


@dataclass(frozen=True)
class SourceFile:
    path: str
    size: int
    mode: int
    #: What stat said when the tree was scanned: the reads are checked against it.
    identity: Identity


def scan_tree(root: str) -> list[SourceFile]:
    """Every model file under root, sorted; symlinks to files are followed (Hugging Face's cache
    is built of them), anything that cannot be copied as a plain file is an error, not a skip."""
    if not os.path.isdir(root):
        raise SourceError(
            f"source {root} is not a directory", "check the path of the persistent copy"
        )
    found: list[SourceFile] = []
    problems: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=_raise):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            rel_dir = ""
            dirnames[:] = [d for d in dirnames if d not in EXCLUDED_TOP_DIRS]
        for d in dirnames:
            if os.path.islink(os.path.join(dirpath, d)):
                problems.append(f"{_join(rel_dir, d)}: a symlink to a directory")
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d)))
        for name in filenames:
            rel = _join(rel_dir, name)
            if not rel_dir and name.startswith(OWN_PREFIX):
                continue
            try:
                st = os.stat(os.path.join(dirpath, name))
            except OSError as exc:
                problems.append(f"{rel}: {exc.strerror}")
                continue
            if not stat.S_ISREG(st.st_mode):
                problems.append(f"{rel}: not a regular file")
                continue
            found.append(SourceFile(rel, st.st_size, stat.S_IMODE(st.st_mode), Identity.of(st)))
    if problems:
        raise SourceError(
            f"{len(problems)} entr{'y' if len(problems) == 1 else 'ies'} under {root} cannot be "
            "staged as plain files",
            "replace them with real files or directories (or remove them) and retry",
            details=tuple(problems),
        )
    return sorted(found, key=lambda f: f.path)


def scan_source(root: str) -> list[SourceFile]:
    """scan_tree for a tree about to be read: not empty, and each identity safe to compare with."""
    files = scan_tree(root)
    if not files:
        raise SourceError(
            f"source {root} holds no files: is the dataset mounted?",
            f"mount the disk that holds the persistent copy (findmnt {root}), or check the path",
        )
    paths = [os.path.join(root, f.path) for f in files]
    try:
        ids = settled(paths, [f.identity for f in files])
    except OSError as exc:
        raise SourceError(
            f"cannot read {exc.filename}: {exc.strerror}", "check the source and run again"
        ) from exc
    return [SourceFile(f.path, i.size, f.mode, i) for f, i in zip(files, ids, strict=True)]


def weight_warning(root: str, files: Iterable[SourceFile]) -> str | None:
    """A note when nothing under root looks like model weights (a wrong or half-mounted path)."""
    if any(f.path.endswith(WEIGHT_SUFFIXES) for f in files):
        return None
    kinds = ", ".join(f"*{s}" for s in WEIGHT_SUFFIXES[:6])
    return f"warning: no weight files ({kinds}, ...) under {root}: is this the model's directory?"


class Listed(Protocol):
    """What compare_to_source needs of a file: a SourceFile, or a file the doctor listed."""

    @property
    def path(self) -> str: ...

    @property
    def size(self) -> int: ...


def compare_to_source(
    manifest: Manifest, files: Iterable[Listed], root: str, label: str = "the source"
) -> None:
    """Stat-level check before anything is copied: same file list, same sizes."""
    have = {f.path: f for f in files}
    problems = []
    for entry in manifest.files:
        got = have.pop(entry.path, None)
        if got is None:
            problems.append(f"{entry.path}: in the manifest, missing from {label}")
        elif got.size != entry.size:
            problems.append(f"{entry.path}: {got.size} bytes, the manifest says {entry.size}")
    problems += [f"{path}: in {label}, not in the manifest" for path in sorted(have)]
    if problems:
        raise SourceError(
            f"source {root} does not match its manifest ({len(problems)} difference(s))",
            "if the source was changed on purpose, remake the manifest: ct200-stage manifest SRC "
            "--force; otherwise restore the persistent copy (e.g. download it again)",
            details=tuple(problems),
        )


def _join(rel_dir: str, name: str) -> str:
    return f"{rel_dir}/{name}" if rel_dir else name


def _raise(exc: OSError) -> None:
    raise SourceError(f"cannot read {exc.filename}: {exc.strerror}", "check its permissions")
