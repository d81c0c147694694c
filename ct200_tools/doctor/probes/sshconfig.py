"""`--host HOST` resolved through the ssh config as ssh(1) resolves it, or refused by name.

The config is untrusted input: read with untrusted.read_bounded (a FIFO or /dev/zero is refused
at once), UTF-8, no control characters. paramiko parses it and picks each option's first value
for the host; this module then decides, option by option, what ssh(1) would do differently.
Every option of ssh_config(5) that changes where the connection goes, or which host key is
trusted, is either implemented here or refused by name with the file, the line and the fix
(the table: docs/host.md, "What the doctor takes from an ssh config"). Options that only change
ssh's local behaviour (forwardings, multiplexing, logging, prompts) are ignored: the doctor opens
none of those, and an authentication it does not do fails closed.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import glob
import os
import re
import shlex
import socket
import sys
from dataclasses import dataclass
from typing import Any

# paramiko.config imports invoke (about 60% of paramiko's import time) only to run an ssh
# config's `Match exec`; the doctor runs no command from a config (refused below).
sys.modules.setdefault("invoke", None)  # type: ignore[arg-type]
import paramiko  # noqa: E402

from ct200_tools.doctor.probes.base import SshError  # noqa: E402
from ct200_tools.untrusted import UntrustedInputError, is_plain, read_bounded, show  # noqa: E402

#: ssh(1)'s defaults.
USER_CONFIG = "~/.ssh/config"
USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
MAX_CONFIG_BYTES = 1 << 20
#: More jump hosts than this is a ProxyJump loop, not a site's route (ssh(1) would recurse).
MAX_HOPS = 8
#: ssh(1)'s own limit on nested Include (READCONF_MAX_DEPTH).
MAX_INCLUDE_DEPTH = 16
#: The Match criteria paramiko judges as ssh(1) does; any other would match every host there.
MATCH_CRITERIA = {"all", "canonical", "final", "host", "originalhost", "user", "localuser"}
FAMILIES = {"any": socket.AF_UNSPEC, "inet": socket.AF_INET, "inet6": socket.AF_INET6}
CONFIG_FIX = (
    "give the doctor an ssh config without it for this host (--ssh-config FILE, as ssh -F), "
    "or change ~/.ssh/config"
)


@dataclass(frozen=True)
class SshTarget:
    #: What was asked for (--host, or a ProxyJump hop), as ssh(1) would be given it.
    alias: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    #: The known_hosts files consulted, in order (missing ones included: the message lists them).
    known_hosts: tuple[str, ...]
    #: HostKeyAlias: the name known_hosts is searched under instead of host[:port].
    host_key_alias: str | None = None
    #: The jump hosts, in the order connected (ProxyJump, flattened): each verified in turn,
    #: the next reached through the one before over a direct-tcpip channel.
    jumps: tuple[SshTarget, ...] = ()
    #: Ask the agent for keys (not with IdentitiesOnly yes or IdentityAgent none).
    allow_agent: bool = True
    family: int = socket.AF_UNSPEC
    bind_address: str | None = None
    #: paramiko's disabled_algorithms: what ssh(1) would not offer (Ciphers, MACs...).
    disabled: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def key_name(self) -> str:
        """How known_hosts names it (OpenSSH: [host]:port off port 22; HostKeyAlias as is)."""
        if self.host_key_alias is not None:
            return self.host_key_alias
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    def describe(self) -> str:
        shown = self.alias if self.alias == self.hostname else f"{self.alias} ({self.hostname})"
        return f"{self.user}@{shown}" + ("" if self.port == 22 else f":{self.port}")


@dataclass
class _Config:
    path: str
    parsed: paramiko.SSHConfig
    #: keyword (lower case) -> (file shown, line number, value) of each line that sets it.
    lines: dict[str, list[tuple[str, int, str]]]

    def where(self, key: str, value: object = None) -> str:
        """ " (ssh config PATH line N)": the first line setting `key` (to `value` if given)."""
        found = self.lines.get(key, [])
        exact = [(f, n) for f, n, v in found if value is not None and _unquote(v) == str(value)]
        f, n = (exact or [(f, n) for f, n, _ in found] or [(self.path, 0)])[0]
        return f" (ssh config {f}" + (f" line {n})" if n else ")")


def _unquote(value: str) -> str:
    return value[1:-1] if len(value) > 1 and value[0] == value[-1] == '"' else value


def _refuse(top: str, what: str, where: str, fix: str = CONFIG_FIX) -> SshError:
    return SshError(f"--host {top}: {what}{where}: {fix}")


#: A config line: (file shown, line number, keyword in lower case, value, the line).
_Line = tuple[str, int, str, str, str]


def _load(ssh_config: str | None, top: str) -> _Config:
    path = ssh_config or os.path.expanduser(USER_CONFIG)
    if ssh_config is None and not os.path.lexists(path):
        return _Config(path, paramiko.SSHConfig(), {})
    lines = _read(path, top, 0, [MAX_CONFIG_BYTES * 4])
    cfg = _Config(show(path), paramiko.SSHConfig(), {})
    for shown, n, key, value, _ in lines:
        cfg.lines.setdefault(key, []).append((shown, n, value))
    try:
        cfg.parsed = paramiko.SSHConfig.from_text("\n".join(line[4] for line in lines))
    except Exception as exc:  # noqa: BLE001 - paramiko's parse errors have no common type
        raise SshError(f"--ssh-config: ssh config {show(path)}: {show(exc, 200)}") from None
    return cfg


def _read(path: str, top: str, depth: int, budget: list[int]) -> list[_Line]:
    """The config's lines, each Include replaced by the files it names (as ssh(1) reads them:
    relative to ~/.ssh, globbed, sorted), every file bounded and checked."""
    fix = "give --ssh-config a regular ssh config file of at most 1 MiB (as for ssh -F)"
    try:
        data = read_bounded(path, "ssh config", min(MAX_CONFIG_BYTES, budget[0]), fix)
    except UntrustedInputError as exc:
        raise SshError(f"--ssh-config: {exc.message}: {exc.fix}") from None
    budget[0] -= len(data)
    shown = show(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SshError(
            f"--ssh-config: ssh config {shown} is not UTF-8 (byte {exc.start})"
        ) from None
    out: list[_Line] = []
    in_block = False
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = paramiko.SSHConfig.SETTINGS_REGEX.match(line)
        if m is None:
            out.append((shown, n, "", "", line))  # paramiko's parse says it cannot read it
            continue
        key, value = m.group(1).lower(), m.group(2)
        where = f" (ssh config {shown} line {n})"
        if not is_plain(line.replace("\t", " ")):
            raise _refuse(top, f"{m.group(1)} '{show(value)}' holds a control character", where)
        if key in ("host", "match"):
            in_block = True
        if key == "match":
            _check_match(top, value, where)
        if key != "include":
            out.append((shown, n, key, value, line))
            continue
        included = _include(value, top, where, depth, budget)
        if any(k in ("host", "match") for _, _, k, _, _ in included):
            if in_block:
                # paramiko's blocks do not nest: the included Host blocks would apply to
                # hosts the enclosing block does not match.
                raise _refuse(
                    top,
                    f"Include {show(value)} inside a Host or Match block names files with Host "
                    "or Match blocks of their own, which the doctor cannot nest",
                    where,
                    "move the Include above the first Host line",
                )
            # After the included files, the lines apply to every host again, as in ssh(1).
            included.append((shown, n, "host", "*", "Host *"))
        out.extend(included)
    return out


def _include(value: str, top: str, where: str, depth: int, budget: list[int]) -> list[_Line]:
    if depth >= MAX_INCLUDE_DEPTH:
        raise _refuse(
            top,
            f"Include {show(value)}: included more than {MAX_INCLUDE_DEPTH} deep (a loop?)",
            where,
            "fix the Include",
        )
    try:
        patterns = shlex.split(value)
    except ValueError:
        raise _refuse(top, f"Include {show(value)}: unbalanced quotes", where) from None
    out: list[_Line] = []
    for pattern in patterns:
        full = os.path.expanduser(pattern)
        if not os.path.isabs(full):
            full = os.path.join(os.path.expanduser("~/.ssh"), full)
        for path in sorted(glob.glob(full)):
            out.extend(_read(path, top, depth + 1, budget))
    return out


def _check_match(top: str, value: str, where: str) -> None:
    try:
        words = shlex.split(value)
    except ValueError:
        raise _refuse(top, f"Match {value}: unbalanced quotes", where) from None
    args = iter(words)
    for word in args:
        kind = word.lstrip("!").lower()
        if kind == "exec":
            raise _refuse(
                top, "`Match exec` runs a command to pick settings; the doctor runs none", where
            )
        if kind not in MATCH_CRITERIA:
            raise _refuse(
                top,
                f"Match {show(kind)} is a criterion the doctor cannot judge (paramiko would "
                "match every host with it)",
                where,
            )
        if kind not in ("all", "canonical", "final"):
            next(args, None)  # its argument


def _port(top: str, value: object, what: str, where: str) -> int:
    text = str(value)
    if re.fullmatch(r"[0-9]{1,5}", text) and 1 <= int(text) <= 65535:
        return int(text)
    raise _refuse(
        top, f"{what} '{show(text)}' is not a port (give 1 to 65535)", where, "fix the port"
    )


def _name(top: str, value: str, what: str, where: str) -> str:
    """A host or user name: as ssh(1) would take it as an argument, never an option."""
    if not value or value.startswith("-") or any(c.isspace() for c in value) or "@" in value:
        kind = "a user" if what.endswith("User") or what.endswith("user") else "a host"
        raise _refuse(top, f"{what} '{show(value)}' is not {kind}", where, "fix the name")
    if not is_plain(value):
        raise _refuse(top, f"{what} '{show(value)}' holds a control character", where)
    return value


def check_host(host: str) -> tuple[str, str]:
    """--host [USER@]NAME split into (user or "", name); SshError when it is not one."""
    if not host:
        raise SshError("--host is empty: give the PVE host's name ([USER@]NAME, as for ssh)")
    if not is_plain(host):
        raise SshError(
            f"--host '{show(host)}' holds a control character: give the host's name as for ssh"
        )
    user, at, name = host.rpartition("@")
    if not name or name.startswith("-") or any(c.isspace() for c in host) or (at and not user):
        raise SshError(f"--host {host!r} is not a host: give NAME or USER@NAME (as for ssh)")
    if re.fullmatch(r"[^:\[\]]+:[0-9]*", name):
        raise SshError(
            f"--host {host}: HOST:PORT is not ssh's syntax: give the Port in the ssh config "
            f"(Host {name.split(':')[0]} / Port N), as ssh needs it"
        )
    return user, name


def _hops(top: str, value: str, where: str) -> list[tuple[str, str, int | None]]:
    """ProxyJump's value: [user@]host[:port] (or ssh://...), comma-separated."""
    hops = []
    for item in value.split(","):
        spec = item.removeprefix("ssh://")
        user, _, hostport = spec.rpartition("@")
        port: int | None = None
        host = hostport
        m = re.fullmatch(r"\[([^\]]*)\](?::(.*))?", hostport)
        if m is not None:
            host, rest = m.group(1), m.group(2)
            port = None if rest is None else _port(top, rest, f"ProxyJump {item}: port", where)
        elif hostport.count(":") == 1:
            host, rest = hostport.split(":")
            port = _port(top, rest, f"ProxyJump {item}: port", where)
        _name(top, host, f"ProxyJump {item}: host", where)
        if user:
            _name(top, user, f"ProxyJump {item}: user", where)
        hops.append((user, host, port))
    return hops


