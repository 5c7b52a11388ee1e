"""jat.ragged_dot: lax.ragged_dot's values, gradients, errors and semantics; the grouped key;
the grouped candidates; and the tuner's gate that a decision is right on every split."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_autotune as jat
from fakes import CPU, FakeClock, FakeTimer
from jax_autotune import config
from jax_autotune.key import MatmulKey
from jax_autotune.kernels import ragged as kernels
from jax_autotune.problem import MatmulProblem
from jax_autotune.registry import ragged_tuner_for
from jax_autotune.splits import SPLITS, representative_splits
from jax_autotune.tuning.candidates import Candidate, CandidateSetBuilder
from jax_autotune.tuning.correctness import check, reference
from jax_autotune.tuning.roofline import Peaks
from jax_autotune.tuning.tuner import Tuner
from numerics import rel_error, tolerance

SIZES = (0, 1, 7, 1000)  # rows m


def operands(m, k, n, groups, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if jnp.issubdtype(dtype, jnp.integer):
        x, w = rng.integers(-4, 5, (m, k)), rng.integers(-4, 5, (groups, k, n))
    else:
        x, w = rng.standard_normal((m, k)), rng.standard_normal((groups, k, n))
    return jnp.asarray(x, dtype), jnp.asarray(w, dtype)


def sizes_for(m, groups, kind):
    """Group sizes over m rows: equal, skewed with empty groups and rows left over, or all
    rows in the last group."""
    if kind == "equal":
        return jnp.asarray(representative_splits(m, groups)[0]) if m else jnp.zeros(groups, jnp.int32)
    if kind == "skewed":
        return jnp.asarray(representative_splits(m, groups)[1]) if m else jnp.zeros(groups, jnp.int32)
    return jnp.zeros(groups, jnp.int32).at[-1].set(m)


@pytest.fixture
def plain_xla():
    """Mode off: every grouped key runs XLA's ragged_dot (the exact-equality cases)."""
    config.update("mode", "off")
    yield
    config.reset()


# ---------------------------------------------------------------- values, as lax's

@pytest.mark.parametrize("m", SIZES)
@pytest.mark.parametrize("k", (7, 64))
@pytest.mark.parametrize("n", (1, 1025))
@pytest.mark.parametrize("dtype", ("bfloat16", "float16", "float32"))
def test_values_are_exactly_lax_s_where_xla_runs_them(m, k, n, dtype, plain_xla):
    x, w = operands(m, k, n, 3, dtype)
    gs = sizes_for(m, 3, "skewed")
    got, want = jax.jit(jat.ragged_dot)(x, w, gs), lax.ragged_dot(x, w, gs)
    assert got.dtype == want.dtype and got.shape == want.shape == (m, n)
    np.testing.assert_array_equal(np.asarray(got, np.float64), np.asarray(want, np.float64))


@pytest.mark.parametrize("candidate", [kernels.MASKED_DENSE, kernels.PADDED_DENSE], ids=lambda c: c.name)
@pytest.mark.parametrize("m,k,n", [(1, 7, 1), (7, 64, 1025), (1000, 7, 1), (1000, 64, 1025)])
@pytest.mark.parametrize("dtype", ("bfloat16", "float16", "float32"))
@pytest.mark.parametrize("split", ("equal", "skewed", "one"))
def test_every_grouped_candidate_matches_lax_within_a_tight_tolerance(candidate, m, k, n, dtype, split):
    x, w = operands(m, k, n, 4, dtype)
    gs = sizes_for(m, 4, split)
    problem = MatmulProblem(1, m, n, k, dtype, dtype, dtype, groups=4, ragged="m")
    got = jax.jit(kernels.served(candidate, problem))(x, w, gs)
    want = lax.ragged_dot(x, w, gs)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert rel_error(got, want) <= tolerance(dtype)
    rows = int(np.sum(np.asarray(gs)))
    assert not np.any(np.asarray(got[rows:], np.float64))  # rows in no group: exactly zero


