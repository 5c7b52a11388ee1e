"""Drop-in conformance: jat.dot_general and jat.matmul accept and return what lax.dot_general
and jnp.matmul do (dtypes, weak types, precision levels, algorithm presets, the default
matmul precision), forward and under grad, jvp, second-order grad and vmap."""

import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_autotune as jat
from jax_autotune import primitive
from jax_autotune.key import MatmulKey, Precision
from jax_autotune.kernels.xla import lax_precision
from jax_autotune.problem import key_precision, problem_for
from jax_autotune.tuners import tuner_for
from jax_autotune.jaxprs import equations
from numerics import REFERENCE_TOLERANCES, rand_stream, rel_error

DIMS = (((1,), (0,)), ((), ()))
DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "bfloat16", "float32", "float64", "complex64", "complex128"]
# norm-wise relative error allowed against a float64 reference, by the narrowest type used
PRESETS = list(lax.DotAlgorithmPreset)
# the type a preset computes in, where it is narrower than its operands'
PRESET_COMPUTE = {"F16_F16_F16": "float16", "F16_F16_F32": "float16", "BF16_BF16_BF16": "bfloat16",
                  "BF16_BF16_F32": "bfloat16", "BF16_BF16_F32_X3": "float32",
                  "BF16_BF16_F32_X6": "float32", "BF16_BF16_F32_X9": "float32",
                  "TF32_TF32_F32": "bfloat16", "TF32_TF32_F32_X3": "float32", "F32_F32_F32": "float32"}


def lax_result_precision(precision):
    """lax's canonical form of ``precision``, read from its own jaxpr."""
    a = jax.ShapeDtypeStruct((1, 1), "float32")
    (eqn,) = jax.make_jaxpr(lambda a, b: lax.dot_general(a, b, DIMS, precision=precision))(a, a).jaxpr.eqns
    return eqn.params["precision"]


rand = rand_stream(17)


def tolerance(*dtypes):
    return max(REFERENCE_TOLERANCES.get(str(jnp.dtype(d)), 0.0) for d in dtypes)


def outcome(fn, *args):
    """('ok', dtype, weak_type) or ('error', type, message) of abstract evaluation."""
    try:
        out = jax.eval_shape(fn, *args)
    except Exception as err:  # noqa: BLE001 - the error itself is compared
        return ("error", type(err), str(err))
    return ("ok", jnp.dtype(out.dtype), bool(out.weak_type))


def run(fn, *args):
    """('ok', outputs as numpy) or ('error', type, message) of a jitted call."""
    try:
        return ("ok", jax.tree.map(np.asarray, jax.jit(fn)(*args)))
    except Exception as err:  # noqa: BLE001 - the error itself is compared
        return ("error", type(err), str(err).split("\n")[0])


def matmul_eqns(jaxpr):
    """The tuned matmuls of a jaxpr, nested jaxprs included."""
    return [e for e in equations(jaxpr) if e.primitive is primitive.matmul_p]


def dot_result_dtypes(fn, *args):
    """The result dtypes of every matmul a function's jaxpr runs, ours and lax's alike."""
    eqns = jax.make_jaxpr(fn)(*args).jaxpr.eqns
    return sorted(str(e.outvars[0].aval.dtype) for e in eqns
                  if e.primitive in (primitive.matmul_p, lax.dot_general_p))


# ---------------------------------------------------------------- dtypes

@pytest.mark.parametrize("preferred", [None, "float32", "int32", "bfloat16", "float64", "int8"])
def test_result_dtype_and_errors_match_lax_for_every_dtype_pair(fresh_tuning, preferred):
    mismatches = []
    with jax.enable_x64(True):
        for x, y in itertools.product(DTYPES, DTYPES):
            a, b = jax.ShapeDtypeStruct((3, 4), x), jax.ShapeDtypeStruct((4, 2), y)
            for ours, theirs in [
                    (lambda a, b: jat.dot_general(a, b, DIMS, preferred_element_type=preferred),
                     lambda a, b: lax.dot_general(a, b, DIMS, preferred_element_type=preferred)),
                    (lambda a, b: jat.matmul(a, b, preferred_element_type=preferred),
                     lambda a, b: jnp.matmul(a, b, preferred_element_type=preferred))]:
                got, want = outcome(ours, a, b), outcome(theirs, a, b)
                if got != want:
                    mismatches.append((x, y, got, want))
    assert not mismatches, mismatches[:10]


