"""Numerical comparisons shared by the tests."""

import numpy as np


def rel_error(got, want) -> float:
    """||got - want|| / ||want|| in float64 (a zero ``want`` counts as 1e-30)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


# norm-wise relative error two computations of one matmul may differ by, per result dtype
# (one rounding of the result each, summed in another order)
TOLERANCES = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def tolerance(dtype) -> float:
    """``TOLERANCES`` of ``dtype`` (a name, a NumPy or jnp dtype or type)."""
    return TOLERANCES[getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)]
