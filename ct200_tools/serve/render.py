"""Render a server's unit, EnvironmentFile and SGLang config from templates/, as Ansible does.

The same Jinja2 templates (top-level templates/, shipped in the wheel as ct200_tools/templates)
are rendered by the inference_servers role (ansible.builtin.template) and here, with the same
variables: ``ct200_site`` (the site spec's mapping), ``server`` (one of its servers) and
``ct200_tools_bin`` (where ct200-tools' commands are installed). The filters below do the work in
both, registered here and, for Ansible, by roles/inference_servers/filter_plugins; so the doctor
can render the unit it expects and compare it with the installed one, byte for byte.
"""

from __future__ import annotations

import functools
import json
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final, cast

import jinja2
import yaml

from ct200_tools.serve import engines
from ct200_tools.spec import DEFAULT_SPEC_PATH, ServerSpec, SiteSpec, spec_to_dict, validate

UNIT_TEMPLATE: Final = "ct200-server.service.j2"
ENV_TEMPLATE: Final = "ct200-server.env.j2"
CONFIG_TEMPLATE: Final = "ct200-server.yaml.j2"
#: One line of documentation for the variables a site is likely to set; the env file repeats it
#: above each, so the file explains itself where it is read.
ENV_DOCS: Final = {
    "NCCL_PROTO": "NCCL protocols to use (LL, LL128, Simple). NCCL's docs file it under debugging "
    "variables: set per server, in plain sight, from a benchmark on this machine.",
    "NCCL_ALGO": "NCCL collective algorithms (Ring, Tree, ...). A debugging variable in NCCL's "
    "docs: set per server, from a benchmark on this machine.",
    "NCCL_P2P_DISABLE": "1: no GPU peer-to-peer transfers in NCCL (through host memory instead).",
    "NCCL_P2P_LEVEL": "How far apart (PIX, PXB, PHB, SYS) two GPUs may be for NCCL to use P2P.",
    "NCCL_SHM_DISABLE": "1: no shared-memory transport (/dev/shm) in NCCL.",
    "NCCL_IB_DISABLE": "1: NCCL does not look for InfiniBand/RoCE.",
    "NCCL_DEBUG": "NCCL's log level (WARN, INFO, TRACE), into the journal.",
    "NCCL_SOCKET_IFNAME": "The network interfaces NCCL's bootstrap may use.",
    "VIRTUAL_ENV": "The engine's Python environment: the unit runs $VIRTUAL_ENV/bin/python.",
    "OMP_NUM_THREADS": "OpenMP threads per process (CPU-side work of each TP rank).",
    "PYTORCH_CUDA_ALLOC_CONF": "PyTorch's CUDA caching allocator settings.",
    "HF_HUB_OFFLINE": "1: no Hugging Face downloads; the model is read from its staged copy.",
}
ENV_PREFIX_DOCS: Final = {
    "NCCL_": "An NCCL setting (see NCCL's environment variable docs).",
    "SGLANG_": "An SGLang setting.",
    "VLLM_": "A vLLM setting.",
    "CUDA_": "A CUDA runtime setting.",
}


@functools.lru_cache(maxsize=32)
def _validated(text: str) -> SiteSpec:
    return validate(json.loads(text))


def site_of(ct200_site: Mapping[str, Any]) -> SiteSpec:
    """The typed spec of a ct200_site mapping (raw group_vars or the canonical form alike)."""
    return _validated(json.dumps(ct200_site, default=str))


def _server(site: SiteSpec, server: Mapping[str, Any]) -> ServerSpec:
    found = site.server(str(server["name"]))
    if found is None:
        raise ValueError(f"server {server['name']!r} is not in ct200_site.servers")
    return found


def _index(site: SiteSpec, server: ServerSpec) -> int:
    return site.servers.index(server)


def unit_fields(
    server: Mapping[str, Any], ct200_site: Mapping[str, Any], tools_bin: str
) -> dict[str, Any]:
    """Everything the unit template writes, already in systemd's syntax."""
    site = site_of(ct200_site)
    s = _server(site, server)
    bin_dir = tools_bin.rstrip("/")
    models = engines.models_of(site, s)
    nodes = engines.numa_nodes(site, s)
    spec_arg = ["--spec", DEFAULT_SPEC_PATH]
    draft = s.speculative.draft_model if s.speculative else None
    drafter = next((m.name for m in models if m.staged == draft), draft)
    what = f"{s.engine}, model {s.model}" + (f", draft {drafter}" if drafter else "")
    return {
        "name": s.name,
        "index": _index(site, s),
        "unit": engines.unit_name(s.name),
        "description": f"ct200 inference server {s.name} ({what})",
        "stage_units": [engines.stage_unit(m.name) for m in models],
        "gpus": ",".join(str(g) for g in s.gpus),
        "numa_nodes": ",".join(str(n) for n in nodes) if nodes is not None else "",
        "numa_spans": nodes is not None and len(nodes) > 1,
        "numa_declared": bool(site.gpus.numa),
        "user": engines.SERVICE_USER,
        "cache_dir": engines.cache_dir(s.name),
        "cache_rel": engines.cache_dir(s.name).removeprefix("/var/cache/"),
        "env_file": engines.env_path(s.name),
        "config_file": engines.config_path(s.name) if engines.kind(s).config_file else "",
        "preflight": engines.exec_line([f"{bin_dir}/ct200-serve", "preflight", s.name, *spec_arg]),
        "gate": engines.exec_line([f"{bin_dir}/ct200-doctor", "gate", s.name, *spec_arg]),
        "exec_start": engines.exec_line(engines.argv(site, s)),
        "ready_path": engines.ready_path(s),
        "wait_ready": engines.exec_line(
            [
                f"{bin_dir}/ct200-serve",
                "wait-ready",
                s.name,
                *spec_arg,
                "--timeout",
                str(engines.ready_timeout(site, s)),
            ]
        ),
        # Once it serves, its start limit and restart counter start again (see the template).
        "served": engines.exec_line([engines.SYSTEMCTL, "reset-failed", engines.unit_name(s.name)]),
        # Once the engine ended after it served, the status line says so (see the template).
        "stopped": engines.exec_line([f"{bin_dir}/ct200-serve", "stopped", s.name]),
        "start_timeout": engines.start_timeout(site, s),
        "start_timeout_default": s.start_timeout is None,
        "stop_timeout": engines.STOP_TIMEOUT,
        "restart_sec": engines.RESTART_SEC,
        "burst": engines.START_LIMIT_BURST,
        "interval": engines.start_limit_interval(site, s),
    }


