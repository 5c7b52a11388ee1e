"""The one place for the model suite's sizes, dtype modes, tolerances and tree comparison.

Sizes: small by default (CI, CPU); ``JAX_AUTOTUNE_MODEL_SIZE=real`` gives the sizes of a real
model (d_model 768, seq 256, batch 8, vocab 32000, 224x224 images), only meant for a GPU run
(``benchmarks/h200_run.sh OUTDIR models`` runs this folder so).

Tolerances bound the difference between an autotuned program and the same program in plain
JAX, in the same dtype: two correct programs that may round at other points (a tuned
kernel sums a dot's products in its own order; a fused epilogue rounds once where XLA
rounds twice). A float leaf is held to a norm-wise relative error ``||got - want|| /
||want||`` (a few elements that round the other way fail nothing), and no element may be
off by more than ``MAX_FACTOR`` tolerances of the leaf's largest value (one wrong row
cannot hide in the norm of a large leaf). Largest differences measured on the small
programs (first step's gradients; parameters after three steps; what the steps changed):

* float32, 1e-4: 2.3e-7; 1.5e-7; 4.0e-6. A wrong transpose, scale or dropped term is an
  error of order 1, a bf16 rounding inside a float32 program one of 1e-3.
* float16, 1e-2 (twenty ulps of 4.9e-4): 8.5e-4; 7.5e-5; 1.5e-3.
* bfloat16, 4e-2 (ten ulps of 3.9e-3): 1.6e-2; 3.6e-3; 1.1e-2 (f32 master weights). Plain
  JAX's own bf16 gradients are 0.4-1.5e-2 from float64's, and the autotuned program, which
  rounds at other points, is as far from plain JAX as that: the issue's 3e-2 would leave
  less than a factor of two; 4e-2 leaves 2.5. (What 16-bit parameters change in three steps
  is not compared: it is of the order of their rounding.)
* float8_e4m3fn, 1.25e-1 (one ulp): float8 gradients round bf16 ones that differ by 1-2%.

A leaf smaller than the tree's typical size (the root-mean-square of all its float
elements) is compared as if it were that size, an absolute tolerance: a gradient that is
zero by the model's symmetry (the bias of an attention key, which softmax ignores; a bias
that the next LayerNorm removes) is rounding noise in both programs (1e-8 in float32, 5e-4
in bfloat16, beside leaves of 0.1), and two noises need not agree. A leaf a tenth of the
typical size that came back as zeros still fails (in 16 and 32 bits).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jax_autotune as jat
from jax_autotune.jaxprs import equations

# ---------------------------------------------------------------------------------- sizes


@dataclasses.dataclass(frozen=True)
class Size:
    d_model: int
    heads: int
    kv_heads: int  # grouped-query attention: heads share these key/value heads
    seq: int
    batch: int
    vocab: int
    layers: int
    image: int  # square images, patch x patch patches, plus one class token
    patch: int
    experts: int
    memory: int  # encoder positions a cross-attention block reads
    learning_rate: float  # SGD's; AdamW's is a tenth of it


SIZES = {
    # odd and unequal on purpose: a swapped axis or a lost token shows as a shape error
    "small": Size(d_model=32, heads=4, kv_heads=2, seq=8, batch=2, vocab=61, layers=1,
                  image=8, patch=2, experts=4, memory=7, learning_rate=0.03),
    "real": Size(d_model=768, heads=12, kv_heads=4, seq=256, batch=8, vocab=32000, layers=2,
                 image=224, patch=16, experts=8, memory=197, learning_rate=0.003),
}


def size() -> Size:
    name = os.environ.get("JAX_AUTOTUNE_MODEL_SIZE", "small")
    if name not in SIZES:
        raise ValueError(f"JAX_AUTOTUNE_MODEL_SIZE={name!r}: expected one of {sorted(SIZES)}")
    return SIZES[name]


# ----------------------------------------------------------------------------- dtype modes


@dataclasses.dataclass(frozen=True)
class Mode:
    """Parameters stored in ``param_dtype``; matmuls run in ``compute_dtype``. A mode with
    ``cast_inside`` keeps float32 master weights and casts them inside the loss."""
    name: str
    param_dtype: type
    compute_dtype: type
    cast_inside: bool = False


MODES = {m.name: m for m in (
    Mode("f32", jnp.float32, jnp.float32),
    Mode("bf16", jnp.bfloat16, jnp.bfloat16),
    Mode("f16", jnp.float16, jnp.float16),
    Mode("f32_master_bf16", jnp.float32, jnp.bfloat16, cast_inside=True),
)}
# weights stored in float8 and cast to bf16 inside the loss (gradients come back in float8)
FLOAT8_STORAGE = Mode("f8_storage_bf16", jnp.float8_e4m3fn, jnp.bfloat16, cast_inside=True)

# ------------------------------------------------------------------------------ tolerances

DOT = ("dot_general",)
TUNED = ("autotuned_matmul", "autotuned_matmul_epilogue")  # a matmul alone, or in its context
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 4e-2, "float8_e4m3fn": 1.25e-1}
MAX_FACTOR = 10  # one element may be off by this many tolerances of its leaf's largest value


# float32 matmuls at the default precision run in TF32 on GPUs (10 mantissa bits), XLA's dot
# and the tuned kernels alike, each rounding its own way: the tuner's own gate allows 5e-3
GPU_FLOAT32_TOLERANCE = 5e-3


def tolerance(dtype) -> float:
    name = jnp.dtype(dtype).name
    if name == "float32" and jax.default_backend() == "gpu":
        return GPU_FLOAT32_TOLERANCE
    return TOLERANCE[name]


def assert_same_tree(got, want, dtype):
    """``got`` has ``want``'s pytree structure, and each leaf its type, dtype (weak type too),
    shape and, for floats, its values within ``dtype``'s tolerance; other leaves (integers,
    PRNG keys, counts) are equal. See the module docstring for how values are compared."""
    got_leaves, got_tree = jax.tree_util.tree_flatten_with_path(got)
    want_leaves, want_tree = jax.tree_util.tree_flatten_with_path(want)
    assert got_tree == want_tree, f"tree structure differs:\n got  {got_tree}\n want {want_tree}"
    floor = typical_size(want)
    for (path, g), (_, w) in zip(got_leaves, want_leaves):
        where = jax.tree_util.keystr(path) or "the value"
        same_kind = type(g) is type(w) or isinstance(g, jax.Array) and isinstance(w, jax.Array)
        assert same_kind, f"{where}: a {type(g).__name__}, plain JAX gives a {type(w).__name__}"
        if isinstance(w, (int, float, complex, bool)):  # a Python number comes back as is
            assert g == w or g != g and w != w, f"{where}: {g!r}, plain JAX gives {w!r}"
            continue
        g_type, w_type = jax.typeof(g), jax.typeof(w)
        assert g_type.dtype == w_type.dtype, f"{where}: dtype {g_type.dtype}, want {w_type.dtype}"
        assert g_type.shape == w_type.shape, f"{where}: shape {g_type.shape}, want {w_type.shape}"
        assert g_type.weak_type == w_type.weak_type, f"{where}: weak_type {g_type.weak_type}"
        assert_close(g, w, dtype, where, floor)


def typical_size(tree) -> float:
    """The root-mean-square of every float element of ``tree``."""
    floats = [f64(x).ravel() for x in jax.tree.leaves(tree)
              if isinstance(x, (jax.Array, np.ndarray, np.generic)) and is_float(x)]
    return float(np.sqrt(np.mean(np.concatenate(floats) ** 2))) if floats else 0.0


def is_float(x) -> bool:
    return jnp.issubdtype(jax.typeof(x).dtype, jnp.inexact)


def assert_close(got, want, dtype, where="the value", floor=0.0):
    """Norm-wise relative error within ``dtype``'s tolerance, as if ``want`` were at least
    ``floor`` in size (root-mean-square), and no element off by more than ``MAX_FACTOR``
    tolerances of the leaf's largest value."""
    if jnp.issubdtype(jax.typeof(want).dtype, jax.dtypes.prng_key):
        got, want = jax.random.key_data(got), jax.random.key_data(want)
    if not is_float(want):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=where)
        return
    got, want = f64(got), f64(want)
    finite = np.isfinite(want)
    assert np.array_equal(np.isfinite(got), finite), f"{where}: non-finite values differ"
    diff = np.where(finite, got - want, 0.0)
    want = np.where(finite, want, 0.0)
    tol = tolerance(dtype)
    size = max(float(np.linalg.norm(want)), floor * np.sqrt(want.size), 1e-30)
    err = float(np.linalg.norm(diff)) / size
    assert err <= tol, f"{where}: norm-wise relative error {err:.2e} > {tol:.0e}"
    largest = max(float(np.max(np.abs(want), initial=0.0)), floor, 1e-30)
    worst = float(np.max(np.abs(diff), initial=0.0)) / largest
    assert worst <= MAX_FACTOR * tol, (
        f"{where}: an element is off by {worst:.2e} of the leaf's largest value "
        f"(> {MAX_FACTOR} x {tol:.0e})")


