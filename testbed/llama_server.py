"""llama.cpp's OpenAI-compatible server on the CPU: the testbed's stand-in for SGLang (issue 11).

``python -m testbed.llama_server build`` builds the binary once per machine
(testbed/llama_build.py); ``measure`` starts it with the tiny model (testbed/tiny_gguf.py) and
prints the figures the issue asks for; ``serve`` runs it in the foreground. The library half
(``Server``, ``complete``, ``stream``) is what tests and benchmarks drive. Dev-only: stdlib, and
the gguf package for the model.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from testbed import llama_build

DEFAULT_ALIAS = "tiny"
#: Where the testbed's sites run llama-server from (their servers' command[0]) and keep each
#: model's persistent copy: MODELS_ROOT/<name>/MODEL_FILE, as a user would put them there.
PROGRAM = "/usr/local/bin/llama-server"
MODELS_ROOT = "/tank/models"
MODEL_FILE = "model.gguf"
#: push(machine, file on the controller, path on the machine, mode): Harness.push.
Push = Callable[[str, Path, str, int], object]
#: Bounds, not estimates: the tiny model loads in well under a second.
READY_DEADLINE_S = 60.0
REQUEST_TIMEOUT_S = 120.0

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


class ServerError(Exception):
    """The server did not start or answer as it should; the message carries its log's tail."""


