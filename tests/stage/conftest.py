"""Real files, real tmpfs, real processes: fixtures for the staging tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ct200_tools.fsutil import write_atomic
from ct200_tools.stage import tree
from ct200_tools.stage.builder import build_manifest
from ct200_tools.stage.hashing import new_hasher
from ct200_tools.stage.manifest import Manifest, parse_manifest
from ct200_tools.stage.status import model_status
from ct200_tools.stage.verify import verify_tree

#: Small chunks so that a few MiB of model still spans many chunks, threads and journal records.
CHUNK = 256 << 10
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root (mount, drop caches)")
STRACE = shutil.which("strace")
#: strace's fault injection hits an exact system call: the Nth pwrite64, the 2nd chmod, ...
needs_strace = pytest.mark.skipif(
    STRACE is None, reason="strace is not installed (scripts/setup.sh installs it)"
)
CLI = [sys.executable, "-c", "from ct200_tools.cli.stage import main; main()"]


def make_model(root: Path, shards: int = 3, shard_size: int = 3 << 20, seed: int = 1) -> Path:
    """A directory shaped like a safetensors checkpoint: shards, an index, configs, a subdir."""
    root.mkdir(parents=True, exist_ok=True)
    rng = __import__("random").Random(seed)
    index = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        header = json.dumps({"__metadata__": {"format": "pt"}}).encode()
        body = rng.randbytes(shard_size - 8 - len(header) - i * 4097)  # odd sizes, unaligned tails
        (root / name).write_bytes(len(header).to_bytes(8, "little") + header + body)
        index[f"layer.{i}.weight"] = name
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))
    (root / "config.json").write_text(json.dumps({"architectures": ["Test"]}))
    (root / "empty.txt").write_bytes(b"")
    (root / "tokenizer").mkdir(exist_ok=True)
    (root / "tokenizer" / "tokenizer.json").write_text(json.dumps({"vocab": list(range(500))}))
    return root


def write_manifest(src: Path, path: Path, name: str = "m") -> Manifest:
    manifest = build_manifest(str(src), name, jobs=4, chunk_size=CHUNK).manifest
    write_atomic(str(path), manifest.to_json())
    return manifest


@pytest.fixture
def manifest_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "manifests"
    monkeypatch.setenv("CT200_MANIFEST_DIR", str(d))
    return d


@pytest.fixture
def shm() -> Iterator[Path]:
    """A fresh directory on /dev/shm (tmpfs, as in production), removed afterwards."""
    base = Path("/dev/shm") if os.path.isdir("/dev/shm") else Path("/tmp")
    d = base / f"ct200-test-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    if not IS_ROOT:
        pytest.skip("mounting a tmpfs needs root")
    d = tmp_path / "tmpfs"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(d)], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def stage_argv(src: Path, dst: Path, manifest: Path, *extra: str, jobs: int = 2) -> list[str]:
    return [
        *CLI,
        "stage",
        str(src),
        str(dst),
        "--manifest",
        str(manifest),
        "--jobs",
        str(jobs),
        "--json",
        *extra,
    ]


def traced(
    argv: list[str], inject: str, *, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run argv under strace with one injection, e.g. "pwrite64:signal=KILL:when=5".

    strace counts calls per syscall and per thread, so with --jobs 1 "the 5th pwrite64 of the copy
    thread" is one exact point of the run."""
    assert STRACE is not None
    syscall = inject.split(":", 1)[0]
    cmd = [
        STRACE,
        "-f",
        "-qq",
        "-o",
        "/dev/null",
        "-e",
        f"trace={syscall}",
        "-e",
        f"inject={inject}",
    ]
    return subprocess.run(
        [*cmd, *argv], capture_output=True, text=True, timeout=timeout, check=False
    )


def assert_never_half_done(dst: Path) -> None:
    """After a kill: whatever claims to be complete is complete, byte for byte."""
    if dst.exists():
        st = model_status(str(dst), deep=True)
        assert st.state == "staged", st
    partial = Path(tree.partial_path(str(dst)))
    if not partial.exists() or not (partial / tree.MANIFEST_NAME).exists():
        return
    manifest = parse_manifest((partial / tree.MANIFEST_NAME).read_text(), str(partial))
    if (partial / tree.MARKER_NAME).exists():
        verify_tree(str(partial), manifest, jobs=2)  # a marker only ever sits on verified data
    journal = tree.Journal(str(partial)).read()
    # Every chunk the journal vouches for holds exactly the manifest's bytes, checked here with
    # plain reads and hashes (not with the engine under test).
    for path in journal.files | set(journal.chunks):
        entry = manifest.file(path)
        assert entry is not None
        chunks = range(len(entry.chunks)) if path in journal.files else journal.chunks[path]
        with open(partial / path, "rb") as fh:
            for c in chunks:
                fh.seek(c * manifest.chunk_size)
                want = min(manifest.chunk_size, entry.size - c * manifest.chunk_size)
                h = new_hasher(manifest.algorithm)
                h.update(fh.read(want))
                assert h.hexdigest() == entry.chunks[c], (path, c)


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ct200-stage as a user would: a separate process, its exit code, its output."""
    return subprocess.run(
        [sys.executable, "-c", "from ct200_tools.cli.stage import main; main()", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        check=False,
    )


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".ct200-")
    }


def tree_stat(root: Path) -> dict[str, tuple[int, int, int, int]]:
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.stat()
        out[str(p.relative_to(root))] = (st.st_mtime_ns, st.st_atime_ns, st.st_mode, st.st_size)
    return out
