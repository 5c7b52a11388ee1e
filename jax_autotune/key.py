"""The tune key: which matmul problems share one tuning decision.

A ``MatmulProblem`` is one concrete matmul (real sizes, dtypes, layout flags); its
``key(level)`` is the ``MatmulKey`` under which the decision is stored. The rules are
the reference's (CubeCL's ``MatmulAutotuneKey``):

* ``m, n, k`` (and ``batch``) are bucketed to the next power of the level's base;
* pow2 factor: trailing zero bits of the bucketed contiguous axis, capped at 4;
* stride factor: the power of two that every non-innermost REAL byte stride is
  divisible by (the minimum over strides), capped at 10;
* layout: Contiguous, MildlyPermuted{transposed, batch_swap} or HighlyPermuted;
* scale from the bucketed sizes (all < 512 Small, all < 2048 Medium, else Large);
* kind from which of m, n, k equal one.

    >>> import jax, jax_autotune as jat
    >>> a = jax.ShapeDtypeStruct((1000, 1000), "float32")
    >>> jat.key_for(a, a).lhs_stride_factor
    5
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any, Sequence

import numpy as np

MAX_POW2_FACTOR = 4
MAX_STRIDE_FACTOR = 10


class Level(str, enum.Enum):
    """Bucketing level; also picks the roofline threshold (see ``roofline``)."""

    MINIMAL = "minimal"
    BALANCED = "balanced"
    EXTENSIVE = "extensive"
    FULL = "full"


LEVEL_BASES: dict[Level, float | None] = {
    Level.MINIMAL: 2.5,
    Level.BALANCED: 2.0,
    Level.EXTENSIVE: 1.5,
    Level.FULL: None,
}


class Scale(str, enum.Enum):
    SMALL = "Small"
    MEDIUM = "Medium"
    LARGE = "Large"


class Kind(str, enum.Enum):
    GENERAL = "General"
    MAT_VEC = "MatVec"
    VEC_MAT = "VecMat"
    SCALAR_VEC = "ScalarVec"
    VEC_SCALAR = "VecScalar"
    INNER_PRODUCT = "InnerProduct"
    OUTER_PRODUCT = "OuterProduct"
    SCALAR_PRODUCT = "ScalarProduct"


class Precision(str, enum.Enum):
    DEFAULT = "DEFAULT"
    HIGH = "HIGH"
    HIGHEST = "HIGHEST"


@dataclasses.dataclass(frozen=True, order=True)
class Layout:
    """How an operand's two matrix axes and its batch axes sit in memory.

    ``Layout.contiguous()``, ``Layout.mildly_permuted(transposed=True)`` or
    ``Layout.highly_permuted()``; ``str(layout)`` is the reference's spelling.
    """

    name: str  # "Contiguous" | "MildlyPermuted" | "HighlyPermuted"
    transposed: bool = False
    batch_swap: bool = False

    @classmethod
    def contiguous(cls) -> "Layout":
        return cls("Contiguous")

    @classmethod
    def mildly_permuted(cls, transposed: bool = False, batch_swap: bool = False) -> "Layout":
        if not (transposed or batch_swap):
            return cls.contiguous()
        return cls("MildlyPermuted", transposed, batch_swap)

    @classmethod
    def highly_permuted(cls) -> "Layout":
        return cls("HighlyPermuted")

    def __str__(self) -> str:
        if self.name == "MildlyPermuted":
            return (f"MildlyPermuted {{ transposed: {str(self.transposed).lower()}, "
                    f"batch_swap: {str(self.batch_swap).lower()} }}")
        return self.name

    @classmethod
    def parse(cls, text: str) -> "Layout":
        text = text.replace(" ", "")
        if text in ("Contiguous", "HighlyPermuted"):
            return cls(text)
        if text.startswith("MildlyPermuted"):
            return cls.mildly_permuted("transposed:true" in text, "batch_swap:true" in text)
        raise ValueError(f"layout: expected Contiguous, MildlyPermuted {{...}} or "
                         f"HighlyPermuted, got {text!r}")


# ---------------------------------------------------------------- bucketing rules

def anchor(x: int, level: Level | str = Level.BALANCED) -> int:
    """The bucket of size ``x``: the next power of the level's base at or above x.

    >>> anchor(768), anchor(1000), anchor(1025), anchor(1025, "full")
    (1024, 1024, 2048, 1025)
    """
    level = Level(level)
    if x < 1:
        raise ValueError(f"anchor: size must be >= 1, got {x}")
    base = LEVEL_BASES[level]
    if base is None or x == 1:
        return int(x)
    if base == 2.0:
        return 1 << (int(x) - 1).bit_length()
    # the small epsilon keeps exact powers (base**e) in their own bucket
    exponent = math.ceil(math.log(x) / math.log(base) - 1e-9)
    return max(int(x), math.ceil(base ** exponent - 1e-9))


def pow2_factor(bucketed_axis: int) -> int:
    """Trailing zero bits of the (bucketed) contiguous axis, capped at 4."""
    tz = (bucketed_axis & -bucketed_axis).bit_length() - 1
    return min(tz, MAX_POW2_FACTOR)


def stride_factor(shape: Sequence[int], strides_bytes: Sequence[int]) -> int:
    """Min over non-innermost byte strides of the power of two dividing each, capped at 10.

    Strides of axes of size one are ignored: they never move the pointer.
    """
    factor = MAX_STRIDE_FACTOR
    for size, stride in zip(shape[:-1], strides_bytes[:-1]):
        if size == 1 or stride == 0:
            continue
        tz = (stride & -stride).bit_length() - 1
        factor = min(factor, tz)
    return factor


def layout_from_strides(shape: Sequence[int], strides: Sequence[int]) -> Layout:
    """Classify a (..., rows, cols) operand by its strides (in elements or bytes).

    Row-major matrices with batch strides in decreasing order are Contiguous; swapped
    matrix axes are ``transposed``; batch axes out of order are ``batch_swap``; a batch
    stride that is inside a matrix (or zero, a broadcast) is HighlyPermuted.
    """
    if len(shape) < 2:
        return Layout.contiguous()
    row, col = strides[-2], strides[-1]
    if (row == 0 and shape[-2] > 1) or (col == 0 and shape[-1] > 1):
        return Layout.highly_permuted()
    transposed = shape[-2] > 1 and shape[-1] > 1 and row < col
    matrix_extent = max(row * shape[-2], col * shape[-1])
    batch_swap = False
    previous = None
    for size, stride in zip(shape[:-2], strides[:-2]):
        if size == 1:
            continue
        if stride == 0 or stride < matrix_extent:
            return Layout.highly_permuted()
        if previous is not None and stride > previous:
            batch_swap = True
        previous = stride
    return Layout.mildly_permuted(transposed, batch_swap)


def row_major_strides(shape: Sequence[int], itemsize: int) -> tuple[int, ...]:
    strides, acc = [], itemsize
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(int(size), 1)
    return tuple(reversed(strides))


def scale_of(m: int, n: int, k: int) -> Scale:
    if m < 512 and n < 512 and k < 512:
        return Scale.SMALL
    if m < 2048 and n < 2048 and k < 2048:
        return Scale.MEDIUM
    return Scale.LARGE


def kind_of(m: int, n: int, k: int) -> Kind:
    ones = (m == 1, n == 1, k == 1)
    return {
        (False, False, False): Kind.GENERAL,
        (False, True, False): Kind.MAT_VEC,
        (True, False, False): Kind.VEC_MAT,
        (True, False, True): Kind.SCALAR_VEC,
        (False, True, True): Kind.VEC_SCALAR,
        (True, True, False): Kind.INNER_PRODUCT,
        (False, False, True): Kind.OUTER_PRODUCT,
        (True, True, True): Kind.SCALAR_PRODUCT,
    }[ones]


def dtype_name(dtype: Any) -> str:
    return np.dtype(dtype).name


# ---------------------------------------------------------------- the key

@dataclasses.dataclass(frozen=True)
class MatmulKey:
    """The tune key: immutable, hashable, JSON round-trip, stable canonical string."""

    m: int
    n: int
    k: int
    batch: int
    lhs_pow2_factor: int
    rhs_pow2_factor: int
    lhs_stride_factor: int
    rhs_stride_factor: int
    lhs_layout: Layout
    rhs_layout: Layout
    lhs_dtype: str
    rhs_dtype: str
    out_dtype: str
    precision: Precision
    scale: Scale
    kind: Kind

    def canonical(self) -> str:
        """One line, fields in declaration order, no spaces inside a value.

        Equal keys give equal strings; ``MatmulKey.parse`` inverts it.
        """
        return " ".join(f"{name}={str(value).replace(' ', '')}"
                        for name, value in self.to_json().items())

    __str__ = canonical

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, enum.Enum):
                value = value.value
            elif isinstance(value, Layout):
                value = str(value)
            out[field.name] = value
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "MatmulKey":
        """Inverse of ``to_json``; a missing or mistyped field is a ValueError naming it."""
        if not isinstance(data, dict):
            raise ValueError(f"MatmulKey: expected a JSON object, got {type(data).__name__}")
        converters = {
            "lhs_layout": Layout.parse, "rhs_layout": Layout.parse,
            "precision": Precision, "scale": Scale, "kind": Kind,
            "lhs_dtype": dtype_name, "rhs_dtype": dtype_name, "out_dtype": dtype_name,
        }
        values = {}
        for field in dataclasses.fields(cls):
            if field.name not in data:
                raise ValueError(f"MatmulKey: missing field {field.name!r}")
            raw = data[field.name]
            try:
                if field.name in converters:
                    values[field.name] = converters[field.name](raw)
                else:
                    if not isinstance(raw, int) or isinstance(raw, bool):
                        raise TypeError
                    values[field.name] = raw
            except (TypeError, ValueError) as err:
                raise ValueError(f"MatmulKey: bad value for field {field.name!r}: {raw!r}") from err
        return cls(**values)

    @classmethod
    def parse(cls, text: str) -> "MatmulKey":
        """Inverse of ``canonical()``; a malformed string is a ValueError naming the part."""
        data: dict[str, Any] = {}
        for part in text.split():
            name, sep, value = part.partition("=")
            if not sep:
                raise ValueError(f"MatmulKey.parse: expected name=value, got {part!r}")
            data[name] = int(value) if value.lstrip("-").isdigit() else value
        return cls.from_json(data)


# ---------------------------------------------------------------- the problem

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
        dims = f"{self.m}x{self.n}x{self.k}" if self.batch == 1 else f"{self.batch}x{self.m}x{self.n}x{self.k}"
        dtypes = {self.lhs_dtype, self.rhs_dtype, self.out_dtype}
        dtype = self.lhs_dtype if len(dtypes) == 1 else f"{self.lhs_dtype},{self.rhs_dtype}->{self.out_dtype}"
        layouts = "NT"[self.transpose_a] + "NT"[self.transpose_b]
        return f"{dims} {dtype} {layouts} {self.precision.value}"

    def key(self, level: Level | str | None = None) -> MatmulKey:
        """The tune key of this problem at ``level`` (default: the configured level)."""
        if level is None:
            from jax_autotune import config
            level = config.get("level")
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
    import jax
    from jax import lax

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
    import jax.numpy as jnp

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


def key_for(lhs: Any, rhs: Any, *, transpose_a: bool = False, transpose_b: bool = False,
            precision: Any = None, preferred_element_type: Any = None,
            level: Level | str | None = None) -> MatmulKey:
    """The tune key of ``lhs @ rhs``; operands are arrays or ShapeDtypeStructs as stored.

    A ``transpose_b=True`` rhs is stored (n, k); a ``transpose_a=True`` lhs is stored (k, m).

    >>> import jax, jax_autotune as jat
    >>> s = jax.ShapeDtypeStruct((768, 768), "float32")
    >>> jat.key_for(s, s).m
    1024
    """
    problem = problem_for(lhs, rhs, transpose_a=transpose_a, transpose_b=transpose_b,
                          precision=precision, preferred_element_type=preferred_element_type)
    return problem.key(level)
