"""Grouped-matmul (``lax.ragged_dot``) candidates, on every platform, and their set.

A grouped candidate's ``fn(lhs, rhs, problem, group_sizes)`` takes the problem's operands
(``MatmulProblem`` with ``groups``: lax's own shapes) and group sizes of shape (splits,
groups), and gives one result per split, (splits, *problem.out_shape): the tuner checks
and times every candidate on the representative splits at once (``jax_autotune.splits``),
a lowering runs it on one split (``served``).

* ``xla_ragged_dot`` (candidate 0, always): ``lax.ragged_dot_general``, the dims lax
  builds itself; the fallback and the values every other candidate is checked against.
* ``ragged_masked_dense`` (ragged m, at most ``MASKED_MAX_GROUPS`` groups): every group's
  weights applied to every row as one dense matmul, each row then taking its group's
  result (rows in no group zero): ``groups`` x the FLOPs, valid for every split.
* ``ragged_padded_dense_x2`` (2 groups or more, capacity below the ragged size): a
  batched dense GEMM over (groups, capacity) rows gathered per group, capacity = twice the
  mean group size rounded up to 8; where a group holds more rows than that (known only
  at run time) the call runs ``xla_ragged_dot`` instead (``lax.cond``), so it is right for
  every split, and fast where routing is balanced. A static bound is not known in general
  (``jat.ragged_dot`` takes no capacity), so the bound is checked on the device.
* ``ragged_mosaic_gemm_<config>`` (Hopper GPUs, ragged m, bf16/f16; one per
  ``mosaic_grouped.GROUPED_CONFIGS``): our Mosaic GPU grouped GEMM
  (``kernels/gpu/mosaic_grouped.py``), the groups' FLOPs only, every split in-kernel; a
  problem its key admits but the kernel cannot serve as stored (an m that is not a
  multiple of 8, say: the key holds bucketed sizes) runs ``xla_ragged_dot`` instead.
* ``ragged_k_mosaic_gemm_<config>`` (Hopper GPUs, ragged k, bf16/f16, lhs stored (k, m)
  and rhs (k, n) as the weight gradient has them; one per
  ``mosaic_grouped_k.GROUPED_K_CONFIGS``): our Mosaic GPU grouped GEMM over each group's
  k rows (``kernels/gpu/mosaic_grouped_k.py``), the groups' FLOPs only, every split
  in-kernel; where the stored problem is not served, ``xla_ragged_dot``.
* ``ragged_cublas_grouped`` (CUDA GPUs with cuBLAS 12.5 or newer; ragged m, or ragged k
  stored as the weight gradient has them; one dtype of bf16, f16, f32): cuBLAS's grouped GEMM, one problem per non-empty group
  (``kernels/gpu/cublas_grouped.py``); each call waits on the host for the group sizes, and
  its time is charged that round trip.
* ``ragged_tokamax_<implementation>`` (GPUs where tokamax is installed; "mosaic" and, where
  this jax ships Pallas's Triton backend, "triton"): ``tokamax.ragged_dot_general`` with
  that implementation alone (``kernels/gpu/tokamax_ragged.py``), ragged m or k.

    >>> cset = ragged_candidate_set(device)
    >>> cset.names()          # a CPU device; a GPU adds ragged_cublas_grouped, Hopper the *mosaic_gemm_* ones
    ('xla_ragged_dot', 'ragged_masked_dense', 'ragged_padded_dense_x2')
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
from jax import lax

from jax_autotune.key import MatmulKey
from jax_autotune.key import Precision
from jax_autotune.kernels.gpu import cublas_grouped, mosaic_grouped, mosaic_grouped_k, tokamax_ragged
from jax_autotune.kernels.groups import group_bounds
from jax_autotune.kernels.gpu.mosaic_gemm import shared_memory_bytes
from jax_autotune.kernels.xla import lax_precision
from jax_autotune.problem import MatmulProblem
from jax_autotune.tuning.candidates import Candidate, CandidateSet, CandidateSetBuilder
from jax_autotune.tuning.device import DeviceInfo

XLA_RAGGED_NAME = "xla_ragged_dot"
MASKED_MAX_GROUPS = 8
CAPACITY_FACTOR = 2  # padded rows per group: this many times the mean group size
CAPACITY_ALIGN = 8


def ragged_dimension_numbers(problem: MatmulProblem) -> lax.RaggedDotDimensionNumbers:
    """lax's dimension numbers of a grouped problem's operands, as lax writes them (the
    forward's, and its transpose rule's for the input gradient).

        >>> ragged_dimension_numbers(problem).dot_dimension_numbers
        (((1,), (1,)), ((), ()))
    """
    lhs_contract = 0 if problem.transpose_a else 1
    if problem.ragged == "m":
        rhs_contract = 2 if problem.transpose_b else 1
        return lax.RaggedDotDimensionNumbers((((lhs_contract,), (rhs_contract,)), ((), ())), [0], [0])
    rhs_contract = 1 if problem.transpose_b else 0
    return lax.RaggedDotDimensionNumbers((((lhs_contract,), (rhs_contract,)), ((), ())),
                                         [lhs_contract], [])


def _dot_options(problem: MatmulProblem) -> dict:
    return dict(precision=lax_precision(problem.precision), preferred_element_type=jnp.dtype(problem.out_dtype))


def xla_ragged_one(lhs, rhs, group_sizes, problem: MatmulProblem):
    """``lax.ragged_dot_general`` of one split (group sizes (groups,))."""
    out = lax.ragged_dot_general(lhs, rhs, group_sizes, ragged_dimension_numbers(problem),
                                 **_dot_options(problem))
    return out.astype(problem.out_dtype)


def _each_split(one):
    """fn(lhs, rhs, problem, sizes (splits, groups)) -> (splits, *out) from ``one`` of a split."""
    def fn(lhs, rhs, problem: MatmulProblem, group_sizes):
        return jnp.stack([one(lhs, rhs, group_sizes[s], problem) for s in range(group_sizes.shape[0])])
    return fn


def _row_groups(group_sizes, rows: int):
    """Per row: its group and its position in it; a row in no group gets group ``groups``."""
    starts, ends = group_bounds(group_sizes, rows)
    row = jnp.arange(rows, dtype=jnp.int32)
    group = jnp.sum(row[:, None] >= ends[None, :], axis=1).astype(jnp.int32)
    position = row - starts[jnp.minimum(group, group_sizes.shape[0] - 1)]
    return group, position


def masked_one(lhs, rhs, group_sizes, problem: MatmulProblem):
    """Ragged m: every group's product on every row (one dense matmul), each row its group's."""
    contract = 2 if problem.transpose_b else 1
    every = lax.dot_general(lhs, rhs, (((1,), (contract,)), ((), ())), **_dot_options(problem))  # (m, g, n)
    group, _ = _row_groups(group_sizes, problem.m)
    picked = jnp.take_along_axis(every, jnp.minimum(group, problem.groups - 1)[:, None, None], axis=1)[:, 0]
    return jnp.where((group < problem.groups)[:, None], picked, 0).astype(problem.out_dtype)


def capacity(problem: MatmulProblem) -> int:
    """Rows per group of the padded candidate: twice the mean group size, a multiple of 8."""
    mean = math.ceil(CAPACITY_FACTOR * problem.ragged_rows / problem.groups)
    return -(-mean // CAPACITY_ALIGN) * CAPACITY_ALIGN


def _gathered(x, axis: int, starts, ends, cap: int):
    """(groups, ...) slices of ``cap`` rows of ``x`` along ``axis`` from each group's start,
    rows past the group's end zero."""
    offset = jnp.arange(cap, dtype=jnp.int32)
    index = starts[:, None] + offset[None, :]  # (groups, cap)
    valid = index < ends[:, None]
    rows = jnp.take(x, jnp.minimum(index, x.shape[axis] - 1).reshape(-1), axis=axis)
    shape = list(x.shape)
    shape[axis:axis + 1] = [starts.shape[0], cap]
    rows = jnp.moveaxis(rows.reshape(shape), axis, 0)  # (groups, cap, ...) or (groups, ..., cap)
    mask_shape = [starts.shape[0]] + [1] * (rows.ndim - 1)
    mask_shape[1 if axis == 0 else rows.ndim - 1] = cap
    return jnp.where(valid.reshape(mask_shape), rows, jnp.zeros((), x.dtype))


