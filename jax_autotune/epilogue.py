"""A matmul's epilogue: the ops a program applies to the product before anything else reads it.

An ``Epilogue`` is a small program over the canonical product ``y`` (batch, m, n): an
elementwise chain (bias, residual, activation, dtype convert, ...) and reductions over
``n`` or over everything (a logsumexp, a sum of squares). Its other inputs are
*operands*, each with a role saying how it broadcasts against ``y``:

* ``scalar`` ``()``; ``row`` ``(n,)`` (a bias); ``col`` ``(batch, m)``; ``full`` ``(batch, m, n)``.

Values have a class: ``full`` (batch, m, n), ``reduced`` (batch, m) after a reduction
over n, ``total`` () after a reduction over everything; an op's arguments broadcast to
the widest. The epilogue is part of the tune key (``MatmulKey.epilogue``), so it is
canonical, hashable and written as one line without spaces:

    row:bfloat16,full:bfloat16|add(y,$0);add(%0,$1)

(operand roles and dtypes, then the ops: ``y`` the product, ``$j`` operand j, ``%i`` the
result of op i, ``0.5:float32`` a literal). The bare epilogue (no ops) is ``""``.
``apply`` runs it with lax ops (XLA fuses them with whatever came before), and
``reference`` in float64 with numpy, for the correctness gate.

    >>> e = Epilogue.parse("row:float32|add(y,$0);tanh(%0)")
    >>> e.apply(y, (bias,)).shape == y.shape
    True
    >>> str(e), e.describe()
    ('row:float32|add(y,$0);tanh(%0)', 'add(y,row) > tanh')
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any, Callable, Sequence

import numpy as np

from jax_autotune.dtypes import is_floating

ROLES = ("scalar", "row", "col", "full")
MAX_OPS = 48  # a longer chain is cut there: the rest runs after the tuned program
_CLASS_RANK = {"total": 0, "reduced": 1, "full": 2}
_ROLE_CLASS = {"scalar": "total", "col": "reduced", "row": "row", "full": "full"}

_STRUCTURAL_PARAMS = {"broadcast": ("to",)}  # the one op that is no computation: it only lifts a class
_LITERAL = re.compile(r"^(-?(inf|nan|\d[\d.e+-]*)|True|False):([a-z0-9]+)$")


@dataclasses.dataclass(frozen=True)
class Operand:
    """An epilogue input other than the product: its role and dtype."""

    role: str
    dtype: str

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"epilogue operand role must be one of {ROLES}, got {self.role!r}")
        object.__setattr__(self, "dtype", np.dtype(self.dtype).name)

    def shape(self, batch: int, m: int, n: int) -> tuple[int, ...]:
        return {"scalar": (), "row": (n,), "col": (batch, m), "full": (batch, m, n)}[self.role]


@dataclasses.dataclass(frozen=True)
class Op:
    """One op: a name, its arguments (``y``, ``$j``, ``%i`` or a literal) and parameters."""

    name: str
    args: tuple[str, ...]
    params: tuple[tuple[str, Any], ...] = ()

    def __str__(self) -> str:
        params = ",".join(f"{k}={v}" for k, v in self.params)
        return f"{self.name}{{{params}}}({','.join(self.args)})" if params else f"{self.name}({','.join(self.args)})"


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """The ops after a matmul, canonical and hashable; ``Epilogue()`` is the bare one."""

    operands: tuple[Operand, ...] = ()
    ops: tuple[Op, ...] = ()

    def __post_init__(self):
        if len(self.ops) > MAX_OPS:
            raise ValueError(f"an epilogue holds at most {MAX_OPS} ops, got {len(self.ops)}")
        if self.operands and not self.ops:
            raise ValueError("an epilogue without ops takes no operands")
        self.classes()  # every reference and arity is checked here

    # ---------------------------------------------------------------- form
    @property
    def is_bare(self) -> bool:
        return not self.ops

    def __str__(self) -> str:
        if self.is_bare:
            return ""
        return ",".join(f"{o.role}:{o.dtype}" for o in self.operands) + "|" + ";".join(map(str, self.ops))

    canonical = __str__

    @classmethod
    def parse(cls, text: str) -> "Epilogue":
        """Inverse of ``str()``; a malformed text is a ValueError naming the part."""
        if not isinstance(text, str):
            raise ValueError(f"epilogue: expected a string, got {type(text).__name__}")
        if text == "":
            return BARE
        head, sep, body = text.partition("|")
        if not sep or not body:
            raise ValueError(f"epilogue: expected 'operands|ops', got {text[:80]!r}")
        operands = []
        for part in filter(None, head.split(",")):
            role, _, dtype = part.partition(":")
            try:
                operands.append(Operand(role, dtype))
            except (TypeError, ValueError) as err:
                raise ValueError(f"epilogue: bad operand {part!r}: {err}") from None
        return cls(tuple(operands), tuple(_parse_op(part) for part in body.split(";")))

    def describe(self) -> str:
        """The ops with operand roles in place of ``$j``, e.g. ``add(y,row) > tanh``."""
        def arg(a):
            return self.operands[int(a[1:])].role if a.startswith("$") else a.split(":")[0]
        steps = []
        for op in self.ops:
            shown = [arg(a) for a in op.args if not a.startswith("%")]
            extra = ",".join(str(v) for _, v in op.params)
            inner = ",".join([*shown, extra] if extra else shown)
            steps.append(f"{op.name}({inner})" if inner else op.name)
        return " > ".join(steps)

    # ---------------------------------------------------------------- structure
    def classes(self) -> tuple[str, ...]:
        """The class (full, reduced, total) of each op's result; a ValueError for a bad
        reference, arity, parameter or class."""
        found: list[str] = []
        for index, op in enumerate(self.ops):
            if op.name not in OPS and op.name not in _STRUCTURAL_PARAMS:
                raise ValueError(f"epilogue: op {index} {op.name!r} is not an epilogue op")
            arity = OPS[op.name].arity if op.name in OPS else 1
            if arity is not None and len(op.args) != arity or not op.args:
                raise ValueError(f"epilogue: op {index} {op.name} takes {arity} arguments, got {len(op.args)}")
            needed = OPS[op.name].params if op.name in OPS else _STRUCTURAL_PARAMS[op.name]
            if tuple(k for k, _ in op.params) != needed:
                raise ValueError(f"epilogue: op {index} {op.name} needs parameters {needed}, got {op.params}")
            kinds = [self._arg_class(a, found, index) for a in op.args]
            found.append(_result_class(op, kinds, index))
        return tuple(found)

    def _arg_class(self, arg: str, found: list[str], index: int) -> str:
        if arg == "y":
            return "full"
        if arg[:1] in "$%" and arg[1:].isdigit():
            j = int(arg[1:])
            pool = self.operands if arg[0] == "$" else found
            if j >= len(pool):
                raise ValueError(f"epilogue: op {index} refers to {arg}, which does not exist yet")
            return _ROLE_CLASS[pool[j].role] if arg[0] == "$" else pool[j]
        if _LITERAL.match(arg):
            return "total"
        raise ValueError(f"epilogue: op {index}: bad argument {arg!r}")

    @property
    def out_class(self) -> str:
        return self.classes()[-1] if self.ops else "full"

    @property
    def reduces(self) -> bool:
        return any(op.name in REDUCTIONS for op in self.ops)

    @property
    def elementwise(self) -> bool:
        """No reduction and no broadcast: the result is (batch, m, n), entry by entry."""
        return not self.reduces and not any(op.name == "broadcast" for op in self.ops)

    def scalars_as_rows(self) -> "Epilogue":
        """The same elementwise epilogue with its scalar operands read as rows, for a kernel
        that loads rows and not scalars (pass each scalar broadcast to ``(n,)``); elementwise
        ops give the same values either way.

            >>> str(Epilogue.parse("scalar:float32|mul(y,$0)").scalars_as_rows())
            'row:float32|mul(y,$0)'
        """
        if not self.elementwise:
            raise ValueError(f"epilogue {self}: only an elementwise epilogue reads scalars as rows")
        return Epilogue(tuple(Operand("row", o.dtype) if o.role == "scalar" else o for o in self.operands),
                        self.ops)

    def operand_shapes(self, batch: int, m: int, n: int) -> tuple[tuple[int, ...], ...]:
        return tuple(o.shape(batch, m, n) for o in self.operands)

    def result(self, batch: int, m: int, n: int, product_dtype: str) -> tuple[tuple[int, ...], str]:
        """(shape, dtype) of the epilogue's result on a (batch, m, n) product."""
        return _result(self, batch, m, n, np.dtype(product_dtype).name)

    # ---------------------------------------------------------------- evaluation
    def apply(self, y, operands: Sequence[Any], compute_dtype: str | None = None):
        """The epilogue on ``y`` (..., m, n) with lax ops; operands in their role shapes
        (``col``: (..., m)). The bare epilogue returns ``y``. Also runs inside Pallas
        kernels, on a (rows, cols) tile with operand tiles; there ``compute_dtype``
        ("float32") stands for every narrower float (literals and converts), so the whole
        chain runs in f32 and is rounded once, at the store."""
        return self._evaluate(y, tuple(operands), "lax", _jnp(), compute_dtype)

    def reference(self, y: np.ndarray, operands: Sequence[np.ndarray]) -> np.ndarray:
        """The epilogue in float64 (numpy) on a float64 product: converts keep float64."""
        return self._evaluate(np.asarray(y, np.float64), tuple(_float64(o) for o in operands),
                              "reference", np)

    def _evaluate(self, y, operands, column: str, xp, compute_dtype=None):
        """The ops run by ``OPS``' ``column`` ("lax" or "reference") on arrays of ``xp``."""
        if self.is_bare:
            return y
        if len(operands) != len(self.operands):
            raise ValueError(f"epilogue {self}: expected {len(self.operands)} operands, got {len(operands)}")
        full, reduced = tuple(y.shape), tuple(y.shape[:-1])
        classes = self.classes()
        results: list[Any] = []

        def value(arg):
            if arg == "y":
                return y, "full"
            if arg[0] == "$":
                j = int(arg[1:])
                return operands[j], _ROLE_CLASS[self.operands[j].role]
            if arg[0] == "%":
                j = int(arg[1:])
                return results[j], classes[j]
            text, dtype = arg.rsplit(":", 1)
            literal = {"True": True, "False": False}.get(text, None)
            dtype = _widened(dtype, compute_dtype)
            return xp.asarray(float(text) if literal is None else literal, dtype=_host_dtype(dtype, xp)), "total"

        def lift(x, kind, to):
            shape = {"full": full, "reduced": reduced, "total": ()}[to]
            if kind in ("reduced",) and to == "full":
                x = xp.expand_dims(x, -1)
            return x if tuple(x.shape) == shape else xp.broadcast_to(x, shape)

        for op, kind in zip(self.ops, classes):
            params = dict(op.params)
            args = [value(a) for a in op.args]
            if op.name in REDUCTIONS:
                (x, _), = args
                axis = -1 if params["axes"] == "n" else None
                results.append(getattr(OPS[op.name], column)(x, axis))
            elif op.name == "broadcast":
                (x, from_kind), = args
                results.append(lift(x, from_kind, params["to"]))
            else:
                lifted = [lift(x, k, kind) for x, k in args]
                if "new_dtype" in params:
                    params["new_dtype"] = _widened(params["new_dtype"], compute_dtype)
                results.append(getattr(OPS[op.name], column)(*lifted, **params))
        return results[-1]


