"""An operand the program copies before the matmul (its prologue), as the tuning times it.

A dot such as attention's ``einsum("bqhd,bkhd->bhqk", q, k)`` reads operands whose batch
dims (b, h) are not outermost: no stored layout reads them as they are, so the program
copies each into its stored (batch, rows, cols) shape first (``MatmulProblem.lhs_copied``,
``rhs_copied``). XLA's dot fuses that copy into its own reads where it can; a kernel's
custom call reads the copy, a kernel more. The tuning times every candidate with the copy
in front, so a kernel wins only where it wins in the program.

The operand is timed as the program typically holds it: a stored (batch, rows, cols) held
as (rows, batch, cols), the batch inside as ``bqhd`` has it, or, with a batch of one,
as (1, cols, rows). ``held(problem, inputs)`` gives the inputs in that form (transposed
on the host: no kernel runs beside another's timing); ``timed(fn, problem)`` is ``fn``
after the copy back, what a timer compiles.

    >>> jax.jit(timed(candidate.bound(problem), problem))(*held(problem, inputs))
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jax_autotune.problem import MatmulProblem


def _order(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The held order of a stored (batch, rows, cols) operand; its own inverse."""
    return (1, 0, 2) if shape[0] > 1 else (0, 2, 1)


def _copied(problem: MatmulProblem) -> tuple[bool, bool]:
    return problem.lhs_copied, problem.rhs_copied


def held(problem: MatmulProblem, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """``inputs`` (lhs, rhs, then the epilogue's, as stored) with each copied operand as
    the program holds it; ``inputs`` itself when nothing is copied."""
    if not any(_copied(problem)):
        return inputs
    out = list(inputs)
    for i, copied in enumerate(_copied(problem)):
        if copied:
            x = inputs[i]
            moved = np.ascontiguousarray(np.transpose(np.asarray(jax.device_get(x)), _order(x.shape)))
            out[i] = jax.block_until_ready(jax.device_put(moved, x.sharding))
    return tuple(out)


def held_specs(problem: MatmulProblem) -> tuple[tuple[tuple[int, ...], str], ...]:
    """``problem.input_specs()`` with each copied operand's shape as ``held`` gives it."""
    specs = list(problem.input_specs())
    for i, copied in enumerate(_copied(problem)):
        if copied:
            shape, dtype = specs[i]
            specs[i] = (tuple(shape[d] for d in _order(shape)), dtype)
    return tuple(specs)


def timed(fn: Callable[..., Any], problem: MatmulProblem) -> Callable[..., Any]:
    """``fn`` (a candidate bound to ``problem``) reading ``held`` inputs: each copied
    operand put back in its stored shape first, as the program does before the matmul."""
    if not any(_copied(problem)):
        return fn
    # per input, the order that puts it back in its stored shape (None: read as held)
    orders = [_order(problem.input_specs()[i][0]) if copied else None for i, copied in enumerate(_copied(problem))]

    def with_copies(*inputs):
        return fn(*(x if i >= 2 or orders[i] is None else jnp.transpose(x, orders[i])
                    for i, x in enumerate(inputs)))

    return with_copies


__all__ = ["held", "held_specs", "timed"]
