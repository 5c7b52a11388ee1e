"""Our Mosaic GPU GEMM (kernels/gpu/mosaic_gemm.py): what it serves, that it cross-lowers on
CPU to a Mosaic GPU custom call, its configs; on a GPU, its numbers against float64."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_autotune.epilogue import Epilogue
from jax_autotune.kernels.gpu import mosaic_gemm as mg
from cross_lowering import cuda_text, custom_calls
from numerics import KERNEL_TOLERANCES, rel_error

needs_mosaic = pytest.mark.skipif(not mg.AVAILABLE, reason=f"Mosaic GPU unavailable: {mg.IMPORT_ERROR}")
SMS = mg.H100_SMS
SMALL = mg.MosaicGemmConfig(stages=3)  # leaves shared memory for epilogue tiles and f32
BIAS_TANH = Epilogue.parse("row:bfloat16|add(y,$0);tanh(%0)")

# (m, n, k, dtype, transpose_lhs, transpose_rhs, out_dtype, supported?, what the reason names)
TABLE = [
    (4096, 4096, 4096, "bfloat16", False, False, None, True, ""),
    (4096, 4096, 4096, "float16", True, True, "float32", True, ""),
    (1000, 1040, 1008, "bfloat16", False, False, None, True, ""),   # partial tiles in m and n
    (1000, 1032, 1008, "bfloat16", False, True, None, True, ""),    # n only 16-byte aligned
    (1008, 1000, 1008, "float16", True, True, None, True, ""),
    (2048, 50264, 768, "bfloat16", False, True, None, True, ""),   # head padded to 8 by its owner
    (8, 1024, 1008, "bfloat16", False, False, None, True, ""),
    (1024, 1024, 1024, "float32", False, True, None, True, ""),     # TF32: K-major only
    (2048, 50257, 768, "bfloat16", False, True, None, False, "rhs"),  # vocabulary head as stored
    (2048, 50257, 768, "bfloat16", False, False, None, False, "rhs"),
    (4095, 4095, 4095, "bfloat16", False, False, None, False, "lhs"),
    (1000, 1025, 7, "bfloat16", False, False, None, False, "rhs"),
    (7, 1024, 1008, "bfloat16", False, False, None, False, "lhs"),
    (1024, 1024, 1000, "bfloat16", False, False, None, False, "multiples of 16"),  # k % 16
    (1024, 1024, 1024, "float32", False, False, None, False, "K-major"),
    (1024, 1024, 1024, "bfloat16", False, False, "float16", False, "out_dtype"),
    (1024, 1024, 1024, "int8", False, False, None, False, "dtype"),
]


def _shapes(m, n, k, transpose_lhs, transpose_rhs, batch=None):
    a = (k, m) if transpose_lhs else (m, k)
    b = (n, k) if transpose_rhs else (k, n)
    return ((batch, *a), (batch, *b)) if batch else (a, b)


def _lowered(m, n, k, dtype, transpose_lhs=False, transpose_rhs=False, *, config=None, batch=None,
             operands=(), **kwargs) -> str:
    a, b = _shapes(m, n, k, transpose_lhs, transpose_rhs, batch)
    fn = jax.jit(lambda x, y, *ops: mg.mosaic_gemm(x, y, config=config or mg.MosaicGemmConfig(),
                                                   transpose_lhs=transpose_lhs, transpose_rhs=transpose_rhs,
                                                   epilogue_operands=ops, num_sms=SMS, **kwargs))
    return cuda_text(fn, jax.ShapeDtypeStruct(a, dtype), jax.ShapeDtypeStruct(b, dtype), *operands)


# ---------------------------------------------------------------- CPU: what it serves

@needs_mosaic
@pytest.mark.parametrize("m,n,k,dtype,tl,tr,out,ok,why", TABLE)
def test_supports_answers_as_documented(m, n, k, dtype, tl, tr, out, ok, why):
    answer = mg.supports(m, n, k, dtype, transpose_lhs=tl, transpose_rhs=tr, out_dtype=out)
    assert bool(answer) is ok, answer
    if not ok:
        assert isinstance(answer, mg.Unsupported) and why in answer


def test_unavailable_is_a_reason():
    if mg.AVAILABLE:
        assert mg.IMPORT_ERROR is None
    else:
        assert not mg.supports(1024, 1024, 1024, "bfloat16") and mg.IMPORT_ERROR


@needs_mosaic
@pytest.mark.parametrize("m,n,k,dtype,tl,tr,out", [row[:7] for row in TABLE if row[7]])
def test_supported_problems_cross_lower(m, n, k, dtype, tl, tr, out):
    config = SMALL if dtype == "float32" or out == "float32" else None
    if dtype == "float32":
        config = mg.MosaicGemmConfig(tile_k=32, stages=3)
    assert custom_calls(_lowered(m, n, k, dtype, tl, tr, config=config, out_dtype=out)) == ["mosaic_gpu_v2"]


@needs_mosaic
def test_batch_split_k_and_epilogues_cross_lower():
    assert custom_calls(_lowered(1024, 1024, 512, "bfloat16", batch=3)) == ["mosaic_gpu_v2"]
    split = _lowered(256, 256, 8192, "bfloat16", config=mg.MosaicGemmConfig(stages=3, split_k=4))
    assert custom_calls(split) == ["mosaic_gpu_v2"] and "reduce" in split  # XLA sums the partials
    bias = jax.ShapeDtypeStruct((1024,), jnp.bfloat16)
    assert custom_calls(_lowered(1024, 1024, 512, "bfloat16", config=SMALL, epilogue=BIAS_TANH,
                                  operands=(bias,))) == ["mosaic_gpu_v2"]
    roles = ("row", "col", "full")
    operands = (jax.ShapeDtypeStruct((1032,), jnp.float32), jax.ShapeDtypeStruct((1000,), jnp.float32),
                jax.ShapeDtypeStruct((1000, 1032), jnp.bfloat16))
    text = _lowered(1000, 1032, 512, "bfloat16", False, True, config=SMALL, operands=operands, epilogue_roles=roles,
                    epilogue=lambda y, r, c, f: jax.nn.relu(y + r) * c + f)  # relu's custom_jvp inlined
    assert custom_calls(text) == ["mosaic_gpu_v2"]


@needs_mosaic
@pytest.mark.parametrize("m,n,k,tl,tr,word", [(2048, 50257, 768, False, True, "rhs"),
                                              (4095, 4095, 4095, False, False, "lhs"),
                                              (1024, 1024, 1000, False, False, "k=1000")])
def test_unsupported_problems_raise_naming_the_argument(m, n, k, tl, tr, word):
    with pytest.raises(ValueError, match=word):
        _lowered(m, n, k, "bfloat16", tl, tr)


@needs_mosaic
def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="contraction"):
        jax.eval_shape(lambda a, b: mg.mosaic_gemm(a, b, config=SMALL, num_sms=SMS),
                       jax.ShapeDtypeStruct((64, 128), jnp.bfloat16), jax.ShapeDtypeStruct((64, 128), jnp.bfloat16))
    with pytest.raises(ValueError, match="epilogue_roles"):
        mg.mosaic_gemm(jnp.zeros((64, 64), jnp.bfloat16), jnp.zeros((64, 64), jnp.bfloat16), config=SMALL,
                       epilogue=lambda y: y, num_sms=SMS)
    with pytest.raises(ValueError, match="MosaicGemmConfig.wg_dimension"):
        mg.MosaicGemmConfig(wg_dimension="K")


# ---------------------------------------------------------------- CPU: configs

@pytest.mark.parametrize("m,n,k,dtype", [(4096, 4096, 4096, "bfloat16"), (2048, 50264, 768, "bfloat16"),
                                         (16, 8192, 8192, "bfloat16"), (1000, 1040, 1008, "float16"),
                                         (1024, 1024, 1024, "float32")])
def test_configs_for_returns_few_that_fit(m, n, k, dtype):
    configs = mg.configs_for(m, n, k, dtype)
    assert 2 <= len(configs) <= 4 and len({c.name for c in configs}) == len(configs)
    assert all(mg.fits_shared_memory(c, dtype) for c in configs)
    if m * n <= 2 ** 21 and k >= 4096:
        assert configs[0].split_k > 1


def test_shared_memory_of_the_reference_tile():
    config = mg.MosaicGemmConfig(128, 128, 64, 4)  # JAX's example: 128x256 CTA tile, 4 stages
    assert mg.fits_shared_memory(config, "bfloat16")
    assert not mg.fits_shared_memory(config, "float32")
    assert not mg.fits_shared_memory(config, "bfloat16", operands=[("full", "float32")])
    assert config.name == "tm128_tn128_tk64_st4_wgN_gN8"


# ---------------------------------------------------------------- GPU: numbers

def _operands(key, m, n, k, dtype, tl, tr, batch=None):
    a, b = _shapes(m, n, k, tl, tr, batch)
    ka, kb = jax.random.split(key)
    return (jax.random.normal(ka, a, jnp.float32).astype(dtype), jax.random.normal(kb, b, jnp.float32).astype(dtype))


def _reference(lhs, rhs, tl, tr):
    a, b = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    a = np.swapaxes(a, -1, -2) if tl else a
    b = np.swapaxes(b, -1, -2) if tr else b
    return a @ b




@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,dtype,tl,tr,out", [
    (1000, 1040, 1008, "bfloat16", False, False, None),
    (1000, 1032, 1008, "bfloat16", False, True, None),
    (1008, 1000, 1008, "float16", True, True, "float32"),
    (1008, 1024, 1000 + 8, "bfloat16", True, False, None),
    (8, 1024, 1008, "bfloat16", False, False, None),
    (2048, 50264, 768, "bfloat16", False, True, None),
    (1024, 1024, 1024, "float32", False, True, None),
])
def test_gpu_matches_float64(m, n, k, dtype, tl, tr, out):
    lhs, rhs = _operands(jax.random.key(m + n + k), m, n, k, dtype, tl, tr)
    config = mg.MosaicGemmConfig(tile_k=32, stages=3) if dtype == "float32" else SMALL
    got = jax.jit(lambda a, b: mg.mosaic_gemm(a, b, config=config, transpose_lhs=tl, transpose_rhs=tr,
                                              out_dtype=out))(lhs, rhs)
    assert got.shape == (m, n) and got.dtype == jnp.dtype(out or dtype)
    assert rel_error(got, _reference(lhs, rhs, tl, tr)) < KERNEL_TOLERANCES[dtype]


@pytest.mark.gpu
def test_gpu_batch_and_split_k():
    lhs, rhs = _operands(jax.random.key(1), 520, 1040, 512, "bfloat16", False, False, batch=3)
    got = mg.mosaic_gemm(lhs, rhs, config=SMALL)
    assert rel_error(got, _reference(lhs, rhs, False, False)) < KERNEL_TOLERANCES["bfloat16"]
    lhs, rhs = _operands(jax.random.key(2), 136, 264, 8208, "bfloat16", False, True)
    got = mg.mosaic_gemm(lhs, rhs, config=mg.MosaicGemmConfig(stages=3, split_k=3), transpose_rhs=True)
    assert rel_error(got, _reference(lhs, rhs, False, True)) < KERNEL_TOLERANCES["bfloat16"]


@pytest.mark.gpu
def test_gpu_epilogues():
    m, n, k = 1000, 1040, 512
    lhs, rhs = _operands(jax.random.key(3), m, n, k, "bfloat16", False, False)
    bias = jax.random.normal(jax.random.key(4), (n,), jnp.float32).astype(jnp.bfloat16)
    got = mg.mosaic_gemm(lhs, rhs, config=SMALL, epilogue=BIAS_TANH, epilogue_operands=(bias,))
    product = _reference(lhs, rhs, False, False)
    want = BIAS_TANH.reference(np.asarray(jnp.asarray(product, jnp.bfloat16), np.float64), [np.asarray(bias)])
    assert rel_error(got, want) < KERNEL_TOLERANCES["bfloat16"]
    col = jax.random.normal(jax.random.key(5), (m,), jnp.float32)
    full = jax.random.normal(jax.random.key(6), (m, n), jnp.float32).astype(jnp.bfloat16)
    got = mg.mosaic_gemm(lhs, rhs, config=SMALL, epilogue=lambda y, c, f: jnp.maximum(y * c, 0.0) + f,
                         epilogue_roles=("col", "full"), epilogue_operands=(col, full))
    want = np.maximum(product * np.asarray(col, np.float64)[:, None], 0) + np.asarray(full, np.float64)
    assert rel_error(got, want) < KERNEL_TOLERANCES["bfloat16"]
