"""A matmul's context in a jaxpr: the equations after a dot that form its epilogue.

``regions(jaxpr, heads)`` finds, for each dot equation it is given, the largest run of
equations after it that consume its result and nothing else needs: elementwise ops (bias,
residual, activation, convert, ...), shape-only ops, reductions over the dot's free rhs
dims or over everything, and the small jitted helpers around them (``jax.nn.silu``) and
``jax.nn.relu``. Exactly one value of the run may be read afterwards, its output, and the
run does not end with a convert to a wider dtype (XLA fuses that into the value's readers;
``_widens``); every other input is an *operand*, classified by how it broadcasts against
the product (see ``jax_autotune.epilogue``). The run's equations become one tuned op that owns the dot and
its epilogue (``Region``), so a kernel is chosen for the program the model runs.

    >>> found = regions(closed.jaxpr, {i: "bmn"[...] for i in dot_equations})
    >>> found[i].epilogue.describe()
    'add(y,row) > add(full)'

Each equation joins at most one region (the first dot's that reaches it). A dot whose
result escapes at once (read twice, by an unsupported op, or as an output) has no region.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np
from jax.extend.core import DropVar, Literal, Var

from jax_autotune.dtypes import is_floating, is_integer
from jax_autotune.epilogue import BARE as BARE_EPILOGUE
from jax_autotune.jaxprs import readers
from jax_autotune.epilogue import ELEMENTWISE_ARITY, MAX_OPS, REDUCTIONS, Epilogue, Op, Operand

# jaxpr primitive name -> epilogue op name, for the elementwise ops taken as they are
_ELEMENTWISE = {name: name for name in ELEMENTWISE_ARITY if name != "relu"}
_ELEMENTWISE["add_any"] = "add"
_COMMUTATIVE = frozenset({"add", "mul", "max", "min", "eq", "ne"})
_SHAPE_OPS = frozenset({"reshape", "broadcast_in_dim", "squeeze", "expand_dims"})
_JIT = frozenset({"jit", "pjit"})
_FLOAT_LITERAL = re.compile(r"^-?(inf|nan|\d[\d.e+-]*):b?float\w*$")


@dataclasses.dataclass(frozen=True)
class OperandUse:
    """An operand of a region: the atom the jaxpr reads, its role, and the shape and dim
    labels (b, m, n or 1) of the value it broadcasts against, to canonicalise it."""

    atom: Any
    role: str
    against: tuple[int, ...]
    labels: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Region:
    """A dot equation and the equations of its epilogue (``members``, in order), the value
    they produce (``output``), the epilogue and its operands; ``swap``: the first member is
    a transpose that swaps the product's m and n dims, taken as the dot of (rhs, lhs)."""

    head: int
    members: tuple[int, ...]
    output: Var
    epilogue: Epilogue
    operands: tuple[OperandUse, ...]
    swap: bool = False  # a transpose after the dot: run the dot with lhs and rhs swapped
    literals: bool = False  # the epilogue holds float literals by value

    @property
    def last(self) -> int:
        return self.members[-1]


@dataclasses.dataclass
class _Value:
    ref: str  # "y", "%i"
    shape: tuple[int, ...]
    kind: str  # full | reduced | total


class _Unsupported(Exception):
    pass


def dot_labels(dimension_numbers, lhs_ndim: int, rhs_ndim: int) -> str:
    """b, m or n per dim of a dot_general's result: batch dims, then lhs and rhs free dims."""
    (lc, rc), (lb, rb) = dimension_numbers
    free_lhs = lhs_ndim - len(lc) - len(lb)
    free_rhs = rhs_ndim - len(rc) - len(rb)
    return "b" * len(lb) + "m" * free_lhs + "n" * free_rhs


