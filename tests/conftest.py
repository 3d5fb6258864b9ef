"""Shared test settings."""

from hypothesis import HealthCheck, settings

# CI runs on 2 cores; keep property tests thorough but bounded.
settings.register_profile(
    "ci", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=60, deadline=None)
settings.load_profile("ci")
