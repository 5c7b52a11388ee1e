"""Run a kernel on operands zero-padded to aligned sizes, then slice the result.

Rows whose byte stride is not a multiple of 16 (k = 1025 in bf16: 2050 bytes) force
every GPU GEMM, XLA's included, onto narrow unvectorised loads (on an H200 XLA's dot is
about 5x slower at 1025^3 bf16 than at 1024^3: benchmarks/results/). Padding m, n and k up to a multiple
of ``align`` costs one copy of each operand and of the output, and zeros in k add
nothing to the product, so the result is exact.

    >>> fn = padded(xla_dot, align=64)
    >>> out = fn(lhs, rhs, problem)        # same contract as any candidate kernel
"""

from __future__ import annotations

import dataclasses

from jax import lax

from jax_autotune.kernels.gpu.sizes import pad_to, round_up
from jax_autotune.problem import MatmulProblem


def padded_problem(problem: MatmulProblem, align: int) -> MatmulProblem:
    """``problem`` with m, n and k rounded up to multiples of ``align``."""
    return dataclasses.replace(problem, m=round_up(problem.m, align),
                               n=round_up(problem.n, align), k=round_up(problem.k, align))


def padded(fn, align: int, barrier: bool = False):
    """``fn(lhs, rhs, problem)`` run on operands zero-padded to multiples of ``align``.

    ``barrier`` puts the padded operands behind ``lax.optimization_barrier``: XLA then
    cannot fuse the pads into its GEMM (a fused pad turns cuBLAS's aligned GEMM back
    into a slower generated one), so the pads are plain copies and the dot is aligned.
    """
    def kernel(lhs, rhs, problem: MatmulProblem):
        big = padded_problem(problem, align)
        if big == problem:
            return fn(lhs, rhs, problem)
        a, b = pad_to(lhs, big.lhs_shape), pad_to(rhs, big.rhs_shape)
        if barrier:
            a, b = lax.optimization_barrier((a, b))
        out = fn(a, b, big)
        return out[:, :problem.m, :problem.n]
    suffix = "_barrier" if barrier else ""
    kernel.__name__ = f"padded_{getattr(fn, '__name__', 'kernel')}_a{align}{suffix}"
    return kernel


__all__ = ["padded", "padded_problem"]