def regions(jaxpr, heads: dict[int, str],
            keeps_values: Callable[[Epilogue], bool] | None = None) -> dict[int, Region]:
    """The region of each head (equation index -> labels of its result's dims) that has an
    epilogue; heads without one are left out.

    ``keeps_values``: None keeps every literal's value in the epilogue (``0.5:float32``);
    otherwise a float literal is a scalar operand (its dtype and role in the key, its value
    read at run time, so a new hyperparameter value is the same key), except in an epilogue
    for which ``keeps_values`` (given the epilogue with its values) is true: one a kernel
    takes by those values, as cuBLASLt takes ``jax.nn.gelu``'s constants."""
    uses = readers(jaxpr)
    outputs = {v for v in jaxpr.outvars if isinstance(v, Var)}
    claimed: set[int] = set()
    found = {}
    for head, labels in sorted(heads.items()):
        region = _grow(jaxpr.eqns, head, labels, uses, outputs, claimed, False)
        if (region is not None and keeps_values is not None and region.literals
                and not keeps_values(region.epilogue)):
            region = _grow(jaxpr.eqns, head, labels, uses, outputs, claimed, True)
        if region is not None:
            claimed.update(region.members)
            found[head] = region
    return found


def _grow(eqns, head: int, labels: str, uses, outputs, claimed, literal_operands: bool) -> Region | None:
    y = eqns[head].outvars[0]
    if y in outputs:
        return None
    first, swap = head, False
    readers = uses.get(y, [])
    if len(readers) == 1 and _swaps_groups(eqns[readers[0]], labels) and readers[0] not in claimed:
        # dot then transpose (a weight gradient): the dot with its operands swapped
        first, swap = readers[0], True
        y = eqns[first].outvars[0]
        labels = "b" * labels.count("b") + "m" * labels.count("n") + "n" * labels.count("m")
    shape = tuple(y.aval.shape)
    if len(labels) != len(shape) or not _general(shape, labels):
        return None
    builder = _Builder(shape, labels, literal_operands)
    values: dict[Any, _Value] = {y: _Value("y", shape, "full")}
    members: list[tuple[int, int, int, int]] = []  # (eqn index, ops, operands, values) before it
    for index in range(first + 1, len(eqns)):
        eqn = eqns[index]
        if not any(isinstance(a, Var) and a in values for a in eqn.invars):
            continue
        if index in claimed or eqn.effects:
            break
        mark = (len(builder.ops), len(builder.operands), len(values))
        try:
            if all(isinstance(v, DropVar) for v in eqn.outvars):
                produced = {}  # read by nothing: it needs no op
            else:
                produced = {eqn.outvars[0]: builder.translate(eqn, values)}
        except _Unsupported:
            builder.truncate(*mark[:2])
            break
        if len(builder.ops) > MAX_OPS:
            builder.truncate(*mark[:2])
            break
        values.update(produced)
        members.append((index, *mark))
    # keep the longest run whose only value read afterwards is its last one, and whose last
    # op does not widen it (see _widens)
    inside = {head, first, *(m[0] for m in members)}
    while members:
        last = eqns[members[-1][0]].outvars[0]
        escaping = {v for v in values if v in outputs or any(u not in inside for u in uses.get(v, ()))}
        if (not isinstance(last, DropVar) and escaping <= {last} and values[last].ref != "y"
                and not _widens(eqns[members[-1][0]])):
            break
        index, ops, operands, known = members.pop()
        inside.discard(index)
        builder.truncate(ops, operands)
        values = dict(list(values.items())[:known])
    if not members:  # a swapped dot alone still saves the transpose
        return Region(head, (first,), y, BARE_EPILOGUE, (), True) if swap else None
    output = eqns[members[-1][0]].outvars[0]
    if values[output].ref != f"%{len(builder.ops) - 1}":  # an alias of an earlier value
        return None
    epilogue = Epilogue(tuple(u[0] for u in builder.operands), tuple(builder.ops))
    return Region(head, (first,) * swap + tuple(m[0] for m in members), output, epilogue,
                  tuple(u[1] for u in builder.operands), swap,
                  any(_FLOAT_LITERAL.match(a) for op in builder.ops for a in op.args))


def _widens(eqn) -> bool:
    """A convert to a wider dtype (bf16 -> f32). A region does not end with one: left out,
    XLA fuses it into the ops that read the value (a loss reads bf16 logits and widens them
    in registers); kept, the tuned kernel writes the wide value, twice the bytes, and its
    readers read them twice over (a vocabulary head's f32 logits)."""
    if eqn.primitive.name != "convert_element_type":
        return False
    (source,), (out,) = eqn.invars, eqn.outvars
    return np.dtype(out.aval.dtype).itemsize > np.dtype(source.aval.dtype).itemsize


