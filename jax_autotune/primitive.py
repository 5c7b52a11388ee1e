"""Internal: the matmul primitives; the key is computed at trace time, the kernel chosen at compile time.

``matmul_p`` takes canonical operands (see ``MatmulProblem``) and carries the problem, its
``MatmulKey`` and lax's ``out_sharding`` as parameters, so ``jax.make_jaxpr`` shows the key
and ``warmup`` can collect it. Its lowering rule asks the platform's tuner for the key's
decision (tuning lazily on a miss) and emits the winner's HLO with ``mlir.lower_fun``;
when the jit spans several devices it emits a per-shard op instead (``sharding``), whose
kernel is chosen for the per-shard key when XLA partitions the program. Under
``jax.export`` it emits the fastest candidate jax.export takes (``Tuner.emitted``),
and for a platform with no device here (a multi-platform export) XLA's dot. vmap re-binds
with a larger batch (a new key); jvp/grad are bilinear, so the backward matmuls are bound
again with their own problems and transposed layouts, and tuned too.

    >>> out = bind_matmul(lhs, rhs, problem)          # lhs problem.lhs_shape, rhs problem.rhs_shape
    >>> jax.make_jaxpr(lambda a, b: bind_matmul(a, b, problem))(lhs, rhs)
    { lambda ; a:f32[1,8,4] b:f32[1,4,2]. let c = autotuned_matmul[key=m=8 n=2 ...] a b in (c,) }

``fused_p`` is the matmul in its context: the product and ``problem.epilogue`` after it,
as one op whose operands are lhs, rhs and the epilogue's operands (``bind_fused``). Its
key holds the epilogue, so its kernel is chosen as the program the model runs (a fused
candidate, or a kernel with the epilogue as XLA ops after it). Under jvp, vmap and on
several devices it is the product (``matmul_p``, tuned as usual) with the epilogue as XLA
ops after it, which autodiff and batching take as they are.

    >>> out = bind_fused(lhs, rhs, (bias,), problem)   # problem.epilogue: add(y,row)
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
from jax_autotune.kernels.xla import XLA_DOT, dimension_numbers, lax_precision, xla_dot
from jax_autotune.problem import MatmulProblem
from jax_autotune.sharding import (ShardKernels, explicit_sharding, lowering_targets_many_devices,
                                   partitioned_matmul)
from jax_autotune.registry import has_devices, lowering_tuner
from jax_autotune.tuning import lowering_warnings

try:  # jax internals, unchanged from 0.10.2 to 0.11.2 (see below for each)
    from jax._src import dispatch
    from jax._src.interpreters import partial_eval as pe
    from jax._src.interpreters.mlir import lower_with_sharding_in_types
    from jax._src.sharding_impls import canonicalize_sharding
except ImportError:  # pragma: no cover - depends on the jax version
    dispatch = pe = lower_with_sharding_in_types = canonicalize_sharding = None

matmul_p = Primitive("autotuned_matmul")
fused_p = Primitive("autotuned_matmul_epilogue")
if dispatch is not None:
    # the multi-device lowering (custom_partitioning) needs the device assignment in the
    # lowering's module (JAX's ctx.module_context), which jit fills only for primitives registered here
    dispatch.prim_requires_devices_during_lowering.update((matmul_p, fused_p))

# lowering calls, per platform: tests check that lowering runs once per compile
LOWERINGS: dict[str, int] = {}


def bind_matmul(lhs, rhs, problem: MatmulProblem, out_sharding=None):
    """Bind the primitive; the key is computed here, at trace time, at the configured level.

    ``out_sharding`` (a NamedSharding, or a PartitionSpec under ``jax.set_mesh``) is
    lax.dot_general's, for the canonical (batch, m, n) output under Explicit mesh axes.
    """
    lhs, rhs, problem = _canonical_inputs(lhs, rhs, problem.bare())
    if out_sharding is not None and canonicalize_sharding is not None:
        out_sharding = canonicalize_sharding(out_sharding, "autotuned_matmul")
    return matmul_p.bind(lhs, rhs, problem=problem, key=problem.key(config.compile_policy().level),
                         out_sharding=out_sharding)


def bind_fused(lhs, rhs, operands, problem: MatmulProblem):
    """Bind the matmul in its context: the product of canonical lhs and rhs through
    ``problem.epilogue``, whose operands come in their role shapes (``Operand.shape``).
    The result has ``problem.result_shape``; the key, with the epilogue, is computed here."""
    epilogue = problem.epilogue
    lhs, rhs, problem = _canonical_inputs(lhs, rhs, problem)
    expected = epilogue.operand_shapes(problem.batch, problem.m, problem.n)
    operands = tuple(operands)
    if tuple(tuple(x.shape) for x in operands) != expected:
        raise ValueError(f"epilogue operands {[tuple(x.shape) for x in operands]} do not match "
                         f"the shapes {list(expected)} of {epilogue}")
    operands = tuple(x if x.dtype == o.dtype else lax.convert_element_type(x, o.dtype)
                     for x, o in zip(operands, epilogue.operands))
    return fused_p.bind(lhs, rhs, *operands, problem=problem, key=problem.key(config.compile_policy().level))


def _canonical_inputs(lhs, rhs, problem: MatmulProblem):
    """lhs and rhs checked against the problem and converted as XLA's dot runs them."""
    if tuple(lhs.shape) != problem.lhs_shape or tuple(rhs.shape) != problem.rhs_shape:
        raise ValueError(f"operands {tuple(lhs.shape)} and {tuple(rhs.shape)} do not match the "
                         f"problem's stored shapes {problem.lhs_shape} and {problem.rhs_shape}")
    problem = problem.with_operands_converted()
    lhs = lhs if lhs.dtype == problem.lhs_dtype else lax.convert_element_type(lhs, problem.lhs_dtype)
    rhs = rhs if rhs.dtype == problem.rhs_dtype else lax.convert_element_type(rhs, problem.rhs_dtype)
    lhs, rhs = _match_varying_axes(lhs, rhs)
    return lhs, rhs, problem


