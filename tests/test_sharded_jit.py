"""Sharded operands under plain jit, on 4 host devices: per-shard keys, the tuned kernel on
per-shard operands, no all-gather of an operand, a psum when k is sharded; Auto and
Explicit meshes, grad, warmup.

The host device count must be set before jax starts, so with fewer devices the one test
that runs re-runs this file in a child process with 4 of them.
"""

import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

import jax_autotune as jat
import jax_autotune.config as config
from jax_autotune.problem import MatmulProblem
from jax_autotune.tuners import tuner_for
from jax_autotune.tuning.decision import Decision
from jax_autotune.tuning.tuner import record_decisions

DEVICES = 4
four_devices = pytest.mark.skipif(jax.device_count() < DEVICES, reason="runs in the child process")


@pytest.mark.slow
@pytest.mark.skipif(jax.device_count() >= DEVICES, reason="the child process itself")
def test_the_sharded_tests_pass_on_four_host_devices(tmp_path):
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={DEVICES}",
               JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                           __file__], capture_output=True, text=True, env=env, timeout=900,
                          cwd=tmp_path)
    assert done.returncode == 0 and " passed" in done.stdout, done.stdout[-6000:] + done.stderr[-2000:]


# ---------------------------------------------------------------- helpers (in the child)

def native_winner(shard: MatmulProblem) -> str:
    """Install a native kernel as the decision of a per-shard problem (timing would often
    keep XLA's dot at these small sizes), so the compiled HLO shows where it runs."""
    pytest.importorskip("jax_autotune.kernels.cpu.native")
    tuner = tuner_for("cpu")
    key = shard.key(config.get("level"))
    name = next(c.name for c in tuner.candidate_set.candidates
                if c.name.startswith(("native_small", "native_gemm")) and c.supports(tuner.device, key))
    assert tuner.known.install(Decision(key=key, problem=shard, winner=name), persist=False)
    return name


def f32(batch, m, n, k):
    return MatmulProblem(batch, m, n, k, "float32", "float32", "float32")


def operands(shape_a, shape_b, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape_a).astype(np.float32),
            rng.standard_normal(shape_b).astype(np.float32))


def gathered(hlo: str) -> list[str]:
    return re.findall(r"\S+ all-gather\(", hlo)


def check_per_shard(f, args, exact, shard, *, reduce):
    """Compile ``f``; the per-shard key is asked while compiling, its native winner runs on
    per-shard operands, no operand is gathered, k-sharding all-reduces; the result is right."""
    lowered = jax.jit(f).lower(*args)
    assert "CustomSPMDPartitioning" in lowered.as_text()
    with record_decisions() as asked:
        compiled = lowered.compile()
    assert [d.problem for d in asked] == [shard]
    hlo = compiled.as_text()
    assert re.search(r'custom_call_target="jax_autotune_(small|gemm)"', hlo), hlo[-2000:]
    assert not gathered(hlo), gathered(hlo)
    assert ("all-reduce" in hlo) == reduce
    out = np.asarray(compiled(*args), np.float64)
    np.testing.assert_allclose(out, exact, rtol=1e-4, atol=1e-4 * np.abs(exact).max())
    return compiled(*args)


@pytest.fixture
def auto_mesh():
    return Mesh(np.array(jax.devices()[:DEVICES]), ("x",))


@pytest.fixture
def explicit_mesh():
    return jax.make_mesh((DEVICES,), ("x",), axis_types=(AxisType.Explicit,))


# (lhs spec, rhs spec, per-shard problem, all-reduce) of x (64, 48) @ w (48, 40)
CASES = {
    "rows": (P("x", None), P(), f32(1, 16, 40, 48), False),
    "columns": (P(), P(None, "x"), f32(1, 64, 10, 48), False),
    "contraction": (P(None, "x"), P("x", None), f32(1, 64, 40, 12), True),
}


# ---------------------------------------------------------------- the tests

@four_devices
@pytest.mark.parametrize("case", CASES)
def test_auto_mesh_runs_the_tuned_kernel_per_shard(fresh_tuning, auto_mesh, case):
    lhs_spec, rhs_spec, shard, reduce = CASES[case]
    native_winner(shard)
    x, w = operands((64, 48), (48, 40))
    args = (jax.device_put(x, NamedSharding(auto_mesh, lhs_spec)),
            jax.device_put(w, NamedSharding(auto_mesh, rhs_spec)))
    check_per_shard(jat.matmul, args, x.astype(np.float64) @ w, shard, reduce=reduce)


@four_devices
@pytest.mark.parametrize("case", CASES)
def test_explicit_mesh_follows_lax_sharding_rule_and_runs_per_shard(fresh_tuning, explicit_mesh, case):
    lhs_spec, rhs_spec, shard, reduce = CASES[case]
    native_winner(shard)
    x, w = operands((64, 48), (48, 40))
    out_sharding = P() if reduce else None  # lax itself needs one when k is sharded
    with jax.set_mesh(explicit_mesh):
        args = (jax.device_put(x, lhs_spec), jax.device_put(w, rhs_spec))
        tuned = lambda a, b: jat.matmul(a, b, out_sharding=out_sharding)  # noqa: E731
        plain = lambda a, b: jnp.matmul(a, b, out_sharding=out_sharding)  # noqa: E731
        assert jax.eval_shape(tuned, *args).sharding == jax.eval_shape(plain, *args).sharding
        out = check_per_shard(tuned, args, x.astype(np.float64) @ w, shard, reduce=reduce)
        assert out.sharding.spec == jax.jit(plain)(*args).sharding.spec


