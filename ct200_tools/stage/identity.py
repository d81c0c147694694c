"""Did a source file change while we read it? Its identity before the first read and after the last.

The identity is what stat tells without reading: device, inode, size, mtime and ctime. Any write
moves ctime (user space cannot set it), a replacement by rename changes the inode, so an unchanged
identity after the last read means the bytes read are one version of the file.

One gap: a filesystem stamps times at a granularity (a kernel tick, or a whole second on some), so a
write within the same tick as the file's last change leaves ctime as it was. A file changed that
recently is "racy" (git's word for the same problem); we wait until its tick is over before taking
the identity that the reads are compared against, so any later write shows.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

#: Longer than any kernel tick (HZ >= 100: 10 ms), for filesystems with nanosecond timestamps.
FINE_RACY_NS = 50_000_000
#: For filesystems that store whole seconds (ext4 with 128-byte inodes, FAT, some FUSE).
COARSE_RACY_NS = 1_100_000_000


@dataclass(frozen=True)
class Identity:
    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> Identity:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def racy_for(self, now_ns: int) -> int:
        """Nanoseconds to wait before a write could no longer keep this ctime (0: none)."""
        coarse = self.ctime_ns % 1_000_000_000 == 0 and self.mtime_ns % 1_000_000_000 == 0
        window = COARSE_RACY_NS if coarse else FINE_RACY_NS
        age = now_ns - self.ctime_ns
        # A ctime in the future (clock stepped back) is never stamped again: any write differs.
        return window - age if 0 <= age < window else 0


def stat_identity(path: str) -> Identity:
    return Identity.of(os.stat(path))


def settled(paths: list[str], identities: list[Identity], rounds: int = 5) -> list[Identity]:
    """The identities, those that were racy re-taken once their window is over."""
    out = list(identities)
    for _ in range(rounds):
        now = time.time_ns()
        racy = [k for k, i in enumerate(out) if i.racy_for(now)]
        if not racy:
            break
        time.sleep(max(out[k].racy_for(now) for k in racy) / 1e9)
        for k in racy:  # changed again meanwhile: racy again, and the next round waits again
            out[k] = stat_identity(paths[k])
    return out