def decomposed(lhs, rhs, *operands, problem: MatmulProblem, key=None):
    """The fused op as the tuned product (``matmul_p``) and the epilogue as XLA ops."""
    return problem.epilogue.apply(bind_matmul(lhs, rhs, problem.bare()), operands)


def _varying_axes(x) -> frozenset:
    """The shard_map axes ``x`` varies over (empty outside shard_map)."""
    aval = jax.typeof(x)
    mat = getattr(aval, "mat", None)  # jax >= 0.10 keeps them here
    return frozenset(mat.varying if mat is not None else getattr(aval, "vma", ()))


def _match_varying_axes(lhs, rhs):
    """Inside shard_map, mark an operand varying over the other's axes, as lax.dot_general
    does, so that autodiff sums the cotangent of a replicated operand across shards."""
    lhs_axes, rhs_axes = _varying_axes(lhs), _varying_axes(rhs)
    if lhs_axes == rhs_axes:
        return lhs, rhs
    union = lhs_axes | rhs_axes
    if lhs_axes != union:
        lhs = lax.pcast(lhs, tuple(sorted(union - lhs_axes)), to="varying")
    if rhs_axes != union:
        rhs = lax.pcast(rhs, tuple(sorted(union - rhs_axes)), to="varying")
    return lhs, rhs


def _abstract_eval(lhs, rhs, *, problem, key, out_sharding):
    """The output aval by lax.dot_general's own rule, so shard_map's varying axes and
    (Explicit) shardings propagate exactly as for XLA's dot."""
    out, _ = lax.dot_general_p.abstract_eval(
        lhs, rhs, dimension_numbers=dimension_numbers(problem),
        precision=lax_precision(problem.precision), preferred_element_type=jnp.dtype(problem.out_dtype),
        out_sharding=out_sharding)
    return out