def env_entries(server: Mapping[str, Any], ct200_site: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The EnvironmentFile's lines, each with its documentation (lines) written above it."""
    site = site_of(ct200_site)
    s = _server(site, server)
    where = f"servers[{_index(site, s)}].env"
    entries = []
    for key, value in s.env.items():
        doc = ENV_DOCS.get(key) or next(
            (d for p, d in ENV_PREFIX_DOCS.items() if key.startswith(p)), "Set by the site spec."
        )
        text = f"{key}: {doc} ({where}.{key})"
        entries.append({"doc": textwrap.wrap(text, 98), "line": engines.env_file_line(key, value)})
    return entries


def engine_config_yaml(server: Mapping[str, Any], ct200_site: Mapping[str, Any]) -> str:
    """The config file the server's engine reads beside its argv (SGLang's --config), as YAML."""
    site = site_of(ct200_site)
    config = engines.config(site, _server(site, server))
    if config is None:
        raise ValueError(f"server {server['name']}: engine {server['engine']} reads no config")
    text = yaml.safe_dump(config, sort_keys=False, default_flow_style=False, allow_unicode=True)
    return text.rstrip("\n")  # the template ends the file with its own newline


def config_servers(servers: list[Mapping[str, Any]], wanted: bool = True) -> list[Any]:
    """The servers whose engine reads a config file (wanted), or the others: which servers the
    role renders a config for, and whose stale config it removes."""
    return [s for s in servers if engines.ENGINES[s["engine"]].config_file == wanted]


def unit_files(
    servers: list[Mapping[str, Any]],
    ct200_site: Mapping[str, Any],
    tools_bin: str,
    unit_dir: str,
    prefix: str,
) -> list[dict[str, str]]:
    """Every server's unit as the inference_servers role installs them, in one ct200_files run
    instead of a template task per server: [{dest, content}], the bytes render() writes."""
    template = environment().get_template(UNIT_TEMPLATE)
    return [
        {
            "dest": f"{unit_dir}/{prefix}{server['name']}.service",
            "content": template.render(
                {"ct200_site": ct200_site, "server": server, "ct200_tools_bin": tools_bin}
            ),
        }
        for server in servers
    ]


#: The filters both renderers register, by the names the templates use.
FILTERS: Final[dict[str, Callable[..., Any]]] = {
    "ct200_unit_fields": unit_fields,
    "ct200_env_entries": env_entries,
    "ct200_engine_config": engine_config_yaml,
    "ct200_config_servers": config_servers,
}


@dataclass(frozen=True)
class Rendered:
    """A server's files: path -> content; the SGLang config only for engine sglang."""

    unit: str
    env: str
    config: str | None

    def files(self, name: str, unit_dir: str = "/etc/systemd/system") -> dict[str, str]:
        out = {f"{unit_dir}/{engines.unit_name(name)}": self.unit, engines.env_path(name): self.env}
        if self.config is not None:
            out[engines.config_path(name)] = self.config
        return out


def environment() -> jinja2.Environment:
    """As Ansible's template module sets it up: trim_blocks, keep the final newline, and here
    StrictUndefined, so a misspelt variable is an error, not an empty string."""
    loader = jinja2.FunctionLoader(_load)
    env = jinja2.Environment(
        loader=loader,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # noqa: S701 - systemd units and YAML, not HTML
    )
    env.filters.update(FILTERS)
    return env


def _load(name: str) -> str:
    return (resources.files("ct200_tools") / "templates" / name).read_text(encoding="utf-8")


def render(site: SiteSpec, name: str, tools_bin: str = engines.DEFAULT_TOOLS_BIN) -> Rendered:
    """The files of server `name` of `site`, as the inference_servers role writes them with
    inference_servers_tools_bin = tools_bin (the container play: the tools venv's bin, which is
    os.path.dirname(sys.executable) for ct200-tools' own commands there). KeyError for a name
    the spec lacks."""
    ct200_site = spec_to_dict(site)
    servers = cast(list[dict[str, Any]], ct200_site["servers"])
    server = next((s for s in servers if s["name"] == name), None)
    if server is None:
        raise KeyError(f"no server {name!r} in the site spec")
    env = environment()
    values = {"ct200_site": ct200_site, "server": server, "ct200_tools_bin": tools_bin}
    unit = env.get_template(UNIT_TEMPLATE).render(values)
    env_text = env.get_template(ENV_TEMPLATE).render(values)
    config = None
    if engines.ENGINES[server["engine"]].config_file:
        config = env.get_template(CONFIG_TEMPLATE).render(values)
    return Rendered(unit, env_text, config)
