"""ct200-serve as a user (and a unit) runs it: exit codes, messages, never a traceback."""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from ct200_tools.cli import serve
from ct200_tools.serve import serving, systemd
from tests.server_sites import llama_site
from tests.unit.spec_helpers import changed
from tests.unit.test_chain import MANAGER, block

SERVE = str(Path(sys.executable).parent / "ct200-serve")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SERVE, *args], capture_output=True, text=True, timeout=60, check=False)


def spec_with_port(tmp_path: Path, port: int) -> str:
    data = changed(
        {
            "servers[1].engine": "command",
            "servers[1].speculative": None,
            "servers[1].gpus": [],
            "servers[1].port": port,
            "servers[1].health": "/health",
            "servers[1].command": ["/usr/local/bin/llama-server", "--port", str(port)],
        }
    )
    path = tmp_path / "site.yml"
    path.write_text(yaml.safe_dump({"ct200_site": data}))
    return str(path)


@pytest.fixture
def listening() -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_wait_ready_of_a_serving_server(tmp_path: Path, listening: int) -> None:
    proc = run("wait-ready", "qwen-tp4-dflash", "--spec", spec_with_port(tmp_path, listening))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith(
        f"ct200-serve: qwen-tp4-dflash serves: GET http://127.0.0.1:{listening}/health answered 200"
    )


