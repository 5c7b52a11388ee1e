"""Internal: the grouped-matmul primitive (``lax.ragged_dot``), keyed at trace time, its kernel chosen at compile time.

``ragged_p`` takes a grouped problem's operands (``MatmulProblem`` with ``groups``: lax's
own shapes) and the group sizes, (groups,) int32, and carries the problem and its key,
so ``jax.make_jaxpr`` shows the key. Its lowering asks the platform's grouped tuner
(``registry.ragged_tuner_for``) and emits the winner (``kernels.ragged``); under
``jax.export``, for a platform with no device here, and under jit over several devices it
emits XLA's ``ragged_dot_general``. Autodiff is lax's: the jvp is bilinear and the
transposes are lax's, each a grouped matmul bound again with its own problem (the input
gradient a ragged m with the rhs transposed, the weight gradient a ragged k), so the
backward is tuned too; like lax, a ragged k has no transpose. vmap runs lax's own
``ragged_dot_general`` under its batching rule (XLA's, untuned).

    >>> out = bind_ragged(lhs, rhs, group_sizes, problem)   # problem.groups > 0

``ragged_fused_p`` is a ragged m in its context: the grouped product and
``problem.epilogue`` after it (a SwiGLU's ``silu(gate) * up``, a bias, a convert), one op
whose key holds the epilogue (``bind_ragged_fused``); its candidates are timed with the
epilogue after them. Under jvp and vmap it is the product (``ragged_p``) with the epilogue
as XLA ops.

    >>> out = bind_ragged_fused(x, w_gate, group_sizes, (up,), problem)   # mul(logistic..)
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

import jax_autotune.config as config
from jax_autotune.kernels.ragged import XLA_RAGGED_DOT, served, xla_ragged_one
from jax_autotune.primitive import _emit, _for_export, _impl, dispatch
from jax_autotune.problem import MatmulProblem
from jax_autotune.registry import has_devices, lowering_tuner
from jax_autotune.sharding import lowering_targets_many_devices

ragged_p = Primitive("autotuned_ragged_dot")
ragged_fused_p = Primitive("autotuned_ragged_dot_epilogue")
if dispatch is not None:  # the device assignment in the lowering's module (many devices: XLA's)
    dispatch.prim_requires_devices_during_lowering.update((ragged_p, ragged_fused_p))


def _operands(lhs, rhs, group_sizes, problem: MatmulProblem):
    if tuple(lhs.shape) != problem.lhs_shape or tuple(rhs.shape) != problem.rhs_shape:
        raise ValueError(f"operands {tuple(lhs.shape)} and {tuple(rhs.shape)} do not match the "
                         f"grouped problem's shapes {problem.lhs_shape} and {problem.rhs_shape}")
    lhs = lhs if lhs.dtype == problem.lhs_dtype else lax.convert_element_type(lhs, problem.lhs_dtype)
    rhs = rhs if rhs.dtype == problem.rhs_dtype else lax.convert_element_type(rhs, problem.rhs_dtype)
    group_sizes = group_sizes if group_sizes.dtype == jnp.int32 else group_sizes.astype(jnp.int32)
    return lhs, rhs, group_sizes


def bind_ragged(lhs, rhs, group_sizes, problem: MatmulProblem):
    """Bind the primitive; the key is computed here, at trace time, at the configured level."""
    return ragged_p.bind(*_operands(lhs, rhs, group_sizes, problem), problem=problem,
                         key=problem.key(config.compile_policy().level))


def bind_ragged_fused(lhs, rhs, group_sizes, operands, problem: MatmulProblem):
    """Bind the grouped product with ``problem.epilogue`` after it; ``operands`` have the
    shapes ``problem.epilogue_operand_shapes()``. The key, with the epilogue, is computed here."""
    expected = problem.epilogue_operand_shapes()
    if [tuple(x.shape) for x in operands] != list(expected):
        raise ValueError(f"epilogue operands {[tuple(x.shape) for x in operands]} do not match "
                         f"the shapes {list(expected)} of {problem.epilogue}")
    operands = [x if x.dtype == o.dtype else lax.convert_element_type(x, o.dtype)
                for x, o in zip(operands, problem.epilogue.operands)]
    return ragged_fused_p.bind(*_operands(lhs, rhs, group_sizes, problem), *operands, problem=problem,
                               key=problem.key(config.compile_policy().level))


def _abstract_eval(lhs, rhs, group_sizes, *operands, problem, key):
    return jax.core.ShapedArray(problem.result_shape, jnp.dtype(problem.result_dtype))


def _xla(lhs, rhs, group_sizes, *operands, problem):
    """XLA's ragged_dot, and the epilogue after it."""
    return problem.epilogue.apply(xla_ragged_one(lhs, rhs, group_sizes, problem.bare()), operands)


def _xla_lowering(ctx, *inputs, problem, key):
    return _emit(ctx, inputs, functools.partial(_xla, problem=problem))


