"""Issue 10: a published copy is always one consistent version of the source, and nothing outside
the model is ever touched. One test per case of the issue; each failed before the fix.

Exact kill points come from strace's fault injection (`inject=SYSCALL:signal=KILL:when=N`), run on
the real CLI in its own process; a source rewritten during the copy is rewritten from the copy's
own progress callback, so the rewrite lands between two reads every time.
"""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from ct200_tools.stage import tree
from ct200_tools.stage.builder import build_manifest
from ct200_tools.stage.errors import StageError
from ct200_tools.stage.lock import target_lock
from ct200_tools.stage.manifest import load_manifest
from ct200_tools.stage.progress import NullProgress
from ct200_tools.stage.stager import StageOptions, stage
from ct200_tools.stage.status import model_status
from ct200_tools.stage.verify import verify_tree
from tests.foreground import foreground

from .conftest import (
    CHUNK,
    CLI,
    assert_never_half_done,
    cli,
    make_model,
    needs_root,
    needs_strace,
    stage_argv,
    traced,
    tree_bytes,
    write_manifest,
)

SHARD = "model-00001-of-00003.safetensors"


def _json(out: str) -> dict[str, object]:
    return json.loads(out)  # type: ignore[no-any-return]


class _Rewriter(NullProgress):
    """Rewrites a source shard in place, same size, new bytes, once the copy has read `after`
    bytes, `times` times at most: a writer racing the copy, at a point the copy cannot miss."""

    def __init__(self, victim: Path, after: int, times: int) -> None:
        self.victim, self.after, self.times = victim, after, times
        self.seen = self.rewrites = 0
        self.rng = random.Random(7)  # noqa: S311 - test data

    def advance(self, n: int) -> None:
        self.seen += n
        if self.seen >= self.after and self.rewrites < self.times:
            self.rewrites += 1
            size = self.victim.stat().st_size
            with open(self.victim, "r+b") as fh:
                fh.write(self.rng.randbytes(size))
                fh.flush()
                os.fsync(fh.fileno())


# --- Must fix 1: a torn copy is never published ---------------------------------------------------


def test_source_rewritten_during_create_manifest_stage_gives_one_consistent_version(
    tmp_path: Path, shm: Path
) -> None:
    src = make_model(tmp_path / "src")
    mpath = tmp_path / "made" / "m.json"
    dst = shm / "m"
    # 1 MiB in: config.json and empty.txt are done, the first shard is a third read.
    writer = _Rewriter(src / SHARD, after=1 << 20, times=1)
    opts = StageOptions(jobs=1, create_manifest=True)
    stage(str(src), str(dst), manifest_path=str(mpath), name="m", options=opts, progress=writer)
    assert writer.rewrites == 1
    # The copy and the manifest written from it are the source as it is now, not a mix.
    assert tree_bytes(dst) == tree_bytes(src)
    fresh = build_manifest(str(src), "m", jobs=2).manifest
    assert load_manifest(str(mpath)).digest == fresh.digest
    verify_tree(str(dst), load_manifest(str(mpath)), jobs=2)


def test_source_that_keeps_changing_is_refused_naming_the_file(tmp_path: Path, shm: Path) -> None:
    src = make_model(tmp_path / "src")
    mpath = tmp_path / "made" / "m.json"
    dst = shm / "m"
    writer = _Rewriter(src / SHARD, after=1 << 20, times=1000)
    opts = StageOptions(jobs=1, create_manifest=True)
    with pytest.raises(StageError, match=f"{SHARD}.*changed") as err:
        stage(str(src), str(dst), manifest_path=str(mpath), name="m", options=opts, progress=writer)
    assert err.value.kind == "source"  # exit 2, like every StageError
    assert not dst.exists() and not mpath.exists()


def test_manifest_of_a_source_rewritten_while_hashed_is_one_version(tmp_path: Path) -> None:
    src = make_model(tmp_path / "src")
    writer = _Rewriter(src / SHARD, after=1 << 20, times=1)
    made = build_manifest(str(src), "m", jobs=1, chunk_size=CHUNK, progress=writer).manifest
    assert writer.rewrites == 1
    assert made.digest == build_manifest(str(src), "m", jobs=2, chunk_size=CHUNK).manifest.digest


