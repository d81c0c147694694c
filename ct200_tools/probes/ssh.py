"""The host probes' door to the PVE host over SSH: paramiko, host keys verified, no shell strings.

`check --host HOST` reads the host through SshReader, a Reader whose file reads are SFTP reads
and whose commands are fixed argv lists (shlex-quoted word by word, never built from data), so
the same probes read the host over SSH as they read this machine.

Host keys: only keys already recorded in known_hosts are accepted (the files ssh(1) reads:
~/.ssh/known_hosts and /etc/ssh/ssh_known_hosts, or what the ssh config's UserKnownHostsFile and
GlobalKnownHostsFile name); an unknown or changed key refuses the connection with the fix. A
key is never added (no AutoAddPolicy, whatever StrictHostKeyChecking says), and known_hosts is
never written.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import io
import os
import shlex
import socket
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

# paramiko.config imports invoke (about 60% of paramiko's import time) only to run an ssh
# config's `Match exec`; the doctor does not run commands from a config. Without it, such a
# config is an error that says so (resolve).
sys.modules.setdefault("invoke", None)  # type: ignore[arg-type]
import paramiko  # noqa: E402

from ct200_tools.probes.base import NodeStat, Ran, Reader, RunTimeout, SshError  # noqa: E402

#: ssh(1)'s defaults.
USER_CONFIG = "~/.ssh/config"
USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SshTarget:
    #: What was asked for (--host), as ssh(1) would be given it.
    alias: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    #: The known_hosts files consulted, in order (missing ones included: the message lists them).
    known_hosts: tuple[str, ...]

    @property
    def key_name(self) -> str:
        """How known_hosts names it (OpenSSH: [host]:port off port 22)."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    def describe(self) -> str:
        shown = self.alias if self.alias == self.hostname else f"{self.alias} ({self.hostname})"
        return f"{self.user}@{shown}" + ("" if self.port == 22 else f":{self.port}")


def _split_files(value: Any) -> list[str]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    return [os.path.expanduser(w) for item in items for w in str(item).split()]


def resolve(host: str, ssh_config: str | None = None) -> SshTarget:
    """HOST ([USER@]NAME) as ssh(1) resolves it through the ssh config: HostName, Port, User,
    IdentityFile, UserKnownHostsFile, GlobalKnownHostsFile. ssh_config: a file (it must exist);
    None: ~/.ssh/config when there is one."""
    user, at, name = host.rpartition("@")
    if not name or name.startswith("-") or any(c.isspace() for c in host) or (at and not user):
        raise SshError(f"--host {host!r} is not a host: give NAME or USER@NAME (as for ssh)")
    cfg = paramiko.SSHConfig()
    path = ssh_config or os.path.expanduser(USER_CONFIG)
    if ssh_config is not None or os.path.exists(path):
        try:
            cfg = paramiko.SSHConfig.from_path(path)
        except OSError as exc:
            raise SshError(f"--ssh-config {path}: cannot read it: {exc.strerror or exc}") from None
        except Exception as exc:  # noqa: BLE001 - paramiko's parse errors have no common type
            raise SshError(f"ssh config {path}: {exc}") from None
    try:
        found = cfg.lookup(name)
    except ImportError:
        raise SshError(
            f"ssh config {path}: `Match exec` runs a command to pick settings; the doctor runs "
            f"none: give it a config without it (--ssh-config FILE)"
        ) from None
    try:
        port = int(found.get("port", 22))
    except ValueError:
        raise SshError(f"ssh config {path}: Port {found.get('port')!r} is not a number") from None
    user_files = _split_files(found.get("userknownhostsfile")) or [
        os.path.expanduser(p) for p in USER_KNOWN_HOSTS
    ]
    global_files = _split_files(found.get("globalknownhostsfile")) or list(GLOBAL_KNOWN_HOSTS)
    return SshTarget(
        alias=name,
        hostname=str(found.get("hostname", name)),
        port=port,
        user=user or str(found.get("user") or _login()),
        identity_files=tuple(_split_files(found.get("identityfile"))),
        known_hosts=tuple(dict.fromkeys([*user_files, *global_files])),
    )


def _login() -> str:
    try:
        import pwd  # noqa: PLC0415 - POSIX only, as ssh

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return os.environ.get("USER", "root")


def fingerprint(key: paramiko.PKey) -> str:
    """As ssh-keygen -l shows it: SHA256:<base64, unpadded>."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class UnknownHostKey(SshError):
    pass


class _Refuse(paramiko.RejectPolicy):
    """RejectPolicy, raising an error that names the host, the key offered and the fix."""

    def __init__(self, target: SshTarget) -> None:
        self.target = target

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
        raise UnknownHostKey(
            f"--host {t.alias}: the SSH host key of {t.describe()} is not in known_hosts "
            f"({files}); it offered {key.get_name()} {fingerprint(key)}. The doctor never trusts "
            f"an unknown key: compare that fingerprint with the host's own "
            f"(ssh-keygen -lf /etc/ssh/ssh_host_{_short(key)}_key.pub on its console), then "
            f"record it with `ssh {t.alias} true` (answer yes) or "
            f"`ssh-keyscan {port}-H {t.hostname} >> {shlex.quote(user_file)}`, and run again"
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

    def close(self) -> None:
        self.sftp.close()
        self.client.close()


def connect(target: SshTarget, timeout_s: float = CONNECT_TIMEOUT_S) -> SshSession:
    """An SSH session with the host's key verified against known_hosts; SshError otherwise.
    Keys: the ssh config's IdentityFile, else the agent and ~/.ssh/id_*; never a password."""
    client = paramiko.SSHClient()
    for path in target.known_hosts:
        if os.path.isfile(path):
            try:
                client.load_system_host_keys(path)
            except (OSError, paramiko.SSHException) as exc:
                raise SshError(f"known_hosts {path}: cannot read it: {exc}") from None
    client.set_missing_host_key_policy(_Refuse(target))
    keys = [p for p in target.identity_files if os.path.exists(p)]
    # paramiko takes a list of key files; its stubs say one.
    key_filename: Any = keys or None
    where = f"--host {target.alias}: {target.describe()}"
    try:
        client.connect(
            target.hostname,
            port=target.port,
            username=target.user,
            key_filename=key_filename,
            look_for_keys=not keys,
            allow_agent=not keys,
            timeout=timeout_s,
            banner_timeout=timeout_s,
            auth_timeout=timeout_s,
            channel_timeout=timeout_s,
        )
        sftp = client.open_sftp()
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
    except socket.gaierror as exc:
        client.close()
        raise SshError(
            f"{where}: cannot resolve {target.hostname} ({exc.strerror}): fix the name, or "
            "give its HostName in the ssh config"
        ) from None
    except (OSError, EOFError) as exc:
        client.close()
        why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise SshError(
            f"{where}: cannot connect ({why}): check that `ssh {target.alias} true` works"
        ) from None
    except Exception as exc:  # noqa: BLE001 - paramiko raises bare Exception on odd key types
        client.close()
        raise SshError(f"{where}: cannot connect ({type(exc).__name__}: {exc})") from None
    return SshSession(target, client, sftp)


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
