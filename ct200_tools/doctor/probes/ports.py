"""Who listens on a TCP port: /proc/net/tcp{,6} for the socket, /proc/PID/fd for its process.

This is what `ss -ltnp` reads, through the Reader, so recorded trees can stand in for a machine.
Naming another user's process needs root (its /proc/PID/fd is private); without it the socket
is still reported, with why its holder is unknown.
"""

from __future__ import annotations

import ipaddress
import re

from ct200_tools.doctor.probes.base import Reader
from ct200_tools.facts import PortHolder

LISTEN = "0A"
_SOCKET = re.compile(r"^socket:\[(\d+)\]$")
#: A machine with more processes than this is not scanned further for a socket's holder.
MAX_PROCESSES = 20000


def _addr(hex_addr: str) -> str:
    """/proc/net/tcp's address: 32-bit words in host (little-endian) byte order."""
    raw = bytes.fromhex(hex_addr)
    fixed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(fixed))


def parse_listeners(text: str) -> list[tuple[str, int, int]]:
    """(address, port, inode) of every LISTEN socket in a /proc/net/tcp or tcp6 table."""
    out = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != LISTEN:
            continue
        addr, _, port = fields[1].partition(":")
        try:
            out.append((_addr(addr), int(port, 16), int(fields[9])))
        except ValueError:
            continue
    return out


def _wildcard(addr: str) -> bool:
    return addr in ("0.0.0.0", "::")  # noqa: S104 - addresses read, not bound


def clashes(listener: str, host: str) -> bool:
    """Whether a socket listening on `listener` keeps a server from binding `host` on the same
    port: a wildcard on either side covers every address; a host name (not an address) is taken
    to mean any address, since the doctor does not resolve names."""
    if _wildcard(listener) or _wildcard(host):
        return True
    try:
        want = ipaddress.ip_address(host)
    except ValueError:
        return True
    return ipaddress.ip_address(listener) == want


def unit_of(cgroup_text: str) -> str | None:
    """The systemd unit a process belongs to, from /proc/PID/cgroup (v2 line, else the
    systemd v1 hierarchy): the last path component that is a .service or .scope."""
    lines = cgroup_text.splitlines()
    line = next((x for x in lines if x.startswith("0::")), None) or next(
        (x for x in lines if ":name=systemd:" in x), ""
    )
    path = line.split(":", 2)[-1]
    units = [c for c in path.split("/") if c.endswith((".service", ".scope"))]
    return units[-1] if units else None


def _holders(r: Reader, inodes: set[int]) -> tuple[dict[int, int], str | None]:
    """inode -> pid for the sockets given, and why some could not be looked for."""
    found: dict[int, int] = {}
    denied = 0
    try:
        pids = [p for p in r.listdir("/proc") if p.isdigit()][:MAX_PROCESSES]
    except OSError as exc:
        return found, f"cannot list /proc: {exc.strerror or exc}"
    for pid in pids:
        try:
            fds = r.listdir(f"/proc/{pid}/fd")
        except PermissionError:
            denied += 1
            continue
        except OSError:
            continue  # exited meanwhile
        for fd in fds:
            try:
                m = _SOCKET.match(r.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                continue
            if m and int(m.group(1)) in inodes:
                found.setdefault(int(m.group(1)), int(pid))
        if len(found) == len(inodes):
            break
    why = None
    if len(found) < len(inodes) and denied:
        why = (
            f"not permitted to read the open files of {denied} other users' processes: "
            "run the doctor as root to name the holder"
        )
    return found, why


def probe_port(r: Reader, host: str, port: int) -> tuple[PortHolder, ...]:
    """Every listening socket on `port` that clashes with `host`, with its holder when it can
    be named. OSError when neither table can be read."""
    listeners: list[tuple[str, int, int]] = []
    read_any = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            text = r.read_text(table)
        except OSError:
            continue
        read_any = True
        listeners += [x for x in parse_listeners(text) if x[1] == port and clashes(x[0], host)]
    if not read_any:
        raise OSError("cannot read /proc/net/tcp or /proc/net/tcp6")
    if not listeners:
        return ()
    owners, why = _holders(r, {inode for _, _, inode in listeners})
    out = []
    for addr, p, inode in listeners:
        shown = f"[{addr}]:{p}" if ":" in addr else f"{addr}:{p}"
        pid = owners.get(inode)
        if pid is None:
            out.append(PortHolder(shown, why_unknown=why or "no process holds it (closing)"))
            continue
        out.append(PortHolder(shown, pid, _comm(r, pid), _unit(r, pid)))
    return tuple(out)


def _comm(r: Reader, pid: int) -> str | None:
    try:
        return r.read_text(f"/proc/{pid}/comm").strip() or None
    except OSError:
        return None


def _unit(r: Reader, pid: int) -> str | None:
    try:
        return unit_of(r.read_text(f"/proc/{pid}/cgroup"))
    except OSError:
        return None
