"""autotune(fn): every matmul of an unmodified function becomes the tuned primitive, through every
nested jaxpr, with the untouched function's values, gradients, effects and caching."""

import functools
import inspect
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_autotune as jat
from jax_autotune import config, primitive
from jax_autotune.registry import RUNTIME
from jax_autotune.jaxprs import equations
import numerics

TUNED = ("autotuned_matmul", "autotuned_matmul_epilogue")  # a dot alone, or in its context
F32 = dict(rtol=2e-5, atol=2e-5)
TOL = {jnp.float32: F32, jnp.bfloat16: dict(rtol=3e-2, atol=3e-2)}
MM = (((1,), (0,)), ((), ()))  # (m, k) x (k, n)


def count(closed, names):
    """Equations named ``names`` (a name or a tuple) in a jaxpr and in every jaxpr nested
    in its params."""
    names = (names,) if isinstance(names, str) else names
    return sum(eqn.primitive.name in names for eqn in equations(closed))


def assert_all_tuned(fn, *args, expected):
    """fn traces to ``expected`` dots, and autotune(fn) to as many tuned ones and no dot."""
    assert count(jax.make_jaxpr(fn)(*args), "dot_general") == expected
    rewritten = jax.make_jaxpr(jat.autotune(fn))(*args)
    assert count(rewritten, "dot_general") == 0
    assert count(rewritten, TUNED) == expected


rand = functools.partial(numerics.rand, scale=0.5)  # activations stay in their sensitive range


def f64(x):
    return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


def assert_trees_close(got, want, **tol):
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(f64(g), f64(w), **tol)


# ---------------------------------------------------------------- one function, every kind of dot

def model(x, w, q, k):
    """Each output is one kind of dot; its float64 reference is in ``reference``."""
    return {
        "einsum": jnp.einsum("ij,jk->ik", x, w),
        "operator": x @ w,
        "jnp.matmul": jnp.matmul(x, w),
        "tensordot": jnp.tensordot(x, w, axes=1),
        "dot_general": lax.dot_general(x, w, MM),
        "attention": jnp.einsum("bqd,bkd->bqk", q, k),
        "scan": lax.scan(lambda c, _: (c @ w.T, None), x, None, length=2)[0],
        "cond": lax.cond(x[0, 0] > -100, lambda a: a @ w, lambda a: a[:, :3] * 0, x),
        "remat": jax.checkpoint(lambda a: jnp.sin(a @ w))(x),
        "jit": jax.jit(lambda a, b: jnp.dot(a, b))(x, w),
    }


def reference(x, w, q, k):
    x, w, q, k = map(f64, (x, w, q, k))
    return {"einsum": x @ w, "operator": x @ w, "jnp.matmul": x @ w, "tensordot": x @ w,
            "dot_general": x @ w, "attention": np.einsum("bqd,bkd->bqk", q, k),
            "scan": x @ w.T @ w.T, "cond": x @ w, "remat": np.sin(x @ w), "jit": x @ w}


def model_args(dtype=jnp.float32):
    return (rand(0, 3, 3, dtype=dtype), rand(1, 3, 3, dtype=dtype), rand(2, 2, 4, 8, dtype=dtype),
            rand(3, 2, 5, 8, dtype=dtype))


def test_every_dot_of_every_nested_jaxpr_is_tuned():
    assert_all_tuned(model, *model_args(), expected=10)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_values_match_float64_reference_jitted_and_eager(dtype):
    args = model_args(dtype)
    ref = reference(*args)
    for out in (jax.jit(jat.autotune(model))(*args), jat.autotune(model)(*args)):
        assert out.keys() == ref.keys()
        for name in ref:
            assert out[name].dtype == dtype, name
            np.testing.assert_allclose(f64(out[name]), ref[name], **TOL[dtype], err_msg=name)


