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

import contextlib
import contextvars
import dataclasses
import inspect
import math
import operator
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_autotune.config as config
from jax_autotune.dtypes import is_floating
from jax_autotune.key import Level, MatmulKey
from jax_autotune.problem import MatmulProblem, key_precision, lax_result, matmul_dims, problem_for
from jax_autotune.epilogue import Epilogue
from jax_autotune.primitive import bind_fused, bind_matmul
from jax_autotune.sharding import ShardingTypeError, explicit_sharding

_LAX_DOT_GENERAL_PARAMS = set(inspect.signature(lax.dot_general).parameters)


def _problem(batch, m, n, k, lhs, rhs, out_dtype, transpose_a, transpose_b, precision,
             lhs_copied=False, rhs_copied=False):
    return MatmulProblem(batch=batch, m=m, n=n, k=k, lhs_dtype=lhs.dtype.name, rhs_dtype=rhs.dtype.name,
                         out_dtype=np.dtype(out_dtype).name, transpose_a=transpose_a,
                         transpose_b=transpose_b, precision=precision, lhs_copied=lhs_copied,
                         rhs_copied=rhs_copied)


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
        wide_floats = all(is_floating(x.dtype) and x.dtype.itemsize >= 2
                          for x in (lhs, rhs))
        # converted operands are strong, so a weak result needs lax's own dot too
        if not wide_floats or result.weak_type:
            return None
    return None if level is None else (level, result.dtype)


def matmul(a, b, *, precision=None, preferred_element_type=None, out_sharding=None):
    """``jnp.matmul(a, b)`` through the autotuner: 1-D promotion, batch broadcasting,
    result dtype and ``precision`` (levels, algorithm presets, the default matmul precision
    in force) as ``jnp.matmul`` has them; a ``lax.DotAlgorithm`` goes to ``jnp.matmul``;
    ``out_sharding`` as jnp.matmul takes it (Explicit mesh axes). A zero-size operand gives
    what jnp gives (an empty array, or zeros when k is 0).

    >>> jat.matmul(jnp.ones((3, 4)), jnp.ones(4)).shape
    (3,)
    """
    if out_sharding is not None or _explicitly_sharded(a, b):
        return _sharded(lambda: _matmul(a, b, precision, preferred_element_type, out_sharding),
                        lambda: jnp.matmul(a, b, precision=precision,
                                           preferred_element_type=preferred_element_type,
                                           out_sharding=out_sharding))
    return _matmul(a, b, precision, preferred_element_type, None)


