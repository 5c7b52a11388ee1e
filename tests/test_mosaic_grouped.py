"""Our Mosaic GPU grouped GEMM (kernels/gpu/mosaic_grouped.py): what it serves, its tile table,
that it cross-lowers on CPU to a Mosaic GPU custom call, its configs and candidates; on a GPU,
its numbers against float64 per group on every kind of split."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_autotune.kernels import ragged
from jax_autotune.kernels.gpu import mosaic_gemm as mg
from jax_autotune.kernels.gpu import mosaic_grouped as mgr
from jax_autotune.problem import MatmulProblem
from jax_autotune.splits import representative_splits
from jax_autotune.tuning.device import DeviceInfo
from cross_lowering import cuda_text, custom_calls
from group_trials import group_trials
from numerics import KERNEL_TOLERANCES, rel_error

needs_mosaic = pytest.mark.skipif(not mgr.AVAILABLE, reason=f"Mosaic GPU unavailable: {mgr.IMPORT_ERROR}")
SMS = mg.H100_SMS
H200 = DeviceInfo("gpu", "NVIDIA H200", 143_771 * 2**20, (9, 0))
A100 = DeviceInfo("gpu", "NVIDIA A100-SXM4-80GB", 80 * 2**30, (8, 0))
CPU = DeviceInfo("cpu", "cpu")

# (m, n, k, groups, dtype, transpose_rhs, out_dtype, supported?, what the reason names)
TABLE = [
    (8192, 14336, 4096, 8, "bfloat16", False, None, True, ""),     # Mixtral up
    (8192, 4096, 14336, 8, "bfloat16", False, None, True, ""),     # Mixtral down
    (16384, 768, 2048, 128, "bfloat16", False, None, True, ""),    # Qwen MoE up, 128 experts
    (1000, 1088, 1008, 4, "float16", True, "float32", True, ""),   # partial tiles in m, n and k
    (1000, 1040, 1008, 4, "bfloat16", False, None, False, "128 bytes"),  # the store tile's swizzle
    (1000, 1032, 512, 4, "bfloat16", False, None, False, "bytes"),  # n only 16-byte aligned
    (1001, 1024, 512, 4, "bfloat16", False, None, False, "row count"),
    (1024, 1024, 1000, 4, "bfloat16", False, None, False, "multiples of 16"),
    (1024, 1024, 1024, 4, "float32", True, None, False, "dtype"),
    (1024, 1024, 1024, 4, "bfloat16", False, "float16", False, "out_dtype"),
    (1024, 1024, 1024, 0, "bfloat16", False, None, False, "groups"),
]


def _rhs_shape(n, k, groups, transpose_rhs):
    return (groups, n, k) if transpose_rhs else (groups, k, n)


def _lowered(m, n, k, groups, dtype="bfloat16", transpose_rhs=False, *, config=None, out_dtype=None) -> str:
    config = config or mgr.configs_for_grouped(m, n, k, groups, dtype, out_dtype=out_dtype)[0]
    fn = jax.jit(lambda x, w, s: mgr.mosaic_grouped_gemm(x, w, s, config=config, transpose_rhs=transpose_rhs,
                                                         out_dtype=out_dtype, num_sms=SMS))
    return cuda_text(fn, jax.ShapeDtypeStruct((m, k), dtype),
                     jax.ShapeDtypeStruct(_rhs_shape(n, k, groups, transpose_rhs), dtype),
                     jax.ShapeDtypeStruct((groups,), jnp.int32))


# ---------------------------------------------------------------- CPU: what it serves

@needs_mosaic
@pytest.mark.parametrize("m,n,k,groups,dtype,tr,out,ok,why", TABLE)
def test_supports_grouped_answers_as_documented(m, n, k, groups, dtype, tr, out, ok, why):
    answer = mgr.supports_grouped(m, n, k, groups, dtype, transpose_rhs=tr, out_dtype=out)
    assert bool(answer) is ok, answer
    if not ok:
        assert isinstance(answer, mg.Unsupported) and why in answer


def test_configs_that_split_m_or_store_part_of_the_rows_are_refused():
    for config in (mg.MosaicGemmConfig(wg_dimension="M", epi_tile_m=128), mg.MosaicGemmConfig(epi_tile_m=64),
                   mg.MosaicGemmConfig(split_k=2, epi_tile_m=128)):
        answer = mgr.supports_grouped(1024, 1024, 1024, 4, "bfloat16", config=config)
        assert not answer and "wg_dimension='N'" in answer


def test_tile_table_covers_every_row_once_with_its_group():
    for m, groups, tile_m, sizes in group_trials():
        table = np.asarray(mgr.tile_table(jnp.asarray(sizes, jnp.int32), m, tile_m))
        ends = np.minimum(np.cumsum(sizes), m)
        starts = np.concatenate([[0], ends[:-1]])
        want = np.full(m, groups)  # rows past the groups: the zero pseudo-group
        for g in range(groups):
            want[starts[g]:ends[g]] = g
        got = np.full(m, -1)
        for group, block, first, rows in table.T:
            if rows:
                assert 0 <= first and first + rows <= tile_m
                span = np.arange(block * tile_m + first, block * tile_m + first + rows)
                assert (got[span] == -1).all()
                got[span] = group
        np.testing.assert_array_equal(got, want, err_msg=f"m={m} sizes={sizes} tile_m={tile_m}")


# ---------------------------------------------------------------- CPU: cross-lowering

@needs_mosaic
@pytest.mark.parametrize("m,n,k,groups,tr,out", [
    (8192, 14336, 4096, 8, False, None),    # Mixtral up
    (16384, 768, 2048, 128, False, None),   # 128 groups
    (1000, 1024, 512, 4, False, None),      # odd m: a partial last row block
    (1000, 1088, 1008, 4, False, None),     # n and k not multiples of the tiles
    (1000, 1088, 1008, 4, True, "float32"),  # transpose_rhs, partial tiles everywhere, f32 out
])
def test_cross_lowers_to_one_mosaic_gpu_call(m, n, k, groups, tr, out):
    for config in mgr.configs_for_grouped(m, n, k, groups, "bfloat16", out_dtype=out):
        assert custom_calls(_lowered(m, n, k, groups, transpose_rhs=tr, config=config,
                                      out_dtype=out)) == ["mosaic_gpu_v2"], config.name


@needs_mosaic
def test_bad_arguments_raise_naming_the_argument():
    config = mgr.GROUPED_CONFIGS[0]
    x, w = jax.ShapeDtypeStruct((256, 128), jnp.bfloat16), jax.ShapeDtypeStruct((4, 128, 256), jnp.bfloat16)
    with pytest.raises(ValueError, match="group_sizes"):
        jax.eval_shape(lambda a, b, s: mgr.mosaic_grouped_gemm(a, b, s, config=config, num_sms=SMS),
                       x, w, jax.ShapeDtypeStruct((3,), jnp.int32))
    with pytest.raises(ValueError, match="contraction"):
        jax.eval_shape(lambda a, b, s: mgr.mosaic_grouped_gemm(a, b, s, config=config, num_sms=SMS),
                       jax.ShapeDtypeStruct((256, 64), jnp.bfloat16), w, jax.ShapeDtypeStruct((4,), jnp.int32))
    with pytest.raises(ValueError, match="row count"):
        _lowered(1001, 1024, 512, 4, config=config)


# ---------------------------------------------------------------- CPU: configs and candidates

@pytest.mark.parametrize("m,n,k,groups,out", [(8192, 14336, 4096, 8, None), (8192, 4096, 14336, 8, None),
                                              (16384, 768, 2048, 128, None), (1000, 1088, 1008, 4, "float32")])
def test_configs_for_grouped_returns_few_that_fit(m, n, k, groups, out):
    configs = mgr.configs_for_grouped(m, n, k, groups, "bfloat16", out_dtype=out)
    assert 2 <= len(configs) <= 3 and len({c.name for c in configs}) == len(configs)
    assert all(mg.fits_shared_memory(c, "bfloat16", out) for c in configs)
    assert all(mgr.supports_grouped(m, n, k, groups, "bfloat16", out_dtype=out, config=c) for c in configs)


def test_small_groups_prefer_the_short_row_block():
    # 256 groups of 64 rows: a 128-row block would hold a boundary each, computed twice
    assert mgr.configs_for_grouped(16384, 768, 2048, 256, "bfloat16")[0].tile_m == 64


def test_the_gpu_candidate_set_holds_the_mosaic_grouped_gemms_for_hopper_only():
    names = ragged.ragged_candidate_set(H200).names()
    mosaic = [c.name for c in ragged.MOSAIC_GROUPED]
    assert len(mosaic) == len(mgr.GROUPED_CONFIGS) and set(mosaic) <= set(names)
    assert names[0] == ragged.XLA_RAGGED_NAME
    assert not set(mosaic) & set(ragged.ragged_candidate_set(CPU).names())
    key = MatmulProblem(1, 8192, 14336, 4096, "bfloat16", "bfloat16", "bfloat16", groups=8, ragged="m").key()
    for candidate in ragged.MOSAIC_GROUPED:
        assert candidate.params["family"] == "ragged_mosaic_gemm"
        assert candidate.runs(H200, key) is mgr.AVAILABLE
        assert not candidate.runs(A100, key) and not candidate.runs(CPU, key)
    for problem in (MatmulProblem(1, 1024, 1024, 1024, "float32", "float32", "float32", groups=8, ragged="m"),
                    MatmulProblem(1, 1024, 1024, 1000, "bfloat16", "bfloat16", "bfloat16", groups=8, ragged="m"),
                    MatmulProblem(1, 64, 32, 1024, "bfloat16", "bfloat16", "bfloat16", transpose_a=True,
                                  groups=8, ragged="k")):
        assert not any(c.runs(H200, problem.key()) for c in ragged.MOSAIC_GROUPED), problem


@needs_mosaic
def test_the_candidate_runs_xla_where_the_stored_problem_is_not_served():
    # m=1001 buckets with aligned sizes, but lhs rows are not a multiple of 8: XLA's ragged_dot
    def lowered(m):
        problem = MatmulProblem(1, m, 256, 256, "bfloat16", "bfloat16", "bfloat16", groups=4, ragged="m")
        return cuda_text(jax.jit(ragged.served(ragged.MOSAIC_GROUPED[0], problem)),
                         jax.ShapeDtypeStruct((m, 256), jnp.bfloat16), jax.ShapeDtypeStruct((4, 256, 256), jnp.bfloat16),
                         jax.ShapeDtypeStruct((4,), jnp.int32))
    assert "mosaic_gpu" not in lowered(1001)
    text = lowered(1000)
    assert custom_calls(text) == ["mosaic_gpu_v2"]


# ---------------------------------------------------------------- GPU: numbers



def _operands(seed, m, n, k, groups, dtype, transpose_rhs):
    kx, kw = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (m, k), jnp.float32).astype(dtype)
    w = jax.random.normal(kw, _rhs_shape(n, k, groups, transpose_rhs), jnp.float32).astype(dtype)
    return x, w


def _check_per_group(got, x, w, sizes, transpose_rhs, out_dtype):
    """Each group's rows against float64, the rows past the groups exactly zero."""
    got = np.asarray(got.astype(jnp.float32), np.float64)
    x, w = np.asarray(x.astype(jnp.float32), np.float64), np.asarray(w.astype(jnp.float32), np.float64)
    if transpose_rhs:
        w = np.swapaxes(w, 1, 2)
    ends = np.minimum(np.cumsum(sizes), x.shape[0])
    start = 0
    for g, end in enumerate(ends):
        if end > start:
            assert rel_error(got[start:end], x[start:end] @ w[g]) < KERNEL_TOLERANCES[out_dtype], f"group {g}"
        start = end
    assert not np.any(got[start:]), "rows past sum(group_sizes) must be zero"


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,groups,dtype,tr,out,split", [
    (4096, 2048, 1024, 8, "bfloat16", False, None, "equal"),
    (4096, 2048, 1024, 8, "bfloat16", False, None, "skewed"),     # group 1 empty, an eighth in no group
    (4096, 2048, 1024, 8, "float16", False, "float32", "below"),  # sum < m
    (4096, 2048, 1024, 8, "bfloat16", False, None, "above"),      # sum > m: clipped as lax does
    (1000, 1088, 1008, 4, "bfloat16", False, None, "skewed"),     # odd m, partial tiles in n and k
    (1000, 1088, 1008, 4, "float16", True, None, "equal"),        # transpose_rhs
    (16384, 768, 2048, 128, "bfloat16", False, None, "equal"),
    (16384, 768, 2048, 128, "bfloat16", True, None, "skewed"),    # 128 groups
])
def test_gpu_matches_float64_per_group(m, n, k, groups, dtype, tr, out, split):
    x, w = _operands(m + n + k + groups, m, n, k, groups, dtype, tr)
    if split in ("equal", "skewed"):
        sizes = representative_splits(m, groups)[0 if split == "equal" else 1]
    else:
        sizes = representative_splits(m, groups)[0] * (3 if split == "above" else 1)
        sizes[-2:] = 0 if split == "below" else sizes[-2:]
    out_dtype = out or dtype
    for config in mgr.configs_for_grouped(m, n, k, groups, dtype, out_dtype=out):
        got = jax.jit(lambda a, b, s, c=config: mgr.mosaic_grouped_gemm(a, b, s, config=c, transpose_rhs=tr,
                                                                        out_dtype=out))(x, w, jnp.asarray(sizes))
        assert got.shape == (m, n) and got.dtype == jnp.dtype(out_dtype)
        _check_per_group(got, x, w, sizes, tr, out_dtype)


