"""Our Mosaic GPU grouped GEMM over a ragged contraction (kernels/gpu/mosaic_grouped_k.py, a
grouped matmul's weight gradient): what it serves, its group table, that it cross-lowers on
CPU to one Mosaic GPU custom call, its candidates; on a GPU, its numbers against float64
per group on every kind of split, and the gradient of a grouped matmul through it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jax_autotune.kernels import ragged
from jax_autotune.kernels.gpu import mosaic_gemm as mg
from jax_autotune.kernels.gpu import mosaic_grouped_k as mk
from jax_autotune.problem import MatmulProblem
from jax_autotune.splits import representative_splits
from jax_autotune.tuning.device import DeviceInfo
from cross_lowering import cuda_text, custom_calls
from group_trials import group_trials, split_sizes
from numerics import KERNEL_TOLERANCES, rel_error

needs_mosaic = pytest.mark.skipif(not mk.AVAILABLE, reason=f"Mosaic GPU unavailable: {mk.IMPORT_ERROR}")
SMS = mg.H100_SMS
H200 = DeviceInfo("gpu", "NVIDIA H200", 143_771 * 2**20, (9, 0))
A100 = DeviceInfo("gpu", "NVIDIA A100-SXM4-80GB", 80 * 2**30, (8, 0))
CPU = DeviceInfo("cpu", "cpu")


def _weight_gradient(m, n, k, groups, dtype="bfloat16", out=None, **kw) -> MatmulProblem:
    """The problem JAX's transpose rule of ragged_dot builds: x (k, m) and dy (k, n) as stored."""
    return MatmulProblem(1, m, n, k, dtype, dtype, out or dtype, transpose_a=True, groups=groups, ragged="k", **kw)


# ---------------------------------------------------------------- CPU: what it serves

@pytest.mark.parametrize("m,n,k,dtype,out,ok,why", [
    (4096, 14336, 8192, "bfloat16", None, True, ""),         # Mixtral up's weight gradient
    (2048, 768, 16384, "float16", "float32", True, ""),      # 128 small experts, f32 gradient
    (4096, 14336, 1000, "bfloat16", None, True, ""),         # k past the last block: masked there
    (4096, 14336, 1001, "bfloat16", None, False, "multiple of 8"),
    (4096, 1000, 8192, "bfloat16", None, False, "columns"),
    (1000, 1024, 8192, "bfloat16", None, False, "rows"),
    (1024, 1024, 1024, "float32", None, False, "dtype"),
    (1024, 1024, 1024, "bfloat16", "float16", False, "out_dtype"),
])
def test_supports_grouped_k_answers_as_documented(m, n, k, dtype, out, ok, why):
    answer = mk.supports_grouped_k(m, n, k, dtype, out_dtype=out)
    assert bool(answer) is ok, answer
    if not ok:
        assert isinstance(answer, mg.Unsupported) and why in answer


def test_a_config_past_shared_memory_is_refused():
    big = mk.GroupedKConfig(128, 128, 64, stages=12)
    answer = mk.supports_grouped_k(4096, 4096, 4096, "bfloat16", config=big)
    assert not answer and "shared memory" in answer


def test_two_ctas_per_sm_only_where_both_fit_an_sm():
    two = mk.GroupedKConfig(128, 128, 64, 2, 8, ctas_per_sm=2)
    assert two.name.endswith("_c2") and not mk.GROUPED_K_CONFIGS[0].name.endswith("_c1")
    assert mk.supports_grouped_k(2048, 768, 16384, "bfloat16", config=two)      # 96 KiB each
    answer = mk.supports_grouped_k(2048, 768, 16384, "bfloat16", out_dtype="float32", config=two)  # 128 KiB each
    assert not answer and "2 CTAs" in answer
    assert mk.supports_grouped_k(2048, 768, 16384, "bfloat16", out_dtype="float32",
                                 config=mk.GroupedKConfig(128, 128, 64, 2, 8))