def test_the_dtype_rule_follows_the_x64_setting_in_force(fresh_tuning):
    a = jnp.ones((2, 3))
    for x64, want in [(False, "float32"), (True, "float64"), (False, "float32")]:
        with jax.enable_x64(x64):
            wide = jax.eval_shape(lambda a: jat.dot_general(a, a.T, DIMS, preferred_element_type="float64"), a)
            assert wide.dtype == jnp.dtype(want)
            assert jax.eval_shape(lambda a: jat.matmul(a, a.T, preferred_element_type="float64"), a).dtype == want


def test_bfloat16_with_a_float32_accumulator_backward_as_lax_does(fresh_tuning):
    x, w = rand((6, 12), "bfloat16"), rand((12, 5), "bfloat16")
    loss = lambda f: lambda x, w: jnp.sum(f(x, w, DIMS, preferred_element_type=jnp.float32) ** 2)  # noqa: E731
    assert dot_result_dtypes(jax.grad(loss(jat.dot_general), (0, 1)), x, w) == \
        dot_result_dtypes(jax.grad(loss(lax.dot_general), (0, 1)), x, w) == ["float32"] * 3
    for g, h in zip(jax.grad(loss(jat.dot_general), (0, 1))(x, w), jax.grad(loss(lax.dot_general), (0, 1))(x, w)):
        assert g.dtype == h.dtype == jnp.bfloat16 and rel_error(g, h) < REFERENCE_TOLERANCES["bfloat16"]


def test_weak_typed_operands_give_lax_weak_types(fresh_tuning):
    weak = jnp.broadcast_to(2.0, (3, 3))
    strong = jnp.ones((3, 3))
    assert jax.typeof(weak).weak_type
    for a, b in [(weak, weak), (weak, strong), (strong, weak)]:
        assert jax.typeof(jat.dot_general(a, b, DIMS)) == jax.typeof(lax.dot_general(a, b, DIMS))
        assert jax.typeof(jat.matmul(a, b)) == jax.typeof(jnp.matmul(a, b))


@pytest.mark.parametrize("x, y, preferred", [
    ("float16", "bfloat16", None), ("bfloat16", "float16", None), ("float16", "bfloat16", "float32"),
    ("bfloat16", "float32", None), ("float32", "float16", "bfloat16"), ("float32", "float64", None)])
def test_mixed_float_operands_match_lax_forward_and_grad(fresh_tuning, x, y, preferred):
    with jax.enable_x64(True):
        a, b = rand((9, 13), x), rand((13, 5), y)
        ours = lambda a, b: jat.dot_general(a, b, DIMS, preferred_element_type=preferred)  # noqa: E731
        theirs = lambda a, b: lax.dot_general(a, b, DIMS, preferred_element_type=preferred)  # noqa: E731
        got, want = jax.jit(ours)(a, b), jax.jit(theirs)(a, b)
        assert got.dtype == want.dtype
        exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
        tol = tolerance(want.dtype, *(d for d in (x, y) if jnp.dtype(d).itemsize < want.dtype.itemsize))
        assert rel_error(got, exact) < tol and rel_error(got, want) < tol
        # the key holds what runs: both operands converted to the result dtype, as lax does
        (eqn,) = matmul_eqns(jax.make_jaxpr(ours)(a, b))
        assert eqn.params["key"].lhs_dtype == eqn.params["key"].rhs_dtype == str(want.dtype)

        def loss(f):
            return lambda a, b: jnp.sum(jnp.sin(f(a, b).astype(jnp.float32)))

        grads = jax.jit(jax.grad(loss(ours), (0, 1)))(a, b)
        lax_grads = jax.jit(jax.grad(loss(theirs), (0, 1)))(a, b)
        # the cotangent products keep the forward's result dtype, as lax's transposes do
        assert dot_result_dtypes(jax.grad(loss(ours), (0, 1)), a, b) == \
            dot_result_dtypes(jax.grad(loss(theirs), (0, 1)), a, b)
        for g, h, operand in zip(grads, lax_grads, (a, b)):
            assert g.dtype == h.dtype == operand.dtype
            assert rel_error(g, h) < 2 * tolerance(want.dtype, operand.dtype)