@pytest.mark.parametrize("dtype", ("int8", "int32"))
def test_integer_inputs_give_lax_s_exact_values_and_dtype(dtype):
    x, w = operands(50, 7, 9, 3, dtype)
    gs = jnp.array([20, 0, 25], jnp.int32)
    want = lax.ragged_dot(x, w, gs)
    got = jax.jit(jat.ragged_dot)(x, w, gs)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    problem = MatmulProblem(1, 50, 9, 7, dtype, dtype, want.dtype.name, groups=3, ragged="m")
    for candidate in (kernels.MASKED_DENSE, kernels.PADDED_DENSE):
        np.testing.assert_array_equal(jax.jit(kernels.served(candidate, problem))(x, w, gs), want)


def test_the_tuned_call_matches_lax_and_its_key_is_grouped(fresh_tuning):
    x, w = operands(1000, 64, 48, 8, "float32")
    gs = jnp.array([100, 0, 300, 50, 50, 200, 100, 150], jnp.int32)
    jaxpr = jax.make_jaxpr(jat.ragged_dot)(x, w, gs)
    (eqn,) = jaxpr.eqns
    assert eqn.primitive.name == "autotuned_ragged_dot"
    key = eqn.params["key"]
    assert (key.groups, key.ragged, key.m, key.k, key.n) == (8, "m", 1024, 64, 64)
    assert rel_error(jax.jit(jat.ragged_dot)(x, w, gs), lax.ragged_dot(x, w, gs)) <= 1e-6
    decision = ragged_tuner_for("cpu").known.lookup(key)
    assert decision is not None and decision.source == "tuned"
    assert {r.name for r in decision.results} == set(kernels.ragged_candidate_set(CPU).names())


def test_eager_calls_and_preferred_element_type_follow_lax():
    x, w = operands(40, 16, 8, 2, "bfloat16")
    gs = jnp.array([10, 25], jnp.int32)
    got = jat.ragged_dot(x, w, gs, preferred_element_type=jnp.float32)
    want = lax.ragged_dot(x, w, gs, preferred_element_type=jnp.float32)
    assert got.dtype == jnp.float32
    assert rel_error(got, want) <= 1e-6


@pytest.mark.parametrize("m", (0, 5))
def test_zero_sizes_give_lax_s_result(m):
    x, w = jnp.ones((m, 0)), jnp.ones((2, 0, 3))
    gs = jnp.array([m, 0], jnp.int32)
    np.testing.assert_array_equal(jat.ragged_dot(x, w, gs), lax.ragged_dot(x, w, gs))
    no_groups = jat.ragged_dot(jnp.ones((4, 3)), jnp.ones((0, 3, 2)), jnp.zeros((0,), jnp.int32))
    np.testing.assert_array_equal(no_groups, lax.ragged_dot(jnp.ones((4, 3)), jnp.ones((0, 3, 2)),
                                                            jnp.zeros((0,), jnp.int32)))


def test_group_offset_is_lax_s_own_behaviour():
    x, w = operands(8, 4, 3, 2, "float32")
    gs, offset = jnp.array([4, 4], jnp.int32), jnp.array([1], jnp.int32)

    def outcome(f):
        try:
            return "ok", np.asarray(jax.jit(lambda a, b, c, o: f(a, b, c, group_offset=o))(x, w, gs, offset))
        except Exception as err:  # noqa: BLE001 - the same error as lax's is the point
            return type(err), None

    got, want = outcome(jat.ragged_dot), outcome(lax.ragged_dot)
    assert got[0] == want[0]
    if got[0] == "ok":
        np.testing.assert_array_equal(got[1], want[1])


def test_vmap_gives_lax_s_values():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 20, 8)), jnp.float32)
    w = jnp.asarray(np.random.default_rng(1).standard_normal((3, 2, 8, 5)), jnp.float32)
    gs = jnp.array([[10, 5], [0, 20], [7, 7]], jnp.int32)
    got = jax.jit(jax.vmap(jat.ragged_dot))(x, w, gs)
    np.testing.assert_array_equal(got, jax.vmap(lax.ragged_dot)(x, w, gs))


