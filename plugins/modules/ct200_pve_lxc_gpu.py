#!/usr/bin/python
"""Ansible module ct200_pve_lxc_gpu: NVIDIA device passthrough in a PVE container's config.

A thin wrapper: parsing, editing and the PVE-style locked write are ct200_tools/host/pvecfg.py,
shipped to the host as module_utils/ct200_pvecfg.py (ct200-tools is not installed there).
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.ct200_pvecfg import PveConfigError, Want, apply, as_pve_reads

DOCUMENTATION = r"""
module: ct200_pve_lxc_gpu
short_description: Pass NVIDIA device nodes into a Proxmox VE container (/etc/pve/lxc/<vmid>.conf)
description:
  - Makes the GPU passthrough lines of a PVE container config match the given device nodes, as
    PVE will start the container (its [pve:pending] changes applied first), and changes nothing
    else. [snapshot] sections, comments and every unrelated line stay byte for byte, and line
    ends stay as the file has them (CRLF too).
  - >-
    Around pending changes it edits like C(pct set): an index it writes leaves the pending
    C(delete:) list, and a pending devN for a node it passes is set in the main section (its
    options kept) instead of creating the node a second time at the next start. The diff shows
    the pending lines too (C(pending_removed), C(pending_added) in the result).
  - >-
    A devN entry it manages keeps the admin's C(uid) and C(gid) and gets I(mode) in PVE's form
    (C(0666), never C(666), which PVE refuses); an option PVE refuses there is refused by name.
  - >-
    C(devn) (PVE >= 8.1) writes one C(devN: <path>,mode=<mode>) entry per node; pve-container then
    allows each node's current major at every container start.
  - >-
    C(raw-lxc) (older PVE) writes C(lxc.cgroup2.devices.allow: c <major>:* rwm) for the majors the
    host has now, read from I(proc_devices) on every run, plus one C(lxc.mount.entry) per node.
  - Stale lines are replaced where they stand and never duplicated, e.g. an allow rule for an old
    (dynamic) nvidia-uvm major. Lines of the other mode for the same nodes are removed.
  - Writes the way PVE does (a temporary C(<file>.tmp.<pid>) in the same directory, renamed over
    the config, no chmod/chown, no backup file) while holding pve-container's config lock, an
    flock on C(/run/lock/lxc/pve-config-<vmid>.lock).
  - Refuses, changing nothing, a config whose main section has a C(lock:) key (backup, snapshot,
    migration in progress) or lines PVE cannot parse, a config that is a symbolic link or not a
    regular file, a missing config, unknown device paths, raw C(lxc.*) lines in [pve:pending]
    that would undo or double the passthrough, and in raw-lxc mode a host without nvidia-uvm in
    /proc/devices.
  - Does not restart the container; config changes take effect at its next start.
    The lxc_passthrough role runs C(pct reboot) when this module reports a change.
  - The device nodes need not exist (the ct200-host-devices boot unit creates them).
version_added: "0.1.0"
author: ct200-tools
options:
  path:
    description: The container's config, C(/etc/pve/lxc/<vmid>.conf).
    type: path
    required: true
  passthrough:
    description: How the nodes are passed.
    type: str
    choices: [devn, raw-lxc]
    default: devn
  devices:
    description:
      - Host device nodes, e.g. C(/dev/nvidia0) .. C(/dev/nvidia7), C(/dev/nvidiactl),
        C(/dev/nvidia-uvm), C(/dev/nvidia-uvm-tools), C(/dev/nvidia-caps/nvidia-cap1).
    type: list
    elements: str
    required: true
  proc_devices:
    description:
      - Where the host's device majors are read from (raw-lxc reads them on every run).
    type: path
    default: /proc/devices
  mode:
    description: Access mode of the devN entries (devn mode).
    type: str
    default: "0666"
  lock_timeout:
    description: Seconds to wait for the config lock another tool holds before failing.
    type: float
    default: 10
  onboot:
    description:
      - Sets C(onboot) (whether pve-guests.service starts the container at host boot), in the
        same locked write. Unset leaves the key as it is. Needs no container restart.
    type: bool
  startup:
    description:
      - Sets C(startup), the container's boot order and delays (C([order=]N[,up=N][,down=N])),
        in the same locked write. Unset leaves the key as it is. Needs no container restart.
    type: str
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
"""

EXAMPLES = r"""
- name: Pass GPUs 0-7 and the control and UVM nodes into container 200.
  ct200_pve_lxc_gpu:
    path: /etc/pve/lxc/200.conf
    devices: "{{ ['/dev/nvidiactl', '/dev/nvidia-uvm', '/dev/nvidia-uvm-tools']
                 + range(8) | map('regex_replace', '^', '/dev/nvidia') | list }}"
  register: gpu_conf

