"""The CPU candidate set: its shape, what it supports and the plan its priorities give."""

import jax
import numpy as np
import pytest

from jax_autotune.kernels.cpu import native
from jax_autotune.tuning.device import DeviceInfo
from jax_autotune.kernels.cpu.candidates import cpu_candidate_set, native_candidates
from jax_autotune.key import Kind
from jax_autotune.problem import MatmulProblem
from jax_autotune.tuning.plan import DEMOTED, make_plan

HERE = DeviceInfo("cpu", "cpu", features=native.cpu_features())
EVERY_ISA = DeviceInfo("cpu", "cpu", features=frozenset(
    {"avx2", "fma", "avx512f", "avx512dq", "avx512vl"}))
PORTABLE_ONLY = DeviceInfo("cpu", "cpu", features=frozenset())


def key_of(batch, m, n, k, dtype="float32", out_dtype=None):
    return MatmulProblem(batch, m, n, k, dtype, dtype, out_dtype or dtype).key("balanced")


def groups_in_order(candidate_set, key, device=EVERY_ISA):
    names = []
    for round_ in make_plan(candidate_set, key, device).rounds:
        if round_.group != DEMOTED and round_.group not in names:
            names.append(round_.group)
    return names


@pytest.fixture(scope="module")
def candidate_set():
    return cpu_candidate_set(HERE)


def test_xla_dot_is_candidate_zero_and_names_are_unique(candidate_set):
    assert candidate_set.baseline.name == "xla_dot"
    assert len(set(candidate_set.names())) == len(candidate_set.names())


def test_every_native_name_encodes_its_parameters(candidate_set):
    for candidate in candidate_set.candidates[1:]:
        params = candidate.params
        if params["family"] == "blas":
            assert candidate.name == f"blas_openblas_t{params['threads']}"
            continue
        assert candidate.name.startswith(f"native_{params['family']}_{params['isa']}")
        assert candidate.name.endswith(f"_t{params['threads']}")
        if params["family"] == "gemm":
            assert f"_{params['mr']}x{params['nr']}_" in candidate.name
        assert candidate.cost is not None


@pytest.mark.parametrize("dtype,out_dtype", [("bfloat16", None), ("int32", None),
                                             ("float16", None), ("float32", "float64")])
def test_unsupported_dtypes_are_declared_unsupported(candidate_set, dtype, out_dtype):
    key = key_of(1, 8, 8, 8, dtype, out_dtype)
    for candidate in candidate_set.candidates[1:]:
        assert not candidate.supports(EVERY_ISA, key), candidate.name


def test_isa_support_follows_the_device_features(candidate_set):
    key = key_of(1, 64, 64, 64, "float64")
    for candidate in native_candidates("small") + native_candidates("gemv") + \
            native_candidates("gemm"):
        isa = candidate.params["isa"]
        assert candidate.supports(EVERY_ISA, key) == (candidate.params["family"] == "gemm")
        assert candidate.supports(PORTABLE_ONLY, key) == (
            isa == "portable" and candidate.params["family"] == "gemm")


def test_size_limits_are_checked(candidate_set):
    small = [c for c in candidate_set.candidates if c.params.get("family") == "small"]
    gemv = [c for c in candidate_set.candidates if c.params.get("family") == "gemv"]
    assert all(c.supports(EVERY_ISA, key_of(9, 32, 32, 32)) for c in small)
    assert not any(c.supports(EVERY_ISA, key_of(9, 33, 32, 32)) for c in small)
    assert all(c.supports(EVERY_ISA, key_of(1, 1, 500, 70)) for c in gemv)
    assert not any(c.supports(EVERY_ISA, key_of(1, 2, 500, 70)) for c in gemv)


