"""ct200-tools: provision, verify and recover a Proxmox GPU host and its inference container."""

__version__ = "0.1.0"