def _lowering(platform: str):
    def rule(ctx, *inputs, problem, key):
        target = (ctx.platforms or ctx.module_context.platforms)[0]
        if not has_devices(target) or _for_export(ctx) or lowering_targets_many_devices(ctx):
            return _xla_lowering(ctx, *inputs, problem=problem, key=key)
        chosen = lowering_tuner(platform, grouped=True)  # None: mode off, a bad setting
        if chosen is None:
            return _xla_lowering(ctx, *inputs, problem=problem, key=key)
        tuner, policy = chosen
        candidate = tuner.candidate_set.by_name(tuner.select(problem, key, policy).winner)
        if candidate is XLA_RAGGED_DOT:
            return _xla_lowering(ctx, *inputs, problem=problem, key=key)
        try:
            return _emit(ctx, inputs, served(candidate, problem))
        except Exception as err:  # noqa: BLE001 - a kernel that cannot take this problem: XLA's
            warnings.warn(f"jax_autotune: kernel {candidate.name} failed to lower {problem.describe()} "
                          f"({type(err).__name__}: {err}); using XLA's ragged_dot.",
                          RuntimeWarning, stacklevel=2)
            return _xla_lowering(ctx, *inputs, problem=problem, key=key)
    return rule


# ---------------------------------------------------------------- autodiff (lax's rules)

def _jvp(primals, tangents, *, problem, key):
    lhs, rhs, group_sizes = primals
    d_lhs, d_rhs, _ = tangents  # no tangent of the group sizes
    bind = functools.partial(ragged_p.bind, problem=problem, key=key)
    out = bind(lhs, rhs, group_sizes)
    parts = ([] if type(d_lhs) is ad.Zero else [bind(d_lhs, rhs, group_sizes)]) + \
            ([] if type(d_rhs) is ad.Zero else [bind(lhs, d_rhs, group_sizes)])
    return out, functools.reduce(lax.add, parts) if parts else jnp.zeros_like(out)


def _transpose(ct, lhs, rhs, group_sizes, *, problem, key):
    """lax's transpose of a ragged m: the input gradient ct . rhs^T per group (a ragged m,
    rhs transposed), the weight gradient lhs^T . ct per group (a ragged k)."""
    if problem.ragged != "m":
        raise NotImplementedError("Unimplemented grad for ragged dot general in mode RAGGED_CONTRACTING.")
    if type(ct) is ad.Zero:
        return None, None, None
    p = problem
    lhs_bar = rhs_bar = None
    if ad.is_undefined_primal(lhs):  # (m, k) = ct (m, n) . rhs[g] over n
        new = dataclasses.replace(p, n=p.k, k=p.n, lhs_dtype=ct.dtype, transpose_b=not p.transpose_b)
        lhs_bar = bind_ragged(ct, rhs, group_sizes, new).astype(lhs.aval.dtype)
    if ad.is_undefined_primal(rhs):  # (g, k, n) = lhs^T (k, rows) . ct (rows, n), per group
        new = dataclasses.replace(p, ragged="k", m=p.k, k=p.m, rhs_dtype=ct.dtype, transpose_a=True,
                                  transpose_b=False)
        rhs_bar = bind_ragged(lhs, ct, group_sizes, new)
        if p.transpose_b:  # rhs stored (g, n, k)
            rhs_bar = jnp.swapaxes(rhs_bar, 1, 2)
        rhs_bar = rhs_bar.astype(rhs.aval.dtype)
    return lhs_bar, rhs_bar, None


# ---------------------------------------------------------------- vmap (lax's)

def _batching_rule(args, dims, *, problem, key):
    out = jax.vmap(functools.partial(_xla, problem=problem), in_axes=tuple(dims))(*args)
    return out, 0


# ---------------------------------------------------------------- the fused op's rules

def _decomposed(lhs, rhs, group_sizes, *operands, problem):
    """The tuned product (``ragged_p``) and the epilogue as XLA ops."""
    return problem.epilogue.apply(bind_ragged(lhs, rhs, group_sizes, problem.bare()), operands)


def _fused_jvp(primals, tangents, *, problem, key):
    """jvp of the product and the epilogue taken apart (no tangent of the group sizes)."""
    lhs, rhs, group_sizes, *operands = primals
    d_lhs, d_rhs, _, *d_operands = (ad.instantiate_zeros(t) for t in tangents)

    def differentiable(lhs, rhs, *operands):
        return _decomposed(lhs, rhs, group_sizes, *operands, problem=problem)
    return jax.jvp(differentiable, (lhs, rhs, *operands), (d_lhs, d_rhs, *d_operands))


def _fused_batching_rule(args, dims, *, problem, key):
    return jax.vmap(functools.partial(_xla, problem=problem), in_axes=tuple(dims))(*args), 0


for _p in (ragged_p, ragged_fused_p):
    _p.def_abstract_eval(_abstract_eval)
    _p.def_impl(_impl(_p))
    mlir.register_lowering(_p, _xla_lowering)  # any other platform: XLA's ragged_dot
    mlir.register_lowering(_p, _lowering("cpu"), platform="cpu")
    for _gpu in ("cuda", "rocm"):
        mlir.register_lowering(_p, _lowering("gpu"), platform=_gpu)
ad.primitive_jvps[ragged_p] = _jvp
ad.primitive_transposes[ragged_p] = _transpose
batching.primitive_batchers[ragged_p] = _batching_rule
ad.primitive_jvps[ragged_fused_p] = _fused_jvp
batching.primitive_batchers[ragged_fused_p] = _fused_batching_rule

__all__ = ["ragged_p", "ragged_fused_p", "bind_ragged", "bind_ragged_fused"]
