"""The jaxprs nested in a jaxpr: the one walker over them (the bodies of nested jit, scan,
while, cond branches, ``jax.checkpoint``, custom_jvp/vjp calls), read by ``warmup`` and
rewritten by ``jat.autotune``.

    >>> sum(e.primitive.name == "dot_general" for e in equations(jax.make_jaxpr(f)(x)))
    3
    >>> map_jaxprs(eqn.params["branches"], rewrite)     # a cond's branches, each rewritten
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from jax.extend.core import ClosedJaxpr, Jaxpr, Var


def map_jaxprs(value: Any, fn: Callable[[Any], Any]) -> Any:
    """``value`` (an equation's param) with each jaxpr in it, open or closed, alone or in
    a plain tuple or list (cond's branches), replaced by ``fn(jaxpr)``; anything else as is.

        >>> map_jaxprs((closed_a, closed_b), len_of_eqns)
        (4, 7)
    """
    if isinstance(value, (Jaxpr, ClosedJaxpr)):
        return fn(value)
    if type(value) in (tuple, list):
        return type(value)(map_jaxprs(item, fn) for item in value)
    return value


def equations(jaxpr: Jaxpr | ClosedJaxpr) -> Iterator[Any]:
    """Every equation of a (closed) jaxpr and of the jaxprs nested in its params, in order.

        >>> [e.primitive.name for e in equations(jax.make_jaxpr(jax.jit(f))(x))]
        ['pjit', 'dot_general', 'tanh']
    """
    for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
        yield eqn
        nested: list = []
        for value in eqn.params.values():
            map_jaxprs(value, nested.append)
        for sub in nested:
            yield from equations(sub)


def readers(jaxpr: Jaxpr) -> dict[Any, list[int]]:
    """{var: the indices of the equations of ``jaxpr`` that read it} (its own equations).

        >>> jaxpr = jax.make_jaxpr(lambda x: jnp.sin(x) + x)(1.0).jaxpr
        >>> readers(jaxpr)[jaxpr.invars[0]]      # sin and add read x
        [0, 1]
    """
    found: dict[Any, list[int]] = {}
    for index, eqn in enumerate(jaxpr.eqns):
        for atom in eqn.invars:
            if isinstance(atom, Var):
                found.setdefault(atom, []).append(index)
    return found


def bind(eqn, values, params=None):
    """``eqn``'s primitive bound on ``values`` with its params (or ``params``, the same
    with rewritten bodies), as JAX traced it: a list of its results.

        >>> bind(eqn, [x, y])                   # doctest: +SKIP
        [Array(...)]
    """
    out = eqn.primitive.bind(*values, **eqn.primitive.get_bind_params(eqn.params if params is None else params))
    return out if eqn.primitive.multiple_results else [out]