@pytest.mark.gpu
def test_gpu_candidate_matches_lax_on_both_representative_splits():
    m, n, k, groups = 2048, 1024, 512, 8
    problem = MatmulProblem(1, m, n, k, "bfloat16", "bfloat16", "bfloat16", groups=groups, ragged="m")
    x, w = _operands(7, m, n, k, groups, "bfloat16", False)
    splits = jnp.asarray(representative_splits(m, groups))
    for candidate in ragged.MOSAIC_GROUPED:
        got = jax.jit(lambda a, b, s, c=candidate: c.fn(a, b, problem, s))(x, w, splits)
        want = ragged.XLA_RAGGED_DOT.fn(x, w, problem, splits)
        assert got.shape == want.shape == (2, m, n)
        assert rel_error(got, want) < KERNEL_TOLERANCES["bfloat16"], candidate.name


@needs_mosaic
def test_the_candidate_in_a_swiglu_context_lowers_to_the_kernel_and_the_ops_after_it():
    from jax_autotune.epilogue import Epilogue
    problem = MatmulProblem(1, 1024, 512, 256, "bfloat16", "bfloat16", "bfloat16", groups=8, ragged="m",
                            epilogue=Epilogue.parse("full:bfloat16|logistic(y);mul(y,%0);mul(%1,$0)"))
    assert ragged.MOSAIC_GROUPED[0].runs(H200, problem.key()) is mgr.AVAILABLE
    text = cuda_text(jax.jit(ragged.served(ragged.MOSAIC_GROUPED[0], problem)),
                     jax.ShapeDtypeStruct((1024, 256), jnp.bfloat16), jax.ShapeDtypeStruct((8, 256, 512), jnp.bfloat16),
                     jax.ShapeDtypeStruct((8,), jnp.int32), jax.ShapeDtypeStruct((1024, 512), jnp.bfloat16))
    assert custom_calls(text) == ["mosaic_gpu_v2"] and "stablehlo.exponential" in text  # the logistic, after it