BARE = Epilogue()


def _parse_op(text: str) -> Op:
    match = re.fullmatch(r"([a-z_0-9]+)(?:\{([^}]*)\})?\(([^)]*)\)", text)
    if not match:
        raise ValueError(f"epilogue: bad op {text[:80]!r}")
    name, params_text, args_text = match.groups()
    params = []
    for item in filter(None, (params_text or "").split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"epilogue: bad parameter {item!r} of {name}")
        params.append((key, int(value) if key == "y" else value))
    return Op(name, tuple(filter(None, args_text.split(","))), tuple(params))


def _result_class(op: Op, kinds: list[str], index: int) -> str:
    params = dict(op.params)
    if op.name in REDUCTIONS:
        if params["axes"] not in ("n", "all"):
            raise ValueError(f"epilogue: op {index} reduces over {params['axes']!r}; expected n or all")
        if kinds[0] == "row" or (params["axes"] == "n" and kinds[0] != "full"):
            raise ValueError(f"epilogue: op {index} reduces a {kinds[0]} value over {params['axes']}")
        return "reduced" if params["axes"] == "n" else "total"
    if op.name == "broadcast":
        if params["to"] not in ("full", "reduced") or _CLASS_RANK.get(kinds[0], 3) >= _CLASS_RANK[params["to"]]:
            raise ValueError(f"epilogue: op {index} broadcasts a {kinds[0]} value to {params['to']!r}")
        return params["to"]
    if "row" in kinds or "full" in kinds:
        return "full"
    return "reduced" if "reduced" in kinds else "total"