def resolve(host: str, ssh_config: str | None = None) -> SshTarget:
    """HOST ([USER@]NAME) as ssh(1) resolves it through the ssh config: HostName, Port, User,
    IdentityFile, IdentitiesOnly, the known_hosts files, HostKeyAlias, AddressFamily,
    BindAddress and ProxyJump (each hop resolved through the same config). ssh_config: a file
    (it must exist); None: ~/.ssh/config when there is one."""
    user, name = check_host(host)
    cfg = _load(ssh_config, name)
    return _resolve(cfg, name, name, user, None, None, ())


def _resolve(
    cfg: _Config,
    top: str,
    name: str,
    user: str,
    port: int | None,
    jump: str | None,
    chain: tuple[str, ...],
) -> SshTarget:
    try:
        found = cfg.parsed.lookup(name)
    except Exception as exc:  # noqa: BLE001 - paramiko fails with KeyError, ValueError...
        raise _refuse(
            top,
            f"paramiko cannot apply the ssh config to {name} ({type(exc).__name__}: "
            f"{show(exc, 200)})",
            f" (ssh config {cfg.path})",
            "fix that option for this host",
        ) from None
    _check_options(cfg, top, found)
    hostname = _name(top, str(found.get("hostname", name)), "HostName", cfg.where("hostname"))
    if port is None:
        port = _port(top, found.get("port", "22"), "Port", cfg.where("port", found.get("port")))
    user = _name(top, user or str(found.get("user") or _login()), "User", cfg.where("user"))
    alias = found.get("hostkeyalias")
    if alias is not None:
        alias = _name(top, str(alias), "HostKeyAlias", cfg.where("hostkeyalias"))
    family = str(found.get("addressfamily", "any")).lower()
    if family not in FAMILIES:
        raise _refuse(
            top,
            f"AddressFamily {family} is not any, inet or inet6",
            cfg.where("addressfamily"),
            "fix it",
        )
    bind = found.get("bindaddress")
    agent = str(found.get("identityagent", "SSH_AUTH_SOCK"))
    only = str(found.get("identitiesonly", "no")).lower() == "yes"
    user_files = _split_files(found.get("userknownhostsfile")) or [
        os.path.expanduser(p) for p in USER_KNOWN_HOSTS
    ]
    global_files = _split_files(found.get("globalknownhostsfile")) or list(GLOBAL_KNOWN_HOSTS)
    target = SshTarget(
        alias=name,
        hostname=hostname,
        port=port,
        user=user,
        identity_files=tuple(f for f in _split_files(found.get("identityfile")) if f != os.devnull),
        known_hosts=tuple(dict.fromkeys([*user_files, *global_files])),
        host_key_alias=alias,
        allow_agent=not only and agent.lower() != "none",
        family=FAMILIES[family],
        bind_address=None if bind is None else str(bind),
        disabled=_algorithms(cfg, top, found),
    )
    if jump is None:
        jump = found.get("proxyjump")
    if jump is None or str(jump).lower() == "none":
        return target
    where = cfg.where("proxyjump", jump)
    hops: list[SshTarget] = []
    for i, (hop_user, hop_host, hop_port) in enumerate(_hops(top, str(jump), where)):
        if hop_host in (*chain, name) or len(chain) + len(hops) >= MAX_HOPS:
            raise _refuse(
                top,
                f"ProxyJump {jump}: a loop ({' -> '.join((*chain, name, hop_host))})",
                where,
                "fix the ProxyJump chain",
            )
        # ssh -J h1,...,hn: h1 is reached by its own config's route, each later hop through
        # the ones before it (ssh runs `ssh -J h1..hk-1 -W %h:%p hk`).
        via = None if i == 0 else "none"
        hop = _resolve(cfg, top, hop_host, hop_user, hop_port, via, (*chain, name))
        hops.extend(hop.jumps)
        hops.append(dataclasses.replace(hop, jumps=()))
    return dataclasses.replace(target, jumps=tuple(hops))


