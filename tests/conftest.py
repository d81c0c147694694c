"""Settings for every test directory: the hypothesis profiles, and what the testbed needs.

Hypothesis fails an example that takes longer than its deadline (200 ms by default). On a busy
machine (CI, or two cores shared with other work) a parser test then fails for the load, not for
the code, so no profile here has a deadline. A test that must bound a duration says so itself.

    HYPOTHESIS_PROFILE=ci    the same examples on every run (derandomized), for a CI that must
                             not turn red on a new random example nobody can reproduce at once

Loaded here, before pytest imports any test module: ``@settings(max_examples=...)`` on a test
takes every setting it does not name from the profile loaded at import time.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from testbed.config import Settings
from testbed.harness import unmet

settings.register_profile("default", deadline=None, print_blob=True)
settings.register_profile("ci", parent=settings.get_profile("default"), derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(scope="session")
def testbed_requirements() -> None:
    """Skips a test that boots testbed machines where it cannot (not root, tools missing), with
    the reason; under CI (CI=true) fails it instead, so CI cannot skip those tests silently."""
    reason = unmet(Settings.from_env(), Path(sys.executable).parent)
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the testbed tests, but {reason}", pytrace=False)
    pytest.skip(reason)
