"""Which dtypes are floating, integer or differentiable: one answer for the whole package.

NumPy's type hierarchy does not know ml_dtypes' narrow floats (``np.issubdtype(bfloat16,
np.inexact)`` is False, and so for float16-likes and float8s), nor JAX's extended dtypes
(typed PRNG keys, which ``np.dtype`` cannot even read). JAX's hierarchy knows both, so
every module asks here instead of asking NumPy.

    >>> is_floating("bfloat16"), is_differentiable("float8_e4m3fn"), is_integer("uint8")
    (True, True, True)
    >>> is_differentiable(jax.random.key(0).dtype), is_differentiable("int32")
    (False, False)

JAX is imported on the first question, not with this module (the command line's parser
imports the key, and the key this module, without starting JAX).
"""

from __future__ import annotations

import functools

import numpy as np


@functools.lru_cache(maxsize=None)
def _jax_dtypes():
    import jax.dtypes
    return jax.dtypes


def _is(dtype, kind) -> bool:
    try:
        return bool(_jax_dtypes().issubdtype(dtype, kind))
    except TypeError:  # not a dtype at all
        return False


def is_extended(dtype) -> bool:
    """A JAX extended dtype (a typed PRNG key): no NumPy dtype, no arithmetic."""
    return _is(dtype, _jax_dtypes().extended)


def is_floating(dtype) -> bool:
    """A real float of any width: float64 to float8 and bfloat16."""
    return not is_extended(dtype) and _is(dtype, np.floating)


def is_complex(dtype) -> bool:
    return not is_extended(dtype) and _is(dtype, np.complexfloating)


def is_integer(dtype) -> bool:
    """A signed or unsigned integer (not bool)."""
    return not is_extended(dtype) and _is(dtype, np.integer)


def is_differentiable(dtype) -> bool:
    """Whether JAX gives a leaf of this dtype a cotangent of its own dtype (floats and
    complex numbers); every other leaf (integers, bools, keys) gets a ``float0`` one."""
    return is_floating(dtype) or is_complex(dtype)


def zero_cotangent(aval):
    """The cotangent JAX gives a leaf of ``aval`` that nothing differentiates: zeros of its
    dtype, or ``float0`` zeros of its shape where it is not differentiable."""
    if is_differentiable(aval.dtype):
        import jax.numpy as jnp
        return jnp.zeros(aval.shape, aval.dtype)
    return np.zeros(aval.shape, _jax_dtypes().float0)


__all__ = ["is_extended", "is_floating", "is_complex", "is_integer", "is_differentiable",
           "zero_cotangent"]