def test_gradients_match_untouched_function_and_backward_dots_are_tuned():
    def loss(x, w, q, k):
        return sum(jnp.sum(v ** 2) for v in jax.tree_util.tree_leaves(model(x, w, q, k)))
    args, argnums = model_args(), (0, 1, 2, 3)
    grads = jax.jit(jax.grad(jat.autotune(loss), argnums=argnums))(*args)
    assert_trees_close(grads, jax.grad(loss, argnums=argnums)(*args), **F32)
    backward = jax.make_jaxpr(jax.grad(jat.autotune(loss), argnums=argnums))(*args)
    assert count(backward, "dot_general") == 0 and count(backward, TUNED) > 10
    # the attention cotangent against float64: d/dq sum((q k^T)^2) = 2 (q k^T) k
    q, k = f64(args[2]), f64(args[3])
    attention_only = lambda q, k: jnp.sum(jnp.einsum("bqd,bkd->bqk", q, k) ** 2)  # noqa: E731
    np.testing.assert_allclose(f64(jax.grad(jat.autotune(attention_only))(args[2], args[3])),
                               2 * np.einsum("bqk,bkd->bqd", np.einsum("bqd,bkd->bqk", q, k), k), **F32)


def test_signature_and_pytree_structure_are_kept():
    def fn(params, x, *, scale=1.0):
        """doc"""
        return {"y": (x @ params["w"]) * scale, "aux": [x.sum()]}
    params, x = {"w": rand(1, 3, 3)}, rand(0, 2, 3)
    tuned = jat.autotune(fn)
    assert tuned.__name__ == "fn" and tuned.__doc__ == "doc"
    assert inspect.signature(tuned) == inspect.signature(fn)
    out = tuned(params, x, scale=2.0)
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(fn(params, x))
    np.testing.assert_allclose(f64(out["y"]), 2 * f64(x) @ f64(params["w"]), **F32)
    from_numpy = tuned({"w": np.asarray(params["w"])}, np.asarray(x), scale=2.0)  # NumPy leaves are traced
    np.testing.assert_allclose(from_numpy["y"], out["y"], **F32)


def test_a_non_callable_is_an_error_naming_fn():
    with pytest.raises(TypeError, match=r"autotune\(fn\): fn must be callable"):
        jat.autotune(jnp.ones(3))


def test_closed_over_constants_in_nested_jaxprs():
    table = np.arange(9.0, dtype=np.float32).reshape(3, 3) / 9

    def fn(x):
        y = jax.checkpoint(lambda a: a @ table)(x)
        y = jax.jit(lambda a: a @ table.T)(y)
        return lax.scan(lambda c, _: (c @ table, None), y, None, length=2)[0]
    x = rand(0, 2, 3)
    assert_all_tuned(fn, x, expected=3)  # the scan body holds one
    t = table.astype(np.float64)
    np.testing.assert_allclose(f64(jax.jit(jat.autotune(fn))(x)), f64(x) @ t @ t.T @ t @ t, **F32)


# ---------------------------------------------------------------- flax, unmodified

def test_flax_linen_dense_densegeneral_einsum_without_dot_general():
    nn = pytest.importorskip("flax.linen")

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Dense(4)(x)
            x = nn.DenseGeneral((2, 3))(x)
            return nn.Einsum((2, 3, 5), "bij,ijk->bk")(x)
    x = rand(0, 2, 3)
    net = Net()
    params = net.init(jax.random.key(0), x)
    assert_all_tuned(net.apply, params, x, expected=3)
    p = jax.tree_util.tree_map(f64, params)["params"]
    h = f64(x) @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"]
    h = np.einsum("bi,ijk->bjk", h, p["DenseGeneral_0"]["kernel"]) + p["DenseGeneral_0"]["bias"]
    want = np.einsum("bij,ijk->bk", h, p["Einsum_0"]["kernel"]) + p["Einsum_0"]["bias"]
    np.testing.assert_allclose(f64(jax.jit(jat.autotune(net.apply))(params, x)), want, **F32)