def test_two_ctas_per_sm_are_timed_only_for_groups_of_a_few_k_blocks():
    two = next(c for c in ragged.MOSAIC_GROUPED_K if c.params["ctas_per_sm"] == 2)
    one = ragged.MOSAIC_GROUPED_K[0]
    short = _weight_gradient(2048, 768, 16384, 128).key()     # 128 rows a group: 2 blocks
    long = _weight_gradient(4096, 14336, 8192, 8).key()       # 1024 rows a group: 16 blocks
    assert two.runs(H200, short) is mk.AVAILABLE and one.runs(H200, short) is mk.AVAILABLE
    assert not two.runs(H200, long) and one.runs(H200, long) is mk.AVAILABLE


def test_group_table_covers_each_group_with_the_fewest_blocks():
    for trial, (k, groups, block_k, sizes) in enumerate(group_trials()):
        size, start, end, blocks, first = np.asarray(mk.group_table(jnp.asarray(sizes, jnp.int32), k, block_k))
        ends = np.minimum(np.cumsum(sizes), k)
        np.testing.assert_array_equal(end, ends)
        np.testing.assert_array_equal(start, np.concatenate([[0], ends[:-1]]))
        np.testing.assert_array_equal(size, end - start)
        for g in range(groups):
            if size[g] == 0:
                assert blocks[g] == 0, (trial, g)
                continue
            assert first[g] * block_k <= start[g] < (first[g] + 1) * block_k, (trial, g)
            assert (first[g] + blocks[g] - 1) * block_k < end[g] <= (first[g] + blocks[g]) * block_k, (trial, g)


# ---------------------------------------------------------------- CPU: cross-lowering

def _lowered(m, n, k, groups, dtype="bfloat16", *, config, out_dtype=None) -> str:
    fn = jax.jit(lambda x, d, s: mk.mosaic_grouped_k_gemm(x, d, s, config=config, out_dtype=out_dtype, num_sms=SMS))
    return cuda_text(fn, jax.ShapeDtypeStruct((k, m), dtype), jax.ShapeDtypeStruct((k, n), dtype),
                     jax.ShapeDtypeStruct((groups,), jnp.int32))


@needs_mosaic
@pytest.mark.parametrize("m,n,k,groups,dtype,out", [
    (4096, 14336, 8192, 8, "bfloat16", None),
    (2048, 1408, 16384, 64, "bfloat16", "float32"),
    (256, 128, 1000, 3, "float16", None),
])
def test_cross_lowers_to_one_mosaic_gpu_call(m, n, k, groups, dtype, out):
    for config in mk.GROUPED_K_CONFIGS:
        if mk.supports_grouped_k(m, n, k, dtype, out_dtype=out, config=config):
            assert custom_calls(_lowered(m, n, k, groups, dtype, config=config, out_dtype=out)) == ["mosaic_gpu_v2"]


@needs_mosaic
def test_bad_arguments_raise_naming_the_argument():
    config = mk.GROUPED_K_CONFIGS[0]
    x, dy = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16), jax.ShapeDtypeStruct((512, 256), jnp.bfloat16)

    def shape_of(a, b, s):
        return jax.eval_shape(lambda a, b, s: mk.mosaic_grouped_k_gemm(a, b, s, config=config, num_sms=SMS), a, b, s)
    with pytest.raises(ValueError, match="group_sizes"):
        shape_of(x, dy, jax.ShapeDtypeStruct((4,), jnp.float32))
    with pytest.raises(ValueError, match="same k"):
        shape_of(x, jax.ShapeDtypeStruct((256, 256), jnp.bfloat16), jax.ShapeDtypeStruct((4,), jnp.int32))
    with pytest.raises(ValueError, match="columns"):
        shape_of(x, jax.ShapeDtypeStruct((512, 200), jnp.bfloat16), jax.ShapeDtypeStruct((4,), jnp.int32))
    assert shape_of(x, dy, jax.ShapeDtypeStruct((4,), jnp.int32)).shape == (4, 256, 256)


# ---------------------------------------------------------------- CPU: candidates

