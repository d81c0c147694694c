"""vLLM: `<python> -m vllm.entrypoints.openai.api_server --model ... --speculative-config JSON`.

Ready: /v1/models (vLLM's /health only reads an error flag).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Final

from ct200_tools.serve.engines.base import PythonEngine, model_path, python_of
from ct200_tools.spec.servers import VLLM_METHODS

if TYPE_CHECKING:
    from ct200_tools.spec import ServerSpec, SiteSpec


def arg_words(key: str, value: object) -> list[str]:
    """One free-form argument as argv words: true is a bare flag, false vLLM's --no-KEY."""
    if value is True:
        return [f"--{key}"]
    if value is False:
        return [f"--no-{key}"]
    if isinstance(value, tuple | list):
        return [f"--{key}", *(str(v) for v in value)]
    return [f"--{key}", str(value)]


def speculative_config(server: ServerSpec) -> dict[str, object] | None:
    """vLLM's --speculative-config: method, draft model, and num_steps as the tokens to propose."""
    spec = server.speculative
    if spec is None:
        return None
    config: dict[str, object] = {"method": VLLM_METHODS.get(spec.algorithm, spec.algorithm)}
    if spec.draft_model is not None:
        config["model"] = spec.draft_model
    if spec.num_steps is not None:
        config["num_speculative_tokens"] = spec.num_steps
    return config


class VLLM(PythonEngine):
    name: Final = "vllm"
    ready_path: Final = "/v1/models"
    module: Final = "vllm.entrypoints.openai.api_server"
    dist: Final = "vllm"
    config_file: Final = False

    def argv(self, site: SiteSpec, server: ServerSpec) -> list[str]:
        words = [python_of(server), "-m", self.module, "--model", model_path(site, server)]
        words += ["--tensor-parallel-size", str(server.tp)]
        words += ["--host", server.host, "--port", str(server.port)]
        if not any(k.replace("_", "-") == "served-model-name" for k in server.args):
            words += ["--served-model-name", self.served_name(server)]
        spec = speculative_config(server)
        if spec is not None:
            words += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
        for key, value in server.args.items():
            words += arg_words(key, value)
        return words

    def config(self, site: SiteSpec, server: ServerSpec) -> dict[str, object] | None:
        return None


ENGINE: Final = VLLM()
