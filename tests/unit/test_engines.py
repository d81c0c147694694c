"""The engine kinds: one module each behind base.Engine, and the spec's grammar admits exactly
the kinds a module implements."""

from __future__ import annotations

from ct200_tools.serve import engines
from ct200_tools.serve.engines import command, sglang, vllm
from ct200_tools.spec import SiteSpec, validate
from ct200_tools.spec.servers import ENGINES as SPEC_ENGINES
from tests.unit.spec_helpers import example


def test_every_kind_the_spec_admits_has_a_module_and_no_more() -> None:
    assert set(engines.ENGINES) == set(SPEC_ENGINES)
    assert engines.ENGINES == {
        "sglang": sglang.ENGINE,
        "vllm": vllm.ENGINE,
        "command": command.ENGINE,
    }


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
