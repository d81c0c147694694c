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
from ct200_tools.stage.builder import build_manifest
from ct200_tools.stage.manifest import Manifest

#: Small chunks so that a few MiB of model still spans many chunks, threads and journal records.
CHUNK = 256 << 10
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root (mount, drop caches)")


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
