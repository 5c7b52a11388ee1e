"""Triton GEMM on operands repacked once per call into the layout the tensor cores want.

Two problems this solves, both measured on an H200:

* f32 at ``Precision.DEFAULT`` (TF32): Hopper's wgmma reads 32-bit operands only
  K-major from shared memory, and Triton cannot transpose them there, so a row-major
  rhs (k, n) is transposed in registers and its loads are NOT pipelined (Triton's
  AccelerateMatmul warns "the pipelined load for this operand will be disabled"). The
  TF32 Pallas GEMMs ran 2-4x slower than XLA's dot for that reason. Packing the rhs to
  (n, k) (one XLA transpose, ``k * n * 4`` bytes each way) gives both operands K-major.
* Rows whose byte stride is not a multiple of 16 (k or n = 1025) force scalar loads.
  Padding k (and, for a row-major rhs, n) with zeros to a multiple of ``block_k`` (and
  of 16 bytes) makes every load a whole, aligned, unmasked block; the zeros add nothing.

The output is written straight into the unpadded (batch, m, n) result by the kernel's
store mask: no slice copy afterwards.

    >>> out = packed_gemm(lhs, rhs, problem, GemmConfig(128, 64, 32, num_warps=4,
    ...                   num_stages=4), k_major=True)
"""

from __future__ import annotations

import jax.numpy as jnp

from jax_autotune.kernels.gpu.sizes import ROW_ALIGN_BYTES, misaligned, pad_to, round_up
from jax_autotune.kernels.gpu.triton import GemmConfig, dot_precision, gemm_call
from jax_autotune.problem import MatmulProblem


def packed_operands(lhs, rhs, problem: MatmulProblem, block_k: int, k_major: bool):
    """(lhs, rhs, a_transposed, b_rhs_major) repacked for the kernel.

    k is padded to a multiple of ``block_k``; with ``k_major`` both operands come out
    K-major, (m, K) and (n, K); otherwise their stored orientation is kept and the free
    axis of a non-K-major operand is padded to 16 bytes so its rows stay aligned.
    """
    item = jnp.dtype(problem.lhs_dtype).itemsize
    row_align = max(ROW_ALIGN_BYTES // item, 1)
    big_k = round_up(problem.k, block_k)
    b, m, n = problem.batch, problem.m, problem.n

    if problem.transpose_a and k_major:
        lhs, a_t = jnp.swapaxes(lhs, 1, 2), False
    else:
        a_t = problem.transpose_a
    lhs = pad_to(lhs, (b, big_k, round_up(m, row_align)) if a_t else (b, m, big_k))

    if not problem.transpose_b and k_major:
        rhs, b_major = jnp.swapaxes(rhs, 1, 2), True
    else:
        b_major = problem.transpose_b
    rhs = pad_to(rhs, (b, n, big_k) if b_major else (b, big_k, round_up(n, row_align)))
    return lhs, rhs, a_t, b_major


def packed_gemm(lhs, rhs, problem: MatmulProblem, config: GemmConfig, *operands, k_major: bool,
                interpret: bool = False):
    """The tiled GEMM on repacked operands; (batch, m, n) in out_dtype, exact in k padding;
    with the epilogue's ``operands``, ``problem.epilogue`` applied in the kernel."""
    a, b, a_t, b_major = packed_operands(lhs, rhs, problem, config.block_k, k_major)
    return gemm_call(a, b, config, out_shape=problem.out_shape,
                     out_dtype=jnp.dtype(problem.out_dtype), a_transposed=a_t,
                     b_rhs_major=b_major, precision=dot_precision(problem),
                     interpret=interpret, name="packed_gemm",
                     epilogue=None if problem.epilogue.is_bare else problem.epilogue, operands=operands)


def packing_bytes(problem: MatmulProblem, block_k: int, k_major: bool) -> int:
    """Bytes the repacking copies move (read + write), 0 when the operands are used as-is."""
    item = jnp.dtype(problem.lhs_dtype).itemsize
    b, m, n, k = problem.batch, problem.m, problem.n, problem.k
    ragged_k = k % block_k != 0
    moved = 0
    if ragged_k or (problem.transpose_a and k_major) or (problem.transpose_a and misaligned(m, item)):
        moved += 2 * b * m * round_up(k, block_k) * item
    if ragged_k or (not problem.transpose_b and (k_major or misaligned(n, item))):
        moved += 2 * b * n * round_up(k, block_k) * item
    return moved


__all__ = ["packed_gemm", "packed_operands", "packing_bytes"]
