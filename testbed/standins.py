"""Stand-ins for what cannot exist on a testbed machine, each one named as such where it lives.

The ``pve`` machine is a plain Debian machine standing in for the Proxmox VE host:

* ``/etc/pve`` is a plain directory, not pmxcfs (the FUSE cluster filesystem); the container's
  config is a plain file ``/etc/pve/lxc/<vmid>.conf``. ``/etc/pve/.ct200-testbed-standin`` says so.
* ``/usr/local/sbin/pct`` is a STAND-IN for Proxmox's ``pct``: it records every call (one JSON
  line per call in ``/var/log/ct200-testbed/pct.log``) and emulates ``list``, ``status``,
  ``config``, ``set`` and ``start``/``stop``/``shutdown``/``reboot`` on a recorded state.
  It does not start anything: the ``ct`` machine stands in for the container.
* ``/usr/local/sbin/pveversion`` is a STAND-IN reporting a PVE 8.2 version.
* ``pve-guests.service`` is a STAND-IN for PVE's unit of the same name (which runs
  ``pvesh create /nodes/localhost/startall``): at boot it picks the containers with ``onboot: 1``
  in ``/etc/pve/lxc/*.conf`` in PVE's start order (``startup: order=N`` ascending, then the rest
  by vmid), marks them running for the ``pct`` stand-in, and writes the list to
  ``/run/ct200-testbed/pve-guests.json``. It cannot start a machine itself: the harness
  (``Harness.reboot``) reads that list once the ``pve`` machine has booted and powers on the ``ct``
  machine only when its vmid is in it. So a missing ``onboot: 1`` leaves the container down, as
  on a real host.

No NVIDIA hardware exists on any testbed machine.
"""

from __future__ import annotations

PCT_LOG = "/var/log/ct200-testbed/pct.log"

MACHINE_README = """\
This is a ct200-tools testbed machine: a throwaway Debian machine booted with systemd-nspawn by
`python -m testbed up`, reached over SSH by Ansible exactly like a real one.
Stand-ins (pve machine only): /etc/pve is a plain directory (not pmxcfs), /usr/local/sbin/pct
and /usr/local/sbin/pveversion are stand-ins that record their calls. See
testbed/standins.py.
"""

PVE_STANDIN_MARKER = """\
ct200-tools testbed STAND-IN: this /etc/pve is a plain directory, not pmxcfs.
"""

PCT = r'''#!/usr/bin/python3
"""pct -- ct200-tools testbed STAND-IN for Proxmox VE's pct (not the real tool).

Records every call as a JSON line in __LOG__ and emulates list, status, config, set and
start/stop/shutdown/reboot against /etc/pve/lxc/<vmid>.conf and a recorded state. It starts
nothing: on the testbed the `ct` machine stands in for the container.
"""
import json
import os
import re
import sys
import time

LOG = "__LOG__"
CONF_DIR = "/etc/pve/lxc"
STATE_DIR = "/var/lib/ct200-testbed/pct"
POWER = {"start": "running", "stop": "stopped", "shutdown": "stopped", "reboot": "running"}


def record(argv):
    os.makedirs(os.path.dirname(LOG), exist_ok=True)
    with open(LOG, "a") as fh:
        fh.write(json.dumps({"time": time.time(), "argv": argv}) + "\n")


def conf_path(vmid):
    path = os.path.join(CONF_DIR, f"{vmid}.conf")
    if not re.fullmatch(r"[0-9]+", vmid) or not os.path.isfile(path):
        sys.exit(f"Configuration file 'nodes/pve/lxc/{vmid}.conf' does not exist")
    return path


def state(vmid):
    try:
        with open(os.path.join(STATE_DIR, vmid)) as fh:
            return fh.read().strip()
    except FileNotFoundError:
        return "running"


def main_section(path):
    with open(path) as fh:
        lines = fh.read().splitlines()
    end = next((i for i, line in enumerate(lines) if line.startswith("[")), len(lines))
    return lines[:end], lines[end:]


def cmd_set(vmid, opts):
    path = conf_path(vmid)
    main, rest = main_section(path)
    while opts:
        key = opts.pop(0).lstrip("-")
        if not opts:
            sys.exit(f"400 not enough arguments: option '{key}' needs a value")
        value = opts.pop(0)
        line = f"{key}: {value}"
        idx = next((i for i, l in enumerate(main) if l.startswith(f"{key}:")), None)
        if idx is None:
            main.append(line)
        else:
            main[idx] = line
    with open(path + ".tmp", "w") as fh:
        fh.write("\n".join(main + rest) + "\n")
    os.replace(path + ".tmp", path)


def main(argv):
    record(argv)
    if not argv:
        sys.exit("ERROR: no command specified (testbed stand-in for pct)")
    cmd, args = argv[0], argv[1:]
    if cmd == "list":
        print(f"{'VMID':<10} {'Status':<10} {'Lock':<10} Name")
        for name in sorted(os.listdir(CONF_DIR)) if os.path.isdir(CONF_DIR) else []:
            if name.endswith(".conf"):
                vmid = name[:-5]
                print(f"{vmid:<10} {state(vmid):<10} {'':<10} ct")
        return 0
    if not args:
        sys.exit(f"400 not enough arguments: pct {cmd} <vmid>")
    vmid = args[0]
    if cmd == "status":
        conf_path(vmid)
        print(f"status: {state(vmid)}")
    elif cmd == "config":
        print("\n".join(l for l in main_section(conf_path(vmid))[0] if l.strip()))
    elif cmd == "set":
        cmd_set(vmid, list(args[1:]))
    elif cmd in POWER:
        conf_path(vmid)
        os.makedirs(STATE_DIR, exist_ok=True)
        with open(os.path.join(STATE_DIR, vmid), "w") as fh:
            fh.write(POWER[cmd] + "\n")
    else:
        sys.stderr.write(f"pct (ct200-tools testbed stand-in): '{cmd}' is not emulated\n")
        return 255
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
'''.replace("__LOG__", PCT_LOG)