def _speaks(kind: str) -> tuple[str, ...]:
    # What a Transport offers by default; the class attributes disabled_algorithms filters
    # (paramiko's stubs do not list them).
    return tuple(getattr(paramiko.Transport, f"_preferred_{kind}"))


#: ssh_config option -> (paramiko's disabled_algorithms key, everything paramiko speaks).
ALGORITHMS = {
    "ciphers": ("ciphers", _speaks("ciphers")),
    "macs": ("macs", _speaks("macs")),
    "kexalgorithms": ("kex", _speaks("kex")),
    "hostkeyalgorithms": ("keys", _speaks("keys")),
    "pubkeyacceptedalgorithms": ("pubkeys", _speaks("pubkeys")),
    "pubkeyacceptedkeytypes": ("pubkeys", _speaks("pubkeys")),
}
#: What paramiko offers and ssh(1) does not by default (OpenSSH 9: no CBC, no MD5, no -96).
NOT_BY_DEFAULT = {"aes128-cbc", "aes192-cbc", "aes256-cbc", "3des-cbc"} | {
    "hmac-md5",
    "hmac-md5-96",
    "hmac-sha1-96",
}
NAMES = {
    "ciphers": "Ciphers",
    "macs": "MACs",
    "kexalgorithms": "KexAlgorithms",
    "hostkeyalgorithms": "HostKeyAlgorithms",
    "pubkeyacceptedalgorithms": "PubkeyAcceptedAlgorithms",
    "pubkeyacceptedkeytypes": "PubkeyAcceptedKeyTypes",
}


