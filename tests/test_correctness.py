"""Correctness gating: references, tolerances by dtype and precision, NaN never passes."""

import dataclasses
import warnings
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_autotune.tuning import timing
from jax_autotune.tuning.correctness import SampledReference, check, prepare_check, reference, tolerance
from jax_autotune.key import Precision
from jax_autotune.problem import MatmulProblem
from jax_autotune.tuning.timing import random_operands, runs_kernels_while_compiling
from jax_autotune.kernels.xla import xla_dot

PROBLEM = MatmulProblem(3, 33, 17, 65, "float32", "float32", "float32", transpose_a=True)


def operands_and_output(problem):
    lhs, rhs = random_operands(problem, jax.devices()[0], seed=3)
    return lhs, rhs, jax.jit(lambda a, b: xla_dot(a, b, problem, Precision.HIGHEST))(lhs, rhs)


@pytest.mark.parametrize("host_max_macs", [2**31, 0])
def test_the_host_and_device_references_agree_and_accept_a_correct_output(host_max_macs):
    lhs, rhs, out = operands_and_output(PROBLEM)
    ref = reference(PROBLEM, lhs, rhs, host_max_macs=host_max_macs)
    assert isinstance(ref, SampledReference) == (host_max_macs == 0)
    verdict = check(out, ref, PROBLEM, platform="cpu")
    assert verdict.ok and verdict.rel_error < 1e-6


@pytest.mark.parametrize("host_max_macs", [2**31, 0])
def test_a_wrong_or_non_finite_output_fails(host_max_macs):
    lhs, rhs, out = operands_and_output(PROBLEM)
    ref = reference(PROBLEM, lhs, rhs, host_max_macs=host_max_macs)
    nudged = out.at[0, 0, 0].add(1.0)
    assert not check(nudged, ref, PROBLEM, platform="cpu").ok  # one element off by 1.0
    bad = check(out.at[1, 2, 3].set(jnp.nan), ref, PROBLEM)
    assert not bad.ok and np.isnan(bad.rel_error)
    assert not check(out[:, :5], ref, PROBLEM).ok  # wrong shape


def test_tolerances_follow_dtype_precision_and_platform():
    f32 = PROBLEM
    assert tolerance(f32, "gpu") == 5e-3  # TF32 allowed at DEFAULT, as XLA does on GPUs
    assert tolerance(dataclasses.replace(f32, precision=Precision.HIGHEST), "gpu") == 3e-5
    assert tolerance(f32, "cpu") == 3e-5  # no TF32 on the CPU
    bf16 = dataclasses.replace(f32, lhs_dtype="bfloat16", rhs_dtype="bfloat16", out_dtype="bfloat16")
    assert tolerance(bf16) == 3e-2
    wide_out = dataclasses.replace(bf16, out_dtype="float32")
    assert tolerance(wide_out) == 3e-2
    ints = dataclasses.replace(f32, lhs_dtype="int32", rhs_dtype="int32", out_dtype="int32")
    assert tolerance(ints) == 0.0


def test_integer_problems_are_checked_exactly():
    problem = MatmulProblem(1, 5, 4, 3, "int32", "int32", "int32")
    lhs, rhs = random_operands(problem, jax.devices()[0])
    out = jax.jit(lambda a, b: xla_dot(a, b, problem))(lhs, rhs)
    ref = reference(problem, lhs, rhs)
    assert ref.dtype == np.int32 and check(out, ref, problem).ok
    assert not check(out.at[0, 0, 0].add(1), ref, problem).ok


def test_an_int8_result_is_compared_with_the_int8_wraparound_of_the_exact_product():
    problem = MatmulProblem(1, 4, 4, 64, "int8", "int8", "int8")
    lhs = jnp.full(problem.lhs_shape, 7, jnp.int8)
    rhs = jnp.full(problem.rhs_shape, 5, jnp.int8)  # each entry 64 * 35 = 2240: wraps to -64
    out = jax.jit(lambda a, b: xla_dot(a, b, problem))(lhs, rhs)
    ref = reference(problem, lhs, rhs)
    assert ref.dtype == np.int8 and int(ref[0, 0, 0]) == np.int64(2240).astype(np.int8) == -64
    verdict = check(out, ref, problem, platform="cpu")
    assert verdict.ok and verdict.rel_error == 0.0
    assert not check(out.at[0, 1, 2].add(1), ref, problem, platform="cpu").ok


