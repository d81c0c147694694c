"""llama.cpp's llama-server: `llama-server -m MODEL.gguf --host H --port P -np SLOTS --metrics`.

A native binary serving GGUF models, on the CPU (gpus: []) or with every layer on the GPUs
(`-ngl 99`). command: is its program alone (default `llama-server`, found on systemd's search
path as ExecStart= finds it). The model is the staged copy: a path ending in .gguf as it is,
else the file args.gguf (default model.gguf) inside the staged directory. Parallel slots:
args.parallel (default 1) as `-np`. Ready: /health (503 while loading). Served name: the
spec's model name (`--alias`). Other args: pass through as --key value.

speculative: is llama-server's own: algorithm is its --spec-type (draft-simple, draft-eagle3,
draft-dflash with a draft model: `-md` its staged copy; ngram-simple drafts from the prompt),
draft_ngl (--spec-draft-ngl), n_max/n_min (--spec-draft-n-max/-n-min), and synth_len
(--spec-synth-len, a synthetic acceptance length: benchmarking only, so it needs
benchmark_only: true).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ct200_tools.engines.base import (
    COMMON_RESERVED,
    Draft,
    Engine,
    Field,
    Report,
    Speculative,
    arg_words,
    model_path,
)

if TYPE_CHECKING:
    from ct200_tools.spec import ServerSpec, SiteSpec

PROGRAM: Final = "llama-server"
GGUF: Final = "model.gguf"
#: Layers on the GPUs when the server has any: all of them (more than any model has).
GPU_LAYERS: Final = "99"
#: Its own args, read here and not passed through.
OWN_ARGS: Final = ("parallel", "gguf")
SPECULATIVE: Final = Speculative(
    algorithms=("draft-simple", "draft-eagle3", "draft-dflash", "ngram-simple"),
    no_draft_model=("ngram-simple",),
    draft_model_ignored=("ngram-simple",),
    fields={
        "draft_ngl": Field("draft_ngl: 99", lo=0, hi=999),
        "n_max": Field("n_max: 16", lo=1, hi=256),
        "n_min": Field("n_min: 0", lo=0, hi=256),
        "synth_len": Field("synth_len: 3", lo=1, hi=256),
        "benchmark_only": Field("benchmark_only: true", type="bool"),
    },
    example="speculative: {algorithm: draft-simple, draft_model: /dev/shm/models/...}",
)
_FLAGS: Final = {
    "draft_ngl": "--spec-draft-ngl",
    "n_max": "--spec-draft-n-max",
    "n_min": "--spec-draft-n-min",
    "synth_len": "--spec-synth-len",
}


def gguf(staged: str, name: str = GGUF) -> str:
    """The GGUF file of a staged copy: the path itself when it is one, else the file inside."""
    return staged if staged.endswith(".gguf") else f"{staged.rstrip('/')}/{name}"


class LlamaCpp(Engine):
    name = "llamacpp"
    summary = "llama.cpp's llama-server (a native binary serving GGUF models)"
    ready_path = "/health"
    takes_command = "program"
    cpu_ok = True
    reserved_args = (
        COMMON_RESERVED
        | {"m", "alias", "a", "np", "ngl", "gpu-layers", "n-gpu-layers", "metrics"}
        | {"md", "model-draft", "ngld", "gpu-layers-draft", "n-gpu-layers-draft"}
        | {f"spec-{k}" for k in ("type", "draft-model", "draft-ngl", "draft-n-max")}
        | {f"spec-{k}" for k in ("draft-n-min", "synth-len")}
    )
    speculative = SPECULATIVE
    install = "build llama.cpp (cmake --build ... --target llama-server) or use its release"

    def program(self, server: ServerSpec) -> str:
        return server.command[0] if server.command else PROGRAM

    def served_name(self, server: ServerSpec) -> str:
        return server.model

    def argv(self, site: SiteSpec, server: ServerSpec) -> list[str]:
        name = server.args.get("gguf")
        model = gguf(model_path(site, server), name if isinstance(name, str) else GGUF)
        slots = server.args.get("parallel", 1)
        words = [self.program(server), "-m", model, "--alias", self.served_name(server)]
        words += ["--host", server.host, "--port", str(server.port), "-np", str(slots)]
        words += ["--metrics"]
        if server.gpus:
            words += ["-ngl", GPU_LAYERS]
        spec = server.speculative
        if spec is not None:
            words += ["--spec-type", spec.algorithm]
            if spec.draft_model is not None and spec.algorithm not in SPECULATIVE.no_draft_model:
                words += ["-md", gguf(spec.draft_model)]
            for key, flag in _FLAGS.items():
                if key in spec.options:
                    words += [flag, str(spec.options[key])]
        for key, value in server.args.items():
            if key not in OWN_ARGS:
                words += arg_words(key, value)
        return words

    def check(self, draft: Draft, report: Report) -> None:
        slots = draft.args.get("parallel")
        if slots is not None and (not isinstance(slots, int) or isinstance(slots, bool)):
            report.error(
                f"{draft.path}.args.parallel",
                f"the parallel slots are a whole number, got {slots!r}",
                "write e.g. args: {parallel: 4} (llama-server's -np)",
            )
        elif isinstance(slots, int) and not 1 <= slots <= 1024:
            report.error(
                f"{draft.path}.args.parallel",
                f"{slots} slots is out of range 1..1024",
                "write e.g. args: {parallel: 4}",
            )
        spec, where = draft.speculative, f"{draft.path}.speculative"
        if spec is None:
            return
        o = spec.options
        n_max, n_min = o.get("n_max"), o.get("n_min")
        if isinstance(n_max, int) and isinstance(n_min, int) and n_min > n_max:
            report.error(
                f"{where}.n_min",
                f"n_min {n_min} is more than n_max {n_max}",
                f"set n_min to at most {n_max} (the fewest tokens to draft), or raise n_max",
            )
        if "synth_len" in o and o.get("benchmark_only") is not True:
            report.error(
                f"{where}.synth_len",
                "--spec-synth-len fakes the acceptance length: its figures say nothing of a "
                "real drafter (llama-server: benchmarking only)",
                "remove synth_len, or add benchmark_only: true to say this server is for a "
                "benchmark of the verification path only",
            )
        if "draft_ngl" in o and spec.draft_model is None:
            report.error(
                f"{where}.draft_ngl",
                f"draft_ngl puts a draft model's layers on the GPUs, but {spec.algorithm} has "
                "no draft model",
                "remove draft_ngl, or set draft_model",
            )


ENGINE: Final = LlamaCpp()
