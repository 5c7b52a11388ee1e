"""Differential test: ``jat.autotune(f)`` gives what ``f`` gives, on random dots and epilogues.

Hypothesis draws a ``lax.dot_general`` (batch, free and contracting dims in any order on
either side, dtypes, precision, preferred_element_type) and a chain of 0-5 ops after it of
the kinds ``jax_autotune.context`` takes into a dot's context (bias and residual adds, a
scalar scale, activations, converts, ``integer_pow``, a final sum). The tuned function must
give the plain one's value (dtype, shape, values within the dtype's tolerance) and, through
``jax.value_and_grad`` of a float32 scalar loss, its gradient with respect to every float
input (dtype and shape per leaf, values within tolerance). Integer dots, and dots with an
empty dim, are left as lax's: those must match exactly.

Tolerances (``numerics.PROGRAM_TOLERANCES``, by the narrowest float the program goes
through) are relative to the size of the terms each leaf is a sum of, from a float64 numpy run of the same program,
forward and backward (``reference``): a final sum that cancels, or a gradient through a
saturated tanh, is compared at the scale its rounding errors have. The reference's own
errors against both results are in each failure's notes.

    JAX_AUTOTUNE_DIFF_EXAMPLES=300 pytest tests/test_differential.py   # a longer hunt
    JAX_AUTOTUNE_DIFF_SEED=7 ...                                         # other examples

A failure's report holds ``repro()``: a self-contained program that shows the difference.
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, note, seed, settings
from hypothesis import strategies as st
from jax import lax

import jax_autotune as jat
from jax_autotune import config
from jax_autotune.primitive import fused_p, matmul_p
from jax_autotune.jaxprs import equations
from numerics import PROGRAM_TOLERANCES, assert_matches

EXAMPLES = int(os.environ.get("JAX_AUTOTUNE_DIFF_EXAMPLES", "40"))
SEED = os.environ.get("JAX_AUTOTUNE_DIFF_SEED")

P = lax.Precision
PRECISIONS = [None, P.DEFAULT, P.HIGH, P.HIGHEST]
FLOATS = ("float32", "bfloat16", "float16")
DTYPE_PAIRS = [  # same-dtype floats most often: those are the dots the tuner serves
    *[("float32", "float32")] * 4, *[("bfloat16", "bfloat16")] * 3, *[("float16", "float16")] * 3,
    ("float32", "bfloat16"), ("bfloat16", "float32"), ("float16", "float32"), ("bfloat16", "float16"),
    ("int8", "int8"), ("int32", "int32"), ("int8", "int32"),
]
# bounds on the chain's values and on its derivative: exp and pow stay finite in float16,
# and so do the gradients (a cotangent summed over up to 81 entries)
LIMIT, SLOPE_LIMIT = 1e3, 1e2
MAX_OUT, MAX_K = 2048, 64  # elements of the product, and its contraction size


# ---------------------------------------------------------------- one drawn case

@dataclasses.dataclass(frozen=True)
class Case:
    lhs_labels: tuple[str, ...]  # per lhs dim: b0 b1 (batch), m0 m1 (free), k0 k1 (contracting)
    rhs_labels: tuple[str, ...]  # per rhs dim: b0 b1, n0 n1, k0 k1
    sizes: tuple[tuple[str, int], ...]
    lhs_dtype: str
    rhs_dtype: str
    precision: object
    preferred: str | None
    ops: tuple[tuple[str, object], ...]  # (name, parameter)
    jit: bool
    seed: int

    @property
    def size(self) -> dict[str, int]:
        return dict(self.sizes)

    @property
    def dimension_numbers(self):
        batch = sorted(l for l in self.lhs_labels if l[0] == "b")
        contract = sorted(l for l in self.lhs_labels if l[0] == "k")
        lc = tuple(self.lhs_labels.index(l) for l in contract)
        rc = tuple(self.rhs_labels.index(l) for l in contract)
        lb = tuple(self.lhs_labels.index(l) for l in batch)
        rb = tuple(self.rhs_labels.index(l) for l in batch)
        return ((lc, rc), (lb, rb))

    @property
    def out_labels(self) -> tuple[str, ...]:
        return (tuple(sorted(l for l in self.lhs_labels if l[0] == "b"))
                + tuple(l for l in self.lhs_labels if l[0] == "m")
                + tuple(l for l in self.rhs_labels if l[0] == "n"))

    @property
    def integer(self) -> bool:
        return not (_is_float(self.lhs_dtype) and _is_float(self.rhs_dtype))

    @property
    def empty(self) -> bool:
        return 0 in self.size.values()

    def shapes(self):
        return (tuple(self.size[l] for l in self.lhs_labels), tuple(self.size[l] for l in self.rhs_labels))

    def operand_specs(self, out_shape):
        """(shape, dtype) of each bias / residual, in the order the chain reads them."""
        specs = []
        for name, dtype in self.ops:
            if name == "bias":
                specs.append(((out_shape[-1],), dtype))
            elif name == "residual":
                specs.append((tuple(out_shape), dtype))
        return specs

    def inputs(self):
        """lhs, rhs and the operands: fresh random normals, scaled so the product is about
        N(0, 1); integers in [-3, 3]."""
        rng = np.random.default_rng(self.seed)
        k = math.prod(self.size[l] for l in self.lhs_labels if l[0] == "k")
        scale = max(k, 1) ** -0.25

        def draw(shape, dtype, s=1.0):
            if _is_float(dtype):
                return jnp.asarray(rng.standard_normal(shape) * s, dtype)
            return jnp.asarray(rng.integers(-3, 4, shape), dtype)

        lhs_shape, rhs_shape = self.shapes()
        lhs, rhs = draw(lhs_shape, self.lhs_dtype, scale), draw(rhs_shape, self.rhs_dtype, scale)
        out_shape = tuple(self.size[l] for l in self.out_labels)
        return [lhs, rhs, *(draw(s, d) for s, d in self.operand_specs(out_shape))]

    def repro(self) -> str:
        """A program that shows this case: plain and autotuned value and gradient."""
        lhs_shape, rhs_shape = self.shapes()
        out_shape = tuple(self.size[l] for l in self.out_labels)
        lines = [
            "import jax, jax.numpy as jnp, numpy as np",
            "from jax import lax",
            "import jax_autotune as jat",
            "",
            "def f(lhs, rhs, *operands):",
            f"    y = lax.dot_general(lhs, rhs, {self.dimension_numbers!r},",
            f"                        precision={_precision_src(self.precision)},",
            f"                        preferred_element_type={_dtype_src(self.preferred)})",
        ]
        if self.operand_specs(out_shape):
            lines.append("    ops = iter(operands)")
        lines += [f"    y = {OP_SOURCE[name](param)}" for name, param in self.ops]
        k = math.prod(self.size[l] for l in self.lhs_labels if l[0] == "k")

        def source(shape, dtype, scale=1.0):
            if _is_float(dtype):
                scaled = f" * {scale:.4g}" if scale != 1.0 else ""
                return f"jnp.asarray(rng.standard_normal({shape}){scaled}, {_dtype_src(dtype)})"
            return f"jnp.asarray(rng.integers(-3, 4, {shape}), {_dtype_src(dtype)})"

        scale = max(k, 1) ** -0.25
        args = [source(lhs_shape, self.lhs_dtype, scale), source(rhs_shape, self.rhs_dtype, scale),
                *(source(s, d) for s, d in self.operand_specs(out_shape))]
        wrap = "jax.jit" if self.jit else ""
        lines += ["    return y", "", "rng = np.random.default_rng(0)",
                  "args = (" + ",\n        ".join(args) + ",)",
                  f"print('plain', {wrap}(f)(*args))", f"print('tuned', {wrap}(jat.autotune(f))(*args))",
                  "loss = lambda g: lambda *a: jnp.sum(g(*a).astype(jnp.float32))",
                  "n = tuple(i for i, a in enumerate(args) if jnp.issubdtype(a.dtype, jnp.floating))",
                  "if n:",
                  f"    print('plain', {wrap}(jax.grad(loss(f), n))(*args))",
                  f"    print('tuned', {wrap}(jax.grad(loss(jat.autotune(f)), n))(*args))"]
        return "\n".join(lines)


def _is_float(dtype) -> bool:
    return dtype is not None and np.dtype(dtype).name in FLOATS


def _dtype_src(dtype) -> str:
    return "None" if dtype is None else f"jnp.{np.dtype(dtype).name}"


def _precision_src(precision) -> str:
    if isinstance(precision, tuple):
        return "(" + ", ".join(_precision_src(p) for p in precision) + ")"
    return "None" if precision is None else f"lax.Precision.{precision.name}"


# the chain's ops: how f applies each, and how repro() writes it
OPS = {
    "bias": lambda y, p, ops: y + next(ops),        # (n,) along the last dim
    "residual": lambda y, p, ops: y + next(ops),    # the product's shape
    "scale": lambda y, p, ops: y * p,               # a Python scalar: a weak literal
    "tanh": lambda y, p, ops: jnp.tanh(y),
    "exp": lambda y, p, ops: jnp.exp(y),
    "logistic": lambda y, p, ops: lax.logistic(y),
    "max0": lambda y, p, ops: jnp.maximum(y, p),
    "relu": lambda y, p, ops: jax.nn.relu(y),
    "gelu": lambda y, p, ops: jax.nn.gelu(y, approximate=p),
    "silu": lambda y, p, ops: jax.nn.silu(y),
    "convert": lambda y, p, ops: y.astype(p),
    "pow": lambda y, p, ops: lax.integer_pow(y, p),
    "sum_last": lambda y, p, ops: jnp.sum(y, axis=-1),
    "sum_all": lambda y, p, ops: jnp.sum(y),
}
OP_SOURCE = {
    "bias": lambda p: "y + next(ops)", "residual": lambda p: "y + next(ops)",
    "scale": lambda p: f"y * {p!r}", "tanh": lambda p: "jnp.tanh(y)", "exp": lambda p: "jnp.exp(y)",
    "logistic": lambda p: "lax.logistic(y)", "max0": lambda p: f"jnp.maximum(y, {p!r})",
    "relu": lambda p: "jax.nn.relu(y)", "gelu": lambda p: f"jax.nn.gelu(y, approximate={p})",
    "silu": lambda p: "jax.nn.silu(y)", "convert": lambda p: f"y.astype(jnp.{p})",
    "pow": lambda p: f"lax.integer_pow(y, {p})", "sum_last": lambda p: "jnp.sum(y, axis=-1)",
    "sum_all": lambda p: "jnp.sum(y)",
}


def program(case: Case):
    dims = case.dimension_numbers

    def f(lhs, rhs, *operands):
        y = lax.dot_general(lhs, rhs, dims, precision=case.precision,
                            preferred_element_type=case.preferred)
        ops = iter(operands)
        for name, param in case.ops:
            y = OPS[name](y, param, ops)
        return y

    return f


# ---------------------------------------------------------------- the strategy

def _cap(sizes: dict, labels, limit: int) -> None:
    """Halve the largest of ``labels`` until their product is at most ``limit``."""
    while math.prod(sizes[l] for l in labels) > limit:
        biggest = max(labels, key=lambda l: sizes[l])
        sizes[biggest] = max(1, sizes[biggest] // 2)


@st.composite
def cases(draw) -> Case:
    # free dims on both sides most often: a product with m > 1 and n > 1 takes its epilogue
    counts = {"b": draw(st.integers(0, 2)), "k": draw(st.sampled_from([1, 1, 2, 0])),
              "m": draw(st.sampled_from([1, 1, 1, 2, 0])), "n": draw(st.sampled_from([1, 1, 1, 2, 0]))}
    labels = {c: [f"{c}{i}" for i in range(counts[c])] for c in "bmnk"}
    lhs_labels = tuple(draw(st.permutations(labels["b"] + labels["m"] + labels["k"])))
    rhs_labels = tuple(draw(st.permutations(labels["b"] + labels["n"] + labels["k"])))
    sizes = {l: draw(st.integers(1, 9)) for c in "bmnk" for l in labels[c]}
    _cap(sizes, labels["b"] + labels["m"] + labels["n"], MAX_OUT)
    _cap(sizes, labels["k"], MAX_K)
    if sizes and draw(st.integers(0, 11)) == 0:  # now and then an empty dim: lax's own dot
        sizes[draw(st.sampled_from(sorted(sizes)))] = 0
    lhs_dtype, rhs_dtype = draw(st.sampled_from(DTYPE_PAIRS))
    precision = draw(st.one_of(st.sampled_from(PRECISIONS),
                               st.tuples(st.sampled_from(PRECISIONS[1:]), st.sampled_from(PRECISIONS[1:]))))
    integer = not (_is_float(lhs_dtype) and _is_float(rhs_dtype))
    result = jax.eval_shape(lambda a, b: lax.dot_general(a, b, (((), ()), ((), ()))),
                            jax.ShapeDtypeStruct((), lhs_dtype), jax.ShapeDtypeStruct((), rhs_dtype)).dtype.name
    if integer:
        preferred = draw(st.sampled_from([None, None, "int32", "float32"]))
    else:  # None, the result's own dtype, or a wider float
        wider = [d for d in FLOATS if np.dtype(d).itemsize > np.dtype(result).itemsize]
        preferred = draw(st.sampled_from([None, None, result, *wider]))
    dtype = preferred or result
    out_shape = tuple(sizes[l] for l in labels["b"] + labels["m"] + labels["n"])
    count = math.prod(out_shape)

    ops = []
    value, slope = 5.0, 1.0  # bounds on |y| and on the chain's derivative so far
    for _ in range(draw(st.integers(0, 5))):
        if _is_float(dtype):
            choices = ["residual", "scale", "tanh", "logistic", "max0", "relu", "gelu", "silu", "convert"]
            if math.exp(value) <= LIMIT and slope * math.exp(value) <= SLOPE_LIMIT:
                choices.append("exp")
            if value ** 3 <= LIMIT and slope * 3 * value ** 2 <= SLOPE_LIMIT:  # either power
                choices.append("pow")
        else:  # what keeps an integer an integer, and a convert to a float
            choices = ["residual", "scale", "max0", "relu", "pow", "convert"]
        if out_shape:
            choices.append("bias")
        name = draw(st.sampled_from(choices))
        param = None
        if name in ("bias", "residual"):
            param = draw(st.sampled_from([dtype, dtype, dtype, *FLOATS])) if _is_float(dtype) else dtype
            dtype = jnp.promote_types(dtype, param).name
            value += 5.0
        elif name == "scale":
            param = draw(st.sampled_from([c for c in (0.5, -1.5, 2.0, 0.125) if slope * abs(c) <= SLOPE_LIMIT]
                                         if _is_float(dtype) else [2, -1, 3]))
            value, slope = value * abs(param), slope * abs(param)
        elif name == "max0":
            param = 0.0 if _is_float(dtype) else 0
        elif name == "gelu":
            param = draw(st.booleans())
        elif name == "convert":
            param = draw(st.sampled_from([d for d in FLOATS if d != dtype]))
            dtype = param
        elif name == "pow":
            param = draw(st.sampled_from([2, 3]))
            value, slope = value ** param, slope * param * value ** (param - 1)
        elif name == "exp":
            value, slope = math.exp(value), slope * math.exp(value)
        elif name in ("tanh", "logistic"):
            value = 1.0
        elif name in ("gelu", "silu"):
            slope *= 1.2
        ops.append((name, param))
    ending = draw(st.sampled_from([None, None, "sum_last", "sum_all"])) if len(ops) < 5 else None
    if ending == "sum_last" and out_shape:
        ops.append(("sum_last", None))
    elif ending == "sum_all" and (dtype != "float16" or value * count < 3e4):
        ops.append(("sum_all", None))
    return Case(lhs_labels, rhs_labels, tuple(sorted(sizes.items())), lhs_dtype, rhs_dtype,
                precision, preferred, tuple(ops), draw(st.booleans()), draw(st.integers(0, 2**32 - 1)))


# ---------------------------------------------------------------- comparisons

def narrowest(case: Case, arrays) -> str:
    """The dtype whose tolerance applies: exact for integer and empty dots, else the
    narrowest float any input, the product or a convert of the chain has."""
    if case.integer or case.empty:
        return "exact"
    seen = {np.dtype(x.dtype).name for x in arrays} | {p for n, p in case.ops if n == "convert"}
    seen.add(case.preferred or "float32")
    seen &= set(FLOATS)
    return max(seen, key=lambda d: PROGRAM_TOLERANCES[d])


_C = math.sqrt(2 / math.pi)
_erf = np.vectorize(math.erf, otypes=[np.float64])


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _forward(name, p, x, operand):
    """One op of the chain in float64."""
    if name in ("bias", "residual"):
        return x + operand
    return {
        "scale": lambda: x * p, "tanh": lambda: np.tanh(x), "exp": lambda: np.exp(x),
        "logistic": lambda: _sigmoid(x), "max0": lambda: np.maximum(x, 0), "relu": lambda: np.maximum(x, 0),
        "gelu": lambda: (0.5 * x * (1 + np.tanh(_C * (x + 0.044715 * x ** 3))) if p
                         else 0.5 * x * (1 + _erf(x / math.sqrt(2)))),
        "silu": lambda: x * _sigmoid(x), "convert": lambda: x, "pow": lambda: x ** p,
        "sum_last": lambda: np.sum(x, axis=-1), "sum_all": lambda: np.sum(x),
    }[name]()


def _derivative(name, p, x):
    """(d op / dx, a bound on the size of the terms it is computed from) of an elementwise op."""
    if name == "tanh":
        return 1 - np.tanh(x) ** 2, 1.0  # 1 - t^2: its rounding error is eps, not eps * t'
    if name == "exp":
        return np.exp(x), np.exp(x)
    if name == "logistic":
        return _sigmoid(x) * (1 - _sigmoid(x)), 1.0
    if name in ("max0", "relu"):
        return (x > 0).astype(np.float64), 1.0
    if name == "gelu":
        if p:
            t = np.tanh(_C * (x + 0.044715 * x ** 3))
            exact = 0.5 * (1 + t) + 0.5 * x * (1 - t ** 2) * _C * (1 + 3 * 0.044715 * x ** 2)
        else:
            exact = 0.5 * (1 + _erf(x / math.sqrt(2))) + x * np.exp(-x ** 2 / 2) / math.sqrt(2 * math.pi)
        return exact, 1 + np.abs(x) * (1 + 0.2 * x ** 2)
    if name == "silu":
        return _sigmoid(x) * (1 + x * (1 - _sigmoid(x))), 1 + np.abs(x)
    if name == "pow":
        return p * x ** (p - 1), p * np.abs(x) ** (p - 1)
    if name == "scale":
        return np.full_like(x, p), abs(p)
    return np.ones_like(x), 1.0  # convert


def reference(case: Case, arrays, cotangent):
    """The program in float64 with numpy, forward and backward (the dot by einsum, each op
    as written): (value, gradients of sum(value * cotangent) per input); and beside each,
    the size of the terms it is a sum of, elementwise: the scale rounding errors have
    where a sum cancels (a final reduction, a gradient through a saturated tanh)."""
    letters = {l: chr(ord("a") + i) for i, l in enumerate(sorted(case.size))}
    lhs_s, rhs_s, out_s = ("".join(letters[l] for l in labels)
                           for labels in (case.lhs_labels, case.rhs_labels, case.out_labels))
    lhs, rhs, *operands = (np.asarray(x, np.float64) for x in arrays)
    y = np.einsum(f"{lhs_s},{rhs_s}->{out_s}", lhs, rhs)
    size = np.einsum(f"{lhs_s},{rhs_s}->{out_s}", np.abs(lhs), np.abs(rhs))
    taken, ops = [], iter(operands)
    for name, p in case.ops:
        operand = next(ops) if name in ("bias", "residual") else None
        taken.append((name, p, y, operand))
        if name in ("sum_last", "sum_all"):
            size = _forward(name, p, np.maximum(size, np.abs(y)), None)
        elif name in ("bias", "residual"):
            size = np.abs(y) + np.abs(operand)
        y = _forward(name, p, y, operand)
        if name not in ("sum_last", "sum_all", "bias", "residual"):
            size = np.abs(y)
    g, g_size = np.asarray(cotangent, np.float64), np.abs(np.asarray(cotangent, np.float64))
    operand_grads = []
    for name, p, x, operand in reversed(taken):
        if name == "sum_last":
            g, g_size = (np.broadcast_to(v[..., None], x.shape) for v in (g, g_size))
        elif name == "sum_all":
            g, g_size = (np.broadcast_to(v, x.shape) for v in (g, g_size))
        elif name in ("bias", "residual"):
            axes = tuple(range(x.ndim - operand.ndim))
            operand_grads.append((np.sum(g, axis=axes), np.sum(g_size, axis=axes)))
        else:
            exact, bound = _derivative(name, p, x)
            g, g_size = g * exact, g_size * bound
    to_lhs, to_rhs = f"{out_s},{rhs_s}->{lhs_s}", f"{lhs_s},{out_s}->{rhs_s}"
    grads = [(np.einsum(to_lhs, g, rhs), np.einsum(to_lhs, g_size, np.abs(rhs))),
             (np.einsum(to_rhs, lhs, g), np.einsum(to_rhs, np.abs(lhs), g_size)),
             *reversed(operand_grads)]
    return (y, size), grads


def tuned_ops(fn, *args) -> list[str]:
    return [e.primitive.name for e in equations(jax.make_jaxpr(fn)(*args)) if e.primitive in (matmul_p, fused_p)]


# ---------------------------------------------------------------- the comparison can fail

@pytest.mark.parametrize("got, tolerance, message", [
    (np.ones((2, 3), np.float16), 1e-2, "dtype float16"),                 # a float32 leaf
    (np.ones((3, 2), np.float32), 1e-2, "shape"),
    (np.ones((2, 3), np.float32) * 1.05, 1e-2, "max |tuned - plain|"),
    (np.array([[1, 1, np.inf], [1, 1, 1]], np.float32), 1e-2, "non-finite"),
    (np.ones((2, 3), np.float32) + 1e-7, 0.0, "not exactly"),
    (jnp.ones((2, 3), jnp.bfloat16), 1e-2, "dtype bfloat16"),
])
def test_the_comparison_rejects_what_plain_jax_does_not_give(got, tolerance, message):
    with pytest.raises(AssertionError, match=message):
        assert_matches(got, np.ones((2, 3), np.float32), tolerance, "leaf")


def test_the_comparison_accepts_a_difference_within_tolerance():
    want = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    assert_matches(want + np.float32(1e-4), want, 1e-4, "leaf")  # 1e-4 of max |want| = 2


def test_a_float0_gradient_is_not_plain_jaxs():
    zeros = np.zeros((2, 3), jax.dtypes.float0)
    with pytest.raises(AssertionError, match="dtype"):
        assert_matches(zeros, np.zeros((2, 3), jnp.bfloat16), 6e-2, "d lhs")


# ---------------------------------------------------------------- the test

@pytest.fixture
def quick_tuning(fresh_tuning):
    config.update("budget_seconds", 0.05)
    yield fresh_tuning


def check(case: Case) -> None:
    note(case.repro())
    f = program(case)
    tuned = jat.autotune(f)
    arrays = case.inputs()
    tolerance = PROGRAM_TOLERANCES[narrowest(case, arrays)]
    wrap = jax.jit if case.jit else (lambda g: g)

    cotangent = jnp.asarray(np.random.default_rng(case.seed + 1).standard_normal(
        jax.eval_shape(f, *arrays).shape), jnp.float32)

    def loss(g):  # a float32 scalar, and g's value beside it
        def scalar(*xs):
            out = g(*xs)
            return jnp.sum(out.astype(jnp.float32) * cotangent), out
        return scalar

    # plain JAX: the value, and the loss and its gradient; jitted (one compile), or where
    # they must match exactly, called as the tuned function is
    plain = wrap if tolerance == 0.0 else jax.jit
    argnums = tuple(i for i, x in enumerate(arrays) if _is_float(x.dtype))
    if argnums:
        (want_loss, want), want_grads = plain(jax.value_and_grad(loss(f), argnums, has_aux=True))(*arrays)
    else:
        want = plain(f)(*arrays)

    got = wrap(tuned)(*arrays)
    kinds = sorted(set(tuned_ops(tuned, *arrays)))
    event(f"tuned ops in the forward pass: {kinds or 'none'}")
    scales = [0.0] * (len(arrays) + 2)  # value, loss, each input's gradient
    if tolerance:  # a float64 reference: who is off, and the scale of each leaf's terms
        (exact, size), grads = reference(case, arrays, cotangent)
        scales = [float(np.max(size, initial=0.0)), float(np.sum(size * np.abs(np.asarray(cotangent)))),
                  *(float(np.max(gs, initial=0.0)) for _, gs in grads)]
        off = lambda x, r: float(np.max(np.abs(np.asarray(x, np.float64) - r), initial=0.0))  # noqa: E731
        note(f"value: max |plain - f64| = {off(want, exact):.3g}, max |tuned - f64| = {off(got, exact):.3g}")
    assert_matches(got, want, tolerance, "value", scales[0])
    if not argnums:
        return

    (got_loss, got_value), got_grads = wrap(jax.value_and_grad(loss(tuned), argnums, has_aux=True))(*arrays)
    if tolerance:
        for i, g, w in zip(argnums, got_grads, want_grads):
            tuned_off = f"{off(g, grads[i][0]):.3g}" if g.dtype == w.dtype else "n/a"
            note(f"gradient {i}: max |plain - f64| = {off(w, grads[i][0]):.3g}, max |tuned - f64| = {tuned_off}")
    assert_matches(got_value, want, tolerance, "value under jax.grad", scales[0])
    assert_matches(got_loss, want_loss, tolerance, "loss", scales[1])
    names = ["d lhs", "d rhs"] + [f"d operand {j}" for j in range(len(arrays) - 2)]
    for i, g, w in zip(argnums, got_grads, want_grads):
        assert_matches(g, w, tolerance, f"{names[i]} ({arrays[i].dtype})", scales[2 + i])


_settings = settings(max_examples=EXAMPLES, deadline=None, derandomize=SEED is None, database=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@_settings
@given(case=cases())
def test_autotune_matches_plain_jax_on_random_dots_and_epilogues(quick_tuning, case):
    check(case)


if SEED is not None:
    test_autotune_matches_plain_jax_on_random_dots_and_epilogues = seed(int(SEED))(
        test_autotune_matches_plain_jax_on_random_dots_and_epilogues)
