"""Internal: the backward pass of an autotuned function, as JAX computes it, tuned in its contexts.

Differentiating the tuned primitives gives correct gradients, but each backward matmul
is then a transpose rule's bare product: what consumes it (the add into the input
gradient, the convert of a weight gradient, the accumulation of a weight used twice) is
out of sight. So, when an autotuned function is called under reverse-mode autodiff
(``jax.grad``, ``jax.vjp``), it becomes a ``jax.custom_vjp`` whose forward is
``jax.vjp`` of the plain function and whose backward is the plain backward pass, both
traced to jaxprs and rewritten like the function itself (``autotune._rewrite``): the
gradients are JAX's own, and every matmul of both passes is bound in its context.

    >>> linearized = reverse_mode(arrays)       # which leaves are differentiated
    >>> if linearized:
    ...     out = with_tuned_backward(closed, flat_fn, avals, linearized, rewrite)(*arrays)

Forward-mode autodiff (``jax.jvp``, ``jax.jacfwd``, ``jax.hessian``, and ``jax.linearize``,
whose linear function runs forward) cannot differentiate a ``custom_vjp``; under it, or
where ``fn`` has effects or closes over values of an outer transformation (which custom_vjp
rules cannot), the function is differentiated as traced (tuned primitives, bare backward
keys). Leaves and outputs that are not differentiable (integers, bools, PRNG keys) get the
``float0`` cotangents JAX gives them.
"""

from __future__ import annotations

from typing import Callable

import jax
from jax.extend.core import jaxpr_as_fun

from jax_autotune.dtypes import is_differentiable, zero_cotangent

try:  # jax internals (0.10 and 0.11): the tracers of linearize, jvp, vmap and jit
    from jax._src.interpreters.ad import JVPTracer, LinearizeTracer
    from jax._src.interpreters.batching import BatchTracer
    from jax._src.interpreters.partial_eval import DynamicJaxprTracer
except ImportError:  # pragma: no cover - a jax that moved them: differentiate as traced
    JVPTracer = LinearizeTracer = BatchTracer = DynamicJaxprTracer = None


def reverse_mode(arrays) -> tuple[bool, ...] | None:
    """Which leaves the call is linearized with respect to, for reverse-mode autodiff;
    None when it is not, or when something else is around it: forward-mode autodiff
    (which a ``custom_vjp`` refuses: ``jax.jvp``, and ``jax.linearize``, whose linear
    function runs forward) or a tracer of a kind not known here (a leaf it hides could be
    differentiated, and its gradient must not be lost)."""
    if LinearizeTracer is None:
        return None
    found = []
    for x in arrays:
        linearized = False
        while isinstance(x, jax.core.Tracer):
            if isinstance(x, LinearizeTracer):
                if not getattr(x._trace, "is_vjp", False):  # jax.linearize, not jax.vjp
                    return None
                linearized, x = True, x.primal
            elif isinstance(x, BatchTracer):
                x = x.val
            elif isinstance(x, DynamicJaxprTracer):
                break
            else:  # a JVPTracer, or a kind this walk does not know
                return None
        found.append(linearized)
    return tuple(found) if any(found) else None


def jit_or_vjp_only(arrays) -> bool:
    """Whether nothing but tracing (jit, make_jaxpr) and reverse-mode linearization
    (``jax.grad``, ``jax.vjp``) is around the call: no forward-mode autodiff, no vmap, no
    tracer of a kind not known here. A ``custom_vjp`` (a fused attention's) serves such a
    call; forward mode refuses one."""
    if LinearizeTracer is None:
        return False
    for x in arrays:
        while isinstance(x, jax.core.Tracer):
            if isinstance(x, LinearizeTracer) and getattr(x._trace, "is_vjp", False):
                x = x.primal
            elif isinstance(x, DynamicJaxprTracer):
                break
            else:
                return False
    return True


def with_tuned_backward(primal, flat_fn, avals: tuple, linearized: tuple, rewrite) -> Callable | None:
    """``custom_vjp`` of ``flat_fn`` (over the array leaves, whose rewritten jaxpr is
    ``primal``), differentiated with respect to the ``linearized`` leaves, its forward and
    backward traced and rewritten by ``rewrite``; None where it does not apply (see the
    module docstring): the caller differentiates as traced (and keeps it per signature)."""
    if primal.effects or _closes_over_tracers(primal):
        return None
    floats = tuple(bool(d) and is_differentiable(a.dtype) for a, d in zip(avals, linearized))
    if not any(floats):
        return None

    def forward(*arrays):
        def of_floats(*xs):
            it = iter(xs)
            return flat_fn(*(next(it) if f else a for a, f in zip(arrays, floats)))
        return jax.vjp(of_floats, *(a for a, f in zip(arrays, floats) if f))

    try:
        traced, (out_shape, pullback_shape) = jax.make_jaxpr(forward, return_shape=True)(*avals)
        out_tree = jax.tree_util.tree_structure(out_shape)
        pullback_tree = jax.tree_util.tree_structure(pullback_shape)
        n_out = out_tree.num_leaves
        outs, residuals = traced.out_avals[:n_out], traced.out_avals[n_out:]
        sensitive = [is_differentiable(a.dtype) for a in outs]  # outputs with a cotangent

        def backward(*inputs):
            res, cts = iter(inputs[:len(residuals)]), iter(inputs[len(residuals):])
            pullback = jax.tree_util.tree_unflatten(pullback_tree, list(res))
            cts = [next(cts) if s else zero_cotangent(a) for a, s in zip(outs, sensitive)]
            return pullback(jax.tree_util.tree_unflatten(out_tree, cts))

        bwd_traced = jax.make_jaxpr(backward)(*residuals, *(a for a, s in zip(outs, sensitive) if s))
    except Exception:  # noqa: BLE001 - a pullback that is not a pytree of arrays here
        return None
    if _closes_over_tracers(traced) or _closes_over_tracers(bwd_traced):
        return None  # custom_vjp rules cannot close over an outer transformation's values
    fwd_jaxpr, bwd_jaxpr = rewrite(traced), rewrite(bwd_traced)
    run_primal, run_fwd, run_bwd = (jaxpr_as_fun(j) for j in (primal, fwd_jaxpr, bwd_jaxpr))

    @jax.custom_vjp
    def tuned(*arrays):
        return run_primal(*arrays)

    def tuned_fwd(*arrays):
        outs = run_fwd(*arrays)
        return outs[:n_out], outs[n_out:]

    def tuned_bwd(res, cts):
        grads = iter(run_bwd(*res, *(c for c, s in zip(cts, sensitive) if s)))
        return tuple(next(grads) if f else zero_cotangent(a) for f, a in zip(floats, avals))

    tuned.defvjp(tuned_fwd, tuned_bwd)
    return lambda *arrays: tuned(*arrays)


def _closes_over_tracers(closed) -> bool:
    return any(isinstance(c, jax.core.Tracer) for c in closed.consts)


__all__ = ["jit_or_vjp_only", "reverse_mode", "with_tuned_backward"]