def test_f16_by_bf16_matmul_follows_jnp_promotion(fresh_tuning):
    a, b = rand((6, 8), "float16"), rand((8, 4), "bfloat16")
    out = jat.matmul(a, b)
    assert out.dtype == jnp.matmul(a, b).dtype == jnp.float32
    assert rel_error(out, np.asarray(a, np.float64) @ np.asarray(b, np.float64)) < REFERENCE_TOLERANCES["float16"]


# ---------------------------------------------------------------- algorithm presets

def test_every_lax_preset_has_a_key_precision_and_round_trips():
    for preset in PRESETS:
        level = key_precision(preset)
        assert level is not None and level.algorithm == preset.name
        assert lax_precision(level) is preset
        assert MatmulKey.parse(problem_for(jax.ShapeDtypeStruct((8, 8), "float32"),
                                           jax.ShapeDtypeStruct((8, 8), "float32"),
                                           precision=preset).key().canonical()).precision is level
    # the preset DEFAULT is not the level DEFAULT: lax's dtype rule differs for it
    assert key_precision(lax.DotAlgorithmPreset.DEFAULT) is Precision.ALGORITHM_DEFAULT
    for level in (Precision.DEFAULT, Precision.HIGH, Precision.HIGHEST):
        assert level.algorithm is None and lax_precision(level) is getattr(lax.Precision, level.value)


def test_old_canonical_keys_and_json_still_parse_to_equal_keys():
    old = ("m=1024 n=1024 k=1024 batch=1 lhs_pow2_factor=4 rhs_pow2_factor=4 lhs_stride_factor=5 "
           "rhs_stride_factor=5 lhs_layout=Contiguous rhs_layout=Contiguous lhs_dtype=float32 "
           "rhs_dtype=float32 out_dtype=float32 precision=HIGHEST scale=Medium kind=General")
    s = jax.ShapeDtypeStruct((1000, 1000), "float32")
    now = problem_for(s, s, precision="highest").key()
    assert MatmulKey.parse(old) == now and now.canonical() == old
    old_default = ("m=64 n=64 k=1024 batch=1 lhs_pow2_factor=4 rhs_pow2_factor=4 lhs_stride_factor=4 "
                   "rhs_stride_factor=4 lhs_layout=Contiguous "
                   "rhs_layout=MildlyPermuted{transposed:true,batch_swap:false} lhs_dtype=bfloat16 "
                   "rhs_dtype=bfloat16 out_dtype=float32 precision=DEFAULT scale=Medium kind=General")
    t = jax.ShapeDtypeStruct((64, 1000), "bfloat16")
    now = problem_for(t, t, transpose_b=True, preferred_element_type="float32").key()
    assert MatmulKey.parse(old_default) == now
    assert MatmulKey.from_json(now.to_json()) == now and now.to_json()["precision"] == "DEFAULT"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("preset", PRESETS, ids=[p.name for p in PRESETS])
def test_presets_forward_and_grad_as_lax_does_or_lax_own_error(fresh_tuning, preset, dtype):
    with jax.enable_x64(True):
        a, b = rand((6, 9), dtype), rand((9, 4), dtype)
        for precision in (preset, preset.name):
            ours = lambda a, b: jat.dot_general(a, b, DIMS, precision=precision)  # noqa: E731
            theirs = lambda a, b: lax.dot_general(a, b, DIMS, precision=precision)  # noqa: E731
            got, want = run(ours, a, b), run(theirs, a, b)
            assert got[0] == want[0], (got, want)
            if want[0] == "error":  # e.g. TF32_TF32_F32 on the CPU: lax's own error, as lax raises it
                assert got == want
                continue
            assert got[1].dtype == want[1].dtype
            tol = tolerance(PRESET_COMPUTE.get(preset.name, dtype), dtype)
            exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
            assert rel_error(got[1], want[1]) <= tol / 10 and rel_error(got[1], exact) < tol
            (eqn,) = matmul_eqns(jax.make_jaxpr(ours)(a, b))
            assert eqn.params["key"].precision.algorithm == preset.name

            def loss(f):
                return lambda a, b: jnp.sum(jnp.sin(f(a, b))).astype(jnp.float32)

            grads = run(jax.grad(loss(ours), (0, 1)), a, b)[1]
            lax_grads = run(jax.grad(loss(theirs), (0, 1)), a, b)[1]
            for g, h in zip(grads, lax_grads):
                assert g.dtype == h.dtype == jnp.dtype(dtype) and rel_error(g, h) <= 2 * tol


