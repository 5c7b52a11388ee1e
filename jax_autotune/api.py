"""The user-facing calls: ``matmul`` (jnp.matmul semantics), ``dot_general`` (a drop-in
for ``lax.dot_general``) and ``key_for`` (the tune key of a problem). The matmuls
canonicalise to (batch, m, k) x (batch, k, n) plus layout flags and bind the autotuned
primitive.

    >>> import jax, jax.numpy as jnp, jax_autotune as jat
    >>> x, w = jnp.ones((8, 32, 64)), jnp.ones((64, 16))
    >>> jax.jit(jat.matmul)(x, w).shape
    (8, 32, 16)
    >>> flax.linen.Dense(16, dot_general=jat.dot_general)          # a drop-in
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_autotune.config as config
from jax_autotune.key import Level, MatmulKey
from jax_autotune.problem import MatmulProblem, key_precision, lax_result, problem_for
from jax_autotune.primitive import bind_matmul

_LAX_DOT_GENERAL_PARAMS = set(inspect.signature(lax.dot_general).parameters)


def _problem(batch, m, n, k, lhs, rhs, out_dtype, transpose_a, transpose_b, precision):
    return MatmulProblem(batch=batch, m=m, n=n, k=k, lhs_dtype=lhs.dtype.name, rhs_dtype=rhs.dtype.name,
                         out_dtype=np.dtype(out_dtype).name, transpose_a=transpose_a,
                         transpose_b=transpose_b, precision=precision)


def _tuned(op: str, lhs, rhs, precision, preferred_element_type):
    """(key precision, result dtype) of a call the tuned matmul serves exactly as lax does;
    None where lax's own dot must run it: a ``lax.DotAlgorithm``, or operands of different
    dtypes other than two floats of 16 bits or more. Raises lax's error where lax rejects it.

    >>> _tuned("dot_general", jnp.ones((2, 2), "float16"), jnp.ones((2, 2), "bfloat16"), None, None)
    (<Precision.DEFAULT: 'DEFAULT'>, dtype(bfloat16))
    """
    result = lax_result(op, lhs, rhs, precision, preferred_element_type)
    level = key_precision(result.precision)
    if lhs.dtype != rhs.dtype:
        wide_floats = all(jnp.issubdtype(x.dtype, jnp.floating) and x.dtype.itemsize >= 2
                          for x in (lhs, rhs))
        # converted operands are strong, so a weak result needs lax's own dot too
        if not wide_floats or result.weak_type:
            return None
    return None if level is None else (level, result.dtype)


def matmul(a, b, *, precision=None, preferred_element_type=None):
    """``jnp.matmul(a, b)`` through the autotuner: 1-D promotion, batch broadcasting,
    result dtype and ``precision`` (levels, algorithm presets, the default matmul precision
    in force) as ``jnp.matmul`` has them; a ``lax.DotAlgorithm`` goes to ``jnp.matmul``.

    >>> jat.matmul(jnp.ones((3, 4)), jnp.ones(4)).shape
    (3,)
    """
    a, b = jnp.asarray(a), jnp.asarray(b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul: operands must be at least 1-D, got shapes {a.shape} and {b.shape}")
    tuned = _tuned("matmul", a, b, precision, preferred_element_type)
    if tuned is None:
        return jnp.matmul(a, b, precision=precision, preferred_element_type=preferred_element_type)
    precision_level, out_dtype = tuned
    vector_a, vector_b = a.ndim == 1, b.ndim == 1
    a2 = a[None, :] if vector_a else a
    b2 = b[:, None] if vector_b else b
    (m, k), (k_b, n) = a2.shape[-2:], b2.shape[-2:]
    if k != k_b:
        raise ValueError(f"matmul: contracting dims differ: a {a.shape} has {k}, b {b.shape} has {k_b}")
    try:
        batch_shape = tuple(np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]))
    except ValueError as err:
        raise ValueError(f"matmul: batch dims of a {a.shape} and b {b.shape} do not broadcast") from err
    batch = math.prod(batch_shape)
    if b2.ndim == 2 and batch > 1:
        # (..., m, k) @ (k, n): one (1, batch*m, k) problem, no copy of b
        lhs = a2.reshape(1, batch * m, k)
        problem = _problem(1, batch * m, n, k, lhs, b2, out_dtype, False, False, precision_level)
        out = bind_matmul(lhs, b2.reshape(1, k, n), problem)
    else:
        lhs = jnp.broadcast_to(a2, (*batch_shape, m, k)).reshape(batch, m, k)
        rhs = jnp.broadcast_to(b2, (*batch_shape, k, n)).reshape(batch, k, n)
        problem = _problem(batch, m, n, k, lhs, rhs, out_dtype, False, False, precision_level)
        out = bind_matmul(lhs, rhs, problem)
    out = out.reshape(*batch_shape, m, n)
    if vector_a:
        out = out[..., 0, :]
    if vector_b:
        out = out[..., 0]
    return out


def _check_dims(name: str, dims: Sequence[int], ndim: int, shape) -> tuple[int, ...]:
    dims = tuple(int(d) for d in dims)
    if any(not 0 <= d < ndim for d in dims) or len(set(dims)) != len(dims):
        raise ValueError(f"dot_general: {name} {dims} must be distinct dims of an operand of shape {shape}")
    return dims


def _canonical_operand(x, batch: tuple, free: tuple, contract: tuple, free_first: bool):
    """Reshape ``x`` to (B, F, C) (free_first) or (B, C, F); returns (array, transposed).

    Picks the stored order that needs no data movement when one exists: a transposed
    operand becomes a transposed-layout problem, not a materialised transpose.
    """
    natural = batch + free + contract if free_first else batch + contract + free
    swapped = batch + contract + free if free_first else batch + free + contract
    identity = tuple(range(x.ndim))
    transposed = natural != identity and swapped == identity
    order = swapped if transposed else natural
    size = lambda dims: math.prod(x.shape[d] for d in dims)  # noqa: E731
    first, second = (free, contract) if free_first != transposed else (contract, free)
    shape = (size(batch), size(first), size(second))
    if order != identity:
        x = jnp.transpose(x, order)
    return x.reshape(shape), transposed


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **kwargs):
    """A drop-in for ``lax.dot_general`` that goes through the autotuner.

    Accepts every keyword the installed ``lax.dot_general`` accepts (e.g. ``out_sharding``);
    extra keywords with non-default values are passed to ``lax.dot_general`` itself, and so
    are a ``lax.DotAlgorithm`` precision and operands of different dtypes other than two
    floats. The result dtype and the precision (a level, a ``lax.DotAlgorithmPreset`` or its
    name, or the ``jax.default_matmul_precision`` in force) follow lax's own rules.

    >>> jat.dot_general(x, w, (((2,), (0,)), ((), ()))).shape
    (8, 32, 16)
    >>> jat.dot_general(x, w, (((2,), (0,)), ((), ())), precision="F32_F32_F32").dtype
    dtype('float32')
    """
    unknown = set(kwargs) - _LAX_DOT_GENERAL_PARAMS
    if unknown:
        raise TypeError(f"dot_general() got unexpected keyword argument(s) {sorted(unknown)}; "
                        f"lax.dot_general accepts {sorted(_LAX_DOT_GENERAL_PARAMS)}")
    if any(value is not None for value in kwargs.values()):
        return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type, **kwargs)
    lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    try:
        (lc, rc), (lb, rb) = dimension_numbers
    except (TypeError, ValueError) as err:
        raise ValueError(f"dot_general: dimension_numbers must be ((lhs_contracting, rhs_contracting), "
                         f"(lhs_batch, rhs_batch)), got {dimension_numbers!r}") from err
    lc, lb = _check_dims("lhs dims", lc, lhs.ndim, lhs.shape), _check_dims("lhs batch", lb, lhs.ndim, lhs.shape)
    rc, rb = _check_dims("rhs dims", rc, rhs.ndim, rhs.shape), _check_dims("rhs batch", rb, rhs.ndim, rhs.shape)
    if len(lc) != len(rc) or any(lhs.shape[i] != rhs.shape[j] for i, j in zip(lc, rc)):
        raise ValueError(f"dot_general: contracting dims {lc} of lhs {lhs.shape} and {rc} of rhs "
                         f"{rhs.shape} must have equal sizes")
    if len(lb) != len(rb) or any(lhs.shape[i] != rhs.shape[j] for i, j in zip(lb, rb)):
        raise ValueError(f"dot_general: batch dims {lb} of lhs {lhs.shape} and {rb} of rhs "
                         f"{rhs.shape} must have equal sizes")
    if set(lc) & set(lb) or set(rc) & set(rb):
        raise ValueError(f"dot_general: a dim cannot be both batch and contracting: {dimension_numbers!r}")
    lfree = tuple(d for d in range(lhs.ndim) if d not in lc and d not in lb)
    rfree = tuple(d for d in range(rhs.ndim) if d not in rc and d not in rb)
    tuned = _tuned("dot_general", lhs, rhs, precision, preferred_element_type)
    if tuned is None:
        return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type)
    precision_level, out_dtype = tuned
    lhs3, transpose_a = _canonical_operand(lhs, lb, lfree, lc, free_first=True)
    rhs3, transpose_b = _canonical_operand(rhs, rb, rfree, rc, free_first=False)
    batch = lhs3.shape[0]
    m = math.prod(lhs.shape[d] for d in lfree)
    n = math.prod(rhs.shape[d] for d in rfree)
    k = math.prod(lhs.shape[d] for d in lc)
    problem = _problem(batch, m, n, k, lhs3, rhs3, out_dtype, transpose_a, transpose_b,
                       precision_level)
    out = bind_matmul(lhs3, rhs3, problem)
    out_shape = tuple(lhs.shape[d] for d in lb) + tuple(lhs.shape[d] for d in lfree) + \
        tuple(rhs.shape[d] for d in rfree)
    return out.reshape(out_shape)


def key_for(lhs: Any, rhs: Any, *, transpose_a: bool = False, transpose_b: bool = False,
            precision: Any = None, preferred_element_type: Any = None,
            level: Level | str | None = None) -> MatmulKey:
    """The tune key of ``lhs @ rhs``; operands are arrays or ShapeDtypeStructs as stored.

    A ``transpose_b=True`` rhs is stored (n, k); a ``transpose_a=True`` lhs is stored (k, m).
    ``level`` defaults to the configured one.

    >>> import jax, jax_autotune as jat
    >>> s = jax.ShapeDtypeStruct((768, 768), "float32")
    >>> jat.key_for(s, s).m
    1024
    """
    problem = problem_for(lhs, rhs, transpose_a=transpose_a, transpose_b=transpose_b,
                          precision=precision, preferred_element_type=preferred_element_type)
    return problem.key(config.get("level") if level is None else level)
