"""vLLM: `<python> -m vllm.entrypoints.openai.api_server --model ... --speculative-config JSON`.

Ready: /v1/models (vLLM's /health only reads an error flag). Its speculative: block is
SGLang's, mapped to --speculative-config's methods; DFLASH and DDTREE are SGLang's only.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Final

from ct200_tools.engines import sglang
from ct200_tools.engines.base import (
    Draft,
    PythonEngine,
    Report,
    arg_words,
    model_path,
    python_of,
)

if TYPE_CHECKING:
    from ct200_tools.spec import ServerSpec, SiteSpec

#: What vLLM's --speculative-config calls each algorithm.
VLLM_METHODS: Final = {
    "EAGLE": "eagle",
    "EAGLE3": "eagle3",
    "NEXTN": "mtp",
    "STANDALONE": "draft_model",
    "NGRAM": "ngram",
}
SPECULATIVE: Final = replace(sglang.SPECULATIVE, algorithms=tuple(VLLM_METHODS))

__all__ = ["ENGINE", "VLLM_METHODS", "arg_words", "speculative_config"]


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
    name = "vllm"
    summary = "vLLM's OpenAI-compatible server (vllm.entrypoints.openai.api_server)"
    ready_path = "/v1/models"
    module = "vllm.entrypoints.openai.api_server"
    dist = "vllm"
    reserved_args = sglang.RESERVED
    speculative = SPECULATIVE
    install = "pip install vllm into the server's VIRTUAL_ENV"

    def argv(self, site: SiteSpec, server: ServerSpec) -> list[str]:
        module = self.module or ""
        words = [python_of(server), "-m", module, "--model", model_path(site, server)]
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

    def check(self, draft: Draft, report: Report) -> None:
        sglang.check_block(draft, report)
        spec = draft.speculative
        if spec is not None and spec.eagle_topk not in (None, 1):
            report.error(
                f"{draft.path}.speculative.eagle_topk",
                f"vLLM's --speculative-config drafts one chain; eagle_topk {spec.eagle_topk} is "
                "SGLang's tree",
                "set eagle_topk: 1 (num_steps becomes num_speculative_tokens), or use sglang",
            )


ENGINE: Final = VLLM()