def test_presets_error_as_lax_does_when_called_eagerly(fresh_tuning):
    a, b = rand((4, 3)), rand((3, 2))
    for precision in ("F16_F16_F32", lax.DotAlgorithmPreset.TF32_TF32_F32):
        with pytest.raises(ValueError) as ours:
            jat.matmul(a, b, precision=precision)
        with pytest.raises(ValueError) as theirs:
            jnp.matmul(a, b, precision=precision)
        assert str(ours.value) == str(theirs.value)


def test_a_preset_runs_xla_dot_alone_without_a_benchmark(fresh_tuning):
    a, b = rand((8, 8)), rand((8, 8))  # a key the native kernels would compete for
    out = jax.jit(lambda a, b: jat.matmul(a, b, precision="F32_F32_F32"))(a, b)
    assert rel_error(out, np.asarray(a, np.float64) @ np.asarray(b, np.float64)) < REFERENCE_TOLERANCES["float32"]
    stats = jat.stats()
    assert stats["candidate_runs"] == 0 and stats["candidate_compiles"] == 0
    (entry,) = jat.warmup([(8, 8, 8)], precision=lax.DotAlgorithmPreset.F32_F32_F32).entries
    assert entry.winner == "xla_dot" and entry.problem.precision is Precision.F32_F32_F32
    assert "F32_F32_F32" in tuner_for("cpu").known.lookup(entry.key).reason


def test_preset_default_keeps_lax_dtype_rule_for_narrow_integer_results(fresh_tuning):
    a, b = jnp.arange(12, dtype=jnp.int32).reshape(3, 4) * 20, jnp.full((4, 2), 3, jnp.int32)
    preset = lax.DotAlgorithmPreset.DEFAULT
    got = jat.dot_general(a, b, DIMS, precision=preset, preferred_element_type=jnp.int8)
    want = lax.dot_general(a, b, DIMS, precision=preset, preferred_element_type=jnp.int8)
    assert got.dtype == want.dtype == jnp.int8
    np.testing.assert_array_equal(got, want)
    with pytest.raises(TypeError, match="narrower"):
        jat.dot_general(a, b, DIMS, preferred_element_type=jnp.int8)


@pytest.mark.parametrize("x, y", [("float16", "bfloat16"), ("bfloat16", "float32"), ("float32", "float32")])
def test_presets_with_mixed_dtypes_and_preferred_type_match_lax(fresh_tuning, x, y):
    a, b = rand((7, 5), x), rand((5, 6), y)
    for preset, preferred in [("BF16_BF16_F32", None), ("BF16_BF16_F32", "float32"), ("F32_F32_F32", None),
                              ("F16_F16_F16", None)]:
        ours = lambda a, b: jat.dot_general(a, b, DIMS, precision=preset,  # noqa: E731
                                            preferred_element_type=preferred)
        theirs = lambda a, b: lax.dot_general(a, b, DIMS, precision=preset,  # noqa: E731
                                              preferred_element_type=preferred)
        got, want = run(ours, a, b), run(theirs, a, b)
        assert got[0] == want[0] == "ok" and got[1].dtype == want[1].dtype
        assert rel_error(got[1], want[1]) <= tolerance(got[1].dtype) / 10
        loss = lambda f: lambda a, b: jnp.sum(f(a, b).astype(jnp.float32) ** 2)  # noqa: E731
        assert dot_result_dtypes(jax.grad(loss(ours), (0, 1)), a, b) == \
            dot_result_dtypes(jax.grad(loss(theirs), (0, 1)), a, b)
        for g, h in zip(run(jax.grad(loss(ours), (0, 1)), a, b)[1], run(jax.grad(loss(theirs), (0, 1)), a, b)[1]):
            assert g.dtype == h.dtype and rel_error(g, h) <= 2 * tolerance("bfloat16")


@pytest.mark.parametrize("x_dtype, w_dtype, precision", [
    ("float32", "float32", "BF16_BF16_F32_X3"), ("bfloat16", "float32", None),
    ("float16", "bfloat16", lax.DotAlgorithmPreset.BF16_BF16_F32), ("float32", "float32", "highest")])