def _fused_abstract_eval(lhs, rhs, *operands, problem, key):
    product = _abstract_eval(lhs, rhs, problem=problem.bare(), key=None, out_sharding=None)
    return product.update(shape=problem.result_shape, dtype=jnp.dtype(problem.result_dtype))


def _emit(ctx, inputs, kernel):
    out, = mlir.lower_fun(kernel, multiple_results=False)(ctx, *inputs)
    if lower_with_sharding_in_types is None:
        return [out]
    return [lower_with_sharding_in_types(ctx, out, ctx.avals_out[0])]


def _partitioned(lhs, rhs, *operands, problem: MatmulProblem, kernels, out_sharding):
    """Per-shard tuning of the product; an epilogue runs after it as XLA ops."""
    product = partitioned_matmul(lhs, rhs, problem=problem.bare(), kernels=kernels,
                                 out_sharding=out_sharding)
    return problem.epilogue.apply(product, operands)


def _lowering(platform: str):
    def rule(ctx, lhs, rhs, *operands, problem, key, out_sharding=None):
        LOWERINGS[platform] = LOWERINGS.get(platform, 0) + 1
        inputs = (lhs, rhs, *operands)
        target = (ctx.platforms or ctx.module_context.platforms)[0]  # this branch's platform
        # lowered for a platform absent here (nothing to tune on), mode off, a bad setting
        chosen = lowering_tuner(platform) if has_devices(target) else None
        if chosen is None:
            return _xla_lowering(ctx, *inputs, problem=problem, key=key, out_sharding=out_sharding)
        tuner, policy = chosen
        for_export = _for_export(ctx)
        if lowering_targets_many_devices(ctx) and not for_export:  # jax.export takes no partitioner op
            # the product's Explicit sharding is the output's only for the matmul alone
            sharding = explicit_sharding(ctx.avals_out[0]) if problem.epilogue.is_bare else None
            kernels = ShardKernels(platform, dataclasses.replace(policy, level=key.level))
            kernel = functools.partial(_partitioned, problem=problem, kernels=kernels, out_sharding=sharding)
            return _emit(ctx, inputs, kernel)
        candidate = tuner.emitted(problem, tuner.select(problem, key, policy), for_export, target, policy)
        if candidate.fn is xla_dot:
            return _xla_lowering(ctx, *inputs, problem=problem, key=key, out_sharding=out_sharding)
        try:
            with lowering_warnings.quiet():  # our kernels' JAX deprecations are not the user's
                return _emit(ctx, inputs, candidate.bound(problem))
        except Exception as err:  # noqa: BLE001 - a kernel that cannot take this problem
            # (its wrapper refuses it while tracing, before emitting anything): XLA's dot
            warnings.warn(f"jax_autotune: kernel {candidate.name} failed to lower "
                          f"{problem.describe()} ({type(err).__name__}: {err}); using XLA's dot.",
                          RuntimeWarning, stacklevel=2)
            return _xla_lowering(ctx, *inputs, problem=problem, key=key, out_sharding=out_sharding)
    return rule


def _for_export(ctx) -> bool:
    """True when the rule lowers for ``jax.export`` (a name jax may rename: False then)."""
    return bool(getattr(ctx.module_context.lowering_parameters, "for_export", False))


def _xla_lowering(ctx, *inputs, problem, key, out_sharding=None):
    return _emit(ctx, inputs, XLA_DOT.bound(problem))


# ---------------------------------------------------------------- autodiff

def _swap_problem(problem: MatmulProblem, *, m, n, k, lhs_dtype, rhs_dtype, transpose_a,
                  transpose_b) -> MatmulProblem:
    # the cotangent product keeps the forward's result dtype and precision, as lax's
    # transpose does; the caller converts it to the operand's dtype. Its operands are the
    # cotangent and a forward operand as the forward read it: neither is copied first
    return dataclasses.replace(problem, m=m, n=n, k=k, lhs_dtype=lhs_dtype, rhs_dtype=rhs_dtype,
                               transpose_a=transpose_a, transpose_b=transpose_b,
                               lhs_copied=False, rhs_copied=False)