def _matmul(a, b, precision, preferred_element_type, out_sharding):
    a, b = jnp.asarray(a), jnp.asarray(b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul: operands must be at least 1-D, got shapes {a.shape} and {b.shape}")
    tuned = _tuned("matmul", a, b, precision, preferred_element_type)
    if tuned is None:
        return jnp.matmul(a, b, precision=precision, preferred_element_type=preferred_element_type,
                          out_sharding=out_sharding)
    vector_a, vector_b = a.ndim == 1, b.ndim == 1
    a2 = a[None, :] if vector_a else a
    b2 = b[:, None] if vector_b else b
    batch_shape, m, n, k = matmul_dims(a2.shape, b2.shape, caller="matmul", shown=(a.shape, b.shape))
    batch = math.prod(batch_shape)
    final_shape = (*batch_shape, m, n)
    if vector_a or vector_b:
        final_shape = (*batch_shape, *([m] if not vector_a else []), *([n] if not vector_b else []))
    if b2.ndim == 2 and batch > 1:
        # (..., m, k) @ (k, n): one (1, batch*m, k) problem, no copy of b
        lhs, rhs, nb = a2, b2, 0
        lfree = tuple(range(a2.ndim - 1))
    else:
        nb = len(batch_shape)
        lhs, rhs = jnp.broadcast_to(a2, (*batch_shape, m, k)), jnp.broadcast_to(b2, (*batch_shape, k, n))
        lfree = (nb,)
    dims = ((tuple(range(nb)), lfree, (lhs.ndim - 1,)), (tuple(range(nb)), (nb + 1,), (nb,)))
    return _bound(lhs, rhs, dims, tuned, final_shape, out_sharding,
                  plain=lambda: jnp.matmul(a, b, precision=precision,
                                           preferred_element_type=preferred_element_type,
                                           out_sharding=out_sharding))


def _explicitly_sharded(*operands) -> bool:
    """Whether an operand's type carries a sharding over Explicit mesh axes."""
    for x in operands:
        sharding = explicit_sharding(jax.typeof(x)) if hasattr(x, "shape") else None
        if sharding is not None and any(entry is not None for entry in sharding.spec):
            return True
    return False


def _sharded(tuned, plain):
    """``tuned()``, or lax's own ``plain()`` where the canonical (batch, m, k) reshapes
    cannot carry the operands' Explicit shardings (jax's reshape rules decide)."""
    try:
        return tuned()
    except ShardingTypeError:
        return plain()


def _canonical_sharding(out_sharding, final_shape, canonical_shape):
    """The user's out_sharding (over the result's dims) as the canonical (batch, m, n)
    output's, by jax's own reshape rule; None when none was given."""
    if out_sharding is None:
        return None
    final = jax.ShapeDtypeStruct(final_shape, jnp.float32, sharding=out_sharding)
    return jax.eval_shape(lambda x: _reshape(x, canonical_shape, None), final).sharding


def _reshape(x, shape, out_sharding=None):
    """``x`` reshaped; without an out_sharding, a leading unit batch axis is added or
    dropped as its own step, which jax's reshape rules follow under Explicit axes."""
    shape = tuple(shape)
    if tuple(x.shape) == shape:
        return x
    if out_sharding is None and len(shape) == 3 and shape[0] == 1 and x.shape[:1] != (1,):
        return lax.expand_dims(_reshape(x, shape[1:]), (0,))
    if out_sharding is None and x.ndim == 3 and x.shape[0] == 1 and shape[:1] != (1,):
        return _reshape(lax.squeeze(x, (0,)), shape)
    return jnp.reshape(x, shape, out_sharding=out_sharding)


def _check_dims(name: str, dims: Sequence[int], ndim: int, shape) -> tuple[int, ...]:
    try:  # integers only, as lax: 2.5 or '2' is a TypeError, never truncated or converted
        dims = tuple(operator.index(d) for d in dims)
    except TypeError as err:
        raise TypeError(f"dot_general: {name} must be integers, got {tuple(dims)!r}: {err}") from None
    if any(not 0 <= d < ndim for d in dims) or len(set(dims)) != len(dims):
        raise TypeError(f"dot_general: {name} {dims} must be distinct dims of an operand of shape {shape}")
    return dims


def _canonical_layout(shape, batch: tuple, free: tuple, contract: tuple, free_first: bool):
    """(dim order, transposed, 3-D shape) of an operand of ``shape`` canonicalised to
    (B, F, C) (free_first) or (B, C, F).

    Picks the stored order that needs no data movement when one exists: a transposed
    operand becomes a transposed-layout problem, not a materialised transpose. Where both
    move data (the batch dims are not outermost), the one that keeps the minor dim in place
    (a copy of whole rows).
    """
    natural = batch + free + contract if free_first else batch + contract + free
    swapped = batch + contract + free if free_first else batch + free + contract
    identity = tuple(range(len(shape)))
    minor = len(shape) - 1
    transposed = natural != identity and (swapped == identity or (swapped[-1:] == (minor,) != natural[-1:]))
    order = swapped if transposed else natural
    size = lambda dims: math.prod(shape[d] for d in dims)  # noqa: E731
    first, second = (free, contract) if free_first != transposed else (contract, free)
    return order, transposed, (size(batch), size(first), size(second))


def _copies(shape, order: tuple) -> bool:
    """Whether putting an operand of ``shape`` in ``order`` moves data: a transpose of more
    than one non-unit dim (a reshape of the result is then free)."""
    moved = [d for d in order if shape[d] != 1]
    return moved != sorted(moved)


def _canonical_operand(x, order: tuple, shape: tuple):
    """``x`` put in ``order`` (where it is not x's own) and reshaped to its canonical 3-D
    ``shape``, both from ``_canonical_layout``."""
    if order != tuple(range(x.ndim)):
        x = jnp.transpose(x, order)
    return _reshape(x, shape)


LEFT_PLAIN = object()  # what dot_general_in_context returns for a key left plain
_LEFT_PLAIN: contextvars.ContextVar[frozenset] = contextvars.ContextVar("left_plain", default=frozenset())


@contextlib.contextmanager
def leaving_plain(keys: frozenset):
    """Within it, ``dot_general`` and ``dot_general_in_context`` leave a call whose key is in
    ``keys`` to lax (untuned, as the program had it): a program's decisions that cost it
    (``jax_autotune.program_check``).

        >>> with leaving_plain(frozenset({key})):
        ...     jax.make_jaxpr(jat.autotune(f))(x)
    """
    token = _LEFT_PLAIN.set(frozenset(keys))
    try:
        yield
    finally:
        _LEFT_PLAIN.reset(token)


def left_plain_keys() -> frozenset:
    """The keys ``leaving_plain`` holds now (matmul keys, and attention keys left as written)."""
    return _LEFT_PLAIN.get()


def _left_plain(problem: MatmulProblem, epilogue: Epilogue | None) -> bool:
    keys = _LEFT_PLAIN.get()
    if not keys:
        return False
    if epilogue is not None and not epilogue.is_bare:
        problem = dataclasses.replace(problem, epilogue=epilogue)
    return problem.key(config.compile_policy().level) in keys


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **kwargs):
    """A drop-in for ``lax.dot_general`` that goes through the autotuner.

    Accepts every keyword the installed ``lax.dot_general`` accepts (``out_sharding`` as lax
    takes it, under Explicit mesh axes); other keywords with non-default values are passed
    to ``lax.dot_general`` itself, and so are a ``lax.DotAlgorithm`` precision and operands
    of different dtypes other than two floats. The result dtype and the precision (a level,
    a ``lax.DotAlgorithmPreset`` or its name, or the ``jax.default_matmul_precision`` in
    force) follow lax's own rules.

    >>> jat.dot_general(x, w, (((2,), (0,)), ((), ()))).shape
    (8, 32, 16)
    >>> jat.dot_general(x, w, (((2,), (0,)), ((), ())), precision="F32_F32_F32").dtype
    dtype('float32')
    """
    unknown = set(kwargs) - _LAX_DOT_GENERAL_PARAMS
    if unknown:
        raise TypeError(f"dot_general() got unexpected keyword argument(s) {sorted(unknown)}; "
                        f"lax.dot_general accepts {sorted(_LAX_DOT_GENERAL_PARAMS)}")
    out_sharding = kwargs.pop("out_sharding", None)
    if any(value is not None for value in kwargs.values()):
        return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type,
                               out_sharding=out_sharding, **kwargs)
    if out_sharding is not None or _explicitly_sharded(lhs, rhs):
        return _sharded(lambda: _dot_general(lhs, rhs, dimension_numbers, precision,
                                             preferred_element_type, out_sharding),
                        lambda: lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                                                preferred_element_type=preferred_element_type,
                                                out_sharding=out_sharding))
    return _dot_general(lhs, rhs, dimension_numbers, precision, preferred_element_type, None)