def test_jvp_second_order_grad_and_vmap_match_lax(fresh_tuning, x_dtype, w_dtype, precision):
    x, w, dx, dw = rand((5, 8), x_dtype), rand((8, 3), w_dtype), rand((5, 8), x_dtype), rand((8, 3), w_dtype)
    ours = lambda a, b: jat.dot_general(a, b, DIMS, precision=precision)  # noqa: E731
    theirs = lambda a, b: lax.dot_general(a, b, DIMS, precision=precision)  # noqa: E731
    tol = tolerance(x_dtype, w_dtype, "bfloat16" if precision == "BF16_BF16_F32" else "float32")
    (p1, t1), (p2, t2) = jax.jvp(ours, (x, w), (dx, dw)), jax.jvp(theirs, (x, w), (dx, dw))
    assert p1.dtype == p2.dtype and t1.dtype == t2.dtype
    assert rel_error(p1, p2) <= tol / 10 and rel_error(t1, t2) <= tol

    def hessian_vector(f):
        inner = jax.grad(lambda a, b: jnp.sum(jnp.tanh(f(a, b).astype(jnp.float32))), argnums=1)
        return jax.grad(lambda a, b: jnp.sum(inner(a, b).astype(jnp.float32) ** 2), argnums=(0, 1))

    for g, h in zip(hessian_vector(ours)(x, w), hessian_vector(theirs)(x, w)):
        assert g.dtype == h.dtype and rel_error(g, h) <= 4 * tol
    assert dot_result_dtypes(hessian_vector(ours), x, w) == dot_result_dtypes(hessian_vector(theirs), x, w)
    want = {key_precision(lax_result_precision(precision))}
    assert {e.params["key"].precision for e in matmul_eqns(jax.make_jaxpr(hessian_vector(ours))(x, w))} == want
    xs = rand((4, 5, 8), x_dtype)
    for in_axes, args in [((0, None), (xs, w)), ((None, 0), (x, jnp.stack([w] * 2))), ((0, 0), (xs, jnp.stack([w] * 4)))]:
        got, expected = jax.vmap(ours, in_axes=in_axes)(*args), jax.vmap(theirs, in_axes=in_axes)(*args)
        assert got.dtype == expected.dtype and rel_error(got, expected) <= tol / 10
        (eqn,) = matmul_eqns(jax.make_jaxpr(jax.vmap(ours, in_axes=in_axes))(*args))
        assert eqn.params["key"].precision in want


def test_a_dot_algorithm_goes_to_lax_itself(fresh_tuning):
    algorithm = lax.DotAlgorithm(jnp.float32, jnp.float32, jnp.float32)
    a, b = rand((4, 3)), rand((3, 2))
    for ours, theirs in [(lambda a, b: jat.dot_general(a, b, DIMS, precision=algorithm),
                          lambda a, b: lax.dot_general(a, b, DIMS, precision=algorithm)),
                         (lambda a, b: jat.matmul(a, b, precision=algorithm),
                          lambda a, b: jnp.matmul(a, b, precision=algorithm))]:
        assert not matmul_eqns(jax.make_jaxpr(ours)(a, b))
        assert run(ours, a, b) == run(theirs, a, b)  # on the CPU: lax's own error


def test_a_precision_lax_rejects_gives_lax_error(fresh_tuning):
    a, b = rand((4, 3)), rand((3, 2))
    for bad in ("fast-ish", ("highest",), 3):
        with pytest.raises(ValueError) as ours:
            jat.dot_general(a, b, DIMS, precision=bad)
        with pytest.raises(ValueError) as theirs:
            lax.dot_general(a, b, DIMS, precision=bad)
        assert str(ours.value) == str(theirs.value)
    with pytest.raises(ValueError, match="precision: .*DotAlgorithm"):
        jat.key_for(jax.ShapeDtypeStruct((2, 2), "float32"), jax.ShapeDtypeStruct((2, 2), "float32"),
                    precision=lax.DotAlgorithm(jnp.float32, jnp.float32, jnp.float32))


# ---------------------------------------------------------------- default_matmul_precision

CONTEXT_VALUES = {"bfloat16": Precision.DEFAULT, "tensorfloat32": Precision.HIGH,
                  "float32": Precision.HIGHEST, "default": Precision.DEFAULT, "high": Precision.HIGH,
                  "highest": Precision.HIGHEST,
                  **{p.name: Precision(p.name) for p in PRESETS if p.name != "DEFAULT"}}