def test_nnx_linear_as_argument_and_closure():
    nnx = pytest.importorskip("flax.nnx")
    layer = nnx.Linear(3, 4, rngs=nnx.Rngs(0))
    x = rand(0, 2, 3)
    apply = lambda m, v: m(v)  # noqa: E731
    assert_all_tuned(apply, layer, x, expected=1)
    assert_all_tuned(lambda v: layer(v), x, expected=1)
    expected = f64(x) @ f64(layer.kernel[...]) + f64(layer.bias[...])
    np.testing.assert_allclose(f64(jat.autotune(apply)(layer, x)), expected, **F32)
    np.testing.assert_allclose(f64(jax.jit(jat.autotune(lambda v: layer(v)))(x)), expected, **F32)

    def loss_fn(model, x):
        return jnp.mean(model(x) ** 2)
    grads = nnx.jit(nnx.grad(jat.autotune(loss_fn)))(layer, x)
    dy = 2 * expected / expected.size
    np.testing.assert_allclose(f64(grads.kernel[...]), f64(x).T @ dy, **F32)
    np.testing.assert_allclose(f64(grads.bias[...]), dy.sum(0), **F32)


# ---------------------------------------------------------------- custom derivatives

@jax.custom_vjp
def vjp_dense(x, w):
    return jnp.tanh(x @ w)


def _vjp_fwd(x, w):
    y = jnp.tanh(x @ w)
    return y, (x, w, y)


def _vjp_bwd(res, g):
    x, w, y = res
    g = g * (1 - y ** 2)
    return g @ w.T, x.T @ g


vjp_dense.defvjp(_vjp_fwd, _vjp_bwd)


def test_custom_vjp_primal_fwd_and_bwd_rules_are_tuned_under_grad():
    x, w = rand(0, 3, 3), rand(1, 3, 3)
    assert_all_tuned(vjp_dense, x, w, expected=1)
    loss = lambda x, w: jnp.sum(vjp_dense(x, w) ** 2)  # noqa: E731
    backward = jax.make_jaxpr(jax.grad(jat.autotune(loss), argnums=(0, 1)))(x, w)
    # the fwd rule's dot, and the bwd rule's two: the backward pass is traced, then tuned
    assert count(backward, TUNED) == 3 and count(backward, "dot_general") == 0
    assert_all_tuned(jax.grad(loss, argnums=(0, 1)), x, w, expected=3)  # bwd traced into the jaxpr

    np.testing.assert_allclose(f64(jax.jit(jat.autotune(vjp_dense))(x, w)), np.tanh(f64(x) @ f64(w)), **F32)
    want = jax.grad(loss, argnums=(0, 1))(x, w)
    for tuned in (jax.grad(jat.autotune(loss), argnums=(0, 1)), jat.autotune(jax.grad(loss, argnums=(0, 1)))):
        assert_trees_close(jax.jit(tuned)(x, w), want, **F32)


def test_custom_vjp_with_autotuned_bwd_has_no_lax_dot_left():
    @jax.custom_vjp
    def dense(x, w):
        return x @ w
    dense.defvjp(lambda x, w: (x @ w, (x, w)), jat.autotune(lambda res, g: (g @ res[1].T, res[0].T @ g)))
    x, w = rand(0, 3, 3), rand(1, 3, 3)
    loss = lambda x, w: jnp.sum(dense(x, w) ** 2)  # noqa: E731
    backward = jax.make_jaxpr(jax.grad(jat.autotune(loss), argnums=(0, 1)))(x, w)
    assert count(backward, "dot_general") == 0 and count(backward, TUNED) == 3
    y = 2 * f64(x) @ f64(w)  # d loss / d (x @ w)
    assert_trees_close(jax.grad(jat.autotune(loss), argnums=(0, 1))(x, w),
                       (y @ f64(w).T, f64(x).T @ y), **F32)


@jax.custom_jvp
def jvp_dense(x, w):
    return jnp.sin(x @ w)


