"""A matmul problem: one concrete matmul in canonical form, and how to build one.

``MatmulProblem`` is (batch, m, k) x (batch, k, n) -> (batch, m, n) with real sizes,
dtypes, layout flags and precision; ``problem.key(level)`` is its tune key
(``jax_autotune.key``). ``problem_for`` builds one from operands as stored;
``lax_result`` is lax's own dtype and precision rule for a call, ``key_precision`` and
``precision_name`` turn a jax precision into the key's.

    >>> import jax
    >>> from jax_autotune.problem import problem_for
    >>> s = jax.ShapeDtypeStruct((1000, 1000), "float32")
    >>> problem_for(s, s).describe()
    '1000x1000x1000 float32 NN DEFAULT'
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_autotune.epilogue import BARE, Epilogue
from jax_autotune.key import (PRECISION_LEVELS, RAGGED_MODES, Level, MatmulKey, Precision, compact_form,
                              dtype_name, key_of)
from jax_autotune.splits import SPLITS


@dataclasses.dataclass(frozen=True)
class MatmulProblem:
    """One concrete matmul in canonical form: (batch, m, k) x (batch, k, n) -> (batch, m, n).

    Operands are stored row-major as ``lhs_shape`` / ``rhs_shape``: with ``transpose_a``
    the lhs is stored (batch, k, m), with ``transpose_b`` the rhs is stored (batch, n, k).
    ``epilogue`` is what the program applies to the product (its operands follow lhs and
    rhs, ``input_specs``); the result is then ``result_shape`` in ``result_dtype``. It is
    hashable, so the matmul primitives carry it as a parameter.

    A grouped matmul (``lax.ragged_dot``) has ``groups`` > 0 and a ``ragged`` dim
    (``key.RAGGED_MODES``) and batch 1; its operands are lax's own shapes:
    ``"m"``: lhs (m, k), rhs (groups, k, n) or, ``transpose_b``, (groups, n, k), out (m, n);
    ``"k"``: lhs (m, k) or (k, m), rhs (k, n) or (n, k), out (groups, m, n), the k rows
    split into groups. Its group sizes are a third input (``input_specs``). A ragged m may
    have an elementwise epilogue (a SwiGLU's ``silu(gate) * up``, a bias, a convert) over
    its (m, n) product; its operands, after the group sizes, have their role shapes without
    the batch: row (n,), col (m,), full (m, n).

    ``lhs_copied`` / ``rhs_copied``: the program holds that operand in an order no stored
    layout reads (``bqhd`` with batch dims b and h), so it is copied into its stored shape
    before the matmul (its prologue). XLA's dot fuses that copy into its own reads where it
    can; a kernel's custom call reads the copy. Candidates are timed with it
    (``jax_autotune.tuning.timing``), so the decision counts what the program pays.
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
    epilogue: Epilogue = BARE
    groups: int = 0
    ragged: str = ""
    lhs_copied: bool = False
    rhs_copied: bool = False

    def __post_init__(self):
        for name in ("batch", "m", "n", "k"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"MatmulProblem: {name} must be a positive int, got {value!r}")
        object.__setattr__(self, "precision", Precision(self.precision))
        for name in ("lhs_dtype", "rhs_dtype", "out_dtype"):
            object.__setattr__(self, name, dtype_name(getattr(self, name)))
        if isinstance(self.epilogue, str):
            object.__setattr__(self, "epilogue", Epilogue.parse(self.epilogue))
        elif not isinstance(self.epilogue, Epilogue):
            raise ValueError(f"MatmulProblem: epilogue must be an Epilogue, got {self.epilogue!r}")
        if self.ragged not in RAGGED_MODES or (self.groups > 0) != bool(self.ragged) or self.groups < 0:
            raise ValueError(f"MatmulProblem: a grouped matmul needs groups > 0 and ragged 'm' or 'k', "
                             f"a dense one neither; got groups={self.groups!r}, ragged={self.ragged!r}")
        if not isinstance(self.lhs_copied, bool) or not isinstance(self.rhs_copied, bool):
            raise ValueError(f"MatmulProblem: lhs_copied and rhs_copied must be bools, got "
                             f"{self.lhs_copied!r} and {self.rhs_copied!r}")
        if (self.lhs_copied or self.rhs_copied) and self.groups:
            raise ValueError("MatmulProblem: a grouped matmul's operands are never copied (lhs_copied, rhs_copied)")
        if self.ragged and (self.batch != 1 or (self.ragged == "m" and self.transpose_a)
                            or not (self.epilogue.is_bare or (self.ragged == "m" and self.epilogue.elementwise))):
            raise ValueError("MatmulProblem: a grouped matmul has batch 1, an epilogue only when elementwise "
                             "and its ragged dim m, and, ragged 'm', its lhs stored (m, k)")

    @property
    def lhs_shape(self) -> tuple[int, ...]:
        shape = (self.batch, self.k, self.m) if self.transpose_a else (self.batch, self.m, self.k)
        return shape[1:] if self.groups else shape

    @property
    def rhs_shape(self) -> tuple[int, ...]:
        shape = (self.batch, self.n, self.k) if self.transpose_b else (self.batch, self.k, self.n)
        if self.ragged == "m":
            return (self.groups, *shape[1:])
        return shape[1:] if self.groups else shape

    @property
    def out_shape(self) -> tuple[int, ...]:
        """The product's shape (what a kernel computes; the epilogue then runs on it)."""
        if self.groups:
            return (self.m, self.n) if self.ragged == "m" else (self.groups, self.m, self.n)
        return (self.batch, self.m, self.n)

    @property
    def ragged_rows(self) -> int:
        """A grouped matmul's size of the dim split into groups (m or k); 0 when dense."""
        return {"": 0, "m": self.m, "k": self.k}[self.ragged]

    @property
    def result_shape(self) -> tuple[int, ...]:
        """The shape of what the program computes: the product through the epilogue."""
        if self.groups:
            return self.out_shape
        return self.epilogue.result(self.batch, self.m, self.n, self.out_dtype)[0]

    @property
    def result_dtype(self) -> str:
        return self.epilogue.result(self.batch, self.m, self.n, self.out_dtype)[1]

    def input_specs(self) -> tuple[tuple[tuple[int, ...], str], ...]:
        """(shape, dtype) of every input: lhs, rhs, then the epilogue's operands; for a
        grouped matmul lhs, rhs and the group sizes of the tuning splits, (``splits.SPLITS``,
        groups) int32 (its kernels take (splits, groups) and give one result per split)."""
        operands = tuple(zip(self.epilogue_operand_shapes(), (o.dtype for o in self.epilogue.operands)))
        if self.groups:
            return ((self.lhs_shape, self.lhs_dtype), (self.rhs_shape, self.rhs_dtype),
                    ((SPLITS, self.groups), "int32"), *operands)
        return ((self.lhs_shape, self.lhs_dtype), (self.rhs_shape, self.rhs_dtype), *operands)

    def epilogue_operand_shapes(self) -> tuple[tuple[int, ...], ...]:
        """The epilogue operands' shapes: their roles' on (batch, m, n), or, grouped, on (m, n)."""
        shapes = self.epilogue.operand_shapes(self.batch, self.m, self.n)
        if self.groups:  # no batch dim: col (m,), full (m, n)
            return tuple(s[1:] if o.role in ("col", "full") else s for s, o in zip(shapes, self.epilogue.operands))
        return shapes

    def bare(self) -> "MatmulProblem":
        """The product alone, without the epilogue."""
        return self if self.epilogue.is_bare else dataclasses.replace(self, epilogue=BARE)

    def describe(self) -> str:
        """A compact one-line form, e.g. ``8x1000x1000x1000 float32 NT DEFAULT``
        (N: stored as is, T: stored transposed, a trailing c: copied into it), and
        ``| ops`` with an epilogue."""
        layouts = "NT"[self.transpose_a] + "c" * self.lhs_copied + "NT"[self.transpose_b] + "c" * self.rhs_copied
        return compact_form(self.batch, self.m, self.n, self.k,
                            (self.lhs_dtype, self.rhs_dtype, self.out_dtype), layouts, self.precision,
                            self.epilogue, self.groups, self.ragged)

    def with_operands_converted(self) -> "MatmulProblem":
        """The problem as XLA's dot runs it on CPUs and GPUs: lax's lowering converts
        operands of different dtypes to the result dtype first (under an algorithm preset it
        converts them to the preset's types instead, so those stay as they are)."""
        if self.lhs_dtype == self.rhs_dtype or self.precision.algorithm is not None:
            return self
        return dataclasses.replace(self, lhs_dtype=self.out_dtype, rhs_dtype=self.out_dtype)

    def key(self, level: Level | str = Level.BALANCED) -> MatmulKey:
        """The tune key of this problem at ``level`` (callers pass the configured level;
        the rules: ``jax_autotune.key.key_of``)."""
        return key_of(self, level)

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["precision"] = self.precision.value
        if self.epilogue.is_bare:
            del data["epilogue"]  # written as before epilogues existed
        else:
            data["epilogue"] = str(self.epilogue)
        if not self.groups:  # a dense problem: written as before grouped matmuls existed
            del data["groups"], data["ragged"]
        for name in ("lhs_copied", "rhs_copied"):
            if not data[name]:  # written as before operand copies were keyed
                del data[name]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "MatmulProblem":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"MatmulProblem: unknown fields {sorted(unknown)}")
        return cls(**data)