- name: The same on PVE older than 8.1.
  ct200_pve_lxc_gpu:
    path: /etc/pve/lxc/200.conf
    passthrough: raw-lxc
    devices: [/dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools]
"""

RETURN = r"""
vmid:
  description: The container's id, from the file name.
  returned: always
  type: int
lines:
  description: The managed passthrough lines after the run (in check mode, as they would be).
  returned: always
  type: list
  elements: str
config_lines:
  description: The same lines as C(pct config) prints them (PVE's separator and spacing).
  returned: always
  type: list
  elements: str
added:
  description: Lines written (new or replacing a stale one).
  returned: always
  type: list
  elements: str
removed:
  description: Lines taken out (stale, duplicate, or of the other passthrough mode).
  returned: always
  type: list
  elements: str
pending_removed:
  description: Lines of the [pve:pending] section taken out or rewritten (a pending devN for a
    managed node, now in the main section; a C(delete:) that named an index the module writes).
  returned: always
  type: list
  elements: str
pending_added:
  description: The C(delete:) line that replaces such a one (the keys it still deletes), if any.
  returned: always
  type: list
  elements: str
passthrough_changed:
  description: Whether the main section's passthrough lines changed (a running container needs
    a restart); boot keys or a pending-only edit (a shorter C(delete:)) alone need none.
  returned: always
  type: bool
majors:
  description: The majors the raw-lxc allow rules use, by /proc/devices name (empty for devn).
  returned: always
  type: dict
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "passthrough": {"type": "str", "choices": ["devn", "raw-lxc"], "default": "devn"},
            "devices": {"type": "list", "elements": "str", "required": True},
            "proc_devices": {"type": "path", "default": "/proc/devices"},
            "mode": {"type": "str", "default": "0666"},
            "lock_timeout": {"type": "float", "default": 10},
            "onboot": {"type": "bool"},
            "startup": {"type": "str"},
        },
        supports_check_mode=True,
    )
    p = module.params
    options = []
    if p["onboot"] is not None:
        options.append(("onboot", "1" if p["onboot"] else "0"))
    if p["startup"] is not None:
        options.append(("startup", p["startup"]))
    want = Want(tuple(p["devices"]), p["passthrough"], p["mode"], None, tuple(options))
    try:
        result = apply(
            p["path"],
            want,
            check=module.check_mode,
            proc_devices=p["proc_devices"],
            timeout=p["lock_timeout"],
        )
    except PveConfigError as exc:
        module.fail_json(msg=str(exc), changed=False)
    except OSError as exc:
        module.fail_json(msg=f"{exc.filename or p['path']}: {exc.strerror}", changed=False)
    edit = result.plan
    out = {
        "changed": edit.changed,
        "vmid": result.vmid,
        "lines": list(edit.managed),
        "config_lines": [as_pve_reads(t) for t in edit.managed],
        "added": list(edit.added),
        "removed": list(edit.removed),
        "pending_removed": list(edit.pending_removed),
        "pending_added": list(edit.pending_added),
        "passthrough_changed": edit.passthrough_changed,
        "majors": result.majors,
    }
    if module._diff:
        out["diff"] = {
            "before": edit.before,
            "after": edit.after,
            "before_header": p["path"],
            "after_header": p["path"],
        }
    module.exit_json(**out)


if __name__ == "__main__":
    main()
