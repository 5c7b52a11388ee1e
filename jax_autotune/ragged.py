"""Grouped matmuls through the autotuner: ``ragged_dot``, a drop-in for ``lax.ragged_dot``,
and ``ragged_dot_general``, for ``lax.ragged_dot_general`` (what ``jat.autotune`` binds).

    >>> import jax, jax.numpy as jnp, jax_autotune as jat
    >>> x, w = jnp.ones((12, 64), "bfloat16"), jnp.ones((4, 64, 32), "bfloat16")
    >>> group_sizes = jnp.array([5, 0, 4, 2], jnp.int32)      # row 11 is in no group: zeros
    >>> jax.jit(jat.ragged_dot)(x, w, group_sizes).shape
    (12, 32)

Same signature, result dtype, errors and semantics as lax's (empty groups; rows past
``sum(group_sizes)`` are zero). Served by the grouped tuner (``registry.ragged_tuner_for``):
a ragged m (lhs (m, k), rhs (groups, k, n) or (groups, n, k): the forward and the input
gradient) and a ragged k (2-D operands, the contracted rows split into groups: the weight
gradient), in integer and float dtypes with lhs and rhs of one dtype. Everything else is
lax's own op, unchanged: a ``group_offset`` (lax implements none), an ``out_sharding`` or
Explicit-mesh operands, batch dims, a ragged batch dim, group sizes of more than one dim,
operands of different dtypes, an algorithm preset, empty or symbolic sizes.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import numpy as np
from jax import lax

from jax_autotune.api import LEFT_PLAIN, _explicitly_sharded, _left_plain, _tuned
from jax_autotune.dtypes import is_floating, is_integer
from jax_autotune.epilogue import Epilogue
from jax_autotune.problem import MatmulProblem
from jax_autotune.ragged_primitive import bind_ragged, bind_ragged_fused

# lax.ragged_dot's dims: lhs (m, k) ragged in m, rhs (groups, k, n)
RAGGED_DOT_DIMENSION_NUMBERS = lax.RaggedDotDimensionNumbers((((1,), (1,)), ((), ())), [0], [0])


def ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None, group_offset=None,
               out_sharding=None):
    """``lax.ragged_dot`` through the autotuner: lhs (m, k), rhs (groups, k, n), group
    sizes (groups,) of an integer dtype -> (m, n); group g takes the next
    ``group_sizes[g]`` rows, rows past their sum are zero.

    >>> jat.ragged_dot(x, w, jnp.array([5, 0, 4, 2])).dtype
    dtype(bfloat16)
    """
    return _ragged_dot_general("ragged_dot", lhs, rhs, group_sizes, RAGGED_DOT_DIMENSION_NUMBERS,
                               precision, preferred_element_type, group_offset, out_sharding)


def ragged_dot_general(lhs, rhs, group_sizes, ragged_dot_dimension_numbers, precision=None,
                       preferred_element_type=None, group_offset=None, out_sharding=None):
    """``lax.ragged_dot_general`` through the autotuner where the grouped tuner serves the
    dims (see the module docstring), else lax's own.

    >>> dims = lax.RaggedDotDimensionNumbers((((0,), (0,)), ((), ())), [0], [])   # a weight gradient
    >>> jat.ragged_dot_general(x, dy, group_sizes, dims).shape                    # (groups, k, n)
    """
    return _ragged_dot_general("ragged_dot_general", lhs, rhs, group_sizes, ragged_dot_dimension_numbers,
                               precision, preferred_element_type, group_offset, out_sharding)


def _ragged_dot_general(name, lhs, rhs, group_sizes, dims, precision, preferred_element_type,
                        group_offset, out_sharding):
    for argument, x in (("lhs", lhs), ("rhs", rhs), ("group_sizes", group_sizes)):
        _check_array(name, argument, x)

    def plain():
        return lax.ragged_dot_general(lhs, rhs, group_sizes, dims, precision=precision,
                                      preferred_element_type=preferred_element_type,
                                      group_offset=group_offset, out_sharding=out_sharding)

    if group_offset is not None or out_sharding is not None or _explicitly_sharded(lhs, rhs, group_sizes):
        return plain()
    if not isinstance(dims, lax.RaggedDotDimensionNumbers):
        raise TypeError(f"{name}: ragged_dot_dimension_numbers must be a lax.RaggedDotDimensionNumbers, "
                        f"got {type(dims).__name__} {dims!r}")
    try:  # lax's own checks and errors, and its result type
        out = _lax_result(*(_spec(x) for x in (lhs, rhs, group_sizes)), dims, _hashable(precision),
                          preferred_element_type)
    except (TypeError, ValueError) as err:
        raise type(err)(f"{name}: {err}") from None
    problem = _grouped_problem(lhs, rhs, group_sizes, dims, precision, preferred_element_type, out)
    if problem is None or _left_plain(problem, None):  # left plain: a program check found it costs
        return plain()
    return bind_ragged(jax.numpy.asarray(lhs), jax.numpy.asarray(rhs), jax.numpy.asarray(group_sizes), problem)


def ragged_dot_in_context(lhs, rhs, group_sizes, dims, precision, preferred_element_type,
                          epilogue: Epilogue, operands: Callable[[int, int], list]):
    """``epilogue`` applied to the (m, n) result of ``lax.ragged_dot_general(lhs, rhs,
    group_sizes, dims, ...)``, bound as one tuned op; None where the grouped tuner does not
    serve the call as a ragged m (lax's own op must run it), and ``LEFT_PLAIN`` where its
    key is left plain (``api.leaving_plain``). ``operands(m, n)`` gives the
    epilogue's operands in their role shapes on a batch of 1 (col (1, m), full (1, m, n)).

        >>> up = ragged_dot_in_context(x, w_up, sizes, RAGGED_DOT_DIMENSION_NUMBERS, None, None,
        ...                            Epilogue.parse("full:bfloat16|logistic(y);mul(y,%0);mul(%1,$0)"),
        ...                            lambda m, n: [gate])
    """
    if _explicitly_sharded(lhs, rhs, group_sizes):
        return None
    out = _lax_result(*(_spec(x) for x in (lhs, rhs, group_sizes)), dims, _hashable(precision),
                      preferred_element_type)
    problem = _grouped_problem(lhs, rhs, group_sizes, dims, precision, preferred_element_type, out)
    if problem is None or problem.ragged != "m" or not epilogue.elementwise:
        return None
    if _left_plain(problem, epilogue):
        return LEFT_PLAIN
    problem = dataclasses.replace(problem, epilogue=epilogue)
    values = [jax.numpy.reshape(x, shape) for x, shape in zip(operands(problem.m, problem.n),
                                                                problem.epilogue_operand_shapes())]
    return bind_ragged_fused(jax.numpy.asarray(lhs), jax.numpy.asarray(rhs), jax.numpy.asarray(group_sizes),
                             values, problem)


def _check_array(name: str, argument: str, x) -> None:
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        raise TypeError(f"{name}: {argument} must be an array, got {type(x).__name__}")


def _spec(x) -> tuple:
    aval = jax.typeof(x) if isinstance(x, (jax.Array, jax.core.Tracer)) else x
    return tuple(x.shape), np.dtype(x.dtype), bool(getattr(aval, "weak_type", False))


def _hashable(precision):
    return tuple(precision) if isinstance(precision, list) else precision


def _lax_result(lhs, rhs, group_sizes, dims, precision, preferred_element_type):
    args = (lhs, rhs, group_sizes, dims, precision, preferred_element_type,
            (jax.config.jax_default_matmul_precision, jax.config.jax_enable_x64))
    try:
        hash(args)
    except TypeError:
        return _traced_lax_result.__wrapped__(*args)
    return _traced_lax_result(*args)


@functools.lru_cache(maxsize=512)
def _traced_lax_result(lhs, rhs, group_sizes, dims, precision, preferred_element_type, settings):
    specs = [jax.ShapeDtypeStruct(shape, dtype, weak_type=weak) for shape, dtype, weak in (lhs, rhs, group_sizes)]
    return jax.eval_shape(functools.partial(lax.ragged_dot_general, ragged_dot_dimension_numbers=dims,
                                            precision=precision, preferred_element_type=preferred_element_type),
                          *specs)


def _served_dtype(dtype) -> bool:
    return (is_floating(dtype) and np.dtype(dtype).itemsize >= 2) or (is_integer(dtype) and dtype != np.bool_)


def _grouped_problem(lhs, rhs, group_sizes, dims, precision, preferred_element_type, out) -> MatmulProblem | None:
    """The grouped problem of a call the tuner serves (see the module docstring), else None."""
    (lc, rc), (lb, rb) = dims.dot_dimension_numbers
    ragged, group = tuple(dims.lhs_ragged_dimensions), tuple(dims.rhs_group_dimensions)
    shapes = (tuple(lhs.shape), tuple(rhs.shape), tuple(group_sizes.shape))
    if (lb or rb or len(lc) != 1 or len(rc) != 1 or len(ragged) != 1 or len(shapes[0]) != 2
            or len(shapes[2]) != 1 or lhs.dtype != rhs.dtype or not _served_dtype(lhs.dtype)
            or getattr(out, "weak_type", False)
            or not all(isinstance(d, int) and d > 0 for shape in shapes for d in shape)):
        return None
    tuned = _tuned("dot_general", lhs, rhs, precision, preferred_element_type)
    if tuned is None or tuned[0].algorithm is not None:  # a preset: only lax's honours it
        return None
    level = tuned[0]
    (lc,), (rc,), (r,) = lc, rc, ragged
    (lhs_shape, rhs_shape, (groups,)) = shapes
    if r == 0 and lc == 1 and len(rhs_shape) == 3 and group == (0,) and rc in (1, 2):  # ragged m
        m, k = lhs_shape
        n, transpose_a, transpose_b, mode = rhs_shape[3 - rc], False, rc == 2, "m"
    elif r == lc and len(rhs_shape) == 2 and group == ():  # ragged k
        m, k = lhs_shape[1 - lc], lhs_shape[lc]
        n, transpose_a, transpose_b, mode = rhs_shape[1 - rc], lc == 0, rc == 1, "k"
    else:
        return None
    return MatmulProblem(batch=1, m=m, n=n, k=k, lhs_dtype=lhs.dtype.name, rhs_dtype=rhs.dtype.name,
                         out_dtype=np.dtype(out.dtype).name, transpose_a=transpose_a, transpose_b=transpose_b,
                         precision=level, groups=groups, ragged=mode)


__all__ = ["ragged_dot", "ragged_dot_general", "RAGGED_DOT_DIMENSION_NUMBERS"]
