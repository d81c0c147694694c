"""The real llama-server with the tiny model, on a free port of this machine: what the testbed's
SGLang stand-in must do (issue 11, section 5)."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from testbed import llama_build, tiny_gguf
from testbed.llama_server import DEFAULT_ALIAS, Server, complete, http_get, metric, stream

from .conftest import CTX, PARALLEL

# The first test of a fresh machine waits for the build (about 6 minutes on 2 cores).
pytestmark = [pytest.mark.llama, pytest.mark.timeout(llama_build.BUILD_TIMEOUT_S)]

#: What the tiny model's character tokens decode to: no control, byte or special token text.
PRINTABLE = {" ", *tiny_gguf.CHARS[1:]}


def _text_ok(text: str) -> bool:
    return set(text) <= PRINTABLE


def test_health_answers_200_once_loaded(server: Server) -> None:
    code, body = http_get(server.base + "/health")
    assert (code, json.loads(body)) == (200, {"status": "ok"})
    # Before that: not listening yet (0) or 503 while loading, never an error of another kind.
    assert server.health_codes[-1] == 200
    assert set(server.health_codes[:-1]) <= {0, 503}, server.health_codes


def test_models_lists_the_alias_and_the_context_is_split_across_slots(server: Server) -> None:
    code, body = http_get(server.base + "/v1/models")
    assert code == 200, body
    models = json.loads(body)["data"]
    assert [m["id"] for m in models] == [DEFAULT_ALIAS]
    assert models[0]["meta"]["n_ctx"] == CTX // PARALLEL
    assert models[0]["meta"]["n_vocab"] == tiny_gguf.N_VOCAB
    code, body = http_get(server.base + "/props")
    assert json.loads(body)["total_slots"] == PARALLEL


@pytest.mark.parametrize("max_tokens", [1, 48])
def test_completion_runs_to_max_tokens(server: Server, max_tokens: int) -> None:
    # Several samples, greedy among them: none ends early on an EOS, none emits a byte token.
    for seed, temperature in enumerate((0.0, 0.8, 1.0, 1.5)):
        request = {"model": DEFAULT_ALIAS, "prompt": f"Hello {seed}", "max_tokens": max_tokens}
        body = complete(
            server.base, "/v1/completions", {**request, "seed": seed, "temperature": temperature}
        )
        choice = body["choices"][0]
        assert body["usage"]["completion_tokens"] == max_tokens, body
        assert choice["finish_reason"] == "length", body
        assert _text_ok(choice["text"]), choice["text"]


@pytest.mark.parametrize("max_tokens", [1, 48])
def test_chat_completion_runs_to_max_tokens(server: Server, max_tokens: int) -> None:
    messages = [{"role": "user", "content": "Say something."}]
    body = complete(
        server.base,
        "/v1/chat/completions",
        {"model": DEFAULT_ALIAS, "messages": messages, "max_tokens": max_tokens, "seed": 7},
    )
    assert body["model"] == DEFAULT_ALIAS
    assert body["usage"]["completion_tokens"] == max_tokens, body
    assert body["choices"][0]["finish_reason"] == "length", body
    assert _text_ok(body["choices"][0]["message"]["content"])


def test_four_concurrent_streams_all_complete(server: Server) -> None:
    """Two chat and two plain completion streams at once, one per slot."""
    max_tokens = 64
    start = threading.Barrier(PARALLEL)

    def one(index: int) -> list[dict[str, Any]]:
        request: dict[str, Any] = {
            "model": DEFAULT_ALIAS,
            "max_tokens": max_tokens,
            "seed": index,
            "stream_options": {"include_usage": True},
        }
        start.wait()
        if index % 2:
            return stream(server.base, "/v1/completions", {**request, "prompt": f"Stream {index}"})
        messages = [{"role": "user", "content": f"Stream {index}, please."}]
        return stream(server.base, "/v1/chat/completions", {**request, "messages": messages})

    with ThreadPoolExecutor(PARALLEL) as pool:
        results = list(pool.map(one, range(PARALLEL)))
    for events in results:
        choices = [c for e in events for c in e["choices"]]
        text = "".join(
            c.get("text") or (c.get("delta") or {}).get("content") or "" for c in choices
        )
        assert [c["finish_reason"] for c in choices if c.get("finish_reason")] == ["length"]
        assert events[-1]["usage"]["completion_tokens"] == max_tokens, events[-1]
        # One character per token: every token streamed as text, none swallowed.
        assert len(text) == max_tokens and _text_ok(text), text


def test_metrics_count_the_predicted_tokens(server: Server) -> None:
    code, body = http_get(server.base + "/metrics")
    assert code == 200, body
    assert "# TYPE llamacpp:tokens_predicted_total counter" in body.decode()
    before = metric(server.base, "llamacpp:tokens_predicted_total")
    request = {"model": DEFAULT_ALIAS, "prompt": "Count", "max_tokens": 9}
    complete(server.base, "/v1/completions", request)
    assert metric(server.base, "llamacpp:tokens_predicted_total") - before == 9