def dot_general_in_context(lhs, rhs, dimension_numbers, precision, preferred_element_type,
                           epilogue: Epilogue, operands):
    """``epilogue`` applied to ``lax.dot_general(lhs, rhs, ...)``, bound as one tuned op:
    its canonical result, (batch, m, n), (batch, m) or () by the epilogue's class; None
    where the tuned matmul does not serve the call (lax's own dot must run it), and
    ``LEFT_PLAIN`` where its key is left plain (``leaving_plain``: the dot too stays lax's).
    ``operands(batch, m, n)`` gives the epilogue's operands in their role shapes.

        >>> out = dot_general_in_context(x, w, (((1,), (0,)), ((), ())), None, None,
        ...                              Epilogue.parse("row:float32|add(y,$0)"),
        ...                              lambda batch, m, n: [bias])
    """
    if _explicitly_sharded(lhs, rhs):
        return None
    return _dot_general(lhs, rhs, dimension_numbers, precision, preferred_element_type, None,
                        epilogue, operands)


def _dot_general(lhs, rhs, dimension_numbers, precision, preferred_element_type, out_sharding,
                 epilogue: Epilogue | None = None, operands=None):
    lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    try:
        (lc, rc), (lb, rb) = dimension_numbers
    except (TypeError, ValueError) as err:
        raise ValueError(f"dot_general: dimension_numbers must be ((lhs_contracting, rhs_contracting), "
                         f"(lhs_batch, rhs_batch)), got {dimension_numbers!r}") from err
    lc, lb = _check_dims("lhs dims", lc, lhs.ndim, lhs.shape), _check_dims("lhs batch", lb, lhs.ndim, lhs.shape)
    rc, rb = _check_dims("rhs dims", rc, rhs.ndim, rhs.shape), _check_dims("rhs batch", rb, rhs.ndim, rhs.shape)
    if len(lc) != len(rc) or any(lhs.shape[i] != rhs.shape[j] for i, j in zip(lc, rc)):
        raise TypeError(f"dot_general: contracting dims {lc} of lhs {lhs.shape} and {rc} of rhs "
                         f"{rhs.shape} must have equal sizes")
    if len(lb) != len(rb) or any(lhs.shape[i] != rhs.shape[j] for i, j in zip(lb, rb)):
        raise TypeError(f"dot_general: batch dims {lb} of lhs {lhs.shape} and {rb} of rhs "
                         f"{rhs.shape} must have equal sizes")
    if set(lc) & set(lb) or set(rc) & set(rb):
        raise TypeError(f"dot_general: a dim cannot be both batch and contracting: {dimension_numbers!r}")
    lfree = tuple(d for d in range(lhs.ndim) if d not in lc and d not in lb)
    rfree = tuple(d for d in range(rhs.ndim) if d not in rc and d not in rb)
    tuned = _tuned("dot_general", lhs, rhs, precision, preferred_element_type)
    in_context = epilogue is not None

    def plain():
        return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type, out_sharding=out_sharding)

    if tuned is None or (in_context and (lhs.size == 0 or rhs.size == 0 or lhs.dtype != rhs.dtype)):
        return None if in_context else plain()
    out_shape = tuple(lhs.shape[d] for d in lb) + tuple(lhs.shape[d] for d in lfree) + \
        tuple(rhs.shape[d] for d in rfree)
    return _bound(lhs, rhs, ((lb, lfree, lc), (rb, rfree, rc)), tuned, out_shape, out_sharding, plain,
                  epilogue, operands)