def _padded_path(lhs, rhs, group_sizes, problem: MatmulProblem, cap: int):
    starts, ends = group_bounds(group_sizes, problem.ragged_rows)
    options = _dot_options(problem)
    if problem.ragged == "m":
        x = _gathered(lhs, 0, starts, ends, cap)  # (g, cap, k)
        contract = 2 if problem.transpose_b else 1
        y = lax.dot_general(x, rhs, (((2,), (contract,)), ((0,), (0,))), **options)  # (g, cap, n)
        group, position = _row_groups(group_sizes, problem.m)
        inside = group < problem.groups
        out = y[jnp.minimum(group, problem.groups - 1), jnp.clip(position, 0, cap - 1)]
        return jnp.where(inside[:, None], out, 0).astype(problem.out_dtype)
    a = _gathered(lhs, 0 if problem.transpose_a else 1, starts, ends, cap)  # (g, cap, m) or (g, m, cap)
    b = _gathered(rhs, 1 if problem.transpose_b else 0, starts, ends, cap)  # (g, n, cap) or (g, cap, n)
    a_contract = 1 if problem.transpose_a else 2
    b_contract = 2 if problem.transpose_b else 1
    return lax.dot_general(a, b, (((a_contract,), (b_contract,)), ((0,), (0,))),
                           **options).astype(problem.out_dtype)  # (g, m, n)