@four_devices
def test_explicit_mesh_with_k_sharded_and_no_out_sharding_raises_as_lax_does(explicit_mesh):
    x, w = operands((64, 48), (48, 40))
    with jax.set_mesh(explicit_mesh):
        args = (jax.device_put(x, P(None, "x")), jax.device_put(w, P("x", None)))
        for f in (jat.matmul, jnp.matmul):
            with pytest.raises(Exception, match="Contracting dimensions are sharded"):
                jax.eval_shape(f, *args)


@four_devices
def test_batch_sharded_operands_run_per_shard(fresh_tuning, auto_mesh):
    shard = f32(2, 16, 12, 24)
    native_winner(shard)
    x, w = operands((8, 16, 24), (8, 24, 12))
    args = (jax.device_put(x, NamedSharding(auto_mesh, P("x"))),
            jax.device_put(w, NamedSharding(auto_mesh, P("x"))))
    check_per_shard(jat.matmul, args, np.matmul(x.astype(np.float64), w), shard, reduce=False)


@four_devices
def test_a_2d_mesh_splits_rows_and_columns(fresh_tuning):
    mesh = Mesh(np.array(jax.devices()[:DEVICES]).reshape(2, 2), ("x", "y"))
    shard = f32(1, 32, 20, 48)
    native_winner(shard)
    x, w = operands((64, 48), (48, 40))
    args = (jax.device_put(x, NamedSharding(mesh, P("x", None))),
            jax.device_put(w, NamedSharding(mesh, P(None, "y"))))
    check_per_shard(jat.matmul, args, x.astype(np.float64) @ w, shard, reduce=False)


@four_devices
@pytest.mark.parametrize("kind", ["auto", "explicit"])
def test_grad_of_sharded_matmuls_matches_lax_without_gathering(fresh_tuning, kind):
    x, w = operands((64, 48), (48, 40), seed=3)
    mesh = (Mesh(np.array(jax.devices()[:DEVICES]), ("x",)) if kind == "auto"
            else jax.make_mesh((DEVICES,), ("x",), axis_types=(AxisType.Explicit,)))

    def loss(matmul):
        return lambda a, b: jnp.sum(jnp.tanh(matmul(a, b)) ** 2)

    with jax.set_mesh(mesh):
        args = (jax.device_put(x, NamedSharding(mesh, P("x", None))),
                jax.device_put(w, NamedSharding(mesh, P())))
        tuned = jax.jit(jax.grad(loss(jat.matmul), argnums=(0, 1)))
        plain = jax.jit(jax.grad(loss(lambda a, b: jnp.matmul(a, b, precision="highest")), argnums=(0, 1)))
        hlo = tuned.lower(*args).compile().as_text()
        got, want = tuned(*args), plain(*args)
    assert not gathered(hlo), gathered(hlo)
    for g, r in zip(got, want):
        assert g.sharding.spec == r.sharding.spec or kind == "auto"
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-5)


@four_devices
def test_without_a_table_the_tuner_is_asked_for_the_per_shard_key(fresh_tuning, auto_mesh):
    pytest.importorskip("jax_autotune.kernels.cpu.native")  # something to tune besides XLA's dot
    jax.clear_caches()  # an executable compiled by an earlier test would skip the partitioner
    x, w = operands((64, 48), (48, 40))
    args = (jax.device_put(x, NamedSharding(auto_mesh, P("x", None))),
            jax.device_put(w, NamedSharding(auto_mesh, P())))
    with record_decisions() as asked:
        out = jax.jit(jat.matmul)(*args)
    assert [(d.problem.m, d.problem.n, d.problem.k, d.source) for d in asked] == [(16, 40, 48, "tuned")]
    assert jat.stats()["tuned"] == 1
    np.testing.assert_allclose(np.asarray(out), x @ w, rtol=1e-4, atol=1e-4)


@four_devices
def test_warmup_of_a_sharded_step_tunes_the_keys_its_compile_asks_for(fresh_tuning, auto_mesh):
    pytest.importorskip("jax_autotune.kernels.cpu.native")
    x, w = operands((64, 48), (48, 40))
    args = (jax.device_put(x, NamedSharding(auto_mesh, P("x", None))),
            jax.device_put(w, NamedSharding(auto_mesh, P())))
    step = lambda a, b: jnp.sum(jat.matmul(a, b) ** 2)  # noqa: E731
    report = jat.warmup(step, *args, grad=True)
    shapes = {(e.problem.batch, e.problem.m, e.problem.n, e.problem.k) for e in report}
    assert (1, 16, 40, 48) in shapes  # the forward matmul, per shard
    tuned = jat.stats()["tuned"]
    assert tuned == len(report)
    jax.jit(step).lower(*args).compile()
    jax.jit(jax.grad(step)).lower(*args).compile()
    assert jat.stats()["tuned"] == tuned  # nothing left to tune after warmup


