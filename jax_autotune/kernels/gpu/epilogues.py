"""Which epilogues the fused GPU kernels take into the GEMM itself.

* cuBLASLt's epilogue (``cublaslt_form``): ``act(y + residual + bias)`` with a bias row, a
  full residual (added as cuBLASLt's C, beta 1) and ``relu`` or ``gelu`` (its tanh form,
  ``jax.nn.gelu``'s default), a residual without an activation. An epilogue is matched
  against templates captured from those very jax functions (``jax_autotune.context``), at
  the key's dtype, so it is taken exactly when the program computes the same thing.
* The Pallas Triton GEMM (``triton_takes``): any elementwise epilogue (operands of every
  role: scalars, rows, columns, full arrays), applied to each tile in f32 before its store.

    >>> cublaslt_form(Epilogue.parse("row:bfloat16|add(y,$0);relu(%0)"), "bfloat16")
    CublasLtForm(bias=0, residual=None, activation='relu')
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jax_autotune.context import dot_labels, regions
from jax_autotune.epilogue import ROLES, Epilogue


class CublasLtForm(NamedTuple):
    """Operand indices of an epilogue's bias and residual (None: absent), its activation."""

    bias: int | None
    residual: int | None
    activation: str


def triton_takes(epilogue: Epilogue) -> bool:
    """Whether the Pallas Triton GEMM applies ``epilogue`` in its tiles."""
    return (not epilogue.is_bare and epilogue.elementwise
            and all(o.role in ROLES for o in epilogue.operands))


def mosaic_takes(epilogue: Epilogue) -> bool:
    """Whether our Mosaic GPU GEMM applies ``epilogue`` in registers before its store
    (every operand role; a full operand's row alignment is checked on the problem)."""
    return not epilogue.is_bare and epilogue.elementwise


def cublaslt_form(epilogue: Epilogue, out_dtype: str) -> CublasLtForm | None:
    """How cuBLASLt's epilogue computes ``epilogue`` on an ``out_dtype`` product, or None."""
    if epilogue.is_bare or not epilogue.elementwise or any(o.dtype != out_dtype for o in epilogue.operands):
        return None
    return _templates(out_dtype).get(str(epilogue))


def taken_by_value(epilogue: Epilogue) -> bool:
    """Whether a fused kernel takes ``epilogue`` by the values of its literals (cuBLASLt's
    GELU, ``jax.nn.gelu``'s constants), at any float dtype: such an epilogue keeps them in
    its key (``jax_autotune.context.regions``' ``keeps_values``).

        >>> taken_by_value(Epilogue.parse("|mul(y,0.5:float32)"))
        False
    """
    floats = ("bfloat16", "float16", "float32") + ("float64",) * bool(jax.config.jax_enable_x64)
    return any(str(epilogue) in _templates(dtype) for dtype in floats)


_ACTIVATIONS: dict[str, Callable] = {"none": lambda x: x, "relu": jax.nn.relu,
                                     "gelu": functools.partial(jax.nn.gelu, approximate=True)}


@functools.lru_cache(maxsize=None)
def _templates(dtype: str) -> dict[str, CublasLtForm]:
    """canonical epilogue -> form, for every cuBLASLt epilogue on a ``dtype`` product."""
    found = {}
    for activation, act in _ACTIVATIONS.items():
        found[str(_captured(lambda y, b: act(y + b), dtype, "row"))] = CublasLtForm(0, None, activation)
        if activation != "none":
            found[str(_captured(act, dtype))] = CublasLtForm(None, None, activation)
    found[str(_captured(lambda y, r: y + r, dtype, "full"))] = CublasLtForm(None, 0, "none")
    found[str(_captured(lambda y, b, r: y + b + r, dtype, "row", "full"))] = CublasLtForm(0, 1, "none")
    found[str(_captured(lambda y, r, b: y + r + b, dtype, "full", "row"))] = CublasLtForm(1, 0, "none")
    return found


def _captured(fn, dtype: str, *roles: str) -> Epilogue:
    """The epilogue ``jax_autotune.context`` finds in ``fn(a @ b, *operands)``."""
    m, n, k = 8, 16, 4
    shapes = {"row": (n,), "full": (m, n)}
    args = [jax.ShapeDtypeStruct((m, k), dtype), jax.ShapeDtypeStruct((k, n), dtype),
            *(jax.ShapeDtypeStruct(shapes[r], dtype) for r in roles)]
    dims = (((1,), (0,)), ((), ()))
    closed = jax.make_jaxpr(lambda a, b, *ops: fn(lax.dot_general(a, b, dims, preferred_element_type=jnp.dtype(dtype)),
                                                  *ops))(*args)
    (head,) = [i for i, e in enumerate(closed.jaxpr.eqns) if e.primitive.name == "dot_general"]
    found = regions(closed.jaxpr, {head: dot_labels(dims, 2, 2)})
    return found[head].epilogue


__all__ = ["CublasLtForm", "cublaslt_form", "taken_by_value", "triton_takes", "mosaic_takes"]