def _algorithms(cfg: _Config, top: str, found: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Ciphers, MACs, KexAlgorithms, HostKeyAlgorithms, PubkeyAcceptedAlgorithms as ssh(1)
    reads them (a list replaces the default, +LIST adds, -LIST removes, ^LIST puts first;
    wildcards allowed), as the algorithms paramiko must not offer. Without them, what ssh(1)
    offers by default: paramiko would also offer CBC ciphers and MD5 MACs."""
    disabled: dict[str, set[str]] = {}
    for option, (kind, speaks) in ALGORITHMS.items():
        default = [a for a in speaks if a not in NOT_BY_DEFAULT]
        value = found.get(option)
        allowed = set(default)
        if value is not None:
            text = str(value)
            head, rest = (text[0], text[1:]) if text[:1] in "+-^" else ("", text)
            picked = {a for a in speaks for p in rest.split(",") if fnmatch.fnmatchcase(a, p)}
            allowed = {"": picked, "-": allowed - picked}.get(head, allowed | picked)
            if not allowed:
                raise _refuse(
                    top,
                    f"{NAMES[option]} {show(text)} leaves nothing paramiko speaks (it speaks "
                    f"{', '.join(speaks)})",
                    cfg.where(option),
                    f"add one of those to {NAMES[option]}",
                )
        disabled.setdefault(kind, set()).update(a for a in speaks if a not in allowed)
    return tuple((kind, tuple(sorted(names))) for kind, names in sorted(disabled.items()))


#: Options refused whenever they apply to a host: each would change the route or the trust.
REFUSED = {
    "proxycommand": "runs a command to make the connection, and the doctor runs none: reach the "
    "host with ProxyJump (each hop's key verified) or ProxyCommand none",
    "bindinterface": "binds to a network interface, which the doctor does not do: remove it",
    "revokedhostkeys": "lists revoked host keys in a form the doctor cannot read, so it cannot "
    "honour it: take the revoked keys out of known_hosts, and remove it for this host",
}


def _check_options(cfg: _Config, top: str, found: Any) -> None:
    for key, why in REFUSED.items():
        value = found.get(key)
        if value is not None:
            raise _refuse(top, f"{_shown_key(key)} {show(value)} {why}", cfg.where(key, value))
    agent = found.get("identityagent")
    if agent is not None and agent.lower() not in ("none", "ssh_auth_sock", "$ssh_auth_sock"):
        raise _refuse(
            top,
            f"IdentityAgent {show(agent)}: the doctor asks only the agent of SSH_AUTH_SOCK",
            cfg.where("identityagent"),
            "set SSH_AUTH_SOCK to it instead, or give IdentityFile",
        )
    canon = str(found.get("canonicalizehostname", "no")).lower()
    jump = str(found.get("proxyjump", "none")).lower()
    if canon in ("yes", "always") and jump != "none":
        # ssh(1) canonicalises before a ProxyJump only with `always`, and then on the far side
        # of no hop; paramiko would resolve the name here either way.
        raise _refuse(
            top,
            f"CanonicalizeHostname {canon} with ProxyJump: the doctor cannot canonicalise a name "
            "behind a jump host",
            cfg.where("canonicalizehostname"),
            "give the full HostName instead, and CanonicalizeHostname no",
        )


def _shown_key(key: str) -> str:
    return {
        "proxycommand": "ProxyCommand",
        "bindinterface": "BindInterface",
        "revokedhostkeys": "RevokedHostKeys",
    }.get(key, key)


def _split_files(value: Any) -> list[str]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    words = [w for item in items for w in str(item).split()]
    # `none` is ssh(1)'s "no file": no known hosts (never a file of that name here).
    return [os.path.expanduser(w) if w.lower() != "none" else os.devnull for w in words]


def _login() -> str:
    try:
        import pwd  # noqa: PLC0415 - POSIX only, as ssh

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return os.environ.get("USER", "root")
