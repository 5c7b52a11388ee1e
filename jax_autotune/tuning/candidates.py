"""Candidates: the kernels a key may be run with, and the sets they are built into.

A ``Candidate`` is a unique name (encoding its parameters), a jax-traceable function
``fn(lhs, rhs, problem) -> out`` on the canonical operands of a ``MatmulProblem``
(lhs ``problem.lhs_shape``, rhs ``problem.rhs_shape``, out ``problem.out_shape`` in
``problem.out_dtype``), the groups it belongs to with an in-group priority each, and
``supports(device, key)`` (``DeviceInfo`` lives in ``tuning.device``). A problem with an
epilogue runs the kernel and the epilogue after it as XLA ops (``bound``), unless the
candidate ``applies_epilogue``: then ``fn(lhs, rhs, problem, *operands)`` computes the
whole context itself (a fused epilogue), and its ``supports`` says which epilogues. A ``CandidateSet``
is built once per (platform, device kind) with ``CandidateSetBuilder``; XLA's own dot is
always candidate 0, the baseline. ``candidate.export_safety(problem, platform)`` says what
it emits and whether jax.export takes it (``tuning.export_safety``).

    >>> builder = CandidateSetBuilder(platform="cpu", device_kind="cpu")
    >>> fast = builder.group("native", priority=lambda key: 2)
    >>> builder.add(Candidate("my_kernel", my_fn, params={"tile": 8}), fast, lambda key: 1)
    >>> candidate_set = builder.build()
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from typing import Any, Callable, Mapping

from jax_autotune.key import MatmulKey
from jax_autotune.problem import MatmulProblem
from jax_autotune.tuning import export_safety
from jax_autotune.tuning.device import DeviceInfo

PriorityFn = Callable[[MatmulKey], int]
KernelFn = Callable[[Any, Any, MatmulProblem], Any]


def always(device: DeviceInfo, key: MatmulKey) -> bool:
    return True


@dataclasses.dataclass(frozen=True, eq=False)
class Candidate:
    """A kernel that may be chosen for a key; ``name`` encodes its parameters."""

    name: str
    fn: KernelFn
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    supports: Callable[[DeviceInfo, MatmulKey], bool] = always
    # a rough time estimate (seconds) used to order a round so the short-circuit fires early
    cost: Callable[[MatmulProblem], float] | None = None
    # compiles in milliseconds (a library or FFI call, no kernel of its own to generate):
    # measured right after the baseline, and never skipped by the cost model
    quick_compile: bool = False
    # holds an XLA dot, so compiling it on a GPU runs XLA's GEMM autotuner: a key's such
    # candidates are autotuned together, in one compile, before their own (``xla_priming``)
    xla_autotuned: bool = False
    # fn(lhs, rhs, problem, *operands) applies problem.epilogue itself (before its store)
    applies_epilogue: bool = False
    # a fused variant: the candidate whose product it computes (``tuning.reuse``); not hashed
    product: str = ""

    def runs(self, device: DeviceInfo, key: MatmulKey) -> bool:
        """``supports(device, key)``, a rule that raises read as: not supported.

            >>> candidate.runs(device, problem.key())
            True
        """
        try:
            return bool(self.supports(device, key))
        except Exception:  # noqa: BLE001 - a failing supports rule means: not supported
            return False

    def signature(self) -> str:
        """Name plus parameters: what the candidate-set checksum hashes."""
        return f"{self.name}{json.dumps(dict(self.params), sort_keys=True, default=str)}"

    def export_safety(self, problem: MatmulProblem, platform: str) -> export_safety.ExportSafety:
        """The custom-call targets it emits for ``problem`` on ``platform`` and whether
        jax.export takes them; derived from its lowering (once, then cached).

            >>> XLA_DOT.export_safety(problem, "cpu").safe
            True
        """
        return export_safety.check(self, problem, platform)

    def bound(self, problem: MatmulProblem) -> Callable[..., Any]:
        """``fn(lhs, rhs, *operands)``: this kernel for ``problem`` in its context (the
        epilogue after it as XLA ops, which XLA fuses where it can, unless the kernel
        applies it), to jit or lower.

            >>> jax.jit(XLA_DOT.bound(problem))(lhs, rhs, *epilogue_operands)
        """
        if problem.epilogue.is_bare or self.applies_epilogue:
            return functools.partial(_run, self.fn, problem=problem)
        return functools.partial(_in_context, self.fn, problem=problem)


def _run(fn: KernelFn, lhs, rhs, *operands, problem: MatmulProblem):
    return fn(lhs, rhs, problem, *operands)


def _in_context(fn: KernelFn, lhs, rhs, *operands, problem: MatmulProblem):
    bare = problem.bare()
    own = len(bare.input_specs()) - 2  # a grouped kernel's group sizes come before the epilogue's
    return problem.epilogue.apply(fn(lhs, rhs, bare, *operands[:own]), operands[own:])


@dataclasses.dataclass(frozen=True)
class Group:
    """A named group of candidates with a key -> priority function (negative: skip)."""

    name: str
    priority: PriorityFn
    index: int  # declaration order: breaks ties between groups of equal priority
    # its round's XLA-based candidates are autotuned beside the baseline, in one compile
    # (``xla_priming``): for rounds that seldom end before they are all compiled
    primes_xla: bool = False


@dataclasses.dataclass(frozen=True)
class Membership:
    candidate: str
    group: str
    priority: PriorityFn


@dataclasses.dataclass(frozen=True)
class CandidateSet:
    platform: str
    device_kind: str
    candidates: tuple[Candidate, ...]
    groups: tuple[Group, ...]
    memberships: tuple[Membership, ...]

    @property
    def baseline(self) -> Candidate:
        """Candidate 0: XLA's dot, the baseline of every round and what a key runs with
        when nothing else is valid or allowed."""
        return self.candidates[0]

    def by_name(self, name: str) -> Candidate:
        for candidate in self.candidates:
            if candidate.name == name:
                return candidate
        raise KeyError(f"no candidate named {name!r} in the {self.platform} candidate set")

    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.candidates)

    def checksum(self) -> str:
        """Hash of every candidate's name and parameters: a changed set re-tunes."""
        digest = hashlib.sha256()
        for candidate in self.candidates:
            digest.update(candidate.signature().encode())
            digest.update(b"\0")
        return digest.hexdigest()[:16]