def _bound(lhs, rhs, dims, tuned, out_shape, out_sharding, plain, epilogue: Epilogue | None = None,
           operands=None):
    """The pipeline ``matmul`` and ``dot_general`` share: ``lhs`` and ``rhs`` with their
    ``dims`` ((batch, free, contracting) of each) as the canonical problem, bound tuned and
    reshaped to ``out_shape``; ``tuned`` is ``_tuned``'s (precision level, result dtype).
    A zero-size operand gives zeros (an empty array, or zeros when only k is 0), as lax.
    With ``epilogue`` (``dot_general_in_context``) the canonical result of the matmul in its
    context, or ``LEFT_PLAIN``; without, ``plain()`` (lax's own call) where the key is left plain.

        >>> _bound(x, w, (((), (0,), (1,)), ((), (1,), (0,))), (Precision.DEFAULT, x.dtype),
        ...        (8, 16), None, plain=lambda: x @ w)
    """
    (lb, lfree, lc), (rb, rfree, rc) = dims
    precision_level, out_dtype = tuned
    in_context = epilogue is not None
    if lhs.size == 0 or rhs.size == 0:
        return jnp.zeros(out_shape, out_dtype)
    lhs_order, transpose_a, lhs_shape = _canonical_layout(lhs.shape, lb, lfree, lc, free_first=True)
    rhs_order, transpose_b, rhs_shape = _canonical_layout(rhs.shape, rb, rfree, rc, free_first=False)
    batch = lhs_shape[0]
    m = math.prod(lhs.shape[d] for d in lfree)
    n = math.prod(rhs.shape[d] for d in rfree)
    k = math.prod(lhs.shape[d] for d in lc)
    problem = _problem(batch, m, n, k, lhs, rhs, out_dtype, transpose_a, transpose_b, precision_level,
                       _copies(lhs.shape, lhs_order), _copies(rhs.shape, rhs_order))
    if _left_plain(problem, epilogue):
        return LEFT_PLAIN if in_context else plain()
    lhs3 = _canonical_operand(lhs, lhs_order, lhs_shape)
    rhs3 = _canonical_operand(rhs, rhs_order, rhs_shape)
    if in_context:
        if epilogue.is_bare:
            return bind_matmul(lhs3, rhs3, problem)
        return bind_fused(lhs3, rhs3, operands(batch, m, n), dataclasses.replace(problem, epilogue=epilogue))
    out = bind_matmul(lhs3, rhs3, problem, _canonical_sharding(out_sharding, out_shape, problem.out_shape))
    return _reshape(out, out_shape, out_sharding)


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
