"""cuBLASLt as a candidate: ``cublasLtMatmul`` through an XLA FFI custom call.

XLA's dot on a GPU runs either cuBLAS or a GEMM of XLA's own emitter, whichever its
autotuner picked; ``torch.matmul`` runs cuBLAS's heuristic choice, and on some shapes
that is faster (benchmarks/results/gpu_suite_2026-12-01_all.md). This module calls
cuBLASLt directly: the ``algorithm``-th of the algorithms its heuristic offers for the
problem (the last one when it offers fewer), with a ``WORKSPACE_BYTES`` workspace that
XLA allocates as a second result of the call.

The library is not linked: ``available()`` loads the cuBLASLt that XLA's CUDA plugin
already mapped into the process, else the copy of an installed ``nvidia-*`` wheel in
site-packages (``cuda_libraries``), once, and registers the FFI targets for the CUDA platform;
``describe()`` says which (``jax-autotune explain`` prints it).

    >>> from jax_autotune.kernels.gpu import cublaslt
    >>> if cublaslt.available():
    ...     out = jax.jit(lambda a, b: cublaslt.matmul(a, b, problem, algorithm=0))(lhs, rhs)

Operands are the canonical ones of a ``MatmulProblem`` (transposed operands are read in
place); lhs and rhs are one of bfloat16, float16, float32 and the result is theirs or
float32 (f32 operands: f32). f32 at ``Precision.DEFAULT`` runs on the TF32 tensor cores,
as XLA's dot does; HIGH and HIGHEST run full f32.
"""

from __future__ import annotations

import jax
import numpy as np

from jax_autotune.key import Precision
from jax_autotune.kernels.gpu import cuda_libraries
from jax_autotune.problem import MatmulProblem

TARGET = "jax_autotune_cublaslt"
EPILOGUE_TARGET = "jax_autotune_cublaslt_epilogue"
ACTIVATIONS = ("none", "relu", "gelu")  # cuBLASLt's GELU is its tanh form (checked on an H200)
# cuBLAS's guidance for Hopper is a 32 MiB workspace; XLA reuses the buffer between calls
WORKSPACE_BYTES = 32 * 2 ** 20
IN_DTYPES = frozenset({"bfloat16", "float16", "float32"})

_path = ""  # the library loaded
_origin = ""  # where it was found

MAPPED, WHEEL = cuda_libraries.MAPPED, cuda_libraries.WHEEL
site_packages = cuda_libraries.site_packages


def library_sources() -> list[tuple[str, str]]:
    """(path, origin) of each cuBLASLt to try, best first: the one already mapped into this
    process (XLA's), then those of the ``nvidia-*`` wheels in site-packages
    (``cuda_libraries.sources``)."""
    return cuda_libraries.sources("libcublasLt.so")


def library_paths() -> list[str]:
    """The paths of ``library_sources()``, best first."""
    return [path for path, _ in library_sources()]


def available() -> bool:
    """True when cuBLASLt is loaded and the FFI target registered for CUDA (tried once
    per process; ``error()`` says why not). Call it only where a CUDA device exists."""
    return _loaded.available()


def error() -> str:
    """'' when cuBLASLt is usable, else why not."""
    return _loaded.error()


def _load() -> str:
    try:
        import jax_autotune._native as _native
    except ImportError as err:
        return f"the native extension is not built ({err}); see BUILD.md"
    global _path, _origin
    reasons = []
    for path, origin in library_sources():
        reason = _native.load_cublaslt(path)
        if reason == "":
            _path, _origin = _native.cublaslt_library(), origin
            break
        reasons.append(reason)
    else:
        return ("no cuBLASLt library could be loaded: " + "; ".join(reasons[-3:]) if reasons else
                "no cuBLASLt library is mapped into this process or installed in site-packages")
    return cuda_libraries.register_targets()


_loaded = cuda_libraries.LoadedOnce(_load)


def library() -> str:
    """The path of the loaded cuBLASLt ('' when none is, or before ``available()``)."""
    return _path