# ---------------------------------------------------------------- lax's own rules

_DOT_1X1 = (((1,), (0,)), ((), ()))
_F32 = (np.dtype("float32"), False)
_F32_SDS = jax.ShapeDtypeStruct((1, 1), "float32")


class LaxResult(NamedTuple):
    """What lax makes of a call: its canonical precision (None, a pair of ``lax.Precision``,
    a ``lax.DotAlgorithmPreset`` or a ``lax.DotAlgorithm``) and the result's dtype and weak type."""

    precision: Any
    dtype: np.dtype
    weak_type: bool


def lax_result(op: str, lhs: Any, rhs: Any, precision: Any = None,
               preferred_element_type: Any = None) -> LaxResult:
    """How ``lax.dot_general`` (op ``"dot_general"``) or ``jnp.matmul`` (``"matmul"``) treats
    operands of these dtypes, found by tracing it on 1x1 operands: the precision in force
    (``jax.default_matmul_precision`` included) and the result dtype, or lax's own error.

    >>> f16, bf16 = jnp.ones(2, "float16"), jnp.ones(2, "bfloat16")
    >>> lax_result("dot_general", f16, bf16).dtype, lax_result("matmul", f16, bf16).dtype
    (dtype(bfloat16), dtype('float32'))
    """
    args = (op, _dtype_and_weak_type(lhs), _dtype_and_weak_type(rhs),
            tuple(precision) if isinstance(precision, list) else precision, preferred_element_type,
            _settings_in_force())
    try:
        hash(args)
    except TypeError:  # an odd precision or dtype: trace it uncached (lax judges it)
        return _traced_lax_result.__wrapped__(*args)
    return _traced_lax_result(*args)