@jvp_dense.defjvp
def _jvp_dense_jvp(primals, tangents):
    (x, w), (dx, dw) = primals, tangents
    z = x @ w
    return jnp.sin(z), jnp.cos(z) * (dx @ w + x @ dw)


def test_custom_jvp_primal_and_jvp_rule_are_tuned():
    x, w = rand(0, 3, 3), rand(1, 3, 3)
    assert_all_tuned(jvp_dense, x, w, expected=1)
    loss = lambda x, w: jnp.sum(jvp_dense(x, w) ** 2)  # noqa: E731
    backward = jax.make_jaxpr(jax.grad(jat.autotune(loss), argnums=(0, 1)))(x, w)
    assert count(backward, "dot_general") == 0 and count(backward, TUNED) >= 3
    np.testing.assert_allclose(f64(jat.autotune(jvp_dense)(x, w)), np.sin(f64(x) @ f64(w)), **F32)
    assert_trees_close(jax.jit(jax.grad(jat.autotune(loss), argnums=(0, 1)))(x, w),
                       jax.grad(loss, argnums=(0, 1))(x, w), **F32)


# ---------------------------------------------------------------- what stays lax's

def test_dots_no_candidate_serves_keep_lax_dot():
    a = jnp.asarray(np.arange(12).reshape(3, 4), jnp.int32)
    b = jnp.asarray(np.arange(8).reshape(4, 2) - 3, jnp.int32)
    c = (rand(0, 3, 4) + 1j * rand(1, 3, 4)).astype(jnp.complex64)

    def fn(a, b, c):
        f32 = a.astype(jnp.float32)
        return (a @ b,
                lax.dot_general(a.astype(jnp.int8), b.astype(jnp.int8), MM, preferred_element_type=jnp.int32),
                c @ c.T,
                lax.dot_general(f32, b.astype(jnp.bfloat16), MM),
                lax.dot_general(f32, b.astype(jnp.float32), MM, precision=lax.DotAlgorithmPreset.F32_F32_F32),
                f32[:0] @ b.astype(jnp.float32),                  # empty: m = 0
                lax.scan(lambda s, _: (lax.dot_general(s, s, MM), None),   # weak-typed carry
                         lax.full((2, 2), 0.25), None, length=2)[0])
    rewritten = jax.make_jaxpr(jat.autotune(fn))(a, b, c)
    assert count(rewritten, TUNED) == 0
    assert count(rewritten, "dot_general") == count(jax.make_jaxpr(fn)(a, b, c), "dot_general") == 7
    ints, int8s, cplx, mixed, preset, empty, weak = jax.jit(jat.autotune(fn))(a, b, c)
    exact = np.asarray(a, np.int64) @ np.asarray(b, np.int64)
    np.testing.assert_array_equal(ints, exact)
    np.testing.assert_array_equal(int8s, exact)
    np.testing.assert_allclose(cplx, np.asarray(c, np.complex128) @ np.asarray(c, np.complex128).T, **F32)
    np.testing.assert_allclose(mixed, exact, **F32)
    np.testing.assert_allclose(preset, exact, **F32)
    assert empty.shape == (0, 2)
    np.testing.assert_allclose(weak, np.full((2, 2), 0.03125), **F32)  # 0.25 -> 0.125 -> 0.03125
    assert weak.dtype == jnp.float32


def test_symbolic_shapes_keep_lax_dot():
    def fn(x, w):
        return jnp.tanh(x @ w) @ w
    batch = jax.export.symbolic_shape("b")[0]
    specs = jax.ShapeDtypeStruct((batch, 3), jnp.float32), jax.ShapeDtypeStruct((3, 3), jnp.float32)
    rewritten = jax.make_jaxpr(jat.autotune(fn))(*specs)
    assert count(rewritten, TUNED) == 0 and count(rewritten, "dot_general") == 2
    exported = jax.export.export(jax.jit(jat.autotune(fn)))(*specs)
    x, w = rand(0, 5, 3), rand(1, 3, 3)
    np.testing.assert_allclose(f64(exported.call(x, w)), np.tanh(f64(x) @ f64(w)) @ f64(w), **F32)


