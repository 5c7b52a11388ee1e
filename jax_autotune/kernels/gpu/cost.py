"""The GPU cost model: a rough time per candidate, in seconds, that only orders a round.

Rough H200 figures (the SM count comes from the device): a GEMM is whole waves of its
tiles at a fraction of the tensor cores' peak, or the bytes it moves, whichever is
longer, plus its launches. The tuner also skips a Pallas candidate estimated to lose
against the bar cuBLASLt sets (``rules.cost_skip_ratio``), so a library GEMM must not be
estimated slower than it runs.

    >>> problem = MatmulProblem(1, 768, 768, 768, "bfloat16", "bfloat16", "bfloat16")
    >>> xla_cost(problem) < gemm_cost(GemmConfig(128, 128, 64), problem, sms=132)
    True
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jax_autotune.kernels.gpu import mosaic
from jax_autotune.kernels.gpu.packed import packing_bytes
from jax_autotune.kernels.gpu.padded import padded_problem
from jax_autotune.kernels.gpu.predicates import dtype_class
from jax_autotune.kernels.gpu.sizes import cdiv, round_up
from jax_autotune.kernels.gpu.triton import GemmConfig, VectorConfig, split_k_extent, tile_count
from jax_autotune.key import Precision
from jax_autotune.problem import MatmulProblem

_PEAK_FLOPS = {"half": 790e12, "tf32": 400e12, "fp32": 50e12}
_BANDWIDTH = 4.3e12
_LAUNCH_S = 3e-6
# the fraction of those peaks XLA's and cuBLAS's GEMMs reach on large problems, and the
# Triton kernels'
_LIBRARY_EFFICIENCY = 0.95
_KERNEL_EFFICIENCY = 0.7


def _peak(problem: MatmulProblem) -> float:
    if dtype_class(problem) == "half":
        return _PEAK_FLOPS["half"]
    return _PEAK_FLOPS["tf32" if problem.precision == Precision.DEFAULT else "fp32"]


def _memory_seconds(problem: MatmulProblem, extra_bytes: float = 0.0) -> float:
    item = np.dtype(problem.lhs_dtype).itemsize
    out_item = np.dtype(problem.out_dtype).itemsize
    b = problem.batch
    moved = b * ((problem.m + problem.n) * problem.k * item + problem.m * problem.n * out_item)
    return (moved + extra_bytes) / _BANDWIDTH


def gemm_cost(config: GemmConfig, problem: MatmulProblem, sms: int) -> float:
    """Seconds: whole waves of padded tiles at 70% of peak, or the bytes, plus a launch."""
    waves = cdiv(tile_count(problem, config), sms)
    k_extent = split_k_extent(problem.k, config) if config.split_k > 1 else problem.k
    tile_flops = 2 * config.block_m * config.block_n * k_extent
    compute = waves * sms * tile_flops / (_KERNEL_EFFICIENCY * _peak(problem))
    partials = 0.0
    if config.split_k > 1:  # f32 partials written, then read by the reduction
        partials = 2 * 4 * config.split_k * problem.batch * problem.m * problem.n
    launches = 2 if config.split_k > 1 else 1
    return max(compute, _memory_seconds(problem, partials)) + launches * _LAUNCH_S


def vector_cost(config: VectorConfig, problem: MatmulProblem) -> float:
    return _memory_seconds(problem) / 0.8 + _LAUNCH_S


def mosaic_gemm_cost(rank: int, problem: MatmulProblem, sms: int) -> float:
    """Our Mosaic GEMM with its ``rank``-th config: whole waves of CTA tiles at 85% of peak
    (split-K: each split's k range, the f32 partials moved twice), or the bytes."""
    config = mosaic.ranked_config(problem, rank, sms)
    if config is None:
        return float("inf")
    cta_m, cta_n = config.cta_tile
    split = config.split_k
    tiles = problem.batch * cdiv(problem.m, cta_m) * cdiv(problem.n, cta_n) * split
    k_extent = cdiv(cdiv(problem.k, config.tile_k), split) * config.tile_k
    compute = cdiv(tiles, sms) * sms * 2 * cta_m * cta_n * k_extent / (0.85 * _peak(problem))
    partials = 2 * 4 * split * problem.batch * problem.m * problem.n if split > 1 else 0.0
    return max(compute, _memory_seconds(problem, partials)) + (1 + (split > 1)) * _LAUNCH_S


def packed_cost(config: GemmConfig, k_major: bool, problem: MatmulProblem,
                sms: int) -> float:
    """The GEMM on k rounded up to block_k, plus the packing copies (one launch each)."""
    big = dataclasses.replace(problem, k=round_up(problem.k, config.block_k))
    moved = packing_bytes(problem, config.block_k, k_major)
    copies = (moved > 0) * 2
    return gemm_cost(config, big, sms) + moved / _BANDWIDTH + copies * _LAUNCH_S


def _library_seconds(problem: MatmulProblem) -> float:
    """XLA's or cuBLAS's GEMM, launches aside."""
    flops = 2 * problem.batch * problem.m * problem.n * problem.k
    return max(flops / (_LIBRARY_EFFICIENCY * _peak(problem)), _memory_seconds(problem))


def xla_cost(problem: MatmulProblem, launches: int = 1) -> float:
    return _library_seconds(problem) + launches * _LAUNCH_S


def padded_xla_cost(align: int, problem: MatmulProblem, misaligned_only: bool = False) -> float:
    """A library GEMM on the padded problem, plus copying the operands and the output."""
    pad_copies = 2 * _memory_seconds(problem) + 2 * _LAUNCH_S
    return _library_seconds(padded_problem(problem, align, misaligned_only)) + pad_copies


__all__ = ["gemm_cost", "vector_cost", "mosaic_gemm_cost", "packed_cost", "xla_cost", "padded_xla_cost"]