@functools.lru_cache(maxsize=512)
def _result(epilogue: Epilogue, batch: int, m: int, n: int, product_dtype: str):
    import jax

    y = jax.ShapeDtypeStruct((batch, m, n), product_dtype)
    operands = [jax.ShapeDtypeStruct(o.shape(batch, m, n), o.dtype) for o in epilogue.operands]
    out = jax.eval_shape(lambda y, *ops: epilogue.apply(y, ops), y, *operands)
    return tuple(out.shape), np.dtype(out.dtype).name


def _widened(dtype: str, compute_dtype: str | None) -> str:
    """``compute_dtype`` for a float narrower than it, else ``dtype``."""
    if compute_dtype is None or dtype in ("bool",) or not dtype.startswith(("float", "bfloat")):
        return dtype
    return compute_dtype if np.dtype(dtype).itemsize < np.dtype(compute_dtype).itemsize else dtype


def _float64(x) -> np.ndarray:
    """A host copy; floats (bfloat16 and float8 included) as float64."""
    x = np.asarray(x)
    return x.astype(np.float64) if is_floating(x.dtype.name) else x


def _host_dtype(dtype: str, xp):
    if xp is np:  # the float64 reference: floats stay float64
        return np.float64 if is_floating(dtype) else np.dtype(dtype)
    return dtype


