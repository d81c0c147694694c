"""ct200-stage's input files from outside (issue 20): a manifest, a staged tree's embedded
manifest or marker, or Hugging Face's model info that is a FIFO, /dev/zero or a link to it, too
large or too deeply nested is exit 2 with the file and a fix, never a hang or exit 3. Real files,
FIFOs and devices; ct200-stage runs as a real process (conftest.cli, bounded by its timeout)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ct200_tools.stage import tree

from .conftest import cli, make_model, write_manifest

pytestmark = pytest.mark.timeout(180)


def hostile(path: Path, kind: str) -> Path:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero-link":
        path.symlink_to("/dev/zero")
    elif kind == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    return path


KINDS = [("fifo", "FIFO"), ("dev-zero-link", "a device"), ("deep", "nested more than")]


def refused(r: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    for fragment in fragments:
        assert fragment in r.stderr, r.stderr


@pytest.mark.parametrize(("kind", "said"), KINDS)
def test_a_manifest_that_is_no_manifest_file_is_refused(
    tmp_path: Path, manifest_dir: Path, kind: str, said: str
) -> None:
    src = make_model(tmp_path / "m", shards=1, shard_size=1 << 20)
    manifest = hostile(tmp_path / "m.json", kind)
    refused(cli("verify", str(src), "--manifest", str(manifest)), said, "fix:")


@pytest.mark.parametrize(("kind", "said"), KINDS)
def test_a_staged_trees_embedded_manifest_is_refused(
    tmp_path: Path, manifest_dir: Path, kind: str, said: str
) -> None:
    staged = tmp_path / "staged"
    staged.mkdir()
    hostile(staged / tree.MANIFEST_NAME, kind)
    refused(cli("verify", str(staged)), said)


@pytest.mark.parametrize(("kind", "said"), KINDS)
def test_status_of_a_tree_whose_marker_is_hostile_says_so(
    tmp_path: Path, manifest_dir: Path, kind: str, said: str
) -> None:
    src = make_model(tmp_path / "m", shards=1, shard_size=1 << 20)
    write_manifest(src, manifest_dir / "m.json")
    staged = tmp_path / "staged"
    staged.mkdir()
    hostile(staged / tree.MARKER_NAME, kind)
    res = cli("status", str(staged))
    assert res.returncode in (1, 2) and "Traceback" not in res.stderr, (res.stdout, res.stderr)
    assert said in res.stdout + res.stderr


@pytest.mark.parametrize(("kind", "said"), KINDS)
def test_model_info_that_is_no_file_is_refused(
    tmp_path: Path, manifest_dir: Path, kind: str, said: str
) -> None:
    src = make_model(tmp_path / "m", shards=1, shard_size=1 << 20)
    info = hostile(tmp_path / "info.json", kind)
    refused(cli("manifest", str(src), "--lfs", "--model-info", str(info)), said, "fix:")
