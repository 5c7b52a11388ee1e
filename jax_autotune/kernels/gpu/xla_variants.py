"""XLA-level candidates: the same product written so XLA/cuBLAS pick other algorithms.

They compile in XLA's time (no Pallas lowering), so they are cheap members of a round.

* ``xla_split_k(s)``: k cut into ``s`` slices, one batched dot with f32 results (the
  slices are extra batch entries, so a problem with few output tiles, m = 128 and
  n = 8192 say, fills every SM), then a sum over the slices. Exact up to the f32
  summation order; k not divisible by ``s`` is zero-padded.
* ``xla_transposed``: C^T = B^T A^T computed by XLA, then transposed back.

    >>> out = xla_split_k(4)(lhs, rhs, problem)     # (batch, m, n) in out_dtype
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax

from jax_autotune.problem import MatmulProblem
from jax_autotune.kernels.xla import lax_precision


def _split(x, axis: int, parts: int):
    """Pad ``axis`` to a multiple of ``parts`` and cut it into (parts, len/parts)."""
    size = x.shape[axis]
    padded = -(-size // parts) * parts
    if padded != size:
        pad = [(0, 0)] * x.ndim
        pad[axis] = (0, padded - size)
        x = jnp.pad(x, pad)
    return x.reshape(x.shape[:axis] + (parts, padded // parts) + x.shape[axis + 1:])


def xla_split_k(parts: int, transposed: bool = False):
    """``fn(lhs, rhs, problem)``: split-K as one batched XLA dot plus an f32 sum
    (of the transposed problem C^T = B^T A^T when ``transposed``)."""
    def kernel(lhs, rhs, problem: MatmulProblem):
        if transposed:
            flipped = dataclasses.replace(problem, m=problem.n, n=problem.m,
                                          transpose_a=not problem.transpose_b,
                                          transpose_b=not problem.transpose_a)
            return jnp.swapaxes(split(rhs, lhs, flipped), 1, 2)
        return split(lhs, rhs, problem)

    def split(lhs, rhs, problem: MatmulProblem):
        # lhs (b, m, k) -> (b, m, s, k/s), or (b, k, m) -> (b, s, k/s, m)
        a = _split(lhs, 1 if problem.transpose_a else 2, parts)
        a_batch, a_contract = ((1, 2) if problem.transpose_a else (2, 3))
        # rhs (b, k, n) -> (b, s, k/s, n), or (b, n, k) -> (b, n, s, k/s)
        b = _split(rhs, 2 if problem.transpose_b else 1, parts)
        b_batch, b_contract = ((2, 3) if problem.transpose_b else (1, 2))
        dims = (((a_contract,), (b_contract,)), ((0, a_batch), (0, b_batch)))
        partial = lax.dot_general(a, b, dims, precision=lax_precision(problem.precision),
                                  preferred_element_type=jnp.float32)  # (b, s, m, n)
        return partial.sum(axis=1).astype(problem.out_dtype)
    kernel.__name__ = f"xla_split_k{parts}{'_transposed' if transposed else ''}"
    return kernel


def xla_transposed(lhs, rhs, problem: MatmulProblem):
    """C = (B^T A^T)^T: XLA's dot of the transposed problem, transposed back."""
    a_contract = 1 if problem.transpose_a else 2
    b_contract = 2 if problem.transpose_b else 1
    out_t = lax.dot_general(rhs, lhs, (((b_contract,), (a_contract,)), ((0,), (0,))),
                            precision=lax_precision(problem.precision),
                            preferred_element_type=jnp.dtype(problem.out_dtype))  # (b, n, m)
    return jnp.swapaxes(out_t, 1, 2).astype(problem.out_dtype)


def algorithm_preset(problem: MatmulProblem):
    """The explicit dot algorithm equal to the problem's precision level on a GPU."""
    presets = lax.DotAlgorithmPreset
    if problem.lhs_dtype == "bfloat16":
        return presets.BF16_BF16_F32
    if problem.lhs_dtype == "float16":
        return presets.F16_F16_F32
    if problem.precision.value == "DEFAULT":
        return presets.TF32_TF32_F32
    return presets.F32_F32_F32


def xla_algorithm(lhs, rhs, problem: MatmulProblem):
    """XLA's dot with an explicit algorithm preset (same arithmetic as the precision
    level), which routes XLA's GPU backend through its own autotuned GEMM emitters."""
    a_contract = 1 if problem.transpose_a else 2
    b_contract = 2 if problem.transpose_b else 1
    out = lax.dot_general(lhs, rhs, (((a_contract,), (b_contract,)), ((0,), (0,))),
                          precision=algorithm_preset(problem),
                          preferred_element_type=jnp.float32)
    return out.astype(problem.out_dtype)


__all__ = ["xla_split_k", "xla_transposed", "xla_algorithm", "algorithm_preset"]
