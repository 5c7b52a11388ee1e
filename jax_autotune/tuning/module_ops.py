"""The ops of a lowered StableHLO module, nested regions (case, while, called functions)
included: what a candidate emits, read from the module itself rather than its text (a
Pallas kernel's serialized IR is an attribute whose text names ops it does not emit).

    >>> from jax_autotune.tuning.module_ops import ops
    >>> {op.name for op in ops(jax.jit(f).lower(x, y).compiler_ir("stablehlo"))}
    {'func.func', 'stablehlo.dot_general', 'func.return', 'builtin.module'}
"""

from __future__ import annotations

from typing import Iterator

from jax.extend.mlir import ir


def ops(module: ir.Module) -> Iterator[ir.Operation]:
    """Every operation of ``module``, the module itself first, depth first."""
    pending = [module.operation]
    while pending:
        op = pending.pop().operation
        yield op
        inner = [nested for region in op.regions for block in region for nested in block]
        pending.extend(reversed(inner))


__all__ = ["ops"]
