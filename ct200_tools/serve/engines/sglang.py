"""SGLang: `<python> -m sglang.launch_server --config /etc/ct200/servers/NAME.yaml`.

Every argument goes through the YAML file, so no value needs shell or systemd quoting. Ready:
/health_generate runs a 1-token generation (503 while loading).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ct200_tools.serve.engines.base import PythonEngine, model_path, python_of
from ct200_tools.serve.engines.paths import config_path

if TYPE_CHECKING:
    from ct200_tools.spec import ServerSpec, SiteSpec


class SGLang(PythonEngine):
    name: Final = "sglang"
    ready_path: Final = "/health_generate"
    module: Final = "sglang.launch_server"
    dist: Final = "sglang"
    config_file: Final = True

    def argv(self, site: SiteSpec, server: ServerSpec) -> list[str]:
        return [python_of(server), "-m", self.module, "--config", config_path(server.name)]

    def config(self, site: SiteSpec, server: ServerSpec) -> dict[str, object] | None:
        return self.options(site, server)

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
