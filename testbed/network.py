"""The testbed's network: one bridge per slot on the controller, one namespace per machine.

The controller gets the slot's first address on the bridge; each machine's namespace holds one
end of a veth pair (``eth0``) whose other end is a port of the bridge. Machines get no default
route: they reach the controller and each other, and nothing else. No IPv6 addresses are
generated, so nothing but the traffic the tests make leaves the namespaces.
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

from testbed.config import Slot
from testbed.errors import TestbedError
from testbed.system import Runner

NETNS_DIR = Path("/run/netns")


def conflicts(
    slot: Slot, addrs: list[dict[str, object]], routes: list[dict[str, object]]
) -> list[str]:
    """Addresses and routes of the controller that overlap the slot's subnet (but are not ours)."""
    found: list[str] = []
    for link in addrs:
        ifname = str(link.get("ifname", "?"))
        if ifname == slot.bridge:
            continue
        infos = link.get("addr_info", [])
        for info in infos if isinstance(infos, list) else []:
            net = ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}", strict=False)
            if net.version == 4 and net.overlaps(slot.subnet):
                found.append(f"address {info['local']}/{info['prefixlen']} on {ifname}")
    for route in routes:
        dst, dev = str(route.get("dst", "")), str(route.get("dev", ""))
        if dst in ("", "default") or dev == slot.bridge:
            continue
        net = ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False)
        if net.version == 4 and net.overlaps(slot.subnet):
            found.append(f"route {dst} via {dev or route.get('gateway', '?')}")
    return found


def check_free(runner: Runner, slot: Slot) -> None:
    addrs = json.loads(runner.run(["ip", "-j", "-4", "addr", "show"]).stdout or "[]")
    routes = json.loads(runner.run(["ip", "-j", "-4", "route", "show"]).stdout or "[]")
    clash = conflicts(slot, addrs, routes)
    if clash:
        nxt = ipaddress.IPv4Address(int(slot.settings.net_base) + 256 * 16)
        raise TestbedError(
            f"the testbed's subnet {slot.subnet} (slot {slot.index}) is already in use on this "
            "machine",
            detail="\n".join(clash),
            fix=f"pick a free range: `CT200_TESTBED_NET={nxt} python -m testbed up`, "
            "or another slot with --slot",
        )


def link_exists(runner: Runner, name: str, netns: str | None = None) -> bool:
    ns = ["-n", netns] if netns else []
    return runner.run(["ip", *ns, "link", "show", "dev", name], check=False).returncode == 0


def namespaces(prefix: str) -> list[str]:
    """Named network namespaces whose name starts with ``prefix`` (ours, by naming)."""
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(prefix))


def create_bridge(runner: Runner, slot: Slot) -> None:
    if link_exists(runner, slot.bridge):
        raise TestbedError(
            f"network interface {slot.bridge} already exists",
            fix=f"it is a leftover of slot {slot.index}: "
            f"`python -m testbed down --slot {slot.index}`",
        )
    runner.run(["ip", "link", "add", slot.bridge, "type", "bridge"])
    runner.run(["ip", "link", "set", "dev", slot.bridge, "addrgenmode", "none"])
    runner.run(["ip", "addr", "add", f"{slot.gateway}/{slot.subnet.prefixlen}", "dev", slot.bridge])
    runner.run(["ip", "link", "set", "dev", slot.bridge, "up"])


def create_machine(runner: Runner, slot: Slot, name: str, address: ipaddress.IPv4Address) -> str:
    """A namespace with loopback up and ``eth0`` on the slot's bridge; returns its path."""
    ns, veth = slot.netns(name), slot.veth(name)
    runner.run(["ip", "netns", "add", ns])
    runner.run(["ip", "-n", ns, "link", "set", "dev", "lo", "up"])
    runner.run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
    runner.run(["ip", "link", "set", "dev", veth, "addrgenmode", "none"])
    runner.run(["ip", "link", "set", "dev", veth, "master", slot.bridge])
    runner.run(["ip", "link", "set", "dev", veth, "up"])
    runner.run(["ip", "-n", ns, "link", "set", "dev", "eth0", "addrgenmode", "none"])
    runner.run(["ip", "-n", ns, "addr", "add", f"{address}/{slot.subnet.prefixlen}", "dev", "eth0"])
    runner.run(["ip", "-n", ns, "link", "set", "dev", "eth0", "up"])
    return str(NETNS_DIR / ns)


def delete(runner: Runner, slot: Slot) -> list[str]:
    """Remove the slot's namespaces, veths and bridge; returns what was removed."""
    removed: list[str] = []
    for ns in namespaces(slot.prefix + "-"):
        runner.run(["ip", "netns", "delete", ns], check=False)
        removed.append(f"netns {ns}")
    # A veth whose namespace is gone is gone too; one left over from a half-made machine is not.
    links = json.loads(runner.run(["ip", "-j", "link", "show"]).stdout or "[]")
    for link in links:
        ifname = str(link.get("ifname", ""))
        if ifname.startswith(f"tb{slot.index}-"):
            runner.run(["ip", "link", "delete", "dev", ifname], check=False)
            removed.append(f"veth {ifname}")
    if link_exists(runner, slot.bridge):
        runner.run(["ip", "link", "delete", "dev", slot.bridge])
        removed.append(f"bridge {slot.bridge}")
    return removed
