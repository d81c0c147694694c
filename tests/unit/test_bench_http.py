"""Info requests against hostile or distant servers: whole answers however they are cut into TCP
segments, a cut answer named as such, no redirect followed, and one deadline for a target that
does not answer. The real CLI in a subprocess against the stand-in, or a scripted raw server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from ct200_tools.bench import client, prompts
from ct200_tools.bench.http import (
    Answer,
    NoAnswer,
    bounded,
    new_session,
    request_json,
    request_text,
)
from tests.unit.bench_helpers import bench, segmenting_proxy, silent_port, standin

pytestmark = pytest.mark.timeout(180)

ADHOC = ("--concurrency", "1", "--input-tokens", "16", "--output-tokens", "4", "--requests", "4")


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def provenance(out: Path) -> dict[str, object]:
    (run_dir,) = (out / "runs").iterdir()
    data = json.loads((run_dir / "provenance.json").read_text())
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize("segment", [7, 1448])
def test_answers_relayed_in_small_segments_come_through_whole(tmp_path: Path, segment: int) -> None:
    out = tmp_path / "out"
    with standin() as url, segmenting_proxy(url, segment) as proxy:
        proc = bench("run", "--target", proxy, *ADHOC, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    engine = provenance(out)["engine"]
    assert isinstance(engine, dict)
    # /props, /v1/models and each /tokenize answer were read whole: the engine is known, the
    # model found, and the prompts are exactly 16 tokens by the server's count.
    assert engine["engine"] == {"name": "llama-server", "version": "standin"}
    assert engine["models"]["data"]["data"] == [{"id": "standin"}]
    (point,) = lines(out / "results.jsonl")
    assert point["workload"]["prompt_length_method"] == "tokenize"
    assert point["input_tokens"] == 4 * 16
    assert point["requests_completed"] == 4


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_server(answer: bytes, close: bool = True) -> AsyncIterator[str]:
    """A server that reads a request head and writes `answer` as it is, then closes (or
    keeps the connection open, silent, when not `close`)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        if close:
            writer.close()
        else:
            await asyncio.sleep(60)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


def ask(answer: bytes, close: bool = True, max_bytes: int = 1024) -> Answer:
    async def go() -> Answer:
        async with raw_server(answer, close) as url, new_session(2.0) as session:
            return await request_json(session, "GET", url + "/props", max_bytes=max_bytes)

    return asyncio.run(go())


@pytest.mark.parametrize(
    ("answer", "close", "error"),
    [
        # Content-Length announces more than comes before the connection closes.
        (b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"a": 1', True, "cut short"),
        # A chunked body without its last chunk.
        (
            b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n7\r\n{"a": 1\r\n',
            True,
            "cut short",
        ),
        # Part of the body, then silence: no whole answer within the time.
        (
            b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"a": 1',
            False,
            "HTTP 200 but not the whole answer within 2 s",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n", True, "longer than 1024 bytes"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n" + b" " * 2048,
            True,
            "longer than 1024 bytes",
        ),
    ],
)
def test_an_answer_that_is_not_whole_is_an_error_that_says_so(
    answer: bytes, close: bool, error: str
) -> None:
    got = ask(answer, close)
    assert not got.ok and got.data is None
    assert got.error is not None and error in got.error, got.error


def test_a_whole_chunked_answer_in_pieces_is_read() -> None:
    body = b'{"default_generation_settings": {}, "build_info": "x"}'
    pieces = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + 5]), body[i : i + 5]) for i in range(0, len(body), 5)
    )
    got = ask(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + pieces + b"0\r\n\r\n")
    assert got.ok and got.data == json.loads(body)


