"""The engine kinds: one module each in ct200_tools.engines, found there; the spec's grammar
admits exactly the kinds a module declares, and asks the declaration what each accepts."""

from __future__ import annotations

import pkgutil
from pathlib import Path

import ct200_tools.engines as registry
from ct200_tools.engines import command, sglang, vllm
from ct200_tools.engines.base import Engine
from ct200_tools.serve import engines
from ct200_tools.spec import SiteSpec, validate
from ct200_tools.spec.servers import ENGINES as SPEC_ENGINES
from tests.unit.spec_helpers import example


def test_every_engine_module_is_found_and_the_spec_admits_exactly_those() -> None:
    modules = {i.name for i in pkgutil.iter_modules(registry.__path__)}
    declared = {
        m: getattr(__import__(f"ct200_tools.engines.{m}", fromlist=["_"]), "ENGINE", None)
        for m in modules
    }
    kinds = {e.name: e for e in declared.values() if isinstance(e, Engine)}
    assert {"sglang", "vllm", "command"} <= set(kinds)  # the walk found the modules
    assert kinds == registry.ENGINES
    assert engines.ENGINES is registry.ENGINES
    assert tuple(registry.ENGINES) == SPEC_ENGINES  # derived, never written
    assert registry.ENGINES["sglang"] is sglang.ENGINE
    assert registry.ENGINES["vllm"] is vllm.ENGINE
    assert registry.ENGINES["command"] is command.ENGINE


def test_each_engine_declares_what_it_is_and_accepts() -> None:
    for name, kind in registry.ENGINES.items():
        assert kind.name == name
        assert kind.summary, name
        assert kind.install, name
        assert kind.ready_path.startswith("/"), name
        assert kind.takes_command in ("argv", "program", "none"), name
        assert {"model", "host", "port"} <= kind.reserved_args, name
        if kind.speculative is not None:
            assert kind.speculative.algorithms, name
            assert not {"algorithm", "draft_model"} & set(kind.speculative.fields), name


def test_no_engine_name_is_tested_outside_its_module() -> None:
    """The spec, the preflight, the doctor, the renderer and the benchmark ask the engine's
    declaration; a comparison with an engine's name elsewhere is a second list (issue 30)."""
    root = Path(registry.__file__).parents[1]
    names = [f'"{n}"' for n in registry.ENGINES]
    wrong = []
    for path in sorted(root.rglob("*.py")):
        if path.parent.name == "engines" and path.parent.parent == root:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if any(f"== {q}" in code or f"!= {q}" in code or f"in ({q}" in code for q in names):
                wrong.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    assert wrong == []


def test_each_kind_answers_the_interface_for_the_example_sites() -> None:
    data = example()
    first = data["servers"][0]
    data["servers"].append(
        {
            "name": "llama",
            "engine": "command",
            "model": first["model"],
            "gpus": first["gpus"],
            "port": 18080,
            "enabled": False,
            "command": ["/usr/local/bin/llama-server", "--alias", "tiny", "--port", "18080"],
        }
    )
    for i, name in enumerate(n for n in registry.ENGINES if n not in ("command", "vllm")):
        if name != first["engine"]:
            data["servers"].append(
                {
                    "name": f"other-{i}",
                    "engine": name,
                    "model": first["model"],
                    "gpus": first["gpus"],
                    "port": 18100 + i,
                    "enabled": False,
                }
            )
    data["servers"].append(
        {
            "name": "qwen-vllm",
            "engine": "vllm",
            "model": first["model"],
            "gpus": first["gpus"],
            "port": 18081,
            "enabled": False,
        }
    )
    site: SiteSpec = validate(data)
    servers = [(site, server) for server in site.servers]
    assert {server.engine for _, server in servers} == set(engines.ENGINES)
    for _, server in servers:
        kind = engines.kind(server)
        assert kind.name == server.engine
        argv = engines.argv(site, server)
        assert argv[0] == engines.program(server)
        assert engines.ready_path(server) == (server.health or kind.ready_path)
        assert engines.ready_path(server).startswith("/")
        assert (engines.config(site, server) is not None) == kind.config_file
        if kind.module is not None:  # a Python engine: its interpreter runs its module
            assert argv[1:3] == ["-m", kind.module]
            assert engines.engine_python(server) == argv[0]


def test_readiness_paths_are_the_engines_own() -> None:
    assert sglang.ENGINE.ready_path == "/health_generate"  # runs a 1-token generation
    assert vllm.ENGINE.ready_path == "/v1/models"  # vLLM's /health only reads a flag
    assert command.ENGINE.ready_path == "/health"  # llama.cpp: 503 while loading
