"""The Proxmox VE host's side: its container configs (pvecfg, shared with the Ansible
module) and its link of the boot chain (chain)."""