# ---------------------------------------------------------------- loops, shard_map

def test_while_loop_body_is_tuned():
    def fn(x, w, n):
        return lax.fori_loop(0, n, lambda i, c: jnp.tanh(c @ w), x)  # dynamic n: a while loop
    x, w = rand(0, 3, 3), rand(1, 3, 3)
    assert_all_tuned(fn, x, w, jnp.int32(3), expected=1)
    assert "while" in str(jax.make_jaxpr(jat.autotune(fn))(x, w, jnp.int32(3)))
    ref = f64(x)
    for _ in range(3):
        ref = np.tanh(ref @ f64(w))
    np.testing.assert_allclose(f64(jax.jit(jat.autotune(fn))(x, w, jnp.int32(3))), ref, **F32)


SHARD_MAP_SCRIPT = textwrap.dedent("""
    import os, json
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import PartitionSpec as P
    import jax_autotune as jat

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("i",))
    fn = jax.shard_map(lambda x, w: jnp.tanh(x @ w), mesh=mesh, in_specs=(P("i"), P()), out_specs=P("i"))
    loss = lambda x, w: jnp.sum(fn(x, w) ** 2)
    rng = np.random.default_rng(0)
    x, w = (jnp.asarray(rng.standard_normal(s) * 0.5, jnp.float32) for s in ((4, 3), (3, 3)))
    text = str(jax.make_jaxpr(jat.autotune(fn))(x, w))
    product = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    exact = np.tanh(product)
    grads = jax.jit(jax.grad(jat.autotune(loss), argnums=(0, 1)))(x, w)
    want = jax.grad(loss, argnums=(0, 1))(x, w)

    explicit = jax.make_mesh((2,), ("i",), axis_types=(jax.sharding.AxisType.Explicit,))
    xs = jax.device_put(x, jax.sharding.NamedSharding(explicit, P("i")))
    with_out_sharding = lambda x, w: jnp.matmul(x, w, out_sharding=P(None))
    with jax.set_mesh(explicit):
        explicit_text = str(jax.make_jaxpr(jat.autotune(with_out_sharding))(xs, w))
        explicit_out = jax.jit(jat.autotune(with_out_sharding))(xs, w)
    print(json.dumps({
        "devices": len(jax.devices()),
        "dots": str(jax.make_jaxpr(fn)(x, w)).count("dot_general["),
        "dots_left": text.count("dot_general["),
        "tuned": text.count("autotuned_matmul[") + text.count("autotuned_matmul_epilogue["),
        "error": float(np.abs(jax.jit(jat.autotune(fn))(x, w) - exact).max()),
        "grad_error": max(float(np.abs(g - e).max()) for g, e in zip(grads, want)),
        "out_sharding_dots_left": explicit_text.count("dot_general["),
        "out_sharding_error": float(np.abs(explicit_out - product).max()),
    }))
""")


def test_shard_map_bodies_and_dots_with_an_explicit_out_sharding_are_tuned(tmp_path):
    env = dict(os.environ, JAX_AUTOTUNE_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-P", "-c", SHARD_MAP_SCRIPT], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["devices"] == 2
    assert result["dots"] == 1 and result["dots_left"] == 0 and result["tuned"] == 1
    assert result["error"] < 2e-5
    assert result["grad_error"] < 2e-5
    assert result["out_sharding_dots_left"] == 0 and result["out_sharding_error"] < 2e-5


# ---------------------------------------------------------------- caching, effects, composition

def test_traced_once_per_abstract_signature_and_jit_cache_hits():
    traces = []

    def fn(x, w):
        traces.append(x.shape)
        return x @ w
    tuned = jat.autotune(fn)
    x, w = rand(0, 2, 3), rand(1, 3, 3)
    first, second = tuned(x, w), tuned(x + 1, w)
    assert traces == [(2, 3)]
    np.testing.assert_allclose(f64(first), f64(x) @ f64(w), **F32)
    np.testing.assert_allclose(f64(second), (f64(x) + 1) @ f64(w), **F32)
    jitted = jax.jit(tuned)
    jitted(x, w)                   # an outer trace with the same avals: no new trace of fn
    np.testing.assert_allclose(f64(jitted(x + 2, w)), (f64(x) + 2) @ f64(w), **F32)
    assert traces == [(2, 3)]
    assert jitted._cache_size() == 1  # the second call hit jit's cache
    tuned(rand(0, 4, 3), w)
    assert traces == [(2, 3), (4, 3)]
    tuned(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16))  # a new dtype is a new signature
    assert len(traces) == 3


