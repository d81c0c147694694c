"""engine: llamacpp (llama.cpp's llama-server): its argv from the spec, and its speculative:
block validated with field paths and fixes. The argv serving for real: tests/llama."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from ct200_tools.engines import ENGINES, llamacpp
from ct200_tools.serve import engines
from ct200_tools.spec import SpecError, spec_to_dict, validate

SITE: dict[str, Any] = {
    "gpus": {"count": 2, "model": "RTX PRO 6000"},
    "models": [
        {"name": "tiny", "source": "/tank/models/tiny", "staged": "/dev/shm/models/tiny"},
        {"name": "tiny-draft", "source": "/tank/models/d", "staged": "/dev/shm/models/d.gguf"},
    ],
    "servers": [
        {"name": "tiny", "engine": "llamacpp", "model": "tiny", "gpus": [], "port": 8081},
    ],
}


def site(**server: object) -> dict[str, Any]:
    data = copy.deepcopy(SITE)
    data["servers"][0].update(server)
    return data


def argv(**server: object) -> list[str]:
    spec = validate(site(**server))
    return engines.argv(spec, spec.servers[0])


def problems(**server: object) -> list[str]:
    with pytest.raises(SpecError) as info:
        validate(site(**server))
    return [str(i) for i in info.value.issues]


def test_registered_by_its_module_alone() -> None:
    assert ENGINES["llamacpp"] is llamacpp.ENGINE


def test_cpu_server_argv() -> None:
    assert argv() == [
        "llama-server",
        "-m",
        "/dev/shm/models/tiny/model.gguf",
        "--alias",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        "8081",
        "-np",
        "1",
        "--metrics",
    ]
    spec = validate(site())
    assert engines.ready_path(spec.servers[0]) == "/health"
    assert engines.served_name(spec.servers[0]) == "tiny"
    assert engines.config(spec, spec.servers[0]) is None


def test_program_slots_gguf_gpus_and_free_args() -> None:
    words = argv(
        command=["/opt/llama/llama-server"],
        gpus=[0, 1],
        args={"parallel": 4, "gguf": "q4.gguf", "ctx-size": 8192, "flash-attn": True},
    )
    assert words[:3] == ["/opt/llama/llama-server", "-m", "/dev/shm/models/tiny/q4.gguf"]
    assert words[words.index("-np") + 1] == "4"
    assert words[words.index("-ngl") + 1] == "99"
    assert words[-3:] == ["--ctx-size", "8192", "--flash-attn"]
    assert "--parallel" not in words and "--gguf" not in words


def test_speculative_maps_to_llama_server_flags() -> None:
    words = argv(
        speculative={
            "algorithm": "draft-simple",
            "draft_model": "/dev/shm/models/d.gguf",
            "draft_ngl": 99,
            "n_max": 16,
            "n_min": 2,
        }
    )
    tail = words[words.index("--spec-type") :]
    assert tail == [
        "--spec-type",
        "draft-simple",
        "-md",
        "/dev/shm/models/d.gguf",
        "--spec-draft-ngl",
        "99",
        "--spec-draft-n-max",
        "16",
        "--spec-draft-n-min",
        "2",
    ]
    spec = validate(
        site(speculative={"algorithm": "draft-eagle3", "draft_model": "/dev/shm/models/d.gguf"})
    )
    assert [m.name for m in spec.needed_models()] == ["tiny", "tiny-draft"]  # staged together
    ngram = argv(speculative={"algorithm": "ngram-simple", "n_max": 8})
    assert "-md" not in ngram and ngram[ngram.index("--spec-type") + 1] == "ngram-simple"


def test_synth_len_only_for_a_benchmark() -> None:
    block = {"algorithm": "ngram-simple", "synth_len": 3}
    got = problems(speculative=block)
    assert any(p.startswith("servers[0].speculative.synth_len: --spec-synth-len") for p in got)
    assert any("benchmark_only: true" in p for p in got)
    words = argv(speculative={**block, "benchmark_only": True})
    assert words[words.index("--spec-synth-len") + 1] == "3"


@pytest.mark.parametrize(
    ("server", "path", "fragment"),
    [
        (
            {"speculative": {"algorithm": "draft-simple"}},
            "speculative.draft_model",
            "needs a draft",
        ),
        (
            {"speculative": {"algorithm": "EAGLE3", "draft_model": "/m"}},
            "speculative.algorithm",
            "draft-simple",
        ),
        (
            {"speculative": {"algorithm": "ngram-simple", "budget": 15}},
            "speculative.budget",
            "unknown key",
        ),
        (
            {"speculative": {"algorithm": "ngram-simple", "n_max": 2, "n_min": 4}},
            "speculative.n_min",
            "more than n_max",
        ),
        (
            {"speculative": {"algorithm": "ngram-simple", "draft_ngl": 9}},
            "speculative.draft_ngl",
            "no draft model",
        ),
        ({"command": ["/usr/bin/llama-server", "--port", "1"]}, "command", "only its program"),
        ({"args": {"port": 9}}, "args.port", "own fields"),
        ({"args": {"np": 9}}, "args.np", "own fields"),
        ({"args": {"parallel": "many"}}, "args.parallel", "whole number"),
    ],
)
def test_bad_fields_name_their_path_and_fix(
    server: dict[str, object], path: str, fragment: str
) -> None:
    got = problems(**server)
    assert any(p.startswith(f"servers[0].{path}:") and fragment in p for p in got), got


def test_round_trip() -> None:
    spec = validate(
        site(
            gpus=[0],
            args={"parallel": 2},
            speculative={
                "algorithm": "draft-dflash",
                "draft_model": "/dev/shm/models/d.gguf",
                "n_max": 8,
            },
        )
    )
    again = validate(spec_to_dict(spec))
    assert again.servers == spec.servers
    assert again.servers[0].speculative is not None
    assert again.servers[0].speculative.options == {"n_max": 8}