def _transpose_lhs(ct, lhs, rhs, *, problem, key, out_sharding):
    """Cotangent of lhs: ct @ rhs^T, or (rhs @ ct^T) when lhs is stored transposed; in
    lhs's stored layout and (Explicit axes) its sharding, as lax does."""
    p = problem
    sharding = explicit_sharding(lhs.aval)
    if not p.transpose_a:  # lhs_bar (b, m, k) = ct (b, m, n) @ rhs^T (b, n, k)
        new = _swap_problem(p, m=p.m, n=p.k, k=p.n, lhs_dtype=ct.dtype, rhs_dtype=rhs.dtype,
                            transpose_a=False, transpose_b=not p.transpose_b)
        return bind_matmul(ct, rhs, new, sharding).astype(lhs.aval.dtype)
    # lhs stored (b, k, m): lhs_bar = rhs (b, k, n) @ ct^T (b, n, m)
    new = _swap_problem(p, m=p.k, n=p.m, k=p.n, lhs_dtype=rhs.dtype, rhs_dtype=ct.dtype,
                        transpose_a=p.transpose_b, transpose_b=True)
    return bind_matmul(rhs, ct, new, sharding).astype(lhs.aval.dtype)


def _transpose_rhs(ct, lhs, rhs, *, problem, key, out_sharding):
    """Cotangent of rhs: lhs^T @ ct, or (ct^T @ lhs) when rhs is stored transposed; in
    rhs's stored layout and (Explicit axes) its sharding."""
    p = problem
    sharding = explicit_sharding(rhs.aval)
    if not p.transpose_b:  # rhs_bar (b, k, n) = lhs^T (b, k, m) @ ct (b, m, n)
        new = _swap_problem(p, m=p.k, n=p.n, k=p.m, lhs_dtype=lhs.dtype, rhs_dtype=ct.dtype,
                            transpose_a=not p.transpose_a, transpose_b=False)
        return bind_matmul(lhs, ct, new, sharding).astype(rhs.aval.dtype)
    # rhs stored (b, n, k): rhs_bar = ct^T (b, n, m) @ lhs (b, m, k)
    new = _swap_problem(p, m=p.n, n=p.k, k=p.m, lhs_dtype=ct.dtype, rhs_dtype=lhs.dtype,
                        transpose_a=True, transpose_b=p.transpose_a)
    return bind_matmul(ct, lhs, new, sharding).astype(rhs.aval.dtype)


# ---------------------------------------------------------------- jax.checkpoint

def _remat_rule(saveable, unknowns, instantiated, eqn):
    """jax.checkpoint's partial evaluation of a tuned op, as of any primitive, except that
    the policy is asked about the ``lax.dot_general`` the op computes: ``dots_saveable``
    and the other dot policies save the tuned matmuls as they save lax's dots."""
    n = len(eqn.outvars)
    residuals = [v for v, inst in zip(eqn.invars, instantiated) if isinstance(v, pe.Var) and not inst]
    if any(unknowns):  # staged: known inputs become residuals
        return None, eqn, [True] * n, [True] * n, residuals
    problem = eqn.params["problem"]
    lhs, rhs = (v.aval for v in eqn.invars[:2])
    contracting, _ = dims = dimension_numbers(problem)
    if problem.batch == 1:  # a canonical batch of one: the dot the user wrote had none
        lhs, rhs = lhs.update(shape=lhs.shape[1:]), rhs.update(shape=rhs.shape[1:])
        dims = (tuple(tuple(d - 1 for d in side) for side in contracting), ((), ()))
    policy = pe.ensure_enum(saveable(
        lax.dot_general_p, lhs, rhs, dimension_numbers=dims, precision=lax_precision(problem.precision),
        preferred_element_type=jnp.dtype(problem.out_dtype), out_sharding=eqn.params.get("out_sharding")))
    if isinstance(policy, pe.SaveableType):  # known, and kept for the backward pass
        return eqn, None, [False] * n, [False] * n, []
    # recomputed in the backward pass (also where a policy would offload: not done here)
    return eqn, eqn, [False] * n, [True] * n, residuals


