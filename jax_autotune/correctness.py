"""Correctness gating: every candidate's output is compared with a reference first.

The reference is float64 on the host for CPU problems up to ``HOST_REFERENCE_MAX_MACS``
multiply-adds, else (and on accelerators) XLA's dot at HIGHEST precision on the device,
accumulated in f32.
The error is norm-wise: ``||out - ref|| / ||ref||``; NaN or Inf never passes.

    >>> ref = reference(problem, lhs, rhs)
    >>> check(out, ref, problem)
    Check(ok=True, rel_error=3.1e-07, tolerance=2e-05)
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_autotune.key import MatmulProblem, Precision
from jax_autotune.timing import DEVICE_LOCK, as_numpy

HOST_REFERENCE_MAX_MACS = 2**31

# tolerance by input dtype at each precision (norm-wise relative error)
_INPUT_TOLERANCE = {
    "float64": {Precision.DEFAULT: 1e-10, Precision.HIGH: 1e-10, Precision.HIGHEST: 1e-10},
    # f32 DEFAULT and HIGH may use TF32 / bf16x3 on GPUs, as XLA does
    "float32": {Precision.DEFAULT: 5e-3, Precision.HIGH: 5e-3, Precision.HIGHEST: 3e-5},
    "float16": dict.fromkeys(Precision, 1e-2),
    "bfloat16": dict.fromkeys(Precision, 3e-2),
}
# rounding of the result alone
_OUTPUT_TOLERANCE = {"float64": 1e-12, "float32": 1e-6, "float16": 2e-3, "bfloat16": 1.6e-2}
_DEFAULT_FLOAT_TOLERANCE = 3e-2  # float8 and other narrow types


def tolerance(problem: MatmulProblem, platform: str = "gpu") -> float:
    """Allowed norm-wise relative error; 0 for integer results (exact).

    On the CPU, f32 at every precision is full fp32 (XLA:CPU has no TF32), so it gets
    the HIGHEST tolerance there.
    """
    dtypes = (problem.lhs_dtype, problem.rhs_dtype)
    if all(np.issubdtype(np.dtype(_np_name(d)), np.integer) for d in dtypes):
        return 0.0
    precision = Precision.HIGHEST if platform == "cpu" else problem.precision
    by_input = max(_INPUT_TOLERANCE.get(d, {}).get(precision, _DEFAULT_FLOAT_TOLERANCE)
                   for d in dtypes)
    by_output = _OUTPUT_TOLERANCE.get(problem.out_dtype, _DEFAULT_FLOAT_TOLERANCE)
    return max(by_input, by_output)


def _np_name(dtype: str) -> str:
    return "float32" if dtype in ("bfloat16",) or dtype.startswith("float8") else dtype


@dataclasses.dataclass(frozen=True)
class Check:
    ok: bool
    rel_error: float
    tolerance: float


def reference(problem: MatmulProblem, lhs, rhs, host_max_macs: int = HOST_REFERENCE_MAX_MACS):
    """The exact-as-possible result of the problem.

    A host float64 (int64 for integers) numpy array for problems up to ``host_max_macs``
    multiply-adds, else a float32 device array from XLA's HIGHEST dot. Accelerators pass
    ``host_max_macs=0``: the device reference is exact enough for every tolerance, much
    faster, and the comparison then stays on the device too.
    """
    macs = problem.batch * problem.m * problem.n * problem.k
    integer = all(np.issubdtype(np.dtype(_np_name(d)), np.integer)
                  for d in (problem.lhs_dtype, problem.rhs_dtype))
    if macs <= host_max_macs or integer:
        wide = np.int64 if integer else np.float64
        a = as_numpy(lhs).astype(wide)
        b = as_numpy(rhs).astype(wide)
        if problem.transpose_a:
            a = np.swapaxes(a, -1, -2)
        if problem.transpose_b:
            b = np.swapaxes(b, -1, -2)
        return np.matmul(a, b)
    from jax_autotune.xla_dot import xla_dot

    wide_problem = dataclasses.replace(problem, out_dtype="float32", precision=Precision.HIGHEST)
    lowered = jax.jit(lambda a, b: xla_dot(a.astype(jnp.float32), b.astype(jnp.float32),
                                           wide_problem)).lower(lhs, rhs)
    try:
        # the reference runs once: XLA's GEMM autotuning would cost more than it saves
        compiled = lowered.compile(compiler_options={"xla_gpu_autotune_level": 0})
    except Exception:  # noqa: BLE001 - option unknown to this backend: compile as usual
        compiled = lowered.compile()
    with DEVICE_LOCK.shared():
        return jax.block_until_ready(compiled(lhs, rhs))


def _device_errors(out, ref):
    diff = out.astype(jnp.float32) - ref
    return (jnp.linalg.norm(diff.ravel()), jnp.linalg.norm(ref.ravel()),
            jnp.all(jnp.isfinite(out.astype(jnp.float32))))


@functools.lru_cache(maxsize=64)
def _compiled_errors(out_shape: tuple, out_dtype: str, ref_shape: tuple, device):
    with jax.default_device(device):
        return jax.jit(_device_errors).lower(
            jax.ShapeDtypeStruct(out_shape, out_dtype),
            jax.ShapeDtypeStruct(ref_shape, jnp.float32)).compile()


def prepare_check(problem: MatmulProblem, ref) -> None:
    """Compile the device comparison of ``problem``'s outputs with ``ref`` ahead of the
    first ``check`` (the tuner does it while the baseline compiles); no-op for host refs."""
    if isinstance(ref, jax.Array):
        _compiled_errors(tuple(ref.shape), problem.out_dtype, tuple(ref.shape), _device_of(ref))


def _device_of(x: jax.Array):
    return next(iter(x.devices()))


def check(out, ref, problem: MatmulProblem, platform: str = "gpu") -> Check:
    """Compare a candidate's output with the reference under the problem's tolerance
    (on the device when the reference is a device array, else on the host)."""
    tol = tolerance(problem, platform)
    if tuple(out.shape) != tuple(ref.shape):
        return Check(False, float("inf"), tol)
    if isinstance(ref, jax.Array):
        errors = _compiled_errors(tuple(out.shape), str(out.dtype), tuple(ref.shape), _device_of(ref))
        with DEVICE_LOCK.shared():
            values = jax.device_get(errors(out, ref))
        diff, scale, finite = (float(x) if x.dtype != jnp.bool_ else bool(x) for x in values)
    else:
        got = as_numpy(out).astype(ref.dtype)
        finite = not np.issubdtype(got.dtype, np.floating) or bool(np.all(np.isfinite(got)))
        diff = float(np.linalg.norm((got - ref).ravel().astype(np.float64)))
        scale = float(np.linalg.norm(ref.ravel().astype(np.float64)))
    if not finite:
        return Check(False, float("nan"), tol)
    rel = diff / scale if scale > 0 else diff
    return Check(rel <= tol, rel, tol)
