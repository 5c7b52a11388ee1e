"""A matmul's context: which equations after a dot form its epilogue, and what autotune makes of it.

The capture (``jax_autotune.context``) is checked on the jaxprs models produce; the rewrite
(``jat.autotune``) gives the plain program's values and gradients, forward and backward,
with each dot bound in its context.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jax_autotune as jat
from jax_autotune.context import canonical_operand, dot_labels, regions
from jax_autotune.primitive import fused_p, matmul_p
from jax_autotune.jaxprs import equations
import numerics

F32 = dict(rtol=2e-5, atol=2e-5)


rand = functools.partial(numerics.rand, scale=0.5)  # activations stay in their sensitive range


def captured(fn, *args):
    """{dot index: region} of fn's jaxpr, and the jaxpr."""
    jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
    heads = {i: dot_labels(e.params["dimension_numbers"], *(v.aval.ndim for v in e.invars))
             for i, e in enumerate(jaxpr.eqns) if e.primitive.name == "dot_general"}
    return regions(jaxpr, heads), jaxpr


def only_region(fn, *args):
    found, _ = captured(fn, *args)
    assert len(found) == 1
    return next(iter(found.values()))


def tuned_keys(fn, *args):
    return [e.params["key"] for e in equations(jax.make_jaxpr(fn)(*args))
            if e.primitive in (matmul_p, fused_p)]


X, W, B, R = rand(0, 2, 8, 4), rand(1, 4, 16), rand(2, 16), rand(3, 2, 8, 16)


# ---------------------------------------------------------------- what the capture takes

def test_bias_and_residual_are_a_row_and_a_full_operand():
    region = only_region(lambda x, w, b, r: x @ w + b + r, X, W, B, R)
    assert str(region.epilogue) == "row:float32,full:float32|add(y,$0);add(%0,$1)"
    assert [u.role for u in region.operands] == ["row", "full"]


def test_operand_order_in_a_commutative_op_does_not_change_the_key():
    one = only_region(lambda x, w, b: x @ w + b, X, W, B).epilogue
    other = only_region(lambda x, w, b: b + x @ w, X, W, B).epilogue
    assert one == other


def test_jax_nn_relu_is_one_op_and_jitted_helpers_are_inlined():
    assert str(only_region(lambda x, w, b: jax.nn.relu(x @ w + b), X, W, B).epilogue) == \
        "row:float32|add(y,$0);relu(%0)"
    assert only_region(lambda x, w: jax.nn.silu(x @ w), X, W).epilogue.describe() == "logistic(y) > mul(y)"


def test_a_gate_from_another_dot_is_an_operand_of_the_first_dots_context():
    found, _ = captured(lambda x, w, v: jax.nn.silu(x @ w) * (x @ v), X, W, W)
    assert len(found) == 1
    (region,) = found.values()
    assert region.epilogue.describe() == "logistic(y) > mul(y) > mul(full)"


def test_a_logsumexp_is_taken_whole_with_both_reductions():
    region = only_region(lambda x, w: jax.nn.logsumexp((x @ w).astype(jnp.float32), axis=-1), X, W)
    assert region.epilogue.reduces and region.epilogue.out_class == "reduced"
    assert region.output.aval.shape == (2, 8)
    assert [o.name for o in region.epilogue.ops].count("reduce_sum") == 1


def test_a_sum_of_squares_ends_in_a_total_and_a_loss_tail_ends_there():
    region = only_region(lambda x, w: jnp.mean(jnp.square(x @ w)), X, W)
    assert region.epilogue.out_class == "total"
    assert [o.name for o in region.epilogue.ops] == ["square", "reduce_sum", "div"]  # the mean, on the scalar


def test_a_flax_dense_bias_through_its_reshape_is_a_row():
    dense = nn.Dense(16)
    params = dense.init(jax.random.key(0), X)
    region = only_region(lambda p, x, r: dense.apply(p, x) + r, params, X, R)
    assert [u.role for u in region.operands] == ["row", "full"]


def product_and_tanh(x, w):
    y = x @ w
    return y, jnp.tanh(y)  # the product is an output too


def tanh_and_cumsum(x, w):
    y = x @ w
    return jnp.tanh(y) + jnp.cumsum(y, axis=-1)  # read by an op that is not an epilogue op


