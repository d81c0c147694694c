"""Manifests: content identity, tamper detection, what a model tree may contain, LFS sha256."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from ct200_tools.stage.builder import build_manifest
from ct200_tools.stage.errors import SourceError, VerifyError
from ct200_tools.stage.hashing import BLAKE2B_128, XXH3_128
from ct200_tools.stage.manifest import load_manifest, parse_manifest, scan_tree

from .conftest import CHUNK, make_model


def test_digest_names_the_content_not_the_place(tmp_path: Path) -> None:
    a = make_model(tmp_path / "a")
    b = make_model(tmp_path / "b")
    ma = build_manifest(str(a), "x", jobs=4, chunk_size=CHUNK).manifest
    mb = build_manifest(str(b), "y", jobs=2, chunk_size=CHUNK).manifest
    assert ma.digest == mb.digest
    assert ma.algorithm == XXH3_128
    shard = next(f for f in ma.files if f.path.endswith(".safetensors"))
    assert len(shard.chunks) == -(-shard.size // CHUNK) > 1
    assert [f.path for f in ma.files] == sorted(f.path for f in ma.files)
    assert "tokenizer/tokenizer.json" in [f.path for f in ma.files]
    assert ma.file("empty.txt") is not None and ma.file("empty.txt").chunks == ()  # type: ignore[union-attr]
    # Round trip through JSON keeps the digest; the algorithm and chunk size are part of it.
    again = parse_manifest(ma.to_json(), "test")
    assert again.digest == ma.digest and again == ma
    other = build_manifest(str(a), "x", jobs=4, chunk_size=CHUNK, algorithm=BLAKE2B_128).manifest
    assert other.digest != ma.digest


def test_one_changed_byte_changes_the_digest(tmp_path: Path) -> None:
    src = make_model(tmp_path / "m")
    before = build_manifest(str(src), "m", jobs=4, chunk_size=CHUNK).manifest
    shard = src / "model-00002-of-00003.safetensors"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    after = build_manifest(str(src), "m", jobs=4, chunk_size=CHUNK).manifest
    assert after.digest != before.digest
    changed = [
        (i, f.path)
        for f, g in zip(before.files, after.files, strict=True)
        for i, (x, y) in enumerate(zip(f.chunks, g.chunks, strict=True))
        if x != y
    ]
    assert changed == [((len(data) // 2) // CHUNK, shard.name)]


def test_edited_or_unsafe_manifests_are_rejected(tmp_path: Path) -> None:
    src = make_model(tmp_path / "m")
    text = build_manifest(str(src), "m", jobs=2, chunk_size=CHUNK).manifest.to_json()
    raw = json.loads(text)
    raw["files"][0]["size"] += 1
    with pytest.raises(SourceError, match=r"not valid|digest"):
        parse_manifest(json.dumps(raw), "edited")
    raw = json.loads(text)
    raw["files"][0]["chunks"][0] = "0" * 32
    with pytest.raises(SourceError, match="its own digest"):
        parse_manifest(json.dumps(raw), "edited")
    for bad in ("../escape", "/abs", "a/../../b", ".ct200-staged"):
        raw = json.loads(text)
        raw["files"][0]["path"] = bad
        with pytest.raises(SourceError, match="unsafe"):
            parse_manifest(json.dumps(raw), "evil")
    with pytest.raises(SourceError, match="no manifest"):
        load_manifest(str(tmp_path / "absent.json"))


def test_scan_follows_file_links_skips_bookkeeping_and_refuses_dir_links(tmp_path: Path) -> None:
    src = make_model(tmp_path / "m")
    (src / ".cache" / "huggingface").mkdir(parents=True)
    (src / ".cache" / "huggingface" / "x.lock").write_text("")
    (src / ".git").mkdir()
    (src / ".git" / "HEAD").write_text("ref")
    blob = tmp_path / "blob"
    blob.write_bytes(b"linked")
    (src / "linked.bin").symlink_to(blob)
    paths = {f.path for f in scan_tree(str(src))}
    assert "linked.bin" in paths
    assert not any(p.startswith((".cache", ".git")) for p in paths)
    (src / "dirlink").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(SourceError) as err:
        scan_tree(str(src))
    assert any("dirlink" in d for d in err.value.details)


def _local_dir_metadata(src: Path, rel: str, sha: str) -> None:
    meta = src / ".cache" / "huggingface" / "download" / f"{rel}.metadata"
    meta.parent.mkdir(parents=True, exist_ok=True)
    meta.write_text(f"{'c' * 40}\n{sha}\n1700000000.0\n")


def test_lfs_sha256_cross_check_passes_and_catches_a_bad_file(tmp_path: Path) -> None:
    src = make_model(tmp_path / "m")
    shards = sorted(p for p in src.iterdir() if p.suffix == ".safetensors")
    for p in shards:
        _local_dir_metadata(src, p.name, hashlib.sha256(p.read_bytes()).hexdigest())
    # The hub cache form: a snapshot symlink named after the blob's sha256.
    blob_data = os.urandom(5000)
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    sha = hashlib.sha256(blob_data).hexdigest()
    (blobs / sha).write_bytes(blob_data)
    (src / "extra.safetensors").symlink_to(blobs / sha)
    report = build_manifest(str(src), "m", jobs=4, chunk_size=CHUNK)
    assert report.lfs_checked == len(shards) + 1
    assert report.manifest.file(shards[0].name).sha256 is not None  # type: ignore[union-attr]
    _local_dir_metadata(src, shards[1].name, "f" * 64)
    with pytest.raises(VerifyError) as err:
        build_manifest(str(src), "m", jobs=4, chunk_size=CHUNK)
    assert shards[1].name in err.value.details[0]
    assert build_manifest(str(src), "m", jobs=4, chunk_size=CHUNK, lfs=False).lfs_checked == 0