@four_devices
def test_a_require_mode_miss_inside_the_partitioner_names_the_per_shard_key(fresh_tuning, auto_mesh):
    config.update("mode", "require")
    jax.clear_caches()
    x, w = operands((64, 48), (48, 40))
    args = (jax.device_put(x, NamedSharding(auto_mesh, P("x", None))),
            jax.device_put(w, NamedSharding(auto_mesh, P())))
    with pytest.raises(Exception) as info:
        jax.jit(jat.matmul).lower(*args).compile()
    text = str(info.value)
    assert "mode 'require'" in text and "m=16 n=64 k=64" in text, text[-1500:]


@four_devices
@pytest.mark.parametrize("kind", ["auto", "explicit"])
@pytest.mark.parametrize("w_spec, shard", [(P(), f32(1, 32, 40, 48)), (P(None, "y"), f32(1, 32, 20, 48))],
                         ids=["data-parallel", "tensor-parallel"])
def test_a_dense_layer_on_sharded_activations_runs_per_shard(fresh_tuning, kind, w_spec, shard):
    axis_types = (AxisType.Auto if kind == "auto" else AxisType.Explicit,) * 2
    mesh = jax.make_mesh((2, 2), ("x", "y"), axis_types=axis_types)
    native_winner(shard)
    x, w = operands((4, 16, 48), (48, 40), seed=5)  # (batch, tokens, d) @ (d, features)
    dense = lambda a, b: jat.dot_general(a, b, (((2,), (0,)), ((), ())))  # noqa: E731
    with jax.set_mesh(mesh):
        args = (jax.device_put(x, NamedSharding(mesh, P("x", None, None))),
                jax.device_put(w, NamedSharding(mesh, w_spec)))
        out = check_per_shard(dense, args, x.astype(np.float64) @ w, shard, reduce=False)
        lax_out = jax.jit(lambda a, b: lax.dot_general(a, b, (((2,), (0,)), ((), ()))))(*args)
    assert out.shape == (4, 16, 40)
    if kind == "explicit":
        assert out.sharding.spec == lax_out.sharding.spec


@four_devices
def test_one_device_keeps_the_plain_lowering():
    x, w = operands((64, 48), (48, 40))
    assert "CustomSPMDPartitioning" not in jax.jit(jat.matmul).lower(x, w).as_text()


@four_devices
def test_a_matmul_in_context_on_sharded_operands_runs_per_shard_with_its_epilogue_after(fresh_tuning, auto_mesh):
    shard = f32(1, 16, 48, 32)
    native_winner(shard)
    x, w = operands((64, 32), (32, 48), seed=7)
    bias = np.linspace(-1.0, 1.0, 48).astype(np.float32)
    fn = jat.autotune(lambda a, b, c: jnp.tanh(a @ b + c))
    assert "autotuned_matmul_epilogue" in str(jax.make_jaxpr(fn)(x, w, bias))
    args = (jax.device_put(x, NamedSharding(auto_mesh, P("x", None))),
            jax.device_put(w, NamedSharding(auto_mesh, P())), jax.device_put(bias, NamedSharding(auto_mesh, P())))
    with record_decisions() as asked:
        compiled = jax.jit(fn).lower(*args).compile()
    assert "CustomSPMDPartitioning" in jax.jit(fn).lower(*args).as_text()
    assert any(d.key == shard.key(config.get("level")) for d in asked)  # the bare per-shard key
    np.testing.assert_allclose(np.asarray(compiled(*args)), np.tanh(x.astype(np.float64) @ w + bias),
                               rtol=2e-5, atol=2e-5)


@four_devices
def test_the_program_checks_copy_of_sharded_arguments_keeps_their_shardings(fresh_tuning, auto_mesh):
    from jax_autotune import program_check
    from jax_autotune.autotune import programs_traced

    x, w = operands((64, 48), (48, 40))
    args = (jax.device_put(x, NamedSharding(auto_mesh, P("x", None))), jax.device_put(w, NamedSharding(auto_mesh, P())))
    step = jat.autotune(lambda a, b: jnp.tanh(a @ b))
    with programs_traced() as seen:
        jax.make_jaxpr(step)(*args)
    clock = program_check.WallClock(step, args, seen, tuner_for("cpu"), frozenset(), donate=(1,))
    (tuned, plain), = clock(frozenset())  # compiled for the arguments' shardings, run on both sets
    assert tuned > 0 and plain > 0
    moved, donated = clock._moved
    assert donated is args[1] and moved.sharding == args[0].sharding
    assert {s.data.unsafe_buffer_pointer() for s in moved.addressable_shards}.isdisjoint(
        s.data.unsafe_buffer_pointer() for s in args[0].addressable_shards)
    np.testing.assert_array_equal(np.asarray(moved), np.asarray(args[0]))
