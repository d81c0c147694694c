"""Settings for every test directory: the hypothesis profiles.

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

from hypothesis import settings

settings.register_profile("default", deadline=None, print_blob=True)
settings.register_profile("ci", parent=settings.get_profile("default"), derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