def test_a_redirect_is_an_error_naming_its_escaped_location_never_followed() -> None:
    got = ask(b"HTTP/1.1 302 Found\r\nLocation: http://else\x1b[2J/x\r\nContent-Length: 0\r\n\r\n")
    assert got.status == 302 and got.broken
    assert got.error == (
        "HTTP 302 redirect to http://else\\x1b[2J/x: not followed; point --target at the "
        "server itself"
    )

    async def text() -> tuple[str | None, str | None]:
        answer = b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /metrics2\r\n\r\n"
        async with raw_server(answer) as url, new_session(2.0) as session:
            return await request_text(session, url + "/metrics", 1024)

    assert asyncio.run(text()) == (
        None,
        "HTTP 307 redirect to /metrics2: not followed; point --target at the server itself",
    )


def test_a_cut_tokenize_answer_stops_the_run_instead_of_guessing_lengths() -> None:
    async def go() -> int | None:
        answer = b'HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{"tokens": [1, 2'
        async with raw_server(answer) as url, new_session(2.0) as session:
            return await prompts.tokenize(session, url, "m", "some words")

    with pytest.raises(NoAnswer, match="/tokenize: the answer was cut short"):
        asyncio.run(go())


@pytest.mark.parametrize("model", [[], ["--model", "m"]])
def test_a_silent_target_ends_within_the_timeout_with_exit_2_naming_it(
    tmp_path: Path, model: list[str]
) -> None:
    with silent_port() as url:
        proc = bench("run", "--target", url, *ADHOC, *model, "--timeout", "1", "--out",
                     str(tmp_path), timeout=60)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert f"{url} did not answer: GET /v1/models, /version, /get_server_info, /props: " in (
        proc.stderr
    )
    assert "no answer within 1 s" in proc.stderr and "fix: " in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "results.jsonl").exists()


def test_a_tokenize_that_never_answers_is_exit_2_naming_it(tmp_path: Path) -> None:
    with standin("--stall-tokenize") as url:
        proc = bench("run", "--target", url, *ADHOC, "--timeout", "1", "--out", str(tmp_path),
                     timeout=60)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert f"POST {url}/tokenize: no answer within 1 s" in proc.stderr
    assert "fix: " in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "results.jsonl").exists()


def test_a_target_that_redirects_is_refused_and_the_other_host_never_measured(
    tmp_path: Path,
) -> None:
    with standin() as other, standin("--redirect-to", other + "/v1") as url:
        proc = bench("run", "--target", url, *ADHOC, "--out", str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert (
        f"GET {url}/v1/models: HTTP 302 redirect to {other}/v1: not followed; point --target "
        "at the server itself"
    ) in proc.stderr
    assert not (tmp_path / "results.jsonl").exists()


def test_redirected_completions_fail_naming_the_location(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with standin() as other, standin("--redirect-completions", other + "/v1/completions") as url:
        proc = bench("run", "--target", url, *ADHOC, "--out", str(out))
    # Followed, the other server would have answered every request: exit 0.
    assert proc.returncode == 1, proc.stderr
    (point,) = lines(out / "results.jsonl")
    reason = (
        f"HTTP 302 redirect to {other}/v1/completions: not followed; point --target at the "
        "server itself"
    )
    assert point["errors"] == {reason: 4} and point["requests_completed"] == 0
    assert "redirect to" in proc.stdout


def test_an_error_body_in_small_segments_is_quoted_whole() -> None:
    reqs = [client.Request("a b c", 4)]
    with standin("--fail-every", "1") as url, segmenting_proxy(url, 7) as proxy:
        results, _ = asyncio.run(client.run_point(proxy, "standin", reqs, client.Load(1), 30.0))
    (r,) = results
    assert not r.ok and r.error is not None
    assert r.error.startswith("HTTP 500: ") and "scripted failure" in r.error, r.error


def test_a_preparation_past_its_bound_is_no_answer_naming_it() -> None:
    with pytest.raises(NoAnswer, match=r"the /tokenize search did not finish within 0\.05 s"):
        asyncio.run(bounded(asyncio.sleep(30), 0.05, "the /tokenize search"))