def padded_one(lhs, rhs, group_sizes, problem: MatmulProblem, cap: int | None = None):
    """The batched dense GEMM over ``cap`` rows per group where every group fits, else XLA's."""
    cap = cap or capacity(problem)
    fits = jnp.max(group_sizes) <= cap
    return lax.cond(fits, lambda: _padded_path(lhs, rhs, group_sizes, problem, cap),
                    lambda: xla_ragged_one(lhs, rhs, group_sizes, problem))


def _grouped(key: MatmulKey) -> bool:
    return key.groups > 0


def _supports_masked(device: DeviceInfo, key: MatmulKey) -> bool:
    return key.ragged == "m" and 1 <= key.groups <= MASKED_MAX_GROUPS


def _supports_padded(device: DeviceInfo, key: MatmulKey) -> bool:
    # on the key's bucketed sizes: capacity below the ragged size means fewer FLOPs than masking
    rows = key.m if key.ragged == "m" else key.k
    return key.groups >= 2 and -(-CAPACITY_FACTOR * rows // key.groups) < rows


def mosaic_one(config):
    """``one`` of a split for ``mosaic_grouped_gemm`` with ``config`` (fitted to the dtypes),
    ``xla_ragged_one`` where the problem as stored is not served."""
    def one(lhs, rhs, group_sizes, problem: MatmulProblem):
        fitted = mosaic_grouped.fitted(config, problem.lhs_dtype, problem.out_dtype)
        if fitted is None or not mosaic_grouped.supports_grouped(
                problem.m, problem.n, problem.k, problem.groups, problem.lhs_dtype,
                transpose_rhs=problem.transpose_b, out_dtype=problem.out_dtype, config=fitted):
            return xla_ragged_one(lhs, rhs, group_sizes, problem)
        return mosaic_grouped.mosaic_grouped_gemm(lhs, rhs, group_sizes, config=fitted,
                                                  transpose_rhs=problem.transpose_b, out_dtype=problem.out_dtype)
    return one


def _hopper_mosaic(device: DeviceInfo, key: MatmulKey, ragged: str) -> bool:
    """A Hopper GPU with Mosaic GPU, a ``ragged`` key of one input dtype whose stored rows
    are 32-byte aligned (its strides say so; its sizes are bucketed)."""
    cc = device.compute_capability
    return (device.platform == "gpu" and cc is not None and cc >= (9, 0) and mosaic_grouped.AVAILABLE
            and key.ragged == ragged and key.rhs_dtype == key.lhs_dtype
            and 2 ** min(key.lhs_stride_factor, key.rhs_stride_factor) >= 32)


def _supports_mosaic(config):
    def supports(device: DeviceInfo, key: MatmulKey) -> bool:
        if not _hopper_mosaic(device, key, "m"):
            return False
        fitted = mosaic_grouped.fitted(config, key.lhs_dtype, key.out_dtype)
        return (fitted is not None
                and shared_memory_bytes(fitted, key.lhs_dtype, key.out_dtype) <= device.shared_memory_limit
                and bool(mosaic_grouped.supports_grouped(key.m, key.n, key.k, key.groups, key.lhs_dtype,
                                                         transpose_rhs=key.rhs_layout.transposed,
                                                         out_dtype=key.out_dtype, config=fitted)))
    return supports


def _k_served(config, transpose_a: bool, transpose_b: bool, m: int, n: int, k: int, dtype: str,
              out_dtype: str) -> bool:
    return (transpose_a and not transpose_b
            and bool(mosaic_grouped_k.supports_grouped_k(m, n, k, dtype, out_dtype=out_dtype, config=config)))


def mosaic_k_one(config):
    """``one`` of a split for ``mosaic_grouped_k_gemm`` with ``config``, ``xla_ragged_one``
    where the problem as stored is not served."""
    def one(lhs, rhs, group_sizes, problem: MatmulProblem):
        if not _k_served(config, problem.transpose_a, problem.transpose_b, problem.m, problem.n, problem.k,
                         problem.lhs_dtype, problem.out_dtype):
            return xla_ragged_one(lhs, rhs, group_sizes, problem)
        return mosaic_grouped_k.mosaic_grouped_k_gemm(lhs, rhs, group_sizes, config=config,
                                                      out_dtype=problem.out_dtype)
    return one


def _supports_mosaic_k(config):
    def supports(device: DeviceInfo, key: MatmulKey) -> bool:
        return (_hopper_mosaic(device, key, "k")
                and config.shared_memory_bytes(key.lhs_dtype, key.out_dtype) <= device.shared_memory_limit
                and mosaic_grouped_k.suits_groups(config, key.k, key.groups)
                and _k_served(config, key.lhs_layout.transposed, key.rhs_layout.transposed, key.m, key.n, key.k,
                              key.lhs_dtype, key.out_dtype))
    return supports


def _cublas_served(ragged: str, transpose_a: bool, transpose_b: bool) -> bool:
    """The stored layouts cuBLAS's grouped GEMM takes: every ragged m (lhs (m, k), as a
    grouped problem always stores it), ragged k with lhs (k, m) and rhs (k, n)."""
    return ragged == "m" or (transpose_a and not transpose_b)


def cublas_one(lhs, rhs, group_sizes, problem: MatmulProblem):
    """``one`` of a split for cuBLAS's grouped GEMM, ``xla_ragged_one`` where the problem
    as stored is not served."""
    if not _cublas_served(problem.ragged, problem.transpose_a, problem.transpose_b):
        return xla_ragged_one(lhs, rhs, group_sizes, problem)
    return cublas_grouped.grouped_matmul(lhs, rhs, group_sizes, ragged=problem.ragged,
                                         transpose_rhs=problem.transpose_b, out_dtype=problem.out_dtype,
                                         tf32=problem.precision == Precision.DEFAULT)


def _supports_cublas(device: DeviceInfo, key: MatmulKey) -> bool:
    return (device.platform == "gpu" and device.compute_capability is not None and _grouped(key)
            and key.rhs_dtype == key.lhs_dtype and cublas_grouped.supported_dtypes(key.lhs_dtype, key.out_dtype)
            and Precision(key.precision).algorithm is None
            and _cublas_served(key.ragged, key.lhs_layout.transposed, key.rhs_layout.transposed)
            and cublas_grouped.available())


def tokamax_one(implementation: str):
    """``one`` of a split for tokamax's ``implementation`` on lax's own dimension numbers."""
    run = tokamax_ragged.tokamax_one(implementation)

    def one(lhs, rhs, group_sizes, problem: MatmulProblem):
        out = run(lhs, rhs, group_sizes, ragged_dimension_numbers(problem), _dot_options(problem))
        return out.astype(problem.out_dtype)
    return one


def _supports_tokamax(implementation: str):
    def supports(device: DeviceInfo, key: MatmulKey) -> bool:
        return (device.platform == "gpu" and tokamax_ragged.implementation_available(implementation)
                and _grouped(key) and key.rhs_dtype == key.lhs_dtype)
    return supports


XLA_RAGGED_DOT = Candidate(XLA_RAGGED_NAME, _each_split(xla_ragged_one), params={"family": "xla_ragged"})
MASKED_DENSE = Candidate("ragged_masked_dense", _each_split(masked_one),
                         params={"family": "masked_dense", "max_groups": MASKED_MAX_GROUPS},
                         supports=_supports_masked)
PADDED_DENSE = Candidate(f"ragged_padded_dense_x{CAPACITY_FACTOR}", _each_split(padded_one),
                         params={"family": "padded_dense", "capacity_factor": CAPACITY_FACTOR,
                                 "align": CAPACITY_ALIGN}, supports=_supports_padded)
MOSAIC_GROUPED = tuple(
    Candidate(f"ragged_mosaic_gemm_{config.name}", _each_split(mosaic_one(config)),
              params={"family": "ragged_mosaic_gemm", **dataclasses.asdict(config)},
              supports=_supports_mosaic(config))
    for config in mosaic_grouped.GROUPED_CONFIGS)
MOSAIC_GROUPED_K = tuple(
    Candidate(f"ragged_k_mosaic_gemm_{config.name}", _each_split(mosaic_k_one(config)),
              params={"family": "ragged_k_mosaic_gemm", **dataclasses.asdict(config)},
              supports=_supports_mosaic_k(config))
    for config in mosaic_grouped_k.GROUPED_K_CONFIGS)
CUBLAS_GROUPED = Candidate("ragged_cublas_grouped", _each_split(cublas_one),
                           params={"family": "cublas_grouped", "host_syncs": cublas_grouped.HOST_SYNCS},
                           supports=_supports_cublas)
TOKAMAX = tuple(
    Candidate(f"ragged_tokamax_{implementation}", _each_split(tokamax_one(implementation)),
              params={"family": "tokamax", "implementation": implementation},
              supports=_supports_tokamax(implementation))
    for implementation in tokamax_ragged.IMPLEMENTATIONS)


def served(candidate: Candidate, problem: MatmulProblem):
    """``fn(lhs, rhs, group_sizes, *epilogue_operands)`` of one call: ``candidate`` on its
    one split, in its context (the epilogue as XLA ops after the product).

        >>> jax.jit(served(XLA_RAGGED_DOT, problem))(lhs, rhs, group_sizes)
    """
    kernel = candidate.bound(problem)

    def fn(lhs, rhs, group_sizes, *operands):
        return kernel(lhs, rhs, group_sizes[None], *operands)[0]
    return fn


def ragged_candidate_set(device: DeviceInfo) -> CandidateSet:
    """XLA's ragged_dot (candidate 0), then one group in two tiers: on a GPU the Mosaic
    grouped GEMMs, and the dense formulations and tokamax's kernels, timed only where none
    of those is valid for the key (on an H200 the dense ones lost to every valid Mosaic
    kernel, several times over, and timing them cost seconds per large key:
    benchmarks/results/moe_suite_2026-12-03_0f99d14.md; tokamax's took 1.3-2.1x our time:
    moe_suite_2026-12-03.md); a candidate the key's device does not support (tokamax not
    installed, say) is demoted by the planner, so the set is the same with or without it.

        >>> [(r.tier, [c.name for c in r.candidates]) for r in make_plan(cset, key, device).rounds]
    """
    builder = CandidateSetBuilder(device.platform, device.device_kind)
    builder.add(XLA_RAGGED_DOT)
    dense = builder.group("dense", lambda key: 1 if _grouped(key) else -1)
    for candidate in MOSAIC_GROUPED + MOSAIC_GROUPED_K + (CUBLAS_GROUPED,) if device.platform == "gpu" else ():
        builder.add(candidate, dense, lambda key: 2)
    lower = (MASKED_DENSE, PADDED_DENSE) + (TOKAMAX if device.platform == "gpu" else ())
    for candidate in lower:
        builder.add(candidate, dense, lambda key: 1)
    return builder.build()


__all__ = ["XLA_RAGGED_DOT", "MASKED_DENSE", "PADDED_DENSE", "MOSAIC_GROUPED", "MOSAIC_GROUPED_K", "CUBLAS_GROUPED",
           "TOKAMAX",
           "ragged_candidate_set", "served", "ragged_dimension_numbers", "xla_ragged_one", "capacity"]
