"""What the GPU candidate set asks of a key: its classes, and which kernel a device runs for it.

The key predicates work on the key's bucketed sizes ("narrow" is min(m, n), "half" is
bf16/f16, "tf32" is f32 at Precision.DEFAULT) and decide the groups and tiers of
``kernels.gpu.candidates``; the ``supports`` rules, ``rule(device, key) -> bool``, say
where a candidate can run at all (platform, capability, dtypes, shared memory,
alignment, the library loaded).

    >>> key = MatmulProblem(1, 16, 8192, 8192, "bfloat16", "bfloat16", "bfloat16").key()
    >>> dtype_class(key), narrow_side(key), is_split_k_shape(key)
    ('half', 'm', True)
    >>> h200 = DeviceInfo("gpu", "NVIDIA H200", 143_771 * 2**20, (9, 0))
    >>> gemm_supports(GemmConfig(64, 64, 32))(h200, key)
    True
"""

from __future__ import annotations

import numpy as np

from jax_autotune.kernels.gpu import cublaslt, epilogues, mosaic_gemm
from jax_autotune.kernels.gpu.sizes import ROW_ALIGN_BYTES
from jax_autotune.kernels.gpu.triton import GemmConfig, shared_memory_bytes
from jax_autotune.key import Kind, Layout, MatmulKey, Precision, Scale
from jax_autotune.problem import MatmulProblem
from jax_autotune.tuning.device import DeviceInfo

HALF = ("bfloat16", "float16")
FLOAT = HALF + ("float32",)


# ---------------------------------------------------------------- key predicates

def dtype_class(key: MatmulKey | MatmulProblem) -> str:
    return "half" if key.lhs_dtype in HALF else "f32"


def size_class(key: MatmulKey) -> str:
    # 2**22 = a 2048 x 2048 bucket: it holds 1025..2048, so small real sizes land here too
    if key.m * key.n <= 2 ** 22:
        return "medium"
    if key.k <= 256:
        return "small_k"
    return "large"


def tf32_key(key: MatmulKey) -> bool:
    """f32 inputs at Precision.DEFAULT: the tensor cores may run TF32 (as XLA's dot does)."""
    return key.lhs_dtype == "float32" and key.precision == Precision.DEFAULT


def is_vector(key: MatmulKey) -> bool:
    return key.m == 1 or key.n == 1


def narrow_side(key: MatmulKey) -> str | None:
    """"m" or "n" when that side is <= 64 (bucketed) and not 1, else None."""
    if is_vector(key) or min(key.m, key.n) > 64:
        return None
    return "m" if key.m <= key.n else "n"


def narrow_block(key: MatmulKey) -> int:
    return max(16, min(64, min(key.m, key.n)))


def is_misaligned(key: MatmulKey) -> bool:
    """A row stride that is not a multiple of 16 bytes: every GEMM loads narrowly."""
    return key.kind == Kind.GENERAL and 2 ** min(key.lhs_stride_factor, key.rhs_stride_factor) < ROW_ALIGN_BYTES


def is_split_k_shape(key: MatmulKey) -> bool:
    return key.m * key.n <= 2 ** 21 and key.k >= 2048


def _stored_as_is(layout: Layout) -> bool:
    """Contiguous, or only its last two axes swapped: what a TMA descriptor reads as stored."""
    return layout.name == "Contiguous" or (layout.name == "MildlyPermuted" and not layout.batch_swap)


def mosaic_gemm_serves(key: MatmulKey) -> bool:
    """What a key records of our Mosaic GEMM's rules (``kernels.gpu.mosaic``): one input
    dtype of bf16, f16 or f32 (TF32: Precision.DEFAULT, lhs (m, k) and rhs stored (n, k)),
    out the input dtype or f32, operands read as stored, every row stride a multiple of
    32 bytes. Row counts (m a multiple of 8, ...) are not in the key: the kernel checks them."""
    dtype = key.lhs_dtype
    if dtype not in FLOAT or key.rhs_dtype != dtype or key.out_dtype not in (dtype, "float32"):
        return False
    if Precision(key.precision).algorithm is not None or key.kind != Kind.GENERAL:
        return False
    if dtype == "float32" and (key.precision != Precision.DEFAULT or key.lhs_layout.transposed
                               or not key.rhs_layout.transposed):
        return False
    return (_stored_as_is(key.lhs_layout) and _stored_as_is(key.rhs_layout)
            and min(2 ** key.lhs_stride_factor, 2 ** key.rhs_stride_factor) >= 2 * ROW_ALIGN_BYTES)


