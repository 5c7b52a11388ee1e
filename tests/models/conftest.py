"""The model suite tunes every key it meets, briefly, into a store of its own per test."""

import pytest

from jax_autotune import config

BUDGET_SECONDS = 0.05  # per key: enough for the CPU candidates to be timed a few times


@pytest.fixture(autouse=True)
def quick_tuning(fresh_tuning):
    """An empty tune store (tests/conftest.py's ``fresh_tuning``) and a small tuning budget
    per key; the configuration is restored after the test."""
    config.update("budget_seconds", BUDGET_SECONDS)
    yield fresh_tuning
    config.update("budget_seconds", None)
