"""XLA's own dot as a candidate: the baseline of every round, what a key runs with when
nothing else is valid (a *fallback* decision), and what outputs are compared with.

    >>> from jax_autotune.kernels.xla import XLA_DOT, xla_dot
    >>> out = xla_dot(lhs, rhs, problem)   # (batch, m, n) in problem.out_dtype
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jax_autotune.tuning.candidates import Candidate
from jax_autotune.key import Precision
from jax_autotune.problem import MatmulProblem

XLA_DOT_NAME = "xla_dot"


def lax_precision(precision: Precision | str) -> lax.Precision | lax.DotAlgorithmPreset:
    """The lax precision of a key's: a level, or the algorithm preset it names.

    >>> lax_precision("F32_F32_F32")
    DotAlgorithmPreset.F32_F32_F32
    """
    precision = Precision(precision)
    if precision.algorithm is not None:
        return lax.DotAlgorithmPreset[precision.algorithm]
    return lax.Precision[precision.value]


def dimension_numbers(problem: MatmulProblem):
    """lax dimension numbers for the canonical 3-D operands of ``problem``."""
    lhs_contract = 1 if problem.transpose_a else 2
    rhs_contract = 2 if problem.transpose_b else 1
    return (((lhs_contract,), (rhs_contract,)), ((0,), (0,)))


def xla_dot(lhs, rhs, problem: MatmulProblem, precision: Precision | str | None = None, *,
            out_sharding=None):
    """``lax.dot_general`` on canonical operands; output (batch, m, n) in out_dtype
    (``out_sharding`` as lax takes it, under Explicit mesh axes).

    A transposed lhs contracts over its dim 1, so the result's m axis comes out last
    for it; lax puts free lhs dims before free rhs dims, which is (batch, m, n) either way.
    """
    out = lax.dot_general(
        lhs, rhs, dimension_numbers(problem),
        precision=lax_precision(precision or problem.precision),
        preferred_element_type=jnp.dtype(problem.out_dtype), out_sharding=out_sharding,
    )
    return out.astype(problem.out_dtype)


XLA_DOT = Candidate(XLA_DOT_NAME, xla_dot, params={}, xla_autotuned=True)
