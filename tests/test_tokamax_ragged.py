"""tokamax's grouped matmuls as candidates (kernels/gpu/tokamax_ragged.py): in the GPU set
whether or not tokamax is installed, run only where it is, in the lower tier; each calls
tokamax with lax's own dimension numbers and its one implementation (a fake tokamax checks
what is passed); on a GPU with tokamax, each implementation that runs matches lax."""

import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jax_autotune.kernels import ragged
from jax_autotune.kernels.gpu import tokamax_ragged
from jax_autotune.problem import MatmulProblem
from jax_autotune.tuning.device import DeviceInfo, device_info
from jax_autotune.tuning.plan import DEMOTED, make_plan
from numerics import rel_error, tolerance

H200 = DeviceInfo("gpu", "NVIDIA H200", 143_771 * 2**20, (9, 0))
A100 = DeviceInfo("gpu", "NVIDIA A100-SXM4-80GB", 80 * 2**30, (8, 0))
CPU = DeviceInfo("cpu", "cpu")
NAMES = {f"ragged_tokamax_{i}" for i in tokamax_ragged.IMPLEMENTATIONS}
FORWARD = MatmulProblem(1, 1000, 96, 64, "bfloat16", "bfloat16", "bfloat16", groups=4, ragged="m")
WEIGHT_GRAD = MatmulProblem(1, 64, 96, 1000, "bfloat16", "bfloat16", "float32", transpose_a=True,
                            groups=4, ragged="k")


def _rounds(device, problem):
    return [(r.group, r.tier, {c.name for c in r.candidates})
            for r in make_plan(ragged.ragged_candidate_set(device), problem.key(), device).rounds]


def test_the_gpu_set_holds_them_installed_or_not_and_the_cpu_set_never():
    assert NAMES <= set(ragged.ragged_candidate_set(H200).names())
    assert not NAMES & set(ragged.ragged_candidate_set(CPU).names())
    assert {c.params["implementation"] for c in ragged.TOKAMAX} == set(tokamax_ragged.IMPLEMENTATIONS)


def test_without_tokamax_they_are_never_compiled(monkeypatch):
    monkeypatch.setattr(tokamax_ragged, "INSTALLED", False)
    for device in (H200, A100):
        rounds = _rounds(device, FORWARD)
        assert all(not NAMES & names for group, _, names in rounds if group != DEMOTED)
        assert NAMES <= next(names for group, _, names in rounds if group == DEMOTED)


def test_with_tokamax_they_run_in_the_lower_tier_after_our_kernels(monkeypatch):
    monkeypatch.setattr(tokamax_ragged, "INSTALLED", True)
    monkeypatch.setattr(tokamax_ragged.triton_backend, "SHIPPED", True)
    mixtral = MatmulProblem(1, 8192, 14336, 4096, "bfloat16", "bfloat16", "bfloat16", groups=8, ragged="m")
    rounds = [r for r in _rounds(H200, mixtral) if r[0] != DEMOTED]
    mosaic = {c.name for c in ragged.MOSAIC_GROUPED}
    assert mosaic & rounds[0][2] and not NAMES & rounds[0][2]
    assert NAMES <= rounds[1][2] and rounds[1][1] < rounds[0][1]
    # no Mosaic GPU on an A100: tokamax's kernels are in the first round
    assert NAMES <= [r for r in _rounds(A100, mixtral) if r[0] != DEMOTED][0][2]


def test_triton_joins_only_where_this_jax_ships_pallas_triton(monkeypatch):
    monkeypatch.setattr(tokamax_ragged, "INSTALLED", True)
    monkeypatch.setattr(tokamax_ragged.triton_backend, "SHIPPED", False)
    assert tokamax_ragged.implementation_available("mosaic")
    assert not tokamax_ragged.implementation_available("triton")


@pytest.fixture
def fake_tokamax(monkeypatch):
    """A tokamax whose ragged_dot_general records its arguments and runs lax's."""
    calls = []

    def ragged_dot_general(lhs, rhs, group_sizes, dimension_numbers, *, implementation, precision=None,
                           preferred_element_type=None):
        calls.append((dimension_numbers, implementation, precision, preferred_element_type))
        return lax.ragged_dot_general(lhs, rhs, group_sizes, dimension_numbers, precision=precision,
                                      preferred_element_type=preferred_element_type)
    monkeypatch.setitem(sys.modules, "tokamax", types.SimpleNamespace(ragged_dot_general=ragged_dot_general))
    return calls


