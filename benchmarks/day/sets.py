"""The benchmark day's serving sets (examples/benchmark-day/) made concrete for one machine, and
the plan cut into one plan per set for `ct200-bench run PLAN --target URL`.

The site spec there is the one a CT200 would carry (a GPU, staged models under /dev/shm, the
program on the path); `machine_raw` puts this machine's program, model files and GPU (or none) into
a copy, and changes nothing else: every set's speculative block and passthrough args
are rendered by the engine module as written, so what starts here is what the spec says.
"""

from __future__ import annotations

import copy
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from ct200_tools import serverhttp
from ct200_tools.serve import engines
from ct200_tools.spec import SiteSpec, validate

DAY = Path(__file__).resolve().parents[2] / "examples" / "benchmark-day"
SITE = DAY / "site.yml"
PLAN = DAY / "plan.yml"
BASELINE = "ar"


def raw_site() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(SITE.read_text())["ct200_site"]
    return data


def set_names() -> list[str]:
    return [s["name"] for s in raw_site()["servers"]]


def machine_raw(
    *,
    program: Path,
    staged: Mapping[str, Path] | None = None,
    source: Mapping[str, Path] | None = None,
    gpu: str | None,
    args: Mapping[str, Any] | None = None,
    port: int | None = None,
) -> dict[str, Any]:
    """The day's site (`ct200_site`'s value) for this machine: `program` as every server's
    command; each model's staged path (a GGUF file or a directory holding model.gguf) and
    persistent copy from `staged` and `source` (model name -> path), the draft paths following
    their models; `gpu` the GPU's model as NVML names it, or None for llama-server on the CPU
    (no GPU: gpus: [] and no draft_ngl); `args` over each server's args, `port` for all."""
    site = copy.deepcopy(raw_site())
    moved = {}
    for model in site["models"]:
        name = model["name"]
        if source and name in source:
            model["source"] = str(source[name])
        if staged and name in staged:
            moved[model["staged"]] = str(staged[name])
            model["staged"] = str(staged[name])
    site["gpus"] = {"count": 1, "model": gpu} if gpu else {"count": 0, "model": "none"}
    for server in site["servers"]:
        server["command"] = [str(program)]
        server["args"] = {**server.get("args", {}), **(args or {})}
        if port is not None:
            server["port"] = port
        spec = server.get("speculative")
        if spec is not None and spec.get("draft_model") in moved:
            spec["draft_model"] = moved[spec["draft_model"]]
        if not gpu:
            server["gpus"] = []
            if spec is not None:
                spec.pop("draft_ngl", None)
    return site


def machine_site(**kwargs: Any) -> SiteSpec:
    """machine_raw, validated as the tools read it."""
    return validate(machine_raw(**kwargs))


def set_plan(name: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The day's plan for one serving set (a --target run measures one server), dataset paths
    made absolute (the plan is written elsewhere), `overrides` over its top-level keys (a
    smaller sweep for a test or a device session's budget)."""
    plan: dict[str, Any] = yaml.safe_load(PLAN.read_text())
    plan.update(copy.deepcopy(dict(overrides or {})))
    plan["serving_sets"] = [name]
    for w in plan["workloads"]:
        if isinstance(w.get("prompts"), str):
            w["prompts"] = str((DAY / w["prompts"]).resolve())
    return plan


def write_plan(path: Path, plan: Mapping[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(dict(plan), sort_keys=False))
    return path


@contextmanager
def serving(
    site: SiteSpec, name: str, log: Path, timeout_s: float = 300.0
) -> Iterator[tuple[list[str], str]]:
    """The set's server started from its rendered argv (as its unit's ExecStart), until /health
    answers 200; yields (argv, base URL); stopped on exit."""
    server = next(s for s in site.servers if s.name == name)
    argv = engines.argv(site, server)
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            until = time.monotonic() + timeout_s
            status = None
            while status != 200:
                if proc.poll() is not None:
                    tail = log.read_bytes()[-3000:].decode("utf-8", "replace")
                    raise RuntimeError(f"{name}: llama-server exited {proc.returncode}:\n{tail}")
                if time.monotonic() > until:
                    raise RuntimeError(f"{name}: /health not 200 after {timeout_s:.0f} s")
                try:
                    status, _ = serverhttp.request("GET", engines.ready_url(server), None, 2.0)
                except OSError:
                    status = None
                if status != 200:
                    time.sleep(0.2)
            yield argv, engines.base_url(server)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
