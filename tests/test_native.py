"""The native kernels against a float64 numpy reference, under jax.jit.

Every case uses fresh random operands (never zeros) and compares every output element,
so an element a kernel forgot to write cannot pass by accident.
"""

import os
import subprocess
import sys
import textwrap

import jax
import jaxlib
import numpy as np
import pytest

from jax_autotune import _native
from jax_autotune.kernels.cpu import native
from jax_autotune.problem import MatmulProblem

TRANSPOSES = [(False, False), (True, False), (False, True), (True, True)]
DTYPES = ["float32", "float64"]
ISAS_HERE = sorted({"portable", native.isa()})
THREADS = sorted({1, native.max_threads()})

_rng = np.random.default_rng(20240613)


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def make_problem(batch, m, n, k, dtype="float32", ta=False, tb=False):
    return MatmulProblem(batch=batch, m=m, n=n, k=k, lhs_dtype=dtype, rhs_dtype=dtype,
                         out_dtype=dtype, transpose_a=ta, transpose_b=tb)


def random_operands(problem):
    lhs = _rng.uniform(-1.0, 1.0, problem.lhs_shape).astype(problem.lhs_dtype)
    rhs = _rng.uniform(-1.0, 1.0, problem.rhs_shape).astype(problem.rhs_dtype)
    return lhs, rhs


def as_canonical(lhs, rhs, problem):
    a = np.swapaxes(lhs, 1, 2) if problem.transpose_a else lhs
    b = np.swapaxes(rhs, 1, 2) if problem.transpose_b else rhs
    return a.astype(np.float64), b.astype(np.float64)


def assert_matches_reference(kernel, problem, **kwargs):
    lhs, rhs = random_operands(problem)
    out = jax.jit(lambda a, b: kernel(a, b, problem, **kwargs))(lhs, rhs)
    assert out.shape == problem.out_shape and out.dtype == np.dtype(problem.out_dtype)
    a, b = as_canonical(lhs, rhs, problem)
    reference = a @ b
    # error bound relative to |a| @ |b|: what rounding in a length-k sum can reach
    scale = np.abs(a) @ np.abs(b)
    tolerance = (2e-6 if problem.out_dtype == "float32" else 1e-13) * np.sqrt(problem.k)
    error = np.abs(np.asarray(out, np.float64) - reference)
    worst = np.unravel_index(np.argmax(error - tolerance * scale), error.shape)
    assert np.all(error <= tolerance * scale), (
        f"{problem} {kwargs}: element {worst} is {np.asarray(out)[worst]}, "
        f"expected {reference[worst]}")


