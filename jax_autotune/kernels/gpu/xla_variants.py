"""XLA-level candidates: the same product written so XLA/cuBLAS pick other algorithms.

They compile in XLA's time (no Pallas lowering), so they are cheap members of a round.

* ``xla_transposed``: C^T = B^T A^T computed by XLA, then transposed back (cuBLAS then
  picks another kernel; it won at f32 128x8192x8192 on an H200, see
  benchmarks/results/gpu_kernels_2026-11-29-perf-pass.md).

    >>> out = xla_transposed(lhs, rhs, problem)     # (batch, m, n) in out_dtype
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jax_autotune.kernels.xla import lax_precision
from jax_autotune.problem import MatmulProblem


def xla_transposed(lhs, rhs, problem: MatmulProblem):
    """C = (B^T A^T)^T: XLA's dot of the transposed problem, transposed back."""
    a_contract = 1 if problem.transpose_a else 2
    b_contract = 2 if problem.transpose_b else 1
    out_t = lax.dot_general(rhs, lhs, (((b_contract,), (a_contract,)), ((0,), (0,))),
                            precision=lax_precision(problem.precision),
                            preferred_element_type=jnp.dtype(problem.out_dtype))  # (b, n, m)
    return jnp.swapaxes(out_t, 1, 2).astype(problem.out_dtype)


__all__ = ["xla_transposed"]
