"""Softmax attention in a traced program, and the same attention fused.

A model writes attention as two matmuls around a softmax (GPT-2, Llama, ViT, flax's
``MultiHeadDotProductAttention``; ``jax.nn.dot_product_attention``'s XLA implementation,
which flax nnx's ``MultiHeadAttention`` runs, the same with a size-1 query-group axis)::

    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / head_dim ** 0.5
    weights = jax.nn.softmax(jnp.where(causal_mask, scores, -1e9).astype(jnp.float32))
    out = jnp.einsum("bhqk,bkhd->bqhd", weights.astype(q.dtype), v)

XLA runs that as written: the (batch, heads, t, s) scores and weights go through memory
several times, forward and backward. ``jax.nn.dot_product_attention`` computes the same
function fused (cuDNN's flash attention on a GPU), never writing them. ``find(jaxpr)``
recognizes the pattern: the scores' dot (4-D, or 5-D with queries reshaped to (batch, t,
heads, 1, head_dim)), then only scalings by constants, transposes, converts, a
constant mask (``where`` or ``select_n`` with a very negative fill, or an added bias of 0
and very negative entries), the softmax (as ``jax.nn.softmax`` traces: max, subtract, exp,
sum, divide, inline or in a ``custom_jvp`` or ``jit``), converts, and the weights' dot
with v, perhaps transposes and a reshape dropping the size-1 axis after it; each value read
by nothing else. The mask must be
none or causal (the lower triangle: query i sees keys 0..i). ``substituted(closed,
choose)`` traces the program again with each attention whose key ``choose`` gives an
implementation computed by ``fused`` (or, given ``LEFT_PLAIN``, bound exactly as traced in a
jit the rewrite leaves alone: ``untouched``); everything else as traced, jaxprs nested in jit,
scan, cond, while and remat bodies included (custom_jvp/vjp bodies are left as they are:
their rules would no longer match).

    >>> matches = find(jax.make_jaxpr(loss)(params, batch).jaxpr)
    >>> matches[0].key.describe()
    'attention 8x12x1024x1024x64 bfloat16 causal'
    >>> fused_source = substituted(closed, lambda match: "cudnn")

What runs where is decided per key by measurement (``jax_autotune.tuning.attention_decisions``;
``choice`` builds ``choose`` from the settings); ``jat.autotune`` applies it before it
differentiates, so the backward pass is the fused kernel's own.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal, Var

from jax_autotune.attention_key import AttentionKey
from jax_autotune.dtypes import is_floating
from jax_autotune.jaxprs import bind, map_jaxprs, readers

LEFT_PLAIN = "left_plain"  # what ``choose`` returns for an attention to run exactly as traced
UNTOUCHED = "jax_autotune_attention_as_traced"  # the name of the jit that holds such an attention
VERY_NEGATIVE = -1e4  # a mask's fill (or bias) at or below this hides the entry: exp() of it is 0
_CONST_MAX_ELEMENTS = 1 << 24  # constants evaluated while matching (a mask) stay below this
_FLATTENED = frozenset({"jit", "pjit", "custom_jvp_call", "closed_call"})  # bodies read inline
# nested jaxprs an attention may sit in, rewritten in turn (custom_jvp/vjp bodies are not)
_BODIES = {"jit": ("jaxpr",), "pjit": ("jaxpr",), "scan": ("jaxpr",), "while": ("body_jaxpr",),
           "cond": ("branches",), "remat2": ("jaxpr",), "checkpoint": ("jaxpr",),
           "closed_call": ("call_jaxpr",)}


@dataclasses.dataclass(frozen=True)
class Match:
    """One attention in a jaxpr: its equations (``members``, by index), its q, k and v
    (the atoms the scores' and the output's dots read) with the permutation of each to
    (batch, sequence, heads, head_dim), the scale, and its output (``output``, whose dims
    are ``out_perm`` of the fused (batch, t, heads, head_dim) result)."""

    members: tuple[int, ...]
    q: Any
    k: Any
    v: Any
    perms: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
    out_perm: tuple[int, ...]
    output: Var
    scale: float
    key: AttentionKey
    equations: tuple = ()  # the members' equations, in order
    constants: tuple = ()  # (atom, value) of every other value they read (a mask, a fill)

    @property
    def last(self) -> int:
        return self.members[-1]

    def written(self, q, k, v):
        """The attention as the program wrote it: its equations, bound on ``q, k, v`` (a
        constant a program broadcast, e.g. a mask, broadcast again in the trace)."""
        env = {atom: jnp.broadcast_to(_compact(value), np.shape(value)) for atom, value in self.constants}
        env.update({self.q: q, self.k: k, self.v: v})

        def read(atom):
            return atom.val if isinstance(atom, Literal) else env[atom]

        for eqn in self.equations:
            env.update(zip(eqn.outvars, bind(eqn, [read(a) for a in eqn.invars])))
        return env[self.output]


class _NoMatch(Exception):
    pass


# ---------------------------------------------------------------- what a value is, as the walk sees it

@dataclasses.dataclass(frozen=True, eq=False)
class _Scores:
    """``scale * (q . k)`` with the entries where ``keep`` is false hidden (None: none)."""

    scale: float
    keep: Any  # a bool array broadcast against (B, N, T, S), or None
    layout: tuple[str, ...] = ("b", "n", "t", "s")  # what each dim of the value is ("g": a size-1 group)
    origin: Any = None  # the scores' dot's output: the same scores, whatever their layout

    def same(self, other) -> bool:
        """The same values in the same layout (one may be the other transposed back)."""
        return self is other or (isinstance(other, _Scores) and other.origin is self.origin is not None
                                 and (other.scale, other.layout) == (self.scale, self.layout)
                                 and other.keep is self.keep)


@dataclasses.dataclass(frozen=True, eq=False)
class _Part:
    """A piece of the softmax of the scores: "max" (row max), "shifted" (scores - max),
    "exp", "sum" (row sum of exp), "probs" (exp / sum)."""

    stage: str
    scores: _Scores


@dataclasses.dataclass(frozen=True)
class _Const:
    value: np.ndarray


def find(jaxpr: Jaxpr, consts=()) -> list[Match]:
    """Every attention of ``jaxpr``'s own equations (not of nested jaxprs), in order; each
    equation joins at most one. ``consts``: the values of its constvars (a closed jaxpr's)."""
    uses = readers(jaxpr)
    outputs = {v for v in jaxpr.outvars if isinstance(v, Var)}
    consts = _Constants(jaxpr, consts)
    found, claimed = [], set()
    for index, eqn in enumerate(jaxpr.eqns):
        if eqn.primitive.name != "dot_general" or index in claimed:
            continue
        match = _read(jaxpr.eqns, index, uses, outputs, consts)
        if match is not None and not claimed.intersection(match.members):
            claimed.update(match.members)
            found.append(match)
    return found


def _read(eqns, index: int, uses, outputs, consts) -> Match | None:
    """The attention whose scores' product is ``eqns[index]``, the queries on its left or
    its right (the softmax's axis tells them apart); None where there is none."""
    for side in (0, 1):
        try:
            return _match(eqns, index, uses, outputs, consts, side)
        except Exception:  # noqa: BLE001 - not this pattern (_NoMatch), or one the walk cannot read
            continue
    return None


def _scores_dims(eqn, group_axis: int | None = None, side: int = 0):
    """(batch dims, free dim, contracting dim) of the scores' dot's queries and keys, or
    raise; ``side``: the queries' operand (0 lhs, 1 rhs); ``group_axis``: the queries'
    query-group axis, another free dim (the 5-D product of ``jax.nn.dot_product_attention``'s
    XLA implementation, heads split as (kv heads, group)).
    """
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lhs, rhs = (v.aval for v in eqn.invars)
    if side:
        (lc, rc), (lb, rb), (lhs, rhs) = (rc, lc), (rb, lb), (rhs, lhs)
    if len(lc) != 1 or len(rc) != 1 or len(lb) != 2 or len(rb) != 2 or lhs.ndim != 4 + (group_axis is not None) \
            or rhs.ndim != 4:
        raise _NoMatch("not a (batch, heads) batched product over one contracting dim")
    if lhs.dtype != rhs.dtype or not is_floating(lhs.dtype) or \
            not _fusable_precision(eqn.params.get("precision"), lhs.dtype):
        raise _NoMatch("operands of two dtypes, not floating, or a precision asked for")
    free_l = set(range(lhs.ndim)) - set(lb) - set(lc) - {group_axis}
    free_r = ({0, 1, 2, 3} - set(rb) - set(rc)).pop()
    if len(free_l) != 1:
        raise _NoMatch("the group axis is not a free dim of the queries")
    return (tuple(lb), free_l.pop(), lc[0]), (tuple(rb), free_r, rc[0])


# the dot algorithm a fused kernel computes for each input dtype (inputs as they are, f32 sums)
_FUSED_ALGORITHMS = {"bfloat16": "BF16_BF16_F32", "float16": "F16_F16_F32"}


def _fusable_precision(precision, dtype) -> bool:
    """None or DEFAULT on both sides, or the algorithm that multiplies ``dtype`` inputs as
    they are with float32 sums (``jax.nn.dot_product_attention``'s own): what a fused
    kernel computes (another precision or algorithm is a contract only XLA's dot keeps)."""
    if isinstance(precision, jax.lax.DotAlgorithmPreset):
        return precision.name == _FUSED_ALGORITHMS.get(np.dtype(dtype).name)
    return precision is None or (isinstance(precision, tuple)
                                 and all(p is None or p == jax.lax.Precision.DEFAULT for p in precision))


def _grouped_queries(eqns, head: int, uses, consts, side: int):
    """(the 4-D queries, the reshape's index, the group axis) where the scores' dot reads
    them reshaped to 5-D, their heads split as (kv heads, query group): a size-1 group
    axis anywhere, or the group axis right after the kv heads' (grouped-query attention,
    query head i reading kv head i // group, as ``jax.nn.dot_product_attention`` splits
    them), each read by that dot alone; None where it reads 4-D queries."""
    grouped = eqns[head].invars[side]
    if not isinstance(grouped, Var) or grouped.aval.ndim != 5:
        return None
    producer = consts.producer.get(grouped)
    if producer is None or producer.primitive.name != "reshape" or producer.params.get("dimensions") is not None \
            or uses.get(grouped) != [head] or not isinstance(producer.invars[0], Var):
        raise _NoMatch("5-D queries that are not 4-D ones reshaped")
    queries, shape = producer.invars[0], tuple(grouped.aval.shape)
    flat = tuple(queries.aval.shape)
    contracting, batch = (dims[side] for dims in eqns[head].params["dimension_numbers"])
    for axis in sorted(set(range(5)) - set(contracting) - set(batch)):  # the group axis is a free one
        size_one = shape[axis] == 1 and shape[:axis] + shape[axis + 1:] == flat
        split = axis >= 1 and axis - 1 == batch[1] and \
            shape[:axis - 1] + (shape[axis - 1] * shape[axis],) + shape[axis + 1:] == flat
        if size_one or split:
            index = next(i for i, e in enumerate(eqns) if e is producer)
            return queries, index, axis
    raise _NoMatch("5-D queries whose heads are not split as (kv heads, query group)")


def _match(eqns, head: int, uses, outputs, consts, side: int = 0) -> Match:
    """The attention whose scores' product is ``eqns[head]``, its queries the operand
    ``side`` (0 lhs, 1 rhs), or raise."""
    d1 = eqns[head]
    grouped = _grouped_queries(eqns, head, uses, consts, side)
    group_axis = grouped[2] if grouped else None
    # below, l* are the queries' dims, r* the keys'
    (lb, lfree, lc), (rb, rfree, rc) = _scores_dims(d1, group_axis, side)
    q, k = d1.invars[side], d1.invars[1 - side]
    head_dim = q.aval.shape[lc]
    # the scores' dims: batch dims, then the lhs's free dims in order, then the rhs's
    q_free = tuple("g" if axis == group_axis else "t" for axis in sorted({lfree, group_axis} - {None}))
    layout = ("b", "n", *q_free, "s") if side == 0 else ("b", "n", "s", *q_free)
    batch, heads, t, s = (d1.outvars[0].aval.shape[layout.index(label)] for label in "bnts")  # kv heads
    group = d1.outvars[0].aval.shape[layout.index("g")] if grouped else 1
    kinds: dict[Any, Any] = {d1.outvars[0]: _Scores(1.0, None, layout, d1.outvars[0])}
    members = [head]
    if grouped:
        q, members = grouped[0], [grouped[1], head]
        lb, lfree, lc = (tuple(a - (a > group_axis) for a in lb), lfree - (lfree > group_axis),
                         lc - (lc > group_axis))
    for index in range(head + 1, len(eqns)):
        eqn = eqns[index]
        tracked = [a for a in eqn.invars if isinstance(a, Var) and a in kinds]
        if not tracked:
            continue
        if eqn.primitive.name == "dot_general":
            d2 = _output_dot(eqn, kinds, (batch, heads, t, s))
            if d2 is None:
                raise _NoMatch("the scores meet another product")
            v, v_perm, labels, scores = d2
            members.append(index)
            out, labels = _output_of(eqns, eqn.outvars[0], labels, uses, outputs, members)
            out_perm = tuple("btnh".index(label) for label in labels)
            _check_closed(members, kinds, uses, outputs, out, eqns)
            causal = _causal(scores.keep, (batch, heads, t, s))
            key = AttentionKey(batch=batch, heads=heads * group, t=t, s=s, head_dim=head_dim,
                               dtype=np.dtype(q.aval.dtype).name, causal=causal, kv_heads=heads)
            perms = ((lb[0], lfree, lb[1], lc), (rb[0], rfree, rb[1], rc), v_perm)
            equations = tuple(eqns[i] for i in members)
            read = {a for e in equations for a in e.invars if isinstance(a, Var)} - set(kinds) - \
                {o for e in equations for o in e.outvars} - {q, k, v}
            constants = tuple((a, consts.value(a).value) for a in read)
            return Match(tuple(members), q, k, v, perms, out_perm, out, scores.scale, key, equations, constants)
        result = _step(eqn, kinds, consts)
        members.append(index)
        kinds[eqn.outvars[0]] = result
    raise _NoMatch("no product with v after the softmax")


def _check_closed(members, kinds, uses, outputs, out, eqns) -> None:
    """Nothing outside the members reads a value of the attention but its output."""
    inside = set(members)
    for var in kinds:
        if var is out:
            continue
        if var in outputs or any(u not in inside for u in uses.get(var, ())):
            raise _NoMatch("a value of the attention is read elsewhere")
    for index in members[:-1]:
        for var in eqns[index].outvars:
            if var is not out and var in outputs:
                raise _NoMatch("a value of the attention is an output")


def _output_dot(eqn, kinds, shape):
    """(v, v's permutation to (batch, s, heads, head_dim), the labels of this dot's output
    dims ("b", "t", "n", "h", "g"), the scores) where ``eqn`` is probs . v (either order)."""
    batch, heads, t, s = shape
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lhs, rhs = eqn.invars
    probs_left = isinstance(lhs, Var) and isinstance(kinds.get(lhs), _Part) and kinds[lhs].stage == "probs"
    probs_right = isinstance(rhs, Var) and isinstance(kinds.get(rhs), _Part) and kinds[rhs].stage == "probs"
    if probs_left == probs_right:
        return None
    p_dims, v_dims = ((lc, lb), (rc, rb)) if probs_left else ((rc, rb), (lc, lb))
    v = rhs if probs_left else lhs
    (pc, pb), (vc, vb) = p_dims, v_dims
    layout = kinds[lhs if probs_left else rhs].scores.layout
    if tuple(pc) != (layout.index("s"),) or tuple(pb) != (layout.index("b"), layout.index("n")) or \
            len(vc) != 1 or len(vb) != 2 or v.aval.ndim != 4:
        return None
    if not isinstance(v, (Var, Literal)) or v.aval.dtype != eqn.invars[0].aval.dtype or \
            eqn.invars[0].aval.dtype != eqn.invars[1].aval.dtype or \
            not _fusable_precision(eqn.params.get("precision"), v.aval.dtype):
        return None
    v_free = ({0, 1, 2, 3} - set(vb) - set(vc)).pop()
    v_perm = (vb[0], vc[0], vb[1], v_free)
    if tuple(v.aval.shape[d] for d in v_perm[:3]) != (batch, s, heads):
        return None
    # the dot's output: batch dims (B, N), then lhs free, then rhs free
    probs_free = [label for label in layout if label not in "bns"]
    labels = ["b", "n", *probs_free, "h"] if probs_left else ["b", "n", "h", *probs_free]
    scores = kinds[lhs if probs_left else rhs].scores
    return v, v_perm, labels, scores


def _output_of(eqns, out, labels, uses, outputs, members):
    """The attention's output: the product with v, then any transposes and a reshape that
    drops a size-1 group axis or merges the kv heads' axis with the group axis right after
    it (the query heads, as the queries were split), each read by the next alone (added to
    ``members``); with the labels of its dims."""
    while len(after := uses.get(out, [])) == 1 and out not in outputs:
        eqn = eqns[after[0]]
        if eqn.primitive.name == "transpose":
            labels = [labels[p] for p in eqn.params["permutation"]]
        elif eqn.primitive.name == "reshape" and "g" in labels and eqn.params.get("dimensions") is None and \
                tuple(eqn.outvars[0].aval.shape) == _heads_merged(out.aval.shape, labels):
            labels = [label for label in labels if label != "g"]
        else:
            break
        members.append(after[0])
        out = eqn.outvars[0]
    if "g" in labels:
        raise _NoMatch("the query-group axis stays in the output")
    return out, labels


def _heads_merged(shape, labels) -> tuple[int, ...] | None:
    """``shape`` with its group axis ("g") merged into the kv heads' ("n") right before it,
    or dropped where it has size 1; None where neither is a reshape of the query heads."""
    g = labels.index("g")
    if shape[g] == 1:
        return tuple(n for n, label in zip(shape, labels) if label != "g")
    if g >= 1 and labels[g - 1] == "n":
        return tuple(shape[:g - 1]) + (shape[g - 1] * shape[g],) + tuple(shape[g + 1:])
    return None


def _step(eqn, kinds, consts):
    """What ``eqn`` makes of the attention's values it reads; raise where it is not a step
    of the pattern."""
    name = eqn.primitive.name
    if name in _FLATTENED:
        return _flattened(eqn, kinds, consts)
    args = [kinds.get(a) if isinstance(a, Var) and a in kinds else consts.value(a) for a in eqn.invars]
    if any(a is None for a in args):
        raise _NoMatch(f"{name} reads a value that is not constant")
    return _transition(name, eqn.params, args, tuple(eqn.outvars[0].aval.shape), _shapes(eqn))


def _flattened(eqn, kinds, consts):
    """A jit, closed_call or custom_jvp body read inline (``jnp.where``, ``jax.nn.softmax``)."""
    param = "call_jaxpr" if eqn.primitive.name in ("custom_jvp_call", "closed_call") else "jaxpr"
    closed = eqn.params[param]
    body = closed.jaxpr if isinstance(closed, ClosedJaxpr) else closed
    if len(body.outvars) != 1 or body.effects:
        raise _NoMatch("a nested body with several results or effects")
    inner: dict[Any, Any] = {}
    for var, atom in zip(body.invars, eqn.invars):
        if isinstance(atom, Var) and atom in kinds:
            inner[var] = kinds[atom]
        else:
            value = consts.value(atom)
            if value is None:
                raise _NoMatch("a nested body reads a value that is not constant")
            inner[var] = value
    for var, value in zip(body.constvars, getattr(closed, "consts", ())):
        inner[var] = _Const(np.asarray(value))
    for sub in body.eqns:
        args = []
        for a in sub.invars:
            if isinstance(a, Literal):
                args.append(_Const(np.asarray(a.val)))
            elif a in inner:
                args.append(inner[a])
            else:
                raise _NoMatch("a nested body reads an unknown value")
        if all(isinstance(a, _Const) for a in args):
            inner[sub.outvars[0]] = consts.evaluate(sub, [a.value for a in args])
        elif sub.primitive.name in _FLATTENED:
            raise _NoMatch("a body nested twice")
        else:
            inner[sub.outvars[0]] = _transition(sub.primitive.name, sub.params, args,
                                                tuple(sub.outvars[0].aval.shape), _shapes(sub))
    out = body.outvars[0]
    result = inner.get(out) if isinstance(out, Var) else None
    if result is None or isinstance(result, _Const):
        raise _NoMatch("a nested body that does not carry the attention")
    return result


def _shapes(eqn) -> list[tuple[int, ...]]:
    return [tuple(np.shape(a.val)) if isinstance(a, Literal) else tuple(a.aval.shape) for a in eqn.invars]


def _transition(name: str, params, args, out_shape, in_shapes):
    """The pattern's one step: ``name`` applied to ``args`` (kinds and constants, of
    ``in_shapes``); a step that keeps the scores keeps their shape (a mask or bias that
    broadcasts them is another computation)."""
    result = _step_of(name, params, args, out_shape, in_shapes)
    if isinstance(result, _Scores) and name != "transpose" and any(
            isinstance(a, _Scores) and shape != out_shape for a, shape in zip(args, in_shapes)):
        raise _NoMatch(f"{name} broadcasts the scores")
    return result


def _row_shape(shape, scores_shape) -> bool:
    """A row max or sum shaped to meet the scores: their shape with the keys' (last) axis 1."""
    return tuple(shape) == tuple(scores_shape[:-1]) + (1,)


def _step_of(name: str, params, args, out_shape, in_shapes):
    kinds = [a for a in args if not isinstance(a, _Const)]
    if name in ("mul", "div") and len(args) == 2 and isinstance(args[0], _Scores) and isinstance(args[1], _Const):
        factor = _scalar(args[1])
        if factor is None or factor == 0 or not math.isfinite(factor):
            raise _NoMatch("a scaling by a value that is not a finite non-zero scalar")
        scores = args[0]
        if scores.keep is not None:  # it would scale the mask's fill too, which might then not hide
            raise _NoMatch("a scaling after the mask")
        return dataclasses.replace(scores, scale=scores.scale * (factor if name == "mul" else 1.0 / factor))
    if name == "mul" and len(args) == 2 and isinstance(args[1], _Scores) and isinstance(args[0], _Const):
        return _step_of("mul", params, [args[1], args[0]], out_shape, in_shapes[::-1])
    if name == "convert_element_type" and len(args) == 1:
        if not is_floating(params["new_dtype"]):
            raise _NoMatch("a convert to a type that is not floating")
        return args[0]
    if name == "stop_gradient" and len(args) == 1 and isinstance(args[0], _Part) and args[0].stage == "max":
        return args[0]
    if name == "transpose" and len(args) == 1 and isinstance(args[0], _Scores):
        scores = args[0]
        return dataclasses.replace(scores, layout=tuple(scores.layout[p] for p in params["permutation"]))
    if name == "transpose" and len(args) == 1 and isinstance(args[0], _Part) and args[0].stage in ("max", "sum") \
            and args[0].scores.layout[-1] == "s" and len(params["permutation"]) == len(args[0].scores.layout) - 1:
        # a row max or sum (the scores' dims but the keys'), moved as its scores will be
        scores = args[0].scores
        layout = tuple(scores.layout[p] for p in params["permutation"]) + ("s",)
        return _Part(args[0].stage, dataclasses.replace(scores, layout=layout))
    if name == "select_n" and len(args) == 3 and isinstance(args[0], _Const) and len(kinds) == 1:
        return _masked(args, out_shape)
    if name in ("add", "add_any") and len(args) == 2 and len(kinds) == 1 and isinstance(kinds[0], _Scores):
        bias = args[1] if isinstance(args[1], _Const) else args[0]
        return _biased(kinds[0], bias.value, out_shape)
    if name == "sub" and len(args) == 2 and isinstance(args[0], _Scores) and isinstance(args[1], _Part) \
            and args[1].stage == "max" and args[1].scores.same(args[0]) and _row_shape(in_shapes[1], in_shapes[0]):
        return _Part("shifted", args[0])
    if name == "div" and len(args) == 2 and isinstance(args[0], _Part) and args[0].stage == "exp" \
            and isinstance(args[1], _Part) and args[1].stage == "sum" and args[1].scores.same(args[0].scores) \
            and _row_shape(in_shapes[1], in_shapes[0]):
        return _Part("probs", args[0].scores)
    if len(kinds) != 1 or not isinstance(kinds[0], (_Scores, _Part)):
        raise _NoMatch(f"{name} of the attention's values")
    value = kinds[0]
    scores = value if isinstance(value, _Scores) else value.scores
    stage = value.stage if isinstance(value, _Part) else "scores"
    if name == "reduce_max" and stage == "scores" and tuple(params["axes"]) == (len(out_shape),) == \
            (scores.layout.index("s"),):
        return _Part("max", scores)
    if name == "max" and stage == "max" and _is_minus_inf(args):
        return value
    if name in ("broadcast_in_dim", "reshape") and stage in ("max", "sum") and \
            out_shape == in_shapes[0] + (1,) and tuple(params.get("broadcast_dimensions", range(len(out_shape) - 1))) \
            == tuple(range(len(out_shape) - 1)) and params.get("dimensions") is None:
        return value  # a row max or sum given the keys' axis back, of size 1
    if name == "exp" and stage == "shifted":
        return _Part("exp", scores)
    if name == "reduce_sum" and stage == "exp" and tuple(params["axes"]) == (len(out_shape),):
        return _Part("sum", scores)
    if name == "convert_element_type" and stage == "probs":
        return value
    raise _NoMatch(f"{name} is not a step of softmax attention here")


def _is_minus_inf(args) -> bool:
    return any(isinstance(a, _Const) and a.value.size == 1 and np.isneginf(float(a.value.reshape(()))) for a in args)


def _scalar(const: _Const) -> float | None:
    value = np.asarray(const.value)
    if value.size != 1:
        return None
    return float(value.astype(np.float64).reshape(()))


def _masked(args, out_shape):
    """``select_n(pred, a, b)``: b where pred, else a; one of them the scores, the other a
    very negative fill."""
    pred, cases = _compact(args[0].value), args[1:]
    if pred.dtype != np.bool_:
        raise _NoMatch("a select on a predicate that is not boolean")
    shown = 1 if isinstance(cases[1], _Scores) else 0
    scores, fill = cases[shown], cases[1 - shown]
    if not isinstance(scores, _Scores) or not isinstance(fill, _Const) or \
            not np.all(_compact(fill.value) <= VERY_NEGATIVE):
        raise _NoMatch("a select that is not a mask with a very negative fill")
    keep = pred if shown == 1 else ~pred
    return _with_keep(scores, keep, out_shape)


def _biased(scores: _Scores, bias: np.ndarray, out_shape):
    """Scores plus a bias of 0 (kept) and very negative entries (hidden): a mask."""
    bias = _compact(bias).astype(np.float64)
    if not np.all((bias == 0) | (bias <= VERY_NEGATIVE)):
        raise _NoMatch("an added bias that is not a mask")
    return _with_keep(scores, bias == 0, out_shape)


def _with_keep(scores: _Scores, keep, out_shape) -> _Scores:
    """The scores with ``keep`` and any mask they had before: the entries both keep (a
    compact array that broadcasts to ``out_shape``)."""
    keep = _compact(np.asarray(keep, bool))
    try:
        keep = np.broadcast_to(keep, np.broadcast_shapes(keep.shape, tuple(1 for _ in out_shape)))
        np.broadcast_shapes(keep.shape, out_shape)
    except ValueError as err:
        raise _NoMatch("a mask of another shape than the scores") from err
    # in (B, N, T, S) order (N: kv heads), the group axis dropped: one mask for every query
    # head of a group (else another computation)
    keep = np.transpose(keep, [scores.layout.index(label) for label in "bnts"] +
                        [axis for axis, label in enumerate(scores.layout) if label == "g"])
    if keep.ndim == 5:
        keep = _compact(keep)
        if keep.shape[4] > 1 and not np.array_equal(keep, np.broadcast_to(keep[..., :1], keep.shape)):
            raise _NoMatch("a mask that differs between the query heads of a group")
        keep = keep[..., 0]
    if scores.keep is not None:
        keep = keep & scores.keep
    return dataclasses.replace(scores, keep=keep)


def _causal(keep, shape) -> bool:
    """False where nothing is hidden; True where exactly the upper triangle is (query i
    sees keys 0..i); raise for any other mask."""
    if keep is None or np.all(keep):
        return False
    batch, heads, t, s = shape
    keep = np.broadcast_to(keep, np.broadcast_shapes(keep.shape, (1, 1, t, s)))  # the (t, s) dims whole
    if t == s and np.array_equal(keep, np.broadcast_to(np.tril(np.ones((t, s), bool)), keep.shape)):
        return True
    raise _NoMatch("a mask that is neither none nor causal")


class _Constants:
    """The values of a jaxpr known without its inputs (literals, consts, and what equations
    compute from them alone: a mask built from iota), evaluated on demand, small ones only."""

    def __init__(self, jaxpr: Jaxpr, consts=()):
        self.producer = {v: eqn for eqn in jaxpr.eqns for v in eqn.outvars}
        self.known: dict[Any, Any] = {}
        for var, value in zip(jaxpr.constvars, consts):
            try:
                if np.size(value) <= _CONST_MAX_ELEMENTS:
                    self.known[var] = _Const(np.asarray(value))
            except (TypeError, ValueError):  # a value numpy cannot hold (a typed PRNG key): unknown
                continue
        self.invars = set(jaxpr.invars) | set(jaxpr.constvars)

    def value(self, atom) -> _Const | None:
        if isinstance(atom, Literal):
            return _Const(np.asarray(atom.val))
        if atom in self.known:
            return self.known[atom]
        found = None
        eqn = self.producer.get(atom)
        if eqn is not None and atom not in self.invars and not eqn.effects and len(eqn.outvars) == 1:
            args = [self.value(a) for a in eqn.invars]
            if all(a is not None for a in args):
                found = self.evaluate(eqn, [a.value for a in args])
        self.known[atom] = found
        return found

    @staticmethod
    def evaluate(eqn, values) -> _Const:
        """``eqn`` on constant ``values``: a broadcast or transpose as a numpy view, an
        elementwise op by JAX on the operands' compact forms (their broadcast copies never
        read), anything else by JAX, up to ``_CONST_MAX_ELEMENTS``."""
        name, shape = eqn.primitive.name, tuple(eqn.outvars[0].aval.shape)
        if name in _VIEWS and len(values) == 1:
            return _Const(_VIEWS[name](np.asarray(values[0]), eqn.params))
        if name in _ELEMENTWISE:
            compact = [_compact(v) for v in values]
            common = np.broadcast_shapes(*(c.shape for c in compact))
            if math.prod(common) > _CONST_MAX_ELEMENTS:
                raise _NoMatch(f"a constant {name} too large to evaluate")
            out = _Constants._bound(eqn, [np.broadcast_to(c, common) for c in compact])
            return _Const(np.broadcast_to(out.value, shape))
        if math.prod(shape) > _CONST_MAX_ELEMENTS:
            raise _NoMatch(f"a constant {name} too large to evaluate")
        return _Constants._bound(eqn, values)

    @staticmethod
    def _bound(eqn, values) -> _Const:
        try:
            with jax.ensure_compile_time_eval():
                (out, *_) = bind(eqn, values)
            return _Const(np.asarray(out))
        except Exception as err:  # noqa: BLE001 - a constant this walk cannot evaluate: no match
            raise _NoMatch(f"cannot evaluate {eqn.primitive.name}: {err}") from err


def _broadcast(value: np.ndarray, params) -> np.ndarray:
    """``broadcast_in_dim`` of a constant as a read-only numpy view: a mask broadcast to
    the scores' (batch, heads, t, s) is never materialized (GPT-2's: 100M entries a layer)."""
    shape, dims = tuple(params["shape"]), tuple(params["broadcast_dimensions"])
    expanded = [value.shape[dims.index(axis)] if axis in dims else 1 for axis in range(len(shape))]
    return np.broadcast_to(value.reshape(expanded), shape)


# constants read as numpy views, whatever their size (a mask a program broadcasts to the
# scores' shape), and the elementwise ops evaluated on their operands' compact forms
_VIEWS = {"broadcast_in_dim": _broadcast,
          "transpose": lambda value, params: np.transpose(value, params["permutation"])}
_ELEMENTWISE = frozenset({"convert_element_type", "and", "or", "not", "eq", "ne", "lt", "le", "gt", "ge"})


def _compact(value) -> np.ndarray:
    """``value`` with each broadcast axis (stride 0) cut to length 1: the same array under
    broadcasting, without reading its copies."""
    value = np.asarray(value)
    return value[tuple(slice(0, 1) if stride == 0 and size > 1 else slice(None)
                       for stride, size in zip(value.strides, value.shape))]


# ---------------------------------------------------------------- the fused attention

def fused(match: Match, q, k, v, implementation: str):
    """The attention ``match`` found, computed by ``jax.nn.dot_product_attention`` with
    ``implementation`` ("cudnn", "xla"), in the dims and dtype of its output."""
    qs, ks, vs = (jnp.transpose(x, perm) for x, perm in zip((q, k, v), match.perms))
    out = jax.nn.dot_product_attention(qs, ks, vs, scale=match.scale, is_causal=match.key.causal,
                                       implementation=implementation)
    return jnp.transpose(out, match.out_perm).astype(match.output.aval.dtype)


def untouched(match: Match, q, k, v):
    """The attention as the program wrote it, in a jit named ``UNTOUCHED``, which
    ``jat.autotune``'s rewrite binds as traced: its dots stay lax's (an attention the
    program check left plain runs as the user wrote it)."""
    def as_traced(q, k, v):
        return match.written(q, k, v)

    as_traced.__name__ = as_traced.__qualname__ = UNTOUCHED
    return jax.jit(as_traced)(q, k, v)


def substituted(closed: ClosedJaxpr, choose: Callable[[Match], str | None]) -> ClosedJaxpr:
    """``closed`` traced again with each attention for which ``choose`` gives an
    implementation computed fused; the same object where none is (in it or in its bodies)."""
    changed = []
    new = jax.make_jaxpr(functools.partial(_evaluate, closed, choose, changed))(*closed.in_avals)
    return new if changed else closed


def _evaluate(closed: ClosedJaxpr, choose, changed: list, *args):
    jaxpr = closed.jaxpr
    env = dict(zip(jaxpr.constvars, closed.consts))
    env.update(zip(jaxpr.invars, args))

    def read(atom):
        return atom.val if isinstance(atom, Literal) else env[atom]

    chosen = {}
    for match in find(jaxpr, closed.consts):
        implementation = choose(match)
        if implementation is not None:
            chosen[match.last] = (match, implementation)
    skipped = {i for match, _ in chosen.values() for i in match.members[:-1]}
    for index, eqn in enumerate(jaxpr.eqns):
        if index in chosen:
            match, implementation = chosen[index]
            q, k, v = read(match.q), read(match.k), read(match.v)
            env[match.output] = (untouched(match, q, k, v) if implementation == LEFT_PLAIN
                                 else fused(match, q, k, v, implementation))
            changed.append(match)
            continue
        if index in skipped:
            continue
        params = eqn.params
        if eqn.primitive.name in _BODIES:
            params = {name: map_jaxprs(value, functools.partial(_body, choose, changed))
                      if name in _BODIES[eqn.primitive.name] else value for name, value in params.items()}
        env.update(zip(eqn.outvars, bind(eqn, [read(a) for a in eqn.invars], params)))
    return [read(v) for v in jaxpr.outvars]


def _body(choose, changed: list, jaxpr):
    """A nested body with its attentions substituted (an open one only where that adds no
    constants, which an open jaxpr cannot hold)."""
    closed = jaxpr if isinstance(jaxpr, ClosedJaxpr) else ClosedJaxpr(jaxpr, ())
    new = substituted(closed, choose)
    if new is closed or (not isinstance(jaxpr, ClosedJaxpr) and new.consts):
        return jaxpr
    changed.append(new)
    return new if isinstance(jaxpr, ClosedJaxpr) else new.jaxpr


__all__ = ["LEFT_PLAIN", "Match", "UNTOUCHED", "VERY_NEGATIVE", "find", "fused", "substituted", "untouched"]