@pytest.mark.parametrize("fn", [
    product_and_tanh, tanh_and_cumsum,
    lambda x, w: jnp.cumsum(x @ w, axis=-1),
    lambda x, w: (x @ w).reshape(2, 8, 4, 4) * 2.0,               # a reshape that splits n
])
def test_a_product_read_outside_an_epilogue_has_no_context(fn):
    found, _ = captured(fn, X, W)
    assert all(r.epilogue.is_bare and not r.swap for r in found.values()) or not found


def test_an_intermediate_read_afterwards_ends_the_context_before_it():
    def fn(x, w, b):
        h = x @ w + b
        return jnp.tanh(h), h  # h escapes: the context is the bias add alone
    assert str(only_region(fn, X, W, B).epilogue) == "row:float32|add(y,$0)"


def test_a_transpose_after_the_dot_is_the_dot_with_its_operands_swapped():
    region = only_region(lambda x, w: (x[0] @ w).T.astype(jnp.bfloat16), X, W)
    assert region.swap and region.epilogue.describe() == "convert_element_type(y,bfloat16)"


def test_a_context_does_not_end_with_a_widening_convert():
    """The wide value is left to XLA, which fuses the convert into its readers."""
    xb, wb, bb = (a.astype(jnp.bfloat16) for a in (X, W, B))

    def loss(x, w, b):
        logits = (x @ w + b).astype(jnp.float32)
        return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[..., 0])

    region = only_region(loss, xb, wb, bb)
    assert region.epilogue.describe() == "add(y,row)"  # a logits head: bf16 out, f32 loss outside
    found, _ = captured(lambda x, w: (x @ w).astype(jnp.float32), xb, wb)
    assert not found  # a convert alone is no context
    kept = only_region(lambda x, w: jnp.tanh((x @ w).astype(jnp.float32)).astype(jnp.bfloat16), xb, wb)
    assert kept.epilogue.describe() == "convert_element_type(y,float32) > tanh > convert_element_type(bfloat16)"


def test_each_equation_joins_one_context():
    found, _ = captured(lambda x, w, v: jnp.tanh((x @ w) + (x @ v)), X, W, W)
    members = [m for r in found.values() for m in r.members]
    assert len(members) == len(set(members)) and len(found) == 1


def test_a_canonical_operand_takes_the_roles_shape():
    region = only_region(lambda x, w, b, r: x @ w + b + r, X, W, B, R)
    row, full = region.operands
    assert canonical_operand(jnp.broadcast_to(B, (1, 1, 16)), row, 1, 16, 16).shape == (16,)
    assert canonical_operand(R, full, 1, 16, 16).shape == (1, 16, 16)


# ---------------------------------------------------------------- what autotune makes of it

def mlp(params, x):
    for w, b in params[:-1]:
        x = x + jax.nn.gelu(x @ w + b)  # a residual stream
    w, b = params[-1]
    return jax.nn.logsumexp((x @ w + b).astype(jnp.float32), axis=-1)


PARAMS = [(rand(10 + i, 16, 16), rand(20 + i, 16)) for i in range(2)] + [(rand(30, 16, 24), rand(31, 24))]
XS = rand(40, 6, 16)


def loss(params, x):
    return jnp.sum(mlp(params, x) ** 2)


def test_autotune_gives_the_plain_programs_values_with_the_dots_in_context(fresh_tuning):
    np.testing.assert_allclose(jax.jit(jat.autotune(mlp))(PARAMS, XS), mlp(PARAMS, XS), **F32)
    keys = tuned_keys(jat.autotune(mlp), PARAMS, XS)
    assert len(keys) == 3 and all(not k.epilogue.is_bare for k in keys)


def test_grad_of_autotune_is_jaxs_gradient_and_the_backward_dots_have_contexts(fresh_tuning):
    got = jax.jit(jax.grad(jat.autotune(loss)))(PARAMS, XS)
    want = jax.grad(loss)(PARAMS, XS)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g, w, **F32)
    keys = tuned_keys(jax.grad(jat.autotune(loss), argnums=(0, 1)), PARAMS, XS)
    backward = [k for k in keys if "add(" in k.epilogue.describe() and "full" in k.epilogue.describe()]
    assert backward, "the input gradients' adds into the residual stream's gradient"


XS3 = rand(41, 3, 6, 16)


