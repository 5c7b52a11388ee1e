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
* kind from which of m, n, k equal one;
* the epilogue: the ops a program applies to the product (``jax_autotune.epilogue``),
  empty for a bare matmul; a key without one is written, stored and read as before;
* a grouped matmul (``lax.ragged_dot``): its number of groups, exact, and which dim is
  ragged (``RAGGED_MODES``); a dense key has neither and is written as before. The
  group sizes are runtime values: they are not in the key (``jax_autotune.splits``).
* an operand the program copies into its stored layout (``MatmulProblem.lhs_copied``):
  the copy is part of what a kernel costs there; a key without one is written as before.

A ``MatmulKey`` is derived here, from a ``MatmulProblem`` (``jax_autotune.problem``) at a
level the caller passes in (``key_of``; ``MatmulProblem.key`` calls it): this module reads
no setting.

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

from jax_autotune.epilogue import BARE, Epilogue

MAX_POW2_FACTOR = 4
MAX_STRIDE_FACTOR = 10
# the ragged dim of a grouped matmul: "" dense; "m" the lhs rows (lax's ragged non-contracting
# mode: lhs (m, k), rhs (g, k, n), out (m, n)); "k" the contracted rows (lax's ragged
# contracting mode, a weight gradient: out (g, m, n))
RAGGED_MODES = ("", "m", "k")


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
    """A key's numerical contract: a ``lax.Precision`` level, or a ``lax.DotAlgorithmPreset``
    by its name (the preset ``DEFAULT`` is ``ALGORITHM_DEFAULT``: lax's dtype and lowering
    rules for it differ from the level's).

    >>> Precision.of_algorithm("F32_F32_F32").algorithm, Precision.HIGH.algorithm
    ('F32_F32_F32', None)
    """

    DEFAULT = "DEFAULT"
    HIGH = "HIGH"
    HIGHEST = "HIGHEST"
    ALGORITHM_DEFAULT = "ALGORITHM_DEFAULT"
    ANY_F8_ANY_F8_F32 = "ANY_F8_ANY_F8_F32"
    ANY_F8_ANY_F8_F32_FAST_ACCUM = "ANY_F8_ANY_F8_F32_FAST_ACCUM"
    ANY_F8_ANY_F8_ANY = "ANY_F8_ANY_F8_ANY"
    ANY_F8_ANY_F8_ANY_FAST_ACCUM = "ANY_F8_ANY_F8_ANY_FAST_ACCUM"
    F16_F16_F16 = "F16_F16_F16"
    F16_F16_F32 = "F16_F16_F32"
    BF16_BF16_BF16 = "BF16_BF16_BF16"
    BF16_BF16_F32 = "BF16_BF16_F32"
    BF16_BF16_F32_X3 = "BF16_BF16_F32_X3"
    BF16_BF16_F32_X6 = "BF16_BF16_F32_X6"
    BF16_BF16_F32_X9 = "BF16_BF16_F32_X9"
    TF32_TF32_F32 = "TF32_TF32_F32"
    TF32_TF32_F32_X3 = "TF32_TF32_F32_X3"
    F32_F32_F32 = "F32_F32_F32"
    F64_F64_F64 = "F64_F64_F64"

    @property
    def algorithm(self) -> str | None:
        """The ``lax.DotAlgorithmPreset`` name of a preset; None for a level."""
        if self in PRECISION_LEVELS:
            return None
        return "DEFAULT" if self is Precision.ALGORITHM_DEFAULT else self.value

    @classmethod
    def of_algorithm(cls, name: str) -> "Precision":
        """The member of the ``lax.DotAlgorithmPreset`` named ``name``; ValueError if unknown."""
        member = cls.ALGORITHM_DEFAULT if name == "DEFAULT" else cls(name)
        if member in PRECISION_LEVELS:
            raise ValueError(f"{name!r} is a precision level, not an algorithm preset")
        return member


PRECISION_LEVELS = (Precision.DEFAULT, Precision.HIGH, Precision.HIGHEST)  # lowest first


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
    """The tune key: immutable, hashable, JSON round-trip, stable canonical string.

    ``level`` records the level the key was bucketed at (its tuning's roofline threshold):
    not part of the key's identity, its JSON or its canonical string, so stored tables
    read as before; a key read back from them carries the default."""

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
    epilogue: Epilogue = BARE
    groups: int = 0  # a grouped matmul's number of groups; 0: dense
    ragged: str = ""  # its ragged dim (``RAGGED_MODES``)
    lhs_copied: bool = False  # the program copies lhs into its stored layout (its prologue)
    rhs_copied: bool = False
    level: str = dataclasses.field(default=Level.BALANCED.value, compare=False)

    def canonical(self) -> str:
        """One line, fields in declaration order, no spaces inside a value (the epilogue
        only when there is one, so a bare key reads as before this field existed).

        Equal keys give equal strings; ``MatmulKey.parse`` inverts it.
        """
        return " ".join(f"{name}={str(value).replace(' ', '')}"
                        for name, value in self.to_json().items())

    __str__ = canonical

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            if not field.compare:  # the level: not the key's identity
                continue
            value = getattr(self, field.name)
            if isinstance(value, enum.Enum):
                value = value.value
            elif isinstance(value, (Layout, Epilogue)):
                if isinstance(value, Epilogue) and value.is_bare:
                    continue
                value = str(value)
            elif field.name in _OMITTED_AT_DEFAULT and value == _OMITTED_AT_DEFAULT[field.name]:
                continue  # a dense key, no copies: written as before these fields existed
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
            "epilogue": Epilogue.parse, "lhs_copied": _flag, "rhs_copied": _flag,
        }
        values = {}
        for field in dataclasses.fields(cls):
            if not field.compare:  # the level: never stored
                continue
            if field.name not in data:
                if field.name == "epilogue" or field.name in _OMITTED_AT_DEFAULT:  # bare, dense, no copies
                    continue
                raise ValueError(f"MatmulKey: missing field {field.name!r}")
            raw = data[field.name]
            try:
                if field.name in converters:
                    values[field.name] = converters[field.name](raw)
                elif field.name == "ragged":
                    if raw not in RAGGED_MODES:
                        raise ValueError
                    values[field.name] = raw
                else:
                    if not isinstance(raw, int) or isinstance(raw, bool):
                        raise TypeError
                    values[field.name] = raw
            except (TypeError, ValueError) as err:
                raise ValueError(f"MatmulKey: bad value for field {field.name!r}: {raw!r}") from err
        return cls(**values)

    def describe(self) -> str:
        """A compact one-line form, e.g. ``1024x1024x1024 float32 NT DEFAULT`` (per operand
        N: contiguous, T: transposed, B: batch-swapped, P: highly permuted, and a trailing
        c where the program copies it into that layout)."""
        layouts = (_layout_letter(self.lhs_layout) + "c" * self.lhs_copied
                   + _layout_letter(self.rhs_layout) + "c" * self.rhs_copied)
        return compact_form(self.batch, self.m, self.n, self.k,
                            (self.lhs_dtype, self.rhs_dtype, self.out_dtype), layouts, self.precision,
                            self.epilogue, self.groups, self.ragged)

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