# --- Must fix 2: a resume re-proves what it keeps -------------------------------------------------


@needs_strace
def test_resume_rehashes_kept_chunks_and_redoes_damaged_ones(tmp_path: Path, shm: Path) -> None:
    src = make_model(tmp_path / "src", shards=3, shard_size=4 << 20)
    mpath = tmp_path / "m.json"
    write_manifest(src, mpath)
    dst = shm / "m"
    killed = traced(stage_argv(src, dst, mpath, jobs=1), "pwrite64:signal=KILL:when=20")
    assert killed.returncode == -9, killed.stderr
    partial = Path(tree.partial_path(str(dst)))
    journal = tree.Journal(str(partial)).read()
    kept = sorted((p, c) for p, cs in journal.chunks.items() for c in cs if p.endswith("tensors"))
    assert kept, journal
    path, chunk = kept[len(kept) // 2]
    with open(partial / path, "r+b") as fh:  # damage one byte of a chunk the journal vouches for
        fh.seek(chunk * CHUNK + 100)
        b = fh.read(1)
        fh.seek(chunk * CHUNK + 100)
        fh.write(bytes([b[0] ^ 0xFF]))
    res = cli(*stage_argv(src, dst, mpath)[len(CLI) :])
    assert res.returncode == 0, res.stderr
    notes = " ".join(_json(res.stdout)["result"]["notes"])  # type: ignore[index]
    assert "resumed" in notes and "1 damaged" in notes, notes
    assert tree_bytes(dst) == tree_bytes(src)
    assert cli("verify", str(dst)).returncode == 0


# --- Must fix 3: --replace swaps only our own tree ------------------------------------------------


def test_replace_never_deletes_a_directory_of_other_models(tmp_path: Path, shm: Path) -> None:
    models = shm / "models"
    srcs = {n: make_model(tmp_path / n, shards=1, seed=i) for i, n in enumerate(("m1", "m2", "m3"))}
    for n, s in srcs.items():
        write_manifest(s, tmp_path / f"{n}.json", n)
    for n in ("m1", "m2"):
        res = cli("stage", str(srcs[n]), str(models / n), "--manifest", str(tmp_path / f"{n}.json"))
        assert res.returncode == 0, res.stderr
    (models / "notes.txt").write_text("mine")
    before = {n: tree_bytes(models / n) for n in ("m1", "m2")}
    m3 = ("--manifest", str(tmp_path / "m3.json"))
    for target in (str(models), f"{models}/m1/..", f"{models}/"):
        res = cli("stage", str(srcs["m3"]), target, *m3, "--replace")
        assert res.returncode == 2, (target, res.stdout, res.stderr)
        assert "Traceback" not in res.stderr
    res = cli("stage", str(srcs["m3"]), str(models), *m3, "--replace")
    assert "m1" in res.stderr and "m2" in res.stderr  # it says what is there
    assert (models / "notes.txt").read_text() == "mine"
    assert {n: tree_bytes(models / n) for n in ("m1", "m2")} == before
    # Without --replace the refusal never suggests deleting anything.
    res = cli("stage", str(srcs["m3"]), str(models), *m3)
    assert res.returncode == 2 and "rm " not in res.stderr, res.stderr


def test_replace_refuses_an_unmarked_tree_and_swaps_our_own(tmp_path: Path, shm: Path) -> None:
    src = make_model(tmp_path / "src")
    write_manifest(src, tmp_path / "m.json")
    m = ("--manifest", str(tmp_path / "m.json"))
    handmade = shm / "handmade"
    handmade.mkdir()
    (handmade / "weights.bin").write_bytes(b"precious")
    res = cli("stage", str(src), str(handmade), *m, "--replace")
    assert res.returncode == 2 and "weights.bin" in res.stderr, res.stderr
    assert "rm " not in res.stderr
    assert (handmade / "weights.bin").read_bytes() == b"precious"
    # Our own tree of another model is swapped; an empty directory is simply used.
    other = make_model(tmp_path / "other", seed=5)
    write_manifest(other, tmp_path / "o.json")
    ours = shm / "ours"
    assert (
        cli("stage", str(other), str(ours), "--manifest", str(tmp_path / "o.json")).returncode == 0
    )
    assert cli("stage", str(src), str(ours), *m, "--replace").returncode == 0
    assert tree_bytes(ours) == tree_bytes(src)
    (shm / "empty").mkdir()
    assert cli("stage", str(src), str(shm / "empty"), *m, "--replace").returncode == 0


# --- Must fix 4: nothing but the manifest's files is published ------------------------------------


@needs_strace
@pytest.mark.parametrize(
    "inject",
    [
        "pwrite64:signal=KILL:when=1",  # main thread: the lock's pid, before anything else
        "pwrite64:signal=KILL:when=9",  # the copy thread, mid-shard
        "fsync:signal=KILL:when=4",  # the journal
        "chmod:signal=KILL:when=2",  # the marker's temporary file, before its rename
        "rename:signal=KILL:when=3",  # the publishing rename
        "unlink:signal=KILL:when=1",  # removing the journal before the marker
    ],
)
def test_kill_at_an_exact_point_then_rerun(tmp_path: Path, shm: Path, inject: str) -> None:
    src = make_model(tmp_path / "src")
    mpath = tmp_path / "m.json"
    write_manifest(src, mpath)
    dst = shm / "m"
    killed = traced(stage_argv(src, dst, mpath, jobs=1), inject)
    assert killed.returncode == -9, (killed.returncode, killed.stderr)
    assert_never_half_done(dst)
    res = cli(*stage_argv(src, dst, mpath)[len(CLI) :])
    assert res.returncode == 0, res.stderr
    assert model_status(str(dst), deep=True, manifest=str(mpath)).state == "staged"
    assert tree_bytes(dst) == tree_bytes(src)
    own = {tree.MANIFEST_NAME, tree.MARKER_NAME}
    assert {p.name for p in dst.iterdir() if p.name.startswith(".")} <= own
    assert sorted(os.listdir(shm)) == [".m.ct200-lock", "m"]


@needs_strace
def test_junk_in_the_partial_tree_is_not_published(tmp_path: Path, shm: Path) -> None:
    src = make_model(tmp_path / "src")
    mpath = tmp_path / "m.json"
    write_manifest(src, mpath)
    dst = shm / "m"
    traced(stage_argv(src, dst, mpath, jobs=1), "pwrite64:signal=KILL:when=9")
    partial = Path(tree.partial_path(str(dst)))
    (partial / "junk.bin").write_bytes(b"junk")
    (partial / "tokenizer").mkdir(exist_ok=True)
    (partial / "tokenizer" / "stray.json").write_text("{}")
    (partial / "leftover-dir").mkdir()
    res = cli(*stage_argv(src, dst, mpath)[len(CLI) :])
    assert res.returncode == 0, res.stderr
    assert not (dst / "junk.bin").exists() and not (dst / "leftover-dir").exists()
    assert not (dst / "tokenizer" / "stray.json").exists()
    assert model_status(str(dst), deep=True).state == "staged"
    again = _json(cli(*stage_argv(src, dst, mpath)[len(CLI) :]).stdout)
    assert again["result"]["outcome"] == "already-staged"  # type: ignore[index]


def test_a_partial_tree_that_is_not_ours_is_left_alone(tmp_path: Path, shm: Path) -> None:
    src = make_model(tmp_path / "src")
    mpath = tmp_path / "m.json"
    write_manifest(src, mpath)
    dst = shm / "m"
    partial = Path(tree.partial_path(str(dst)))
    partial.mkdir()
    (partial / "someone-elses.bin").write_bytes(b"keep")
    res = cli(*stage_argv(src, dst, mpath)[len(CLI) :])
    assert res.returncode == 2 and str(partial) in res.stderr, res.stderr
    assert (partial / "someone-elses.bin").read_bytes() == b"keep"


# --- Must fix 5: the printed fix for a corrupt copy works -----------------------------------------


def test_the_fix_verify_prints_for_a_damaged_copy_restages_it(
    tmp_path: Path, shm: Path, manifest_dir: Path
) -> None:
    src = make_model(tmp_path / "qwen")
    assert cli("manifest", str(src)).returncode == 0
    dst = shm / "qwen"
    assert cli("stage", str(src), str(dst)).returncode == 0
    shard = dst / SHARD
    with open(shard, "r+b") as fh:
        fh.seek(5000)
        fh.write(b"\x00\x00\x00")
    bad = cli("verify", str(dst))
    assert bad.returncode == 2
    fix = next(line for line in bad.stderr.splitlines() if "fix:" in line)
    command = shlex.split(fix[fix.index("ct200-stage stage") :])
    assert command[:2] == ["ct200-stage", "stage"] and "--replace" in command
    res = cli(*command[1:])
    assert res.returncode == 0, res.stderr
    assert "already staged" not in res.stdout
    assert cli("verify", str(dst)).returncode == 0
    assert tree_bytes(dst) == tree_bytes(src)


def test_stage_replace_repairs_a_copy_with_an_extra_file(tmp_path: Path, shm: Path) -> None:
    src = make_model(tmp_path / "src")
    mpath = tmp_path / "m.json"
    write_manifest(src, mpath)
    dst = shm / "m"
    argv = stage_argv(src, dst, mpath)[len(CLI) :]
    assert cli(*argv).returncode == 0
    (dst / "extra.bin").write_bytes(b"x")
    again = cli(*argv)
    assert again.returncode == 2 and "--replace" in again.stderr, again.stdout
    assert cli(*argv, "--replace").returncode == 0
    assert not (dst / "extra.bin").exists()
    assert model_status(str(dst), deep=True).state == "staged"


# --- Must fix 6: an empty source is what an unmounted dataset looks like --------------------------


def test_empty_source_is_refused_and_weightless_source_warned(
    tmp_path: Path, shm: Path, manifest_dir: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for args in (
        ("stage", str(empty), str(shm / "e"), "--create-manifest"),
        ("manifest", str(empty)),
    ):
        res = cli(*args)
        assert res.returncode == 2, (args, res.stdout, res.stderr)
        assert "is the dataset mounted?" in res.stderr
    assert not (shm / "e").exists() and not (manifest_dir / "empty.json").exists()
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "config.json").write_text("{}")
    res = cli("stage", str(configs), str(shm / "c"), "--create-manifest")
    assert res.returncode == 0, res.stderr
    assert "no weight files" in res.stdout


# --- Minor ----------------------------------------------------------------------------------------


@needs_strace
def test_sigint_exits_130_and_the_rerun_resumes(tmp_path: Path, shm: Path) -> None:
    src = make_model(tmp_path / "src")
    mpath = tmp_path / "m.json"
    write_manifest(src, mpath)
    dst = shm / "m"
    res = traced(foreground(stage_argv(src, dst, mpath, jobs=1)), "pwrite64:signal=INT:when=5")
    assert res.returncode == 130, (res.returncode, res.stderr)
    assert "interrupted" in res.stderr and "Traceback" not in res.stderr
    assert _json(res.stdout)["error"]["kind"] == "interrupted"  # type: ignore[index]
    assert cli(*stage_argv(src, dst, mpath)[len(CLI) :]).returncode == 0


@needs_strace
def test_destination_filled_up_is_said_once(tmp_path: Path, shm: Path) -> None:
    src = make_model(tmp_path / "src", shards=4)
    mpath = tmp_path / "m.json"
    write_manifest(src, mpath)
    # Every data write fails as on a full tmpfs; the delay puts all four threads inside one.
    inject = "pwrite64:error=ENOSPC:delay_enter=300000:when=2+"
    res = traced(stage_argv(src, shm / "m", mpath, jobs=4), inject)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("filled up") == 1, res.stderr
    assert _json(res.stdout)["error"]["kind"] == "capacity"  # type: ignore[index]


@needs_root
def test_too_few_inodes_is_refused_before_any_write(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.safetensors").write_bytes(b"w" * 4096)
    for i in range(40):
        (src / f"f{i:03d}.json").write_text("{}")
    mpath = tmp_path / "m.json"
    write_manifest(src, mpath)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m,nr_inodes=20", "tmpfs", mnt], check=True
    )
    try:
        res = cli("stage", str(src), str(mnt / "m"), "--manifest", str(mpath), "--json")
        assert res.returncode == 2, res.stderr
        err = _json(res.stdout)["error"]
        assert err["kind"] == "capacity" and "inode" in json.dumps(err)  # type: ignore[index]
        assert "nothing was written" in err["message"]  # type: ignore[index]
        assert os.listdir(mnt) == []
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@needs_root
def test_a_target_that_is_a_mount_point_is_refused_before_any_write(tmp_path: Path) -> None:
    src = make_model(tmp_path / "src", shards=1)
    mpath = tmp_path / "m.json"
    write_manifest(src, mpath)
    parent = tmp_path / "parent"
    mnt = parent / "shm"
    mnt.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", mnt], check=True)
    try:
        res = cli("stage", str(src), str(mnt), "--manifest", str(mpath))
        assert res.returncode == 2 and "mount point" in res.stderr, res.stderr
        assert f"{mnt}/" in res.stderr  # the fix names a directory inside it
        assert sorted(os.listdir(parent)) == ["shm"] and os.listdir(mnt) == []
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_reserve_larger_than_memory_says_so(tmp_path: Path, shm: Path) -> None:
    src = make_model(tmp_path / "src", shards=1)
    mpath = tmp_path / "m.json"
    write_manifest(src, mpath)
    res = cli("stage", str(src), str(shm / "m"), "--manifest", str(mpath), "--reserve", "100T")
    assert res.returncode == 2
    assert " -" not in res.stderr.splitlines()[0], res.stderr
    first = res.stderr.splitlines()[0]
    assert "reserve" in first and "109.95 TB" in first  # 100 TiB, in the decimal units we print
    assert "fix: lower --reserve" in res.stderr
    assert not (shm / "m").exists()


def test_verify_during_a_stage_says_a_stage_is_in_progress(tmp_path: Path, shm: Path) -> None:
    src = make_model(tmp_path / "src", shards=1)
    mpath = tmp_path / "m.json"
    write_manifest(src, mpath)
    dst = shm / "m"
    with target_lock(str(dst), "m"):  # the lock a running stage holds
        first = cli("verify", str(dst), "--manifest", str(mpath))
    assert first.returncode == 2 and "a stage" in first.stderr and "in progress" in first.stderr
    assert cli("stage", str(src), str(dst), "--manifest", str(mpath)).returncode == 0
    with target_lock(str(dst), "m"):  # a --replace stage of a staged copy
        again = cli("verify", str(dst))
    assert again.returncode == 2 and "in progress" in again.stderr, again.stderr
    assert cli("verify", str(dst)).returncode == 0


def test_a_target_whose_parent_is_a_file_names_it(tmp_path: Path) -> None:
    src = make_model(tmp_path / "src", shards=1)
    mpath = tmp_path / "m.json"
    write_manifest(src, mpath)
    blocker = tmp_path / "afile"
    blocker.write_text("not a directory")
    res = cli("stage", str(src), str(blocker / "sub" / "m"), "--manifest", str(mpath))
    assert res.returncode == 2
    assert f"{blocker} is a file" in res.stderr and "File exists" not in res.stderr, res.stderr
    assert blocker.read_text() == "not a directory"


def test_exit_codes_in_the_docs_are_the_enum() -> None:
    from ct200_tools.doctor.report import Exit as ReportExit  # noqa: PLC0415
    from ct200_tools.exitcodes import Exit  # noqa: PLC0415

    assert ReportExit is Exit  # one enum for both CLIs
    doc = (Path(__file__).parents[2] / "docs" / "staging.md").read_text()
    rows = re.findall(r"^\| (\d+) \|", doc, flags=re.M)
    assert sorted(int(r) for r in rows) == [Exit.OK, Exit.FAILURES, Exit.BROKE, Exit.INTERRUPTED]
