"""Run a kernel on operands zero-padded to aligned sizes, then slice the result.

Rows whose byte stride is not a multiple of 16 (k = 1025 in bf16: 2050 bytes) force
every GPU GEMM, XLA's included, onto narrow unvectorised loads (on an H200 XLA's dot is
about 5x slower at 1025^3 bf16 than at 1024^3: benchmarks/results/). Padding costs one
copy of each padded operand (and, when n is padded, of the output), and zeros in k add
nothing to the product, so the result is exact.

    >>> fn = padded(xla_dot, align=64)                 # m, n and k to multiples of 64
    >>> fn = padded(xla_dot, 8, barrier=True, misaligned_only=True)
    >>> out = fn(lhs, rhs, problem)        # same contract as any candidate kernel
"""

from __future__ import annotations

import dataclasses

import numpy as np
from jax import lax

from jax_autotune.kernels.gpu.sizes import misaligned, pad_to, round_up
from jax_autotune.problem import MatmulProblem


def padded_problem(problem: MatmulProblem, align: int, misaligned_only: bool = False) -> MatmulProblem:
    """``problem`` with m, n and k rounded up to multiples of ``align``; with
    ``misaligned_only``, only the dims that are some operand's or the output's row stride
    and not a multiple of 16 bytes (k of a row-major lhs, n of a row-major rhs and of the
    output, m of a transposed lhs, k of a transposed rhs)."""
    if not misaligned_only:
        return dataclasses.replace(problem, m=round_up(problem.m, align),
                                   n=round_up(problem.n, align), k=round_up(problem.k, align))
    lhs_item, rhs_item = (np.dtype(d).itemsize for d in (problem.lhs_dtype, problem.rhs_dtype))
    out_item = np.dtype(problem.out_dtype).itemsize

    # each operand's innermost stored axis is its row stride
    pad_m = problem.transpose_a and misaligned(problem.m, lhs_item)
    pad_k = ((not problem.transpose_a and misaligned(problem.k, lhs_item))
             or (problem.transpose_b and misaligned(problem.k, rhs_item)))
    pad_n = (not problem.transpose_b and misaligned(problem.n, rhs_item)) or misaligned(problem.n, out_item)
    return dataclasses.replace(problem, m=round_up(problem.m, align) if pad_m else problem.m,
                               n=round_up(problem.n, align) if pad_n else problem.n,
                               k=round_up(problem.k, align) if pad_k else problem.k)


def padded(fn, align: int, barrier: bool = False, misaligned_only: bool = False):
    """``fn(lhs, rhs, problem)`` run on operands zero-padded to multiples of ``align``.

    ``barrier`` puts the padded operands behind ``lax.optimization_barrier``: XLA then
    cannot fuse the pads into its GEMM (a fused pad turns cuBLAS's aligned GEMM back
    into a slower generated one), so the pads are plain copies and the dot is aligned.
    ``misaligned_only`` pads only the misaligned row strides (see ``padded_problem``): a
    problem whose n is aligned then needs no slice of the output.
    """
    def kernel(lhs, rhs, problem: MatmulProblem):
        big = padded_problem(problem, align, misaligned_only)
        if big == problem:
            return fn(lhs, rhs, problem)
        a, b = pad_to(lhs, big.lhs_shape), pad_to(rhs, big.rhs_shape)
        if barrier:
            a, b = lax.optimization_barrier((a, b))
        out = fn(a, b, big)
        return out if big.out_shape == problem.out_shape else out[:, :problem.m, :problem.n]
    suffix = ("_barrier" if barrier else "") + ("_rows" if misaligned_only else "")
    kernel.__name__ = f"padded_{getattr(fn, '__name__', 'kernel')}_a{align}{suffix}"
    return kernel


__all__ = ["padded", "padded_problem"]
