"""``autotune(fn)``: ``fn`` with every matmul it traces to tuned, without changing its source.

    >>> import jax, jax.numpy as jnp, jax_autotune as jat
    >>> def attention(q, k, v):
    ...     return jax.nn.softmax(jnp.einsum("bqd,bkd->bqk", q, k)) @ v
    >>> fast = jax.jit(jat.autotune(attention))     # also: grad, vmap, warmup(autotune(f), ...)
    >>> fast(q, k, v)

``einsum``, ``@``, ``jnp.dot``/``matmul``/``tensordot``, ``lax.dot_general`` and flax's
``Dense``/``DenseGeneral``/``Einsum``/``nnx.Linear`` all trace to ``dot_general`` equations;
``lax.ragged_dot`` (mixture-of-experts layers) and the ``ragged_dot_general`` equations of
its gradients (ragged contracting dims included) are bound through
``jat.ragged_dot_general`` (float operands of one dtype), a ragged m with the elementwise
ops after it (a SwiGLU's ``silu(gate) * up``, a bias, a convert) as one op whose key holds them.
``fn`` is traced to a jaxpr once per abstract signature, and that jaxpr is traced again
through a small interpreter that binds every equation as JAX would, except that each
``dot_general`` the tuner serves (see ``_tuner_serves``) goes through ``jat.dot_general``,
with its precision, preferred_element_type and out_sharding. A dot followed by ops that
only it feeds (bias, residual, activation, convert, a reduction: ``jax_autotune.context``)
is bound with them as one op whose key holds that epilogue, so its kernel is chosen in
the context the program runs it. Under reverse-mode autodiff (``jax.grad``, ``jax.vjp``)
the backward pass is JAX's own, traced and tuned the same way (``jax_autotune.backward``),
so the backward matmuls are decided in their contexts too. The interpreter recurses into
the jaxprs of nested jit, scan, while, cond, ``jax.checkpoint``, closed_call, custom_jvp
(primal and jvp rule), custom_vjp (primal and fwd rule) and shard_map bodies. Each call
evaluates the cached rewritten jaxpr, so effects (prints, callbacks) happen once per call,
in order.

Left as lax's own dot (no tuning cost):
  * integer, complex, bool, float8 and mixed-dtype dots, and dots with an empty or symbolic
    dimension: no candidate serves them;
  * dots with a ``lax.DotAlgorithmPreset`` precision: a preset is a numerical contract
    that only XLA's dot honours, so the tuner would run no rounds and pick lax's dot
    anyway (``_tuner_takes_precision`` is the one place that says so);
  * weak-typed dots (both operands weakly typed): ``jat.dot_general`` returns a strong
    type, which would change e.g. a scan carry's type.
Left as is:
  * a ``custom_vjp``'s ``bwd`` rule: a Python function, not a jaxpr, that may return symbolic
    zeros, which cannot be traced. Tune it with ``f.defvjp(fwd, jat.autotune(bwd))``, or
    transform the gradient: ``jat.autotune(jax.grad(loss))`` traces bwd into the jaxpr;
  * primitives whose sub-jaxprs are not plain JAX programs, or not in ``_SUBJAXPR_PARAMS``
    (pallas_call kernels, custom_transpose, linear_call, run_state, ...): bound unchanged.

Arguments: array leaves (``jax.Array``, tracers, NumPy arrays and scalars) are traced. Every
other leaf, Python numbers included, is static and part of the cache key by type and exact
value, as with ``static_argnums``: ``fn`` sees exactly what it was given, so
``jax.jit(autotune(fn), static_argnums=...)`` and ``range(n)`` work. Under ``jax.jit`` a
Python number that jit makes dynamic arrives as a tracer; eagerly, each new value is a new
trace. The key also holds JAX's trace-time settings (x64, the default matmul precision) and
ours. Values ``fn`` closes over are read at its first trace of a signature, as with
``jax.jit``. flax nnx modules among the arguments get the state ``fn`` writes into them
(``jax_autotune.module_state``). Outputs that are no arrays come back as ``fn`` returned them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import struct
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import linear_util as lu
from jax.extend import source_info_util
from jax.extend.core import ClosedJaxpr, Literal, jaxpr_as_fun

import jax_autotune.config as config
from jax_autotune.api import LEFT_PLAIN, dot_general, dot_general_in_context, leaving_plain
from jax_autotune import attention, attention_tuning
from jax_autotune.backward import jit_or_vjp_only, reverse_mode, with_tuned_backward
from jax_autotune.context import Region, dot_labels, operand_values, regions
from jax_autotune.jaxprs import bind, map_jaxprs
from jax_autotune.kernels.gpu.epilogues import taken_by_value
from jax_autotune.module_state import split_modules, with_module_state
from jax_autotune.ragged import ragged_dot_general, ragged_dot_in_context
from jax_autotune.registry import tuner_for
from jax_autotune.tuning import programs

try:  # what jax.jit keys its trace cache on (jax 0.10 and 0.11)
    from jax._src.config import trace_context as _jax_trace_context
except ImportError:  # pragma: no cover - a jax that moved it: the settings known to matter
    def _jax_trace_context():
        return (jax.config.jax_enable_x64, jax.config.jax_default_matmul_precision,
                jax.config.jax_numpy_rank_promotion, jax.config.jax_numpy_dtype_promotion)

_TUNED_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})

# primitive name -> its params that hold jaxprs (or jaxpr thunks) to rewrite. "pjit",
# "checkpoint", "custom_vjp_call_jaxpr" and "jvp_jaxpr_thunk" are names of older jax.
_SUBJAXPR_PARAMS = {
    "jit": ("jaxpr",), "pjit": ("jaxpr",),
    "scan": ("jaxpr",),
    "while": ("cond_jaxpr", "body_jaxpr"),
    "cond": ("branches",),
    "remat2": ("jaxpr",), "checkpoint": ("jaxpr",),
    "closed_call": ("call_jaxpr",), "call": ("call_jaxpr",),
    "custom_jvp_call": ("call_jaxpr", "jvp_jaxpr_fun", "jvp_jaxpr_thunk"),
    "custom_vjp_call": ("call_jaxpr", "fwd_jaxpr_thunk"),
    "custom_vjp_call_jaxpr": ("fun_jaxpr", "fwd_jaxpr_thunk"),
}
_SHARD_MAP_PARAMS = {"jaxpr", "mesh", "in_specs", "out_specs", "check_vma", "newly_manual_axes"}


def autotune(fn):
    """``fn`` with every matmul it traces to bound as the tuned primitive: same signature,
    same pytree in/out structure. See the module docstring for what stays lax's.

    >>> train_step = jax.jit(jat.autotune(train_step))
    >>> loss, grads = jax.value_and_grad(jat.autotune(loss_fn))(params, batch)
    """
    if not callable(fn):
        raise TypeError(f"autotune(fn): fn must be callable, got {type(fn).__name__} {fn!r}")
    plain, stateful = _Traces(fn), _Traces(with_module_state(fn))

    @functools.wraps(fn)
    def tuned(*args, **kwargs):
        split = split_modules(args, kwargs)
        if split is None:
            return plain(args, kwargs)
        out, state = stateful((split.graph, split.state, split.args, split.kwargs), {})
        return split.write_back(out, state)

    return tuned


@dataclasses.dataclass
class _Traced:
    """One abstract signature of ``fn``: its rewritten jaxpr over the array leaves of the
    arguments, ``fn`` over those leaves (``flat_fn``, returning its traced outputs), how
    its result is rebuilt around them, and its tuned backward passes."""

    closed: ClosedJaxpr
    flat_fn: Callable
    out_tree: Any
    out_static: tuple  # per output leaf: _TRACED, or the value fn returned (not an array)
    source: ClosedJaxpr  # as traced, its attentions fused where decided, before the rewrite
    program: str  # its identity (``tuning.programs``)
    original: ClosedJaxpr  # as traced
    left_plain: frozenset = frozenset()  # keys whose dots the rewrite left to lax
    checked_at: int = -1  # the ``programs.generation()`` left_plain was read at
    backwards: dict = dataclasses.field(default_factory=dict)
    unfused: ClosedJaxpr | None = None  # ``original`` rewritten: for calls that run no fused attention

    def as_written(self) -> ClosedJaxpr:
        """The program with every attention as written (the rewrite of ``original``), for
        forward-mode autodiff and vmap, which the fused kernels' custom_vjp refuses."""
        if self.unfused is None:
            self.unfused = self.closed if self.source is self.original else _rewrite(self.original)
        return self.unfused

    def differentiated(self) -> Callable:
        """The function reverse-mode autodiff traces: ``fn``'s, or with its attentions fused
        where ``source`` has them (the backward pass is then the fused kernels')."""
        return self.flat_fn if self.source is self.original else _as_function(self.source)

    def result(self, arrays):
        it = iter(arrays)
        leaves = [next(it) if static is _TRACED else static for static in self.out_static]
        return jax.tree_util.tree_unflatten(self.out_tree, leaves)


