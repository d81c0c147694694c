"""Staging end to end on real files: copy, verify, publish, refuse, resume, protect the source."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ct200_tools.stage import tree
from ct200_tools.stage.errors import CapacityError, RefusedError, SourceError, VerifyError
from ct200_tools.stage.progress import NullProgress
from ct200_tools.stage.stager import StageOptions, stage
from ct200_tools.stage.status import model_status
from ct200_tools.stage.verify import embedded_manifest, verify_tree

from .conftest import make_model, needs_root, tree_bytes, tree_stat, write_manifest

OPTS = StageOptions(jobs=4)


def _stage(src: Path, dst: Path, mpath: Path, **kw: object) -> object:
    opts = StageOptions(**{"jobs": 4, **kw})  # type: ignore[arg-type]
    return stage(str(src), str(dst), manifest_path=str(mpath), name="m", options=opts)


def test_stage_copies_verifies_and_publishes_with_a_marker(tmp_path: Path, shm: Path) -> None:
    src = make_model(tmp_path / "src")
    os.chmod(src / "config.json", 0o600)
    manifest = write_manifest(src, tmp_path / "m.json")
    before = tree_stat(src)
    dst = shm / "models" / "m"
    result = _stage(src, dst, tmp_path / "m.json")
    # The source is untouched: bytes, mtimes, modes, and (O_NOATIME) even access times.
    assert tree_stat(src) == before
    assert result.outcome == "staged"  # type: ignore[attr-defined]
    assert tree_bytes(dst) == tree_bytes(src)
    assert (dst / "config.json").stat().st_mode & 0o777 == 0o600
    marker = tree.read_marker(str(dst))
    assert marker is not None and marker.manifest_digest == manifest.digest
    assert embedded_manifest(str(dst)) == manifest
    assert not os.path.exists(tree.partial_path(str(dst)))
    assert not (dst / tree.JOURNAL_NAME).exists()
    st = model_status(str(dst), deep=True, manifest=str(tmp_path / "m.json"))
    assert (st.state, st.files_expected, st.bytes_actual) == ("staged", 7, manifest.total_bytes)
    # A second run finds it staged and copies nothing.
    again = _stage(src, dst, tmp_path / "m.json")
    assert again.outcome == "already-staged"  # type: ignore[attr-defined]


def test_flipped_byte_in_source_after_manifest_is_caught_and_nothing_published(
    tmp_path: Path, shm: Path
) -> None:
    src = make_model(tmp_path / "src")
    write_manifest(src, tmp_path / "m.json")
    shard = src / "model-00003-of-00003.safetensors"
    with open(shard, "r+b") as fh:  # same size, one bit different: only the hash can tell
        fh.seek(12345)
        b = fh.read(1)
        fh.seek(12345)
        fh.write(bytes([b[0] ^ 0x80]))
    dst = shm / "m"
    with pytest.raises(VerifyError) as err:
        _stage(src, dst, tmp_path / "m.json")
    assert shard.name in err.value.message and "chunk 0" in err.value.message
    assert not dst.exists()
    partial = Path(tree.partial_path(str(dst)))
    assert not (partial / tree.MARKER_NAME).exists()
    assert model_status(str(dst)).state == "partial"
    journal = tree.Journal(str(partial)).read()
    assert shard.name not in journal.files
    assert 0 not in journal.chunks.get(shard.name, set())
    # Put the byte back: the rerun keeps what was verified and redoes only the rest.
    with open(shard, "r+b") as fh:
        fh.seek(12345)
        fh.write(b)
    result = _stage(src, dst, tmp_path / "m.json")
    assert any("resumed" in n for n in result.notes)  # type: ignore[attr-defined]
    assert tree_bytes(dst) == tree_bytes(src)


def test_refuses_to_overwrite_a_different_model_unless_replace(tmp_path: Path, shm: Path) -> None:
    a = make_model(tmp_path / "a", seed=1)
    b = make_model(tmp_path / "b", seed=2)
    write_manifest(a, tmp_path / "a.json")
    mb = write_manifest(b, tmp_path / "b.json")
    dst = shm / "m"
    _stage(a, dst, tmp_path / "a.json")
    with pytest.raises(RefusedError, match="different staged model"):
        _stage(b, dst, tmp_path / "b.json")
    assert tree_bytes(dst) == tree_bytes(a)
    result = _stage(b, dst, tmp_path / "b.json", replace=True)
    assert result.replaced  # type: ignore[attr-defined]
    assert tree_bytes(dst) == tree_bytes(b)
    assert tree.read_marker(str(dst)).manifest_digest == mb.digest  # type: ignore[union-attr]
    assert sorted(os.listdir(shm)) == [".m.ct200-lock", "m"]  # no trash, no partial left


def test_refuses_unmarked_files_and_non_directories(tmp_path: Path, shm: Path) -> None:
    src = make_model(tmp_path / "src")
    write_manifest(src, tmp_path / "m.json")
    handmade = shm / "handmade"
    handmade.mkdir()
    (handmade / "weights.bin").write_bytes(b"precious")
    with pytest.raises(RefusedError, match="not staged by ct200-stage"):
        _stage(src, handmade, tmp_path / "m.json")
    assert (handmade / "weights.bin").read_bytes() == b"precious"
    assert model_status(str(handmade)).state == "unmarked"
    afile = shm / "afile"
    afile.write_text("x")
    with pytest.raises(RefusedError, match="not a directory"):
        _stage(src, afile, tmp_path / "m.json")
    with pytest.raises(RefusedError, match="overlap"):
        _stage(src, src / "inside", tmp_path / "m.json")
    empty = shm / "empty"
    empty.mkdir()
    assert _stage(src, empty, tmp_path / "m.json").outcome == "staged"  # type: ignore[attr-defined]


def test_dst_on_the_same_filesystem_as_src(tmp_path: Path) -> None:
    src = make_model(tmp_path / "src")
    write_manifest(src, tmp_path / "m.json")
    before = tree_stat(src)
    dst = tmp_path / "staged" / "m"
    result = _stage(src, dst, tmp_path / "m.json")
    assert tree_stat(src) == before
    assert result.outcome == "staged"  # type: ignore[attr-defined]
    assert result.capacity["fs_type"] != "tmpfs"  # type: ignore[attr-defined]
    assert tree_bytes(dst) == tree_bytes(src)
    assert not any((dst / p).is_symlink() for p in os.listdir(dst))
    assert (src / "config.json").stat().st_ino != (dst / "config.json").stat().st_ino


class _DeleteAfter(NullProgress):
    """Removes a source file once the copy is under way (the copy's own progress is the clock)."""

    def __init__(self, victim: Path, after: int) -> None:
        self.victim, self.after, self.seen = victim, after, 0

    def advance(self, n: int) -> None:
        self.seen += n
        if self.seen >= self.after and self.victim.exists():
            self.victim.rename(self.victim.with_suffix(".away"))


def test_source_file_that_disappears_mid_copy(tmp_path: Path, shm: Path) -> None:
    src = make_model(tmp_path / "src", shards=4)
    write_manifest(src, tmp_path / "m.json")
    victim = src / "model-00004-of-00004.safetensors"
    dst = shm / "m"
    opts = StageOptions(jobs=1)
    with pytest.raises(SourceError, match="disappeared"):
        stage(
            str(src),
            str(dst),
            manifest_path=str(tmp_path / "m.json"),
            options=opts,
            progress=_DeleteAfter(victim, 1 << 20),
        )
    assert not dst.exists()
    assert model_status(str(dst)).state == "partial"
    victim.with_suffix(".away").rename(victim)
    result = stage(str(src), str(dst), manifest_path=str(tmp_path / "m.json"), options=opts)
    assert result.files_resumed >= 1  # what was verified before the failure is kept
    assert tree_bytes(dst) == tree_bytes(src)


@needs_root
def test_too_small_tmpfs_is_refused_before_any_write(tmp_path: Path, small_tmpfs: Path) -> None:
    src = make_model(tmp_path / "src")  # ~9 MB into a 4 MiB tmpfs
    write_manifest(src, tmp_path / "m.json")
    with pytest.raises(CapacityError) as err:
        _stage(src, small_tmpfs / "models" / "m", tmp_path / "m.json")
    assert "nothing was written" in err.value.message
    assert any("tmpfs" in d and "free" in d for d in err.value.details)
    assert os.listdir(small_tmpfs) == []  # not even the parent directory or the lock
    # The reserve is RAM kept for everything else: a huge one refuses even where the fs is big.
    with pytest.raises(CapacityError, match="nothing was written"):
        _stage(src, Path("/dev/shm") / "ct200-never", tmp_path / "m.json", reserve=1 << 60)
    assert not Path("/dev/shm/ct200-never").exists()


@needs_root
def test_a_tmpfs_smaller_than_the_spec_says_prints_the_remount_to_paste(
    tmp_path: Path, small_tmpfs: Path
) -> None:
    """/dev/shm smaller than the spec's shm.size (its fstab line shrunk: issue 19's fault
    matrix): the fix is the whole command, pasted, with the spec's size; pasted here (on a real
    tmpfs), the stage then succeeds. Without a size to grow to it says what to do, as before."""
    src = make_model(tmp_path / "src")  # ~9 MB into a 4 MiB tmpfs
    write_manifest(src, tmp_path / "m.json")
    dst = small_tmpfs / "models" / "m"
    with pytest.raises(CapacityError) as err:
        _stage(src, dst, tmp_path / "m.json")
    assert "remount,size=... " in err.value.fix
    with pytest.raises(CapacityError) as err:
        _stage(src, dst, tmp_path / "m.json", shm_size=32 << 20)
    fix = err.value.fix
    command = fix.split("`")[1]
    assert command == f"mount -o remount,size={32 << 20} {small_tmpfs}", fix
    subprocess.run(["bash", "-c", command], check=True, timeout=30)
    _stage(src, dst, tmp_path / "m.json", shm_size=32 << 20)
    assert tree_bytes(dst) == tree_bytes(src)


def test_verify_and_status_catch_damage_in_the_staged_copy(tmp_path: Path, shm: Path) -> None:
    src = make_model(tmp_path / "src")
    manifest = write_manifest(src, tmp_path / "m.json")
    dst = shm / "m"
    _stage(src, dst, tmp_path / "m.json")
    shard = dst / "model-00001-of-00003.safetensors"
    with open(shard, "r+b") as fh:
        fh.seek(300_000)
        fh.write(b"\x00\x01\x02")
    # Sizes still match, but the write moved the file's ctime (tmpfs keeps it too): one stat
    # tells, without re-hashing (issue 19).
    quick = model_status(str(dst))
    assert quick.state == "mismatch", quick
    assert f"{shard.name}: changed since it was staged (ctime " in quick.detail
    deep = model_status(str(dst), deep=True)
    assert deep.state == "mismatch" and any(shard.name in e for e in deep.errors)
    with pytest.raises(VerifyError):
        verify_tree(str(dst), manifest, jobs=2)
    (dst / "config.json").write_text("{}")
    shallow = model_status(str(dst))
    assert shallow.state == "mismatch" and any("config.json" in e for e in shallow.errors)
    (dst / "extra.safetensors").write_bytes(b"x")
    assert any("extra" in e for e in model_status(str(dst)).errors)
    os.unlink(dst / tree.MARKER_NAME)
    assert model_status(str(dst)).state == "unmarked"
    shutil.rmtree(dst)
    assert model_status(str(dst)).state == "missing"
    other = make_model(tmp_path / "other", seed=9)
    write_manifest(other, tmp_path / "o.json")
    _stage(other, dst, tmp_path / "o.json")
    stale = model_status(str(dst), manifest=str(tmp_path / "m.json"))
    assert stale.state == "mismatch" and stale.expected_digest == manifest.digest


def test_create_manifest_during_the_copy(tmp_path: Path, shm: Path) -> None:
    src = make_model(tmp_path / "src")
    mpath = tmp_path / "made" / "m.json"
    with pytest.raises(SourceError, match="no manifest"):
        _stage(src, shm / "m", mpath)
    assert not (shm / "m").exists()
    result = _stage(src, shm / "m", mpath, create_manifest=True)
    assert mpath.exists() and any("no manifest existed" in n for n in result.notes)  # type: ignore[attr-defined]
    assert model_status(str(shm / "m"), deep=True, manifest=str(mpath)).state == "staged"
