"""autotune(f) is f, as plain JAX runs it, under every transformation a user puts around it:
gradients in every float dtype (bfloat16, float16, float8, mixed pytrees), PRNG keys among
the inputs, jax.linearize, nested grads closing over traced values, module state written
inside (flax nnx), remat policies, the settings a trace depends on, static arguments by
exact value, and outputs of the types f returns."""

import io
import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import print_saved_residuals

import jax_autotune as jat
from jax_autotune import config
from numerics import assert_same_tree, rand


@pytest.fixture(autouse=True)
def quick(fresh_tuning):
    config.update("budget_seconds", 0.05)
    yield


def lm_loss(p, tok):
    return jnp.mean((p["emb"][tok] @ p["head"]).astype(jnp.float32) ** 2)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_gradients_keep_the_parameters_dtype_under_every_reverse_mode_entry(dtype):
    p = {"emb": rand(0, 101, 64, dtype=dtype) * 0.3, "head": rand(1, 64, 101, dtype=dtype) * 0.3}
    tok = jnp.asarray(np.random.default_rng(2).integers(0, 101, (16,)))
    tuned = jat.autotune(lm_loss)
    assert_same_tree(jax.grad(tuned)(p, tok), jax.grad(lm_loss)(p, tok))
    assert_same_tree(jax.value_and_grad(tuned)(p, tok), jax.value_and_grad(lm_loss)(p, tok))
    assert_same_tree(jax.vjp(tuned, p, tok)[1](jnp.float32(1.0)), jax.vjp(lm_loss, p, tok)[1](jnp.float32(1.0)))
    assert_same_tree(jax.jacrev(tuned)(p, tok), jax.jacrev(lm_loss)(p, tok))
    aux = lambda f: lambda p, tok: (f(p, tok), {"n": tok.shape[0]})  # noqa: E731
    assert_same_tree(jax.grad(aux(tuned), has_aux=True)(p, tok), jax.grad(aux(lm_loss), has_aux=True)(p, tok))
    two = lambda f: lambda e, h, tok: f({"emb": e, "head": h}, tok)  # noqa: E731
    assert_same_tree(jax.grad(two(tuned), argnums=(0, 1))(p["emb"], p["head"], tok),
                jax.grad(two(lm_loss), argnums=(0, 1))(p["emb"], p["head"], tok))


def test_float8_and_mixed_float_leaves_get_gradients_of_their_own_dtype():
    q = {"a": rand(0, 8, 16, dtype="float8_e4m3fn"), "b": rand(1, 16, 8, dtype="float16"), "c": rand(2, 8, 8, dtype="bfloat16")}
    loss = lambda q: ((q["a"].astype(jnp.float16) @ q["b"]).astype(jnp.bfloat16) * q["c"]).astype(jnp.float32).sum()  # noqa: E731
    assert_same_tree(jax.grad(jat.autotune(loss))(q), jax.grad(loss)(q))
    grads = jax.grad(jat.autotune(loss))(q)
    assert {k: v.dtype.name for k, v in grads.items()} == {"a": "float8_e4m3fn", "b": "float16", "c": "bfloat16"}


def test_linearize_gives_plain_values_and_tangents():
    x, w = rand(0, 8, 16), rand(1, 16, 8)
    f = lambda x, w: jnp.tanh(x @ w).sum()  # noqa: E731
    y, lin = jax.linearize(jat.autotune(f), x, w)
    y0, lin0 = jax.linearize(f, x, w)
    assert_same_tree((y, lin(x, w)), (y0, lin0(x, w)))


def test_typed_prng_keys_among_the_inputs_get_float0_cotangents():
    x, w, key = rand(0, 8, 16), rand(1, 16, 8), jax.random.key(3)
    f = lambda x, w, k: (x @ w * jax.random.normal(k, (8, 8))).sum()  # noqa: E731
    assert_same_tree(jax.grad(jat.autotune(f), argnums=(0, 1))(x, w, key), jax.grad(f, argnums=(0, 1))(x, w, key))
    assert_same_tree(jax.vjp(jat.autotune(f), x, w, key)[1](1.0), jax.vjp(f, x, w, key)[1](1.0))


def test_an_inner_grad_closing_over_an_outer_grads_value_is_differentiated():
    x = rand(0, 8, 16)

    def outer(wrap, w):
        inner = wrap(lambda x: jnp.tanh(x @ w).sum())
        return jax.grad(inner)(x).sum()

    w = rand(1, 16, 8)
    assert_same_tree(jax.grad(lambda w: outer(jat.autotune, w))(w), jax.grad(lambda w: outer(lambda f: f, w))(w))
    assert_same_tree(jax.jit(jax.grad(lambda w: outer(jat.autotune, w)))(w), jax.grad(lambda w: outer(lambda f: f, w))(w))