def test_complex_problems_are_checked_with_their_imaginary_parts_and_no_complex_warning():
    problem = MatmulProblem(1, 6, 5, 4, "complex64", "complex64", "complex64")
    rng = np.random.default_rng(0)
    lhs = jnp.asarray(rng.standard_normal(problem.lhs_shape) + 1j * rng.standard_normal(problem.lhs_shape),
                      jnp.complex64)
    rhs = jnp.asarray(rng.standard_normal(problem.rhs_shape) + 1j * rng.standard_normal(problem.rhs_shape),
                      jnp.complex64)
    out = jax.jit(lambda a, b: xla_dot(a, b, problem))(lhs, rhs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a ComplexWarning (imaginary parts dropped) fails here
        ref = reference(problem, lhs, rhs)
        full = check(out, ref, problem, platform="cpu")
        conjugated = check(jnp.conj(out), ref, problem, platform="cpu")  # same real parts
        sampled = reference(problem, lhs, rhs, host_max_macs=0)
        sampled_ok = check(out, sampled, problem, platform="cpu")
        sampled_conj = check(jnp.conj(out), sampled, problem, platform="cpu")
    assert ref.dtype == np.complex128 and full.ok and sampled_ok.ok
    assert not conjugated.ok and not sampled_conj.ok


def test_random_operands_are_never_zero_and_have_the_stored_shapes():
    problem = MatmulProblem(2, 7, 5, 3, "bfloat16", "bfloat16", "float32", transpose_b=True)
    lhs, rhs = random_operands(problem, jax.devices()[0])
    assert lhs.shape == problem.lhs_shape and rhs.shape == problem.rhs_shape
    assert lhs.dtype == jnp.bfloat16
    assert float(jnp.mean(lhs != 0)) > 0.98 and float(jnp.std(rhs.astype(jnp.float32))) > 0.5


def test_only_modules_with_an_xla_dot_count_as_running_kernels_while_compiling():
    lhs, rhs = random_operands(PROBLEM, jax.devices()[0])
    dot = jax.jit(lambda a, b: xla_dot(a, b, PROBLEM)).lower(lhs, rhs)
    scale = jax.jit(lambda a, b: a * 2.0).lower(lhs, rhs)
    nested = jax.jit(lambda a, b: jax.lax.cond(a[0, 0, 0] > 0, lambda: xla_dot(a, b, PROBLEM),
                                               lambda: jnp.zeros(PROBLEM.out_shape, PROBLEM.out_dtype))
                     ).lower(lhs, rhs)  # the dot inside a branch's region
    ragged = jax.jit(jax.lax.ragged_dot).lower(jnp.ones((8, 4)), jnp.ones((2, 4, 3)), jnp.array([3, 5], jnp.int32))
    assert runs_kernels_while_compiling(dot) and runs_kernels_while_compiling(nested)
    # XLA rewrites a ragged_dot into dots its GEMM autotuner runs: a CUPTI timing beside
    # that compile would count the autotuner's kernels
    assert runs_kernels_while_compiling(ragged)
    assert not runs_kernels_while_compiling(scale)


def test_a_pallas_kernel_naming_dot_general_in_its_ir_does_not_count_as_an_xla_dot():
    # lowered for CUDA on any host: the Triton IR travels as a string attribute whose
    # locations say "dot_general"; read as an XLA dot, every Pallas compile held the
    # device alone and they compiled one after another
    from jax_autotune.kernels.gpu.candidates import gpu_candidate_set
    from jax_autotune.tuning.device import DeviceInfo

    candidates = gpu_candidate_set(DeviceInfo("gpu", "NVIDIA H200", 143_771 * 2**20, (9, 0)))
    problem = MatmulProblem(1, 1025, 1025, 1025, "bfloat16", "bfloat16", "bfloat16")
    operand = jax.ShapeDtypeStruct(problem.lhs_shape, jnp.bfloat16)

    def lowered(name):
        fn = candidates.by_name(name).bound(problem)
        return jax.jit(fn).trace(operand, operand).lower(lowering_platforms=("cuda",))

    try:
        lowered("triton_gemm_bm64_bn128_bk64_g8_w4_s4")
    except RuntimeError as err:  # jax 0.11 asks the GPU for its capability while lowering
        pytest.skip(f"this jax lowers Pallas for CUDA only beside a GPU ({str(err)[:80]}); "
                    "test_gpu_tuner checks the same on one")
    for name in ("triton_gemm_bm64_bn128_bk64_g8_w4_s4", "triton_packed_asis_bm128_bn128_bk64_g8_w8_s3"):
        pallas = lowered(name)
        assert "dot_general" in pallas.as_text() and not runs_kernels_while_compiling(pallas)
    assert runs_kernels_while_compiling(lowered("padded_xla_dot_a64_barrier_rows"))


LARGE = MatmulProblem(6, 200, 150, 70, "float32", "float32", "float32", transpose_b=True)


def test_a_sampled_reference_holds_exact_values_at_edge_and_random_entries():
    lhs, rhs = random_operands(LARGE, jax.devices()[0], seed=4)
    ref = reference(LARGE, lhs, rhs, host_max_macs=0)
    full = reference(LARGE, lhs, rhs)  # float64 on the host, whole
    assert ref.batches.size == 4 and ref.rows.size == ref.cols.size == 64
    for index, size in ((ref.rows, 200), (ref.cols, 150)):
        assert {0, 1, 2, 3, size - 4, size - 1} <= set(index.tolist())
    # each sampled value is the float64 dot product of its row and column: within the
    # summation-order error bound (k ulps of the sum of |terms|) of the exactly rounded
    # sum (float32 x float32 products are exact in float64), as the whole product is
    a = np.asarray(lhs, np.float64)[ref.batches]
    b = np.asarray(rhs, np.float64)[ref.batches]
    a = (np.swapaxes(a, 1, 2) if LARGE.transpose_a else a)[:, ref.rows, :]
    b = (np.swapaxes(b, 1, 2) if LARGE.transpose_b else b)[:, :, ref.cols]
    terms = a[:, :, :, None] * b[:, None, :, :]  # (batch, row, k, col)
    exact = np.vectorize(lambda *i: math.fsum(terms[i[0], i[1], :, i[2]]))(
        *np.indices(ref.values.shape))
    bound = LARGE.k * np.finfo(np.float64).eps * np.abs(terms).sum(axis=2)
    assert np.all(np.abs(ref.values - exact) <= bound)
    assert np.all(np.abs(full[np.ix_(ref.batches, ref.rows, ref.cols)] - exact) <= bound)


def test_an_error_off_the_sample_is_caught_by_the_trusted_output():
    lhs, rhs, out = operands_and_output(LARGE)
    ref = reference(LARGE, lhs, rhs, host_max_macs=0)
    row = next(r for r in range(200) if r not in set(ref.rows.tolist()))
    wrong = out.at[0, row, :].multiply(3.0)
    assert check(wrong, ref, LARGE, platform="cpu").ok  # the sample alone cannot see it
    caught = check(wrong, ref, LARGE, platform="cpu", trusted=out)
    assert not caught.ok and caught.rel_error > 0.05
    assert check(out, ref, LARGE, platform="cpu", trusted=out).ok


def test_a_prepared_check_gives_the_same_verdict_as_a_fresh_one():
    lhs, rhs, out = operands_and_output(LARGE)
    ref = reference(LARGE, lhs, rhs, host_max_macs=0)
    prepare_check(LARGE, ref, jax.devices()[0])
    good, bad = check(out, ref, LARGE), check(out * 1.01, ref, LARGE)
    assert good.ok and not bad.ok and bad.rel_error == pytest.approx(0.01, rel=0.05)


def test_operands_beyond_the_random_period_repeat_it_with_rows_starting_apart(monkeypatch):
    monkeypatch.setattr(timing, "RANDOM_PERIOD", 7)
    problem = MatmulProblem(1, 5, 4, 4, "float32", "float32", "float32")
    lhs = np.asarray(random_operands(problem, jax.devices()[0], seed=9)[0]).ravel()
    assert len(set(lhs[:7].tolist())) == 7 and np.array_equal(lhs[7:14], lhs[:7])
    rows = lhs.reshape(5, 4)
    assert all(not np.array_equal(rows[i], rows[i + 1]) for i in range(4))
