"""Fixtures of the llama-server tests: the built binary (cached per machine), the tiny model, and
one running server per module.

The first run on a machine builds llama-server (about 6 minutes on 2 cores). Where it cannot be
built (no compiler, no write access to the cache) the tests skip with the reason, except under CI
(CI=true), where a missing requirement fails the run instead of silently skipping it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed import llama_build, tiny_gguf
from testbed.llama_server import ServeConfig, Server, free_port, running

#: Four slots over a 2048-token cache: 512 tokens each.
CTX = 2048
PARALLEL = 4


def _unmet() -> str | None:
    if llama_build.cached() is not None:
        return None
    missing = llama_build.missing_tools()
    if missing:
        packages = " ".join(sorted(set(missing.values())))
        return f"cannot build llama-server: missing {', '.join(sorted(missing))}: " + (
            f"apt-get install -y {packages} (or `bash scripts/setup.sh`)"
        )
    root = llama_build.cache_root()
    parent = next((p for p in (root, *root.parents) if p.exists()), root)
    if not os.access(parent, os.W_OK):
        return f"cannot build llama-server: {parent} is not writable (root, or CT200_TESTBED_CACHE)"
    return None


@pytest.fixture(scope="session")
def llama_binary() -> Path:
    reason = _unmet()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the llama tests, but {reason}", pytrace=False)
        pytest.skip(reason)
    try:
        built = llama_build.ensure()
    except llama_build.BuildError as exc:
        pytest.fail(f"llama-server did not build: {exc}", pytrace=False)
    if built.build_s:
        print(f"\nllama-server: built {built.binary} in {built.build_s:.0f} s")
    return built.binary


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_gguf.write(tmp_path_factory.mktemp("model") / "tiny.gguf")


@pytest.fixture(scope="module")
def server(
    llama_binary: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    config = ServeConfig(model=tiny_model, port=free_port(), ctx=CTX, parallel=PARALLEL)
    log = tmp_path_factory.mktemp("server") / "llama-server.log"
    with running(config, llama_binary, log) as srv:
        yield srv
