"""models.staged on real trees staged by the real ct200-stage: quick (marker and sizes) and
--deep (every chunk re-hashed), through the doctor's CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


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


def test_quick_and_deep(site: tuple[Path, Path, dict[str, str]]) -> None:
    spec, staged, env = site
    before = staged_check(spec, env)
    assert before["status"] == "fail"
    assert before["remediation"]["command"] == (  # type: ignore[index]
        "ct200-stage stage tiny --spec /etc/ct200/site.yml"
    )
    r = run(
        "ct200_tools.cli.stage", "stage", "tiny", "--spec", str(spec), "--create-manifest", env=env
    )
    assert r.returncode == 0, r.stderr
    assert staged_check(spec, env)["status"] == "pass"
    # Same size, one byte flipped: only --deep can tell.
    shard = staged / "model-00001-of-00003.safetensors"
    data = bytearray(shard.read_bytes())
    data[12345] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert staged_check(spec, env)["status"] == "pass"
    deep = staged_check(spec, env, "--deep")
    assert deep["status"] == "fail"
    assert "re-hashed" in " ".join(deep["evidence"])  # type: ignore[arg-type]
