"""cuBLAS's grouped GEMM (``cublasGemmGroupedBatchedEx``, cuBLAS 12.5 and newer) through an
XLA FFI custom call: the grouped matmuls of ``lax.ragged_dot`` as one cuBLAS call.

One cuBLAS problem per non-empty group, on XLA's stream (``ffi/cublas_grouped.cc``). cuBLAS
takes each problem's m, n and k on the host while ``lax.ragged_dot``'s group sizes live on
the device, so every call copies them back and waits for the stream: a host
synchronization that neither XLA's ragged_dot nor our Mosaic kernels make. Device time
does not see it, so the tuner adds the device's measured round trip to each call's time
(``HOST_SYNCS``; ``tuning.timing``).

cuBLAS and the CUDA driver are loaded at run time, as cuBLASLt is (``cuda_libraries``):
the copies already mapped into this process, else an installed ``nvidia-*`` wheel's.

    >>> if cublas_grouped.available():
    ...     y = cublas_grouped.grouped_matmul(x, w, sizes)                      # (m, n)
    ...     dw = cublas_grouped.grouped_matmul(x, dy, sizes, ragged="k")        # (groups, k, n)

Operands and result: bfloat16, float16 or float32, one dtype (cuBLAS's grouped GEMM takes
no mixed output). f32 runs on the TF32 tensor cores unless ``tf32=False``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_autotune.kernels.gpu import cuda_libraries

TARGET = "jax_autotune_cublas_grouped"
IN_DTYPES = frozenset({"bfloat16", "float16", "float32"})
HOST_SYNCS = 1  # host round trips per call: the group sizes copied back

_path = ""  # the cuBLAS loaded
_origin = ""  # where it was found


def available() -> bool:
    """True when cuBLAS (12.5 or newer) and the CUDA driver are loaded and the FFI target
    registered (tried once per process; ``error()`` says why not). Call it only where a
    CUDA device exists."""
    return _loaded.available()


def error() -> str:
    """'' when the grouped GEMM is usable, else why not."""
    return _loaded.error()


def _load() -> str:
    try:
        import jax_autotune._native as _native
    except ImportError as err:
        return f"the native extension is not built ({err}); see BUILD.md"
    drivers = [path for path, _ in cuda_libraries.sources("libcuda.so", wheels=False)]
    if not drivers:
        return "the CUDA driver (libcuda) is not mapped into this process"
    global _path, _origin
    reasons = []
    for path, origin in cuda_libraries.sources("libcublas.so"):
        reason = _native.load_cublas_grouped(path, drivers[0])
        if reason == "":
            _path, _origin = _native.cublas_grouped_library(), origin
            return cuda_libraries.register_targets()
        reasons.append(reason)
    return ("no cuBLAS with a grouped GEMM could be loaded: " + "; ".join(reasons[-3:]) if reasons else
            "no cuBLAS library is mapped into this process or installed in site-packages")


_loaded = cuda_libraries.LoadedOnce(_load)


def describe() -> str:
    """Which cuBLAS this process runs the grouped GEMM with and where it was found, or why
    none; loads it where a CUDA device exists.

        >>> cublas_grouped.describe()
        '/venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcublas.so.13 (already mapped by XLA)'
    """
    return _loaded.describe(lambda: f"{_path} ({_origin})")


def supported_dtypes(in_dtype: str, out_dtype: str) -> bool:
    return in_dtype in IN_DTYPES and out_dtype == in_dtype


def grouped_matmul(lhs, rhs, group_sizes, *, ragged: str = "m", transpose_rhs: bool = False,
                   out_dtype=None, tf32: bool = True):
    """A grouped matmul by cuBLAS, f32 accumulation; ``out_dtype`` (default) is the operands'.

    ``ragged="m"``: ``lax.ragged_dot(lhs, rhs, group_sizes)``: lhs (m, k), rhs (groups, k, n)
    or, ``transpose_rhs``, (groups, n, k); out (m, n), rows past the last group zero.
    ``ragged="k"`` (the weight gradient): lhs (k, m) and rhs (k, n), the contraction split
    into the groups; out (groups, m, n), ``out[g] = lhs[rows of g].T @ rhs[rows of g]``.
    ``group_sizes``: (groups,) integers; a group's rows are lax's (the running sum, clipped).

        >>> grouped_matmul(x, w, sizes).shape                       # x (8192, 4096), w (8, 4096, 14336)
        (8192, 14336)
    """
    if ragged not in ("m", "k"):
        raise ValueError(f"ragged: expected 'm' or 'k', got {ragged!r}")
    if lhs.dtype != rhs.dtype:
        raise ValueError(f"grouped_matmul: lhs and rhs dtypes differ: {lhs.dtype} and {rhs.dtype}")
    in_dtype = np.dtype(lhs.dtype).name
    out_dtype = np.dtype(out_dtype or lhs.dtype).name
    if not supported_dtypes(in_dtype, out_dtype):
        raise ValueError(f"grouped_matmul: operands must be one of {sorted(IN_DTYPES)} and out_dtype "
                         f"theirs, got {in_dtype} and {out_dtype}")
    groups = group_sizes.shape[0] if group_sizes.ndim == 1 else -1
    if ragged == "m":
        if lhs.ndim != 2 or rhs.ndim != 3 or lhs.shape[1] != rhs.shape[2 if transpose_rhs else 1]:
            raise ValueError(f"grouped_matmul: ragged m takes lhs (m, k) and rhs (groups, k, n) or, "
                             f"transpose_rhs, (groups, n, k); got {lhs.shape} and {rhs.shape}")
        out_shape = (lhs.shape[0], rhs.shape[1 if transpose_rhs else 2])
        expected_groups = rhs.shape[0]
    else:
        if transpose_rhs or lhs.ndim != 2 or rhs.ndim != 2 or lhs.shape[0] != rhs.shape[0]:
            raise ValueError(f"grouped_matmul: ragged k takes lhs (k, m) and rhs (k, n), no transpose_rhs; "
                             f"got {lhs.shape} and {rhs.shape}, transpose_rhs={transpose_rhs}")
        out_shape = (groups, lhs.shape[1], rhs.shape[1])
        expected_groups = groups
    if groups != expected_groups or groups < 0 or not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise ValueError(f"grouped_matmul: group_sizes must be ({expected_groups},) integers, "
                         f"got {group_sizes.shape} {group_sizes.dtype}")
    if not available():
        raise RuntimeError(f"grouped_matmul: {error()}")
    out = jax.ShapeDtypeStruct(out_shape, np.dtype(out_dtype))
    workspace = jax.ShapeDtypeStruct((max(1, 3 * groups * 8),), np.uint8)  # the problems' pointers
    result, _ = jax.ffi.ffi_call(TARGET, (out, workspace), vmap_method="sequential")(
        lhs, rhs, group_sizes.astype(jnp.int32), ragged_k=np.int64(ragged == "k"),
        transpose_b=np.int64(transpose_rhs), tf32=np.int64(in_dtype == "float32" and tf32))
    return result


__all__ = ["TARGET", "HOST_SYNCS", "IN_DTYPES", "available", "describe", "error", "grouped_matmul",
           "supported_dtypes"]
