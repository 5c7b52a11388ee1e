"""The suite's programs under the other ways users transform a loss, autotuned against plain
JAX: per-example gradients (``jax.vmap`` of ``jax.grad``), autotune around
``jax.value_and_grad``, forward mode (``jax.jvp``, ``jax.linearize``), dropout keyed by a
PRNG key in the batch (typed or raw), float8 weights, metrics returned beside the loss
(``jax.grad(has_aux=True)``, under jit and eagerly), and remat policies, which decide what
the backward pass recomputes."""

import functools

import jax
import jax.numpy as jnp
import pytest

import jax_autotune as jat
from harness import (DOT, FLOAT8_STORAGE, MODES, TUNED, assert_same_tree, compiler_options,
                     in_mode, loss_in_mode, matmul_count, normal, rng_for, size)
from zoo import make_gpt, make_scan_remat, programs
from zoo_layers import next_token_loss


def jit(fn):
    return jax.jit(fn, compiler_options=compiler_options())


def prepared(make, mode):
    """(loss, params, batch) of a program (a name, or a function of the size) in a mode."""
    built = (programs()[make] if isinstance(make, str) else make)(size())
    params, batch = in_mode(built.params, built.batch, mode)
    return loss_in_mode(built.loss, mode), params, batch


def both(transform, loss, *args):
    """``transform(jat.autotune(loss))(*args)`` and ``transform(loss)(*args)``."""
    return transform(jat.autotune(loss))(*args), transform(loss)(*args)


@pytest.mark.parametrize("mode", MODES)
def test_gpt_per_example_grads_under_vmap_match_plain_jax(mode):
    mode = MODES[mode]
    loss, params, batch = prepared("gpt", mode)
    one_each = jax.tree.map(lambda x: x[:, None], batch)  # each example a batch of one

    def per_example(fn):
        return jit(jax.vmap(jax.grad(fn), in_axes=(None, 0)))

    got, want = both(per_example, loss, params, one_each)
    assert jax.tree.leaves(want)[0].shape[0] == size().batch
    assert_same_tree(got, want, mode.compute_dtype)


def test_moe_autotune_around_value_and_grad_matches_plain_jax():
    mode = MODES["bf16"]
    loss, params, batch = prepared("moe", mode)
    got = jit(jat.autotune(jax.value_and_grad(loss)))(params, batch)
    want = jit(jax.value_and_grad(loss))(params, batch)
    assert_same_tree(got, want, mode.compute_dtype)


@pytest.mark.parametrize("transform", ["jvp", "linearize"])
def test_llama_forward_mode_matches_plain_jax(transform):
    mode = MODES["f32"]
    loss, params, batch = prepared("llama", mode)
    rng = rng_for("tangent")
    tangent = jax.tree.map(lambda p: normal(rng, *p.shape).astype(p.dtype), params)

    def forward(fn):
        def of_params(p):
            return fn(p, batch)

        def linearized(p, t):
            out, f_jvp = jax.linearize(of_params, p)
            return out, f_jvp(t)
        if transform == "jvp":
            return jit(lambda p, t: jax.jvp(of_params, (p,), (t,)))
        return jit(linearized)

    got, want = both(forward, loss, params, tangent)
    assert_same_tree(got, want, mode.compute_dtype)


@pytest.mark.parametrize("key", [jax.random.key, jax.random.PRNGKey],
                         ids=["typed_key", "raw_uint32_key"])
def test_gpt_dropout_grads_match_plain_jax(key):
    mode = MODES["bf16"]
    loss, params, batch = prepared(functools.partial(make_gpt, dropout=0.1, key=key(7)), mode)
    plain = jit(jax.value_and_grad(loss))
    got, want = jit(jax.value_and_grad(jat.autotune(loss)))(params, batch), plain(params, batch)
    assert_same_tree(got, want, mode.compute_dtype)
    other_key = plain(params, {**batch, "key": key(8)})
    assert float(want[0]) != float(other_key[0]), "dropout dropped nothing"


def test_llama_float8_weights_get_grads_as_in_plain_jax():
    loss, params, batch = prepared("llama", FLOAT8_STORAGE)
    assert jax.tree.leaves(params)[0].dtype == jnp.float8_e4m3fn
    got, want = both(lambda fn: jit(jax.value_and_grad(fn)), loss, params, batch)
    assert_same_tree(got[0], want[0], FLOAT8_STORAGE.compute_dtype)
    assert_same_tree(got[1], want[1], FLOAT8_STORAGE.param_dtype)


@pytest.mark.parametrize("jitted", [True, False], ids=["under_jit", "eager"])
def test_gpt_metrics_beside_the_loss_come_back_as_plain_jax_returns_them(jitted):
    """``jax.grad(..., has_aux=True)``: eagerly, a Python number among the metrics stays one.
    The GPT's tied embedding as a bigram model: eagerly, each op compiles on its own."""
    mode = MODES["bf16"]
    built = make_gpt(size())
    params, batch = in_mode(built.params, built.batch, mode)

    def loss_and_metrics(params, batch):
        logits = params["wte"][batch["tokens"]] @ params["wte"].T
        value = next_token_loss(logits, batch["tokens"])
        accuracy = jnp.mean(jnp.argmax(logits[:, :-1], -1) == batch["tokens"][:, 1:])
        return value, {"accuracy": accuracy, "loss": value, "tokens": batch["tokens"].size}

    def transform(fn):
        grad_fn = jax.grad(fn, has_aux=True)
        return jit(grad_fn) if jitted else grad_fn

    got, want = both(transform, loss_and_metrics, params, batch)
    assert isinstance(want[1]["tokens"], int) != jitted
    assert_same_tree(got, want, mode.compute_dtype)


@pytest.mark.parametrize("placement", ["around_the_loss", "inside_the_checkpoint"])
def test_remat_policy_recomputes_no_more_matmuls_than_in_plain_jax(placement):
    """``dots_with_no_batch_dims_saveable`` saves each projection's product, so the backward
    pass recomputes only the attention matmuls (batched) - tuned or not."""
    mode = MODES["f32"]
    plain = make_scan_remat(size())
    if placement == "around_the_loss":
        tuned_loss = jat.autotune(plain.loss)
    else:
        tuned_loss = make_scan_remat(size(), inner=jat.autotune).loss
    params, batch = in_mode(plain.params, plain.batch, mode)

    def matmuls(fn):
        return matmul_count(jax.make_jaxpr(jax.grad(fn))(params, batch), DOT + TUNED)

    saving_nothing = make_scan_remat(size(), policy=jax.checkpoint_policies.nothing_saveable)
    assert matmuls(tuned_loss) == matmuls(plain.loss)
    assert matmuls(plain.loss) < matmuls(saving_nothing.loss)  # the policy saves something
    if placement == "inside_the_checkpoint":  # around the loss, test_model_programs compares it
        got = jit(jax.value_and_grad(tuned_loss))(params, batch)
        want = jit(jax.value_and_grad(plain.loss))(params, batch)
        assert_same_tree(got, want, mode.compute_dtype)