def test_the_trace_cache_follows_x64_and_the_default_matmul_precision():
    plain = lambda x: x.astype(float) * 2  # noqa: E731 - float is float64 under x64
    f, x = jat.autotune(plain), jnp.ones(3, jnp.float32)
    assert f(x).dtype == plain(x).dtype == np.float32
    with jax.enable_x64(True):
        assert f(x).dtype == plain(x).dtype == np.float64
    assert f(x).dtype == np.float32
    g = jat.autotune(lambda a, b: a @ b)
    a, b = rand(0, 4, 4), rand(1, 4, 4)
    with jax.default_matmul_precision("highest"):
        assert "HIGHEST" in str(jax.make_jaxpr(g)(a, b)).upper()
    assert "HIGHEST" not in str(jax.make_jaxpr(g)(a, b)).upper()


def test_static_numbers_are_told_apart_by_type_and_exact_value():
    f = jat.autotune(lambda x, s: x * (-1.0 if str(s).startswith("-") else 1.0) + (10.0 if s is True else 0.0))
    x = rand(0, 3)
    np.testing.assert_array_equal(f(x, 0.0), x)
    np.testing.assert_array_equal(f(x, -0.0), -x)
    np.testing.assert_array_equal(f(x, 1), x)
    np.testing.assert_array_equal(f(x, True), x + 10.0)
    nan = float("nan")
    np.testing.assert_array_equal(f(x, nan), f(x, nan))


def test_outputs_come_back_as_the_types_f_returns():
    w = rand(1, 16, 8)
    f = lambda x: (x @ w, 1.5, np.float64(2.5), 2 ** 40, "name", None, True)  # noqa: E731
    got, want = jat.autotune(f)(rand(0, 8, 16)), f(rand(0, 8, 16))
    assert [type(v) for v in got[1:]] == [type(v) for v in want[1:]] and got[1:] == want[1:]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)


def saved_residuals(fn, *args):
    """(dtype, element count) of each residual the backward pass keeps, sorted (a tuned
    matmul's output is its canonical (batch, m, n) shape)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_saved_residuals(fn, *args)
    sizes = []
    for line in out.getvalue().splitlines():
        dtype, dims = line.split(" ")[0].rstrip("]").split("[")
        sizes.append((dtype, int(np.prod([int(d) for d in dims.split(",") if d]))))
    return sorted(sizes)


@pytest.mark.parametrize("context", ["full", "forward"])
@pytest.mark.parametrize("policy", ["dots_saveable", "dots_with_no_batch_dims_saveable"])
def test_remat_policies_save_the_tuned_matmuls_as_they_save_lax_dots(context, policy):
    config.update("context", context)
    x, w = rand(0, 8, 16), rand(1, 16, 16)
    f = lambda x, w: jnp.sin(jnp.tanh(x @ w) @ w.T).sum()  # noqa: E731
    rule = getattr(jax.checkpoint_policies, policy)
    want = saved_residuals(jax.checkpoint(f, policy=rule), x, w)
    assert len(want) == 4  # the two inputs and the two dots' outputs
    assert saved_residuals(jax.checkpoint(jat.autotune(f), policy=rule), x, w) == want
    assert saved_residuals(jat.autotune(jax.checkpoint(f, policy=rule)), x, w) == want
    assert_same_tree(jax.grad(jax.checkpoint(jat.autotune(f), policy=rule))(x, w),
                jax.grad(jax.checkpoint(f, policy=rule))(x, w))


def test_nnx_module_state_written_inside_is_carried_back_as_nnx_jit_does():
    nnx = pytest.importorskip("flax.nnx")
    optax = pytest.importorskip("optax")

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.l1, self.bn = nnx.Linear(16, 32, rngs=rngs), nnx.BatchNorm(32, rngs=rngs)
            self.drop, self.l2 = nnx.Dropout(0.3, rngs=rngs), nnx.Linear(32, 4, rngs=rngs)

        def __call__(self, x):
            return self.l2(self.drop(jax.nn.relu(self.bn(self.l1(x)))))

    x = rand(0, 8, 16)
    loss = lambda m, x: jnp.mean(m(x) ** 2)  # noqa: E731

    def train(wrap):
        m = Net(nnx.Rngs(0, dropout=1))
        out = wrap(lambda m, x: m(x))(m, x)  # eagerly: statistics and one dropout mask drawn
        opt = nnx.Optimizer(m, optax.adam(1e-2), wrt=nnx.Param)

        @nnx.jit
        def step(m, opt, x):
            value, grads = nnx.value_and_grad(wrap(loss))(m, x)
            opt.update(m, grads)
            return value

        losses = [step(m, opt, x) for _ in range(3)]
        returned = wrap(lambda m, x: m)(m, x)
        return out, losses, nnx.state(m), returned is m

    tuned, plain = train(jat.autotune), train(lambda f: f)
    assert tuned[3] and plain[3]  # a module fn returns is the caller's module
    assert int(tuned[2]["drop"]["rngs"]["count"][...]) == int(plain[2]["drop"]["rngs"]["count"][...]) == 4
    assert float(jnp.abs(tuned[2]["bn"]["mean"][...]).sum()) > 0
    assert_same_tree(tuned[:2], plain[:2])
    assert_same_tree(tuned[2], plain[2])