@pytest.mark.parametrize("value", sorted(CONTEXT_VALUES))
def test_default_matmul_precision_context_is_in_the_key_and_numerics_match_lax(fresh_tuning, value):
    x, w = rand((6, 10)), rand((10, 4))
    loss = lambda f: lambda x, w: jnp.sum(jnp.sin(f(x, w)))  # noqa: E731
    with jax.default_matmul_precision(value):
        for f in (jat.matmul, lambda a, b: jat.dot_general(a, b, DIMS)):
            (eqn,) = matmul_eqns(jax.make_jaxpr(f)(x, w))
            assert eqn.params["key"].precision is CONTEXT_VALUES[value]
            got, want = run(f, x, w), run(jnp.matmul, x, w)
            assert got[0] == want[0]
            if want[0] == "error":  # a preset the CPU does not run: lax's own error
                assert got == want
                continue
            tol = tolerance(PRESET_COMPUTE.get(value, "float32"))
            assert rel_error(got[1], want[1]) <= tol / 10
            assert rel_error(got[1], np.asarray(x, np.float64) @ np.asarray(w, np.float64)) < tol
            grads = run(jax.grad(loss(f), (0, 1)), x, w)[1]
            for g, h in zip(grads, run(jax.grad(loss(jnp.matmul), (0, 1)), x, w)[1]):
                assert rel_error(g, h) <= 2 * tol


def test_the_jax_default_matmul_precision_setting_is_read_at_trace_time(fresh_tuning):
    x, w = rand((6, 10)), rand((10, 4))
    previous = jax.config.jax_default_matmul_precision
    try:
        jax.config.update("jax_default_matmul_precision", "F32_F32_F32")
        (eqn,) = matmul_eqns(jax.make_jaxpr(jat.matmul)(x, w))
        assert eqn.params["key"].precision is Precision.F32_F32_F32
        assert rel_error(jat.matmul(x, w), np.asarray(x, np.float64) @ np.asarray(w, np.float64)) < 2e-5
        jax.config.update("jax_default_matmul_precision", "tensorfloat32")
        (eqn,) = matmul_eqns(jax.make_jaxpr(jat.matmul)(x, w))
        assert eqn.params["key"].precision is Precision.HIGH
    finally:
        jax.config.update("jax_default_matmul_precision", previous)
    (eqn,) = matmul_eqns(jax.make_jaxpr(jat.matmul)(x, w))
    assert eqn.params["key"].precision is Precision.DEFAULT


def test_a_worker_thread_sees_the_x64_setting_of_the_thread_that_handed_it_work():
    import concurrent.futures

    from jax_autotune.tuning.threads import carrying_x64

    def dtype_in_thread():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the truncation warning of the plain thread
            return str(jnp.zeros(2, "float64").dtype)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        with jax.enable_x64(True):
            carried = pool.submit(carrying_x64(dtype_in_thread)).result()
            plain = pool.submit(dtype_in_thread).result()
        with jax.enable_x64(False):
            off = pool.submit(carrying_x64(dtype_in_thread)).result()
    assert (carried, plain, off) == ("float64", "float32", "float32")


def test_a_float64_key_under_the_x64_context_is_tuned_on_float64_operands(fresh_tuning):
    rng = np.random.default_rng(11)
    with jax.enable_x64(True):
        a = jnp.asarray(rng.standard_normal((33, 65)))
        b = jnp.asarray(rng.standard_normal((65, 17)))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = jax.jit(jat.matmul)(a, b)
        key = jat.key_for(a, b)
        want = np.asarray(a) @ np.asarray(b)
        assert out.dtype == jnp.float64
        assert np.max(np.abs(np.asarray(out) - want)) <= 1e-12 * np.max(np.abs(want))
    truncations = [w for w in caught if "truncated" in str(w.message)]
    assert not truncations, [str(w.message) for w in truncations][:2]
    assert jat.stats()["tuned"] == 1
    decision = tuner_for("cpu").known.lookup(key)
    failed = [(r.name, r.error) for r in decision.results if r.outcome not in ("ok", "skipped")]
    assert not failed, failed  # f32 stand-ins made the float64 native kernels refuse them