@dataclass(frozen=True)
class ServeConfig:
    model: Path
    alias: str = DEFAULT_ALIAS
    host: str = "127.0.0.1"
    port: int = 8080
    #: The whole KV cache; llama-server splits it evenly across the ``parallel`` slots.
    ctx: int = 2048
    parallel: int = 4
    threads: int = 2
    extra: tuple[str, ...] = ()

    def argv(self, binary: Path) -> list[str]:
        return [
            str(binary),
            *("--model", str(self.model), "--alias", self.alias),
            *("--host", self.host, "--port", str(self.port)),
            *("--ctx-size", str(self.ctx), "--parallel", str(self.parallel)),
            *("--threads", str(self.threads)),
            "--metrics",
            "--no-webui",
            *self.extra,
        ]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """Status and body; an HTTP error status is an answer, not an exception."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (http://host:port)
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _post(url: str, payload: dict[str, Any], timeout: float) -> IO[bytes]:
    request = urllib.request.Request(  # noqa: S310 (http://host:port)
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        resp: IO[bytes] = urllib.request.urlopen(request, timeout=timeout)  # noqa: S310
    except urllib.error.HTTPError as exc:
        raise ServerError(f"POST {url}: HTTP {exc.code}: {exc.read()[:500]!r}") from exc
    return resp


def complete(
    base: str, path: str, payload: dict[str, Any], timeout: float = REQUEST_TIMEOUT_S
) -> dict[str, Any]:
    """One non-streaming request (``/v1/completions`` or ``/v1/chat/completions``)."""
    with _post(base + path, payload, timeout) as resp:
        body: dict[str, Any] = json.load(resp)
        return body


def stream(
    base: str, path: str, payload: dict[str, Any], timeout: float = REQUEST_TIMEOUT_S
) -> list[dict[str, Any]]:
    """The server-sent events of one streaming request, up to ``data: [DONE]``."""
    events: list[dict[str, Any]] = []
    with _post(base + path, {**payload, "stream": True}, timeout) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line.removeprefix("data:").strip()
            if data == "[DONE]":
                return events
            events.append(json.loads(data))
    raise ServerError(f"POST {base}{path}: the stream ended without data: [DONE]")


@dataclass
class Server:
    """A running llama-server: started by ``start``, ready when ``/health`` answers 200."""

    config: ServeConfig
    binary: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    #: Seconds from the process's start to its first /health 200.
    ready_s: float = 0.0
    health_codes: list[int] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    def start(self) -> None:
        with self.log.open("wb") as out:
            self.started = time.monotonic()
            self.process = subprocess.Popen(
                self.config.argv(self.binary), stdout=out, stderr=subprocess.STDOUT
            )

    def log_tail(self, lines: int = 20) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, deadline_s: float = READY_DEADLINE_S) -> float:
        assert self.process is not None  # noqa: S101 (start() first)
        until = self.started + deadline_s
        while time.monotonic() < until:
            if self.process.poll() is not None:
                raise ServerError(
                    f"llama-server exited with {self.process.returncode} before it served; "
                    f"log {self.log}:\n{self.log_tail()}"
                )
            try:
                code, _ = http_get(self.base + "/health", timeout=2.0)
            except OSError:
                code = 0  # not listening yet
            if not self.health_codes or self.health_codes[-1] != code:
                self.health_codes.append(code)
            if code == 200:
                self.ready_s = time.monotonic() - self.started
                return self.ready_s
            time.sleep(0.02)
        raise ServerError(
            f"llama-server did not answer /health 200 within {deadline_s:.0f} s; "
            f"log {self.log}:\n{self.log_tail()}"
        )

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def running(config: ServeConfig, binary: Path, log: Path) -> Iterator[Server]:
    """A started and ready server, stopped on exit (also when start-up fails)."""
    server = Server(config, binary, log)
    try:
        server.start()
        server.wait_ready()
        yield server
    finally:
        server.stop()


def measure(binary: Path, workdir: Path, runs: int = 3) -> dict[str, Any]:
    """Start-up and throughput figures of the tiny model; medians over ``runs`` cold starts."""
    from testbed import tiny_gguf  # noqa: PLC0415 (numpy and gguf only when measuring)

    model = tiny_gguf.write(workdir / "tiny.gguf")
    ready, first, tok_s, server_tok_s = [], [], [], []
    concurrent: dict[str, float] = {}
    for run in range(runs):
        config = ServeConfig(model=model, port=free_port())
        with running(config, binary, workdir / f"server-{run}.log") as server:
            ready.append(server.ready_s)
            prompt = {"model": DEFAULT_ALIAS, "prompt": "Hello", "max_tokens": 1}
            complete(server.base, "/v1/completions", prompt)
            first.append(time.monotonic() - server.started)
            request = {**prompt, "max_tokens": 64, "temperature": 0.8}
            sent = time.monotonic()
            body = complete(server.base, "/v1/completions", request)
            tokens = int(body["usage"]["completion_tokens"])
            tok_s.append(tokens / (time.monotonic() - sent))
            server_tok_s.append(float(body["timings"]["predicted_per_second"]))
            if run == runs - 1:
                concurrent = _concurrent(server, config.parallel, request)
    return {
        "runs": runs,
        "model_bytes": model.stat().st_size,
        "start_to_health_200_s": round(statistics.median(ready), 3),
        "start_to_first_completion_s": round(statistics.median(first), 3),
        "completion_64_tokens_per_s_client": round(statistics.median(tok_s), 1),
        "completion_64_tokens_per_s_server": round(statistics.median(server_tok_s), 1),
        **concurrent,
    }


def metric(base: str, name: str) -> float:
    """One sample of /metrics (a counter or gauge without labels)."""
    _, body = http_get(base + "/metrics")
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise ServerError(f"{name} is not in {base}/metrics (was it started with --metrics?)")


def _concurrent(server: Server, streams: int, request: dict[str, Any]) -> dict[str, float]:
    """One request per slot at once. Decode calls show the batching: one per token of each
    stream when served one after another, one per token of the longest when fully parallel."""
    decodes = metric(server.base, "llamacpp:n_decode_total")
    sent = time.monotonic()
    with ThreadPoolExecutor(streams) as pool:
        bodies = list(
            pool.map(lambda _: complete(server.base, "/v1/completions", request), range(streams))
        )
    wall = time.monotonic() - sent
    tokens = sum(int(b["usage"]["completion_tokens"]) for b in bodies)
    return {
        f"concurrent_{streams}x64_tokens_per_s": round(tokens / wall, 1),
        f"concurrent_{streams}x64_decode_calls": metric(server.base, "llamacpp:n_decode_total")
        - decodes,
    }


def install(
    push: Push, machine: str, workdir: Path, binary: Path, models: Mapping[str, tuple[int, int]]
) -> list[str]:
    """What a user does on a testbed machine before the playbook: llama-server at PROGRAM and
    each model's persistent copy under MODELS_ROOT (a tiny GGUF of the given seed, and that many
    bytes of padding beside it). Returns the paths written on the machine."""
    from testbed import tiny_gguf  # noqa: PLC0415 (numpy and gguf only here)

    push(machine, binary, PROGRAM, 0o755)
    written = [PROGRAM]
    for name, (seed, pad) in models.items():
        gguf = tiny_gguf.write(workdir / f"{name}.gguf", seed=seed)
        written.append(f"{MODELS_ROOT}/{name}/{MODEL_FILE}")
        push(machine, gguf, written[-1], 0o644)
        if pad:
            filler = workdir / f"{name}.pad"
            filler.write_bytes(bytes(pad))
            written.append(f"{MODELS_ROOT}/{name}/pad.bin")
            push(machine, filler, written[-1], 0o644)
    return written


def _build(root: Path | None) -> llama_build.Built:
    built = llama_build.ensure(root)
    how = f"built in {built.build_s:.0f} s" if built.build_s else "cached"
    print(f"{built.binary} ({how})", file=sys.stderr)
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.llama_server",
        description="llama.cpp's llama-server for the testbed: build it (cached), run, measure.",
        epilog="cache: $CT200_TESTBED_CACHE/llama-server (default /var/cache/ct200-testbed/...)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build llama-server unless cached; print the binary's path")
    sub.add_parser("path", help="print the cached binary's path; exit 1 when not built")
    sub.add_parser("measure", help="start-up time and tokens/s with the tiny model, as JSON")
    serve = sub.add_parser("serve", help="run llama-server in the foreground")
    serve.add_argument("--model", type=Path, required=True, help="a .gguf (see testbed.tiny_gguf)")
    serve.add_argument("--alias", default=DEFAULT_ALIAS, help="the served model name")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--parallel", type=int, default=4, help="slots; -c is split across them")
    serve.add_argument("--ctx", type=int, default=2048)
    args = parser.parse_args(argv)
    try:
        if args.command == "path":
            found = llama_build.cached()
            if found is None:
                print(f"not built: {llama_build.binary_path()}", file=sys.stderr)
                return EXIT_FAILED
            print(found)
            return EXIT_OK
        binary = _build(None).binary
        if args.command == "build":
            print(binary)
        elif args.command == "measure":
            with tempfile.TemporaryDirectory(prefix="llama-measure-") as tmp:
                print(json.dumps(measure(binary, Path(tmp)), indent=2))
        else:
            if not args.model.is_file():
                print(f"llama_server: error: --model {args.model}: no such file", file=sys.stderr)
                return EXIT_BAD_INPUT
            config = ServeConfig(
                args.model, args.alias, port=args.port, ctx=args.ctx, parallel=args.parallel
            )
            os.execv(binary, config.argv(binary))  # noqa: S606 (argv list, no shell)
    except llama_build.BuildError as exc:
        print(f"llama_server: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (ServerError, OSError) as exc:
        print(f"llama_server: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