# ---------------------------------------------------------------- gradients

def _loss(f, gs):
    return lambda x, w: jnp.sum(jnp.sin(f(x, w, gs).astype(jnp.float32)))


@pytest.mark.parametrize("dtype", ("bfloat16", "float32"))
def test_gradients_are_exactly_lax_s_where_xla_runs_them(dtype, plain_xla):
    x, w = operands(37, 7, 9, 4, dtype)
    gs = jnp.array([10, 0, 20, 3], jnp.int32)  # 4 rows in no group
    got = jax.jit(jax.grad(_loss(jat.ragged_dot, gs), (0, 1)))(x, w)
    want = jax.jit(jax.grad(_loss(lax.ragged_dot, gs), (0, 1)))(x, w)
    for g, h in zip(got, want):
        assert g.dtype == h.dtype
        np.testing.assert_array_equal(np.asarray(g, np.float64), np.asarray(h, np.float64))


def test_tuned_gradients_match_lax_s_and_the_backward_is_grouped_too(fresh_tuning):
    x, w = operands(300, 16, 24, 4, "float32")
    gs = jnp.array([100, 0, 150, 20], jnp.int32)
    grad = jax.grad(_loss(jat.ragged_dot, gs), (0, 1))
    keys = [e.params["key"] for e in jax.make_jaxpr(grad)(x, w).eqns if e.primitive.name == "autotuned_ragged_dot"]
    assert sorted((k.ragged, k.lhs_layout.transposed, k.rhs_layout.transposed) for k in keys) == [
        ("k", True, False), ("m", False, False), ("m", False, True)]
    got = jax.jit(grad)(x, w)
    want = jax.grad(_loss(lax.ragged_dot, gs), (0, 1))(x, w)
    for g, h in zip(got, want):
        assert rel_error(g, h) <= 1e-5


def test_a_ragged_contracting_call_has_lax_s_missing_transpose():
    dims = lax.RaggedDotDimensionNumbers((((0,), (0,)), ((), ())), [0], [])
    x, dy, gs = jnp.ones((6, 3)), jnp.ones((6, 2)), jnp.array([2, 4], jnp.int32)
    from jax_autotune.ragged import ragged_dot_general
    np.testing.assert_array_equal(jax.jit(ragged_dot_general, static_argnums=3)(x, dy, gs, dims),
                                  lax.ragged_dot_general(x, dy, gs, dims))
    with pytest.raises(NotImplementedError):
        jax.grad(lambda a: jnp.sum(ragged_dot_general(a, dy, gs, dims)))(x)
    with pytest.raises(NotImplementedError):
        jax.grad(lambda a: jnp.sum(lax.ragged_dot_general(a, dy, gs, dims)))(x)


# ---------------------------------------------------------------- a small MoE layer under jat.autotune

def moe_layer(params, tokens):
    """Top-2 routing, experts as ragged_dots (gate, up, down: SwiGLU), bf16 compute."""
    experts = params["up"].shape[0]
    bf16 = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)  # f32 master weights
    x = tokens.astype(jnp.bfloat16)
    logits = (x @ bf16["router"]).astype(jnp.float32)
    weights, chosen = lax.top_k(jax.nn.softmax(logits), 2)
    flat = chosen.reshape(-1)
    order = jnp.argsort(flat)
    rows = jnp.repeat(x, 2, axis=0)[order]
    group_sizes = jnp.bincount(flat, length=experts).astype(jnp.int32)
    gate = lax.ragged_dot(rows, bf16["gate"], group_sizes)
    up = lax.ragged_dot(rows, bf16["up"], group_sizes)
    out = lax.ragged_dot(jax.nn.silu(gate) * up, bf16["down"], group_sizes)
    out = jnp.zeros_like(out).at[order].set(out).reshape(tokens.shape[0], 2, -1)
    return jnp.sum(out.astype(jnp.float32) * weights[..., None], axis=1)


