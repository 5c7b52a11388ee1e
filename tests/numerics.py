"""Numerical comparisons shared by the tests: random operands, the norm-wise relative error,
and the tolerances by dtype, one table per kind of comparison.

    >>> x = rand(0, 64, 48, dtype="bfloat16")
    >>> assert rel_error(kernel(x, w), x64 @ w64) < REFERENCE_TOLERANCES["bfloat16"]
"""

import jax.numpy as jnp
import numpy as np


def rand(seed, *shape, dtype="float32", scale=1.0):
    """Standard normal values times ``scale`` from their own ``seed`` (fresh, never zeros), as ``dtype``."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape) * scale, dtype)


def rand_stream(seed):
    """``rand(shape, dtype="float32")`` drawing from one generator: fresh values each call."""
    rng = np.random.default_rng(seed)

    def rand_from_stream(shape, dtype="float32"):
        return jnp.asarray(rng.standard_normal(shape), dtype)
    return rand_from_stream


def rel_error(got, want) -> float:
    """||got - want|| / ||want|| in float64 (a zero ``want`` counts as 1e-30); the shapes must
    be equal (a broadcast would hide a wrong shape)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"shapes differ: {got.shape} and {want.shape}"
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


# norm-wise relative error two computations of one matmul may differ by, per result dtype
# (one rounding of the result each, summed in another order)
TOLERANCES = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


# one product computed in the dtype (inputs and result) against a float64 reference
REFERENCE_TOLERANCES = {"float64": 1e-12, "float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}

# our GPU kernels against a float64 reference, per output dtype: f32 inputs run TF32 wgmma,
# half inputs accumulate in f32 over tiles in another order than XLA's
KERNEL_TOLERANCES = {"bfloat16": 2e-2, "float16": 4e-3, "float32": 4e-3}


def tolerance(dtype) -> float:
    """``TOLERANCES`` of ``dtype`` (a name, a NumPy or jnp dtype or type)."""
    return TOLERANCES[getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)]
