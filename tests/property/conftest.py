"""Property-based tests: generated configs, flags, traces and environments.

scripts/test runs them with a fixed seed (derandomized) and a bounded example count, so a run
is repeatable and takes seconds; `POOLCTL_FUZZ=deep scripts/test tests/property` explores
far more examples with a random seed.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=60, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "deep", deadline=None, max_examples=2000, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.function_scoped_fixture],
)
settings.load_profile("deep" if os.environ.get("POOLCTL_FUZZ") == "deep" else "ci")
