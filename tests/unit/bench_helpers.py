"""The stand-in streaming server (benchmarks/bench_client/standin.py) as a test fixture: a real
aiohttp server on 127.0.0.1 in a subprocess, with scripted delays and faults, and the CLI; a TCP
proxy that relays answers in small segments (what a client on another host sees); a port that
takes connections and never answers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "benchmarks" / "bench_client" / "standin.py"
BENCH = [sys.executable, "-c", "from ct200_tools.cli.bench import main; main()"]


@contextlib.contextmanager
def standin(*args: str, lifetime: float = 120.0) -> Iterator[str]:
    """The server's base URL while it runs; it is killed (by pid) afterwards."""
    proc = subprocess.Popen(
        [sys.executable, str(STANDIN), "--port", "0", "--lifetime", str(lifetime), *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline() if ready else ""
        assert line.startswith("port "), f"the stand-in did not start: {line!r}"
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def bench(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*BENCH, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=REPO,
        env={**os.environ, **env} if env is not None else None,
    )


@contextlib.contextmanager
def segmenting_proxy(upstream: str, segment: int, pause: float = 0.001) -> Iterator[str]:
    """A TCP proxy in front of `upstream` (http://HOST:PORT) that relays each answer in writes
    of `segment` bytes with `pause` seconds between them (TCP_NODELAY: one segment each), as a
    proxy or a long path does; requests go through as they come. Its base URL while it runs."""
    host, port = urlsplit(upstream).hostname, urlsplit(upstream).port
    loop = asyncio.new_event_loop()
    started = threading.Event()
    address: list[int] = []

    async def pump_slowly(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                for i in range(0, len(data), segment):
                    writer.write(data[i : i + segment])
                    await writer.drain()
                    await asyncio.sleep(pause)
        writer.close()

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()

    async def relay(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(host, port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(pump(client_r, up_w), pump_slowly(up_r, client_w))
        up_w.close()

    stop: list[asyncio.Event] = []

    async def main() -> None:
        stop.append(asyncio.Event())
        server = await asyncio.start_server(relay, "127.0.0.1", 0)
        address.append(server.sockets[0].getsockname()[1])
        started.set()
        await stop[0].wait()
        server.close()
        relays = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in relays:
            task.cancel()
        await asyncio.gather(*relays, return_exceptions=True)

    def serve() -> None:
        loop.run_until_complete(main())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(10), "the proxy did not start"
    try:
        yield f"http://127.0.0.1:{address[0]}"
    finally:
        loop.call_soon_threadsafe(stop[0].set)
        thread.join(10)


@contextlib.contextmanager
def silent_port() -> Iterator[str]:
    """A base URL whose port takes connections (the kernel completes them: listen, never
    accept) and never answers, as a hung server does."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
