"""GPU kernels for the tuner: cuBLASLt, our Mosaic GPU (Hopper) GEMM and Pallas Triton families.

``candidates`` builds the set, one builder per family (``FAMILIES``), from the configs
of ``configs``, the key predicates and supports rules of ``predicates`` and the cost
model of ``cost``.

    >>> from jax_autotune.kernels.gpu import gpu_candidate_set
    >>> candidate_set = gpu_candidate_set(device_info)   # XLA's dot first, then kernels
"""

from jax_autotune.kernels.gpu.candidates import gpu_candidate_set
from jax_autotune.kernels.gpu.mosaic import MosaicGemmConfig, mosaic_matmul
from jax_autotune.kernels.gpu.triton import GemmConfig, VectorConfig, gemm, vector_matmul

__all__ = ["gpu_candidate_set", "GemmConfig", "VectorConfig", "MosaicGemmConfig", "gemm",
           "vector_matmul", "mosaic_matmul"]
