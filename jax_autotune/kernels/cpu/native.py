"""The native CPU kernels (C++, XLA FFI custom calls) and their jax wrappers.

Importing this module registers every FFI target of ``jax_autotune._native`` with XLA
(once per process). The wrappers take the canonical operands of a ``MatmulProblem``
(lhs ``problem.lhs_shape``, rhs ``problem.rhs_shape``; transposed layouts are read in
place by the kernels) and return ``problem.out_shape`` in ``problem.out_dtype``:

    >>> import jax, numpy as np
    >>> from jax_autotune import native
    >>> from jax_autotune.key import MatmulProblem
    >>> p = MatmulProblem(batch=1, m=64, n=64, k=64, lhs_dtype="float32",
    ...                   rhs_dtype="float32", out_dtype="float32")
    >>> a = np.ones(p.lhs_shape, np.float32); b = np.ones(p.rhs_shape, np.float32)
    >>> jax.jit(lambda a, b: native.gemm(a, b, p, tile=0, threads=1))(a, b)[0, 0, 0]
    Array(64., dtype=float32)

Kernel families: ``small_matmul`` (m, n, k <= 32, batch loop inside), ``gemv`` (n == 1
or m == 1), ``gemm`` (packed, cache-blocked, register tiles per ISA) and, when the
optional ``scipy-openblas32`` package is importable, ``blas_gemm``. ``isa`` picks
the instruction set ("portable", "avx2", "avx512"; default: ``isa()``), ``threads`` is 1
or up to ``max_threads()`` (0 means all). ``JAX_AUTOTUNE_NATIVE_ISA`` lowers the ISA of
the whole process; it is read once, when the module is first used.
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import Any

import jax
import numpy as np

import jax_autotune._native as _native
from jax_autotune.problem import MatmulProblem

ISA_CODES = {"portable": 0, "avx2": 1, "avx512": 2}
SUPPORTED_DTYPES = frozenset({"float32", "float64"})
SMALL_MAX_DIM: int = _native.small_max_dim
MAX_THREADS_ATTRIBUTE: int = _native.max_threads_attribute  # the handlers refuse more

NOOP_TARGET = "jax_autotune_noop"
SMALL_TARGET = "jax_autotune_small"
GEMV_TARGET = "jax_autotune_gemv"
GEMM_TARGET = "jax_autotune_gemm"
BLAS_TARGET = "jax_autotune_blas"

_registration_lock = threading.Lock()
_blas_lock = threading.Lock()
_blas_error: str | None = None  # None: not tried yet


def register_targets() -> tuple[str, ...]:
    """Registers every handler of ``_native.registrations()`` for the CPU platform, once.

    Safe to call again (and from several threads): XLA sees each target exactly once.
    Returns the target names.
    """
    with _registration_lock:
        # the flag lives on the extension module, so a reload of this module cannot re-register
        if not getattr(_native, "_jax_autotune_registered", False):
            for name, capsule in _native.registrations().items():
                jax.ffi.register_ffi_target(name, capsule, platform="cpu")
            _native._jax_autotune_registered = True
    return tuple(_native.registrations())


def _warn_if_jaxlib_differs() -> None:
    import jaxlib

    built = _native.built_against_jaxlib
    if jaxlib.__version__ != built:
        warnings.warn(
            f"jax_autotune._native was built against jaxlib {built} but jaxlib "
            f"{jaxlib.__version__} is running; the XLA FFI API may differ. Rebuild it: "
            f"pip install --no-build-isolation -e . (see BUILD.md)", RuntimeWarning, stacklevel=3)


# ---------------------------------------------------------------- machine facts

def isa() -> str:
    """The ISA the kernels use here: 'portable', 'avx2' or 'avx512'.

    It is the best the CPU supports, lowered by ``JAX_AUTOTUNE_NATIVE_ISA``; asking for
    more than the CPU has gives the best available, and ``isa_note()`` says why.
    """
    return _native.isa()


def isa_note() -> str:
    """'' when ``JAX_AUTOTUNE_NATIVE_ISA`` was followed (or unset), else why it was not."""
    return _native.isa_note()


def best_isa() -> str:
    """The best ISA of this CPU and build, ignoring ``JAX_AUTOTUNE_NATIVE_ISA``."""
    return _native.best_isa()


def cpu_features() -> frozenset[str]:
    """Features the kernels may use here, e.g. ``frozenset({"avx2", "fma"})``.

    It follows the effective ISA, so a forced ``portable`` gives an empty set; the tuner
    puts it in ``DeviceInfo.features``.
    """
    return frozenset(_native.cpu_features())


def max_threads() -> int:
    """The CPUs this process may run on: the most threads a kernel uses."""
    return int(_native.max_threads())


def built_isas() -> tuple[str, ...]:
    """ISAs this build has kernels for: ('portable', 'avx2', 'avx512') on x86-64."""
    return tuple(_native.gemm_tiles())


def gemm_tiles(isa_name: str) -> tuple[tuple[int, int, int], ...]:
    """Register tiles ``(mr, nr_f32, nr_f64)`` of ``isa_name``, by tile index.

    >>> gemm_tiles("avx2")
    ((6, 16, 8), (4, 24, 12))
    """
    tiles = _native.gemm_tiles()
    if isa_name not in tiles:
        raise ValueError(f"isa_name: expected one of {sorted(tiles)}, got {isa_name!r}")
    return tuple(tuple(t) for t in tiles[isa_name])


# ---------------------------------------------------------------- wrappers

def _isa_code(isa_name: str | None) -> int:
    name = isa() if isa_name is None else isa_name
    if name not in ISA_CODES:
        raise ValueError(f"isa: expected one of {sorted(ISA_CODES)} or None, got {isa_name!r}")
    return ISA_CODES[name]


def _check_operands(lhs: Any, rhs: Any, problem: MatmulProblem, caller: str) -> None:
    dtypes = {problem.lhs_dtype, problem.rhs_dtype, problem.out_dtype}
    if len(dtypes) != 1 or not dtypes <= SUPPORTED_DTYPES:
        raise ValueError(f"{caller}: problem dtypes must all be float32 or all float64, got "
                         f"lhs {problem.lhs_dtype}, rhs {problem.rhs_dtype}, "
                         f"out {problem.out_dtype}")
    for name, x, shape, dtype in (("lhs", lhs, problem.lhs_shape, problem.lhs_dtype),
                                  ("rhs", rhs, problem.rhs_shape, problem.rhs_dtype)):
        if tuple(x.shape) != shape or np.dtype(x.dtype) != np.dtype(dtype):
            raise ValueError(f"{caller}: {name} must be {dtype}{list(shape)} for {problem}, "
                             f"got {np.dtype(x.dtype).name}{list(x.shape)}")


def _matmul_call(target: str, lhs: Any, rhs: Any, problem: MatmulProblem, threads: int,
                 **extra: int):
    """``target`` on canonical operands; every attribute is passed as an int64."""
    if not isinstance(threads, (int, np.integer)) or not 0 <= threads <= MAX_THREADS_ATTRIBUTE:
        raise ValueError(f"threads: expected 0 (all) or a positive int up to "
                         f"{MAX_THREADS_ATTRIBUTE}, got {threads!r}")
    out = jax.ShapeDtypeStruct(problem.out_shape, np.dtype(problem.out_dtype))
    call = jax.ffi.ffi_call(target, out, vmap_method="sequential")
    attributes = dict(transpose_a=problem.transpose_a, transpose_b=problem.transpose_b,
                      threads=threads, **extra)
    return call(lhs, rhs, **{name: np.int64(value) for name, value in attributes.items()})


def small_matmul(lhs, rhs, problem: MatmulProblem, *, isa: str | None = None, threads: int = 1):
    """Batched small matmul (m, n, k <= ``SMALL_MAX_DIM``), the batch loop in the kernel.

    >>> out = native.small_matmul(lhs, rhs, problem)   # (batch, m, n)
    """
    _check_operands(lhs, rhs, problem, "small_matmul")
    if max(problem.m, problem.n, problem.k) > SMALL_MAX_DIM:
        raise ValueError(f"small_matmul: m, n and k must be <= {SMALL_MAX_DIM}, got "
                         f"m={problem.m} n={problem.n} k={problem.k}")
    return _matmul_call(SMALL_TARGET, lhs, rhs, problem, threads, isa=_isa_code(isa))


def gemv(lhs, rhs, problem: MatmulProblem, *, isa: str | None = None, threads: int = 1):
    """Matrix-vector (n == 1) or vector-matrix (m == 1) product, any transpose flags.

    >>> out = native.gemv(lhs, rhs, problem)   # (batch, m, 1) or (batch, 1, n)
    """
    _check_operands(lhs, rhs, problem, "gemv")
    if problem.n != 1 and problem.m != 1:
        raise ValueError(f"gemv: problem needs n == 1 or m == 1, got m={problem.m} "
                         f"n={problem.n}")
    return _matmul_call(GEMV_TARGET, lhs, rhs, problem, threads, isa=_isa_code(isa))


def gemm(lhs, rhs, problem: MatmulProblem, *, tile: int = 0, isa: str | None = None,
         threads: int = 1):
    """Packed, register-blocked GEMM with register tile ``gemm_tiles(isa)[tile]``.

    >>> out = native.gemm(lhs, rhs, problem, tile=1, isa="avx2", threads=0)
    """
    _check_operands(lhs, rhs, problem, "gemm")
    n_tiles = len(_native.gemm_tiles()["portable"])
    if not isinstance(tile, (int, np.integer)) or not 0 <= tile < n_tiles:
        raise ValueError(f"tile: expected an int in [0, {n_tiles}), got {tile!r}")
    return _matmul_call(GEMM_TARGET, lhs, rhs, problem, threads, isa=_isa_code(isa),
                        tile=int(tile))


def blas_available() -> bool:
    """True when the optional ``scipy-openblas32`` package is importable and loaded.

    Tried once per process (``blas_error()`` says why it failed); ``OPENBLAS_CORETYPE``
    and friends are left to the user.
    """
    global _blas_error
    with _blas_lock:
        if _blas_error is None:
            try:
                import scipy_openblas32
            except ImportError as err:
                _blas_error = f"scipy_openblas32 is not importable: {err}"
            else:
                path = os.path.join(scipy_openblas32.get_lib_dir(),
                                    scipy_openblas32.get_library(fullname=True))
                _blas_error = _native.load_blas(path, "scipy_")
        return _blas_error == ""


def blas_error() -> str:
    """'' when BLAS is loaded, else why not (after ``blas_available()``)."""
    blas_available()
    return _blas_error or ""


def blas_gemm(lhs, rhs, problem: MatmulProblem, *, threads: int = 1):
    """The product through ``cblas_?gemm`` of scipy-openblas32 (its own thread pool).

    >>> if native.blas_available(): out = native.blas_gemm(lhs, rhs, problem, threads=0)
    """
    _check_operands(lhs, rhs, problem, "blas_gemm")
    if not blas_available():
        raise RuntimeError(f"blas_gemm: no BLAS library: {blas_error()}")
    return _matmul_call(BLAS_TARGET, lhs, rhs, problem, threads)


def noop_call(x):
    """One FFI call that copies ``x``'s first element into a (1,) array: the call cost.

    >>> jax.jit(native.noop_call)(jnp.arange(3.0))
    Array([0.], dtype=float32)
    """
    if x.size < 1:
        raise ValueError(f"x: expected a non-empty array, got shape {tuple(x.shape)}")
    out = jax.ShapeDtypeStruct((1,), x.dtype)
    return jax.ffi.ffi_call(NOOP_TARGET, out, vmap_method="sequential")(x)


register_targets()
_warn_if_jaxlib_differs()


# ---------------------------------------------------------------- throughput probes

def fma_peak_sample(dtype: str, iterations: int, threads: int) -> tuple[float, float]:
    """(seconds, flops) of ``threads`` threads each running ``iterations`` FMA rounds of
    the effective ISA: one sample of the CPU compute peak probe."""
    seconds = _native.fma_seconds(dtype, int(iterations), int(threads))
    return seconds, float(threads) * iterations * _native.fma_flops_per_iteration(dtype)


def copy_seconds(nbytes: int, threads: int) -> float:
    """Seconds to copy ``nbytes`` between two host buffers with ``threads`` threads
    (moves 2 * nbytes): one sample of the CPU bandwidth probe."""
    return _native.copy_seconds(int(nbytes), int(threads))
