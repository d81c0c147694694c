"""The local testbed: throwaway systemd machines that the playbooks reach over SSH.

A Debian rootfs is built once with debootstrap and cached. Each machine boots it with
``systemd-nspawn --boot`` on its own overlay, in its own network namespace, with sshd and its own
host keys. The controller reaches the machines over a bridge that only the testbed uses, with a
generated key and a known_hosts file written here (host-key checking stays on), and Ansible gets
an inventory written here. Only what cannot exist on such a machine is stood in for (see
``standins.py``: pmxcfs and ``pct`` on the ``pve`` machine).

Entry point: ``python -m testbed up|down|status|ssh NAME``.
"""