def _swaps_groups(eqn, labels: str) -> bool:
    """A transpose that keeps the batch dims and puts the rhs free dims before the lhs ones."""
    if eqn.primitive.name != "transpose":
        return False
    b, m, n = labels.count("b"), labels.count("m"), labels.count("n")
    want = (*range(b), *range(b + m, b + m + n), *range(b, b + m))
    return tuple(eqn.params["permutation"]) == want and m > 0 and n > 0


def _general(shape, labels) -> bool:
    """m > 1 and n > 1: a product whose reductions are unambiguous (not a vector kind)."""
    m = math.prod(d for d, l in zip(shape, labels) if l == "m")
    n = math.prod(d for d, l in zip(shape, labels) if l == "n")
    return m > 1 and n > 1


class _Builder:
    """The epilogue's ops and operands as a region grows; equation by equation."""

    def __init__(self, shape, labels, literal_operands: bool = False):
        self.literal_operands = literal_operands  # float literals as scalar operands
        self.full = tuple(shape)
        self.labels = tuple(labels)
        self.reduced = tuple(d for d, l in zip(shape, labels) if l != "n")
        self.reduced_labels = tuple(l for l in labels if l != "n")
        self.ops: list[Op] = []
        self.operands: list[tuple[Operand, OperandUse]] = []

    def truncate(self, ops: int, operands: int) -> None:
        del self.ops[ops:], self.operands[operands:]

    # ---------------------------------------------------------------- classes of shapes
    def kind(self, shape) -> str:
        shape = tuple(shape)
        if shape == self.full:
            return "full"
        if shape == self.reduced or shape == tuple(1 if l == "n" else d for d, l in zip(self.full, self.labels)):
            return "reduced"
        if all(d == 1 for d in shape):
            return "total"
        raise _Unsupported(f"shape {shape} is not the product's {self.full}, reduced or total")

    def labels_of(self, shape) -> tuple[str, ...]:
        kind = self.kind(shape)
        if kind == "full" or len(shape) == len(self.full):
            return self.labels
        if kind == "reduced":
            return self.reduced_labels
        return ("1",) * len(shape)

    # ---------------------------------------------------------------- translation
    def translate(self, eqn, values) -> _Value:
        name = eqn.primitive.name
        if name in _SHAPE_OPS:
            return self._shape_op(eqn, values)
        if name == "custom_jvp_call" and _is_relu(eqn):
            return self._elementwise("relu", (), [eqn.invars[0]], eqn.outvars[0].aval, values)
        if name in _JIT:
            return self._inline(eqn, values)
        if name in REDUCTIONS:
            return self._reduction(eqn, values)
        if name in _ELEMENTWISE:
            return self._elementwise(_ELEMENTWISE[name], _params(name, eqn.params), eqn.invars,
                                     eqn.outvars[0].aval, values)
        raise _Unsupported(name)

    @property
    def totalled(self) -> bool:
        """A reduction over everything happened: what follows is a scalar's tail (a loss's
        mean and convert), not the product's epilogue."""
        return any(op.name in REDUCTIONS and op.params == (("axes", "all"),) for op in self.ops)

    def _elementwise(self, name, params, atoms, aval, values) -> _Value:
        shape = tuple(aval.shape)
        kind = self.kind(shape)
        if self.totalled and kind != "total":
            raise _Unsupported("a full value after the reduction over everything")
        args = [self._arg(atom, shape, values) for atom in atoms]
        if name in _COMMUTATIVE and len(args) == 2 and _rank(args[1]) < _rank(args[0]):
            args.reverse()  # y first, then %, then operands and literals
        self.ops.append(Op(name, tuple(args), params))
        return _Value(f"%{len(self.ops) - 1}", shape, kind)

    def _arg(self, atom, shape, values) -> str:
        if isinstance(atom, Literal):
            if self.literal_operands and is_floating(atom.aval.dtype) and atom.aval.shape == ():
                return self._operand(atom, shape)
            return _literal(atom)
        if atom in values:
            return values[atom].ref
        return self._operand(atom, shape)

    def _operand(self, atom, against) -> str:
        x = tuple(atom.aval.shape)
        dtype = np.dtype(atom.aval.dtype).name
        labels = self.labels_of(against)
        if x == ():
            role = "scalar"
        elif len(x) != len(against) or any(d not in (1, a) for d, a in zip(x, against)):
            raise _Unsupported(f"operand of shape {x} against {against}")
        else:
            varying = {l for d, a, l in zip(x, against, labels) if d > 1 and a > 1}
            role = ("scalar" if not varying else "row" if varying == {"n"}
                    else "col" if "n" not in varying else "full")
        use = OperandUse(atom, role, tuple(against), labels)
        for j, (_, known) in enumerate(self.operands):  # the same value read twice: one operand
            if known.atom is atom and known.role == role:
                return f"${j}"
        self.operands.append((Operand(role, dtype), use))
        return f"${len(self.operands) - 1}"

    def _reduction(self, eqn, values) -> _Value:
        (atom,) = eqn.invars
        if not isinstance(atom, Var) or atom not in values or not _unsharded(eqn.params.get("out_sharding")):
            raise _Unsupported("reduction")
        source = values[atom]
        axes = set(eqn.params["axes"])
        shape = tuple(eqn.outvars[0].aval.shape)
        if axes == set(range(len(source.shape))):
            which = "all"
        elif source.kind == "full" and axes == {d for d, l in enumerate(self.labels) if l == "n"} \
                and shape == self.reduced:
            which = "n"
        else:
            raise _Unsupported(f"reduction over {sorted(axes)}")
        self.ops.append(Op(eqn.primitive.name, (source.ref,), (("axes", which),)))
        return _Value(f"%{len(self.ops) - 1}", shape, "reduced" if which == "n" else "total")

    def _shape_op(self, eqn, values) -> _Value:
        atom = eqn.invars[0]
        if not isinstance(atom, Var) or atom not in values or not _unsharded(eqn.params.get("sharding")):
            raise _Unsupported("shape op")
        source = values[atom]
        shape = tuple(eqn.outvars[0].aval.shape)
        kind = self.kind(shape)
        if kind == source.kind and _squeezed(shape) == _squeezed(source.shape):
            return _Value(source.ref, shape, kind)  # an alias: the canonical value is the same
        lifts = (kind == "full" and source.kind in ("reduced", "total")) or (kind == "reduced" and source.kind == "total")
        if eqn.primitive.name == "broadcast_in_dim" and lifts and not self.totalled and self._lifts(eqn, source, shape):
            self.ops.append(Op("broadcast", (source.ref,), (("to", kind),)))
            return _Value(f"%{len(self.ops) - 1}", shape, kind)
        raise _Unsupported(f"shape op {eqn.primitive.name} {source.shape} -> {shape}")

    def _lifts(self, eqn, source: _Value, shape) -> bool:
        """broadcast_in_dim puts the source's dims where the class's dims are."""
        dims = tuple(eqn.params["broadcast_dimensions"])
        if source.kind == "total":
            return True
        if shape != self.full:
            return False
        kept = [d for d, l in enumerate(self.labels) if l != "n"]
        if len(source.shape) == len(kept):
            return list(dims) == kept
        return dims == tuple(range(len(self.full)))

    def _inline(self, eqn, values) -> _Value:
        """A jitted helper (``jax.nn.silu``): its body's ops, if all are epilogue ops."""
        closed = eqn.params["jaxpr"]
        body = closed.jaxpr
        if closed.consts or len(body.outvars) != 1 or body.effects:
            raise _Unsupported("jit with consts, effects or several results")
        inner = dict(values)
        for var, atom in zip(body.invars, eqn.invars):
            inner[var] = values[atom] if isinstance(atom, Var) and atom in values else _Outer(atom)
        for sub in body.eqns:
            if any(isinstance(v, DropVar) for v in sub.outvars):
                continue
            inner[sub.outvars[0]] = self.translate(_Rebound(sub, inner), inner)
        out = body.outvars[0]
        if isinstance(out, Literal) or out not in inner or isinstance(inner[out], _Outer):
            raise _Unsupported("jit returning a literal or an argument")
        return inner[out]


