"""A matmul problem: one concrete matmul in canonical form, and how to build one.

``MatmulProblem`` is (batch, m, k) x (batch, k, n) -> (batch, m, n) with real sizes,
dtypes, layout flags and precision; ``problem.key(level)`` is its tune key
(``jax_autotune.key``). ``problem_for`` builds one from operands as stored;
``precision_name`` normalises a jax precision argument.

    >>> import jax
    >>> from jax_autotune.problem import problem_for
    >>> s = jax.ShapeDtypeStruct((1000, 1000), "float32")
    >>> problem_for(s, s).describe()
    '1000x1000x1000 float32 NN DEFAULT'
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_autotune.key import (Level, MatmulKey, Precision, anchor, compact_form, dtype_name,
                              kind_of, layout_from_strides, pow2_factor, row_major_strides,
                              scale_of, stride_factor)


@dataclasses.dataclass(frozen=True)
class MatmulProblem:
    """One concrete matmul in canonical form: (batch, m, k) x (batch, k, n) -> (batch, m, n).

    Operands are stored row-major as ``lhs_shape`` / ``rhs_shape``: with ``transpose_a``
    the lhs is stored (batch, k, m), with ``transpose_b`` the rhs is stored (batch, n, k).
    It is hashable, so the matmul primitive carries it as a parameter.
    """

    batch: int
    m: int
    n: int
    k: int
    lhs_dtype: str
    rhs_dtype: str
    out_dtype: str
    transpose_a: bool = False
    transpose_b: bool = False
    precision: Precision = Precision.DEFAULT

    def __post_init__(self):
        for name in ("batch", "m", "n", "k"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"MatmulProblem: {name} must be a positive int, got {value!r}")
        object.__setattr__(self, "precision", Precision(self.precision))
        for name in ("lhs_dtype", "rhs_dtype", "out_dtype"):
            object.__setattr__(self, name, dtype_name(getattr(self, name)))

    @property
    def lhs_shape(self) -> tuple[int, int, int]:
        return (self.batch, self.k, self.m) if self.transpose_a else (self.batch, self.m, self.k)

    @property
    def rhs_shape(self) -> tuple[int, int, int]:
        return (self.batch, self.n, self.k) if self.transpose_b else (self.batch, self.k, self.n)

    @property
    def out_shape(self) -> tuple[int, int, int]:
        return (self.batch, self.m, self.n)

    def describe(self) -> str:
        """A compact one-line form, e.g. ``8x1000x1000x1000 float32 NT DEFAULT``
        (N: stored as is, T: stored transposed)."""
        layouts = "NT"[self.transpose_a] + "NT"[self.transpose_b]
        return compact_form(self.batch, self.m, self.n, self.k,
                            (self.lhs_dtype, self.rhs_dtype, self.out_dtype), layouts, self.precision)

    def key(self, level: Level | str = Level.BALANCED) -> MatmulKey:
        """The tune key of this problem at ``level`` (callers pass the configured level)."""
        level = Level(level)
        m, n, k, batch = (anchor(x, level) for x in (self.m, self.n, self.k, self.batch))
        lhs_item = np.dtype(self.lhs_dtype).itemsize
        rhs_item = np.dtype(self.rhs_dtype).itemsize
        lhs_strides = row_major_strides(self.lhs_shape, lhs_item)
        rhs_strides = row_major_strides(self.rhs_shape, rhs_item)
        # logical (batch, rows, cols) strides: a transposed operand swaps the last two
        lhs_logical = _logical(self.lhs_shape, lhs_strides, self.transpose_a)
        rhs_logical = _logical(self.rhs_shape, rhs_strides, self.transpose_b)
        return MatmulKey(
            m=m, n=n, k=k, batch=batch,
            lhs_pow2_factor=pow2_factor(m if self.transpose_a else k),
            rhs_pow2_factor=pow2_factor(k if self.transpose_b else n),
            lhs_stride_factor=stride_factor(self.lhs_shape, lhs_strides),
            rhs_stride_factor=stride_factor(self.rhs_shape, rhs_strides),
            lhs_layout=layout_from_strides(*lhs_logical),
            rhs_layout=layout_from_strides(*rhs_logical),
            lhs_dtype=self.lhs_dtype, rhs_dtype=self.rhs_dtype, out_dtype=self.out_dtype,
            precision=self.precision,
            scale=scale_of(m, n, k),
            kind=kind_of(self.m, self.n, self.k),
        )

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["precision"] = self.precision.value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "MatmulProblem":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"MatmulProblem: unknown fields {sorted(unknown)}")
        return cls(**data)


def _logical(stored_shape, stored_strides, transposed):
    if not transposed:
        return stored_shape, stored_strides
    shape = (*stored_shape[:-2], stored_shape[-1], stored_shape[-2])
    strides = (*stored_strides[:-2], stored_strides[-1], stored_strides[-2])
    return shape, strides


def precision_name(precision: Any) -> Precision:
    """Normalise a jax precision argument (None, str, lax.Precision or a pair) to one level.

    None follows ``jax.config.jax_default_matmul_precision`` like XLA's dot does; a
    pair takes the higher of the two.
    """
    if precision is None:
        configured = jax.config.jax_default_matmul_precision
        if configured is None:
            return Precision.DEFAULT
        precision = configured
    if isinstance(precision, (tuple, list)):
        if len(precision) != 2:
            raise ValueError(f"precision: expected None, a Precision or a pair, got {precision!r}")
        levels = [precision_name(p) for p in precision]
        order = list(Precision)
        return max(levels, key=order.index)
    if isinstance(precision, lax.Precision):
        return Precision(precision.name)
    if isinstance(precision, str):
        aliases = {
            "default": Precision.DEFAULT, "fastest": Precision.DEFAULT, "bfloat16": Precision.DEFAULT,
            "high": Precision.HIGH, "tensorfloat32": Precision.HIGH, "bfloat16_3x": Precision.HIGH,
            "highest": Precision.HIGHEST, "float32": Precision.HIGHEST,
        }
        if precision.lower() in aliases:
            return aliases[precision.lower()]
    raise ValueError(f"precision: expected None, 'DEFAULT', 'HIGH', 'HIGHEST', a lax.Precision "
                     f"or a pair of them, got {precision!r}")


def _shape_dtype(x: Any, name: str) -> tuple[tuple[int, ...], np.dtype]:
    try:
        return tuple(int(d) for d in x.shape), np.dtype(x.dtype)
    except (AttributeError, TypeError) as err:
        raise TypeError(f"{name}: expected an array or jax.ShapeDtypeStruct, "
                        f"got {type(x).__name__}") from err


def problem_for(lhs: Any, rhs: Any, *, transpose_a: bool = False, transpose_b: bool = False,
                precision: Any = None, preferred_element_type: Any = None) -> MatmulProblem:
    """The canonical problem of ``lhs @ rhs`` with operands given as stored.

    Both operands are (..., rows, cols) with equal or broadcastable leading batch dims.
    """
    lhs_shape, lhs_dtype = _shape_dtype(lhs, "lhs")
    rhs_shape, rhs_dtype = _shape_dtype(rhs, "rhs")
    if len(lhs_shape) < 2 or len(rhs_shape) < 2:
        raise ValueError(f"lhs and rhs must have at least 2 dims (..., rows, cols); got "
                         f"lhs {lhs_shape} and rhs {rhs_shape}")
    m, k_lhs = (lhs_shape[-1], lhs_shape[-2]) if transpose_a else lhs_shape[-2:]
    k_rhs, n = (rhs_shape[-1], rhs_shape[-2]) if transpose_b else rhs_shape[-2:]
    if k_lhs != k_rhs:
        raise ValueError(f"contracting dims differ: lhs {lhs_shape} (transpose_a={transpose_a}) "
                         f"has k={k_lhs}, rhs {rhs_shape} (transpose_b={transpose_b}) has k={k_rhs}")
    try:
        batch_shape = np.broadcast_shapes(lhs_shape[:-2], rhs_shape[:-2])
    except ValueError as err:
        raise ValueError(f"batch dims of lhs {lhs_shape} and rhs {rhs_shape} do not "
                         f"broadcast") from err
    out_dtype = (np.dtype(preferred_element_type) if preferred_element_type is not None
                 else np.dtype(jnp.promote_types(lhs_dtype, rhs_dtype)))
    return MatmulProblem(
        batch=int(np.prod(batch_shape, dtype=np.int64)), m=int(m), n=int(n), k=int(k_lhs),
        lhs_dtype=lhs_dtype.name, rhs_dtype=rhs_dtype.name, out_dtype=out_dtype.name,
        transpose_a=bool(transpose_a), transpose_b=bool(transpose_b),
        precision=precision_name(precision),
    )