def vmapped_sum(f):
    return lambda p, x: jnp.sum(jax.vmap(f, in_axes=(None, 0))(p, x))


COMPOSITIONS = {  # name: (tuned, plain, argument)
    "jit(grad(autotune(f)))": (lambda: jax.jit(jax.grad(jat.autotune(loss))), lambda: jax.grad(loss), XS),
    "autotune(grad(f))": (lambda: jat.autotune(jax.grad(loss)), lambda: jax.grad(loss), XS),
    "grad(jit(autotune(f)))": (lambda: jax.grad(jax.jit(jat.autotune(loss))), lambda: jax.grad(loss), XS),
    "vmap(grad(autotune(f)))": (lambda: jax.vmap(jax.grad(jat.autotune(loss)), in_axes=(None, 0)),
                                lambda: jax.vmap(jax.grad(loss), in_axes=(None, 0)), XS3),
    "grad(vmap(autotune(f)))": (lambda: jax.grad(vmapped_sum(jat.autotune(loss))),
                                lambda: jax.grad(vmapped_sum(loss)), XS3),
    "grad(grad(autotune(f)))": (lambda: jax.grad(lambda p, x: jnp.sum(jax.grad(jat.autotune(loss), 1)(p, x))),
                                lambda: jax.grad(lambda p, x: jnp.sum(jax.grad(loss, 1)(p, x))), XS),
}


@pytest.mark.parametrize("name", list(COMPOSITIONS))
def test_every_composition_of_grad_gives_jaxs_gradient(fresh_tuning, name):
    tuned, plain, x = COMPOSITIONS[name]
    got, want = tuned()(PARAMS, x), plain()(PARAMS, x)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g, w, rtol=5e-5, atol=5e-5)


def test_forward_mode_and_the_hessian_still_work(fresh_tuning):
    tangent = jax.tree_util.tree_map(jnp.ones_like, PARAMS)
    got = jax.jvp(lambda p: jat.autotune(loss)(p, XS), (PARAMS,), (tangent,))
    want = jax.jvp(lambda p: loss(p, XS), (PARAMS,), (tangent,))
    np.testing.assert_allclose(got[1], want[1], rtol=5e-5)
    small = lambda x: jnp.sum(jax.nn.gelu(x @ PARAMS[0][0] + PARAMS[0][1]))  # noqa: E731
    np.testing.assert_allclose(jax.hessian(jat.autotune(small))(XS[0]), jax.hessian(small)(XS[0]), **F32)


def test_integer_inputs_and_outputs_pass_through_the_tuned_backward(fresh_tuning):
    def ce(params, tokens):
        logits = params[0][0][tokens] @ params[-1][0] + params[-1][1]
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, ::-1]).mean()
    tokens = jnp.asarray(np.arange(12).reshape(3, 4) % 16, jnp.int32)
    got = jax.grad(jat.autotune(ce))(PARAMS, tokens)
    want = jax.grad(ce)(PARAMS, tokens)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g, w, **F32)


def test_matmul_and_dot_general_callers_get_the_bare_key(fresh_tuning):
    keys = tuned_keys(lambda x, w, b: jax.nn.gelu(jat.matmul(x, w) + b), X, W, B)
    assert len(keys) == 1 and keys[0].epilogue.is_bare


def test_warmup_of_an_autotuned_function_tunes_its_context_keys(fresh_tuning):
    report = jat.warmup(jat.autotune(loss), PARAMS, XS, grad=True)
    assert report and any(not e.key.epilogue.is_bare for e in report)
    before = jat.stats()["tuned"]
    jax.jit(jax.grad(jat.autotune(loss))).lower(PARAMS, XS).compile()
    assert jat.stats()["tuned"] == before


# ---------------------------------------------------------------- constants in keys

def scaled(scale):
    return lambda x, w: jnp.tanh(x @ w) * scale


def test_a_float_literal_enters_the_key_as_a_scalar_operand_and_its_value_at_run_time(fresh_tuning):
    (one,), (other,) = tuned_keys(jat.autotune(scaled(10.0)), X, W), tuned_keys(jat.autotune(scaled(12.5)), X, W)
    assert one == other and str(one.epilogue) == "scalar:float32|tanh(y);mul(%0,$0)"
    for scale in (10.0, 12.5, -0.0):
        np.testing.assert_allclose(jax.jit(jat.autotune(scaled(scale)))(X, W), scaled(scale)(X, W), **F32)


