"""A file's identity, and the "racy" window in which a write could leave its ctime as it was."""

from __future__ import annotations

import time
from pathlib import Path

from ct200_tools.stage.identity import (
    COARSE_RACY_NS,
    FINE_RACY_NS,
    Identity,
    settled,
    stat_identity,
)

S = 1_000_000_000


def _at(ctime_ns: int) -> Identity:
    return Identity(1, 2, 3, ctime_ns, ctime_ns)


def test_a_file_changed_within_a_tick_is_racy_and_an_older_one_is_not() -> None:
    now = 1_700_000_000 * S + 123_456_789
    assert 0 < _at(now - 1_000_000).racy_for(now) <= FINE_RACY_NS
    assert _at(now - FINE_RACY_NS).racy_for(now) == 0
    assert _at(now + S).racy_for(now) == 0  # stamped in the future: any write differs from it
    # Whole-second timestamps mean a filesystem that keeps only seconds: a longer window.
    whole = 1_700_000_000 * S
    assert _at(whole).racy_for(whole + S // 2) > FINE_RACY_NS
    assert _at(whole).racy_for(whole + COARSE_RACY_NS) == 0


def test_settled_retakes_a_racy_identity_after_its_window(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"a")
    fresh = stat_identity(str(f))
    ids = settled([str(f)], [fresh])
    assert ids[0].racy_for(time.time_ns()) == 0
    assert ids[0].ino == fresh.ino and ids[0].size == 1
    # Not racy at all: returned as it was, without a stat.
    stale = Identity(0, 0, 0, 1, 1)
    assert settled([str(tmp_path / "gone")], [stale]) == [stale]