def _operands(problem, seed=0):
    kx, kw = jax.random.split(jax.random.key(seed))
    lhs = jax.random.normal(kx, problem.lhs_shape, jnp.float32).astype(problem.lhs_dtype)
    rhs = jax.random.normal(kw, problem.rhs_shape, jnp.float32).astype(problem.rhs_dtype)
    return lhs, rhs


@pytest.mark.parametrize("problem", [FORWARD, WEIGHT_GRAD], ids=["ragged_m", "ragged_k"])
@pytest.mark.parametrize("candidate", ragged.TOKAMAX, ids=lambda c: c.name)
def test_each_calls_tokamax_with_lax_s_dims_and_its_one_implementation(fake_tokamax, candidate, problem):
    lhs, rhs = _operands(problem)
    sizes = jnp.asarray([300, 0, 500, 150], jnp.int32)  # an empty group, rows in no group
    got = jax.jit(ragged.served(candidate, problem))(lhs, rhs, sizes)
    want = ragged.xla_ragged_one(lhs, rhs, sizes, problem)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got, np.float64), np.asarray(want, np.float64))
    dims, implementation, _, preferred = fake_tokamax[-1]
    assert dims == ragged.ragged_dimension_numbers(problem)
    assert implementation == candidate.params["implementation"]
    assert jnp.dtype(preferred) == jnp.dtype(problem.out_dtype)


def test_tokamax_is_imported_without_parsing_the_user_s_own_flags(fake_tokamax, monkeypatch):
    flags = pytest.importorskip("absl.flags")
    was_parsed = flags.FLAGS.is_parsed()
    flags.FLAGS.unparse_flags()  # as in a program that never parsed absl flags
    monkeypatch.setattr(sys, "argv", [sys.argv[0], "--a-flag-of-the-user-s-program=1"])
    with pytest.raises(flags.UnrecognizedFlagError):
        flags.FLAGS(sys.argv)  # what tokamax would do
    try:
        assert tokamax_ragged.import_tokamax() is sys.modules["tokamax"]
        assert flags.FLAGS.is_parsed()
    finally:
        flags.FLAGS.unparse_flags()
        if was_parsed:
            flags.FLAGS.mark_as_parsed()


# ---------------------------------------------------------------- GPU, tokamax installed

needs_tokamax = pytest.mark.skipif(not tokamax_ragged.INSTALLED, reason="tokamax is not installed")


def _float64_reference(lhs, rhs, sizes, problem):
    """Per group in float64: x[rows_g] @ w[g] (ragged m), x[rows_g].T @ dy[rows_g] (ragged k);
    rows in no group zero."""
    x, w = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    ends = np.cumsum(np.asarray(sizes))
    starts = ends - np.asarray(sizes)
    if problem.ragged == "m":
        out = np.zeros((x.shape[0], w.shape[2]))
        for g, (a, b) in enumerate(zip(starts, ends)):
            out[a:b] = x[a:b] @ w[g]
        return out
    return np.stack([x[a:b].T @ w[a:b] for a, b in zip(starts, ends)])


@pytest.mark.gpu
@needs_tokamax
@pytest.mark.parametrize("problem", [FORWARD, WEIGHT_GRAD], ids=["ragged_m", "ragged_k"])
@pytest.mark.parametrize("candidate", ragged.TOKAMAX, ids=lambda c: c.name)
def test_gpu_each_implementation_that_runs_matches_float64_per_group(candidate, problem):
    if not candidate.runs(device_info(jax.devices("gpu")[0]), problem.key()):
        pytest.skip(f"{candidate.name} does not run here")
    lhs, rhs = _operands(problem, seed=1)
    sizes = jnp.asarray([300, 0, 500, 150], jnp.int32)
    try:
        got = jax.block_until_ready(jax.jit(ragged.served(candidate, problem))(lhs, rhs, sizes))
    except Exception as err:  # noqa: BLE001 - the tuner drops a candidate that raises; a wrong one must not pass
        pytest.skip(f"{candidate.name} raises on this problem: {type(err).__name__}: {str(err)[:200]}")
    want = _float64_reference(lhs, rhs, sizes, problem)
    assert got.dtype == jnp.dtype(problem.out_dtype) and got.shape == want.shape
    assert rel_error(got, want) <= tolerance(problem.lhs_dtype)
    if problem.ragged == "m":
        assert not np.any(np.asarray(got[int(np.sum(sizes)):], np.float64))  # rows in no group: zero
