"""Site specs with servers, shared by the unit tests of the server units and the testbed tests.

- ``llama_site()``: the committed testbed spec (inventory/testbed) plus tiny llama.cpp models
  and servers running llama-server on the CPU, as tests/testbed/test_servers.py and
  benchmarks/servers converge them: `tiny`, the one that serves, is `engine: llamacpp` (as the
  quickstart's), the others `command` servers (any argv: the quoting of a tricky alias, a bad
  flag). Each server stands for a case of issue 11: the server that serves, a second set to
  switch to, a GPU server whose gate must fail here (no GPU), a bad flag,
  a missing program, a model that cannot be staged, a taken port, a model too large to keep
  beside another in a small /dev/shm.
- ``VARIANTS``: edits of the CT200 example's servers covering every engine and every speculative
  algorithm, rendered and checked with systemd-analyze by tests/unit/test_server_units.py.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Final

import yaml

from testbed import llama_server
from tests.unit.spec_helpers import DROP, changed

REPO = Path(__file__).resolve().parents[1]
TESTBED_SPEC = REPO / "inventory" / "testbed" / "group_vars" / "all.yml"

LLAMA: Final = llama_server.PROGRAM
#: An alias with every character a unit file would mangle unless quoted: the test reads the
#: process's argv back and compares.
TRICKY_ALIAS: Final = 'tiny b "quoted" $HOME ${X} 100% \\ back;'
#: Bytes of padding in the big models: two of them do not fit together in SHM_SIZE.
PAD_BYTES: Final = 56 << 20
SHM_SIZE: Final = "96M"


def model(name: str) -> dict[str, str]:
    return {
        "name": name,
        "source": f"{llama_server.MODELS_ROOT}/{name}",
        "staged": f"/dev/shm/models/{name}",
    }


def llama(
    name: str, model_name: str, port: int, alias: str = "tiny", **extra: Any
) -> dict[str, Any]:
    argv = [
        LLAMA,
        *("--model", f"/dev/shm/models/{model_name}/{llama_server.MODEL_FILE}", "--alias", alias),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--ctx-size", "512", "--parallel", "2", "--threads", "1", "--no-webui", "--metrics"),
    ]
    server: dict[str, Any] = {
        "name": name,
        "engine": "command",
        "model": model_name,
        "gpus": [],
        "port": port,
        "health": "/health",
        "start_timeout": 120,
        "enabled": False,
        "command": argv,
    }
    server.update(extra)
    return server


def llamacpp(name: str, model_name: str, port: int, **extra: Any) -> dict[str, Any]:
    """The same server as engine: llamacpp: its module renders -m, --alias (the model's name),
    --host/--port, -np and --metrics from the spec."""
    server: dict[str, Any] = {
        "name": name,
        "engine": "llamacpp",
        "model": model_name,
        "gpus": [],
        "port": port,
        "health": "/health",
        "start_timeout": 120,
        "enabled": False,
        "command": [LLAMA],
        "args": {"parallel": 2, "ctx-size": 512, "threads": 1, "no-webui": True},
    }
    server.update(extra)
    return server


#: Models whose persistent copies the testbed tests write (name -> seed of the tiny GGUF, and
#: padding bytes beside it); "tiny-missing" is declared but never written.
MODELS: Final = {
    "tiny-a": (0, 0),
    "tiny-b": (1, 0),
    "tiny-big-1": (2, PAD_BYTES),
    "tiny-big-2": (3, PAD_BYTES),
}


def llama_site(shm: bool = True) -> dict[str, Any]:
    """The testbed spec with the llama servers; ``tiny`` is the one enabled."""
    data = yaml.safe_load(TESTBED_SPEC.read_text())
    site: dict[str, Any] = copy.deepcopy(data["ct200_site"])
    site["models"] = [model(n) for n in (*MODELS, "tiny-missing")]
    if shm:
        site["shm"] = {"size": SHM_SIZE}
    site["servers"] = [
        llamacpp("tiny", "tiny-a", 8081, enabled=True),
        # The second serving set: the same port, so switching to it stops `tiny`.
        llama("tiny-b", "tiny-b", 8081, alias=TRICKY_ALIAS, env={"NCCL_DEBUG": "WARN"}),
        # One GPU (the testbed declares one, and has none): the doctor's gate fails it.
        llama("tiny-gpu", "tiny-a", 8083, gpus=[0]),
        llama("tiny-badflag", "tiny-a", 8084, command=[LLAMA, "--no-such-flag", "--port", "8084"]),
        llama("tiny-nobin", "tiny-a", 8085, command=[f"{LLAMA}-missing", "--port", "8085"]),
        llama("tiny-unstaged", "tiny-missing", 8086),
        llama("tiny-port", "tiny-a", 8087),
        llama("tiny-big-1", "tiny-big-1", 8088),
        llama("tiny-big-2", "tiny-big-2", 8089),
    ]
    return site


def server_names(site: dict[str, Any]) -> list[str]:
    return [s["name"] for s in site["servers"]]


def prepare_ct(push: llama_server.Push, workdir: Path, binary: Path) -> Path:
    """What a user does before the playbook: the engine's program in place (llama-server, built
    by testbed/llama_build.py) and each model's persistent copy (a tiny GGUF, and padding for the
    big ones) under /tank/models (llama_server.install, which the quickstart runs too). Returns
    the extra-vars file with the site."""
    llama_server.install(push, "ct", workdir, binary, MODELS)
    site = workdir / "llama-site.yml"
    site.write_text(yaml.safe_dump({"ct200_site": llama_site()}, sort_keys=False))
    return site


_SG = "servers[1]"  # qwen-tp4-dflash, an SGLang server on GPUs 4-7
_EAGLE = {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
_DRAFT = "/dev/shm/models/qwen3.6-27b-dflash"

#: (id, edits of the example) -> the server whose unit to check is servers[1], "qwen-tp4-dflash".
VARIANTS: Final[list[tuple[str, dict[str, object]]]] = [
    ("sglang-none", {f"{_SG}.speculative": DROP}),
    (
        "sglang-eagle",
        {f"{_SG}.speculative": {"algorithm": "EAGLE", "draft_model": _DRAFT, **_EAGLE}},
    ),
    (
        "sglang-eagle3-unsized",
        {f"{_SG}.speculative": {"algorithm": "EAGLE3", "draft_model": _DRAFT}},
    ),
    ("sglang-nextn", {f"{_SG}.speculative": {"algorithm": "NEXTN"}}),
    (
        "sglang-standalone",
        {f"{_SG}.speculative": {"algorithm": "STANDALONE", "draft_model": _DRAFT}},
    ),
    ("sglang-ngram", {f"{_SG}.speculative": {"algorithm": "NGRAM"}}),
    ("sglang-dflash", {}),
    (
        "sglang-ddtree",
        {f"{_SG}.speculative": {"algorithm": "DDTREE", "draft_model": _DRAFT, "budget": 15}},
    ),
    (
        "sglang-args-and-env",
        {
            f"{_SG}.args": {
                "mem-fraction-static": 0.85,
                "trust-remote-code": True,
                "enable-torch-compile": False,
                "cuda-graph-bs": [1, 2, 4, 8],
                "chat-template": "/etc/templates/a b.jinja",
                "served-model-name": "qwen",
            },
            f"{_SG}.env": {"VIRTUAL_ENV": "/opt/sglang-ddtree", "NCCL_DEBUG": "INFO", "X": "$a%b"},
            f"{_SG}.start_timeout": 3600,
        },
    ),
    ("sglang-any-host", {f"{_SG}.host": "0.0.0.0"}),  # noqa: S104 - a spec value, not a bind
    ("sglang-no-numa", {"gpus.numa": DROP}),
    ("sglang-spans-numa", {f"{_SG}.gpus": [2, 3, 4, 5], "servers[0].gpus": [0, 1, 6, 7]}),
    ("vllm-none", {f"{_SG}.engine": "vllm", f"{_SG}.speculative": DROP}),
    (
        "vllm-eagle3",
        {
            f"{_SG}.engine": "vllm",
            f"{_SG}.speculative": {"algorithm": "EAGLE3", "draft_model": _DRAFT, **_EAGLE},
            f"{_SG}.args": {"max-model-len": 32768, "enforce-eager": True, "no-x": False},
        },
    ),
    ("vllm-ngram", {f"{_SG}.engine": "vllm", f"{_SG}.speculative": {"algorithm": "NGRAM"}}),
    ("vllm-mtp", {f"{_SG}.engine": "vllm", f"{_SG}.speculative": {"algorithm": "NEXTN"}}),
    (
        "vllm-draft-model",
        {
            f"{_SG}.engine": "vllm",
            f"{_SG}.speculative": {"algorithm": "STANDALONE", "draft_model": _DRAFT},
        },
    ),
    (
        "command-gpu",
        {
            f"{_SG}.engine": "command",
            f"{_SG}.speculative": DROP,
            f"{_SG}.command": ["llama-server", "--alias", TRICKY_ALIAS, "--port", "30001"],
        },
    ),
    (
        "command-cpu",
        {
            f"{_SG}.engine": "command",
            f"{_SG}.speculative": DROP,
            f"{_SG}.gpus": [],
            f"{_SG}.command": ["/usr/local/bin/llama-server", "--port", "30001"],
            f"{_SG}.health": "/v1/models",
        },
    ),
]


def variant(changes: dict[str, object]) -> dict[str, Any]:
    return changed(changes)
