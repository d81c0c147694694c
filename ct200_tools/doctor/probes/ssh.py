"""The host probes' door to the PVE host over SSH: paramiko, host keys verified, no shell strings.

`check --host HOST` reads the host through SshReader, a Reader whose file reads are SFTP reads
and whose commands are fixed argv lists (shlex-quoted word by word, never built from data), so
the same probes read the host over SSH as they read this machine.

Host keys: only keys already recorded in known_hosts are accepted (the files ssh(1) reads:
~/.ssh/known_hosts and /etc/ssh/ssh_known_hosts, or what the ssh config's UserKnownHostsFile and
GlobalKnownHostsFile name); an unknown or changed key refuses the connection with the fix. A
key is never added (no AutoAddPolicy, whatever StrictHostKeyChecking says), and known_hosts is
never written. Each ProxyJump hop is verified the same way before anything goes through it.
What the ssh config may say: probes/sshconfig.py.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import io
import logging
import os
import shlex
import socket
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

# paramiko.config imports invoke (about 60% of paramiko's import time) only to run an ssh
# config's `Match exec`, which sshconfig.py refuses: keep it out before paramiko is imported.
sys.modules.setdefault("invoke", None)  # type: ignore[arg-type]
import paramiko  # noqa: E402

from ct200_tools.doctor.probes.base import NodeStat, Ran, Reader, RunTimeout, SshError  # noqa: E402
from ct200_tools.doctor.probes.sshconfig import SshTarget, resolve  # noqa: E402
from ct200_tools.untrusted import UntrustedInputError, read_bounded  # noqa: E402

__all__ = ["SshReader", "SshSession", "SshTarget", "connect", "fingerprint", "resolve"]

CONNECT_TIMEOUT_S = 10.0
MAX_KNOWN_HOSTS_BYTES = 64 << 20

# paramiko's transport thread logs a garbage or closed port's traceback at ERROR; with no
# handler, logging's last resort prints it on stderr before the doctor's own message. The
# doctor says what happened itself (connect's SshError).
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False


def fingerprint(key: paramiko.PKey) -> str:
    """As ssh-keygen -l shows it: SHA256:<base64, unpadded>."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class UnknownHostKey(SshError):
    pass


class _Refuse(paramiko.RejectPolicy):
    """RejectPolicy, raising an error that names the host, the key offered and the fix."""

    def __init__(self, target: SshTarget, label: str, direct: bool, top: str) -> None:
        self.target, self.label, self.direct, self.top = target, label, direct, top

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> NoReturn:
        t = self.target
        files = ", ".join(t.known_hosts)
        user_file = next(
            (f for f in t.known_hosts if f != "/dev/null"),
            os.path.expanduser("~/.ssh/known_hosts"),
        )
        port = "" if t.port == 22 else f"-p {t.port} "
        # ssh-keyscan reaches only a host this machine reaches, and records no HostKeyAlias.
        keyscan = (
            f" or `ssh-keyscan {port}-H {t.hostname} >> {shlex.quote(user_file)}`"
            if self.direct and t.host_key_alias is None
            else ""
        )
        alias = "" if t.host_key_alias is None else f" (HostKeyAlias {t.host_key_alias})"
        raise UnknownHostKey(
            f"{self.label} is not in known_hosts{alias} "
            f"({files}); it offered {key.get_name()} {fingerprint(key)}. The doctor never trusts "
            f"an unknown key: compare that fingerprint with the host's own "
            f"(ssh-keygen -lf /etc/ssh/ssh_host_{_short(key)}_key.pub on its console), then "
            f"record it with `ssh {self.top} true` (answer yes){keyscan}, and run again"
        )


def _short(key: paramiko.PKey) -> str:
    name = key.get_name()
    return {"ssh-ed25519": "ed25519", "ssh-rsa": "rsa"}.get(
        name, "ecdsa" if "ecdsa" in name else name
    )


@dataclass
class SshSession:
    target: SshTarget
    client: paramiko.SSHClient
    sftp: paramiko.SFTPClient
    #: The jump hosts' connections, in the order made (closed after the host's, last first).
    jumps: tuple[paramiko.SSHClient, ...] = field(default=())

    def close(self) -> None:
        self.sftp.close()
        self.client.close()
        for client in reversed(self.jumps):
            client.close()