def matmul_count(jaxpr, names) -> int:
    """Equations whose primitive is one of ``names`` (a tuple) in a jaxpr and every jaxpr
    nested in it: ``dot_general`` for plain JAX's matmuls, autotune's own for the tuned."""
    return sum(eqn.primitive.name in names for eqn in equations(jaxpr))


def f64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)  # numpy casts bf16 and float8 too (ml_dtypes)


# ---------------------------------------------------------------------------------- inputs


def rng_for(*names) -> np.random.Generator:
    """A generator seeded by a name: each program draws its own data, the same every run."""
    return np.random.default_rng(zlib.crc32("/".join(map(str, names)).encode()))


def normal(rng: np.random.Generator, *shape, scale=1.0) -> jax.Array:
    return jnp.asarray(rng.standard_normal(shape) * scale, jnp.float32)


def tokens(rng: np.random.Generator, *shape, vocab) -> jax.Array:
    """Random int32 token ids over the whole vocabulary."""
    return jnp.asarray(rng.integers(0, vocab, shape), jnp.int32)


def cast_floats(tree, dtype):
    """Every float leaf of ``tree`` as ``dtype``; integer leaves (tokens, labels) and PRNG
    keys as they are. Arrays at hand are cast by numpy: a cast by JAX compiles a program for
    each shape, and the suite casts a few hundred."""
    def cast(x):
        if not jnp.issubdtype(jax.typeof(x).dtype, jnp.floating):
            return x
        if isinstance(x, jax.core.Tracer):
            return x.astype(dtype)
        return jnp.asarray(np.asarray(x).astype(jnp.dtype(dtype)))
    return jax.tree.map(cast, tree)