def key_of(problem, level: Level | str = Level.BALANCED) -> MatmulKey:
    """The tune key of ``problem`` (a ``MatmulProblem``: its sizes, stored shapes, dtypes,
    layout flags, precision, epilogue and groups) at ``level``, by the rules above.

        >>> key_of(MatmulProblem(1, 1000, 1000, 1000, "float32", "float32", "float32")).m
        1024
    """
    level = Level(level)
    m, n, k, batch = (anchor(x, level) for x in (problem.m, problem.n, problem.k, problem.batch))
    lhs_strides = row_major_strides(problem.lhs_shape, np.dtype(problem.lhs_dtype).itemsize)
    rhs_strides = row_major_strides(problem.rhs_shape, np.dtype(problem.rhs_dtype).itemsize)
    # logical (batch, rows, cols) strides: a transposed operand swaps the last two
    lhs_logical = _logical(problem.lhs_shape, lhs_strides, problem.transpose_a)
    rhs_logical = _logical(problem.rhs_shape, rhs_strides, problem.transpose_b)
    return MatmulKey(
        m=m, n=n, k=k, batch=batch,
        lhs_pow2_factor=pow2_factor(m if problem.transpose_a else k),
        rhs_pow2_factor=pow2_factor(k if problem.transpose_b else n),
        lhs_stride_factor=stride_factor(problem.lhs_shape, lhs_strides),
        rhs_stride_factor=stride_factor(problem.rhs_shape, rhs_strides),
        lhs_layout=layout_from_strides(*lhs_logical),
        rhs_layout=layout_from_strides(*rhs_logical),
        lhs_dtype=problem.lhs_dtype, rhs_dtype=problem.rhs_dtype, out_dtype=problem.out_dtype,
        precision=problem.precision,
        scale=scale_of(m, n, k),
        kind=kind_of(problem.m, problem.n, problem.k),
        epilogue=problem.epilogue,
        groups=problem.groups, ragged=problem.ragged, lhs_copied=problem.lhs_copied,
        rhs_copied=problem.rhs_copied, level=level.value,
    )


def _logical(stored_shape, stored_strides, transposed):
    if not transposed:
        return stored_shape, stored_strides
    shape = (*stored_shape[:-2], stored_shape[-1], stored_shape[-2])
    strides = (*stored_strides[:-2], stored_strides[-1], stored_strides[-2])
    return shape, strides


def compact_form(batch: int, m: int, n: int, k: int, dtypes: tuple[str, str, str], layouts: str,
                 precision: Precision, epilogue: Epilogue = BARE, groups: int = 0, ragged: str = "") -> str:
    """``[B x] M x N x K``, one dtype (or ``lhs,rhs->out``), two layout letters, precision,
    ``ragged <dim> g<groups>`` for a grouped matmul, then ``| `` and the epilogue's ops when
    there are any."""
    dims = f"{m}x{n}x{k}" if batch == 1 else f"{batch}x{m}x{n}x{k}"
    lhs, rhs, out = dtypes
    dtype = lhs if len({lhs, rhs, out}) == 1 else f"{lhs},{rhs}->{out}"
    text = f"{dims} {dtype} {layouts} {Precision(precision).value}"
    if groups:
        text = f"{text} ragged {ragged} g{groups}"
    return text if epilogue.is_bare else f"{text} | {epilogue.describe()}"


# fields written only when set: a dense key's grouped-matmul fields, an operand copy's flags
_OMITTED_AT_DEFAULT = {"groups": 0, "ragged": "", "lhs_copied": False, "rhs_copied": False}


def _flag(raw: Any) -> bool:
    """A key's bool field from JSON (true/false) or its canonical string (True/False)."""
    if isinstance(raw, bool):
        return raw
    if raw in ("True", "False"):
        return raw == "True"
    raise ValueError(raw)


def _layout_letter(layout: Layout) -> str:
    if layout.name == "Contiguous":
        return "N"
    if layout.name == "HighlyPermuted":
        return "P"
    return ("T" if layout.transposed else "") + ("B" if layout.batch_swap else "")
