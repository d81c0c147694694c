"""A stand-in sshd for the SSH door's tests: paramiko's server side in a thread on 127.0.0.1.

It stands in for the PVE host's sshd and for a site's bastion, which cannot exist here. Each has
an ephemeral port and its own fresh host key (ECDSA: paramiko generates no ed25519 key), accepts
exactly one client key, serves SFTP (no files: the handshake is what the door needs), and as a
bastion opens `direct-tcpip` channels only to the names in `routes` (a name only the bastion can
resolve proves the connection went through it). Every forward asked for is recorded.

Also `junk_server`: a plain TCP port that writes garbage, or closes at once, instead of SSH.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import paramiko


class _Iface(paramiko.ServerInterface):
    def __init__(self, standin: StandIn) -> None:
        self.standin = standin
        self.dest: dict[int, tuple[str, int]] = {}

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        if key.asbytes() == self.standin.client_key.asbytes():
            return paramiko.AUTH_SUCCESSFUL
        return paramiko.AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return paramiko.OPEN_SUCCEEDED
        return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_direct_tcpip_request(
        self, chanid: int, origin: tuple[str, int], destination: tuple[str, int]
    ) -> int:
        self.standin.forwarded.append((destination[0], destination[1]))
        if destination[0] not in self.standin.routes:
            return paramiko.OPEN_FAILED_CONNECT_FAILED
        self.dest[chanid] = destination
        return paramiko.OPEN_SUCCEEDED


def _pump(chan: paramiko.Channel, port: int) -> None:
    # Either side may go first (EOFError from paramiko, OSError from the socket): the end.
    with (
        contextlib.suppress(OSError, EOFError, paramiko.SSHException),
        socket.create_connection(("127.0.0.1", port), 5) as sock,
    ):
        try:
            while True:
                ready, _, _ = select.select([chan, sock], [], [], 10)
                if not ready:
                    return
                if chan in ready:
                    data = chan.recv(65536)
                    if not data:
                        return
                    sock.sendall(data)
                if sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    chan.sendall(data)
        finally:
            with contextlib.suppress(Exception):  # the client may have gone first
                chan.close()


class StandIn:
    def __init__(self, client_key: paramiko.PKey, routes: dict[str, int] | None = None) -> None:
        self.client_key = client_key
        self.routes = dict(routes or {})
        self.host_key = paramiko.ECDSAKey.generate()
        self.forwarded: list[tuple[str, int]] = []
        #: The address each connection came from (BindAddress).
        self.peers: list[str] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._transports: list[paramiko.Transport] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def known_hosts_line(self, name: str = "127.0.0.1") -> str:
        """The line ssh-keyscan would give for this server under `name` (its port added)."""
        return f"[{name}]:{self.port} {self.host_key.get_name()} {self.host_key.get_base64()}\n"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._session, args=(conn,), daemon=True).start()

    def _session(self, conn: socket.socket) -> None:
        self.peers.append(conn.getpeername()[0])
        t = paramiko.Transport(conn)
        t.add_server_key(self.host_key)
        t.set_subsystem_handler("sftp", paramiko.SFTPServer, ReadOnlySftp)
        self._transports.append(t)
        iface = _Iface(self)
        with contextlib.suppress(paramiko.SSHException, EOFError, OSError):
            t.start_server(server=iface)
            while t.is_active():
                chan = t.accept(timeout=1)
                if chan is None:
                    continue
                if chan.get_id() in iface.dest:
                    port = self.routes[iface.dest[chan.get_id()][0]]
                    threading.Thread(target=_pump, args=(chan, port), daemon=True).start()

    def close(self) -> None:
        self._listener.close()
        for t in self._transports:
            t.close()


@contextlib.contextmanager
def junk_server(answer: bytes | None) -> Iterator[int]:
    """A port that answers every connection with `answer` and closes (None: closes at once)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                if answer is not None:
                    conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def client_key(tmp_path: Path) -> tuple[paramiko.PKey, Path]:
    """A fresh client key and its private key file (the IdentityFile)."""
    key = paramiko.ECDSAKey.generate()
    path = tmp_path / "id_ecdsa"
    key.write_private_key_file(str(path))
    return key, path


class ReadOnlySftp(paramiko.SFTPServerInterface):
    """SFTP that reads this machine's files (stat, lstat, open for reading): what the host
    probes ask of the PVE host. Opening a FIFO here would block the stand-in's thread, as the
    host's sftp-server would: the reader must never ask."""

    def stat(self, path: str) -> paramiko.SFTPAttributes | int:
        try:
            return paramiko.SFTPAttributes.from_stat(os.stat(path))
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno)

    def lstat(self, path: str) -> paramiko.SFTPAttributes | int:
        try:
            return paramiko.SFTPAttributes.from_stat(os.lstat(path))
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno)

    def open(
        self, path: str, flags: int, attr: paramiko.SFTPAttributes
    ) -> paramiko.SFTPHandle | int:
        if flags & (os.O_WRONLY | os.O_RDWR):
            return paramiko.sftp.SFTP_PERMISSION_DENIED
        try:
            fh = open(path, "rb")  # noqa: SIM115 - the handle owns it and closes it
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno)
        handle = paramiko.SFTPHandle(flags)
        handle.readfile = fh  # type: ignore[attr-defined]
        return handle