_TRACED = object()  # marks a traced output leaf in _Traced.out_static


class _Traces:
    """``fn`` called through its rewritten jaxpr, traced once per abstract signature: the
    tree of the arguments, their array leaves' avals, their other (static) leaves by type
    and exact value, and the settings a trace depends on (JAX's and ours)."""

    def __init__(self, fn):
        self.fn = fn
        self.cache: dict = {}

    def __call__(self, args, kwargs):
        leaves, in_tree = jax.tree_util.tree_flatten((args, kwargs))
        is_array = tuple(isinstance(x, (jax.Array, np.ndarray, np.generic)) for x in leaves)
        arrays = [x for x, array in zip(leaves, is_array) if array]
        avals = tuple(jax.typeof(x) for x in arrays)
        static = tuple(_static_key(x) for x, array in zip(leaves, is_array) if not array)
        key = (in_tree, is_array, static, avals, _trace_settings())
        try:
            traced = self.cache.get(key)
        except TypeError:  # an unhashable static leaf: traced on every call
            key = traced = None
        if traced is None:
            traced = _trace(self.fn, in_tree, leaves, is_array, avals)
        traced = _as_checked(traced)
        closes_over_tracer = any(isinstance(c, jax.core.Tracer) for c in traced.closed.consts)
        if key is not None and not closes_over_tracer:
            self.cache[key] = traced
        for seen in _programs_seen:
            seen.add(traced.program)
        with leaving_plain(traced.left_plain):
            if traced.source is not traced.original and not jit_or_vjp_only(arrays):
                return traced.result(jaxpr_as_fun(traced.as_written())(*arrays))
            linearized = reverse_mode(arrays) if config.compile_policy().context == "full" else None
            if linearized is not None:
                if linearized not in traced.backwards:  # per signature and differentiated leaves
                    traced.backwards[linearized] = with_tuned_backward(
                        traced.closed, traced.differentiated(), avals, linearized, _rewrite)
                if traced.backwards[linearized] is not None:
                    return traced.result(traced.backwards[linearized](*arrays))
            return traced.result(jaxpr_as_fun(traced.closed)(*arrays))