PVEVERSION = r"""#!/bin/sh
# pveversion -- ct200-tools testbed STAND-IN for Proxmox VE's pveversion (not the real tool).
echo "pve-manager/8.2.4/faa83925c9641325 (running kernel: $(uname -r))"
"""


PVE_GUESTS_STATE = "/run/ct200-testbed/pve-guests.json"

PVE_GUESTS = r'''#!/usr/bin/python3
"""ct200-testbed-pve-guests -- ct200-tools testbed STAND-IN for PVE's pve-guests.service
(`pvesh create /nodes/localhost/startall`); not the real thing.

Picks the containers with `onboot: 1` in PVE's start order (startup order=N ascending, those
without an order after them, ties by vmid), marks them running for the pct stand-in, and writes
{"started": [vmid, ...], "skipped": {vmid: why}} to __STATE__. The testbed harness powers on
the container machine when its vmid is listed.
"""
import json
import os
import re
import time

CONF_DIR = "/etc/pve/lxc"
STATE = "__STATE__"
PCT_STATE = "/var/lib/ct200-testbed/pct"


def main_keys(path):
    keys = {}
    with open(path) as fh:
        for line in fh:
            if line.startswith("["):
                break
            m = re.match(r"^([a-z][a-z_]*\d*):\s*(.*?)\s*$", line)
            if m:
                keys[m.group(1)] = m.group(2)
    return keys


def order_of(startup):
    for part in startup.split(","):
        k, _, v = part.partition("=")
        if k.strip() == "order" and v.strip().isdigit():
            return int(v)
    return None


def main():
    guests, skipped = [], {}
    names = sorted(os.listdir(CONF_DIR)) if os.path.isdir(CONF_DIR) else []
    for name in names:
        if not re.fullmatch(r"[0-9]+[.]conf", name):
            continue
        vmid = int(name[:-5])
        keys = main_keys(os.path.join(CONF_DIR, name))
        if keys.get("onboot") != "1":
            skipped[vmid] = "onboot is not 1"
            continue
        if "lock" in keys:
            skipped[vmid] = "locked (" + keys["lock"] + ")"
            continue
        order = order_of(keys.get("startup", ""))
        guests.append((order is None, order or 0, vmid))
    started = [vmid for _, _, vmid in sorted(guests)]
    os.makedirs(PCT_STATE, exist_ok=True)
    for vmid in started:
        with open(os.path.join(PCT_STATE, str(vmid)), "w") as fh:
            fh.write("running\n")
    os.makedirs(os.path.dirname(STATE), exist_ok=True)
    with open(STATE + ".tmp", "w") as fh:
        json.dump({"time": time.time(), "started": started, "skipped": skipped}, fh)
    os.replace(STATE + ".tmp", STATE)
    for vmid in started:
        print(f"pve-guests (testbed stand-in): starting CT {vmid}")
    for vmid, why in skipped.items():
        print(f"pve-guests (testbed stand-in): not starting CT {vmid}: {why}")


if __name__ == "__main__":
    main()
'''.replace("__STATE__", PVE_GUESTS_STATE)

PVE_GUESTS_UNIT = """\
# ct200-tools testbed STAND-IN for Proxmox VE's pve-guests.service (testbed/standins.py): it
# lists the containers to start at boot; the testbed harness powers the container machine on.
[Unit]
Description=PVE guests (ct200-tools testbed STAND-IN)
After=network.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/ct200-testbed-pve-guests

[Install]
WantedBy=multi-user.target
"""


def lxc_conf(vmid: int) -> str:
    """A freshly created PVE 8 container's config, before any ct200 role touched it."""
    return (
        "arch: amd64\n"
        "cores: 8\n"
        "features: nesting=1\n"
        "hostname: ct\n"
        "memory: 65536\n"
        f"net0: name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:{vmid // 256 % 256:02X}:{vmid % 256:02X}"
        ",ip=dhcp,type=veth\n"
        "ostype: debian\n"
        f"rootfs: local-zfs:subvol-{vmid}-disk-0,size=64G\n"
        "swap: 0\n"
        "unprivileged: 0\n"
    )