def test_a_changed_scalar_hyperparameter_tunes_nothing_new(fresh_tuning):
    jat.warmup(jat.autotune(scaled(10.0)), X, W)
    before = jat.stats()["tuned"]
    for scale in (12.5, 3.0):
        jax.jit(jat.autotune(scaled(scale))).lower(X, W).compile()
    assert before >= 1 and jat.stats()["tuned"] == before


def test_an_eager_python_scalar_and_a_jitted_one_are_one_key(fresh_tuning):
    def f(x, w, scale):
        return jnp.tanh(x @ w) * scale
    eager = tuned_keys(lambda x, w: jat.autotune(f)(x, w, 3.0), X, W)
    jitted = tuned_keys(jat.autotune(f), X, W, 3.0)  # the scale a (weak) traced scalar
    assert eager == jitted and len(eager) == 1


def test_the_literals_a_kernel_takes_by_value_stay_values(fresh_tuning):
    """cuBLASLt's GELU is jax.nn.gelu's constants: that epilogue keeps them."""
    (key,) = tuned_keys(jat.autotune(lambda x, w, b: jax.nn.gelu(x @ w + b)), X, W, B)
    assert key.epilogue.operands[0].role == "row" and len(key.epilogue.operands) == 1
    assert "0.044714998" in str(key.epilogue)
    bf16 = [jnp.asarray(a, jnp.bfloat16) for a in (X, W)]
    (key,) = tuned_keys(jat.autotune(lambda x, w: (x @ w) * 0.125), *bf16)  # a bf16 literal
    assert str(key.epilogue) == "scalar:bfloat16|mul(y,$0)"
    np.testing.assert_allclose(np.float32(jax.jit(jat.autotune(lambda x, w: (x @ w) * 0.125))(*bf16)),
                               np.float32((bf16[0] @ bf16[1]) * 0.125), rtol=1e-2, atol=1e-2)


# ---------------------------------------------------------------- warmup tunes what a step compiles

def test_warmup_with_grad_tunes_exactly_the_keys_the_training_step_compiles(fresh_tuning):
    """Not the forward-alone keys: under autodiff the values the backward keeps end contexts."""
    from jax_autotune.tuning.tuner import record_decisions

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.LayerNorm()(jax.nn.gelu(nn.Dense(24)(x)))
            h = jax.nn.softmax(jnp.einsum("btd,bsd->bts", h, h) / 8.0) @ h
            return nn.Dense(10)(nn.Dense(16)(h) + x)

    model, x = Block(), rand(50, 4, 9, 16)
    params = model.init(jax.random.PRNGKey(0), x)
    labels = jnp.asarray(np.arange(36).reshape(4, 9) % 10, jnp.int32)

    def ce(p, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()

    step = jat.autotune(ce)
    # compare=False: the program check compiles the step, and JAX reuses its lowerings
    warmed = {e.key for e in jat.warmup(step, params, x, labels, grad=True, compare=False)}
    tuned = jat.stats()["tuned"]
    for train in (jax.value_and_grad(step), jax.grad(step)):
        with record_decisions() as asked:
            jax.jit(train).lower(params, x, labels).compile()
        assert {d.key for d in asked} == warmed
    assert jat.stats()["tuned"] == tuned == len(warmed)


def test_warmup_tunes_no_key_of_dead_code_in_nested_jits_and_scans(fresh_tuning):
    """jit drops what no output reads, nested too: warmup finds exactly the live keys."""
    @jax.jit
    def inner(x, w):
        unused = jnp.tanh(x @ w.T @ w)  # noqa: F841 - dead: jit drops it
        return x @ w

    def through_jit(x, w):
        return jnp.sum(inner(x, w))

    def through_scan(x, w):
        y, _ = jax.lax.scan(lambda c, _: (c @ w, jnp.tanh(c @ w.T)), x, None, length=2)
        return jnp.sum(y)

    x, w = rand(60, 8, 16), rand(61, 16, 16)
    for fn in (through_jit, through_scan):
        report = jat.warmup(jat.autotune(fn), x, w, compare=False)
        assert len(report) == 1 and report.entries[0].key.epilogue.is_bare
