"""Each model program of the suite, in each dtype mode, trained for three steps by a jitted
step that calls ``jax.value_and_grad(jat.autotune(loss))``, against the same three steps of
plain JAX (``jax.value_and_grad(loss)``): the first step's loss and every gradient leaf
(structure, dtype, shape, values), each step's loss, the parameters after the last step
(and, for float32 parameters, what the steps changed), and the optimizer state's types."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness import (DOT, MODES, TUNED, assert_close, assert_same_tree, in_mode, loss_in_mode,
                     matmul_count, size, train)
from zoo import programs

PROGRAMS = programs()
CASES = [pytest.param(program, mode, id=f"{program}-{mode}") for program in PROGRAMS for mode in MODES]


def types(tree):
    return jax.tree.map(lambda x: (jax.typeof(x).dtype, jax.typeof(x).shape), tree)


@pytest.mark.parametrize("program, mode", CASES)
def test_loss_grads_and_three_optimizer_steps_match_plain_jax(program, mode):
    mode = MODES[mode]
    built = PROGRAMS[program](size())
    params, batch = in_mode(built.params, built.batch, mode)
    loss = loss_in_mode(built.loss, mode)

    want_history, want_params, want_state, plain_jaxpr = train(loss, params, batch, mode, tuned=False)
    got_history, got_params, got_state, tuned_jaxpr = train(loss, params, batch, mode, tuned=True)

    assert matmul_count(tuned_jaxpr, TUNED) >= matmul_count(plain_jaxpr, DOT) > 0, (
        "autotune left matmuls untuned")
    (got_loss, got_grads), (want_loss, want_grads) = got_history[0], want_history[0]
    assert_same_tree(got_loss, want_loss, mode.compute_dtype)
    assert_same_tree(got_grads, want_grads, mode.compute_dtype)
    # later steps start from parameters that differ by the first steps' rounding, which
    # the steps amplify: their losses are compared, their gradients' types
    for step, ((got_loss, got_grads), (want_loss, want_grads)) in enumerate(
            zip(got_history, want_history), start=1):
        assert_close(got_loss, want_loss, mode.compute_dtype, f"the loss of step {step}")
        assert types(got_grads) == types(want_grads), f"the gradients' types at step {step}"
    assert float(want_history[-1][0]) < float(want_history[0][0]), "the plain steps did not train"
    assert_same_tree(got_params, want_params, mode.compute_dtype)
    if jnp.dtype(mode.param_dtype) == jnp.float32:  # the steps themselves, exactly as stored
        assert_same_tree(change(got_params, params), change(want_params, params), mode.compute_dtype)
    assert types(got_state) == types(want_state)


def change(after, before):
    return jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), after, before)
