"""The SSH door's trust boundary (issue 20, class 4): what an ssh config may say, ProxyJump through
stand-in bastions with every hop's host key verified, options refused by name, ports in range,
hostile ports and --host values. The servers are stand-ins (tests/unit/ssh_standin.py): paramiko's
server side on 127.0.0.1, each with its own host key."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from ct200_tools.doctor.probes.base import SshError
from ct200_tools.doctor.probes.ssh import SshReader, SshTarget, connect, resolve
from tests.unit import ssh_standin

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def key(tmp_path: Path) -> tuple[paramiko.PKey, Path]:
    return ssh_standin.client_key(tmp_path)


@pytest.fixture
def servers(key: tuple[paramiko.PKey, Path]) -> Iterator[list[ssh_standin.StandIn]]:
    made: list[ssh_standin.StandIn] = []
    yield made
    for s in made:
        s.close()


def standin(
    made: list[ssh_standin.StandIn], key: tuple[paramiko.PKey, Path], **routes: int
) -> ssh_standin.StandIn:
    s = ssh_standin.StandIn(key[0], {k.replace("_", "."): v for k, v in routes.items()})
    made.append(s)
    return s


def config(tmp_path: Path, key: Path, body: str, known: str = "") -> str:
    """An ssh config: `body` first (its Host blocks win), then the files every host shares."""
    (tmp_path / "known_hosts").write_text(known)
    path = tmp_path / "config"
    path.write_text(
        f"{body}\nHost *\n  User root\n  IdentityFile {key}\n"
        f"  UserKnownHostsFile {tmp_path}/known_hosts\n  GlobalKnownHostsFile /dev/null\n"
    )
    return str(path)


def open_and_close(target: SshTarget) -> None:
    session = connect(target, 10)
    try:
        assert session.sftp.get_channel() is not None
    finally:
        session.close()


# -- direct ------------------------------------------------------------------------------------
def test_direct_connect_with_a_verified_key(tmp_path: Path, key, servers) -> None:  # type: ignore[no-untyped-def]
    pve = standin(servers, key)
    cfg = config(
        tmp_path,
        key[1],
        f"Host pve\n  HostName 127.0.0.1\n  Port {pve.port}",
        pve.known_hosts_line(),
    )
    target = resolve("pve", cfg)
    assert target.jumps == ()
    open_and_close(target)
    assert pve.forwarded == []


def test_known_hosts_markers_are_read_as_ssh_reads_them(tmp_path: Path, key, servers) -> None:  # type: ignore[no-untyped-def]
    """paramiko's reader stopped at a @cert-authority line ("cannot read it"); a @revoked key is
    refused even where another line lists it."""
    pve = standin(servers, key)
    ca = paramiko.ECDSAKey.generate()
    body = f"Host pve\n  HostName 127.0.0.1\n  Port {pve.port}"
    marked = f"@cert-authority *.example {ca.get_name()} {ca.get_base64()}\n# a comment\n"
    open_and_close(resolve("pve", config(tmp_path, key[1], body, marked + pve.known_hosts_line())))
    revoked = f"@revoked * {pve.host_key.get_name()} {pve.host_key.get_base64()}\n"
    cfg = config(tmp_path, key[1], body, pve.known_hosts_line() + revoked)
    with pytest.raises(SshError, match="marked @revoked in known_hosts"):
        connect(resolve("pve", cfg), 10)


def test_host_key_alias_names_the_known_hosts_entry(tmp_path: Path, key, servers) -> None:  # type: ignore[no-untyped-def]
    pve = standin(servers, key)
    line = f"pve-alias {pve.host_key.get_name()} {pve.host_key.get_base64()}\n"
    body = f"Host pve\n  HostName 127.0.0.1\n  Port {pve.port}\n  HostKeyAlias pve-alias"
    open_and_close(resolve("pve", config(tmp_path, key[1], body, line)))
    # Recorded under the address, not the alias: ssh(1) looks the alias up only, so must we.
    cfg = config(tmp_path, key[1], body, pve.known_hosts_line())
    with pytest.raises(SshError, match="is not in known_hosts") as exc:
        connect(resolve("pve", cfg), 10)
    assert "pve-alias" in str(exc.value)


def test_algorithms_are_what_ssh_would_offer(tmp_path: Path, key, servers) -> None:  # type: ignore[no-untyped-def]
    pve = standin(servers, key)
    body = f"Host pve\n  HostName 127.0.0.1\n  Port {pve.port}\n"
    known = pve.known_hosts_line()
    default = dict(resolve("pve", config(tmp_path, key[1], body, known)).disabled)
    assert {"3des-cbc", "aes128-cbc"} <= set(default["ciphers"]), default
    assert "hmac-md5" in default["macs"], default
    cfg = config(
        tmp_path, key[1], body + "  Ciphers aes256-gcm@openssh.com\n  MACs -hmac-sha1*", known
    )
    target = resolve("pve", cfg)
    assert "hmac-sha1" in dict(target.disabled)["macs"]
    session = connect(target, 10)
    try:
        transport = session.client.get_transport()
        assert transport is not None and transport.remote_cipher == "aes256-gcm@openssh.com"
    finally:
        session.close()
    cfg = config(tmp_path, key[1], body + "  Ciphers chacha20-poly1305@openssh.com", known)
    with pytest.raises(SshError, match=r"Ciphers chacha20-poly1305@openssh.com leaves nothing"):
        resolve("pve", cfg)


def test_bind_address_address_family_identities_only(tmp_path: Path, key, servers) -> None:  # type: ignore[no-untyped-def]
    pve = standin(servers, key)
    body = f"Host pve\n  HostName 127.0.0.1\n  Port {pve.port}\n  IdentitiesOnly yes\n"
    known = pve.known_hosts_line()
    target = resolve("pve", config(tmp_path, key[1], body + "  BindAddress 127.0.0.2", known))
    assert not target.allow_agent
    open_and_close(target)
    assert pve.peers == ["127.0.0.2"]
    target = resolve("pve", config(tmp_path, key[1], body + "  AddressFamily inet6", known))
    with pytest.raises(SshError, match=r"cannot resolve 127\.0\.0\.1"):
        connect(target, 10)
    assert pve.peers == ["127.0.0.2"]


# -- ProxyJump ---------------------------------------------------------------------------------
def test_proxy_jump_goes_through_the_bastion_with_both_keys_verified(  # type: ignore[no-untyped-def]
    tmp_path: Path, key, servers
) -> None:
    pve = standin(servers, key)
    # pve.internal resolves only on the bastion: a direct connection cannot reach it.
    bastion = standin(servers, key, pve_internal=pve.port)
    body = (
        f"Host pve\n  HostName pve.internal\n  Port {pve.port}\n  ProxyJump bastion\n"
        f"Host bastion\n  HostName 127.0.0.1\n  Port {bastion.port}"
    )
    known = bastion.known_hosts_line() + pve.known_hosts_line("pve.internal")
    target = resolve("pve", config(tmp_path, key[1], body, known))
    assert [j.alias for j in target.jumps] == ["bastion"]
    open_and_close(target)
    assert bastion.forwarded == [("pve.internal", pve.port)]


def test_proxy_jump_chain_user_and_port_in_the_hop(tmp_path: Path, key, servers) -> None:  # type: ignore[no-untyped-def]
    """Two hops, the second given as user@host:port: ssh(1) connects to the first, through it to
    the second, through that to the host; `ProxyJump none` in a later block changes nothing
    (the first value wins), and means direct where it comes first."""
    pve = standin(servers, key)
    inner = standin(servers, key, pve_internal=pve.port)
    outer = standin(servers, key, inner_internal=inner.port)
    body = (
        f"Host pve\n  HostName pve.internal\n  Port {pve.port}\n"
        f"  ProxyJump outer,admin@inner.internal:{inner.port}\n"
        f"Host outer\n  HostName 127.0.0.1\n  Port {outer.port}\n"
        "Host *\n  ProxyJump none"
    )
    known = (
        outer.known_hosts_line()
        + inner.known_hosts_line("inner.internal")
        + pve.known_hosts_line("pve.internal")
    )
    target = resolve("pve", config(tmp_path, key[1], body, known))
    assert [(j.alias, j.user, j.port) for j in target.jumps] == [
        ("outer", "root", outer.port),
        ("inner.internal", "admin", inner.port),
    ]
    open_and_close(target)
    assert outer.forwarded == [("inner.internal", inner.port)]
    assert inner.forwarded == [("pve.internal", pve.port)]


def test_unknown_key_at_the_jump_host_is_refused(tmp_path: Path, key, servers) -> None:  # type: ignore[no-untyped-def]
    pve = standin(servers, key)
    bastion = standin(servers, key, pve_internal=pve.port)
    body = (
        f"Host pve\n  HostName pve.internal\n  Port {pve.port}\n  ProxyJump bastion\n"
        f"Host bastion\n  HostName 127.0.0.1\n  Port {bastion.port}"
    )
    cfg = config(tmp_path, key[1], body, pve.known_hosts_line("pve.internal"))
    with pytest.raises(SshError) as exc:
        connect(resolve("pve", cfg), 10)
    msg = str(exc.value)
    assert msg.startswith("--host pve: jump host root@bastion (127.0.0.1):"), msg
    assert "is not in known_hosts" in msg and ssh_standin_fingerprint(bastion) in msg
    assert bastion.forwarded == []  # nothing went past the unverified hop
    assert (tmp_path / "known_hosts").read_text() == pve.known_hosts_line("pve.internal")


def test_changed_key_behind_the_jump_host_is_refused(tmp_path: Path, key, servers) -> None:  # type: ignore[no-untyped-def]
    pve = standin(servers, key)
    bastion = standin(servers, key, pve_internal=pve.port)
    other = paramiko.ECDSAKey.generate()
    body = (
        f"Host pve\n  HostName pve.internal\n  Port {pve.port}\n  ProxyJump bastion\n"
        f"Host bastion\n  HostName 127.0.0.1\n  Port {bastion.port}"
    )
    known = bastion.known_hosts_line() + (
        f"[pve.internal]:{pve.port} {other.get_name()} {other.get_base64()}\n"
    )
    with pytest.raises(SshError, match="its SSH host key CHANGED"):
        connect(resolve("pve", config(tmp_path, key[1], body, known)), 10)
    assert bastion.forwarded == [("pve.internal", pve.port)]


def test_a_jump_host_that_cannot_reach_the_host_says_so(tmp_path: Path, key, servers) -> None:  # type: ignore[no-untyped-def]
    bastion = standin(servers, key)
    body = (
        "Host pve\n  HostName pve.internal\n  ProxyJump bastion\n"
        f"Host bastion\n  HostName 127.0.0.1\n  Port {bastion.port}"
    )
    with pytest.raises(SshError, match=r"jump host .*bastion.* could not open pve.internal:22"):
        connect(resolve("pve", config(tmp_path, key[1], body, bastion.known_hosts_line())), 10)


def ssh_standin_fingerprint(s: ssh_standin.StandIn) -> str:
    from ct200_tools.doctor.probes.ssh import fingerprint  # noqa: PLC0415

    return fingerprint(s.host_key)


@pytest.mark.parametrize(
    ("jump", "why"),
    [
        ("bastion:70000", "port '70000'"),
        ("bastion:0", "port '0'"),
        ("bastion:x", "port 'x'"),
        ("a b", "not a host"),
        ("-oProxyCommand=x", "not a host"),
        ("pve", "loop"),
        ("bastion,", "not a host"),
    ],
)
def test_bad_proxy_jump_is_refused(tmp_path: Path, key, jump: str, why: str) -> None:  # type: ignore[no-untyped-def]
    cfg = config(tmp_path, key[1], f"Host pve\n  ProxyJump {jump}\nHost bastion\n  Port 22")
    with pytest.raises(SshError, match="ProxyJump") as exc:
        resolve("pve", cfg)
    assert why in str(exc.value) and f"{tmp_path}/config line 2" in str(exc.value)


# -- options refused by name, ports ------------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "name"),
    [
        ("ProxyCommand nc %h %p", "ProxyCommand"),
        ("ProxyCommand ssh -W %h:%p bastion", "ProxyCommand"),
        ("BindInterface eth1", "BindInterface"),
        ("RevokedHostKeys /etc/ssh/revoked", "RevokedHostKeys"),
        ("IdentityAgent /run/other-agent.sock", "IdentityAgent"),
        ("CanonicalizeHostname yes\n  CanonicalDomains x\n  ProxyJump b", "CanonicalizeHostname"),
    ],
)
def test_options_that_change_the_route_are_refused_by_name(  # type: ignore[no-untyped-def]
    tmp_path: Path, key, line: str, name: str
) -> None:
    cfg = config(tmp_path, key[1], f"Host pve\n  HostName 10.0.0.5\n  {line}")
    with pytest.raises(SshError) as exc:
        resolve("pve", cfg)
    msg = str(exc.value)
    assert name in msg and f"{tmp_path}/config line 3" in msg, msg


def test_include_is_read_as_ssh_reads_it(tmp_path: Path, key) -> None:  # type: ignore[no-untyped-def]
    """An included file's ProxyJump is the route (ignored, it bypassed the bastion); after the
    Include, lines apply to every host again; Host blocks included inside a block are refused."""
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "10-pve.conf").write_text(
        "Host pve\n  HostName pve.internal\n  ProxyJump bastion\nHost other\n  Port 2\n"
    )
    (tmp_path / "conf.d" / "20-empty.conf").write_text("# nothing\n")
    body = f"Include {tmp_path}/conf.d/*.conf\nPort 2222\nHost bastion\n  HostName 10.0.0.9"
    t = resolve("pve", config(tmp_path, key[1], body))
    assert (t.hostname, t.port) == ("pve.internal", 2222)
    assert [(j.alias, j.hostname, j.port) for j in t.jumps] == [("bastion", "10.0.0.9", 2222)]
    inside = f"Host pve\n  Include {tmp_path}/conf.d/10-pve.conf"
    with pytest.raises(SshError, match=r"Include .* inside a Host or Match block .*line 2"):
        resolve("pve", config(tmp_path, key[1], inside))
    (tmp_path / "conf.d" / "30-loop.conf").write_text(f"Include {tmp_path}/conf.d/30-loop.conf\n")
    with pytest.raises(SshError, match="more than 16 deep"):
        resolve("pve", config(tmp_path, key[1], body))
    os.mkfifo(tmp_path / "conf.d" / "30-loop.conf.fifo")
    (tmp_path / "conf.d" / "30-loop.conf").write_text(f"Include {tmp_path}/conf.d/*.fifo\n")
    with pytest.raises(SshError, match="is a FIFO"):
        resolve("pve", config(tmp_path, key[1], body))


def test_match_criteria_paramiko_cannot_judge_are_refused(tmp_path: Path, key) -> None:  # type: ignore[no-untyped-def]
    cfg = config(tmp_path, key[1], "Match localnetwork 10.0.0.0/8\n  ProxyJump bastion")
    with pytest.raises(SshError, match=r"Match localnetwork .*line 1"):
        resolve("pve", cfg)


def test_none_values(tmp_path: Path, key, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    body = (
        "Host pve\n  HostName 10.0.0.5\n  ProxyCommand none\n  ProxyJump none\n"
        "  UserKnownHostsFile none\n  IdentityFile none"
    )
    (tmp_path / "none").write_text("")  # `none` is no file, not one in the working directory
    monkeypatch.chdir(tmp_path)
    t = resolve("pve", config(tmp_path, key[1], body))
    assert (t.hostname, t.jumps) == ("10.0.0.5", ())
    assert t.known_hosts == ("/dev/null",) and t.identity_files == (str(key[1]),)


@pytest.mark.parametrize("port", ["70000", "0", "-1", "65536", "22x", "0x16", "99999999999"])
def test_port_out_of_range_is_refused(tmp_path: Path, key, port: str) -> None:  # type: ignore[no-untyped-def]
    cfg = config(tmp_path, key[1], f"Host pve\n  HostName 10.0.0.5\n  Port {port}")
    with pytest.raises(SshError, match=rf"Port {port!r} .*1 to 65535.*line 3"):
        resolve("pve", cfg)


def test_host_port_syntax_is_refused_with_the_fix(tmp_path: Path, key) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SshError, match="Port in the ssh config"):
        resolve("pve:2222", config(tmp_path, key[1], ""))


def test_control_characters_from_the_config_are_refused_escaped(tmp_path: Path, key) -> None:  # type: ignore[no-untyped-def]
    cfg = config(tmp_path, key[1], "Host pve\n  HostName evil\x1b[2Jhost")
    with pytest.raises(SshError, match=r"HostName 'evil\\x1b\[2Jhost'") as exc:
        resolve("pve", cfg)
    assert "\x1b" not in str(exc.value)


@pytest.mark.parametrize("kind", ["fifo", "zero", "big"])
def test_ssh_config_is_read_bounded(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "config"
    if kind == "fifo":
        os.mkfifo(path)
        src = str(path)
    elif kind == "zero":
        src = "/dev/zero"
    else:
        path.write_text("# x\n" * 300_000)
        src = str(path)
    with pytest.raises(SshError, match="ssh config") as exc:
        resolve("pve", src)
    assert "--ssh-config" in str(exc.value)


# -- the CLI: hostile ports and --host values --------------------------------------------------
def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ct200_tools.cli.entry", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "CT200_DEBUG": ""},
    )


@pytest.mark.parametrize("answer", [b"HTTP/1.1 400 Bad Request\r\n\r\n" + b"\xff\x00" * 64, None])
def test_a_port_that_speaks_garbage_gives_only_the_doctors_message(  # type: ignore[no-untyped-def]
    tmp_path: Path, key, answer: bytes | None
) -> None:
    with ssh_standin.junk_server(answer) as port:
        cfg = config(tmp_path, key[1], f"Host pve\n  HostName 127.0.0.1\n  Port {port}")
        r = doctor(
            "check", "--host", "pve", "--ssh-config", cfg, "--spec", "inventory/ct200",
            "--only", "lxc.nodes",
        )  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"ct200-doctor: --host pve: root@pve (127.0.0.1):{port}: cannot")


def test_the_doctor_reads_the_host_through_the_bastion(tmp_path: Path, key, servers) -> None:  # type: ignore[no-untyped-def]
    pve = standin(servers, key)
    bastion = standin(servers, key, pve_internal=pve.port)
    body = (
        f"Host pve\n  HostName pve.internal\n  Port {pve.port}\n  ProxyJump bastion\n"
        f"Host bastion\n  HostName 127.0.0.1\n  Port {bastion.port}"
    )
    known = bastion.known_hosts_line() + pve.known_hosts_line("pve.internal")
    cfg = config(tmp_path, key[1], body, known)
    r = doctor(
        "check", "--host", "pve", "--ssh-config", cfg, "--spec", "inventory/ct200",
        "--only", "lxc.nodes",
    )  # fmt: skip
    # The stand-in serves no files: the host's checks skip, saying what could not be read.
    assert "Traceback" not in r.stderr and r.returncode == 2, r.stdout + r.stderr
    route = f"ssh root@pve (pve.internal):{pve.port} via root@bastion (127.0.0.1):{bastion.port}"
    assert f"read over {route}" in r.stdout, r.stdout
    assert bastion.forwarded == [("pve.internal", pve.port)]


@pytest.mark.parametrize(("value", "shown"), [("", "empty"), ("a\x1b", "a\\x1b"), ("\r", "\\r")])
def test_host_empty_or_with_control_characters_is_a_usage_error(value: str, shown: str) -> None:
    r = doctor("check", "--host", value, "--spec", "inventory/ct200", "--only", "lxc.nodes")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == "" and shown in r.stderr and "--host" in r.stderr, r.stderr
    assert "\x1b" not in r.stderr and "\r" not in r.stderr and "Traceback" not in r.stderr


# -- files read on the host ---------------------------------------------------------------------
def test_read_regular_on_the_host_refuses_a_fifo_and_bounds_the_size(  # type: ignore[no-untyped-def]
    tmp_path: Path, key, servers
) -> None:
    pve = standin(servers, key)
    cfg = config(
        tmp_path,
        key[1],
        f"Host pve\n  HostName 127.0.0.1\n  Port {pve.port}",
        pve.known_hosts_line(),
    )
    (tmp_path / "marker").write_bytes(b"x" * 10)
    os.mkfifo(tmp_path / "fifo")
    session = connect(resolve("pve", cfg), 10)
    try:
        reader = SshReader(session)
        assert reader.read_regular(str(tmp_path / "marker"), 10) == b"x" * 10
        with pytest.raises(OSError, match="more than the 9 bytes"):
            reader.read_regular(str(tmp_path / "marker"), 9)
        with pytest.raises(OSError, match="not a regular file"):  # never opened: no hang
            reader.read_regular(str(tmp_path / "fifo"), 10)
        with pytest.raises(FileNotFoundError):
            reader.read_regular(str(tmp_path / "absent"), 10)
    finally:
        session.close()