_programs_seen: list[set] = []


@contextlib.contextmanager
def programs_traced():
    """The identities (``tuning.programs``) of the autotuned programs called meanwhile.

        >>> with programs_traced() as seen:
        ...     jax.make_jaxpr(jat.autotune(step))(params, batch)
    """
    seen: set = set()
    _programs_seen.append(seen)
    try:
        yield seen
    finally:
        _programs_seen.remove(seen)


def _as_checked(traced: _Traced) -> _Traced:
    """``traced`` rewritten again if the keys its program leaves plain changed (a check in
    ``warmup`` found that they cost it; ``jax_autotune.program_check``)."""
    generation = programs.generation()
    if traced.checked_at == generation:  # no check kept or dropped since: nothing to read
        return traced
    left = _keys_left_plain(traced.program)
    if left == traced.left_plain:
        return dataclasses.replace(traced, checked_at=generation)
    with leaving_plain(left):
        source = _fused_attention(traced.original)
        closed = _rewrite(source)
    return dataclasses.replace(traced, closed=closed, source=source, left_plain=left,
                               backwards={}, unfused=None, checked_at=generation)


def _keys_left_plain(program: str) -> frozenset:
    """The keys ``program`` leaves to lax on this platform; none where nothing was checked
    (or the store cannot say: never an error for the user's program)."""
    if config.compile_policy().mode == "off":
        return frozenset()
    try:
        return programs.left_plain(tuner_for(jax.default_backend()), program)
    except Exception:  # noqa: BLE001 - a bad store or setting: the program as tuned
        return frozenset()