@functools.lru_cache(maxsize=1024)
def _traced_lax_result(op, lhs, rhs, precision, preferred_element_type, settings):
    # lax reads the settings while tracing; as an argument they key the cache
    a, b = (jax.ShapeDtypeStruct((1, 1), dtype, weak_type=weak) for dtype, weak in (lhs, rhs))
    if op == "matmul":
        out = jax.eval_shape(functools.partial(jnp.matmul, precision=precision,
                                               preferred_element_type=preferred_element_type), a, b)
        # jnp.matmul hands precision to lax.dot_general as is
        canonical = _traced_lax_result("dot_general", _F32, _F32, precision, None, settings)
        return LaxResult(canonical.precision, np.dtype(out.dtype), bool(out.weak_type))
    closed = jax.make_jaxpr(functools.partial(lax.dot_general, dimension_numbers=_DOT_1X1,
                                              precision=precision,
                                              preferred_element_type=preferred_element_type))(a, b)
    (eqn,) = [e for e in closed.eqns if e.primitive is lax.dot_general_p]
    out = closed.out_avals[0]
    return LaxResult(eqn.params["precision"], np.dtype(out.dtype), bool(out.weak_type))


def _settings_in_force() -> tuple:
    """The jax settings lax's dtype and precision rules read."""
    return (jax.config.jax_default_matmul_precision, jax.config.jax_enable_x64,
            jax.config.jax_numpy_dtype_promotion)