def test_wait_ready_gives_up_with_the_fix(tmp_path: Path) -> None:
    port = free_port()
    spec = spec_with_port(tmp_path, port)
    proc = run("wait-ready", "qwen-tp4-dflash", "--spec", spec, "--timeout", "0.5")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"GET http://127.0.0.1:{port}/health last got" in proc.stdout
    assert "raise servers[1].start_timeout" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("wait-ready", "nope", "--spec", "inventory/ct200"), "no server 'nope' in the site spec"),
        (("preflight", "x", "--spec", "/nonexistent/site.yml"), "/nonexistent/site.yml"),
        (("switch", "--spec", "inventory/ct200"), "Missing argument"),
        (("switch", "kimi-tp8", "kimi-tp8-eagle3", "--spec", "inventory/ct200"), "together"),
        (("wait-ready", "kimi-tp8", "--spec", "inventory/ct200", "--timeout", "0"), "0.1"),
    ],
)
def test_bad_input_exits_2_with_a_message(args: tuple[str, ...], fragment: str) -> None:
    proc = run(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert fragment in proc.stderr
    assert "Traceback" not in proc.stderr


def test_help_lists_the_commands_and_exit_codes() -> None:
    proc = run("--help")
    assert proc.returncode == 0
    for word in ("switch", "status", "wait-ready", "preflight", "Exit codes"):
        assert word in proc.stdout


def completing(answer: dict[str, object]) -> Iterator[tuple[int, list[dict[str, object]]]]:
    """A real HTTP server: /health answers 200, POST /v1/completions answers `answer` and
    keeps each request's body."""
    bodies: list[dict[str, object]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            bodies.append(json.loads(self.rfile.read(length)))
            data = json.dumps(answer).encode()
            self.send_response(200 if self.path == "/v1/completions" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1]), bodies
    server.shutdown()
    server.server_close()


@pytest.fixture
def answering() -> Iterator[tuple[int, list[dict[str, object]]]]:
    answer = {"choices": [{"text": " world"}], "usage": {"completion_tokens": 1}}
    yield from completing(answer)


@pytest.fixture
def answering_nothing() -> Iterator[tuple[int, list[dict[str, object]]]]:
    yield from completing({"choices": [], "usage": {"completion_tokens": 0}})


def test_smoke_waits_for_readiness_and_asks_a_real_completion(
    tmp_path: Path, answering: tuple[int, list[dict[str, object]]]
) -> None:
    port, bodies = answering
    spec = spec_with_port(tmp_path, port)
    proc = run("smoke", "qwen-tp4-dflash", "--spec", spec, "--json", "--prompt", "Hi")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row = json.loads(proc.stdout)["result"]["servers"][0]
    assert row["name"] == "qwen-tp4-dflash" and row["ok"] is True
    assert row["ready_url"] == f"http://127.0.0.1:{port}/health"
    assert row["completion_status"] == 200 and row["completion_tokens"] == 1
    assert bodies == [
        {"model": bodies[0]["model"], "prompt": "Hi", "max_tokens": 1, "temperature": 0}
    ]
    assert bodies[0]["model"]


def test_smoke_fails_on_an_answer_without_a_completion(
    tmp_path: Path, answering_nothing: tuple[int, list[dict[str, object]]]
) -> None:
    port, _ = answering_nothing
    proc = run("smoke", "qwen-tp4-dflash", "--spec", spec_with_port(tmp_path, port))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "answered without a completion: no choices in the answer" in proc.stdout
    assert "journalctl -u ct200-server-qwen-tp4-dflash.service" in proc.stdout


def test_smoke_of_a_server_that_does_not_serve_asks_no_completion(tmp_path: Path) -> None:
    port = free_port()
    spec = spec_with_port(tmp_path, port)
    proc = run("smoke", "qwen-tp4-dflash", "--spec", spec, "--timeout", "0.3", "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    row = json.loads(proc.stdout)["result"]["servers"][0]
    assert row["ok"] is False and row["completion_status"] is None
    assert f"GET http://127.0.0.1:{port}/health last got" in row["error"]


# -- chain --smoke: the chain read and, when it serves, the smoke test in one process -----------
#
# This machine runs no systemd as PID 1 and has no ct200 units, so `systemctl show` is a stand-in
# with systemd 252's output (tests/unit/test_chain.py's blocks); the servers are real HTTP
# servers, asked over the network as the real ones are.


def chain_in_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, port: int, server_state: str
) -> tuple[int, dict[str, Any]]:
    """`ct200-serve chain --json --smoke` on the testbed's llama site, `tiny` on `port`, with
    systemd saying its stage is active and its server `server_state`."""
    spec = stand_in_chain(monkeypatch, tmp_path, port, server_state)
    args = ["chain", "--spec", str(spec), "--json", "--no-doctor", "--smoke", "--timeout", "0.5"]
    got = CliRunner().invoke(serve.cli, [*args, "--prompt", "Hi"])
    assert got.exception is None or isinstance(got.exception, SystemExit), got.exception
    return got.exit_code, json.loads(got.output)


def stand_in_chain(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, port: int, server_state: str
) -> Path:
    """The llama site's spec, `tiny` on `port`, and systemd's stand-in in this process."""
    site = llama_site()
    site["servers"][0].update(port=port)  # engine: llamacpp renders --port from it
    spec = tmp_path / "site.yml"
    spec.write_text(yaml.safe_dump({"ct200_site": site}))
    units = block("ct200-stage@tiny-a.service", "active", "exited", 2.0, 2.5) + block(
        "ct200-server-tiny.service", server_state, "running", 2.5, 4.25
    )

    def show(argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
        if argv[-1].endswith(".service"):
            return 0, units, ""
        if argv[0] == "journalctl":
            return 0, "", ""
        return 0, MANAGER, ""

    real = serving.current
    no_state = str(tmp_path / "serving.json")  # none: the spec's enabled flags rule
    monkeypatch.setattr(serving, "current", lambda s, path=no_state: real(s, path))

    class Recorded(systemd.Systemd):
        def __init__(self, run: object = None) -> None:
            super().__init__(show)

    monkeypatch.setattr(systemd, "Systemd", Recorded)
    return spec


def test_chain_smoke_tests_a_serving_chain_in_the_same_process(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    answering: tuple[int, list[dict[str, object]]],
) -> None:
    port, bodies = answering
    rc, got = chain_in_process(monkeypatch, tmp_path, port, "active")
    assert rc == 0 and got["ok"] is True, got
    assert got["result"]["ok"] is True and got["result"]["serving"] == ["tiny"]
    smoke = got["result"]["smoke"]
    assert [row["name"] for row in smoke["servers"]] == ["tiny"]
    row = smoke["servers"][0]
    assert row["ok"] is True and row["completion_tokens"] == 1
    assert row["ready_url"] == f"http://127.0.0.1:{port}/health"
    assert smoke["seconds"] >= smoke["ready_seconds"] >= 0
    assert [b["prompt"] for b in bodies] == ["Hi"]


def test_chain_smoke_fails_when_a_serving_chain_does_not_complete(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    answering_nothing: tuple[int, list[dict[str, object]]],
) -> None:
    port, _ = answering_nothing
    rc, got = chain_in_process(monkeypatch, tmp_path, port, "active")
    assert rc == 1 and got["ok"] is False, got
    assert got["result"]["ok"] is True  # the chain itself serves: the smoke test failed
    row = got["result"]["smoke"]["servers"][0]
    assert row["ok"] is False and "no choices in the answer" in row["error"]


def test_chain_smoke_asks_nothing_of_a_chain_that_stopped(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    answering: tuple[int, list[dict[str, object]]],
) -> None:
    port, bodies = answering
    rc, got = chain_in_process(monkeypatch, tmp_path, port, "failed")
    assert rc == 1 and got["result"]["ok"] is False
    assert got["result"]["stopped_at"]["name"] == "tiny"
    assert got["result"]["smoke"] is None and bodies == []


# -- hostile servers (adversarial review): each is a failed smoke test, never a crash or a hang ---


@contextlib.contextmanager
def raw_server(answer: Callable[[socket.socket], None]) -> Iterator[int]:
    """A real TCP server that reads each request's head and lets `answer` reply as it likes."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)

    def serve_one(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            answer(conn)

    def loop() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        listener.close()


def test_smoke_of_a_completion_with_a_number_python_cannot_read_is_a_failed_smoke(
    tmp_path: Path,
) -> None:
    """json.loads raises a plain ValueError (not JSONDecodeError) for an integer of more than
    4300 digits: a hostile answer, not an internal error."""
    body = b'{"choices": [{}], "usage": {"completion_tokens": ' + b"1" * 5000 + b"}}"

    def answer(conn: socket.socket) -> None:
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        conn.sendall(head.encode() + body)

    with raw_server(answer) as port:
        proc = run("smoke", "qwen-tp4-dflash", "--spec", spec_with_port(tmp_path, port), "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    row = json.loads(proc.stdout)["result"]["servers"][0]
    assert row["ok"] is False and "the answer is not JSON" in row["error"]


def test_smoke_of_a_readiness_path_that_trickles_its_body_ends_at_the_deadline(
    tmp_path: Path,
) -> None:
    """A server that answers 200 and then sends its body a byte at a time: the readiness poll
    must not wait for a body that never ends (each byte arrives within the socket timeout), and
    an answer whose body does not complete is no answer (issue 20: bodies must be complete)."""
    stop = threading.Event()

    def answer(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
        while not stop.wait(0.05):
            conn.sendall(b"x")

    with raw_server(answer) as port:
        spec = spec_with_port(tmp_path, port)
        bounds = ["--timeout", "1", "--completion-timeout", "1"]
        proc = subprocess.run(
            [SERVE, "smoke", "qwen-tp4-dflash", "--spec", spec, "--json", *bounds],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        stop.set()
    row = json.loads(proc.stdout)["result"]["servers"][0]
    assert proc.returncode == 1 and row["ok"] is False, row
    assert row["ready_last"].startswith("no complete answer within 1 s ("), row
    assert "bytes its Content-Length announced came" in row["ready_last"], row


def test_chain_that_cannot_write_its_textfile_is_broken_not_stopped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ct200-boot-report.service counts exit 1 (a chain that stopped) as success: a textfile
    that could not be written (disk full, read-only) must be exit 3, or the unit passes and
    the last boot's file stays as if it were this one's."""
    spec = stand_in_chain(monkeypatch, tmp_path, free_port(), "active")
    (tmp_path / "a-file").write_text("")
    textfile = tmp_path / "a-file" / "ct200_boot.prom"  # its directory is a file
    with pytest.raises(SystemExit) as exited:
        serve.main(["chain", "--spec", str(spec), "--no-doctor", "--textfile", str(textfile)])
    err = capsys.readouterr().err
    assert exited.value.code == serve.Exit.INTERNAL, err
    assert f"cannot write {textfile}" in err and "Traceback" not in err


# -- the boot textfile is this boot's, whatever fails (issue 19) ----------------------------------


def this_boot() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def test_an_unparsable_spec_still_rewrites_the_textfile_with_this_boots_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ct200-boot-report.service with an unparsable site.yml: the last boot's `chain_ok 1` must
    not stand; the file says chain_ok 0, why, and this boot's id; the command exits 2."""
    spec = tmp_path / "site.yml"
    spec.write_text("ct200_site: [\n")
    textfile = tmp_path / "ct200_boot.prom"
    textfile.write_text("ct200_boot_chain_ok 1\n")  # the previous boot's, green
    with pytest.raises(SystemExit) as exited:
        serve.main(["chain", "--spec", str(spec), "--no-doctor", "--textfile", str(textfile)])
    err = capsys.readouterr().err
    assert exited.value.code == serve.Exit.BAD_INPUT, err
    text = textfile.read_text()
    assert "ct200_boot_chain_ok 0" in text.splitlines()
    assert 'ct200_boot_chain_reason{reason="spec unreadable: ' in text, text
    assert f'ct200_boot_report_info{{machine="container",boot_id="{this_boot()}"}} 1' in text
    assert "Traceback" not in err


@pytest.fixture
def listener() -> Iterator[int]:
    """A real socket listening on a free port (what an engine that serves has)."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield int(sock.getsockname()[1])


def test_an_active_server_whose_port_refuses_is_not_serving(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 33: after a port change the process still listened on the old port, and the
    chain said serving. The unit is active; nothing listens on the spec's port."""
    port = free_port()
    spec = stand_in_chain(monkeypatch, tmp_path, port, "active")
    with pytest.raises(SystemExit) as exited:
        serve.main(["chain", "--spec", str(spec), "--no-doctor"])
    out = capsys.readouterr().out
    assert exited.value.code == serve.Exit.FAILED, out
    assert out.startswith("boot chain: STOPPED"), out
    assert f"but nothing listens on 127.0.0.1:{port}" in out
    assert "`systemctl restart ct200-server-tiny.service`" in out
    with pytest.raises(SystemExit):
        serve.main(["chain", "--spec", str(spec), "--no-doctor", "--json"])
    got = json.loads(capsys.readouterr().out)["result"]
    assert got["ok"] is False and got["steps"][-1]["state"] == "not-listening", got


def test_the_chain_shows_this_boots_id_in_text_json_and_textfile(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    listener: int,
) -> None:
    spec = stand_in_chain(monkeypatch, tmp_path, listener, "active")
    textfile = tmp_path / "ct200_boot.prom"
    args = ["chain", "--spec", str(spec), "--no-doctor", "--textfile", str(textfile)]
    with pytest.raises(SystemExit) as exited:
        serve.main(args)
    out = capsys.readouterr().out
    assert exited.value.code == serve.Exit.OK, out
    assert f"  boot id {this_boot()}" in out.splitlines()
    assert f'boot_id="{this_boot()}"}} 1' in textfile.read_text()
    with pytest.raises(SystemExit):
        serve.main([*args, "--json"])
    assert json.loads(capsys.readouterr().out)["result"]["boot_id"] == this_boot()


def nothing_enabled(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    spec = stand_in_chain(monkeypatch, tmp_path, free_port(), "active")
    data = yaml.safe_load(spec.read_text())
    for server in data["ct200_site"]["servers"]:
        server["enabled"] = False
    spec.write_text(yaml.safe_dump(data))
    return spec


def test_nothing_to_serve_is_not_serving_with_its_own_exit_and_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = nothing_enabled(monkeypatch, tmp_path)
    textfile = tmp_path / "ct200_boot.prom"
    with pytest.raises(SystemExit) as exited:
        serve.main(["chain", "--spec", str(spec), "--no-doctor", "--textfile", str(textfile)])
    out = capsys.readouterr().out
    assert exited.value.code == serve.Exit.NOTHING == 5, out
    assert out.startswith("boot chain: NOT SERVING: nothing to serve: the serving set is empty")
    assert "fix: choose what this machine serves, e.g. `ct200-serve switch tiny`" in out
    text = textfile.read_text()
    assert "ct200_boot_chain_ok 0" in text
    assert 'ct200_boot_chain_reason{reason="nothing to serve: the serving set is empty"} 1' in text
    with pytest.raises(SystemExit) as exited:
        serve.main(["smoke", "--spec", str(spec)])
    out = capsys.readouterr().out
    assert exited.value.code == serve.Exit.NOTHING, out
    assert "nothing to serve: the serving set is empty" in out and "ct200-serve switch" in out


@pytest.mark.parametrize(
    ("was", "env", "expected"),
    [
        (
            "serving: GET http://127.0.0.1:8094/health answered 200 after 0.01 s",
            {"SERVICE_RESULT": "signal", "EXIT_CODE": "killed", "EXIT_STATUS": "KILL"},
            "STATUS=not serving: the engine ended (signal: killed KILL); systemd restarts it "
            "after a failure, until its start limit; `journalctl -u ct200-server-tiny.service` "
            "says why",
        ),
        (
            "serving: GET http://127.0.0.1:8095/health answered 200 after 0.01 s",
            {"SERVICE_RESULT": "success", "EXIT_CODE": "exited", "EXIT_STATUS": "0"},
            "STATUS=not serving: stopped (exited 0)",
        ),
        # A start that failed keeps its own reason: nothing is sent.
        ("preflight failed: model tiny-a: not staged", {"SERVICE_RESULT": "exit-code"}, None),
    ],
    ids=["killed-in-restart-delay", "stopped-by-hand", "failed-start-keeps-its-reason"],
)
def test_stopped_says_a_server_that_served_no_longer_does(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    was: str,
    env: dict[str, str],
    expected: str | None,
) -> None:
    """The unit's ExecStopPost (issue 19's fault matrix: during the restart delay after kill -9,
    and after `systemctl stop`, `systemctl status` still said "serving: ... answered 200").
    A STAND-IN systemctl answers the unit's current status line; the notify socket is real."""
    from ct200_tools.serve import engines  # noqa: PLC0415

    fake = tmp_path / "systemctl"
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' {json.dumps(was)}\n")
    fake.chmod(0o755)
    monkeypatch.setattr(engines, "SYSTEMCTL", str(fake))
    address = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(address)
        sock.setblocking(False)
        for key in ("SERVICE_RESULT", "EXIT_CODE", "EXIT_STATUS"):
            monkeypatch.delenv(key, raising=False)
        for key, value in {**env, "NOTIFY_SOCKET": address}.items():
            monkeypatch.setenv(key, value)
        result = CliRunner().invoke(serve.cli, ["stopped", "tiny"])
        assert result.exit_code == 0, result.output
        try:
            got: str | None = sock.recv(4096).decode()
        except BlockingIOError:
            got = None
    assert got == expected


def test_status_names_an_active_server_that_does_not_listen(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    listener: int,
) -> None:
    for port, listens in ((free_port(), False), (listener, True)):
        spec = stand_in_chain(monkeypatch, tmp_path, port, "active")
        with pytest.raises(SystemExit):
            serve.main(["status", "--spec", str(spec), "--json"])
        rows = json.loads(capsys.readouterr().out)["result"]["servers"]
        # Only an active unit's port is tried (the others are not running: nothing to say).
        assert {r["name"]: r["listening"] for r in rows if r["active"] == "active"} == {
            "tiny": listens
        }, rows
        assert {r["listening"] for r in rows if r["active"] != "active"} <= {None}
        with pytest.raises(SystemExit):
            serve.main(["status", "--spec", str(spec)])
        out = capsys.readouterr().out
        said = f"not serving: nothing listens on http://127.0.0.1:{port}"
        assert (said in out) is not listens, out
        if not listens:
            assert "`systemctl restart ct200-server-tiny.service`" in out