# ---------------------------------------------------------------- vmap

def _batching_rule(args, dims, *, problem, key, out_sharding):
    """Fold the mapped axis into the problem's batch (or into m when rhs is unmapped).

    With an Explicit out_sharding the folded shapes would need shardings of their own:
    there, lax's dot and its own batching rule do it (XLA's dot, untuned).
    """
    lhs, rhs = args
    lhs_dim, rhs_dim = dims
    if out_sharding is not None:
        dot = functools.partial(xla_dot, problem=problem, out_sharding=out_sharding)
        return jax.vmap(dot, in_axes=(lhs_dim, rhs_dim))(lhs, rhs), 0
    size = lhs.shape[lhs_dim] if lhs_dim is not None else rhs.shape[rhs_dim]
    if size == 0:  # an empty mapped axis: no problem to tune, the empty result lax gives
        return jnp.zeros((0, *problem.out_shape), problem.out_dtype), 0
    if rhs_dim is None and not problem.transpose_a and problem.batch == 1:
        # (V, 1, m, k) @ (1, k, n): one (1, V*m, k) problem, no copy of rhs
        lhs = jnp.moveaxis(lhs, lhs_dim, 0).reshape(1, size * problem.m, problem.k)
        new = dataclasses.replace(problem, m=size * problem.m)
        out = bind_matmul(lhs, rhs, new)
        return out.reshape(size, 1, problem.m, problem.n), 0

    def stack(x, dim, shape):
        if dim is None:
            x = jnp.broadcast_to(x, (size, *shape))
        else:
            x = jnp.moveaxis(x, dim, 0)
        return x.reshape(size * shape[0], *shape[1:])

    new = dataclasses.replace(problem, batch=size * problem.batch)
    out = bind_matmul(stack(lhs, lhs_dim, problem.lhs_shape), stack(rhs, rhs_dim, problem.rhs_shape), new)
    return out.reshape(size, *problem.out_shape), 0


# ---------------------------------------------------------------- the fused op's rules

def _fused_jvp(primals, tangents, *, problem, key):
    """jvp of the product and the epilogue taken apart (each piece has its own rules)."""
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    return jax.jvp(functools.partial(decomposed, problem=problem), tuple(primals), tuple(tangents))


def _fused_batching_rule(args, dims, *, problem, key):
    return jax.vmap(functools.partial(decomposed, problem=problem), in_axes=tuple(dims))(*args), 0


# ---------------------------------------------------------------- registration

@functools.lru_cache(maxsize=512)
def _eager(primitive, params: tuple):
    return jax.jit(lambda *inputs: primitive.bind(*inputs, **dict(params)))


def _impl(primitive):
    def impl(*inputs, **params):
        """Eager calls compile through the same lowering (and so the same tuner)."""
        return _eager(primitive, tuple(sorted(params.items())))(*inputs)
    return impl


matmul_p.def_abstract_eval(_abstract_eval)
ad.defbilinear(matmul_p, _transpose_lhs, _transpose_rhs)
batching.primitive_batchers[matmul_p] = _batching_rule
fused_p.def_abstract_eval(_fused_abstract_eval)
if pe is not None:
    pe.partial_eval_jaxpr_custom_rules[matmul_p] = pe.partial_eval_jaxpr_custom_rules[fused_p] = _remat_rule
ad.primitive_jvps[fused_p] = _fused_jvp
batching.primitive_batchers[fused_p] = _fused_batching_rule
for _primitive in (matmul_p, fused_p):
    _primitive.def_impl(_impl(_primitive))
    mlir.register_lowering(_primitive, _xla_lowering)  # any other platform: XLA's dot
    mlir.register_lowering(_primitive, _lowering("cpu"), platform="cpu")
    for _gpu in ("cuda", "rocm"):
        mlir.register_lowering(_primitive, _lowering("gpu"), platform=_gpu)
