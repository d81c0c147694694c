"""SGLang: `<python> -m sglang.launch_server --config /etc/ct200/servers/NAME.yaml`.

Every argument goes through the YAML file, so no value needs shell or systemd quoting. Ready:
/health_generate runs a 1-token generation (503 while loading). Its speculative: block (the
algorithms, EAGLE's three sizing flags, DDTREE's budget) is vLLM's too, which maps it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ct200_tools.engines.base import (
    COMMON_RESERVED,
    Draft,
    Field,
    PythonEngine,
    Report,
    Speculative,
    model_path,
    python_of,
)
from ct200_tools.engines.paths import config_path

if TYPE_CHECKING:
    from ct200_tools.spec import ServerSpec, SiteSpec

EAGLE_FLAGS: Final = ("num_steps", "eagle_topk", "num_draft_tokens")
#: The speculative: block of SGLang (and vLLM's, with fewer algorithms).
SPECULATIVE: Final = Speculative(
    algorithms=("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DDTREE"),
    upper=True,
    #: NEXTN drafts with the model's own MTP layers and NGRAM from the prompt.
    no_draft_model=("NGRAM", "NEXTN"),
    draft_model_ignored=("NGRAM",),
    fields={
        "budget": Field("budget: 15"),
        "num_steps": Field("num_steps: 3"),
        "eagle_topk": Field("eagle_topk: 1"),
        "num_draft_tokens": Field("num_draft_tokens: 4"),
    },
    example="speculative: {algorithm: DFLASH, draft_model: /dev/shm/models/...}",
)
#: What the unit renders from the server's fields (tensor parallelism, the speculative block).
RESERVED: Final = (
    COMMON_RESERVED
    | {"model-path", "tp", "tp-size", "tensor-parallel-size"}
    | {f"speculative-{k}" for k in ("config", "algorithm", "draft-model-path", "num-steps")}
    | {f"speculative-{k}" for k in ("eagle-topk", "num-draft-tokens", "ddtree-budget")}
)


def check_block(draft: Draft, report: Report) -> None:
    """The SGLang block's own rules (vLLM's too): EAGLE's flags all or none, budget only for
    DDTREE, DFLASH's forced sizes, DDTREE's page size."""
    spec, where = draft.speculative, f"{draft.path}.speculative"
    if spec is None:
        return
    values = {"num_steps": spec.num_steps, "eagle_topk": spec.eagle_topk}
    values["num_draft_tokens"] = spec.num_draft_tokens
    given = [k for k in EAGLE_FLAGS if values[k] is not None]
    if 0 < len(given) < len(EAGLE_FLAGS):
        missing = [k for k in EAGLE_FLAGS if k not in given]
        report.error(
            where,
            f"sets {', '.join(given)} but not {', '.join(missing)}: setting some is the classic "
            "SGLang launch AssertionError",
            "set all three of num_steps, eagle_topk and num_draft_tokens, or none (SGLang then "
            "chooses them)",
        )
    algorithm = spec.algorithm
    if algorithm != "DDTREE" and spec.budget is not None:
        report.error(
            f"{where}.budget",
            f"budget only applies to DDTREE, not {algorithm}",
            "remove budget, or set algorithm: DDTREE",
        )
    if algorithm == "DDTREE" and spec.budget is None:
        report.warn(
            where,
            "DDTREE without budget runs with the build's default tree budget",
            "set budget (15 was best for Qwen3.6 on CT200; larger trees leak state on hybrid "
            "Mamba models)",
        )
    for key in ("num_steps", "eagle_topk"):
        if algorithm == "DFLASH" and values[key] not in (None, 1):
            report.error(
                f"{where}.{key}", f"DFLASH forces {key} to 1, got {values[key]}", f"set {key}: 1"
            )
    page = draft.args.get("page-size", draft.args.get("page_size"))
    if algorithm == "DDTREE" and page not in (None, 1, "1"):
        report.error(
            f"{draft.path}.args.page-size",
            f"DDTREE requires page size 1, got {page!r}",
            "set args: {page-size: 1} (SGLang PR #29907), or another algorithm",
        )


class SGLang(PythonEngine):
    name = "sglang"
    summary = "SGLang's OpenAI-compatible server (sglang.launch_server)"
    ready_path = "/health_generate"
    module = "sglang.launch_server"
    dist = "sglang"
    config_file = True
    reserved_args = RESERVED
    speculative = SPECULATIVE
    install = "pip install sglang into the server's VIRTUAL_ENV"

    def argv(self, site: SiteSpec, server: ServerSpec) -> list[str]:
        module = self.module or ""
        return [python_of(server), "-m", module, "--config", config_path(server.name)]

    def config(self, site: SiteSpec, server: ServerSpec) -> dict[str, object] | None:
        return self.options(site, server)

    def check(self, draft: Draft, report: Report) -> None:
        check_block(draft, report)

    def options(self, site: SiteSpec, server: ServerSpec) -> dict[str, object]:
        """SGLang's arguments as its --config YAML takes them (long flag names, dashes)."""
        config: dict[str, object] = {
            "model-path": model_path(site, server),
            "tp-size": server.tp,
            "host": server.host,
            "port": server.port,
            "served-model-name": self.served_name(server),
        }
        spec = server.speculative
        if spec is not None:
            config["speculative-algorithm"] = spec.algorithm
            optional = {
                "speculative-draft-model-path": spec.draft_model,
                "speculative-num-steps": spec.num_steps,
                "speculative-eagle-topk": spec.eagle_topk,
                "speculative-num-draft-tokens": spec.num_draft_tokens,
                "speculative-ddtree-budget": spec.budget,
            }
            config.update({k: v for k, v in optional.items() if v is not None})
        for key, value in server.args.items():
            if key.replace("_", "-") not in config:  # served-model-name: written once, above
                config[key] = list(value) if isinstance(value, tuple) else value
        return config


ENGINE: Final = SGLang()
