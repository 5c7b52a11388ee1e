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
        out = jax.jit(lambda a, b, c=cand: c.fn(a, b, problem))(lhs, rhs)
        assert out.shape == problem.out_shape and str(out.dtype) == dtype
        err = float(jnp.linalg.norm(out.astype(jnp.float32) - ref) / jnp.linalg.norm(ref))
        if not err <= tol:
            failures.append((name, err))
    assert not failures, failures