def connect(target: SshTarget, timeout_s: float = CONNECT_TIMEOUT_S) -> SshSession:
    """An SSH session with the host's key verified against known_hosts; SshError otherwise.

    With ProxyJump, each jump host is connected and its key verified in turn, and the next one
    reached through it over a direct-tcpip channel (as `ssh -J`: the name is resolved by the
    jump host). Keys: IdentityFile, the agent (unless IdentitiesOnly), ~/.ssh/id_* when no
    IdentityFile is given; never a password."""
    top = target.alias
    hops = [*target.jumps, target]
    made: list[paramiko.SSHClient] = []
    try:
        sock: Any = None
        for i, hop in enumerate(hops):
            jump = i < len(hops) - 1
            where = f"--host {top}: " + (f"jump host {hop.describe()}" if jump else hop.describe())
            label = (
                f"{where}: the SSH host key"
                if jump
                else f"--host {top}: the SSH host key of {hop.describe()}"
            )
            if sock is None:
                sock = _dial(hop, where, timeout_s)
            made.append(_login(hop, sock, where, _Refuse(hop, label, i == 0, top), timeout_s))
            if jump:
                sock = _forward(made[-1], hops[i + 1], where, top, timeout_s)
        try:
            sftp = made[-1].open_sftp()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise SshError(
                f"--host {top}: {target.describe()}: no SFTP ({_why(exc)}): the doctor reads the "
                "host's files over SFTP, as scp does: check its sshd's Subsystem sftp"
            ) from None
    except BaseException:
        for client in reversed(made):
            client.close()
        raise
    return SshSession(target, made[-1], sftp, tuple(made[:-1]))