@pytest.mark.parametrize("size,kind,groups", [
    ((64, 8, 8, 8), Kind.GENERAL, ["small", "gemm"]),
    ((1, 1024, 1024, 1024), Kind.GENERAL, ["gemm"]),
    ((1, 4096, 4096, 4096), Kind.GENERAL, ["gemm"]),
    ((1, 1000, 1, 1000), Kind.MAT_VEC, ["gemv", "gemm"]),
    ((1, 1, 1000, 1000), Kind.VEC_MAT, ["gemv", "gemm"]),
    ((1, 16, 1, 16), Kind.MAT_VEC, ["small", "gemv", "gemm"]),
    ((1, 1, 1, 1000), Kind.INNER_PRODUCT, ["gemv", "gemm"]),
    ((1, 300, 200, 1), Kind.OUTER_PRODUCT, ["gemm"]),
    ((1, 1, 300, 1), Kind.SCALAR_VEC, ["gemv", "gemm"]),
    ((1, 300, 1, 1), Kind.VEC_SCALAR, ["gemv", "gemm"]),
    ((1, 1, 1, 1), Kind.SCALAR_PRODUCT, ["small", "gemv", "gemm"]),
])
def test_the_priority_table_gives_the_documented_groups(candidate_set, size, kind, groups):
    key = key_of(*size)
    assert key.kind == kind
    assert groups_in_order(candidate_set, key) == groups


def test_simd_candidates_form_the_first_round_and_portable_is_its_fallback(candidate_set):
    rounds = make_plan(candidate_set, key_of(1, 512, 512, 512), EVERY_ISA).rounds
    first, second = rounds[0], rounds[1]
    assert {c.params.get("isa", "blas") for c in first.candidates} <= {"avx2", "avx512", "blas"}
    assert {c.params.get("isa") for c in first.candidates} >= {"avx2", "avx512"}
    assert {c.params["isa"] for c in second.candidates} == {"portable"}
    assert first.tier > second.tier


def test_threads_are_only_tried_when_the_work_pays_for_them(candidate_set):
    tiny = make_plan(candidate_set, key_of(1, 8, 8, 8), EVERY_ISA).rounds[0]
    assert all(c.params["threads"] == 1 for c in tiny.candidates)
    if native.max_threads() > 1:
        large = make_plan(candidate_set, key_of(1, 4096, 4096, 4096), EVERY_ISA).rounds[0]
        assert all(c.params["threads"] > 1 for c in large.candidates)


def test_cost_grows_with_the_problem():
    gemm = native_candidates("gemm")[0]
    small = MatmulProblem(1, 64, 64, 64, "float32", "float32", "float32")
    big = MatmulProblem(1, 1024, 1024, 1024, "float32", "float32", "float32")
    assert 0 < gemm.cost(small) < gemm.cost(big)


def test_every_supported_candidate_computes_the_product(candidate_set):
    rng = np.random.default_rng(3)
    problems = [MatmulProblem(3, 7, 9, 5, "float32", "float32", "float32", True, False),
                MatmulProblem(2, 33, 1, 40, "float32", "float32", "float32", False, True),
                MatmulProblem(1, 40, 70, 300, "float32", "float32", "float32", True, True)]
    for problem in problems:
        key = problem.key("balanced")
        lhs = rng.uniform(-1, 1, problem.lhs_shape).astype(np.float32)
        rhs = rng.uniform(-1, 1, problem.rhs_shape).astype(np.float32)
        expected = np.asarray(candidate_set.baseline.fn(lhs, rhs, problem))
        for candidate in candidate_set.candidates[1:]:
            if candidate.supports(HERE, key):
                out = jax.jit(lambda a, b: candidate.fn(a, b, problem))(lhs, rhs)
                np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4,
                                           err_msg=candidate.name)


def test_blas_candidates_exist_exactly_when_scipy_openblas32_loads(candidate_set):
    blas = [c for c in candidate_set.candidates if c.params.get("family") == "blas"]
    assert bool(blas) == native.blas_available(), native.blas_error()
    key = key_of(1, 256, 256, 256)
    assert all(c.supports(HERE, key) for c in blas)
    assert not any(c.supports(HERE, key_of(1, 256, 256, 256, "bfloat16")) for c in blas)
