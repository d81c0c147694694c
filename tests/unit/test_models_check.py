"""models.staged on real trees staged by the real ct200-stage: quick (marker, sizes and change
times) and
--deep (every chunk re-hashed), through the doctor's CLI; the models probe reading through its
Reader; and the one verdict behind the doctor and `ct200-stage status`."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ct200_tools.doctor.probes.base import Reader
from ct200_tools.doctor.probes.models import probe_model
from ct200_tools.facts import (
    ManifestFacts,
    ManifestFile,
    MarkerFacts,
    RehashedFile,
    StagedTreeFacts,
    TreeEntry,
)
from ct200_tools.fsutil import write_atomic
from ct200_tools.spec import ModelSpec
from ct200_tools.stage.builder import build_manifest
from ct200_tools.stage.lock import target_lock
from ct200_tools.stage.stager import StageOptions, stage
from ct200_tools.stage.tree import partial_path
from ct200_tools.stage.verdict import MAX_ERRORS, stage_verdict


def run(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *argv],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env=env,
    )


@pytest.fixture
def site(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    src = tmp_path / "persistent" / "tiny"
    src.mkdir(parents=True)
    for i in range(3):  # shard-shaped files, not all zeros
        (src / f"model-0000{i}-of-00003.safetensors").write_bytes(os.urandom(3 << 20) * 1)
    (src / "config.json").write_text('{"model_type": "tiny"}')
    staged = tmp_path / "shm" / "tiny"
    spec = tmp_path / "site.yml"
    spec.write_text(
        "ct200_site:\n"
        "  gpus: {count: 1, model: H200}\n"
        f"  models: [{{name: tiny, source: {src}, staged: {staged}}}]\n"
        "  servers: [{name: s, engine: sglang, model: tiny, gpus: [0], port: 30000}]\n"
    )
    env = {**os.environ, "CT200_MANIFEST_DIR": str(tmp_path / "manifests")}
    return spec, staged, env


def staged_check(spec: Path, env: dict[str, str], *extra: str) -> dict[str, object]:
    r = run(
        "ct200_tools.cli.entry",
        "check",
        "--json",
        "--only",
        "models",
        "--spec",
        str(spec),
        *extra,
        env=env,
    )
    assert r.stdout, r.stderr
    return json.loads(r.stdout)["checks"][0]  # type: ignore[no-any-return]


def paste(command: str, spec: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The printed fix, pasted into bash as it is; only the spec's path is this test's (the
    printed one is the machine's, /etc/ct200/site.yml), and ct200-stage is the venv's."""
    line = command.replace("/etc/ct200/site.yml", shlex.quote(str(spec)))
    path = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return subprocess.run(
        ["bash", "-c", line],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**env, "PATH": path},
    )


def test_quick_and_deep(site: tuple[Path, Path, dict[str, str]]) -> None:
    spec, _staged, env = site
    before = staged_check(spec, env)
    assert before["status"] == "fail"
    assert before["remediation"]["command"] == (  # type: ignore[index]
        "ct200-stage stage tiny --spec /etc/ct200/site.yml --replace"
    )
    r = run(
        "ct200_tools.cli.stage", "stage", "tiny", "--spec", str(spec), "--create-manifest", env=env
    )
    assert r.returncode == 0, r.stderr
    good = staged_check(spec, env)
    assert good["status"] == "pass"
    assert "sizes and change times of 4 files as staged; content not re-hashed: " in str(
        good["summary"]
    ) + " ".join(good["evidence"])  # type: ignore[arg-type]
    deep = staged_check(spec, env, "--deep")
    assert deep["status"] == "pass"


