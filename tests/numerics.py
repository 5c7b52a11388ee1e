"""Numerical comparisons shared by the tests: random operands, the norm-wise relative error,
a tuned program's results against plain JAX's, and the tolerances by dtype, one table per
kind of comparison.

    >>> x = rand(0, 64, 48, dtype="bfloat16")
    >>> assert rel_error(kernel(x, w), x64 @ w64) < REFERENCE_TOLERANCES["bfloat16"]
    >>> assert_same_tree(jat.autotune(loss)(params, batch), loss(params, batch))
"""

import jax
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


# a tuned program against the same program plain: the largest |tuned - plain| relative to
# the largest |plain| of the leaf (or of the terms a final sum adds), by the narrowest float
# the computation goes through; what stays lax's (integer and empty dots, and every op
# after them) is "exact"
PROGRAM_TOLERANCES = {"float32": 2e-5, "float16": 1e-2, "bfloat16": 3e-2, "exact": 0.0}


def assert_matches(got, want, tolerance: float, what: str, scale: float = 0.0) -> None:
    """Same dtype and shape; values equal (tolerance 0) or within ``tolerance`` of the
    largest of ``|want|`` and ``scale`` (the size of the terms a sum cancelled)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, plain JAX gives {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, plain JAX gives {want.shape}"
    if tolerance == 0.0:
        np.testing.assert_array_equal(got, want, err_msg=f"{what}: not exactly plain JAX's")
        return
    g, w = got.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(w)
    np.testing.assert_array_equal(np.where(finite, 0.0, g), np.where(finite, 0.0, w),
                                  err_msg=f"{what}: non-finite entries differ from plain JAX's")
    assert np.isfinite(g[finite]).all(), f"{what}: non-finite entries where plain JAX's are finite"
    scale = max(float(np.max(np.abs(w[finite]), initial=0.0)), scale, 1e-30)
    error = float(np.max(np.abs(g - w)[finite], initial=0.0))
    assert error <= tolerance * scale, (
        f"{what}: max |tuned - plain| = {error:.3g}, {error / scale:.3g} of the scale {scale:.3g} "
        f"(max |plain| or the terms summed; tolerance {tolerance:g})")


def assert_same_tree(got, want) -> None:
    """Same tree, dtypes and shapes; each float leaf within ``PROGRAM_TOLERANCES`` of its
    dtype (8-bit floats: bfloat16's), integer and bool leaves exactly; PRNG keys by their bits."""
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for index, (g, w) in enumerate(zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want))):
        if jax.dtypes.issubdtype(jnp.result_type(g), jax.dtypes.extended):
            g, w = jax.random.key_data(g), jax.random.key_data(w)
        g, w = np.asarray(g), np.asarray(w)
        if w.dtype == jax.dtypes.float0:
            assert (g.dtype, g.shape) == (w.dtype, w.shape), f"leaf {index}"
            continue
        exact = w.dtype.kind in "iub"
        tolerance = 0.0 if exact else PROGRAM_TOLERANCES.get(w.dtype.name, PROGRAM_TOLERANCES["bfloat16"])
        assert_matches(g, w, tolerance, f"leaf {index}")
