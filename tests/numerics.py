"""Numerical comparisons shared by the tests."""

import numpy as np


def rel_error(got, want) -> float:
    """||got - want|| / ||want|| in float64 (a zero ``want`` counts as 1e-30)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