@pytest.mark.parametrize("damage", ["same-size", "truncated"])
def test_a_damaged_copy_fails_and_its_printed_fix_repairs_it(
    site: tuple[Path, Path, dict[str, str]], damage: str
) -> None:
    """Issue 19: a same-size change passed the quick check (served silently), and the printed
    fix (`ct200-stage stage X` without --replace) said "already staged" or refused a truncated
    copy. Now both fail by one stat per file, and the fix, pasted, restages the copy."""
    spec, staged, env = site
    r = run(
        "ct200_tools.cli.stage", "stage", "tiny", "--spec", str(spec), "--create-manifest", env=env
    )
    assert r.returncode == 0, r.stderr
    shard = staged / "model-00001-of-00003.safetensors"
    original = shard.read_bytes()
    data = bytearray(original)
    if damage == "same-size":
        data[12345] ^= 0xFF
        shard.write_bytes(bytes(data))
    else:
        shard.write_bytes(bytes(data[: len(data) // 2]))
    bad = staged_check(spec, env)
    assert bad["status"] == "fail", bad
    said = " ".join([str(bad["summary"]), *bad["evidence"]])  # type: ignore[list-item]
    if damage == "same-size":
        assert "changed since it was staged (ctime " in said and "content not trusted" in said
    command = bad["remediation"]["command"]  # type: ignore[index]
    assert command == "ct200-stage stage tiny --spec /etc/ct200/site.yml --replace"
    fixed = paste(command, spec, env)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert staged_check(spec, env)["status"] == "pass"
    assert staged_check(spec, env, "--deep")["status"] == "pass"
    assert shard.read_bytes() == original


# =============================================================================================
# The models probe reads only through its Reader, and one verdict serves both tools.
# =============================================================================================
CHUNK = 256 << 10  # small chunks: a few MiB of model span many of them


def make_source(root: Path) -> Path:
    root.mkdir(parents=True)
    for i in range(3):
        (root / f"model-0000{i}-of-00003.safetensors").write_bytes(os.urandom((1 << 20) + i * 4099))
    (root / "config.json").write_text('{"model_type": "tiny"}')
    (root / "tokenizer").mkdir()
    (root / "tokenizer" / "vocab.json").write_text("[1, 2, 3]")
    return root


@pytest.fixture
def rooted(tmp_path: Path) -> tuple[Path, ModelSpec]:
    """A machine's tree under tmp_path/root: a persistent copy, its manifest where ct200-stage
    keeps manifests, and the model staged by the real stager at /dev/shm/models/tiny."""
    root = tmp_path / "root"
    src = make_source(root / "tank" / "tiny")
    mdir = root / "var" / "lib" / "ct200" / "manifests"
    mdir.mkdir(parents=True)
    manifest = build_manifest(str(src), "tiny", jobs=2, chunk_size=CHUNK).manifest
    write_atomic(str(mdir / "tiny.json"), manifest.to_json())
    staged = root / "dev" / "shm" / "models" / "tiny"
    stage(
        str(src),
        str(staged),
        manifest_path=str(mdir / "tiny.json"),
        name="tiny",
        options=StageOptions(jobs=2),
    )
    return root, ModelSpec("tiny", "/tank/tiny", "/dev/shm/models/tiny")


class CountingReader(Reader):
    """The real Reader, counting the bytes the deep re-hash reads through it."""

    def __init__(self, root: Path, deep: bool) -> None:
        super().__init__(root=root, deep=deep)
        self.read = 0

    def open_binary(self, p: str) -> io.FileIO:
        reader = self

        class Counted(io.FileIO):
            def readinto(self, b: Any) -> int:
                n = super().readinto(b) or 0
                reader.read += n
                return n

        return Counted(self.path(p), "r")


def test_probe_reads_the_machine_through_its_reader(
    rooted: tuple[Path, ModelSpec], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rooted at tmp_path/root, the probe finds the staged tree, its manifest in the default
    manifest dir and the persistent copy there; nothing of them exists at the real paths."""
    root, spec = rooted
    monkeypatch.delenv("CT200_MANIFEST_DIR", raising=False)
    assert not Path("/dev/shm/models/tiny").exists() and not Path("/tank/tiny").exists()
    got = probe_model(Reader(root=root), spec)
    size = sum(p.stat().st_size for p in (root / "tank" / "tiny").rglob("*") if p.is_file())
    assert (got.source_exists, got.source_bytes, got.staged_exists) == (True, size, True)
    t = got.staged_tree
    assert t is not None and t.path == "/dev/shm/models/tiny"
    assert t.marker is not None and t.manifest is not None
    assert t.marker.manifest_digest == t.manifest.digest == t.source_manifest_digest
    assert t.source_manifest == "/var/lib/ct200/manifests/tiny.json"
    assert [e.path for e in t.entries or ()] == [
        "config.json",
        *(f"model-0000{i}-of-00003.safetensors" for i in range(3)),
        "tokenizer/vocab.json",
    ]
    assert t.rehashed is None and all(not f.chunks for f in t.manifest.files)  # quick: sizes
    v = stage_verdict(t)
    assert (v.state, v.files_expected, v.bytes_actual) == ("staged", 5, size)
    assert v.detail.endswith(
        "sizes and change times of 5 files as staged; content not re-hashed: "
        "ct200-stage verify /dev/shm/models/tiny re-hashes"
    )


def test_deep_rehash_reads_every_byte_through_the_reader(rooted: tuple[Path, ModelSpec]) -> None:
    root, spec = rooted
    r = CountingReader(root, deep=True)
    t = probe_model(r, spec).staged_tree
    assert t is not None and t.rehashed is not None and t.manifest is not None
    size = sum(f.size for f in t.manifest.files)
    assert r.read == size
    # The facts hold what was read (each chunk's hash), the verdict compares them.
    assert [f.chunks for f in t.rehashed] == [f.chunks for f in t.manifest.files]
    assert stage_verdict(t).detail.endswith("every chunk re-hashed")
    shard = root / "dev" / "shm" / "models" / "tiny" / "model-00001-of-00003.safetensors"
    data = bytearray(shard.read_bytes())
    data[CHUNK + 5] ^= 0xFF  # the second chunk
    shard.write_bytes(bytes(data))
    quick = probe_model(Reader(root=root), spec).staged_tree
    assert quick is not None
    # Sizes still match, but the write moved the file's ctime: not trusted without re-hashing.
    said = stage_verdict(quick)
    assert said.state == "mismatch" and "changed since it was staged (ctime" in said.detail
    deep = probe_model(Reader(root=root, deep=True), spec).staged_tree
    assert deep is not None
    v = stage_verdict(deep)
    assert v.state == "mismatch"
    assert v.errors == (
        "/dev/shm/models/tiny: 1 chunk does not match the manifest",
        f"model-00001-of-00003.safetensors: bytes {CHUNK}-{2 * CHUNK} (chunk 1) do not match "
        "the manifest",
    )


def test_probe_reads_the_stage_lock_holder(rooted: tuple[Path, ModelSpec]) -> None:
    root, spec = rooted
    staged = root / "dev" / "shm" / "models" / "tiny"
    shutil.rmtree(staged)
    Path(partial_path(str(staged))).mkdir()
    idle = probe_model(Reader(root=root), spec).staged_tree
    assert idle is not None and idle.partial and idle.lock_pid is None
    assert stage_verdict(idle).detail == (
        "only a partial copy exists; run the stage again: it resumes"
    )
    with target_lock(str(staged), "tiny"):
        held = probe_model(Reader(root=root), spec).staged_tree
    assert held is not None and held.lock_pid == os.getpid()
    v = stage_verdict(held)
    assert v.state == "partial" and v.stage_pid == os.getpid()
    assert v.detail == (
        f"only a partial copy exists (a stage is running now: pid {os.getpid()}); wait for it"
    )


def test_doctor_and_stage_status_give_one_verdict(site: tuple[Path, Path, dict[str, str]]) -> None:
    """`ct200-stage status` and the doctor's models.staged, on the same tree: missing, staged,
    then damaged (only --deep can tell) -- the same state and detail each time."""
    spec, staged, env = site

    def both(*deep: str) -> tuple[dict[str, Any], dict[str, Any]]:
        r = run("ct200_tools.cli.stage", "status", "--spec", str(spec), "--json", *deep, env=env)
        row = json.loads(r.stdout)["result"]["models"][0]
        return row, staged_check(spec, env, *deep)

    for step in ("missing", "staged", "damaged"):
        if step == "staged":
            r = run(
                "ct200_tools.cli.stage",
                "stage",
                "tiny",
                "--spec",
                str(spec),
                "--create-manifest",
                env=env,
            )
            assert r.returncode == 0, r.stderr
        if step == "damaged":
            shard = staged / "model-00000-of-00003.safetensors"
            data = bytearray(shard.read_bytes())
            data[7] ^= 0xFF
            shard.write_bytes(bytes(data))
        for deep in ((), ("--deep",)):
            row, doctor = both(*deep)
            how = "re-hashed" if row["deep"] else "marker, sizes and change times"
            assert f"tiny: {row['state']} ({how}): {row['detail']}" in doctor["evidence"], step
            # A same-size change moved the file's ctime: a mismatch without re-hashing too.
            want = {"missing": "missing", "staged": "staged"}.get(step, "mismatch")
            assert row["state"] == want, (step, deep)


# The verdict alone, on facts as the probe records them: every state and its words.
DIGEST = "sha256:" + "a" * 64
MANIFEST = ManifestFacts(DIGEST, "blake2b-128", 4096, (ManifestFile("a", 10), ManifestFile("b", 5)))
GOOD = StagedTreeFacts(
    "/dev/shm/models/m",
    exists=True,
    is_dir=True,
    marker=MarkerFacts(DIGEST, "m", "/tank/m", "2026-01-01T00:00:00Z", 2, 15),
    manifest=MANIFEST,
    entries=(TreeEntry("a", 10), TreeEntry("b", 5)),
)
VERDICTS: list[tuple[StagedTreeFacts, str, str]] = [
    (
        GOOD,
        "staged",
        "staged 2026-01-01T00:00:00Z from /tank/m; sizes of 2 files as staged (marker of an older "
        "ct200-stage: no change times); content not re-hashed: ct200-stage verify "
        "/dev/shm/models/m re-hashes",
    ),
    (StagedTreeFacts("/dev/shm/models/m"), "missing", "nothing staged at /dev/shm/models/m"),
    (
        StagedTreeFacts("/dev/shm/models/m", lock_pid=7),
        "missing",
        "nothing staged at /dev/shm/models/m (a stage is running now: pid 7)",
    ),
    (
        StagedTreeFacts("/dev/shm/models/m", partial=True),
        "partial",
        "only a partial copy exists; run the stage again: it resumes",
    ),
    (
        StagedTreeFacts("/dev/shm/models/m", exists=True),
        "unmarked",
        "/dev/shm/models/m is not a directory",
    ),
    (
        dataclasses.replace(GOOD, marker=None, manifest=None, entries=None),
        "unmarked",
        "no .ct200-staged marker: not staged by ct200-stage, or not finished",
    ),
    (
        dataclasses.replace(GOOD, marker=None, marker_error="not a ct200-stage marker"),
        "mismatch",
        "its marker is damaged: not a ct200-stage marker",
    ),
    (dataclasses.replace(GOOD, manifest=None), "mismatch", "its manifest is missing"),
    (
        dataclasses.replace(GOOD, manifest_error="manifest x is not valid: y"),
        "mismatch",
        "manifest x is not valid: y",
    ),
    (
        dataclasses.replace(GOOD, manifest=dataclasses.replace(MANIFEST, digest="sha256:b")),
        "mismatch",
        "marker and manifest disagree",
    ),
    (
        dataclasses.replace(GOOD, entries=(TreeEntry("a", 10), TreeEntry("b", 4))),
        "mismatch",
        "/dev/shm/models/m does not match its manifest (files or sizes differ)",
    ),
    (
        dataclasses.replace(GOOD, source_manifest="/s.json", source_manifest_digest="sha256:b"),
        "mismatch",
        f"staged content {DIGEST} is not the source's sha256:b: restage it (--replace)",
    ),
    (
        dataclasses.replace(GOOD, source_manifest="/s.json", source_manifest_error="no manifest"),
        "unreadable",
        "cannot compare with the source's manifest: no manifest",
    ),
    (
        dataclasses.replace(GOOD, error="/dev/shm/models/m: Permission denied"),
        "unreadable",
        "/dev/shm/models/m: Permission denied",
    ),
    (
        dataclasses.replace(
            GOOD, deep=True, rehashed=(RehashedFile("a", (), "cannot read a at byte 0: EIO"),)
        ),
        "unreadable",
        "cannot read a at byte 0: EIO",
    ),
]


@pytest.mark.parametrize(("tree", "state", "detail"), VERDICTS)
def test_stage_verdict(tree: StagedTreeFacts, state: str, detail: str) -> None:
    v = stage_verdict(tree)
    assert (v.state, v.detail) == (state, detail)
    assert v.ok == (state == "staged")


def test_stage_verdict_lists_every_difference() -> None:
    odd = dataclasses.replace(
        GOOD,
        entries=(
            TreeEntry("a", 9),
            TreeEntry("c", 1),
            TreeEntry("d", problem="not a regular file"),
        ),
    )
    assert stage_verdict(odd).errors == (
        "/dev/shm/models/m does not match its manifest (files or sizes differ)",
        "d: not a regular file",
    )
    odd = dataclasses.replace(odd, entries=odd.entries[:2])  # type: ignore[index]
    assert stage_verdict(odd).errors == (
        "/dev/shm/models/m does not match its manifest (files or sizes differ)",
        "a: 9 bytes, the manifest says 10",
        "b: in the manifest, missing from the source",
        "c: in the source, not in the manifest",
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.from_type(StagedTreeFacts))
def test_stage_verdict_is_total(tree: StagedTreeFacts) -> None:
    """Whatever a facts file says about a tree, the verdict is one of the states, never a
    crash (a damaged snapshot must not break the doctor)."""
    v = stage_verdict(tree)
    assert v.state in ("staged", "missing", "partial", "unmarked", "mismatch", "unreadable")
    assert isinstance(v.detail, str) and v.path == tree.path
    assert len(v.errors) <= MAX_ERRORS + 1


MARKER = '{"kind": "ct200-stage-marker", "manifest_digest": "sha256:x"'


@pytest.mark.parametrize(
    ("marker", "manifest", "detail"),
    [
        ("", None, "its marker is damaged: not JSON: Expecting value: line 1 column 1 (char 0)"),
        ("[]", None, "its marker is damaged: not a ct200-stage marker"),
        ('{"kind": "ct200-stage-marker"}', None, "its marker is damaged: 'manifest_digest'"),
        (MARKER + ', "files": Infinity}', None, "its marker is damaged: "),
        ("[" * 100_000, None, "its marker is damaged: "),
        (MARKER + "}", '{"kind": "nope"}', "is not valid: not a ct200-stage manifest"),
        (
            MARKER + "}",
            '{"kind": "ct200-stage-manifest", "schema_version": 1, "files": [],'
            ' "hash": {"algorithm": "blake2b-128", "chunk_size": Infinity}}',
            "is not valid: ",
        ),
    ],
)
def test_a_damaged_marker_or_manifest_is_a_mismatch(
    rooted: tuple[Path, ModelSpec], marker: str, manifest: str | None, detail: str
) -> None:
    """Whatever is in the tree's own files, the probe records it and the verdict names it;
    neither raises (ct200-stage status and the doctor would exit 3)."""
    root, spec = rooted
    staged = root / "dev" / "shm" / "models" / "tiny"
    (staged / ".ct200-staged").write_text(marker)
    if manifest is not None:
        (staged / ".ct200-manifest.json").write_text(manifest)
    t = probe_model(Reader(root=root, deep=True), spec).staged_tree
    assert t is not None
    v = stage_verdict(t)
    assert v.state == "mismatch"
    assert detail in v.detail