def describe() -> str:
    """Which cuBLASLt this process uses and where it was found, or why none; loads it
    where a CUDA device exists.

        >>> cublaslt.describe()
        '/venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcublasLt.so.13 (already mapped by XLA)'
    """
    return _loaded.describe(lambda: f"{_path} ({_origin})")


def supported_dtypes(lhs_dtype: str, rhs_dtype: str, out_dtype: str) -> bool:
    return (lhs_dtype in IN_DTYPES and rhs_dtype == lhs_dtype
            and out_dtype in ({lhs_dtype, "float32"} if lhs_dtype != "float32" else {"float32"}))


def matmul(lhs, rhs, problem: MatmulProblem, *, algorithm: int = 0, bias=None, residual=None,
           activation: str = "none"):
    """``problem``'s product by cuBLASLt's ``algorithm``-th heuristic algorithm; with
    ``bias`` (n,), ``residual`` (batch, m, n) (both in the output's dtype) or an
    ``activation``, cuBLASLt's epilogue computes ``activation(product + residual + bias)``
    in the same kernel (a residual takes no activation).

    >>> out = cublaslt.matmul(lhs, rhs, problem, algorithm=1)   # (batch, m, n)
    >>> out = cublaslt.matmul(lhs, rhs, problem, bias=b, activation="gelu")
    """
    if not supported_dtypes(problem.lhs_dtype, problem.rhs_dtype, problem.out_dtype):
        raise ValueError(f"cublaslt.matmul: lhs and rhs must be one of {sorted(IN_DTYPES)} and "
                         f"out theirs or float32, got {problem.lhs_dtype}, {problem.rhs_dtype}, "
                         f"{problem.out_dtype}")
    if Precision(problem.precision).algorithm is not None:
        raise ValueError(f"cublaslt.matmul: an algorithm preset ({problem.precision.value}) "
                         f"is XLA's to run")
    if not isinstance(algorithm, (int, np.integer)) or algorithm < 0:
        raise ValueError(f"algorithm: expected an int >= 0, got {algorithm!r}")
    if not available():
        raise RuntimeError(f"cublaslt.matmul: {error()}")
    import jax_autotune._native as _native  # loaded by available()
    if algorithm >= _native.cublaslt_max_algorithms:  # the handler refuses it too
        raise ValueError(f"algorithm: expected an int below {_native.cublaslt_max_algorithms}, "
                         f"got {algorithm!r}")
    if activation not in ACTIVATIONS or (residual is not None and activation != "none"):
        raise ValueError(f"activation: expected one of {ACTIVATIONS}, and none with a residual; "
                         f"got {activation!r}")
    out = jax.ShapeDtypeStruct(problem.out_shape, np.dtype(problem.out_dtype))
    workspace = jax.ShapeDtypeStruct((WORKSPACE_BYTES,), np.uint8)
    tf32 = problem.lhs_dtype == "float32" and problem.precision == Precision.DEFAULT
    attributes = dict(transpose_a=np.int64(problem.transpose_a), transpose_b=np.int64(problem.transpose_b),
                      tf32=np.int64(tf32), algorithm=np.int64(algorithm))
    if bias is None and residual is None and activation == "none":
        result, _ = jax.ffi.ffi_call(TARGET, (out, workspace), vmap_method="sequential")(
            lhs, rhs, **attributes)
        return result
    unused = jax.numpy.zeros((1,), out.dtype)
    result, _ = jax.ffi.ffi_call(EPILOGUE_TARGET, (out, workspace), vmap_method="sequential")(
        lhs, rhs, unused if bias is None else bias, unused if residual is None else residual,
        activation=np.int64(ACTIVATIONS.index(activation)), has_bias=np.int64(bias is not None),
        has_residual=np.int64(residual is not None), **attributes)
    return result


__all__ = ["TARGET", "EPILOGUE_TARGET", "ACTIVATIONS", "WORKSPACE_BYTES", "available", "describe",
           "error", "library", "library_paths", "library_sources", "matmul", "site_packages",
           "supported_dtypes"]