@dataclasses.dataclass(frozen=True)
class _Outer:
    """A jit body's argument that is an operand of the region, not one of its values."""

    atom: Any


class _Rebound:
    """An equation of a jit body whose arguments that stand for outer operands are read as
    those operands (so they are classified and fetched as the outer atoms)."""

    def __init__(self, eqn, inner):
        self.primitive, self.params, self.effects, self.outvars = eqn.primitive, eqn.params, eqn.effects, eqn.outvars
        self.invars = [inner[a].atom if isinstance(a, Var) and isinstance(inner.get(a), _Outer) else a
                       for a in eqn.invars]


def _is_relu(eqn) -> bool:
    """``jax.nn.relu``: a custom_jvp whose primal is ``max(x, 0)`` (through a jit)."""
    if eqn.params.get("num_consts", 0) or len(eqn.invars) != 1:
        return False
    body = eqn.params["call_jaxpr"].jaxpr
    while len(body.eqns) == 1 and body.eqns[0].primitive.name in _JIT:
        body = body.eqns[0].params["jaxpr"].jaxpr
    if len(body.eqns) != 1 or body.eqns[0].primitive.name != "max":
        return False
    args = body.eqns[0].invars
    return (any(isinstance(a, Literal) and np.all(np.asarray(a.val) == 0) for a in args)
            and any(a is body.invars[0] for a in args))