def _dtype_and_weak_type(x: Any) -> tuple[np.dtype, bool]:
    try:
        aval = jax.typeof(x)
    except TypeError:  # any object with a shape and a dtype (key_for takes those)
        aval = x
    return np.dtype(aval.dtype), bool(getattr(aval, "weak_type", False))


def key_precision(canonical: Any) -> Precision | None:
    """The key's ``Precision`` for lax's canonical precision (``LaxResult.precision``);
    None where the key has no word for it (a ``lax.DotAlgorithm``, a preset newer than
    this build), which the drop-ins hand to lax itself. A pair takes the higher level, as
    XLA does on CPUs and GPUs.

    >>> key_precision((lax.Precision.DEFAULT, lax.Precision.HIGH))
    <Precision.HIGH: 'HIGH'>
    """
    if canonical is None:
        return Precision.DEFAULT
    if isinstance(canonical, lax.DotAlgorithmPreset):
        try:
            return Precision.of_algorithm(canonical.name)
        except ValueError:
            return None
    if isinstance(canonical, tuple) and all(isinstance(p, lax.Precision) for p in canonical):
        return max((Precision(p.name) for p in canonical), key=PRECISION_LEVELS.index)
    return None


def precision_name(precision: Any) -> Precision:
    """The key's ``Precision`` for a jax precision argument (anything lax accepts but a
    ``lax.DotAlgorithm``); None follows ``jax.default_matmul_precision`` as lax does.

    >>> precision_name("F32_F32_F32"), precision_name("tensorfloat32")
    (<Precision.F32_F32_F32: 'F32_F32_F32'>, <Precision.HIGH: 'HIGH'>)
    """
    try:
        canonical = lax_result("dot_general", _F32_SDS, _F32_SDS, precision).precision
    except ValueError as err:
        raise ValueError(f"precision: {err}") from err
    level = key_precision(canonical)
    if level is None:
        raise ValueError(f"precision: {precision!r} has no tune key; jax_autotune.dot_general "
                         f"and matmul pass a lax.DotAlgorithm straight to lax")
    return level


def _shape_dtype(x: Any, name: str) -> tuple[tuple[int, ...], np.dtype]:
    try:
        return tuple(int(d) for d in x.shape), np.dtype(x.dtype)
    except (AttributeError, TypeError) as err:
        raise TypeError(f"{name}: expected an array or jax.ShapeDtypeStruct, "
                        f"got {type(x).__name__}") from err


DTYPE_EXAMPLES = ("float32", "float64", "bfloat16", "float16", "float8_e4m3fn", "int8")


