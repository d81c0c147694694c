"""The one error type of the testbed: what went wrong, and what to do about it."""

from __future__ import annotations


class TestbedError(Exception):
    """A condition the testbed cannot work around; ``fix`` tells the user what to do."""

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, what: str, fix: str = "", detail: str = "") -> None:
        self.what = what
        self.fix = fix
        self.detail = detail
        super().__init__(what)

    def __str__(self) -> str:
        lines = [self.what]
        if self.detail:
            lines += ["  " + line for line in self.detail.rstrip().splitlines()]
        if self.fix:
            lines.append(f"  fix: {self.fix}")
        return "\n".join(lines)