def _params(name: str, params: dict) -> tuple:
    if name == "integer_pow":
        return (("y", int(params["y"])),)
    if name == "convert_element_type":
        if params.get("weak_type") or not _unsharded(params.get("sharding")):
            raise _Unsupported("weak or sharded convert")
        return (("new_dtype", np.dtype(params["new_dtype"]).name),)
    if any(value is not None for value in params.values()):  # only defaults (accuracy, out_dtype)
        raise _Unsupported(f"{name} with parameters {params}")
    return ()


def _unsharded(sharding) -> bool:
    """No sharding, or one over a mesh without axes (what autodiff writes on converts)."""
    mesh = getattr(sharding, "mesh", None)
    return sharding is None or (mesh is not None and not tuple(getattr(mesh, "axis_names", ())))


def _literal(atom) -> str:
    value = np.asarray(atom.val)
    if value.shape != ():
        raise _Unsupported("non-scalar literal")
    dtype = np.dtype(atom.aval.dtype).name
    if value.dtype == np.bool_:
        return f"{bool(value)}:{dtype}"
    if is_integer(value.dtype):
        return f"{int(value)}:{dtype}"
    return f"{float(value)!r}:{dtype}"


def _rank(arg: str) -> int:
    return {"y": 0, "%": 1, "$": 2}.get(arg if arg == "y" else arg[0], 3)


def _squeezed(shape) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


# ---------------------------------------------------------------- operands at run time

def canonical_operand(x, use: OperandUse, batch: int, m: int, n: int):
    """An operand value as the jaxpr holds it, in its role's canonical shape:
    scalar (), row (n,), col (batch, m), full (batch, m, n)."""
    if use.role == "scalar":  # a literal's value (a Python float) in the literal's dtype
        return jnp.reshape(jnp.asarray(x, use.atom.aval.dtype), ())
    keep = {"row": {"n"}, "col": {"b", "m"}, "full": {"b", "m", "n"}}[use.role]
    target = tuple(a if l in keep else 1 for a, l in zip(use.against, use.labels))
    if tuple(x.shape) != target:
        x = jnp.broadcast_to(x, target)
    shape = {"row": (n,), "col": (batch, m), "full": (batch, m, n)}[use.role]
    return jnp.reshape(x, shape)


def operand_values(region: Region, read, batch: int, m: int, n: int) -> list:
    return [canonical_operand(read(use.atom), use, batch, m, n) for use in region.operands]


__all__ = ["Region", "OperandUse", "regions", "dot_labels", "canonical_operand", "operand_values"]
