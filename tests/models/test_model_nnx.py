"""A flax nnx model with BatchNorm and Dropout, trained the nnx way (a jitted step of
``nnx.value_and_grad`` of ``jat.autotune(loss)`` and ``nnx.Optimizer``), against the same
program in plain JAX: the loss and gradients, the parameters after three steps, and the
state the model writes as it runs: BatchNorm's batch statistics and each Dropout's count of
random draws."""

import functools

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import jax_autotune as jat
from harness import MODES, STEPS, assert_close, assert_same_tree, compiler_options, optimizer, size
from zoo_flax import make_nnx_classifier, nnx_loss


def train(mode, *, tuned, nnx_jit=False):
    """Three nnx training steps from a fresh model; ([(loss, grads) of each step], the
    model's state after them, the optimizer's state, the model's state before them). The
    step is ``nnx.jit``'s (the README's), or nnx's functional form (``nnx.split`` /
    ``nnx.merge`` under ``jax.jit``), which takes the suite's compiler options."""
    model, batch = make_nnx_classifier(size(), mode)
    initial = jax.tree.map(jnp.copy, nnx.state(model))
    opt = nnx.Optimizer(model, optimizer(mode), wrt=nnx.Param)

    def step(model, opt, batch):
        loss_fn = jat.autotune(nnx_loss) if tuned else nnx_loss
        loss, grads = nnx.value_and_grad(loss_fn)(model, batch)
        opt.update(model, grads)
        return loss, grads

    if nnx_jit:
        jitted = nnx.jit(step)
        history = [jitted(model, opt, batch) for _ in range(STEPS)]
        return history, nnx.state(model), nnx.state(opt), initial
    graphdef, state = nnx.split((model, opt))

    @functools.partial(jax.jit, compiler_options=compiler_options())
    def functional_step(state, batch):
        model, opt = nnx.merge(graphdef, state)
        loss, grads = step(model, opt, batch)
        return nnx.state((model, opt)), loss, grads

    history = []
    for _ in range(STEPS):
        state, loss, grads = functional_step(state, batch)
        history.append((loss, grads))
    nnx.update((model, opt), state)
    return history, nnx.state(model), nnx.state(opt), initial


def rng_counts(state):
    return [int(x) for x in jax.tree.leaves(nnx.filter_state(state, nnx.RngCount))]


@pytest.mark.parametrize("mode, jit", [(mode, "jax.jit") for mode in MODES] + [("bf16", "nnx.jit")],
                         ids=[*MODES, "bf16-nnx.jit"])
def test_nnx_training_matches_plain_jax_with_batch_stats_and_dropout_rngs(mode, jit):
    mode = MODES[mode]
    want_history, want_state, want_opt, initial = train(mode, tuned=False, nnx_jit=jit == "nnx.jit")
    got_history, got_state, got_opt, _ = train(mode, tuned=True, nnx_jit=jit == "nnx.jit")

    (got_loss, got_grads), (want_loss, want_grads) = got_history[0], want_history[0]
    assert_same_tree(got_loss, want_loss, mode.compute_dtype)
    assert_same_tree(got_grads, want_grads, mode.compute_dtype)
    for step, ((got_loss, _), (want_loss, _)) in enumerate(zip(got_history, want_history), 1):
        assert_close(got_loss, want_loss, mode.compute_dtype, f"the loss of step {step}")
    params = [nnx.filter_state(state, nnx.Param) for state in (got_state, want_state)]
    assert_same_tree(*params, mode.compute_dtype)
    assert jax.tree.map(jax.typeof, got_opt) == jax.tree.map(jax.typeof, want_opt)

    # BatchNorm's running statistics moved in the plain program, and as far in the tuned one
    got_stats, want_stats, initial_stats = (nnx.filter_state(state, nnx.BatchStat)
                                            for state in (got_state, want_state, initial))
    moved = jax.tree.map(lambda a, b: bool((a != b).any()), want_stats, initial_stats)
    assert all(jax.tree.leaves(moved)), "the plain steps left a batch statistic as it was"
    assert_same_tree(got_stats, want_stats, mode.compute_dtype)

    # each Dropout drew once a step, from the same keys, in both programs
    assert rng_counts(want_state) == [STEPS, STEPS] and rng_counts(initial) == [0, 0]
    rngs = [nnx.filter_state(state, nnx.RngState) for state in (got_state, want_state)]
    assert_same_tree(*rngs, mode.compute_dtype)