class CandidateSetBuilder:
    """Builds a ``CandidateSet``; XLA's dot must be added first (it is candidate 0)."""

    def __init__(self, platform: str, device_kind: str):
        self.platform = platform
        self.device_kind = device_kind
        self._candidates: list[Candidate] = []
        self._groups: list[Group] = []
        self._memberships: list[Membership] = []

    def group(self, name: str, priority: PriorityFn, primes_xla: bool = False) -> Group:
        if any(g.name == name for g in self._groups):
            raise ValueError(f"group {name!r} is declared twice")
        group = Group(name, priority, len(self._groups), primes_xla)
        self._groups.append(group)
        return group

    def add(self, candidate: Candidate, *groups_and_priorities: Any) -> Candidate:
        """Add ``candidate`` with (group, in-group priority fn) pairs, flat or as tuples.

        ``builder.add(c, g1, p1, g2, p2)`` or ``builder.add(c, (g1, p1), (g2, p2))``.
        """
        if any(c.name == candidate.name for c in self._candidates):
            raise ValueError(f"candidate name {candidate.name!r} is not unique")
        pairs = _pairs(groups_and_priorities)
        known = {g.name for g in self._groups}
        for group, _ in pairs:
            if group.name not in known:
                raise ValueError(f"candidate {candidate.name!r}: unknown group {group.name!r}")
        self._candidates.append(candidate)
        for group, priority in pairs:
            self._memberships.append(Membership(candidate.name, group.name, priority))
        return candidate

    def build(self) -> CandidateSet:
        if not self._candidates:
            raise ValueError("a candidate set needs at least the baseline (XLA's dot)")
        return CandidateSet(self.platform, self.device_kind, tuple(self._candidates),
                            tuple(self._groups), tuple(self._memberships))


def _pairs(items: tuple[Any, ...]) -> list[tuple[Group, PriorityFn]]:
    if all(isinstance(item, tuple) for item in items):
        return [(g, p) for g, p in items]
    if len(items) % 2:
        raise ValueError("groups and priorities must come in (group, priority) pairs")
    return [(items[i], items[i + 1]) for i in range(0, len(items), 2)]