def test_python_numbers_are_static_and_unhashable_leaves_are_not_cached():
    traces = []

    def fn(x, w, n, opts):
        traces.append(n)
        for _ in range(n):       # a Python number is static: range works
            x = x @ w
        return x * opts["scale"]
    tuned = jat.autotune(fn)
    x, w = rand(0, 2, 3), rand(1, 3, 3)
    np.testing.assert_allclose(f64(tuned(x, w, 2, {"scale": 1.0})), f64(x) @ f64(w) @ f64(w), **F32)
    tuned(x, w, 2, {"scale": 1.0})
    np.testing.assert_allclose(f64(tuned(x, w, 1, {"scale": 3.0})), 3 * f64(x) @ f64(w), **F32)
    tuned(x, w, True, {"scale": 3.0})  # True == 1, but a bool is another static value
    assert traces == [2, 1, True]

    scaled = jax.jit(jat.autotune(lambda x, w, s: traces.append(s) or (x @ w) * s))
    traces.clear()
    for s in (2.0, 3.0):  # under jit, a Python float is dynamic: one trace, a tracer
        np.testing.assert_allclose(f64(scaled(x, w, s)), s * f64(x) @ f64(w), **F32)
    assert len(traces) == 1 and isinstance(traces[0], jax.core.Tracer)

    class Unhashable:
        __hash__ = None
        scale = 2.0
    traces.clear()
    tuned = jat.autotune(lambda x, w, o: fn(x, w, 1, {"scale": o.scale}))
    for _ in range(2):
        out = tuned(x, w, Unhashable())
    assert traces == [1, 1]
    np.testing.assert_allclose(f64(out), 2 * f64(x) @ f64(w), **F32)


def test_a_trace_closing_over_an_outer_tracer_is_not_cached():
    weights = {}
    tuned = jat.autotune(lambda x: x @ weights["w"])

    def step(x, w):
        weights["w"] = w  # tuned(x) closes over the outer trace's w
        return tuned(x)
    x, w = rand(0, 2, 3), rand(1, 3, 3)
    np.testing.assert_allclose(f64(jax.jit(step)(x, w)), f64(x) @ f64(w), **F32)
    grad = jax.grad(lambda w: jnp.sum(step(x, w)))(w)  # same avals, another outer trace
    np.testing.assert_allclose(f64(grad), f64(x).T @ np.ones((2, 3)), **F32)


def test_debug_print_once_per_call_in_order(capfd):
    def fn(x, w):
        jax.debug.print("first {}", x.shape[0], ordered=True)
        y = x @ w
        jax.debug.print("second {}", y.shape[1], ordered=True)
        return y
    x, w = rand(0, 2, 3), rand(1, 3, 3)
    tuned = jat.autotune(fn)
    capfd.readouterr()
    tuned(x, w)
    tuned(x, w)
    jitted = jax.jit(tuned)
    jitted(x, w)
    jitted(x, w)
    jax.effects_barrier()
    lines = [line for line in capfd.readouterr().out.splitlines() if line.startswith(("first", "second"))]
    assert lines == ["first 2", "second 3"] * 4


