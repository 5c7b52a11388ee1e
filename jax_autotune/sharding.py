"""Internal: per-shard kernels under plain ``jax.jit`` with sharded operands.

A lowering rule sees global shapes, and XLA's SPMD partitioner cannot split an FFI
custom call or a Pallas kernel: it would gather their operands onto every device. So
when a jit targets several devices (outside ``shard_map``), the primitive lowers to
``partitioned_matmul``: a ``jax.experimental.custom_partitioning`` op with a Shardy rule
over the canonical factors (b, m, n, k; k a reduction factor). At compile time XLA's
partitioner calls back with the operand shardings; the callback derives the per-shard
problem (``plan_shards``), asks the tuner for the per-shard key (``ShardKernels``) and
emits the winner on per-shard operands, with a ``psum`` over the mesh axes that shard k.

    >>> lowering_targets_many_devices(ctx)            # in a lowering rule
    True
    >>> out = partitioned_matmul(lhs, rhs, problem, ShardKernels("cpu"))

What follows from doing it in the partitioner: tuning happens at ``.compile()``, not at
``.lower()``; an error raised there reaches the user wrapped as ``INTERNAL:
custom_partitioner: ...`` (the messages below name the per-shard key); and JAX's
persistent compilation cache never serves such a program from another process (the op
carries a per-process callback address) unless ``jax_remove_custom_partitioning_ptr_from_
cache_key`` is set, in which case a changed per-shard decision is not part of the key.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import jax
from jax import lax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.experimental.xla_metadata import set_xla_metadata
from jax.sharding import NamedSharding, PartitionSpec as P

from jax_autotune.errors import ShardKernelError
from jax_autotune.kernels.xla import xla_dot
from jax_autotune.problem import MatmulProblem
from jax_autotune.registry import tuner_for
from jax_autotune.tuning.policy import DEFAULT_POLICY, Policy

try:  # jax internals, unchanged from 0.10.2 to 0.11.2; without them: the global kernel
    from jax._src.core import ShardingTypeError
    from jax._src.sharding_impls import ShardingContext
except ImportError:  # pragma: no cover - depends on the jax version
    ShardingContext = None

    class ShardingTypeError(Exception):  # never raised: the name for the except clause
        pass

FACTORS = ("b", "m", "n", "k")  # which factor keeps a mesh axis two of them claim


# ---------------------------------------------------------------- the shard plan

def operand_factors(problem: MatmulProblem) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The factor of each stored dim: lhs (b m k) or (b k m), rhs (b k n) or (b n k)."""
    lhs = ("b", "k", "m") if problem.transpose_a else ("b", "m", "k")
    rhs = ("b", "n", "k") if problem.transpose_b else ("b", "k", "n")
    return lhs, rhs


def sharding_rule(problem: MatmulProblem) -> str:
    """The Shardy rule, e.g. ``"b m k, b n k -> b m n"`` (k is a reduction factor)."""
    lhs, rhs = operand_factors(problem)
    return f"{' '.join(lhs)}, {' '.join(rhs)} -> b m n"