def moe_loss(params, tokens):
    return jnp.mean(moe_layer(params, tokens) ** 2)


def moe_params(d=16, ffn=24, experts=4):
    keys = jax.random.split(jax.random.key(0), 4)
    scale = lambda fan_in: 1.0 / np.sqrt(fan_in)  # noqa: E731
    return {"router": jax.random.normal(keys[0], (d, experts)) * scale(d),
            "gate": jax.random.normal(keys[1], (experts, d, ffn)) * scale(d),
            "up": jax.random.normal(keys[2], (experts, d, ffn)) * scale(d),
            "down": jax.random.normal(keys[3], (experts, ffn, d)) * scale(ffn)}


def test_grad_of_a_moe_layer_through_autotune_matches_the_plain_one(fresh_tuning):
    params = moe_params()
    tokens = jax.random.normal(jax.random.key(1), (40, 16))
    tuned = jax.jit(jax.grad(jat.autotune(moe_loss)))
    jaxpr = jax.make_jaxpr(jax.grad(jat.autotune(moe_loss)))(params, tokens)
    text = str(jaxpr)
    assert "ragged=m" in text and "ragged=k" in text  # forward, input and weight gradients tuned
    got, want = tuned(params, tokens), jax.jit(jax.grad(moe_loss))(params, tokens)
    for name in params:
        assert got[name].dtype == jnp.float32
        assert rel_error(got[name], want[name]) <= tolerance("bfloat16"), name


def test_autotune_leaves_integer_and_offset_ragged_dots_to_lax():
    x, w = operands(10, 4, 3, 2, "int8")
    gs = jnp.array([5, 5], jnp.int32)
    text = str(jax.make_jaxpr(jat.autotune(lax.ragged_dot))(x, w, gs))
    assert "autotuned_ragged_dot" not in text and "ragged_dot_general" in text


# ---------------------------------------------------------------- bad input

def test_bad_input_is_a_clear_error_naming_the_argument():
    x, w, gs = jnp.ones((6, 4)), jnp.ones((2, 4, 3)), jnp.array([3, 3], jnp.int32)
    with pytest.raises(TypeError, match="ragged_dot: lhs must be an array, got list"):
        jat.ragged_dot([[1.0]], w, gs)
    with pytest.raises(TypeError, match="ragged_dot: group_sizes must be an array"):
        jat.ragged_dot(x, w, [3, 3])
    with pytest.raises(TypeError, match="ragged_dot: .*group_sizes.dtype"):
        jat.ragged_dot(x, w, jnp.array([3.0, 3.0]))
    with pytest.raises(TypeError, match="ragged_dot: .*rhs group dimension size"):
        jat.ragged_dot(x, jnp.ones((3, 4, 3)), gs)
    with pytest.raises(TypeError, match="ragged_dot: .*contracting"):
        jat.ragged_dot(x, jnp.ones((2, 5, 3)), gs)
    with pytest.raises(TypeError):  # lax's own error type for the same call
        lax.ragged_dot(x, w, jnp.array([3.0, 3.0]))


# ---------------------------------------------------------------- the key and the splits

def test_a_grouped_key_holds_groups_ragged_dim_buckets_dtypes_and_layouts():
    problem = MatmulProblem(1, 1000, 1025, 7, "bfloat16", "bfloat16", "bfloat16", transpose_b=True,
                            groups=8, ragged="m")
    key = problem.key("balanced")
    assert (key.m, key.n, key.k, key.groups, key.ragged) == (1024, 2048, 8, 8, "m")
    assert key.rhs_layout.transposed and not key.lhs_layout.transposed
    assert MatmulKey.parse(key.canonical()) == key
    assert MatmulProblem.from_json(problem.to_json()) == problem
    assert key != dataclasses.replace(problem, groups=4).key("balanced")
    assert "ragged m g8" in key.describe()
    dense = MatmulProblem(1, 1000, 1025, 7, "float32", "float32", "float32")
    assert "groups" not in dense.key().to_json() and "groups" not in dense.to_json()


