"""An operand the program copies into its stored layout (attention's bqhd): keyed and timed with the copy."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_autotune as jat
from jax_autotune.key import MatmulKey
from jax_autotune.problem import MatmulProblem
from jax_autotune.tuning import operand_copies, timing
from jax_autotune.tuning.tuner import tuning_call

SCORES = (((3,), (3,)), ((0, 2), (0, 2)))  # einsum("bqhd,bkhd->bhqk")
BHQD = (((3,), (3,)), ((0, 1), (0, 1)))  # einsum("bhqd,bhkd->bhqk"): batch dims outermost


def _keys(fn, *args):
    jaxpr = jax.make_jaxpr(fn)(*args)
    return [e.params["key"] for e in jaxpr.eqns if e.primitive.name == "autotuned_matmul"]


def _normal(seed, shape, dtype=jnp.float32):
    return jax.random.normal(jax.random.key(seed), shape, dtype)


def test_batch_dims_inside_an_operand_key_a_copy_and_the_minor_dim_stays_in_place():
    q, k = _normal(0, (2, 5, 3, 8)), _normal(1, (2, 7, 3, 8))
    (key,) = _keys(lambda q, k: jat.dot_general(q, k, SCORES), q, k)
    assert key.lhs_copied and key.rhs_copied
    # k (b, s, h, d) is put in (b, h, s, d) order and read transposed, d still minor
    assert key.rhs_layout.transposed and not key.lhs_layout.transposed
    assert key.describe() == "8x8x8x8 float32 NcTc DEFAULT"
    jaxpr = jax.make_jaxpr(lambda q, k: jat.dot_general(q, k, SCORES))(q, k)
    perms = [e.params["permutation"] for e in jaxpr.eqns if e.primitive.name == "transpose"]
    assert perms == [(0, 2, 1, 3), (0, 2, 1, 3)]


@pytest.mark.parametrize("fn, shapes, copied", [
    (lambda a, b: jat.dot_general(a, b, BHQD), ((2, 3, 5, 8), (2, 3, 7, 8)), (False, False)),  # batch outermost
    (lambda a, b: jat.dot_general(a, b, (((1,), (1,)), ((), ()))), ((5, 8), (7, 8)), (False, False)),  # x @ w.T
    (lambda a, b: jat.dot_general(a, b, SCORES), ((2, 1, 3, 8), (2, 7, 3, 8)), (False, True)),  # one query token
])
def test_only_an_operand_no_stored_layout_reads_is_copied(fn, shapes, copied):
    key = _keys(fn, *(_normal(i, s) for i, s in enumerate(shapes)))[0]
    assert (key.lhs_copied, key.rhs_copied) == copied


def test_a_copied_key_round_trips_and_a_key_without_copies_is_written_as_before():
    q, k = _normal(0, (2, 5, 3, 8)), _normal(1, (2, 7, 3, 8))
    (key,) = _keys(lambda q, k: jat.dot_general(q, k, SCORES), q, k)
    assert MatmulKey.from_json(json.loads(json.dumps(key.to_json()))) == key
    assert MatmulKey.parse(key.canonical()) == key
    assert key.canonical().endswith("lhs_copied=True rhs_copied=True")
    (plain,) = _keys(lambda q, k: jat.dot_general(q, k, BHQD), q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3))
    assert "copied" not in plain.canonical() and "lhs_copied" not in plain.to_json()
    with pytest.raises(ValueError, match="'rhs_copied'"):
        MatmulKey.from_json({**key.to_json(), "rhs_copied": "yes"})
    with pytest.raises(ValueError, match="lhs_copied"):
        MatmulProblem(1, 8, 8, 8, "float32", "float32", "float32", lhs_copied=1)


def test_results_and_gradients_through_copied_operands_are_lax_s_and_the_backward_copies_nothing():
    q, k = _normal(0, (2, 5, 3, 8), jnp.bfloat16), _normal(1, (2, 7, 3, 8), jnp.bfloat16)
    ct = _normal(2, (2, 3, 5, 7), jnp.float32)

    def loss(dot):
        return lambda q, k: jnp.sum(dot(q, k, SCORES, preferred_element_type=jnp.float32) * ct)

    out = jax.jit(lambda q, k: jat.dot_general(q, k, SCORES, preferred_element_type=jnp.float32))(q, k)
    exact = np.einsum("bqhd,bkhd->bhqk", np.asarray(q, np.float64), np.asarray(k, np.float64))
    np.testing.assert_allclose(np.asarray(out, np.float64), exact, rtol=1e-5, atol=1e-5)
    tuned = jax.jit(jax.grad(loss(jat.dot_general), argnums=(0, 1)))(q, k)
    plain = jax.jit(jax.grad(loss(jax.lax.dot_general), argnums=(0, 1)))(q, k)
    for got, want in zip(tuned, plain):
        assert got.dtype == want.dtype == jnp.bfloat16 and got.shape == want.shape
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=2e-2, atol=2e-2)
        assert np.all(np.isfinite(np.asarray(got, np.float32))) and np.any(np.asarray(got) != 0)
    keys = _keys(jax.grad(loss(jat.dot_general), argnums=(0, 1)), q, k)
    assert len(keys) == 3 and keys[0].lhs_copied and not any(x.lhs_copied or x.rhs_copied for x in keys[1:])


def test_every_candidate_is_timed_on_the_operands_as_held_with_the_copy_in_front(monkeypatch, fresh_tuning):
    compiled = []
    original = timing.compile_repeated

    def spy(fn, args):
        jaxpr = jax.make_jaxpr(fn)(*args)
        compiled.append(([tuple(a.shape) for a in args[:2]], [e.primitive.name for e in jaxpr.eqns][:2]))
        return original(fn, args)

    monkeypatch.setattr(timing, "compile_repeated", spy)
    q, k = _normal(0, (2, 48, 3, 64)), _normal(1, (2, 40, 3, 64))
    out = jax.jit(lambda q, k: jat.dot_general(q, k, SCORES))(q, k)
    exact = np.einsum("bqhd,bkhd->bhqk", np.asarray(q, np.float64), np.asarray(k, np.float64))
    np.testing.assert_allclose(np.asarray(out, np.float64), exact, rtol=1e-4, atol=1e-4)
    assert compiled, "the key was not tuned"
    for shapes, first_ops in compiled:
        # held (rows, batch, cols): lhs (48, 6, 64), rhs stored (6, 40, 64) held (40, 6, 64)
        assert shapes == [(48, 6, 64), (40, 6, 64)]
        assert first_ops == ["transpose", "transpose"]


def test_held_inputs_copied_back_are_the_stored_ones_for_either_batch():
    for batch in (1, 4):
        problem = MatmulProblem(batch, 6, 5, 3, "float32", "float32", "float32", rhs_copied=True)
        stored = tuple(np.asarray(_normal(i, shape)) for i, (shape, _) in enumerate(problem.input_specs()))
        held = operand_copies.held(problem, tuple(jnp.asarray(x) for x in stored))
        assert held[0].shape == stored[0].shape
        assert held[1].shape == tuple(s for s, _ in operand_copies.held_specs(problem))[1] != stored[1].shape
        back = jax.jit(operand_copies.timed(lambda a, b: (a, b), problem))(*held)
        for got, want in zip(back, stored):
            np.testing.assert_array_equal(np.asarray(got), want)


def test_the_missing_key_message_names_a_warmup_that_tunes_the_copied_key():
    problem = MatmulProblem(6, 48, 40, 64, "float32", "float32", "float32", transpose_b=True,
                            lhs_copied=True, rhs_copied=True)
    call = tuning_call(problem.key("balanced"), problem, "balanced")
    rebuilt = eval(call.removeprefix("jax_autotune.warmup([").removesuffix("])"), {"jax_autotune": jat})
    assert rebuilt == problem


@pytest.mark.gpu
def test_on_a_gpu_a_decode_step_s_scores_time_every_candidate_behind_the_cache_copy(monkeypatch, fresh_tuning):
    compiled = []
    original = timing.compile_candidate

    def spy(candidate, problem, args):
        if problem.rhs_copied:  # the key's own candidates, not the roofline probes' programs
            compiled.append((candidate.name, tuple(args[1].shape)))
        return original(candidate, problem, args)

    monkeypatch.setattr(timing, "compile_candidate", spy)
    # one query token over a (batch, cache, heads, head_dim) cache: the cache is copied
    q, k = _normal(0, (8, 1, 16, 128), jnp.bfloat16), _normal(1, (8, 1024, 16, 128), jnp.bfloat16)
    scores = lambda q, k: jat.dot_general(q, k, SCORES, preferred_element_type=jnp.float32)  # noqa: E731
    (key,) = _keys(scores, q, k)
    assert (key.lhs_copied, key.rhs_copied) == (False, True)
    out = jax.jit(scores)(q, k)
    exact = np.einsum("bqhd,bkhd->bhqk", np.asarray(q, np.float64), np.asarray(k, np.float64))
    np.testing.assert_allclose(np.asarray(out, np.float64), exact, rtol=2e-2, atol=2e-2)
    timed = [shape for name, shape in compiled]
    assert timed and all(shape == (1024, 128, 128) for shape in timed)  # (cache, batch * heads, head_dim)
    assert len({name for name, _ in compiled}) >= 2, compiled  # XLA's dot and at least one kernel