SMALL_SIZES = [(1, 1, 1, 1), (3, 7, 5, 3), (2, 17, 31, 7), (4, 8, 8, 8), (2, 32, 32, 32),
               (5, 1, 17, 31), (64, 3, 16, 1)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ta,tb", TRANSPOSES)
def test_small_matmul_matches_the_reference_for_every_size_class(dtype, ta, tb):
    for isa in ISAS_HERE:
        for size in SMALL_SIZES:
            assert_matches_reference(native.small_matmul, make_problem(*size, dtype, ta, tb),
                                     isa=isa)


def test_small_matmul_spreads_a_large_batch_over_threads_correctly():
    for threads in THREADS:
        assert_matches_reference(native.small_matmul, make_problem(1000, 7, 9, 33 - 2),
                                 threads=threads)


GEMV_SIZES = [(1, 1, 1, 1), (1, 3, 1, 7), (2, 17, 1, 33), (1, 100, 1, 1000), (3, 1000, 1, 17),
              (1, 1, 3, 7), (2, 1, 33, 17), (1, 1, 1000, 100), (3, 1, 17, 1000)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ta,tb", TRANSPOSES)
def test_gemv_matches_the_reference_for_mat_vec_and_vec_mat(dtype, ta, tb):
    for isa in ISAS_HERE:
        for size in GEMV_SIZES:
            assert_matches_reference(native.gemv, make_problem(*size, dtype, ta, tb), isa=isa)


def test_gemv_splits_long_outputs_and_batches_over_threads_correctly():
    for threads in THREADS:
        for size in [(1, 5000, 1, 300), (1, 1, 5000, 300), (9, 300, 1, 300)]:
            for ta, tb in TRANSPOSES:
                assert_matches_reference(native.gemv, make_problem(*size, "float32", ta, tb),
                                         threads=threads)


# 300 and 513 cross the packed depth (256), so the accumulate path of the micro-kernel runs
GEMM_SIZES = [(1, 1, 1, 1), (1, 3, 7, 17), (2, 33, 31, 100), (1, 100, 17, 300),
              (1, 7, 1000, 3), (3, 31, 33, 513)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ta,tb", TRANSPOSES)
def test_gemm_matches_the_reference_for_every_tile_and_isa(dtype, ta, tb):
    for isa in ISAS_HERE:
        for tile in range(len(native.gemm_tiles(isa))):
            for size in GEMM_SIZES:
                assert_matches_reference(native.gemm, make_problem(*size, dtype, ta, tb),
                                         isa=isa, tile=tile)


@pytest.mark.parametrize("threads", THREADS)
def test_gemm_is_correct_on_every_threading_path(threads):
    # M blocks, N slivers (short M), batch-parallel small matrices, and a wide N panel
    for size in [(1, 700, 300, 300), (1, 5, 900, 70), (8, 40, 50, 60), (1, 65, 3000, 20)]:
        assert_matches_reference(native.gemm, make_problem(*size, "float32", True, False),
                                 threads=threads)
        assert_matches_reference(native.gemm, make_problem(*size, "float64", False, True),
                                 threads=threads, tile=1)


def test_noop_call_copies_the_first_element():
    x = _rng.uniform(1.0, 2.0, (3, 4)).astype(np.float32)
    out = jax.jit(native.noop_call)(x)
    assert out.shape == (1,) and out.dtype == np.float32 and out[0] == x[0, 0]


def test_registration_happens_once_and_can_be_asked_again():
    names = native.register_targets()
    assert set(names) == {native.NOOP_TARGET, native.SMALL_TARGET, native.GEMV_TARGET,
                          native.GEMM_TARGET, native.BLAS_TARGET}
    assert native.register_targets() == names


def test_the_module_knows_the_jaxlib_it_was_built_against():
    assert _native.built_against_jaxlib == jaxlib.__version__
    assert len(_native.ffi_api_version) == 2


def test_cpu_features_follow_the_effective_isa():
    expected = {"portable": set(), "avx2": {"avx2", "fma"},
                "avx512": {"avx2", "fma", "avx512f", "avx512dq", "avx512vl"}}
    assert native.cpu_features() == expected[native.isa()]


def test_wrong_operands_are_value_errors_naming_the_argument():
    problem = make_problem(1, 4, 5, 6)
    lhs, rhs = random_operands(problem)
    with pytest.raises(ValueError, match="rhs"):
        native.gemm(lhs, rhs[:, :5], problem)
    with pytest.raises(ValueError, match="dtypes"):
        native.gemm(lhs, rhs, MatmulProblem(1, 4, 5, 6, "bfloat16", "bfloat16", "bfloat16"))
    with pytest.raises(ValueError, match="small_matmul"):
        native.small_matmul(*random_operands(make_problem(1, 33, 2, 2)),
                            make_problem(1, 33, 2, 2))
    with pytest.raises(ValueError, match="gemv"):
        native.gemv(lhs, rhs, problem)
    with pytest.raises(ValueError, match="isa"):
        native.gemm(lhs, rhs, problem, isa="sse9")
    with pytest.raises(ValueError, match="tile"):
        native.gemm(lhs, rhs, problem, tile=7)


GOOD_ATTRIBUTES = dict(transpose_a=0, transpose_b=0, isa=0, threads=1)
BAD_ATTRIBUTES = dict(transpose_a=[2, -1, 2**32], transpose_b=[2, -1], isa=[3, -1, 2**32],
                      threads=[-1, 2**31, 2**32, 2**63 - 1], tile=[2, -1, 2**32])


def _handler_cases():
    """(target, problem, its good attributes) for every matmul target of the module."""
    cases = [(native.SMALL_TARGET, make_problem(2, 3, 4, 5), GOOD_ATTRIBUTES),
             (native.GEMV_TARGET, make_problem(2, 7, 1, 5), GOOD_ATTRIBUTES),
             (native.GEMM_TARGET, make_problem(2, 7, 6, 5), dict(GOOD_ATTRIBUTES, tile=0))]
    if native.blas_available():
        cases.append((native.BLAS_TARGET, make_problem(2, 7, 6, 5),
                      {k: v for k, v in GOOD_ATTRIBUTES.items() if k != "isa"}))
    return cases


def _call_handler(target, problem, attributes):
    lhs, rhs = random_operands(problem)
    call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(problem.out_shape, np.float32))
    out = jax.jit(lambda a, b: call(a, b, **{k: np.int64(v) for k, v in attributes.items()}))(
        lhs, rhs)
    return lhs, rhs, np.asarray(out)


@pytest.mark.parametrize("target,problem,good", _handler_cases(), ids=lambda c: str(c)[:22])
def test_every_attribute_out_of_range_is_an_ffi_error_never_a_result(target, problem, good):
    for name, value in ((n, v) for n, values in BAD_ATTRIBUTES.items() if n in good
                        for v in values):
        with pytest.raises(Exception, match=f"{target}: attribute {name} must be .*got {value}"):
            _call_handler(target, problem, dict(good, **{name: value}))
    # the largest thread count a call may ask for runs, on the threads that are here
    lhs, rhs, out = _call_handler(target, problem, dict(good, threads=_native.max_threads_attribute))
    np.testing.assert_allclose(out, lhs.astype(np.float64) @ rhs, rtol=1e-5, atol=1e-5)


def test_the_wrappers_refuse_a_thread_count_the_handlers_would_refuse():
    problem = make_problem(1, 4, 5, 6)
    with pytest.raises(ValueError, match="threads: expected 0 .* up to 65536, got 2147483648"):
        native.gemm(*random_operands(problem), problem, threads=2**31)


@pytest.mark.parametrize("f32,attributes,refused", [
    (True, (0, 0, 1, 0), ""), (False, (1, 1, 0, 7), ""),
    (True, (2, 0, 1, 0), "transpose_a must be 0 or 1, got 2"),
    (True, (0, -1, 1, 0), "transpose_b must be 0 or 1, got -1"),
    (True, (0, 0, 2, 0), "tf32 must be 0 or 1, got 2"),
    (False, (0, 0, 1, 0), "tf32 must be 0 (TF32 is for float32 operands), got 1"),
    (True, (0, 0, 0, 8), "algorithm must be 0 to 7, got 8"),
    (True, (0, 0, 0, -1), "algorithm must be 0 to 7, got -1"),
    (True, (0, 0, 0, 2**32), "algorithm must be 0 to 7, got 4294967296")])
def test_the_cublaslt_handler_checks_every_attribute_first(f32, attributes, refused):
    # the handler's own check (it needs a GPU stream to be called through XLA)
    error = _native.cublaslt_attribute_error(f32, *attributes)
    assert error == (refused and f"jax_autotune_cublaslt: attribute {refused}")


@pytest.mark.parametrize("attributes, refused", [
    ((0, 0, 0), ""), ((2, 1, 0), ""), ((0, 1, 1), ""), ((1, 0, 1), "activation must be 0 (none) with a residual"),
    ((3, 0, 0), "activation must be"), ((-1, 0, 0), "activation must be"), ((0, 2, 0), "has_bias must be 0 or 1"),
    ((0, 0, 2**32), "has_residual must be 0 or 1"),
])
def test_the_cublaslt_epilogue_handler_checks_its_own_attributes_first(attributes, refused):
    _native = pytest.importorskip("jax_autotune._native")
    error = _native.cublaslt_epilogue_attribute_error(*attributes)
    assert (refused in error and error.startswith("jax_autotune_cublaslt_epilogue: attribute")) if refused \
        else error == ""


def _run_python(body: str, isa_override: str = "") -> str:
    """Runs ``body`` in a fresh interpreter with JAX_AUTOTUNE_NATIVE_ISA set; its stdout."""
    env = dict(os.environ, JAX_AUTOTUNE_NATIVE_ISA=isa_override)
    result = subprocess.run([sys.executable, "-P", "-c", textwrap.dedent(body)], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_isa_override_runs_the_portable_kernels_correctly():
    out = _run_python(isa_override="portable", body="""
        import jax, numpy as np
        from jax_autotune.kernels.cpu import native
        from jax_autotune.problem import MatmulProblem
        assert native.isa() == "portable", native.isa()
        assert native.cpu_features() == frozenset()
        rng = np.random.default_rng(7)
        for kernel, (m, n, k) in ((native.gemm, (67, 45, 300)), (native.small_matmul, (7, 9, 5)),
                                  (native.gemv, (333, 1, 77))):
            p = MatmulProblem(2, m, n, k, "float32", "float32", "float32", transpose_b=True)
            a = rng.uniform(-1, 1, p.lhs_shape).astype(np.float32)
            b = rng.uniform(-1, 1, p.rhs_shape).astype(np.float32)
            out = np.asarray(jax.jit(lambda a, b: kernel(a, b, p))(a, b), np.float64)
            ref = a.astype(np.float64) @ np.swapaxes(b, 1, 2).astype(np.float64)
            assert np.abs(out - ref).max() < 1e-4, kernel
        if native.best_isa() != "portable":
            p = MatmulProblem(1, 8, 8, 8, "float32", "float32", "float32")
            x = np.ones(p.lhs_shape, np.float32)
            try:
                jax.jit(lambda a, b: native.gemm(a, b, p, isa=native.best_isa()))(x, x)
            except Exception as err:
                assert "not available" in str(err), err
            else:
                raise AssertionError("a kernel above the forced ISA ran")
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_an_isa_the_cpu_lacks_falls_back_to_the_best_and_says_so():
    out = _run_python(isa_override="avx512", body="""
        from jax_autotune.kernels.cpu import native
        print(native.isa(), native.best_isa(), repr(native.isa_note()))
    """)
    effective, best, note = out.split(maxsplit=2)
    assert effective == best
    if best != "avx512":
        assert "not supported" in note


def test_an_empty_contraction_writes_zeros():
    lhs = np.ones((2, 3, 0), np.float32)
    rhs = np.ones((2, 0, 4), np.float32)
    out_type = jax.ShapeDtypeStruct((2, 3, 4), np.float32)
    call = jax.ffi.ffi_call(native.GEMM_TARGET, out_type)
    out = jax.jit(lambda a, b: call(a, b, transpose_a=np.int64(0), transpose_b=np.int64(0),
                                    isa=np.int64(0), threads=np.int64(1), tile=np.int64(0)))(
        lhs, rhs)
    assert np.array_equal(out, np.zeros((2, 3, 4), np.float32))


def test_the_handler_rejects_mismatched_shapes_with_a_clear_error():
    out_type = jax.ShapeDtypeStruct((1, 3, 4), np.float32)
    call = jax.ffi.ffi_call(native.GEMM_TARGET, out_type)
    with pytest.raises(Exception, match="do not form"):
        jax.jit(lambda a, b: call(a, b, transpose_a=np.int64(0), transpose_b=np.int64(0),
                                  isa=np.int64(0), threads=np.int64(1), tile=np.int64(0)))(
            np.ones((1, 3, 5), np.float32), np.ones((1, 6, 4), np.float32)).block_until_ready()


def test_concurrent_calls_share_the_thread_pool_safely():
    from concurrent.futures import ThreadPoolExecutor

    problem = make_problem(2, 150, 130, 270, "float32", True, False)
    operands = [random_operands(problem) for _ in range(4)]

    @jax.jit
    def two_independent_products(a, b, c, d):  # XLA may run the two custom calls at once
        return (native.gemm(a, b, problem, threads=0), native.gemm(c, d, problem, threads=0))

    def run(i):
        (a, b), (c, d) = operands[i % 4], operands[(i + 1) % 4]
        return i, two_independent_products(a, b, c, d)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, range(8)))
    for i, (first, second) in results:
        for (a, b), out in ((operands[i % 4], first), (operands[(i + 1) % 4], second)):
            ca, cb = as_canonical(a, b, problem)
            np.testing.assert_allclose(out, ca @ cb, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not native.blas_available(), reason="scipy-openblas32 is not importable")
@pytest.mark.parametrize("dtype", DTYPES)
def test_blas_gemm_matches_the_reference(dtype):
    for threads in THREADS:
        for ta, tb in TRANSPOSES:
            for size in [(1, 1, 1, 1), (3, 17, 31, 33), (1, 100, 7, 1000)]:
                assert_matches_reference(native.blas_gemm, make_problem(*size, dtype, ta, tb),
                                         threads=threads)


def test_without_a_blas_library_the_blas_target_fails_cleanly():
    out = _run_python("""
        import sys
        sys.modules["scipy_openblas32"] = None  # not importable, whatever is installed
        import jax, numpy as np
        from jax_autotune.kernels.cpu import native
        from jax_autotune.problem import MatmulProblem
        assert not native.blas_available() and "not importable" in native.blas_error()
        p = MatmulProblem(1, 4, 4, 4, "float32", "float32", "float32")
        x = np.ones(p.lhs_shape, np.float32)
        try:
            native.blas_gemm(x, x, p)
        except RuntimeError as err:
            assert "no BLAS" in str(err)
        else:
            raise AssertionError("blas_gemm ran without a library")
        print("ok")
    """)
    assert out.strip().endswith("ok")
