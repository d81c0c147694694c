"""The hypothesis profile of tests/conftest.py is in force for every test directory."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st


def test_profile_has_no_deadline() -> None:
    assert settings.default.deadline is None
    # What a test's own @settings(...) builds on: the profile, not hypothesis' defaults.
    assert settings(max_examples=5).deadline is None


@settings(max_examples=2)
@given(st.integers())
def test_slow_example_passes(n: int) -> None:
    """An example slower than hypothesis' default deadline (200 ms), as any example can be on a
    loaded machine, passes: it would fail with DeadlineExceeded under the default profile."""
    time.sleep(0.25)