def in_mode(params, batch, mode: Mode):
    """Parameters and batch as ``mode`` stores them."""
    return cast_floats(params, mode.param_dtype), cast_floats(batch, mode.compute_dtype)


def loss_in_mode(loss, mode: Mode):
    """``loss`` as a user writes it for ``mode``: f32 master weights cast inside, or as is."""
    if not mode.cast_inside:
        return loss

    def master_weight_loss(params, batch):
        return loss(cast_floats(params, mode.compute_dtype), batch)
    return master_weight_loss


# -------------------------------------------------------------------------------- training

STEPS = 3


def compiler_options() -> dict:
    """Options for every program the suite compiles, plain and autotuned alike. On the CPU,
    LLVM's optimisation and the MLIR fusion emitters are most of the time it takes to compile
    a small training step (2.9 s for the ViT's, 0.4 s without), and the suite compiles about a
    hundred: they compile at -O0 with the classic emitters. XLA's HLO passes, fusion
    included, run as always, and both programs of a comparison are built the same way.
    Elsewhere (a GPU run at real sizes), the defaults."""
    if jax.default_backend() != "cpu":
        return {}
    return {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


def optimizer(mode: Mode):
    """AdamW where the gradients are float32; SGD with momentum where they are computed in
    16 bits. Adam divides each gradient by its own size, so a gradient that is rounding noise
    in both programs (one that is zero by the model's symmetry: a key projection's bias) makes
    a step as large as any, whose sign is the noise's. In float32 an ``eps`` of 1e-3 (optax:
    1e-8; gradients here are 1e-2 to 1) keeps such steps small; 16-bit noise is too large for
    that, and parts two correct programs within three steps. SGD is linear in the gradients:
    three steps differ by what the gradients differ."""
    rate = size().learning_rate  # at real sizes the small models' rates raise plain JAX's loss
    if jnp.dtype(mode.compute_dtype) == jnp.float32:
        return optax.adamw(learning_rate=0.1 * rate, eps=1e-3, weight_decay=1e-2)
    return optax.sgd(learning_rate=rate, momentum=0.9)


def initial_state(mode_name: str, params):
    """The optimizer's state before the first step: compiled once per mode and params."""
    return _init(mode_name)(params)


@functools.cache
def _init(mode_name: str):
    return jax.jit(optimizer(MODES[mode_name]).init, compiler_options=compiler_options())


def train(loss, params, batch, mode: Mode, *, tuned: bool):
    """``STEPS`` steps of a jitted training step whose loss and gradients are
    ``jax.value_and_grad(jat.autotune(loss))`` when ``tuned``, else plain JAX's. Returns
    [(loss, grads) of each step], the params and optimizer state after the last, and the
    step's jaxpr."""
    tx = optimizer(mode)

    @functools.partial(jax.jit, compiler_options=compiler_options())
    def step(params, opt_state, batch):
        fn = jat.autotune(loss) if tuned else loss
        value, grads = jax.value_and_grad(fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value, grads

    opt_state = initial_state(mode.name, params)
    jaxpr = step.trace(params, opt_state, batch).jaxpr
    history = []
    for _ in range(STEPS):
        params, opt_state, value, grads = step(params, opt_state, batch)
        history.append((value, grads))
    return history, params, opt_state, jaxpr
