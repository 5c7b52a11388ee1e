"""The GPU candidates on a real GPU: every first-round kernel matches XLA's f32 HIGHEST dot.

Skipped without a CUDA GPU; on the device: ``PYTHONPATH=. pytest -m gpu tests/test_gpu_device.py``.
"""

import jax
import jax.numpy as jnp
import pytest

from jax_autotune.tuning.device import DeviceInfo
from jax_autotune.kernels.gpu.candidates import gpu_candidate_set
from jax_autotune.key import Precision
from jax_autotune.problem import MatmulProblem
from jax_autotune.kernels.xla import xla_dot
from jax_autotune.tuning.lowering_warnings import quiet

pytestmark = pytest.mark.gpu

HAS_GPU = any(d.platform == "gpu" for d in jax.devices())
requires_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
TOLERANCE = {("bfloat16", "DEFAULT"): 1e-2, ("float32", "DEFAULT"): 3e-3,
             ("float32", "HIGHEST"): 1e-5}


def this_device() -> DeviceInfo:
    dev = jax.devices("gpu")[0]
    cc = tuple(int(x) for x in str(dev.compute_capability).split(".")[:2])
    return DeviceInfo("gpu", dev.device_kind, 0, cc, frozenset())


@requires_gpu
@pytest.mark.parametrize("batch,m,n,k,dtype,precision,ta,tb", [
    (1, 768, 768, 768, "bfloat16", "DEFAULT", False, False),
    (1, 1025, 1025, 1025, "float32", "DEFAULT", False, False),
    (3, 257, 129, 1025, "bfloat16", "DEFAULT", True, True),
    (1, 1000, 1000, 1000, "float32", "HIGHEST", True, False),
    (1, 16, 8192, 1024, "bfloat16", "DEFAULT", False, True),
    (1, 1, 4096, 4096, "float32", "HIGHEST", False, False),
    (1, 2048, 2048, 2048, "bfloat16", "DEFAULT", False, False),
    (1, 1025, 1025, 1025, "bfloat16", "DEFAULT", False, False),  # packed, as stored
    (1, 1000, 1000, 1000, "float32", "DEFAULT", True, False),  # packed K-major (TF32)
    (1, 128, 1024, 4096, "float32", "DEFAULT", False, False),  # XLA's transposed dot
])
def test_every_supported_candidate_matches_the_f32_reference(batch, m, n, k, dtype, precision,
                                                            ta, tb):
    device = this_device()
    problem = MatmulProblem(batch, m, n, k, dtype, dtype, dtype, ta, tb, precision)
    key = problem.key("balanced")
    k1, k2 = jax.random.split(jax.random.key(m + n + k))
    lhs = jax.random.normal(k1, problem.lhs_shape, jnp.float32).astype(dtype)
    rhs = jax.random.normal(k2, problem.rhs_shape, jnp.float32).astype(dtype)
    ref = xla_dot(lhs.astype(jnp.float32), rhs.astype(jnp.float32), problem, Precision.HIGHEST)
    cset = gpu_candidate_set(device)
    groups = {g.name for g in cset.groups if g.priority(key) >= 0}
    names = {m.candidate for m in cset.memberships if m.group in groups and m.priority(key) >= 0}
    tol = TOLERANCE[(dtype, precision if dtype == "float32" else "DEFAULT")]
    failures = []
    for name in sorted(names):
        cand = cset.by_name(name)
        if not cand.supports(device, key):
            continue
        with quiet():  # lowered as the tuner lowers it
            out = jax.jit(lambda a, b, c=cand: c.fn(a, b, problem))(lhs, rhs)
        assert out.shape == problem.out_shape and str(out.dtype) == dtype
        err = float(jnp.linalg.norm(out.astype(jnp.float32) - ref) / jnp.linalg.norm(ref))
        if not err <= tol:
            failures.append((name, err))
    assert not failures, failures


@requires_gpu
def test_cublaslt_is_loaded_on_a_cuda_gpu():
    from jax_autotune.kernels.gpu import cublaslt

    assert cublaslt.available(), cublaslt.error()
    assert "libcublasLt.so" in cublaslt.library()


@requires_gpu
@pytest.mark.parametrize("batch,m,n,k,dtype,out_dtype,precision,ta,tb", [
    (1, 768, 768, 768, "bfloat16", "bfloat16", "DEFAULT", False, False),
    (1, 1, 7, 1025, "bfloat16", "bfloat16", "DEFAULT", False, False),
    (1, 1000, 1, 7, "float16", "float16", "DEFAULT", True, False),
    (3, 257, 129, 1025, "bfloat16", "float32", "DEFAULT", True, True),
    (96, 1024, 1024, 64, "bfloat16", "bfloat16", "DEFAULT", False, True),
    (1, 1025, 1025, 1025, "float32", "float32", "DEFAULT", False, True),
    (2, 1000, 1000, 1000, "float32", "float32", "HIGHEST", True, False),
    (1, 16, 14336, 4096, "bfloat16", "bfloat16", "DEFAULT", False, False),
])
def test_cublaslt_matches_the_f32_reference_with_every_algorithm(batch, m, n, k, dtype, out_dtype,
                                                                 precision, ta, tb):
    import jax_autotune._native as _native
    from jax_autotune.kernels.gpu import cublaslt

    problem = MatmulProblem(batch, m, n, k, dtype, dtype, out_dtype, ta, tb, precision)
    k1, k2 = jax.random.split(jax.random.key(batch + m + n + k))
    lhs = jax.random.normal(k1, problem.lhs_shape, jnp.float32).astype(dtype)
    rhs = jax.random.normal(k2, problem.rhs_shape, jnp.float32).astype(dtype)
    ref = xla_dot(lhs.astype(jnp.float32), rhs.astype(jnp.float32), problem, Precision.HIGHEST)
    tol = TOLERANCE[(dtype if dtype == "float32" else "bfloat16",
                     precision if dtype == "float32" else "DEFAULT")]
    last = _native.cublaslt_max_algorithms - 1  # past what the heuristic offers: its last one runs
    for algorithm in (0, 1, 2, last):
        out = jax.jit(lambda a, b: cublaslt.matmul(a, b, problem, algorithm=algorithm))(lhs, rhs)
        assert out.shape == problem.out_shape and str(out.dtype) == out_dtype
        assert bool(jnp.all(jnp.isfinite(out.astype(jnp.float32))))
        err = float(jnp.linalg.norm(out.astype(jnp.float32) - ref) / jnp.linalg.norm(ref))
        assert err <= tol, (algorithm, err)
    with pytest.raises(ValueError, match="algorithm"):  # the handler's range, refused up front
        cublaslt.matmul(lhs, rhs, problem, algorithm=last + 1)


@requires_gpu
def test_cublaslt_under_vmap_matches_lax():
    from jax_autotune.kernels.gpu import cublaslt

    problem = MatmulProblem(1, 64, 48, 32, "float32", "float32", "float32", precision="HIGHEST")
    k1, k2 = jax.random.split(jax.random.key(7))
    lhs = jax.random.normal(k1, (5, *problem.lhs_shape), jnp.float32)
    rhs = jax.random.normal(k2, (5, *problem.rhs_shape), jnp.float32)
    out = jax.jit(jax.vmap(lambda a, b: cublaslt.matmul(a, b, problem)))(lhs, rhs)
    ref = jnp.einsum("xbmk,xbkn->xbmn", lhs, rhs, precision="highest")
    assert float(jnp.max(jnp.abs(out - ref))) <= 1e-4 * float(jnp.max(jnp.abs(ref)))