def test_grouped_problems_have_lax_s_shapes_and_tuning_splits():
    forward = MatmulProblem(1, 10, 5, 4, "float32", "float32", "float32", groups=3, ragged="m")
    assert (forward.lhs_shape, forward.rhs_shape, forward.out_shape) == ((10, 4), (3, 4, 5), (10, 5))
    assert forward.input_specs()[2] == ((SPLITS, 3), "int32")
    weight_grad = MatmulProblem(1, 4, 5, 10, "float32", "float32", "float32", transpose_a=True,
                                groups=3, ragged="k")
    assert (weight_grad.lhs_shape, weight_grad.rhs_shape, weight_grad.out_shape) == ((10, 4), (10, 5), (3, 4, 5))
    with pytest.raises(ValueError, match="grouped"):
        MatmulProblem(1, 10, 5, 4, "float32", "float32", "float32", groups=3)


@pytest.mark.parametrize("rows,groups", [(1, 1), (7, 8), (10, 3), (1000, 2), (1000, 64)])
def test_the_representative_splits_are_equal_and_skewed(rows, groups):
    equal, skewed = representative_splits(rows, groups)
    assert equal.sum() == rows and equal.max() - equal.min() <= 1
    assert skewed.sum() <= rows and (skewed.sum() < rows or rows == 1) and skewed.min() >= 0
    if groups >= 3:
        assert skewed[1] == 0 and skewed[0] >= rows // 3


# ---------------------------------------------------------------- the gate: right on every split

class FakeProbes:
    def peaks_for(self, problem):
        return Peaks(compute=1e12, bandwidth=1e11, launch_overhead=1e-6)


def _right_on_the_equal_split_only(lhs, rhs, group_sizes, problem):
    """The padded GEMM without its fallback: right while every group fits its capacity."""
    return kernels._padded_path(lhs, rhs, group_sizes, problem, kernels.capacity(problem))


def _ignores_rows_in_no_group(lhs, rhs, group_sizes, problem):
    """Right in every group, but rows in no group take the last group's weights."""
    out = kernels.xla_ragged_one(lhs, rhs, group_sizes, problem)
    full = group_sizes.at[-1].add(problem.m - jnp.sum(group_sizes))
    return jnp.where((jnp.arange(problem.m) >= jnp.sum(group_sizes))[:, None],
                     kernels.xla_ragged_one(lhs, rhs, full, problem), out)


def _grouped_set(*extra):
    builder = CandidateSetBuilder("cpu", "fake-cpu")
    builder.add(kernels.XLA_RAGGED_DOT)
    group = builder.group("dense", lambda key: 1)
    for candidate in extra:
        builder.add(candidate, group, lambda key: 1)
    return builder.build()


def _grouped_tuner(store, cset, scripts):
    return Tuner(CPU, cset, jax_device=jax.devices("cpu")[0], timer=FakeTimer(scripts, real_outputs=True),
                 store=store, clock=FakeClock(), probes=FakeProbes())


GATE_PROBLEM = MatmulProblem(1, 64, 8, 16, "float32", "float32", "float32", groups=8, ragged="m")


def test_a_candidate_right_on_the_equal_split_only_never_wins(store):
    cset = _grouped_set(Candidate("equal_only", kernels._each_split(_right_on_the_equal_split_only)),
                        kernels.PADDED_DENSE)
    tuner = _grouped_tuner(store, cset, {"xla_ragged_dot": [3.0], "equal_only": [1.0],
                                         "ragged_padded_dense_x2": [2.0]})
    decision = tuner.select(GATE_PROBLEM)
    results = {r.name: r for r in decision.results}
    assert results["equal_only"].outcome == "wrong_result"
    assert results["ragged_padded_dense_x2"].outcome == "ok"
    assert decision.winner == "ragged_padded_dense_x2"