def _why(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def _dial(target: SshTarget, where: str, timeout_s: float) -> socket.socket:
    """The TCP connection to the first hop: AddressFamily and BindAddress as ssh(1) takes them."""
    try:
        infos = socket.getaddrinfo(target.hostname, target.port, target.family, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise SshError(
            f"{where}: cannot resolve {target.hostname} ({exc.strerror}): fix the name, or "
            "give its HostName in the ssh config"
        ) from None
    why = "no address"
    for family, kind, proto, _, addr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout_s)
            if target.bind_address is not None:
                sock.bind((target.bind_address, 0))
            sock.connect(addr)
        except OSError as exc:
            sock.close()
            why = _why(exc)
            continue
        return sock
    raise SshError(f"{where}: cannot connect ({why}): check that `ssh {target.alias} true` works")


def _forward(
    client: paramiko.SSHClient, nxt: SshTarget, where: str, top: str, timeout_s: float
) -> paramiko.Channel:
    """A direct-tcpip channel from this jump host to the next hop (ssh -W host:port)."""
    transport = client.get_transport()
    try:
        if transport is None:
            raise paramiko.SSHException("the connection closed")
        return transport.open_channel(
            "direct-tcpip", (nxt.hostname, nxt.port), ("127.0.0.1", 0), timeout=timeout_s
        )
    except paramiko.ChannelException as exc:
        why = exc.text
    except (paramiko.SSHException, OSError, EOFError) as exc:
        why = _why(exc)
    raise SshError(
        f"{where}: could not open {nxt.hostname}:{nxt.port} ({why}): check the HostName and "
        f"Port of {nxt.alias}, and that `ssh {top} true` works"
    )


def _login(
    target: SshTarget, sock: Any, where: str, policy: _Refuse, timeout_s: float
) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    revoked = _known_hosts(client.get_host_keys(), target.known_hosts)
    client.set_missing_host_key_policy(policy)
    keys = [p for p in target.identity_files if os.path.exists(p)]
    # paramiko takes a list of key files; its stubs say one.
    key_filename: Any = keys or None
    # The name known_hosts is searched under: paramiko forms it from hostname and port (the
    # socket is ours, so neither is dialled); a HostKeyAlias is looked up as it is.
    name, port = (
        (target.host_key_alias, 22)
        if target.host_key_alias is not None
        else (target.hostname, target.port)
    )
    try:
        client.connect(
            name,
            port=port,
            sock=sock,
            username=target.user,
            key_filename=key_filename,
            look_for_keys=not keys,
            allow_agent=target.allow_agent,
            timeout=timeout_s,
            banner_timeout=timeout_s,
            auth_timeout=timeout_s,
            channel_timeout=timeout_s,
            disabled_algorithms={kind: list(names) for kind, names in target.disabled},
        )
    except UnknownHostKey:
        client.close()
        raise
    except paramiko.BadHostKeyException as exc:
        client.close()
        raise SshError(
            f"{where}: its SSH host key CHANGED since known_hosts recorded it (it offered "
            f"{exc.key.get_name()} {fingerprint(exc.key)}, known_hosts has "
            f"{exc.expected_key.get_name()} {fingerprint(exc.expected_key)}): someone may be "
            "in the middle, or the host was reinstalled. Only when you know it was reinstalled: "
            f"`ssh-keygen -R {target.key_name}`, then `ssh {target.alias} true` to record the "
            "new key after comparing its fingerprint, and run again"
        ) from None
    except paramiko.AuthenticationException as exc:
        client.close()
        raise SshError(
            f"{where}: the host refused our keys ({exc}): the doctor logs in with a key as "
            f"ssh does (IdentityFile in the ssh config, the agent, ~/.ssh/id_*); "
            f"check that `ssh {target.alias} true` works without a password"
        ) from None
    except paramiko.SSHException as exc:
        client.close()
        if "No authentication methods" not in str(exc):
            raise SshError(
                f"{where}: cannot connect ({exc}): check `ssh {target.alias} true`"
            ) from None
        raise SshError(
            f"{where}: no key to log in with (no IdentityFile in the ssh config, no agent, no "
            f"~/.ssh/id_*): check that `ssh {target.alias} true` works without a password"
        ) from None
    except (OSError, EOFError) as exc:
        client.close()
        raise SshError(
            f"{where}: cannot connect ({_why(exc)}): check that `ssh {target.alias} true` works"
        ) from None
    except Exception as exc:  # noqa: BLE001 - paramiko raises bare Exception on odd key types
        client.close()
        raise SshError(f"{where}: cannot connect ({type(exc).__name__}: {exc})") from None
    transport = client.get_transport()
    offered = transport.get_remote_server_key() if transport is not None else None
    if offered is None or (offered.get_name(), offered.get_base64()) in revoked:
        client.close()
        shown = "" if offered is None else f" ({offered.get_name()} {fingerprint(offered)})"
        raise SshError(
            f"{where}: its SSH host key{shown} is marked @revoked in known_hosts: the doctor "
            "does not connect to it; find out why it was revoked before anything else"
        )
    return client


def _known_hosts(keys: paramiko.HostKeys, files: tuple[str, ...]) -> set[tuple[str, str]]:
    """The known_hosts files into `keys`, as ssh(1) reads them; the @revoked keys returned.

    paramiko's own reader stops at the first marker line (@revoked, @cert-authority). Here a
    @revoked key is refused whatever else lists it, a @cert-authority line is skipped (the
    doctor verifies no host certificates, so such a host's key is unknown: refused), and a
    line that is not a key is skipped, as ssh does."""
    revoked: set[tuple[str, str]] = set()
    for path in files:
        if not os.path.isfile(path):
            continue
        fix = f"make {path} a readable known_hosts file (ssh-keygen -R, ssh-keyscan)"
        try:
            data = read_bounded(path, "known_hosts", MAX_KNOWN_HOSTS_BYTES, fix)
        except UntrustedInputError as exc:
            raise SshError(f"{exc.message}: {exc.fix}") from None
        for raw in data.decode("utf-8", "replace").splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            fields = line.split()
            if fields[0] == "@revoked" and len(fields) >= 4:
                revoked.add((fields[2], fields[3]))
                continue
            if fields[0].startswith("@"):
                continue
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(" ".join(fields[:3]))
            except (paramiko.SSHException, ValueError, TypeError):
                continue
            if entry is not None and entry.key is not None:
                for name in entry.hostnames:
                    keys.add(name, entry.key.get_name(), entry.key)
    return revoked


def _unsupported(what: str) -> OSError:
    return OSError(errno.ENOTSUP, f"{what} is not read over SSH")


class SshReader(Reader):
    """A Reader of the remote host: files over SFTP, commands as quoted fixed argv lists.

    What the host probes do not use (statvfs, open, HTTP...) refuses instead of quietly reading
    this machine."""

    def __init__(self, session: SshSession) -> None:
        super().__init__(root=Path("/"))
        self.session = session

    def read_bytes(self, p: str) -> bytes:
        with self.session.sftp.open(p, "rb") as fh:
            return bytes(fh.read())

    def read_text(self, p: str) -> str:
        return self.read_bytes(p).decode("utf-8", errors="replace")

    def read_regular(self, p: str, max_bytes: int) -> bytes:
        """As Reader.read_regular, on the host: judged by SFTP's stat before the open (the
        host's sftp-server would block on a FIFO), and never more than max_bytes read."""
        st = self.session.sftp.stat(p)  # FileNotFoundError when absent, as locally
        mode = st.st_mode or 0
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "not a regular file", p)
        if (st.st_size or 0) > max_bytes:
            raise OSError(errno.EFBIG, f"more than the {max_bytes} bytes it may be", p)
        with self.session.sftp.open(p, "rb") as fh:
            data = bytes(fh.read(max_bytes + 1))
        if len(data) > max_bytes:
            raise OSError(errno.EFBIG, f"more than the {max_bytes} bytes it may be", p)
        return data

    def exists(self, p: str) -> bool:
        try:
            self.session.sftp.stat(p)
        except OSError:
            return False
        return True

    def listdir(self, p: str) -> list[str]:
        return sorted(self.session.sftp.listdir(p))

    def readlink(self, p: str) -> str:
        target = self.session.sftp.readlink(p)
        if target is None:
            raise OSError(errno.EINVAL, f"{p} is not a symbolic link")
        return target

    def stat_node(self, p: str) -> NodeStat | None:
        """SFTP gives the type, not the device number: stat(1) on the host gives that."""
        try:
            st = self.session.sftp.lstat(p)
        except FileNotFoundError:
            return None
        mode = st.st_mode or 0
        if not stat.S_ISCHR(mode):
            return NodeStat(is_char=False, major=0, minor=0, mode=stat.S_IMODE(mode))
        ran = self.run(["stat", "-c", "%t %T", "--", p], CONNECT_TIMEOUT_S)
        parts = ran.stdout.split()
        if ran.returncode != 0 or len(parts) != 2:
            raise OSError(errno.EIO, f"stat {p} on the host: {ran.stderr.strip() or ran.stdout}")
        return NodeStat(True, int(parts[0], 16), int(parts[1], 16), stat.S_IMODE(mode))

    def run(self, argv: list[str], timeout_s: float, env: Mapping[str, str] | None = None) -> Ran:
        if env is not None:
            raise _unsupported("a command environment")
        transport = self.session.client.get_transport()
        if transport is None or not transport.is_active():
            raise OSError(errno.ENOTCONN, "the SSH connection is closed")
        chan = transport.open_session(timeout=timeout_s)
        try:
            chan.settimeout(timeout_s)
            chan.exec_command(shlex.join(argv))
            chan.shutdown_write()
            try:
                out = chan.makefile("rb").read()
                err = chan.makefile_stderr("rb").read()
                code = chan.recv_exit_status()
            except TimeoutError:
                raise RunTimeout(f"{argv[0]} did not finish within {timeout_s:g} s") from None
        finally:
            chan.close()
        return Ran(code, out.decode(errors="replace"), err.decode(errors="replace"))

    def try_open(self, p: str) -> int:
        raise _unsupported(f"open({p})")

    def stat(self, p: str) -> os.stat_result:
        raise _unsupported(f"stat({p})")

    def lstat(self, p: str) -> os.stat_result:
        raise _unsupported(f"lstat({p})")

    def statvfs(self, p: str) -> os.statvfs_result:
        raise _unsupported(f"statvfs({p})")

    def is_dir(self, p: str) -> bool:
        raise _unsupported(f"is_dir({p})")

    def is_file(self, p: str) -> bool:
        raise _unsupported(f"is_file({p})")

    def connect(self, host: str, port: int, timeout_s: float) -> None:
        raise _unsupported("a TCP connection")

    def open_binary(self, p: str) -> io.FileIO:
        raise _unsupported(f"open({p})")

    def lock_holder(self, p: str) -> str | None:
        raise _unsupported(f"the lock on {p}")

    def request(
        self, method: str, url: str, body: bytes | None, timeout_s: float
    ) -> tuple[int, bytes]:
        raise _unsupported("an HTTP request")
