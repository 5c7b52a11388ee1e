"""The tuner end to end on a GPU: device timing, probes, decisions and numerics.

Marked ``gpu``: skipped without a CUDA GPU; results on an H200 are recorded in
benchmarks/results/.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_autotune as jat
from jax_autotune.tuning.device_lock import DEVICE_LOCK
from jax_autotune.tuning.timing import DeviceTimer, compile_candidate, random_operands
from jax_autotune.tuners import tuner_for
from jax_autotune.tuning.lowering_warnings import quiet
from numerics import rel_error

pytestmark = pytest.mark.gpu
RNG = np.random.default_rng(7)


def test_the_gpu_tuner_times_on_the_device_and_has_probed_peaks(fresh_tuning):
    tuner = tuner_for("gpu")
    assert isinstance(tuner.timer, DeviceTimer)
    assert tuner.device.compute_capability is not None
    problem = jat.MatmulProblem(1, 768, 768, 768, "bfloat16", "bfloat16", "bfloat16")
    decision = tuner.select(problem)
    assert decision.source == "tuned"
    xla = decision.result("xla_dot")
    assert xla is not None and xla.outcome == "ok" and 0 < xla.score < 1e-3
    assert decision.limit is not None and decision.bounds["compute_peak"] > 1e14


@pytest.mark.parametrize("dtype, tol", [("bfloat16", 2e-2), ("float32", 5e-3)])
@pytest.mark.parametrize("batch, m, n, k", [((), 1, 1025, 1025), ((), 7, 1000, 33),
                                             ((2,), 768, 768, 768), ((), 1025, 1025, 1025)])
def test_tuned_matmul_on_gpu_matches_float64(fresh_tuning, dtype, tol, batch, m, n, k):
    a = jnp.asarray(RNG.standard_normal((*batch, m, k)), dtype)
    b = jnp.asarray(RNG.standard_normal((*batch, k, n)), dtype)
    out = jax.jit(jat.matmul)(a, b)
    want = np.matmul(np.asarray(a, np.float64), np.asarray(b, np.float64))
    assert out.shape == want.shape and rel_error(out, want) < tol


def test_highest_precision_f32_stays_full_fp32_on_gpu(fresh_tuning):
    a = jnp.asarray(RNG.standard_normal((1000, 1000)), jnp.float32)
    b = jnp.asarray(RNG.standard_normal((1000, 1000)), jnp.float32)
    out = jax.jit(lambda x, y: jat.matmul(x, y, precision="highest"))(a, b)
    want = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    assert rel_error(out, want) < 2e-5


def test_grad_on_gpu_matches_jnp(fresh_tuning):
    x = jnp.asarray(RNG.standard_normal((256, 1025)), jnp.bfloat16)
    w = jnp.asarray(RNG.standard_normal((1025, 768)), jnp.bfloat16)
    f = lambda mm: lambda x, w: jnp.sum(mm(x, w).astype(jnp.float32) ** 2)  # noqa: E731
    got = jax.grad(f(jat.matmul), argnums=(0, 1))(x, w)
    want = jax.grad(f(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32)
                      .astype(jnp.bfloat16)), argnums=(0, 1))(x, w)
    for g, h in zip(got, want):
        assert rel_error(g, h) < 3e-2


def test_a_pallas_candidate_compiles_while_a_kernel_run_holds_the_device():
    # only compiles that run XLA's GEMM autotuner hold the device alone; a Pallas compile
    # that did would wait here for the shared hold to end, and the result would time out
    import concurrent.futures

    tuner = tuner_for("gpu")
    problem = jat.MatmulProblem(1, 1000, 1000, 1000, "bfloat16", "bfloat16", "bfloat16")
    args = random_operands(problem, tuner._jax_device())
    candidate = tuner.candidate_set.by_name("triton_gemm_bm64_bn128_bk64_g8_w4_s4")
    with concurrent.futures.ThreadPoolExecutor(1) as pool, DEVICE_LOCK.shared():
        compiled = pool.submit(compile_candidate, candidate, problem, args).result(timeout=120)
    want = np.matmul(np.asarray(args[0], np.float64), np.asarray(args[1], np.float64))
    assert rel_error(compiled(*args), want) < 2e-2


def test_priming_autotunes_a_misaligned_keys_xla_candidates_once_and_tuning_reuses_it(fresh_tuning):
    from jax_autotune.tuning import counters

    tuner = tuner_for("gpu")
    problem = jat.MatmulProblem(1, 1031, 1029, 1027, "bfloat16", "bfloat16", "bfloat16")  # new here
    key = problem.key()
    primed = tuner.prime([(key, problem)])
    assert primed >= 2  # XLA's dot and the padded one behind a barrier, in one compile
    before = counters.stats()["xla_primed"]
    decision = tuner.select(problem, key)
    assert counters.stats()["xla_primed"] == before  # the tune took XLA's kept choices
    for name in ("xla_dot", "padded_xla_dot_a64_barrier_rows"):
        assert decision.result(name).outcome == "ok", decision.result(name)
    lhs, rhs = random_operands(problem, tuner._jax_device(), seed=3)
    with quiet():
        out = jax.jit(tuner.candidate_set.by_name(decision.winner).bound(problem))(lhs, rhs)
    want = np.matmul(np.asarray(lhs, np.float64), np.asarray(rhs, np.float64))
    assert rel_error(out, want) < 2e-2


def test_xla_refuses_to_autotune_under_kept_choices_only_and_a_primed_dot_compiles_under_it(fresh_tuning):
    from jax_autotune.tuning import xla_priming

    tuner = tuner_for("gpu")
    device = tuner._jax_device()
    primed, fresh = (jat.MatmulProblem(1, m, m + 2, m + 4, "bfloat16", "bfloat16", "bfloat16")
                     for m in (1037, 1043))  # shapes no other test compiles
    xla = tuner.candidate_set.by_name("xla_dot")
    padded = tuner.candidate_set.by_name("padded_xla_dot_a64_barrier_rows")
    assert xla_priming.prime([(primed, xla), (primed, padded)], device) == 2
    lowered = jax.jit(xla.bound(primed)).lower(*random_operands(primed, device))
    assert xla_priming.compile_primed(lowered, primed, xla, device) is not None
    unprimed = jax.jit(xla.bound(fresh)).lower(*random_operands(fresh, device))
    with pytest.raises(Exception, match="(?i)autotun"):  # a miss is an error, not a run of kernels
        unprimed.compile(compiler_options=xla_priming.KEPT_CHOICES_ONLY)


def test_tuning_and_running_with_triton_candidates_shows_no_triton_deprecation(fresh_tuning):
    """The round times Triton-backend kernels (lowered by the tuner, then by the product
    where one wins); JAX's deprecation of that backend is ours to keep from the user."""
    import warnings

    from jax_autotune import config
    from jax_autotune.kernels.gpu import triton_backend
    if not triton_backend.SHIPPED:
        pytest.skip(triton_backend.WHY_NOT)
    config.update("budget_seconds", 300.0)  # other tests share the device: no round cut short
    a = jnp.asarray(RNG.standard_normal((1000, 1000)), jnp.bfloat16)
    b = jnp.asarray(RNG.standard_normal((1000, 1000)), jnp.bfloat16)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = jax.jit(jat.matmul)(a, b)
        decision = tuner_for("gpu").select(jat.MatmulProblem(1, 1000, 1000, 1000, "bfloat16", "bfloat16",
                                                               "bfloat16"))
    timed = [r for r in decision.results if r.name.startswith("triton_") and r.outcome == "ok"]
    assert timed, [(r.name, r.outcome, r.error) for r in decision.results]
    assert not [str(w.message) for w in seen if str(w.message).startswith(triton_backend.DEPRECATION)]
    want = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    assert rel_error(out, want) < 2e-2