def test_a_candidate_wrong_only_on_rows_in_no_group_never_wins(store):
    cset = _grouped_set(Candidate("leaky", kernels._each_split(_ignores_rows_in_no_group)))
    tuner = _grouped_tuner(store, cset, {"xla_ragged_dot": [3.0], "leaky": [1.0]})
    decision = tuner.select(GATE_PROBLEM)
    assert {r.name: r.outcome for r in decision.results}["leaky"] == "wrong_result"
    assert decision.winner == "xla_ragged_dot"


def test_the_gate_checks_each_group_on_each_split_exactly():
    problem = GATE_PROBLEM
    x, w = operands(64, 16, 8, 8, "float32")
    splits = jnp.asarray(representative_splits(64, 8))
    ref = reference(problem, x, w, splits)
    right = kernels.XLA_RAGGED_DOT.fn(x, w, problem, splits)
    assert check(right, ref, problem, "cpu").ok
    for split in range(SPLITS):
        last = int(splits[split].sum()) - 1  # one entry of the last row in a group off, on this split
        wrong = right.at[split, last, 0].add(1e-2 * float(jnp.abs(right).max()))
        assert not check(wrong, ref, problem, "cpu").ok
    stray = right.at[1, 63, 0].set(1e-30)  # a row in no group on the skewed split: must be zero
    assert not check(stray, ref, problem, "cpu").ok


def test_a_ragged_k_reference_checks_empty_groups_are_zero():
    problem = MatmulProblem(1, 4, 5, 64, "float32", "float32", "float32", transpose_a=True, groups=8, ragged="k")
    rng = np.random.default_rng(0)
    x, dy = jnp.asarray(rng.standard_normal((64, 4)), jnp.float32), jnp.asarray(rng.standard_normal((64, 5)), jnp.float32)
    splits = jnp.asarray(representative_splits(64, 8))
    ref = reference(problem, x, dy, splits)
    for candidate in kernels.ragged_candidate_set(CPU).candidates:
        if candidate.runs(CPU, problem.key()):
            assert check(candidate.fn(x, dy, problem, splits), ref, problem, "cpu").ok, candidate.name
    out = kernels.XLA_RAGGED_DOT.fn(x, dy, problem, splits)
    assert not check(out.at[1, 1, 0, 0].set(1e-30), ref, problem, "cpu").ok  # group 1 is empty there


def test_warmup_tunes_the_grouped_keys_of_an_autotuned_function_with_the_grouped_tuner(fresh_tuning):
    params, tokens = moe_params(), jax.random.normal(jax.random.key(1), (40, 16))
    report = jat.warmup(jat.autotune(moe_loss), params, tokens, grad=True, compare=False)
    grouped = [e for e in report.entries if e.key.groups]
    assert {e.key.ragged for e in grouped} == {"m", "k"}
    names = set(kernels.ragged_candidate_set(CPU).names())
    assert all(e.winner in names for e in grouped)
    assert all(ragged_tuner_for("cpu").known.lookup(e.key) is not None for e in grouped)


def test_warmup_measures_the_grouped_keys_probes_before_any_key_tunes(fresh_tuning, monkeypatch):
    """The probes hold the device alone: measured in the prime phase, before the plain
    program's compile may hold it, a grouped key's tuning never waits for them."""
    params, tokens = moe_params(), jax.random.normal(jax.random.key(1), (40, 16))
    probes, events = ragged_tuner_for("cpu").probes, []
    peaks_for, select = probes.peaks_for, Tuner.select
    monkeypatch.setattr(probes, "peaks_for", lambda problem: events.append(("probe", problem)) or peaks_for(problem))
    monkeypatch.setattr(Tuner, "select", lambda self, problem, *a, **k: events.append(("select", problem))
                        or select(self, problem, *a, **k))
    report = jat.warmup(jat.autotune(moe_loss), params, tokens, grad=True, compare=False)
    grouped = {e.problem for e in report.entries if e.key.groups}
    first_select = next(i for i, (what, _) in enumerate(events) if what == "select")
    probed_first = {problem for what, problem in events[:first_select] if what == "probe"}
    assert grouped and grouped <= probed_first