@functools.lru_cache(maxsize=None)
def _jnp():
    import jax.numpy as jnp
    return jnp


@functools.lru_cache(maxsize=None)
def _jax():
    import jax
    return jax


def _lax(name: str) -> Callable:
    """``lax.<name>``, found at the first call: this module imports no jax."""
    return lambda *args: getattr(_jax().lax, name)(*args)


def _select_n(which, *cases):
    return np.choose(np.asarray(which).astype(np.int64), np.broadcast_arrays(*cases))


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One epilogue op: its arguments (None: any number, ``select_n``), how a program runs it
    (``lax``), its float64 numpy form for the correctness gate (``reference``), its
    parameters, and whether it is elementwise. The fused GPU kernels (the Triton and
    Mosaic GEMMs) apply every elementwise op in their tiles; reductions run after them."""

    arity: int | None
    lax: Callable
    reference: Callable
    params: tuple[str, ...] = ()
    elementwise: bool = True


def _unary(name: str, reference: Callable) -> OpSpec:
    return OpSpec(1, _lax(name), reference)


def _binary(name: str, reference: Callable) -> OpSpec:
    return OpSpec(2, _lax(name), reference)


def _reduction(name: str, reference: Callable) -> OpSpec:
    return OpSpec(1, lambda x, axis: getattr(_jnp(), name)(x, axis=axis),
                  lambda x, axis: reference(x, axis=axis), ("axes",), elementwise=False)


# every op an epilogue may hold, by the name the key writes
OPS: dict[str, OpSpec] = {
    "neg": _unary("neg", np.negative), "exp": _unary("exp", np.exp), "log": _unary("log", np.log),
    "log1p": _unary("log1p", np.log1p), "expm1": _unary("expm1", np.expm1),
    "tanh": _unary("tanh", np.tanh),
    "logistic": _unary("logistic", lambda x: 1.0 / (1.0 + np.exp(-x))),
    "erf": _unary("erf", np.vectorize(math.erf, otypes=[np.float64])),
    "sqrt": _unary("sqrt", np.sqrt), "rsqrt": _unary("rsqrt", lambda x: 1.0 / np.sqrt(x)),
    "abs": _unary("abs", np.abs), "sign": _unary("sign", np.sign), "square": _unary("square", np.square),
    "is_finite": _unary("is_finite", np.isfinite),
    "stop_gradient": _unary("stop_gradient", lambda x: x),
    "relu": OpSpec(1, lambda x: _jax().nn.relu(x), lambda x: np.maximum(x, 0)),
    "integer_pow": OpSpec(1, lambda x, y: _jax().lax.integer_pow(x, int(y)), lambda x, y: x ** int(y),
                          ("y",)),
    # the reference keeps float64: only a convert to a non-float type changes values
    "convert_element_type": OpSpec(
        1, lambda x, new_dtype: _jax().lax.convert_element_type(x, new_dtype),
        lambda x, new_dtype: x if is_floating(new_dtype) else x.astype(new_dtype), ("new_dtype",)),
    "add": _binary("add", np.add), "sub": _binary("sub", np.subtract),
    "mul": _binary("mul", np.multiply), "div": _binary("div", np.divide),
    "max": _binary("max", np.maximum), "min": _binary("min", np.minimum),
    "gt": _binary("gt", np.greater), "ge": _binary("ge", np.greater_equal), "lt": _binary("lt", np.less),
    "le": _binary("le", np.less_equal), "eq": _binary("eq", np.equal), "ne": _binary("ne", np.not_equal),
    "select_n": OpSpec(None, _lax("select_n"), _select_n),
    "reduce_sum": _reduction("sum", np.sum), "reduce_max": _reduction("max", np.max),
    "reduce_min": _reduction("min", np.min),
}
ELEMENTWISE_ARITY = {name: spec.arity for name, spec in OPS.items() if spec.elementwise}
REDUCTIONS = tuple(name for name, spec in OPS.items() if not spec.elementwise)

__all__ = ["Epilogue", "Operand", "Op", "OpSpec", "OPS", "BARE", "ROLES", "MAX_OPS", "ELEMENTWISE_ARITY",
           "REDUCTIONS"]