def _static_key(x):
    """A static leaf as the trace cache tells it apart: by type and exact value, so that
    ``-0.0`` is not ``0.0``, ``True`` is not ``1`` and ``nan`` finds its own trace."""
    if isinstance(x, float):
        return type(x), struct.pack("<d", x)
    if isinstance(x, complex):
        return type(x), struct.pack("<dd", x.real, x.imag)
    return type(x), x


def _trace_settings() -> tuple:
    """What a trace depends on beyond the arguments: JAX's trace-time config (x64, the
    default matmul precision, ... as ``jax.jit`` keys its cache on them) and our level and
    context (read when the matmuls are bound)."""
    policy = config.compile_policy()
    return _jax_trace_context(), policy.level, policy.context


def _trace(fn, in_tree, leaves, is_array, avals) -> _Traced:
    static_in = [None if array else x for x, array in zip(leaves, is_array)]
    out: dict = {}  # the result's tree and static leaves, from the first trace

    def flat_fn(*arrays):
        it = iter(arrays)
        args, kwargs = jax.tree_util.tree_unflatten(
            in_tree, [next(it) if array else x for x, array in zip(static_in, is_array)])
        out_leaves, out_tree = jax.tree_util.tree_flatten(fn(*args, **kwargs))
        if not out:  # a leaf that is no tracer (a Python number, a string) is returned as is
            out["tree"] = out_tree
            out["static"] = tuple(_TRACED if isinstance(x, jax.core.Tracer) else x for x in out_leaves)
        return [x for x, static in zip(out_leaves, out["static"]) if static is _TRACED]

    closed = jax.make_jaxpr(flat_fn)(*avals)
    program = programs.identity(getattr(fn, "__qualname__", type(fn).__name__), str(closed.jaxpr))
    source = _fused_attention(closed)
    return _Traced(_rewrite(source), flat_fn, out["tree"], out["static"], source, program, closed)


def _fused_attention(closed: ClosedJaxpr) -> ClosedJaxpr:
    """``closed`` with each softmax attention fused where its decision says so
    (``jax_autotune.attention``, ``jax_autotune.attention_tuning``); as traced otherwise,
    and wherever finding or deciding fails (a warning: never the user's program)."""
    try:
        choose = attention_tuning.choice(config.compile_policy())
        return closed if choose is None else attention.substituted(closed, choose)
    except Exception as err:  # noqa: BLE001 - the program as traced
        warnings.warn(f"jax_autotune: the attentions of this program could not be fused "
                      f"({type(err).__name__}: {err}); they run as written", RuntimeWarning, stacklevel=4)
        return closed


def _as_function(closed: ClosedJaxpr) -> Callable:
    """``closed`` as a function of its inputs returning the list of its outputs."""
    run = jaxpr_as_fun(closed)
    return lambda *arrays: list(run(*arrays))


def _rewrite(jaxpr):
    """The same program with its matmuls tuned: a jaxpr of the same kind and avals."""
    closed = jaxpr if isinstance(jaxpr, ClosedJaxpr) else ClosedJaxpr(jaxpr, ())
    new = jax.make_jaxpr(functools.partial(_eval, closed))(*closed.in_avals)
    if isinstance(jaxpr, ClosedJaxpr):
        return new
    # an open jaxpr (checkpoint, shard_map bodies) cannot hold consts; its operands are
    # lifted arrays and the tuned dot adds only reshapes and transposes, so none appear
    return jaxpr if new.consts else new.jaxpr