def test_the_candidates_run_the_weight_gradient_on_hopper_only():
    names = ragged.ragged_candidate_set(H200).names()
    ours = [c.name for c in ragged.MOSAIC_GROUPED_K]
    assert len(ours) == len(mk.GROUPED_K_CONFIGS) and set(ours) <= set(names)
    assert not set(ours) & set(ragged.ragged_candidate_set(CPU).names())
    key = _weight_gradient(2048, 768, 16384, 128).key()
    for candidate in ragged.MOSAIC_GROUPED_K:
        assert candidate.params["family"] == "ragged_k_mosaic_gemm"
        assert candidate.runs(H200, key) is mk.AVAILABLE
        assert not candidate.runs(A100, key) and not candidate.runs(CPU, key)
    for problem in (MatmulProblem(1, 4096, 4096, 8192, "bfloat16", "bfloat16", "bfloat16", groups=8, ragged="k"),
                    _weight_gradient(4096, 4096, 8192, 8, transpose_b=True),   # operands not stored as the rule's
                    _weight_gradient(4096, 4096, 8192, 8, "float32"),
                    MatmulProblem(1, 8192, 4096, 4096, "bfloat16", "bfloat16", "bfloat16", groups=8, ragged="m")):
        assert not any(c.runs(H200, problem.key()) for c in ragged.MOSAIC_GROUPED_K), problem


@needs_mosaic
def test_the_candidate_runs_xla_where_the_stored_problem_is_not_served():
    def lowered(n):
        problem = _weight_gradient(256, n, 512, 4)
        return cuda_text(jax.jit(ragged.served(ragged.MOSAIC_GROUPED_K[0], problem)),
                         jax.ShapeDtypeStruct((512, 256), jnp.bfloat16), jax.ShapeDtypeStruct((512, n), jnp.bfloat16),
                         jax.ShapeDtypeStruct((4,), jnp.int32))
    assert "mosaic_gpu" not in lowered(200)
    assert custom_calls(lowered(256)) == ["mosaic_gpu_v2"]


# ---------------------------------------------------------------- GPU: numbers

def _check_per_group(got, x, dy, sizes, out_dtype):
    """Each group's product against float64, empty groups exactly zero."""
    got = np.asarray(got.astype(jnp.float32), np.float64)
    x, dy = np.asarray(x.astype(jnp.float32), np.float64), np.asarray(dy.astype(jnp.float32), np.float64)
    ends = np.minimum(np.cumsum(sizes), x.shape[0])
    start = 0
    for g, end in enumerate(ends):
        want = x[start:end].T @ dy[start:end]
        if end > start:
            assert rel_error(got[g], want) < KERNEL_TOLERANCES[out_dtype], f"group {g}"
        else:
            assert not np.any(got[g]), f"empty group {g} must be zero"
        start = end


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,groups,dtype,out,split", [
    (1024, 2048, 4096, 8, "bfloat16", None, "equal"),
    (1024, 2048, 4096, 8, "bfloat16", "float32", "skewed"),  # an empty group, an eighth in no group
    (512, 256, 4096, 8, "float16", None, "below"),           # sum < k
    (512, 256, 4096, 8, "bfloat16", None, "above"),          # sum > k: clipped as lax does
    (256, 128, 1000, 3, "bfloat16", None, "skewed"),         # k not a multiple of the block
    (2048, 768, 16384, 128, "bfloat16", "float32", "skewed"),
])
def test_gpu_matches_float64_per_group(m, n, k, groups, dtype, out, split):
    kx, kd = jax.random.split(jax.random.key(m + n + k + groups))
    x = jax.random.normal(kx, (k, m), jnp.float32).astype(dtype)
    dy = jax.random.normal(kd, (k, n), jnp.float32).astype(dtype)
    sizes = split_sizes(k, groups, split)
    out_dtype = out or dtype
    for config in mk.GROUPED_K_CONFIGS:
        if not mk.supports_grouped_k(m, n, k, dtype, out_dtype=out, config=config):
            continue
        got = jax.jit(lambda a, b, s, c=config: mk.mosaic_grouped_k_gemm(a, b, s, config=c, out_dtype=out))(
            x, dy, jnp.asarray(sizes))
        assert got.shape == (groups, m, n) and got.dtype == jnp.dtype(out_dtype)
        _check_per_group(got, x, dy, sizes, out_dtype)


