"""Module state an autotuned function writes: the flax nnx modules among its arguments.

nnx modules are pytrees, so ``autotune`` traces ``fn`` on copies of them, and what ``fn``
writes into them (BatchNorm's running statistics, the counts of Dropout's ``Rngs``) would
stay in the copies. As ``nnx.jit`` does, the modules among the arguments are split into
their graph (static) and their state (arrays); ``fn`` runs on modules merged from that
state; their state after the call is returned beside ``fn``'s result and written back
into the caller's modules. A module ``fn`` returns comes back as the caller's object.

    >>> split = split_modules(args, kwargs)        # None: no nnx module among them
    >>> out, state = call(with_module_state(fn), split.graph, split.state, split.args, split.kwargs)
    >>> out = split.write_back(out, state)

Nothing here imports flax: where ``flax.nnx`` is not loaded, no argument is a module.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Callable

import jax


@dataclasses.dataclass(frozen=True)
class _Slot:
    """Where the ``index``-th module stood among the arguments, or stands in the result."""

    index: int


def _nnx():
    return sys.modules.get("flax.nnx")


def _fill(tree, nodes):
    return jax.tree_util.tree_map(lambda x: nodes[x.index] if isinstance(x, _Slot) else x, tree)


@dataclasses.dataclass
class SplitModules:
    """The caller's modules, their graph and state, and the arguments with slots for them."""

    nodes: list
    graph: Any
    state: Any
    args: tuple
    kwargs: dict

    def write_back(self, out, state):
        """Write the state ``fn`` left into the caller's modules; ``out`` with them in its slots."""
        _nnx().update(self.nodes, state)
        return _fill(out, self.nodes)


def split_modules(args: tuple, kwargs: dict) -> SplitModules | None:
    """The nnx modules among ``args`` and ``kwargs`` split out; None where there are none."""
    nnx = _nnx()
    if nnx is None:
        return None
    is_node = nnx.graph.is_graph_node
    leaves, tree = jax.tree_util.tree_flatten((args, kwargs), is_leaf=is_node)
    nodes, index = [], {}
    slotted = []
    for leaf in leaves:
        if is_node(leaf):
            if id(leaf) not in index:  # one module passed twice is one module
                index[id(leaf)] = len(nodes)
                nodes.append(leaf)
            leaf = _Slot(index[id(leaf)])
        slotted.append(leaf)
    if not nodes:
        return None
    graph, state = nnx.split(nodes)
    args, kwargs = jax.tree_util.tree_unflatten(tree, slotted)
    return SplitModules(nodes, graph, state, args, kwargs)


def with_module_state(fn: Callable) -> Callable:
    """``fn`` as ``(graph, state, args, kwargs) -> (result, state after)``, its modules
    merged from ``graph`` and ``state`` into the arguments' slots."""

    def pure(graph, state, args, kwargs):
        nnx = _nnx()
        nodes = nnx.merge(graph, state)
        args, kwargs = _fill((args, kwargs), nodes)
        out = fn(*args, **kwargs)
        slots = {id(node): _Slot(i) for i, node in enumerate(nodes)}
        out = jax.tree_util.tree_map(lambda x: slots.get(id(x), x), out, is_leaf=nnx.graph.is_graph_node)
        return out, nnx.state(nodes)

    return pure


__all__ = ["SplitModules", "split_modules", "with_module_state"]
