"""The one HTTP client (ct200_tools.httpclient) against hostile servers, through the commands
that use it: `ct200-serve wait-ready`, `ct200-serve smoke` and the doctor's server checks.

Every server here is a real TCP server bound to 127.0.0.1 on an ephemeral port, in a thread,
answering with the exact bytes a hostile or broken server would send: a head or body trickled a
byte at a time, a redirect to another live server, escape sequences in the reason phrase, the
body and the served name, no answer, a closed connection, a body shorter than its
Content-Length, a token count that is a boolean. Each stand-in ends its trickle after a few
seconds and every test has a pytest timeout: these bound the test, they assert no speed.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ct200_tools import httpclient
from ct200_tools.httpclient import HttpError, HttpTimeout, count, parse_json
from tests.unit.test_serve_cli import spec_with_port

ROOT = Path(__file__).parents[2]
SERVE = str(Path(sys.executable).parent / "ct200-serve")
LLAMA_SPEC = ROOT / "tests" / "fixtures" / "llama-cpu-site.yml"
#: What a hostile server puts in what it says: clear the screen, set the window title, ring the
#: bell, and a carriage return that rewrites the line with a forged verdict.
EVIL = "\x1b[2J\x1b]0;owned\x07\rct200-serve: ok"
EVIL_SHOWN = "\\x1b[2J\\x1b]0;owned\\x07\\rct200-serve: ok"
#: How long a stand-in trickles before it gives up (and closes): longer than every --timeout
#: here, so an unbounded client is still at it, yet every test ends.
TRICKLE_S = 4.0

pytestmark = pytest.mark.timeout(60)

Reply = Callable[[str, str, socket.socket, threading.Event], None]


@contextlib.contextmanager
def stand_in(reply: Reply) -> Iterator[int]:
    """A real HTTP/1.1 server on 127.0.0.1: it reads each request (head, and a body by its
    Content-Length) and lets `reply(method, path, conn, stop)` answer with raw bytes."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    stop = threading.Event()

    def serve_one(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, rest = data.partition(b"\r\n\r\n")
            method, path, _ = head.split(b"\r\n")[0].decode().split(" ", 2)
            length = next(
                (
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")[1:]
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            while len(rest) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                rest += chunk
            reply(method, path, conn, stop)

    def loop() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        listener.close()


def answer(status: str, body: bytes = b"", headers: str = "") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{headers}Connection: close\r\n"
    return head.encode("utf-8", errors="surrogateescape") + b"\r\n" + body


def trickle(conn: socket.socket, data: bytes, stop: threading.Event, every: float = 0.1) -> None:
    """Send data a byte every `every` seconds, for at most TRICKLE_S; then close."""
    for i, byte in enumerate(data):
        if stop.wait(every) or i * every > TRICKLE_S:
            return
        conn.sendall(bytes([byte]))


HEALTHY = answer("200 OK", b"{}")
COMPLETION = {"choices": [{"text": " world"}], "usage": {"completion_tokens": 1}}


def server(health: Reply | bytes = HEALTHY, completion: Reply | bytes | None = None) -> Reply:
    """GET /health answers `health`, POST /v1/completions `completion` (bytes: sent at once)."""

    def reply(method: str, path: str, conn: socket.socket, stop: threading.Event) -> None:
        got = completion if path == "/v1/completions" else health
        if path not in ("/health", "/v1/completions"):
            got = answer("404 Not Found")
        if got is None:
            got = answer("200 OK", json.dumps(COMPLETION).encode())
        if isinstance(got, bytes):
            conn.sendall(got)
        else:
            got(method, path, conn, stop)

    return reply


def serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """ct200-serve as the unit runs it, in its own process (the hang guard is `timeout`)."""
    environ = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    return subprocess.run(
        [SERVE, *args],
        capture_output=True,
        text=True,
        timeout=45,
        check=False,
        env={**environ, **(env or {})},
    )


def wait_ready(tmp_path: Path, port: int, timeout: str = "1", **env: str) -> tuple[int, str]:
    spec = spec_with_port(tmp_path, port)
    proc = serve("wait-ready", "qwen-tp4-dflash", "--spec", spec, "--timeout", timeout, env=env)
    return proc.returncode, proc.stdout + proc.stderr


def smoke(tmp_path: Path, port: int, *more: str) -> tuple[int, str]:
    spec = spec_with_port(tmp_path, port)
    bounds = ("--timeout", "1", "--completion-timeout", "1")
    proc = serve("smoke", "qwen-tp4-dflash", "--spec", spec, *bounds, *more)
    return proc.returncode, proc.stdout + proc.stderr


def raw_controls(text: str) -> set[str]:
    """The control characters in text, but the newlines that end its lines."""
    return {ch for ch in text if (ord(ch) < 0x20 and ch != "\n") or 0x7F <= ord(ch) < 0xA0}


# -- (a) a head trickled a byte at a time, (b) a body trickled, (g) a body cut short --------------


def test_wait_ready_ends_at_its_timeout_against_a_head_that_trickles(tmp_path: Path) -> None:
    """Each byte comes well within any per-read timeout, so only a deadline on the whole request
    ends it; and the head it got is no answer (main: exit 0, "answered 200", once the stand-in
    gave up and closed: http.client takes EOF in the head for its end)."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Pad: " + b"a" * 200 + b"\r\n\r\n"
    with stand_in(server(lambda m, p, conn, stop: trickle(conn, head, stop))) as port:
        rc, out = wait_ready(tmp_path, port)
    assert rc == 1, out
    assert "does not serve after 1 s" in out
    assert "last got no complete answer within 1 s (the head came to" in out
    assert "answered 200" not in out and "Traceback" not in out


def test_a_head_cut_off_is_no_answer(tmp_path: Path) -> None:
    """A server that sends half a head and closes has not answered 200 (main: exit 0)."""
    with stand_in(server(b"HTTP/1.1 200 OK\r\nContent-Le")) as port:
        rc, out = wait_ready(tmp_path, port, timeout="0.5")
    assert rc == 1, out
    assert "last got the connection closed after 27 bytes of the answer's head: no answer" in out


def test_wait_ready_ends_at_its_timeout_against_a_body_that_trickles(tmp_path: Path) -> None:
    """200 in the head, then a body a byte at a time: an answer that does not complete within
    the deadline is no answer (main: exit 0 at the head)."""

    def reply(method: str, path: str, conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
        trickle(conn, b"x" * 100, stop)

    with stand_in(server(reply)) as port:
        rc, out = wait_ready(tmp_path, port)
    assert rc == 1, out
    assert "no complete answer within 1 s (" in out
    assert "of the 100 bytes its Content-Length announced came)" in out


def test_a_body_shorter_than_its_content_length_is_no_answer(tmp_path: Path) -> None:
    """Readiness (main: exit 0, the head said 200) and the completion (main: a complete-looking
    JSON prefix of a longer announced body counted as a completion) both fail."""
    whole = json.dumps(COMPLETION).encode()
    short = b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\nConnection: close\r\n\r\n" + whole
    with stand_in(server(short)) as port:
        rc, out = wait_ready(tmp_path, port)
    assert rc == 1, out
    assert (
        f"last got the body ended after {len(whole)} of the 500 bytes its Content-Length "
        "announced" in out
    )

    with stand_in(server(completion=short)) as port:
        rc, out = smoke(tmp_path, port)
    assert rc == 1, out
    assert (
        f"answered without a completion: the body ended after {len(whole)} of the 500 bytes "
        "its Content-Length announced" in out
    )


# -- (c) a redirect to another live server --------------------------------------------------------


def test_a_redirect_to_a_server_that_serves_is_not_followed(tmp_path: Path) -> None:
    """The port's only answer is a 302 to another port whose server answers 200: the server
    asked does not serve (main: urllib followed it, exit 0)."""
    with stand_in(server()) as other:
        to = f"http://127.0.0.1:{other}/health"
        with stand_in(server(answer("302 Found", headers=f"Location: {to}\r\n"))) as port:
            rc, out = wait_ready(tmp_path, port, timeout="0.5")
            smoke_rc, smoke_out = smoke(tmp_path, port)
    assert rc == 1, out
    assert (
        f"last got 302 Found, a redirect to {to} (not followed: a readiness answer must come "
        "from the server's own port)" in out
    )
    assert smoke_rc == 1 and "a redirect to" in smoke_out, smoke_out


def test_a_redirect_of_the_completion_is_a_failed_smoke(tmp_path: Path) -> None:
    with stand_in(server()) as other:
        to = f"http://127.0.0.1:{other}/v1/completions"
        moved = answer("307 Temporary Redirect", headers=f"Location: {to}\r\n")
        with stand_in(server(completion=moved)) as port:
            rc, out = smoke(tmp_path, port, "--json")
    assert rc == 1, out
    row = json.loads(out)["result"]["servers"][0]
    assert row["completion_status"] == 307
    assert f"HTTP 307, a redirect to {to} (not followed: an answer must come" in row["error"]


# -- (d) escape sequences in the reason phrase, a body, a Location and the served name ------------


def test_what_a_server_says_is_shown_escaped_in_text_and_the_status_line(tmp_path: Path) -> None:
    """wait-ready prints the last answer's reason phrase and sends it as the unit's STATUS=
    line: escaped in both (main did not say what the server answered beyond its number)."""
    notify = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(notify))
        sock.settimeout(5)
        with stand_in(server(answer(f"503 {EVIL}"))) as port:
            rc, out = wait_ready(tmp_path, port, timeout="0.3", NOTIFY_SOCKET=str(notify))
        status = sock.recv(4096)
    assert rc == 1, out
    assert f"last got 503 {EVIL_SHOWN}" in out
    assert not raw_controls(out), out
    assert status.startswith(b"STATUS=not serving: ") and EVIL_SHOWN.encode() in status
    assert not raw_controls(status.decode())


def test_a_redirects_location_is_shown_escaped(tmp_path: Path) -> None:
    moved = answer("301 Moved", headers=f"Location: http://x/{EVIL}\r\n")
    with stand_in(server(moved)) as port:
        rc, out = wait_ready(tmp_path, port, timeout="0.3")
    assert rc == 1 and f"a redirect to http://x/{EVIL_SHOWN} (not followed" in out, out
    assert not raw_controls(out), out


@pytest.mark.parametrize("status", ["200 OK", "500 Internal Server Error"])
def test_a_body_excerpt_is_shown_escaped_and_json_keeps_exact_values(
    tmp_path: Path, status: str
) -> None:
    """A completion answered with a text body: the smoke test quotes the body, escaped (main:
    raw for a 200, so the CR rewrote the line into a forged "ok"; nothing for a 500)."""
    with stand_in(server(completion=answer(status, EVIL.encode()))) as port:
        rc, out = smoke(tmp_path, port)
        json_rc, json_out = smoke(tmp_path, port, "--json")
    assert rc == 1, out
    code = status.split(maxsplit=1)[0]
    said = "" if code == "200" else f"HTTP {code}, "
    assert f"answered without a completion: {said}the answer is not JSON ({EVIL_SHOWN})" in out
    assert not raw_controls(out), out
    assert json_rc == 1
    row = json.loads(json_out)["result"]["servers"][0]
    assert row["completion_status"] == int(code) and row["ready_reason"] == "OK"


def doctor_spec(tmp_path: Path, port: int) -> str:
    """The llama site of the recordings, its server on `port`."""
    site = yaml.safe_load(LLAMA_SPEC.read_text())
    server = site["ct200_site"]["servers"][0]
    server["port"] = port
    server["command"][-1] = str(port)
    path = tmp_path / "site.yml"
    path.write_text(yaml.safe_dump(site))
    return str(path)


def doctor(tmp_path: Path, port: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ct200_tools.cli.entry",
            *args,
            "--spec",
            doctor_spec(tmp_path, port),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=45,
        cwd=ROOT,
    )


def models_reply(ids: list[object], completion: dict[str, object] | None = None) -> Reply:
    def reply(method: str, path: str, conn: socket.socket, stop: threading.Event) -> None:
        if path == "/v1/models":
            conn.sendall(answer("200 OK", json.dumps({"data": [{"id": i} for i in ids]}).encode()))
        elif path == "/v1/completions":
            conn.sendall(answer("200 OK", json.dumps(completion or COMPLETION).encode()))
        else:
            conn.sendall(answer("404 Not Found"))

    return reply


def test_the_doctor_shows_served_names_escaped_and_snapshots_them_exactly(tmp_path: Path) -> None:
    """server.models lists what /v1/models serves: escaped in the text view (main: raw), exact
    in the snapshot's facts."""
    with stand_in(models_reply([EVIL, 7])) as port:
        text = doctor(tmp_path, port, "check", "--only", "server.models")
        snap = doctor(tmp_path, port, "snapshot")
    assert text.returncode == 2, text.stdout + text.stderr
    assert f"/v1/models lists {EVIL_SHOWN}, not 'tiny'" in text.stdout
    assert not raw_controls(text.stdout + text.stderr), text.stdout
    (facts,) = json.loads(snap.stdout)["servers"]
    assert facts["models"]["served"] == [EVIL]  # a number is no model name: not listed


def test_the_doctor_reports_a_redirect_as_what_it_is(tmp_path: Path) -> None:
    with stand_in(server()) as other:
        moved = answer("302 Found", headers=f"Location: http://127.0.0.1:{other}/v1/models\r\n")
        with stand_in(lambda m, p, conn, stop: conn.sendall(moved)) as port:
            got = doctor(tmp_path, port, "check", "--only", "server.models")
    assert got.returncode == 2, got.stdout + got.stderr
    assert f"/v1/models: HTTP 302, a redirect to http://127.0.0.1:{other}/v1/models" in got.stdout


def test_the_doctor_shows_a_port_holders_process_name_escaped(tmp_path: Path) -> None:
    """Another process holds the server's port; its name is whatever it set (comm, 15 bytes):
    server.port_free names it escaped (main: raw)."""
    code = (
        "import socket, sys\n"
        "open('/proc/self/comm', 'w').write('\\x1b[2J\\x07ok')\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)\n"
        "print(s.getsockname()[1], flush=True); sys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        port = int(holder.stdout.readline())
        got = doctor(tmp_path, port, "check", "--only", "server.port_free")
    finally:
        holder.kill()
        holder.wait(10)
    assert got.returncode == 2, got.stdout + got.stderr
    assert f"port {port} is taken by pid {holder.pid} (\\x1b[2J\\x07ok)" in got.stdout
    assert not raw_controls(got.stdout), got.stdout


# -- (e) no answer, (f) closed at once, and no proxy ----------------------------------------------


def test_a_server_that_accepts_and_never_answers(tmp_path: Path) -> None:
    with stand_in(server(lambda m, p, conn, stop: stop.wait(TRICKLE_S))) as port:
        rc, out = wait_ready(tmp_path, port)
        smoke_rc, smoke_out = smoke(tmp_path, port)
    assert rc == 1 and "last got no complete answer within 1 s (no answer yet)" in out, out
    assert smoke_rc == 1 and "no complete answer within 1 s" in smoke_out, smoke_out


def test_a_server_that_closes_at_once(tmp_path: Path) -> None:
    with stand_in(server(lambda m, p, conn, stop: None)) as port:
        rc, out = wait_ready(tmp_path, port, timeout="0.3")
    assert rc == 1 and "last got the connection closed without an answer" in out, out


def test_no_proxy_from_the_environment_answers_for_the_server(tmp_path: Path) -> None:
    """A proxy in the environment that answers 200 to anything must not make a port that
    nothing listens on serve."""
    with stand_in(lambda m, p, conn, stop: conn.sendall(HEALTHY)) as proxy:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            closed = s.getsockname()[1]
        url = f"http://127.0.0.1:{proxy}"
        rc, out = wait_ready(
            tmp_path, closed, timeout="0.3", http_proxy=url, HTTP_PROXY=url, no_proxy=""
        )
    assert rc == 1 and "last got connection refused (nothing listens)" in out, out


# -- (h) a token count that is not a count ---------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "shown"),
    [(True, "true"), (10**30, str(10**30)), (1.0, "1.0"), (-1, "-1"), ("1", '"1"')],
)
def test_a_completion_whose_token_count_is_not_a_count_fails_the_smoke(
    tmp_path: Path, tokens: object, shown: str
) -> None:
    """`true` is a bool, which Python counts as an int (main: 1 token, exit 0); 10**30 and 1.0
    are no count either (main: exit 0)."""
    body = json.dumps({"choices": [{"text": "x"}], "usage": {"completion_tokens": tokens}})
    with stand_in(server(completion=answer("200 OK", body.encode()))) as port:
        rc, out = smoke(tmp_path, port)
    assert rc == 1, out
    assert f"usage.completion_tokens is {shown}, not a token count" in out


def test_the_doctor_judges_a_boolean_token_count_a_failed_generation(tmp_path: Path) -> None:
    bad = {"choices": [{"text": "x"}], "usage": {"completion_tokens": True}}
    with stand_in(models_reply(["tiny"], bad)) as port:
        got = doctor(tmp_path, port, "check", "--only", "server.models,server.generate")
    assert got.returncode == 2, got.stdout + got.stderr
    assert "usage.completion_tokens is true, not a token count" in got.stdout


# -- the client on its own: framing and bounds ----------------------------------------------------


def test_a_chunked_answer_is_read_whole_and_a_cut_one_is_not() -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n"
    )
    with stand_in(lambda m, p, conn, stop: conn.sendall(chunked)) as port:
        got = httpclient.request("GET", f"http://127.0.0.1:{port}/", timeout_s=5)
    assert (got.status, got.reason, got.body) == (200, "OK", b"hello world")
    cut = chunked[: chunked.index(b"0\r\n")]
    with (
        stand_in(lambda m, p, conn, stop: conn.sendall(cut)) as port,
        pytest.raises(HttpError, match="the connection closed before the end: 11 bytes"),
    ):
        httpclient.request("GET", f"http://127.0.0.1:{port}/", timeout_s=5)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n", "announces 99999999 bytes"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70000 + b"\r\n\r\n", "head is more than 65536"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\nok",
            "both Transfer-Encoding and Content-Length",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2, 3\r\n\r\nok", "Content-Length 2, 3 is not"),
        ("HTTP/1.1 200 OK\r\nContent-Length: ²\r\n\r\nok".encode(), "Content-Length ² is not"),
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "the answer is not HTTP/1.x: SSH-2.0-OpenSSH_9.2"),
        (b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n", "malformed header field: bad header"),
    ],
)
def test_answers_that_break_the_rules_are_errors(raw: bytes, message: str) -> None:
    with (
        stand_in(lambda m, p, conn, stop: conn.sendall(raw)) as port,
        pytest.raises(HttpError, match=message),
    ):
        httpclient.request("GET", f"http://127.0.0.1:{port}/", timeout_s=5)


