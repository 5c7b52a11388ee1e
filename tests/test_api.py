"""matmul / dot_general: numerics, transformations, the key in the jaxpr, modes and errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_autotune as jat
from jax_autotune import config, primitive
from jax_autotune.tuning import counters
from jax_autotune.key import Layout
from jax_autotune.jaxprs import equations
from numerics import REFERENCE_TOLERANCES, rand_stream, rel_error



rand = rand_stream(20261129)


def f64_matmul(a, b):
    return np.matmul(np.asarray(a, np.float64), np.asarray(b, np.float64))


@pytest.mark.parametrize("m, n, k", [(1, 7, 100), (7, 1, 7), (100, 100, 1), (1000, 7, 100),
                                     (7, 1025, 1), (1, 1, 1025), (100, 7, 1000)])
def test_matmul_matches_float64_on_odd_shapes(fresh_tuning, m, n, k):
    a, b = rand((m, k)), rand((k, n))
    out = jax.jit(jat.matmul)(a, b)
    assert out.shape == (m, n) and out.dtype == jnp.float32
    assert rel_error(out, f64_matmul(a, b)) < REFERENCE_TOLERANCES["float32"]


@pytest.mark.parametrize("a_shape, b_shape", [
    ((3, 5, 7), (7, 4)),          # batch @ matrix
    ((5, 7), (3, 7, 4)),          # matrix @ batch
    ((2, 1, 5, 7), (3, 7, 4)),    # broadcasting batch dims
    ((7,), (7, 4)),               # 1-D promotion
    ((3, 5, 7), (7,)),            # batched matvec
    ((7,), (7,)),                 # inner product
])
def test_matmul_follows_jnp_matmul_shape_rules(fresh_tuning, a_shape, b_shape):
    a, b = rand(a_shape), rand(b_shape)
    out = jat.matmul(a, b)
    want = f64_matmul(a, b)
    assert out.shape == want.shape
    assert rel_error(out, want) < REFERENCE_TOLERANCES["float32"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_matmul_dtypes_and_preferred_element_type(fresh_tuning, dtype):
    a, b = rand((33, 65), dtype), rand((65, 17), dtype)
    out = jat.matmul(a, b)
    assert out.dtype == jnp.dtype(dtype)
    assert rel_error(out, f64_matmul(a, b)) < REFERENCE_TOLERANCES[dtype]
    wide = jat.matmul(a, b, preferred_element_type=jnp.float32)
    assert wide.dtype == jnp.float32
    assert rel_error(wide, f64_matmul(a, b)) < 1e-5


def test_mixed_dtypes_promote_like_jnp(fresh_tuning):
    a, b = rand((8, 16), "bfloat16"), rand((16, 4), "float32")
    out = jat.matmul(a, b)
    assert out.dtype == jnp.matmul(a, b).dtype == jnp.float32
    ints = jat.matmul(jnp.arange(12, dtype=jnp.int32).reshape(3, 4), jnp.ones((4, 2), jnp.int32))
    assert ints.dtype == jnp.int32
    np.testing.assert_array_equal(ints, np.arange(12).reshape(3, 4) @ np.ones((4, 2), np.int64))


@pytest.mark.parametrize("dims, lhs_shape, rhs_shape", [
    ((((1,), (0,)), ((), ())), (9, 7), (7, 5)),          # plain
    ((((0,), (0,)), ((), ())), (7, 9), (7, 5)),          # lhs transposed
    ((((1,), (1,)), ((), ())), (9, 7), (5, 7)),          # rhs transposed (x @ W^T)
    ((((0,), (1,)), ((), ())), (7, 9), (5, 7)),          # both
    ((((2,), (1,)), ((0,), (0,))), (3, 9, 7), (3, 7, 5)),  # batched
    ((((1,), (2,)), ((0,), (0,))), (3, 7, 9), (3, 5, 7)),  # batched, both transposed
    ((((1, 2), (0, 1)), ((), ())), (4, 3, 5), (3, 5, 6)),  # two contracting dims
    ((((2,), (0,)), ((1,), (2,))), (4, 3, 5), (5, 6, 3)),  # batch dims not leading
])
def test_dot_general_matches_lax_for_general_dimension_numbers(fresh_tuning, dims, lhs_shape, rhs_shape):
    lhs, rhs = rand(lhs_shape), rand(rhs_shape)
    out = jax.jit(lambda a, b: jat.dot_general(a, b, dims))(lhs, rhs)
    want = lax.dot_general(lhs.astype(jnp.float64) if False else lhs, rhs, dims,
                           precision=lax.Precision.HIGHEST)
    assert out.shape == want.shape
    assert rel_error(out, want) < REFERENCE_TOLERANCES["float32"]


def test_a_transposed_operand_becomes_a_transposed_layout_key_not_a_copy(fresh_tuning):
    x, w = rand((9, 7)), rand((5, 7))
    jaxpr = jax.make_jaxpr(lambda a, b: jat.dot_general(a, b, (((1,), (1,)), ((), ()))))(x, w)
    names = [eqn.primitive.name for eqn in jaxpr.jaxpr.eqns]
    assert "transpose" not in names
    (eqn,) = [e for e in jaxpr.jaxpr.eqns if e.primitive is primitive.matmul_p]
    assert eqn.params["key"].rhs_layout == Layout.mildly_permuted(transposed=True)
    assert eqn.params["problem"].transpose_b


def test_the_jaxpr_shows_the_key(fresh_tuning):
    text = str(jax.make_jaxpr(jat.matmul)(rand((1000, 1000)), rand((1000, 1000))))
    assert "autotuned_matmul" in text
    assert "lhs_stride_factor=5" in text and "m=1024" in text


def test_grad_matches_jnp_and_backward_keys_carry_transposed_layouts(fresh_tuning):
    x, w = rand((6, 33, 17)), rand((17, 9))

    def loss(f):
        return lambda x, w: jnp.sum(jnp.tanh(f(x, w)))

    got = jax.grad(loss(jat.matmul), argnums=(0, 1))(x, w)
    want = jax.grad(loss(jnp.matmul), argnums=(0, 1))(x, w)
    for g, h in zip(got, want):
        assert rel_error(g, h) < 1e-5
    jaxpr = jax.make_jaxpr(jax.grad(loss(jat.matmul), argnums=(0, 1)))(x, w)
    problems = [e.params["problem"] for e in jaxpr.jaxpr.eqns if e.primitive is primitive.matmul_p]
    assert len(problems) == 3  # forward, d/dx, d/dw
    assert any(p.transpose_b for p in problems)  # dx = ct @ w^T
    assert any(p.transpose_a for p in problems)  # dw = x^T @ ct


@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True), (True, True)])
def test_grad_through_every_transposed_layout(fresh_tuning, ta, tb):
    dims = (((0 if ta else 1,), (1 if tb else 0,)), ((), ()))
    lhs = rand((7, 9) if ta else (9, 7))
    rhs = rand((5, 7) if tb else (7, 5))
    f = lambda g: lambda a, b: jnp.sum(jnp.sin(g(a, b, dims)))  # noqa: E731
    got = jax.grad(f(jat.dot_general), argnums=(0, 1))(lhs, rhs)
    want = jax.grad(f(lambda a, b, d: lax.dot_general(a, b, d, precision="highest")), argnums=(0, 1))(lhs, rhs)
    for g, h in zip(got, want):
        assert rel_error(g, h) < 1e-5


def test_jvp_matches_jnp(fresh_tuning):
    x, w, dx, dw = rand((5, 8)), rand((8, 3)), rand((5, 8)), rand((8, 3))
    primal, tangent = jax.jvp(jat.matmul, (x, w), (dx, dw))
    want_p, want_t = jax.jvp(lambda a, b: jnp.matmul(a, b, precision="highest"), (x, w), (dx, dw))
    assert rel_error(primal, want_p) < 1e-5 and rel_error(tangent, want_t) < 1e-5


@pytest.mark.parametrize("in_axes", [(0, None), (None, 0), (0, 0), (1, 2)])
def test_vmap_matches_jnp_and_rebinds_with_a_new_key(fresh_tuning, in_axes):
    shapes = {None: None}
    x = rand((4, 6, 5) if in_axes[0] == 0 else (6, 4, 5) if in_axes[0] == 1 else (6, 5))
    w = rand((4, 5, 3) if in_axes[1] == 0 else (5, 3, 4) if in_axes[1] == 2 else (5, 3))
    got = jax.vmap(jat.matmul, in_axes=in_axes)(x, w)
    want = jax.vmap(lambda a, b: jnp.matmul(a, b, precision="highest"), in_axes=in_axes)(x, w)
    assert got.shape == want.shape and rel_error(got, want) < 1e-5
    jaxpr = jax.make_jaxpr(jax.vmap(jat.matmul, in_axes=in_axes))(x, w)
    (eqn,) = [e for e in jaxpr.jaxpr.eqns if e.primitive is primitive.matmul_p]
    problem = eqn.params["problem"]
    assert problem.batch * problem.m == 4 * 6 or problem.batch == 4
    del shapes


def test_nested_jit_checkpoint_and_scan(fresh_tuning):
    w = rand((8, 8)) * 0.3

    @jax.jit
    def body(carry, _):
        return jax.checkpoint(lambda c: jnp.tanh(jax.jit(jat.matmul)(c, w)))(carry), None

    x = rand((4, 8))
    got, _ = lax.scan(body, x, None, length=5)
    ref = np.asarray(x, np.float64)
    for _ in range(5):
        ref = np.tanh(ref @ np.asarray(w, np.float64))
    assert rel_error(got, ref) < 1e-5
    g = jax.grad(lambda x: jnp.sum(lax.scan(body, x, None, length=5)[0]))(x)
    g_ref = jax.grad(lambda x: jnp.sum(lax.scan(
        lambda c, _: (jnp.tanh(jnp.matmul(c, w, precision="highest")), None), x, None, length=5)[0]))(x)
    assert rel_error(g, g_ref) < 1e-5


def test_lowering_runs_once_per_compile(fresh_tuning):
    f = jax.jit(lambda a, b: jat.matmul(a, b) + 1)
    a, b = rand((12, 13)), rand((13, 14))
    before = primitive.LOWERINGS.get("cpu", 0)
    f(a, b)
    f(a, b)
    f(a + 1, b)
    assert primitive.LOWERINGS["cpu"] - before == 1


@pytest.mark.parametrize("mode", ["off", "cached", "tune"])
def test_modes_that_compile_give_correct_results(fresh_tuning, mode):
    config.update("mode", mode)
    a, b = rand((20, 30)), rand((30, 10))
    assert rel_error(jax.jit(jat.matmul)(a, b), f64_matmul(a, b)) < REFERENCE_TOLERANCES["float32"]


def test_mode_require_fails_at_compile_time_naming_the_key_until_warmed_up(fresh_tuning):
    a, b = rand((21, 31)), rand((31, 11))
    config.update("mode", "require")
    with pytest.raises(jat.KeyNotTunedError, match="warmup"):
        jax.jit(jat.matmul)(a, b)
    config.update("mode", "tune")
    jat.warmup([(21, 11, 31)])
    config.update("mode", "require")
    jax.clear_caches()
    assert rel_error(jax.jit(jat.matmul)(a, b), f64_matmul(a, b)) < REFERENCE_TOLERANCES["float32"]


PROGRAMS_TO_REQUIRE = {  # name: (fn, argument shapes and dtypes)
    "bare": (lambda a, b: jat.matmul(a, b), [((21, 31), "float32"), ((31, 11), "float32")]),
    "highest": (lambda a, b: jat.matmul(a, b, precision="highest"), [((21, 31), "float32"), ((31, 11), "float32")]),
    "bf16 into f32": (lambda a, b: lax.dot_general(a, b, (((1,), (0,)), ((), ())),
                                                   preferred_element_type=jnp.float32),
                      [((21, 31), "bfloat16"), ((31, 11), "bfloat16")]),
    "in context": (lambda a, b, c: jnp.tanh(a @ b + c) * 3.0,
                   [((21, 31), "float32"), ((31, 11), "float32"), ((11,), "float32")]),
}


@pytest.mark.parametrize("name", list(PROGRAMS_TO_REQUIRE))
def test_the_call_a_require_miss_names_tunes_exactly_the_missing_key(fresh_tuning, name):
    """Run as pasted, the warmup call in a KeyNotTunedError tunes the key it is about."""
    import re

    fn, specs = PROGRAMS_TO_REQUIRE[name]
    args = [rand(shape, dtype) for shape, dtype in specs]
    program = jax.jit(jat.autotune(fn))
    config.update("mode", "require")
    with pytest.raises(jat.KeyNotTunedError) as info:
        program(*args)
    call = re.search(r"Pre-tune it with (jax_autotune\.warmup\(.*?\)) \(in mode 'tune'\)", str(info.value))
    assert call, str(info.value)
    config.update("mode", "tune")
    report = eval(call.group(1), {"jax_autotune": jat})  # noqa: S307 - the message's own call
    assert len(report) == 1 and report.entries[0].key.canonical() in str(info.value)
    config.update("mode", "require")
    jax.clear_caches()
    np.testing.assert_allclose(np.float32(program(*args)), np.float32(fn(*args)), rtol=2e-2, atol=2e-2)


def test_warmup_with_grad_leaves_the_train_step_with_zero_tunings(fresh_tuning):
    params = {"w1": rand((16, 32)) * 0.2, "w2": rand((32, 4)) * 0.2}
    batch = rand((8, 16))

    def loss(params, x):
        return jnp.mean(jat.matmul(jax.nn.relu(jat.matmul(x, params["w1"])), params["w2"]) ** 2)

    @jax.jit
    def train_step(params, x):
        grads = jax.grad(loss)(params, x)
        return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)

    report = jat.warmup(loss, params, batch, grad=True)
    assert len(report) == 5  # 2 forward + 3 backward (no gradient wrt x)
    counters.reset_stats()
    train_step(params, batch)
    counts = jat.stats()
    assert counts["tuned"] == 0 and counts["candidate_runs"] == 0
    assert counts["memory_hits"] >= 5


def test_warmup_accepts_tuples_and_shape_dtype_pairs_and_reports_sources(fresh_tuning):
    first = jat.warmup([(40, 30, 20), (2, 40, 30, 20)])
    assert [e.problem.batch for e in first] == [1, 2]
    pair = (jax.ShapeDtypeStruct((40, 20), "float32"), jax.ShapeDtypeStruct((30, 20), "float32"))
    second = jat.warmup([pair], transpose_b=True)
    assert second.entries[0].problem.transpose_b
    again = jat.warmup([(40, 30, 20)])
    assert again.entries[0].source == "memory"
    with pytest.raises(ValueError, match=r"shapes\[0\]"):
        jat.warmup([(0, 3, 4)])


def test_bad_shapes_and_dimension_numbers_name_the_shapes():
    with pytest.raises(TypeError, match=r"\(3, 4\).*\(5, 6\)"):
        jat.matmul(jnp.ones((3, 4)), jnp.ones((5, 6)))
    with pytest.raises(ValueError, match="at least 1-D"):
        jat.matmul(jnp.ones(()), jnp.ones((3,)))
    with pytest.raises(TypeError, match=r"\(3, 4\)"):
        jat.dot_general(jnp.ones((3, 4)), jnp.ones((5, 6)), (((1,), (0,)), ((), ())))
    with pytest.raises(ValueError, match="dimension_numbers"):
        jat.dot_general(jnp.ones((3, 4)), jnp.ones((4, 6)), "bad")
    with pytest.raises(TypeError, match=r"must be distinct dims"):
        jat.dot_general(jnp.ones((3, 4)), jnp.ones((4, 6)), (((2,), (0,)), ((), ())))
    with pytest.raises(TypeError, match="unexpected keyword"):
        jat.dot_general(jnp.ones((3, 4)), jnp.ones((4, 6)), (((1,), (0,)), ((), ())), bogus=1)


_SHAPE_ERRORS = [  # (ours, theirs): each pair must raise the same exception type
    (lambda: jat.matmul(jnp.ones((3, 4)), jnp.ones((5, 6))),
     lambda: jnp.matmul(jnp.ones((3, 4)), jnp.ones((5, 6)))),
    (lambda: jat.matmul(jnp.ones((2, 3, 4)), jnp.ones((3, 4, 5))),
     lambda: jnp.matmul(jnp.ones((2, 3, 4)), jnp.ones((3, 4, 5)))),
    (lambda: jat.matmul(jnp.ones(()), jnp.ones((3,))),
     lambda: jnp.matmul(jnp.ones(()), jnp.ones((3,)))),
    *[(lambda dims=dims, shapes=shapes: jat.dot_general(*map(jnp.ones, shapes), dims),
       lambda dims=dims, shapes=shapes: lax.dot_general(*map(jnp.ones, shapes), dims))
      for shapes, dims in [(((3, 4), (5, 6)), (((1,), (0,)), ((), ()))),         # contracting sizes
                           (((2, 3, 4), (3, 4, 5)), (((2,), (1,)), ((0,), (0,)))),  # batch sizes
                           (((3, 4), (4, 6)), (((2,), (0,)), ((), ()))),          # out of range
                           (((3, 4), (4, 6)), (((1, 1), (0, 0)), ((), ()))),      # repeated
                           (((2, 3, 4), (2, 4, 5)), (((0,), (0,)), ((0,), (0,)))),  # batch and contracting
                           (((3, 4), (4, 6)), ((1,), (0,)))]],                    # malformed
]


@pytest.mark.parametrize("ours, theirs", _SHAPE_ERRORS)
def test_a_shape_mismatch_raises_the_exception_type_jnp_and_lax_raise(ours, theirs):
    with pytest.raises(Exception) as expected:
        theirs()
    with pytest.raises(Exception) as got:
        ours()
    assert type(got.value) is expected.type, got.value


def test_dot_general_accepts_out_sharding_like_lax(fresh_tuning):
    a, b = rand((3, 4)), rand((4, 5))
    out = jat.dot_general(a, b, (((1,), (0,)), ((), ())), out_sharding=None)
    assert rel_error(out, f64_matmul(a, b)) < REFERENCE_TOLERANCES["float32"]


def test_flax_linen_dense_with_the_drop_in_matches_the_default(fresh_tuning):
    nn = pytest.importorskip("flax.linen")
    x = rand((4, 10))
    default = nn.Dense(7)
    tuned = nn.Dense(7, dot_general=jat.dot_general)
    params = default.init(jax.random.key(0), x)
    assert rel_error(tuned.apply(params, x), default.apply(params, x)) < 1e-5


def test_flax_nnx_linear_with_the_drop_in_matches_the_default(fresh_tuning):
    nnx = pytest.importorskip("flax.nnx")
    x = rand((4, 10))
    default = nnx.Linear(10, 7, rngs=nnx.Rngs(0))
    tuned = nnx.Linear(10, 7, rngs=nnx.Rngs(0), dot_general=jat.dot_general)
    assert rel_error(tuned(x), default(x)) < 1e-5
    grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(tuned)
    assert np.isfinite(np.asarray(grads.kernel[...])).all()


ZERO_SIZE = [((0, 48), (48, 32)), ((5, 0), (0, 3)), ((5, 4), (4, 0)), ((0, 5, 4), (0, 4, 3)),
             ((2, 0, 4), (4, 3)), ((3, 0), (0,)), ((0,), (0, 4)), ((0,), (0,))]


def bound_primitives(fn, *args) -> list:
    return [e for e in equations(jax.make_jaxpr(fn)(*args)) if e.primitive is primitive.matmul_p]


@pytest.mark.parametrize("a_shape, b_shape", ZERO_SIZE)
@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_zero_size_operands_give_what_jnp_gives_without_tuning(fresh_tuning, a_shape, b_shape, dtype):
    a, b = jnp.ones(a_shape, dtype), jnp.ones(b_shape, dtype)
    want = jnp.matmul(a, b)
    for got in (jat.matmul(a, b), jax.jit(jat.matmul)(a, b)):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    assert bound_primitives(jat.matmul, a, b) == []
    assert counters.stats()["tuned"] == 0 and counters.stats()["candidate_compiles"] == 0


@pytest.mark.parametrize("lhs_shape, rhs_shape, dims", [
    ((0, 48), (48, 32), (((1,), (0,)), ((), ()))),
    ((5, 0), (3, 0), (((1,), (1,)), ((), ()))),         # k = 0, rhs transposed: zeros
    ((0, 5, 4), (0, 4, 3), (((2,), (1,)), ((0,), (0,)))),  # batch 0
    ((2, 5, 4), (2, 4, 0), (((2,), (1,)), ((0,), (0,)))),  # n = 0
])
def test_zero_size_dot_general_vmap_and_grad_match_lax(fresh_tuning, lhs_shape, rhs_shape, dims):
    lhs, rhs = jnp.ones(lhs_shape), jnp.ones(rhs_shape)
    want = lax.dot_general(lhs, rhs, dims)
    got = jax.jit(lambda x, y: jat.dot_general(x, y, dims))(lhs, rhs)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    grads = jax.grad(lambda x, y: jat.dot_general(x, y, dims).sum(), argnums=(0, 1))(lhs, rhs)
    want_grads = jax.grad(lambda x, y: lax.dot_general(x, y, dims).sum(), argnums=(0, 1))(lhs, rhs)
    for g, w in zip(grads, want_grads):
        assert g.shape == w.shape
        np.testing.assert_array_equal(g, w)
    stacked = jax.vmap(lambda x, y: jat.dot_general(x, y, dims))(jnp.stack([lhs] * 3), jnp.stack([rhs] * 3))
    assert stacked.shape == (3, *want.shape)
    assert counters.stats()["tuned"] == 0


DIMS = (((1,), (0,)), ((), ()))  # (m, k) x (k, n)


@pytest.mark.parametrize("a_shape, b_shape, in_axes", [
    ((0, 3, 4), (0, 4, 2), (0, 0)), ((0, 3, 4), (4, 2), (0, None)), ((3, 4), (0, 4, 2), (None, 0)),
    ((3, 0, 4), (2, 0, 4, 5), (1, 1)), ((0, 2, 3, 4), (2, 4, 5), (0, None))])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_vmap_over_an_empty_axis_gives_what_jnp_gives(fresh_tuning, a_shape, b_shape, in_axes, dtype):
    a, b = jnp.ones(a_shape, dtype), jnp.ones(b_shape, dtype)
    want = jax.vmap(jnp.matmul, in_axes=in_axes)(a, b)
    calls = [jax.vmap(jat.matmul, in_axes=in_axes), jax.jit(jax.vmap(jat.matmul, in_axes=in_axes)),
             jax.vmap(jat.autotune(jnp.matmul), in_axes=in_axes),
             jat.autotune(jax.vmap(jnp.matmul, in_axes=in_axes))]
    for call in calls:
        got = call(a, b)
        assert got.shape == want.shape and got.dtype == want.dtype
    if [len(shape) - (axis is not None) for shape, axis in zip((a_shape, b_shape), in_axes)] == [2, 2]:
        dot = lambda f: jax.vmap(lambda x, y: f(x, y, DIMS), in_axes=in_axes)(a, b)  # noqa: E731
        got, lax_dot = dot(jat.dot_general), dot(lax.dot_general)
        assert got.shape == lax_dot.shape and got.dtype == lax_dot.dtype
    assert counters.stats()["tuned"] == 0  # nothing to tune for an empty batch
    grads = [jax.vmap(jax.grad(lambda x, y: f(x, y).astype("float32").sum(), argnums=(0, 1)),
                      in_axes=in_axes)(a, b) for f in (jat.matmul, jnp.matmul)]
    assert [g.shape for g in grads[0]] == [g.shape for g in grads[1]]


@pytest.mark.parametrize("bad", [2.5, "1", 1.0])
def test_dimension_numbers_must_be_integers_as_in_lax(bad):
    lhs, rhs = jnp.ones((3, 4)), jnp.ones((4, 5))
    dims = (((bad,), (0,)), ((), ()))
    with pytest.raises(TypeError):
        lax.dot_general(lhs, rhs, dims)
    with pytest.raises(TypeError, match="lhs dims must be integers"):
        jat.dot_general(lhs, rhs, dims)
    assert jat.dot_general(lhs, rhs, (((np.int64(1),), (jnp.int32(0),)), ((), ()))).shape == (3, 5)


class _ConcurrencyTuner:
    """A tuner stand-in for warmup: counts keys tuned at once; with a device timer each
    select waits at a two-party barrier, which passes only if two keys tune together."""

    def __init__(self, device_time: bool):
        import threading
        import types

        self.timer = types.SimpleNamespace(measures_device_time=device_time)
        self.barrier = threading.Barrier(2, timeout=30) if device_time else None
        self.lock, self.running, self.most, self.keys, self.x64 = threading.Lock(), 0, 0, [], []

    def prime(self, work, policy):
        return 0

    def select(self, problem, key, policy):
        from jax_autotune.tuning.decision import Decision

        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.keys.append(key)
            self.x64.append(bool(jax.config.jax_enable_x64))
        if self.barrier is not None:
            self.barrier.wait()
        with self.lock:
            self.running -= 1
        return Decision(key, problem, "xla_dot", source="tuned")


@pytest.mark.parametrize("device_time,expected", [(True, 2), (False, 1)])
def test_warmup_tunes_two_keys_at_once_only_with_a_device_timer(monkeypatch, device_time, expected):
    import importlib

    warmup_module = importlib.import_module("jax_autotune.warmup")  # the attribute is the function
    fake = _ConcurrencyTuner(device_time)
    monkeypatch.setattr(warmup_module, "tuner_for", lambda platform: fake)
    shapes = [(64, 64, 64), (128, 128, 128), (64, 64, 64), (256, 256, 256), (512, 512, 512)]
    report = jat.warmup(shapes, dtype="float32", progress=False)
    assert fake.most == expected
    assert len(report) == len(fake.keys) == 4  # the repeated shape is one key, tuned once
    assert [e.problem.m for e in report] == [64, 128, 256, 512]  # in the order asked


def test_warmup_threads_tune_with_the_callers_x64_setting(monkeypatch):
    import importlib

    warmup_module = importlib.import_module("jax_autotune.warmup")
    fake = _ConcurrencyTuner(device_time=True)
    monkeypatch.setattr(warmup_module, "tuner_for", lambda platform: fake)
    with jax.enable_x64(True):
        report = jat.warmup([(64, 64, 64), (128, 128, 128)], dtype="float64", progress=False)
    assert fake.x64 == [True, True]
    assert {e.problem.lhs_dtype for e in report} == {"float64"}


def test_warmup_of_a_plain_function_tunes_nothing_and_warns_with_the_fix(fresh_tuning):
    w, x = rand((32, 16)), rand((8, 32))
    with pytest.warns(jat.NoTunedMatmulWarning, match=r"jat\.warmup\(jat\.autotune\(fn\), \.\.\.\)"):
        report = jat.warmup(lambda w, x: jnp.sum(x @ w), w, x, grad=True, progress=False)
    assert len(report) == 0 and "no tuned matmul" in str(report)
    assert jat.stats()["tuned"] == 0


def test_warmup_of_the_autotuned_function_tunes_its_matmuls_without_a_warning(fresh_tuning, recwarn):
    w, x = rand((32, 16)), rand((8, 32))
    report = jat.warmup(jat.autotune(lambda w, x: jnp.sum(x @ w)), w, x, grad=True, progress=False)
    assert len(report) == 2  # forward, and the gradient wrt w
    assert not [w for w in recwarn if issubclass(w.category, jat.NoTunedMatmulWarning)]


def test_warmup_of_a_function_without_a_tunable_matmul_says_so():
    with pytest.warns(jat.NoTunedMatmulWarning, match="no matmul"):
        jat.warmup(jnp.sin, rand((4, 4)), progress=False)
    ints = jnp.ones((4, 4), jnp.int8)
    with pytest.warns(jat.NoTunedMatmulWarning, match="only XLA's dot serves"):
        jat.warmup(jat.autotune(jnp.matmul), ints, ints, progress=False)


def test_warmup_of_an_unknown_dtype_names_it_and_lists_dtype_names():
    with pytest.raises(TypeError, match=r"warmup: dtype 'float8': expected a dtype name such as "
                                        r"float32, .*bfloat16"):
        jat.warmup([(4, 4, 4)], dtype="float8")


def test_a_warmup_row_without_a_measurement_says_why(fresh_tuning):
    report = jat.warmup([(8, 16, 32)], precision="F32_F32_F32", progress=False)  # XLA's dot alone
    [entry] = report.entries
    assert entry.winner == "xla_dot" and entry.winner_seconds is None
    assert "algorithm preset" in entry.reason and entry.reason in str(report).splitlines()[1]