def mosaic_shape(key: MatmulKey) -> bool:
    """The accelerated group's key test: large, both sides >= 1024, served by our Mosaic GEMM."""
    return key.scale == Scale.LARGE and min(key.m, key.n) >= 1024 and mosaic_gemm_serves(key)


# ---------------------------------------------------------------- supports

def _triton_device_ok(device: DeviceInfo, key: MatmulKey) -> bool:
    cc = device.compute_capability
    return (device.platform == "gpu" and cc is not None and cc >= (8, 0)
            and key.lhs_dtype in FLOAT and key.rhs_dtype == key.lhs_dtype
            and key.out_dtype in FLOAT
            and key.lhs_layout.name != "HighlyPermuted" and key.rhs_layout.name != "HighlyPermuted")


def gemm_supports(config: GemmConfig):
    def supports(device: DeviceInfo, key: MatmulKey) -> bool:
        itemsize = np.dtype(key.lhs_dtype).itemsize
        return (_triton_device_ok(device, key)
                and shared_memory_bytes(config, itemsize) <= device.shared_memory_limit)
    return supports


def cublaslt_supports(device: DeviceInfo, key: MatmulKey) -> bool:
    return (device.platform == "gpu" and device.compute_capability is not None
            and cublaslt.supported_dtypes(key.lhs_dtype, key.rhs_dtype, key.out_dtype)
            and Precision(key.precision).algorithm is None and cublaslt.available())


def cublaslt_epilogue_supports(device: DeviceInfo, key: MatmulKey) -> bool:
    """cuBLASLt's own epilogue computes the key's (``epilogues.cublaslt_form``)."""
    return (epilogues.cublaslt_form(key.epilogue, key.out_dtype) is not None
            and cublaslt_supports(device, key))


def applying_epilogue(supports, takes=epilogues.triton_takes):
    """``supports`` for a GEMM's fused variant: only where it ``takes`` the epilogue."""
    return lambda device, key: takes(key.epilogue) and supports(device, key)


def unless_applied(supports, takes=epilogues.triton_takes):
    """``supports`` for a plain GEMM with a fused variant, which stands in for it wherever
    that one ``takes`` the epilogue."""
    return lambda device, key: not takes(key.epilogue) and supports(device, key)


def vector_supports(device: DeviceInfo, key: MatmulKey) -> bool:
    return _triton_device_ok(device, key) and is_vector(key)


def mosaic_gemm_supports(device: DeviceInfo, key: MatmulKey) -> bool:
    """Our Mosaic GEMM on this key: sm_90 (wgmma, TMA), Mosaic GPU importable, the key served."""
    cc = device.compute_capability
    return (device.platform == "gpu" and cc is not None and cc >= (9, 0)
            and mosaic_gemm.AVAILABLE and mosaic_gemm_serves(key))


def float_supports(device: DeviceInfo, key: MatmulKey) -> bool:
    """An XLA-level variant (padded, transposed): any GPU, float operands."""
    return device.platform == "gpu" and key.lhs_dtype in FLOAT


__all__ = ["HALF", "FLOAT", "dtype_class", "size_class", "tf32_key", "is_vector", "narrow_side",
           "narrow_block", "is_misaligned", "is_split_k_shape", "mosaic_shape", "mosaic_gemm_serves", "gemm_supports",
           "cublaslt_supports", "cublaslt_epilogue_supports", "applying_epilogue", "unless_applied",
           "vector_supports", "mosaic_gemm_supports", "float_supports"]