def test_interim_answers_are_skipped_and_the_body_sent() -> None:
    got_body: list[bytes] = []

    def reply(method: str, path: str, conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n" + answer("201 Created", method.encode()))

    with stand_in(reply) as port:
        got = httpclient.request("POST", f"http://127.0.0.1:{port}/x", b"{}", timeout_s=5)
    got_body.append(got.body)
    assert (got.status, got.body) == (201, b"POST")


def test_the_deadline_covers_the_whole_request_and_says_so() -> None:
    with (
        stand_in(lambda m, p, conn, stop: trickle(conn, b"HTTP/1.1 200 OK\r\n", stop)) as port,
        pytest.raises(HttpTimeout, match=r"within 0\.3 s \(the head came to \d+ bytes"),
    ):
        httpclient.request("GET", f"http://127.0.0.1:{port}/", timeout_s=0.3)


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1/",
        "http://127.0.0.1:99999/",
        "http://127.0.0.1/a b",
        "http:///x",
        "http://[::1/",
        "http://127.0.0.1:0/",
        f"http://{'a' * 64}.example/",
    ],
)
def test_urls_it_does_not_ask(url: str) -> None:
    with pytest.raises(HttpError):
        httpclient.request("GET", url, timeout_s=1)


def test_json_is_bounded_and_counts_are_strict() -> None:
    assert parse_json(b'{"a": [1]}') == {"a": [1]}
    for bad in (b"[" * 40 + b"]" * 40, b"NaN", b'{"a": Infinity}', b"1" * 5000, b"\xff"):
        with pytest.raises(httpclient.NotJson):
            parse_json(bad)
    assert [count(v) for v in (1, 0, True, False, 1.0, -1, 2**40, "1", None)] == [
        1,
        0,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
    ]


_PIECES = [
    b"HTTP/1.1 200 OK\r\n",
    b"HTTP/1.0 302 Found\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"Content-Length: 5\r\n",
    b"Content-Length: -1\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Location: \x1b[2J\r\n",
    b"\r\n",
    b"5\r\nhello\r\n",
    b"0\r\n\r\n",
    b"fffffffff\r\n",
    b"\xff\xfe\x00",
    b"x" * 10,
]


@settings(max_examples=60)
@given(st.lists(st.one_of(st.sampled_from(_PIECES), st.binary(max_size=40)), max_size=8))
def test_any_answer_is_an_answer_or_an_http_error(pieces: list[bytes]) -> None:
    """Whatever bytes a port sends (HTTP-like pieces and noise), the client returns an Answer
    or raises HttpError: never another exception, never past its deadline."""
    raw = b"".join(pieces)
    with stand_in(lambda m, p, conn, stop: conn.sendall(raw)) as port:
        try:
            got = httpclient.request("GET", f"http://127.0.0.1:{port}/", timeout_s=2)
        except HttpError:
            return
    assert 200 <= got.status <= 999 and len(got.body) <= httpclient.MAX_BODY
