"""Fused epilogues on a real GPU: cuBLASLt's epilogues and the Triton GEMM's, against XLA.

Marked ``gpu``: skipped without a CUDA GPU; results on an H200 are recorded in
benchmarks/results/.
"""

import jax
import jax.numpy as jnp
import pytest

import jax_autotune as jat
from jax_autotune.kernels.gpu import cublaslt
from jax_autotune.kernels.gpu.candidates import gpu_candidate_set
from jax_autotune.kernels.gpu.epilogues import _captured
from jax_autotune.kernels.gpu.triton import GemmConfig, gemm
from jax_autotune.problem import MatmulProblem
from jax_autotune.tuners import tuner_for
from jax_autotune.tuning.device import device_info
from jax_autotune.tuning.lowering_warnings import quiet
from numerics import rel_error

pytestmark = pytest.mark.gpu


def operands(problem, seed):
    keys = jax.random.split(jax.random.key(seed), 2 + len(problem.epilogue.operands))
    return [jax.random.normal(k, shape, jnp.float32).astype(dtype)
            for k, (shape, dtype) in zip(keys, problem.input_specs())]


def plain(problem, inputs, precision="highest"):
    """The context as XLA runs it, in f32 at the given precision."""
    wide = [x.astype(jnp.float32) for x in inputs]
    bare = problem.bare()
    dims = (((1 if problem.transpose_a else 2,), (2 if problem.transpose_b else 1,)), ((0,), (0,)))
    y = jax.lax.dot_general(wide[0], wide[1], dims, precision=precision).astype(bare.out_dtype)
    return problem.epilogue.apply(y, inputs[2:])


@pytest.mark.parametrize("roles, fn, activation", [
    (("row",), lambda y, b: y + b, "none"),
    (("full",), lambda y, r: y + r, "none"),
    (("row", "full"), lambda y, b, r: y + b + r, "none"),
    (("row",), lambda y, b: jax.nn.relu(y + b), "relu"),
    (("row",), lambda y, b: jax.nn.gelu(y + b), "gelu"),
    ((), jax.nn.gelu, "gelu"),
])
@pytest.mark.parametrize("dtype, ta, tb", [("bfloat16", False, False), ("bfloat16", False, True),
                                           ("float32", True, False)])
def test_cublaslt_epilogues_compute_what_the_program_does(roles, fn, activation, dtype, ta, tb):
    if not cublaslt.available():
        pytest.skip(cublaslt.error())
    epilogue = _captured(fn, dtype, *roles)
    problem = MatmulProblem(2, 257, 130, 96, dtype, dtype, dtype, ta, tb, "HIGHEST", epilogue)
    inputs = operands(problem, seed=len(roles))
    candidate = gpu_candidate_set(device_info(jax.devices("gpu")[0])).by_name("cublaslt_epilogue_algo0")
    assert candidate.runs(device_info(jax.devices("gpu")[0]), problem.key())
    with quiet():
        got = jax.jit(candidate.bound(problem))(*inputs)
    assert rel_error(got, plain(problem, inputs)) < (2e-2 if dtype == "bfloat16" else 1e-5)


def test_cublaslt_gelu_is_the_tanh_form_of_jax_nn_gelu():
    """At f32 HIGHEST the two forms differ by far more than the product's error."""
    if not cublaslt.available():
        pytest.skip(cublaslt.error())
    problem = MatmulProblem(1, 256, 256, 64, "float32", "float32", "float32", precision="HIGHEST")
    a, b = operands(problem, seed=3)[:2]
    y = jax.lax.dot_general(a, b, (((2,), (1,)), ((0,), (0,))), precision="highest")
    fused = jax.jit(lambda a, b: cublaslt.matmul(a, b, problem, activation="gelu"))(a, b)
    tanh_form, erf_form = jax.nn.gelu(y, approximate=True), jax.nn.gelu(y, approximate=False)
    assert rel_error(fused, tanh_form) < 1e-5 < rel_error(fused, erf_form)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_triton_gemm_applies_an_elementwise_epilogue_on_the_device(dtype):
    epilogue = _captured(lambda y, b, g: jax.nn.silu(y + b) * g, dtype, "row", "full")
    problem = MatmulProblem(2, 257, 130, 96, dtype, dtype, dtype, False, True, "HIGHEST", epilogue)
    inputs = operands(problem, seed=5)
    with quiet():
        got = jax.jit(lambda *xs: gemm(xs[0], xs[1], problem, GemmConfig(64, 64, 32), *xs[2:]))(*inputs)
    assert got.dtype == jnp.dtype(problem.result_dtype)
    assert rel_error(got, plain(problem, inputs)) < (2e-2 if dtype == "bfloat16" else 1e-5)


@pytest.mark.parametrize("fn, shapes", [
    (lambda x, w, b, r: x @ w + b + r, [(1024, 768), (768, 3072), (3072,), (1024, 3072)]),
    (lambda x, w, b: jax.nn.gelu(x @ w + b), [(512, 1025), (1025, 2049), (2049,)]),
    (lambda x, w: jax.nn.logsumexp((x @ w).astype(jnp.float32), axis=-1), [(512, 768), (768, 50257)]),
    (lambda x, w, g: jax.nn.silu(x @ w) * g, [(96, 1024), (1024, 2753), (96, 2753)]),
])
def test_a_model_context_tunes_on_the_gpu_and_matches_the_plain_program(fresh_tuning, fn, shapes):
    keys = jax.random.split(jax.random.key(len(shapes)), len(shapes))
    args = [jax.random.normal(k, s, jnp.bfloat16) for k, s in zip(keys, shapes)]
    with jax.default_matmul_precision("highest"):
        want = jax.jit(fn)(*args)
    got = jax.jit(jat.autotune(fn))(*args)
    assert rel_error(got, want) < 2e-2
    decisions = tuner_for("gpu").known.memory_decisions()
    assert decisions and all(not d.key.epilogue.is_bare and d.source == "tuned" for d in decisions)
    results = {r.name: r for d in decisions for r in d.results}
    assert results["xla_dot"].outcome == "ok"
    assert not [r for r in results.values() if r.outcome == "wrong_result"]
