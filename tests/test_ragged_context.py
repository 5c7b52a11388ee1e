"""A grouped matmul in its context: jat.autotune binds a ragged m with the elementwise ops
after it (a SwiGLU's silu(gate) * up, a bias, a convert) as one op whose key holds them;
values, gradients and vmap as lax's; the tuner checks the context on every split, the rows
in no group included."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_autotune as jat
from fakes import CPU
from jax_autotune.epilogue import Epilogue
from jax_autotune.kernels import ragged as kernels
from jax_autotune.problem import MatmulProblem
from jax_autotune.splits import representative_splits
from jax_autotune.tuning.correctness import check, reference
from jax_autotune.tuning.timing import random_operands
from numerics import rel_error, tolerance

SIZES = jnp.array([100, 0, 60, 70], jnp.int32)  # 256 rows: group 1 empty, 26 rows in no group


def _params(dtype, m=256, d=64, f=96, groups=4):
    k = jax.random.split(jax.random.key(0), 4)
    return (jax.random.normal(k[0], (m, d), jnp.float32).astype(dtype),
            (jax.random.normal(k[1], (groups, d, f), jnp.float32) / 8).astype(dtype),
            (jax.random.normal(k[2], (groups, d, f), jnp.float32) / 8).astype(dtype),
            jax.random.normal(k[3], (f,), jnp.float32).astype(dtype))


def swiglu(x, w_gate, w_up, bias):
    gate = lax.ragged_dot(x, w_gate, SIZES)
    up = lax.ragged_dot(x, w_up, SIZES) + bias
    return jax.nn.silu(gate) * up


def _contexts(fn, *args) -> list[str]:
    jaxpr = jax.make_jaxpr(jat.autotune(fn))(*args)
    return [str(e.params["problem"].epilogue) for e in jaxpr.eqns
            if e.primitive.name == "autotuned_ragged_dot_epilogue"]


def test_autotune_binds_the_swiglu_and_the_bias_as_grouped_contexts():
    contexts = _contexts(swiglu, *_params(jnp.float32))
    assert contexts == ["row:float32|add(y,$0)", "full:float32|logistic(y);mul(y,%0);mul(%1,$0)"]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_values_and_gradients_are_lax_s_the_rows_in_no_group_included(fresh_tuning, dtype):
    args = _params(dtype)
    want = jax.jit(swiglu)(*args)
    got = jax.jit(jat.autotune(swiglu))(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert rel_error(got, want) <= tolerance(dtype)
    # rows 230.. are in no group: lax gives silu(0) * (0 + bias) = 0, exactly
    np.testing.assert_array_equal(np.asarray(got[230:], np.float32), 0)
    loss = lambda fn: lambda *a: jnp.sum(fn(*a).astype(jnp.float32) ** 2)  # noqa: E731
    grads = jax.jit(jax.grad(loss(jat.autotune(swiglu)), (0, 1, 2, 3)))(*args)
    plain = jax.jit(jax.grad(loss(swiglu), (0, 1, 2, 3)))(*args)
    for name, g, p in zip(("x", "w_gate", "w_up", "bias"), grads, plain):
        assert g.dtype == p.dtype and rel_error(g, p) <= 4 * tolerance(dtype), name


def test_a_bias_reaches_the_rows_in_no_group_as_lax_gives_it(fresh_tuning):
    x, w, _, bias = _params(jnp.float32)
    fn = lambda x, w, b: (lax.ragged_dot(x, w, SIZES) + b).astype(jnp.bfloat16)  # noqa: E731
    assert _contexts(fn, x, w, bias) == ["row:float32|add(y,$0);convert_element_type{new_dtype=bfloat16}(%0)"]
    got = jax.jit(jat.autotune(fn))(x, w, bias)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got[230:], np.float32),
                                  np.broadcast_to(np.asarray(bias.astype(jnp.bfloat16), np.float32), (26, 96)))
    assert rel_error(got, jax.jit(fn)(x, w, bias)) <= tolerance("bfloat16")


def test_an_eager_call_of_a_grouped_context(fresh_tuning):
    # (vmap: lax's ragged_dot batching rule raises NotImplementedError in these jax releases)
    args = _params(jnp.float32)
    assert rel_error(jat.autotune(swiglu)(*args), swiglu(*args)) <= tolerance("float32")


def test_reductions_and_weight_gradients_stay_bare():
    x, w, _, _ = _params(jnp.float32)
    fn = lambda x, w: jnp.sum(lax.ragged_dot(x, w, SIZES), axis=1)  # noqa: E731
    assert _contexts(fn, x, w) == []
    with pytest.raises(ValueError, match="epilogue only when elementwise"):
        MatmulProblem(1, 64, 32, 16, "float32", "float32", "float32", groups=4, ragged="m",
                      epilogue=Epilogue.parse("|reduce_sum{axes=n}(y)"))
    with pytest.raises(ValueError, match="epilogue only when elementwise"):
        MatmulProblem(1, 64, 32, 16, "float32", "float32", "float32", transpose_a=True, groups=4, ragged="k",
                      epilogue=Epilogue.parse("row:float32|add(y,$0)"))


def test_the_gate_checks_a_context_on_every_split_the_rows_in_no_group_included():
    problem = MatmulProblem(1, 64, 24, 16, "float32", "float32", "float32", groups=4, ragged="m",
                            epilogue=Epilogue.parse("row:float32,col:float32|add(y,$0);mul(%0,$1)"))
    assert [s for s, _ in problem.input_specs()] == [(64, 16), (4, 16, 24), (2, 4), (24,), (64,)]
    x, w, splits, row, col = random_operands(problem, jax.devices()[0])
    np.testing.assert_array_equal(np.asarray(splits), representative_splits(64, 4))
    ref = reference(problem, x, w, splits, row, col)
    for candidate in kernels.ragged_candidate_set(CPU).candidates:
        if candidate.runs(CPU, problem.key()):
            out = jax.jit(candidate.bound(problem))(x, w, splits, row, col)
            assert out.shape == (2, 64, 24) and check(out, ref, problem, "cpu").ok, candidate.name
    good = kernels.XLA_RAGGED_DOT.bound(problem)(x, w, splits, row, col)
    # the skewed split leaves its last 8 rows in no group: there the result is row * col, not 0
    assert np.any(np.asarray(good[1, 56:]))
    assert not check(good.at[1, 56:].set(0.0), ref, problem, "cpu").ok


def test_warmup_tunes_the_grouped_contexts_so_a_compile_under_require_tunes_nothing(fresh_tuning):
    from jax_autotune import config
    args = _params(jnp.bfloat16)
    report = jat.warmup(jat.autotune(swiglu), *args, compare=False)
    contexts = {str(e.key.epilogue) for e in report.entries if e.key.groups}
    assert contexts == {"row:bfloat16|add(y,$0)", "full:bfloat16|logistic(y);mul(y,%0);mul(%1,$0)"}
    config.update("mode", "require")
    tuned = jat.stats()["tuned"]
    out = jax.jit(jat.autotune(swiglu))(*args)  # a key warmup missed would raise KeyNotTunedError
    assert jat.stats()["tuned"] == tuned
    assert rel_error(out, jax.jit(swiglu)(*args)) <= tolerance("bfloat16")


def test_an_optax_step_of_a_bf16_moe_on_int_tokens_matches_plain_jax_leaf_by_leaf(fresh_tuning):
    """As users train: bf16 parameters, int token inputs, top-2 routing to SwiGLU experts
    (their up projections in context), jax.grad of jat.autotune(loss), an AdamW step."""
    import optax

    vocab, d, ffn, experts = 50, 32, 48, 4
    k = jax.random.split(jax.random.key(3), 5)
    params = {"embed": jax.random.normal(k[0], (vocab, d)), "router": jax.random.normal(k[1], (d, experts)) / 6,
              "gate": jax.random.normal(k[2], (experts, d, ffn)) / 6, "up": jax.random.normal(k[3], (experts, d, ffn)) / 6,
              "down": jax.random.normal(k[4], (experts, ffn, d)) / 7}
    params = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)
    tokens = jax.random.randint(jax.random.key(4), (40,), 0, vocab)

    def loss(params, tokens):
        x = params["embed"][tokens]
        weights, chosen = lax.top_k(jax.nn.softmax((x @ params["router"]).astype(jnp.float32)), 2)
        flat = chosen.reshape(-1)
        order = jnp.argsort(flat)
        rows = jnp.repeat(x, 2, axis=0)[order]
        sizes = jnp.bincount(flat, length=experts).astype(jnp.int32)
        hidden = jax.nn.silu(lax.ragged_dot(rows, params["gate"], sizes)) * lax.ragged_dot(rows, params["up"], sizes)
        out = jnp.zeros_like(rows).at[order].set(lax.ragged_dot(hidden, params["down"], sizes))
        y = jnp.sum(out.reshape(-1, 2, d).astype(jnp.float32) * weights[..., None], axis=1)
        return jnp.mean((y @ params["embed"].T.astype(jnp.float32)) ** 2)

    assert _contexts(loss, params, tokens) == ["full:bfloat16|logistic(y);mul(y,%0);mul(%1,$0)"]
    optimizer = optax.adamw(1e-2)

    def step(loss_fn):
        @jax.jit
        def run(params, state, tokens):
            value, grads = jax.value_and_grad(loss_fn)(params, tokens)
            updates, state = optimizer.update(grads, state, params)
            return optax.apply_updates(params, updates), value, grads
        return run

    state = optimizer.init(params)
    tuned_params, tuned_loss, tuned_grads = step(jat.autotune(loss))(params, state, tokens)
    plain_params, plain_loss, plain_grads = step(loss)(params, state, tokens)
    assert rel_error(tuned_loss, plain_loss) <= tolerance("bfloat16")
    for name in params:
        assert tuned_params[name].dtype == jnp.bfloat16 and tuned_grads[name].dtype == jnp.bfloat16
        assert rel_error(tuned_grads[name], plain_grads[name]) <= 4 * tolerance("bfloat16"), name
        assert rel_error(tuned_params[name], plain_params[name]) <= tolerance("bfloat16"), name