def _entry_axes(entry) -> tuple[str, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


def _spec_entry(axes: tuple[str, ...]):
    return None if not axes else axes[0] if len(axes) == 1 else axes


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """The mesh axes of each canonical factor and the per-shard problem they give."""

    problem: MatmulProblem
    axes: dict  # factor -> tuple of mesh axis names
    shard: MatmulProblem

    def shardings(self, mesh) -> tuple[NamedSharding, NamedSharding, NamedSharding]:
        """(lhs, rhs, out) shardings: what the per-shard kernel reads and writes."""
        lhs, rhs = operand_factors(self.problem)
        return tuple(NamedSharding(mesh, P(*(_spec_entry(self.axes[f]) for f in factors)))
                     for factors in (lhs, rhs, ("b", "m", "n")))

    @property
    def reduce_axes(self) -> tuple[str, ...]:
        return self.axes["k"]


def plan_shards(problem: MatmulProblem, mesh_shape: dict, lhs_spec, rhs_spec) -> ShardPlan:
    """Each factor's mesh axes, from the operand specs the partitioner proposes.

    A factor takes its axes from lhs, else rhs; an axis an earlier factor (``FACTORS``
    order) took is dropped with the axes after it. b, m and n may split unevenly (the
    partitioner pads, and padded rows only reach padded outputs); k must divide evenly
    (padding would enter the sum), else it is not split.

        >>> plan_shards(problem, {"x": 4}, P(None, "x", None), P()).shard.m   # m=256
        64
    """
    lhs_f, rhs_f = operand_factors(problem)
    proposed = {f: [] for f in FACTORS}
    for factors, spec in ((lhs_f, lhs_spec), (rhs_f, rhs_spec)):
        spec = tuple(spec) + (None,) * (3 - len(tuple(spec)))
        for factor, entry in zip(factors, spec):
            proposed[factor].append(_entry_axes(entry))
    sizes = {"b": problem.batch, "m": problem.m, "n": problem.n, "k": problem.k}
    used: set = set()
    axes, divided = {}, {}
    for factor in FACTORS:
        chosen = next((a for a in proposed[factor] if a), ())
        kept = []
        for axis in chosen:
            parts = math.prod(mesh_shape[a] for a in kept) * mesh_shape[axis]
            if axis in used or parts > sizes[factor] or (factor == "k" and sizes[factor] % parts):
                break
            kept.append(axis)
        used.update(kept)
        axes[factor] = tuple(kept)
        divided[factor] = -(-sizes[factor] // math.prod(mesh_shape[a] for a in kept))
    shard = dataclasses.replace(problem, batch=divided["b"], m=divided["m"], n=divided["n"],
                                k=divided["k"])
    return ShardPlan(problem, axes, shard)


# ---------------------------------------------------------------- the per-shard kernels

@dataclasses.dataclass(frozen=True)
class ShardKernels:
    """``kernels(shard_problem) -> fn(lhs, rhs)``: the platform tuner's winner for the
    per-shard key, decided by the policy of the compile that lowered the op (its level:
    the global key's). Hashable: it is a static argument of the partitioned op."""

    platform: str
    policy: Policy = DEFAULT_POLICY

    def key(self, shard: MatmulProblem):
        return shard.key(self.policy.level)

    def __call__(self, shard: MatmulProblem) -> Callable:
        tuner = tuner_for(self.platform)
        decision = tuner.select(shard, self.key(shard), self.policy)
        candidate = tuner.candidate_set.by_name(decision.winner)
        return candidate.bound(shard)


def _checked(kernels: ShardKernels, shard: MatmulProblem, whole: MatmulProblem) -> Callable:
    """``kernels(shard)``, with a failure (choosing or tracing) re-raised naming the key:
    XLA hands the user only the text of what escapes the partition callback."""
    where = (f"per-shard problem {shard.describe()} (key {kernels.key(shard).canonical()}) "
             f"of {whole.describe()}")
    try:
        kernel = kernels(shard)
    except Exception as err:
        raise ShardKernelError(f"jax_autotune: no kernel for {where}: "
                               f"{type(err).__name__}: {err}") from err

    def run(lhs, rhs):
        try:
            return kernel(lhs, rhs)
        except Exception as err:
            raise ShardKernelError(f"jax_autotune: kernel failed for {where}: "
                                   f"{type(err).__name__}: {err}") from err
    return run


# ---------------------------------------------------------------- custom_partitioning

def _partition(problem, kernels, out_sharding, mesh, arg_shapes, result_shape):
    """Called by XLA's SPMD partitioner, at compile time, with the operand shardings."""
    del out_sharding, result_shape  # the result sharding is the one the kernel produces
    lhs, rhs = arg_shapes
    plan = plan_shards(problem, dict(mesh.shape), lhs.sharding.spec, rhs.sharding.spec)
    kernel = _checked(kernels, plan.shard, problem)
    reduce_axes = plan.reduce_axes

    def lower_fn(lhs_shard, rhs_shard):
        # no mesh in the types of the per-shard program: under an Explicit mesh the user
        # set, jax 0.11 types the kernel's output with it and puts a sharding op into the
        # psum's reduction, which XLA cannot compile
        with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), ())):
            out = kernel(lhs_shard, rhs_shard)
            return lax.psum(out, reduce_axes) if reduce_axes else out

    lhs_sharding, rhs_sharding, out_sharding = plan.shardings(mesh)
    return mesh, lower_fn, out_sharding, (lhs_sharding, rhs_sharding)


def _infer_sharding_from_operands(problem, kernels, out_sharding, mesh, arg_shapes, result_shape):
    """The GSPMD partitioner's question (``jax_use_shardy_partitioner=False``)."""
    del kernels, out_sharding, result_shape
    lhs, rhs = arg_shapes
    return plan_shards(problem, dict(mesh.shape), lhs.sharding.spec, rhs.sharding.spec).shardings(mesh)[2]


def _sharding_rule(problem, kernels, out_sharding, mesh, operand_types, result_types):
    del kernels, out_sharding, mesh, operand_types, result_types
    return sharding_rule(problem), {"reduction_factors": ("k",)}


@functools.partial(custom_partitioning, static_argnums=(2, 3, 4))
def _partitioned(lhs, rhs, problem, kernels, out_sharding):
    # the global body gives the avals only: it is never run on several devices
    del kernels
    return xla_dot(lhs, rhs, problem, out_sharding=out_sharding)


_partitioned.def_partition(partition=_partition,
                           infer_sharding_from_operands=_infer_sharding_from_operands,
                           sharding_rule=_sharding_rule)


def partitioned_matmul(lhs, rhs, problem: MatmulProblem, kernels: ShardKernels,
                       out_sharding: NamedSharding | None = None):
    """The matmul as a custom_partitioning op whose per-shard kernel ``kernels`` picks.

    ``out_sharding`` is the output's type sharding under Explicit mesh axes, else None.
    The problem is tagged on the op: with the callback address removed from the cache
    key, problems of equal shapes would otherwise share a cache entry.
    """
    out = _partitioned(lhs, rhs, problem, kernels, out_sharding)
    return set_xla_metadata(out, jax_autotune_problem=repr(problem))


def explicit_sharding(aval):
    """``aval``'s sharding when its mesh has Explicit axes (a type to keep), else None.

        >>> explicit_sharding(jax.typeof(x))      # x sharded under jax.set_mesh(explicit_mesh)
        NamedSharding(mesh=..., spec=P('data', None))
    """
    sharding = getattr(aval, "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or getattr(mesh, "empty", True) or not getattr(mesh, "explicit_axes", ()):
        return None
    return sharding


def lowering_targets_many_devices(ctx) -> bool:
    """True under jit over several devices outside shard_map (custom_partitioning's case).

    shard_map bodies lower under an SPMDAxisContext (they keep the per-shard path); one
    device gives a ShardingContext of one device; the device assignment is there only
    because the primitive requires devices during lowering, and the abstract mesh only
    when some sharding of the computation is a NamedSharding.
    """
    axis_context = ctx.module_context.axis_context
    return (ShardingContext is not None and isinstance(axis_context, ShardingContext)
            and axis_context.num_devices > 1 and axis_context.device_assignment is not None
            and axis_context.abstract_mesh is not None)
