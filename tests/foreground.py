"""Run a child as a terminal's foreground job takes Ctrl-C, whatever this process inherited.

A shell starts a background job with SIGINT ignored (no job control), a spawner may leave it
blocked, and a child inherits both across exec: Python then installs no KeyboardInterrupt
handler and a test's SIGINT does nothing. The tests of what Ctrl-C does state the terminal's
state themselves: SIGINT unblocked and at its default when the program under test starts.
"""

from __future__ import annotations

import sys

_RESET = (
    "import os, signal, sys; "
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
    "signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execvp(sys.argv[1], sys.argv[1:])"
)


def foreground(argv: list[str]) -> list[str]:
    """argv, started with SIGINT unblocked and at SIG_DFL (then exec'd: the same pid)."""
    return [sys.executable, "-c", _RESET, *argv]
