"""Re-hash a tree (staged copy or persistent source) against a manifest, every chunk.

A staged copy sits in RAM: re-hashing it is a copy out of tmpfs and a hash, both CPU work, so more
threads than cores only take turns; and there is no page cache of ours to drop.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from ct200_tools.stage import capacity, tree
from ct200_tools.stage.engine import ChunkEngine, FileJob, ReadMode
from ct200_tools.stage.errors import SourceError, VerifyError
from ct200_tools.stage.manifest import (
    Manifest,
    compare_to_source,
    parse_manifest,
    read_manifest_file,
    scan_tree,
)
from ct200_tools.stage.progress import NullProgress, ProgressSink


@dataclass(frozen=True)
class VerifyResult:
    path: str
    manifest_digest: str
    algorithm: str
    files: int
    bytes: int
    seconds: float

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = dict(self.__dict__)
        out["bytes_per_second"] = round(self.bytes / self.seconds) if self.seconds > 0 else 0
        return out


def embedded_manifest(root: str) -> Manifest | None:
    """The manifest a staged tree carries, None when it carries none; raises when it is damaged."""
    path = os.path.join(root, tree.MANIFEST_NAME)
    data = read_manifest_file(path)
    return None if data is None else parse_manifest(data, path)


def check_listing(root: str, manifest: Manifest) -> None:
    """Same files, same sizes (stat only); a difference is a VerifyError listing each one."""
    try:
        compare_to_source(manifest, scan_tree(root), root, "the tree")
    except SourceError as exc:
        raise VerifyError(
            f"{root} does not match its manifest (files or sizes differ)",
            "restage it: ct200-stage stage SRC DST --replace (or remove it and stage again)",
            details=exc.details,
        ) from exc


def verify_tree(
    root: str,
    manifest: Manifest,
    *,
    jobs: int,
    read_mode: ReadMode = "buffered",
    progress: ProgressSink | None = None,
) -> VerifyResult:
    """Raise VerifyError naming every differing file and chunk; return the figures otherwise."""
    sink = progress or NullProgress()
    check_listing(root, manifest)
    in_ram = capacity.fs_type_of(root) in capacity.MEMORY_FS
    engine = ChunkEngine(
        algorithm=manifest.algorithm,
        chunk_size=manifest.chunk_size,
        jobs=min(jobs, os.cpu_count() or 1) if in_ram else jobs,
        read_mode=read_mode,
        drop_cache=not in_ram,
        progress=sink.advance,
        keep_going=True,
    )
    t0 = time.monotonic()
    sink.start(f"verifying {os.path.basename(root)}", manifest.total_bytes)
    try:
        engine.run(root, [FileJob(f.path, f.size, f.chunks) for f in manifest.files])
    except VerifyError as exc:
        raise VerifyError(
            f"{root}: {1 + len(exc.details)} chunk(s) do not match the manifest",
            "restage from the persistent copy (ct200-stage stage ... --replace); if the source "
            "itself fails ct200-stage verify SRC, restore it first",
            details=(exc.message, *exc.details),
        ) from exc
    finally:
        sink.finish()
    seconds = time.monotonic() - t0
    return VerifyResult(
        root,
        manifest.digest,
        manifest.algorithm,
        len(manifest.files),
        manifest.total_bytes,
        round(seconds, 3),
    )