@pytest.mark.gpu
def test_gpu_a_neighbouring_groups_inf_stays_in_its_group():
    k, m, n = 1000, 128, 128  # groups of 300, 400, 300 rows: boundaries inside blocks
    x = jax.random.normal(jax.random.key(1), (k, m), jnp.float32).astype(jnp.bfloat16)
    dy = jax.random.normal(jax.random.key(2), (k, n), jnp.float32).astype(jnp.bfloat16)
    x, dy = x.at[300:700].set(jnp.inf), dy.at[300:700].set(jnp.nan)
    sizes = np.array([300, 400, 300])
    got = jax.jit(lambda a, b, s: mk.mosaic_grouped_k_gemm(a, b, s, config=mk.GROUPED_K_CONFIGS[0]))(
        x, dy, jnp.asarray(sizes))
    assert np.isnan(np.asarray(got[1], np.float32)).all()
    keep = np.array([0, 2])
    _check_per_group(got[keep], np.concatenate([x[:300], x[700:]]), np.concatenate([dy[:300], dy[700:]]),
                     sizes[keep], "bfloat16")


@pytest.mark.gpu
def test_gpu_candidate_matches_lax_on_both_representative_splits():
    m, n, k, groups = 512, 1024, 2048, 8
    problem = _weight_gradient(m, n, k, groups)
    x = jax.random.normal(jax.random.key(3), (k, m), jnp.float32).astype(jnp.bfloat16)
    dy = jax.random.normal(jax.random.key(4), (k, n), jnp.float32).astype(jnp.bfloat16)
    splits = jnp.asarray(representative_splits(k, groups))
    want = ragged.XLA_RAGGED_DOT.fn(x, dy, problem, splits)
    for candidate in ragged.MOSAIC_GROUPED_K:
        got = jax.jit(lambda a, b, s, c=candidate: c.fn(a, b, problem, s))(x, dy, splits)
        assert got.shape == want.shape == (2, groups, m, n)
        assert rel_error(got, want) < KERNEL_TOLERANCES["bfloat16"], candidate.name


@pytest.mark.gpu
def test_gpu_the_weight_gradient_of_a_grouped_matmul_through_autotune():
    import jax_autotune as jat
    m, k, n, groups = 2048, 512, 1024, 8
    x = jax.random.normal(jax.random.key(5), (m, k), jnp.float32).astype(jnp.bfloat16)
    w = (jax.random.normal(jax.random.key(6), (groups, k, n), jnp.float32) / k ** 0.5).astype(jnp.bfloat16)
    sizes = jnp.asarray(representative_splits(m, groups)[1])

    def loss(x, w, sizes):
        return jnp.sum(lax.ragged_dot(x, w, sizes).astype(jnp.float32) ** 2)
    want = jax.jit(jax.grad(loss, argnums=1))(x, w, sizes)
    got = jax.jit(jax.grad(jat.autotune(loss), argnums=1))(x, w, sizes)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert rel_error(np.asarray(got, np.float32), np.asarray(want, np.float32)) < KERNEL_TOLERANCES["bfloat16"]


@needs_mosaic
def test_on_hopper_the_mosaic_kernels_run_first_and_the_dense_formulations_only_where_none_is_valid():
    from jax_autotune.tuning.plan import make_plan
    cset = ragged.ragged_candidate_set(H200)
    up = MatmulProblem(1, 8192, 14336, 4096, "bfloat16", "bfloat16", "bfloat16", groups=8, ragged="m")
    for problem, ours, dense in ((_weight_gradient(4096, 14336, 8192, 8), ragged.MOSAIC_GROUPED_K, {"padded"}),
                                 (up, ragged.MOSAIC_GROUPED, {"padded", "masked"})):
        rounds = make_plan(cset, problem.key(), H200).rounds
        assert [c.name for c in rounds[0].candidates] == [c.name for c in ours if c.runs(H200, problem.key())]
        assert rounds[0].tier > rounds[1].tier
        assert {c.name.split("_")[1] for c in rounds[1].candidates} == dense