def test_vmap_and_grad_compose_in_both_orders():
    def fn(x, w):
        return jnp.sum(jnp.tanh(x @ w) ** 2)
    xs, w = rand(0, 4, 2, 3), rand(1, 3, 3)
    expected = jax.vmap(fn, in_axes=(0, None))(xs, w)
    for tuned in (jax.vmap(jat.autotune(fn), in_axes=(0, None)), jat.autotune(jax.vmap(fn, in_axes=(0, None)))):
        assert count(jax.make_jaxpr(tuned)(xs, w), TUNED) == 1
        np.testing.assert_allclose(jax.jit(tuned)(xs, w), expected, **F32)
    x = xs[0]
    want = jax.grad(fn, argnums=(0, 1))(x, w)
    for tuned in (jax.grad(jat.autotune(fn), argnums=(0, 1)), jat.autotune(jax.grad(fn, argnums=(0, 1)))):
        closed = jax.make_jaxpr(tuned)(x, w)
        assert count(closed, "dot_general") == 0 and count(closed, TUNED) == 3
        assert_trees_close(jax.jit(tuned)(x, w), want, **F32)
    per_example = jax.vmap(jax.grad(jat.autotune(fn)), in_axes=(0, None))(xs, w)
    np.testing.assert_allclose(per_example, jax.vmap(jax.grad(fn), in_axes=(0, None))(xs, w), **F32)


def test_static_arguments_through_partial_and_static_argnums():
    def fn(x, w, n):
        for _ in range(n):
            x = x @ w
        return x
    x, w = rand(0, 2, 3), rand(1, 3, 3)
    two = f64(x) @ f64(w) @ f64(w)
    for tuned in (functools.partial(jat.autotune(fn), n=2), jat.autotune(functools.partial(fn, n=2))):
        assert count(jax.make_jaxpr(tuned)(x, w), TUNED) == 2
        np.testing.assert_allclose(f64(jax.jit(tuned)(x, w)), two, **F32)
    jitted = jax.jit(jat.autotune(fn), static_argnums=2)
    np.testing.assert_allclose(f64(jitted(x, w, 2)), two, **F32)
    np.testing.assert_allclose(f64(jitted(x, w, 1)), f64(x) @ f64(w), **F32)


# ---------------------------------------------------------------- warmup

def test_warmup_tunes_exactly_the_keys_a_compile_asks_for(fresh_tuning, tmp_path):
    def fn(x, w, v):
        return jnp.sum(jnp.tanh(jnp.einsum("bij,jk->bik", x, w)) @ v)
    args = rand(0, 2, 5, 7), rand(1, 7, 6), rand(2, 6, 5)

    def compile_value_and_grad(tuned):
        """The number of matmuls lowered, and how many of them the memory table served."""
        lowerings, hits = primitive.LOWERINGS.get("cpu", 0), jat.stats()["memory_hits"]
        jax.jit(jax.value_and_grad(tuned)).lower(*args).compile()  # the training step
        return primitive.LOWERINGS["cpu"] - lowerings, jat.stats()["memory_hits"] - hits

    compile_value_and_grad(jat.autotune(fn))  # no warmup: the compile tunes what it needs
    compiled_keys = {decision.key for _, decision in jat.table().entries()}
    assert len(compiled_keys) >= 3  # the forward matmuls and their backward layouts

    config.update("cache_dir", str(tmp_path / "second"))  # start again: an empty store and table
    RUNTIME.reset()
    tuned = jat.autotune(fn)
    report = jat.warmup(tuned, *args, grad=True, compare=False)  # the keys alone (test_program_check)
    assert {entry.key for entry in report} == compiled_keys
    assert len(report) == report.count("tuned") == len(compiled_keys)
    tunings = jat.stats()["tuned"]
    lowered, served_from_memory = compile_value_and_grad(tuned)
    # the compile tuned nothing
    assert lowered >= len(compiled_keys) and served_from_memory == lowered and jat.stats()["tuned"] == tunings
