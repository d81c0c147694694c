"""The unit's status line: what `systemctl status` shows as "Status:" (sd_notify STATUS=).

A start that fails hits the restart limit after a few tries, and `systemctl status` then shows
only systemd's own lines of the last try; the status line stays, so it carries the reason (the
model not staged, the program missing, what the readiness poll last got). The unit allows it with
NotifyAccess=exec; outside a unit (no NOTIFY_SOCKET) this does nothing.
"""

from __future__ import annotations

import os
import socket
from typing import Final

from ct200_tools.untrusted import show

#: systemd keeps the status text short in `systemctl status`; the journal has the rest.
MAX_CHARS: Final = 400


def status(text: str) -> bool:
    """Send STATUS=text to systemd; True when it was sent."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    # One line: a newline would start another sd_notify assignment (READY=1, MAINPID=...). The
    # callers escape what servers say (untrusted.show); any control character left is escaped
    # here too, the backslashes of our own text kept as they are.
    flat = " ".join(text.split())
    line = "".join(ch if ch.isprintable() else show(ch) for ch in flat)[:MAX_CHARS]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(f"STATUS={line}".encode())
    except OSError:
        return False  # the status line is a courtesy; the journal has the message
    return True