def dtype_named(value: Any, argument: str = "dtype") -> str:
    """The name of the dtype ``value`` names (a string, a NumPy or jnp dtype or type); for
    anything else a TypeError, as ``jnp.dtype`` raises, that names ``argument`` and lists
    dtype names (``warmup`` and the command line's ``--dtype`` both take it).

        >>> dtype_named("bfloat16"), dtype_named(jnp.float32)
        ('bfloat16', 'float32')
    """
    try:
        return jnp.dtype(value).name
    except TypeError:
        raise TypeError(f"{argument} {value!r}: expected a dtype name such as "
                        f"{', '.join(DTYPE_EXAMPLES)}") from None


def matmul_dims(lhs_shape: tuple, rhs_shape: tuple, transpose_a: bool = False, transpose_b: bool = False,
                caller: str = "", shown: tuple | None = None,
                mismatch: type[Exception] = TypeError) -> tuple[tuple[int, ...], int, int, int]:
    """(batch shape, m, n, k) of ``lhs @ rhs``, each (..., rows, cols) as stored with leading
    batch dims that broadcast: the one check of a matmul's shapes. As ``jnp.matmul``: a
    TypeError (``mismatch``) when the contracting dims differ, a ValueError when the batch
    dims do not broadcast, each naming ``caller`` and the shapes (``shown``: as the user
    gave them).

        >>> matmul_dims((2, 3, 4), (4, 5))
        ((2,), 3, 5, 4)
    """
    head = f"{caller}: " if caller else ""
    shown_lhs, shown_rhs = shown or (lhs_shape, rhs_shape)
    m, k_lhs = (lhs_shape[-1], lhs_shape[-2]) if transpose_a else lhs_shape[-2:]
    k_rhs, n = (rhs_shape[-1], rhs_shape[-2]) if transpose_b else rhs_shape[-2:]
    if k_lhs != k_rhs:
        raise mismatch(f"{head}contracting dims differ: lhs {shown_lhs} (transpose_a={transpose_a}) "
                        f"has k={k_lhs}, rhs {shown_rhs} (transpose_b={transpose_b}) has k={k_rhs}")
    try:
        batch_shape = tuple(int(d) for d in np.broadcast_shapes(lhs_shape[:-2], rhs_shape[:-2]))
    except ValueError as err:
        raise ValueError(f"{head}batch dims of lhs {shown_lhs} and rhs {shown_rhs} do not broadcast") from err
    return batch_shape, int(m), int(n), int(k_lhs)


def problem_for(lhs: Any, rhs: Any, *, transpose_a: bool = False, transpose_b: bool = False,
                precision: Any = None, preferred_element_type: Any = None) -> MatmulProblem:
    """The canonical problem of ``lhs @ rhs`` with operands given as stored.

    Both operands are (..., rows, cols) with equal or broadcastable leading batch dims.
    The result dtype is ``lax.dot_general``'s; operands of different dtypes are keyed as
    they run (``MatmulProblem.with_operands_converted``).
    """
    lhs_shape, lhs_dtype = _shape_dtype(lhs, "lhs")
    rhs_shape, rhs_dtype = _shape_dtype(rhs, "rhs")
    if len(lhs_shape) < 2 or len(rhs_shape) < 2:
        raise ValueError(f"lhs and rhs must have at least 2 dims (..., rows, cols); got "
                         f"lhs {lhs_shape} and rhs {rhs_shape}")
    # a ValueError, as key_for and warmup have always raised for a contracting mismatch
    batch_shape, m, n, k = matmul_dims(lhs_shape, rhs_shape, transpose_a, transpose_b, mismatch=ValueError)
    key_level = precision_name(precision)
    out_dtype = lax_result("dot_general", lhs, rhs, precision, preferred_element_type).dtype
    return MatmulProblem(
        batch=int(np.prod(batch_shape, dtype=np.int64)), m=int(m), n=int(n), k=int(k),
        lhs_dtype=lhs_dtype.name, rhs_dtype=rhs_dtype.name, out_dtype=out_dtype.name,
        transpose_a=bool(transpose_a), transpose_b=bool(transpose_b),
        precision=key_level,
    ).with_operands_converted()