def _eval(closed, *args):
    """``core.eval_jaxpr``, each equation bound by ``_bind`` under its own context; a dot
    with an epilogue is bound with it, where the epilogue's last equation stood."""
    eqns = closed.jaxpr.eqns
    env = dict(zip(closed.jaxpr.constvars, closed.consts))
    env.update(zip(closed.jaxpr.invars, args))

    def read(atom):
        return atom.val if isinstance(atom, Literal) else env[atom]

    def run(eqn, as_traced=False):
        info = eqn.source_info
        name_stack = source_info_util.current_name_stack() + info.name_stack
        bound = _bind_as_traced if as_traced else _bind
        with source_info_util.user_context(info.traceback, name_stack=name_stack), eqn.ctx.manager:
            out = bound(eqn, [read(v) for v in eqn.invars])
        env.update(zip(eqn.outvars, out if eqn.primitive.multiple_results else [out]))

    found = {} if config.compile_policy().context == "off" else regions(
        closed.jaxpr, {i: _labels(e) for i, e in enumerate(eqns) if _has_context(e)}, keeps_values=taken_by_value)
    deferred = {i for r in found.values() for i in (r.head, *r.members[:-1])}
    at_last = {r.last: r for r in found.values()}
    for index, eqn in enumerate(eqns):
        if index in at_last:
            region = at_last[index]
            out = _in_context(region, eqns, read)
            if out is None or out is LEFT_PLAIN:  # the equations as JAX traced them
                for i in (region.head, *region.members):
                    run(eqns[i], as_traced=out is LEFT_PLAIN and i == region.head)
            else:
                env[region.output] = out
        elif index not in deferred:
            run(eqn)
    return [read(v) for v in closed.jaxpr.outvars]


def _has_context(eqn) -> bool:
    """A dot the tuner serves, or a grouped matmul's ragged m (``lax.ragged_dot``'s form),
    whose result may be bound with the ops after it."""
    if eqn.primitive.name == "ragged_dot_general":
        dims = eqn.params["ragged_dot_dimension_numbers"]
        return (_ragged_served(eqn) and tuple(dims.lhs_ragged_dimensions) == (0,)
                and dims.dot_dimension_numbers[0][0] == (1,) and eqn.outvars[0].aval.ndim == 2)
    return (eqn.primitive.name == "dot_general" and _tuner_serves(eqn)
            and eqn.params.get("out_sharding") is None)


def _labels(eqn) -> str:
    """The labels of a context head's result dims (a ragged m's (m, n) result: "mn")."""
    if eqn.primitive.name == "ragged_dot_general":
        return "mn"
    return dot_labels(eqn.params["dimension_numbers"], *(v.aval.ndim for v in eqn.invars))


def _in_context(region: Region, eqns, read):
    """The region's output: its dot (or grouped matmul) and epilogue as one tuned op; None
    where the tuned matmul cannot serve it (it then runs as JAX traced it)."""
    head = eqns[region.head]
    grouped = head.primitive.name == "ragged_dot_general"
    if grouped and (region.swap or region.epilogue.is_bare):
        return None
    try:
        out = (_bound_grouped if grouped else _bound_dot)(region, head, read)
    except Exception as err:  # noqa: BLE001 - never the user's program: as traced
        warnings.warn(f"jax_autotune: the matmul's context {region.epilogue.describe()!r} could "
                      f"not be bound ({type(err).__name__}: {err}); it runs untuned",
                      RuntimeWarning, stacklevel=3)
        return None
    if out is None or out is LEFT_PLAIN:
        return out
    want = region.output.aval
    return jnp.reshape(out, want.shape) if out.dtype == want.dtype else None


def _bound_dot(region: Region, head, read):
    lhs, rhs = (read(v) for v in head.invars)
    (lc, rc), (lb, rb) = head.params["dimension_numbers"]
    dims = ((lc, rc), (lb, rb))
    if region.swap:  # transpose(lhs . rhs) = rhs . lhs
        lhs, rhs, dims = rhs, lhs, ((rc, lc), (rb, lb))
    return dot_general_in_context(lhs, rhs, dims, head.params["precision"], head.params["preferred_element_type"],
                                  region.epilogue, lambda batch, m, n: operand_values(region, read, batch, m, n))


def _bound_grouped(region: Region, head, read):
    params = head.params
    return ragged_dot_in_context(*(read(v) for v in head.invars), params["ragged_dot_dimension_numbers"],
                                 params["precision"], params["preferred_element_type"], region.epilogue,
                                 lambda m, n: operand_values(region, read, 1, m, n))


def _bind_as_traced(eqn, invals):
    out = bind(eqn, invals)
    return out if eqn.primitive.multiple_results else out[0]


