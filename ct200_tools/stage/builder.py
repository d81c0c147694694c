"""Make a manifest by reading the source once (in parallel chunks, read-only).

The engine checks each file's identity before and after its reads, so a file rewritten while it is
hashed is hashed again (or refused): the manifest always describes one version of every file.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from ct200_tools.stage.engine import ChunkEngine, FileJob, ReadMode
from ct200_tools.stage.errors import SourceError, VerifyError
from ct200_tools.stage.hashing import default_algorithm
from ct200_tools.stage.lfs import lfs_hashes
from ct200_tools.stage.manifest import (
    DEFAULT_CHUNK_SIZE,
    FileEntry,
    Manifest,
    now_utc,
    scan_source,
    weight_warning,
)
from ct200_tools.stage.progress import NullProgress, ProgressSink


@dataclass(frozen=True)
class BuildReport:
    manifest: Manifest
    #: Files whose sha256 matched Hugging Face's LFS metadata.
    lfs_checked: int
    #: Files with no LFS sha256 anywhere (small git files, or a copy made without metadata).
    lfs_unknown: int
    seconds: float
    warnings: tuple[str, ...] = ()


def build_manifest(
    source: str,
    name: str,
    *,
    jobs: int,
    algorithm: str | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    read_mode: ReadMode = "buffered",
    lfs: bool = True,
    model_info: str | None = None,
    progress: ProgressSink | None = None,
) -> BuildReport:
    sink = progress or NullProgress()
    root = os.path.realpath(source)
    files = scan_source(root)
    try:
        expected = lfs_hashes(root, [f.path for f in files], model_info) if lfs else {}
    except (OSError, ValueError) as exc:
        raise SourceError(
            f"cannot read the model info {model_info}: {exc}", "check the file"
        ) from exc
    algorithm = algorithm or default_algorithm()
    engine = ChunkEngine(
        algorithm=algorithm,
        chunk_size=chunk_size,
        jobs=jobs,
        read_mode=read_mode,
        progress=sink.advance,
    )
    jobs_list = [
        FileJob(f.path, f.size, None, sha256=f.path in expected, identity=f.identity) for f in files
    ]
    t0 = time.monotonic()
    sink.start(f"hashing {name}", sum(f.size for f in files))
    try:
        result = engine.run(root, jobs_list)
    finally:
        sink.finish()
    bad = [
        f"{path}: sha256 {result.sha256[path]}, Hugging Face says {sha}"
        for path, sha in sorted(expected.items())
        if result.sha256.get(path) != sha
    ]
    if bad:
        raise VerifyError(
            f"{len(bad)} file(s) in {root} differ from Hugging Face's LFS sha256",
            "download those files again; no manifest was written",
            details=tuple(bad),
        )
    entries = tuple(
        FileEntry(f.path, f.size, result.digests[f.path], expected.get(f.path)) for f in files
    )
    manifest = Manifest(name, algorithm, chunk_size, entries, root, now_utc())
    warning = weight_warning(root, files)
    return BuildReport(
        manifest,
        len(expected),
        len(files) - len(expected),
        time.monotonic() - t0,
        (warning,) if warning else (),
    )