def _bind(eqn, invals):
    name, params = eqn.primitive.name, eqn.params
    if name == "dot_general" and _tuner_serves(eqn):
        extra = {"out_sharding": params["out_sharding"]} if "out_sharding" in params else {}
        return dot_general(*invals, params["dimension_numbers"], precision=params["precision"],
                           preferred_element_type=params["preferred_element_type"], **extra)
    if name == "ragged_dot_general" and _ragged_served(eqn):
        return ragged_dot_general(*invals, params["ragged_dot_dimension_numbers"], precision=params["precision"],
                                  preferred_element_type=params["preferred_element_type"])
    if name == "shard_map" and set(params) == _SHARD_MAP_PARAMS:
        return _shard_map(invals, **params)
    if name in _SUBJAXPR_PARAMS and params.get("name") != attention.UNTOUCHED:  # an attention left plain
        params = {k: _rewrite_param(v) if k in _SUBJAXPR_PARAMS[name] else v for k, v in params.items()}
    out = bind(eqn, invals, params)
    return out if eqn.primitive.multiple_results else out[0]


def _tuner_serves(eqn) -> bool:
    """Whether this dot_general equation goes through ``jat.dot_general``; any other stays
    the equation JAX traced."""
    lhs, rhs = (v.aval for v in eqn.invars)
    return (lhs.dtype == rhs.dtype and lhs.dtype.name in _TUNED_DTYPES
            and _static_nonempty(lhs.shape) and _static_nonempty(rhs.shape)
            and not eqn.outvars[0].aval.weak_type
            and _tuner_takes_precision(eqn.params["precision"]))


def _ragged_served(eqn) -> bool:
    """Whether this ragged_dot_general equation goes through ``jat.ragged_dot_general`` (which
    leaves the dims the grouped tuner does not serve to lax): float operands of one dtype,
    as for dots, no group offset and no out_sharding."""
    lhs, rhs, group_sizes = (v.aval for v in eqn.invars)
    return (lhs.dtype == rhs.dtype and lhs.dtype.name in _TUNED_DTYPES
            and all(_static_nonempty(x.shape) for x in (lhs, rhs, group_sizes))
            and not eqn.outvars[0].aval.weak_type and eqn.params.get("group_offset") is None
            and eqn.params.get("out_sharding") is None and _tuner_takes_precision(eqn.params["precision"]))


def _static_nonempty(shape) -> bool:
    return all(isinstance(d, int) and d > 0 for d in shape)


def _tuner_takes_precision(precision) -> bool:
    """None or a pair of ``lax.Precision``; a ``DotAlgorithmPreset`` stays lax's (no rounds)."""
    return precision is None or (isinstance(precision, tuple)
                                 and all(isinstance(p, lax.Precision) for p in precision))


def _rewrite_param(value):
    if isinstance(value, lu.WrappedFun):  # custom_jvp's jvp / custom_vjp's fwd jaxpr thunk
        return _rewrite_thunk(value)
    return map_jaxprs(value, _rewrite)  # a body, or cond's branches


def _rewrite_thunk(thunk):
    """A thunk ``(*zeros) -> (jaxpr, consts, *rest)`` whose jaxpr is rewritten, memoised
    (JAX calls it once per set of zero flags)."""
    memo = {}

    def rewritten(*zeros):
        if zeros not in memo:
            jaxpr, consts, *rest = thunk.call_wrapped(*zeros)
            new = _rewrite(ClosedJaxpr(jaxpr, consts))
            memo[zeros] = (new.jaxpr, new.consts, *rest)
        return memo[zeros]

    return lu.wrap_init(rewritten, debug_info=thunk.debug_info)


def _shard_map(invals, *, jaxpr, mesh, in_specs, out_specs, check_vma, newly_manual_axes):
    """Bound again through ``jax.shard_map``: its body can only be traced under its manual axes."""
    body = ClosedJaxpr(jaxpr, ())
    return jax.shard_map(lambda *xs: tuple(_eval(body, *xs)), mesh=mesh, in_specs=tuple(in_specs),
                         out_specs=tuple(out_specs), axis_names=set(newly_manual_axes),
                         check_vma=check_vma)(*invals)
