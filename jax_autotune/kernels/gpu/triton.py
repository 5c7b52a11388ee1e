"""Pallas kernels on the Triton backend: tiled GEMM, split-K GEMM and vector-matrix.

Every kernel is ``fn(lhs, rhs, problem, config, *, interpret=False)`` on the canonical
operands of a ``MatmulProblem`` (see ``jax_autotune.tuning.candidates``); transposed operands are
read in place, every edge is masked so any m, n, k and batch work, and partial products
accumulate in f32.

    >>> cfg = GemmConfig(block_m=64, block_n=128, block_k=64, group_m=8, num_warps=4,
    ...                  num_stages=4)
    >>> out = gemm(lhs, rhs, problem, cfg)                        # (batch, m, n)
    >>> out = gemm(lhs, rhs, problem, cfg.with_split_k(4))        # f32 partials + sum
    >>> out = vector_matmul(lhs, rhs, problem, VectorConfig(128, 128, 4))  # m == 1 or n == 1

f32 at ``Precision.DEFAULT`` runs the tensor cores in TF32 (as XLA does on GPU); HIGH and
HIGHEST run full-precision fp32 dots (Triton ``inputPrecision = ieee``). The
vector kernel multiplies in f32 on the CUDA cores, so it is exact at every precision.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jax_autotune.dtypes import is_floating
from jax_autotune.key import Precision
from jax_autotune.kernels.gpu.sizes import cdiv
from jax_autotune.kernels.gpu import triton_backend
from jax_autotune.kernels.gpu.triton_backend import pl_triton
from jax_autotune.problem import MatmulProblem

_SQUEEZED = pl.Squeezed() if hasattr(pl, "Squeezed") else None


# ---------------------------------------------------------------- configs

@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """Tile shape and launch parameters of the tiled GEMM (block sizes: powers of 2, >= 16).

    ``split_k > 1`` splits the contraction over that many programs per output tile,
    each writing an f32 partial; the partials are summed afterwards.
    """

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1

    def __post_init__(self):
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"GemmConfig.{name} must be a power of two >= 16, got {value}")
        if self.group_m < 1 or self.split_k < 1:
            raise ValueError(f"GemmConfig: group_m and split_k must be >= 1, got {self}")

    def with_split_k(self, split_k: int) -> "GemmConfig":
        return dataclasses.replace(self, split_k=split_k)

    @property
    def name(self) -> str:
        base = (f"bm{self.block_m}_bn{self.block_n}_bk{self.block_k}_g{self.group_m}"
                f"_w{self.num_warps}_s{self.num_stages}")
        return base if self.split_k == 1 else f"{base}_sk{self.split_k}"


@dataclasses.dataclass(frozen=True)
class VectorConfig:
    """Tiles of the vector-matrix kernel: ``block_n`` outputs per program, ``block_k``
    of the contraction per step (powers of 2)."""

    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self):
        for name in ("block_n", "block_k"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"VectorConfig.{name} must be a power of two, got {value}")

    @property
    def name(self) -> str:
        return f"bn{self.block_n}_bk{self.block_k}_w{self.num_warps}_s{self.num_stages}"


# ---------------------------------------------------------------- shared tiling helpers

def dot_precision(problem: MatmulProblem) -> lax.Precision:
    """The in-kernel dot precision: TF32 for f32 DEFAULT (like XLA), else full fp32."""
    if problem.precision == Precision.DEFAULT:
        return lax.Precision.DEFAULT
    return lax.Precision.HIGHEST


def compiler_params(num_warps: int, num_stages: int):
    return triton_backend.compiler_params(num_warps=num_warps, num_stages=num_stages)


def grouped_tile(tile: jax.Array, tiles_m: int, tiles_n: int, group_m: int):
    """(row, col) of linear output tile ``tile`` in grouped order.

    ``group_m`` consecutive row tiles sweep the columns together, so programs that run
    at the same time share rhs column panels in L2 (Triton's tutorial ordering).
    """
    per_group = group_m * tiles_n
    group = tile // per_group
    first_row = group * group_m
    rows_in_group = jnp.minimum(tiles_m - first_row, group_m)
    row = first_row + (tile % per_group) % rows_in_group
    col = (tile % per_group) // rows_in_group
    return row, col


def _span(start, size: int, bound):
    """Index slice [start, start+size) and the mask of its in-bounds entries.

    ``start`` is always a multiple of ``size`` here (tile starts), so when ``bound`` is a
    static multiple of ``size`` every entry is in bounds and the mask is None: the
    load or store is then unmasked, which lets Triton drop the predicates.
    """
    if isinstance(bound, int) and bound % size == 0:
        return pl.ds(start, size), None
    return pl.ds(start, size), (start + jnp.arange(size)) < bound


def _both(row_mask, col_mask):
    if row_mask is None and col_mask is None:
        return None
    if row_mask is None:
        return col_mask[None, :]
    if col_mask is None:
        return row_mask[:, None]
    return row_mask[:, None] & col_mask[None, :]


def _load(ref, mask, shape):
    if mask is None:
        return pl_triton.load(ref)
    return pl_triton.load(ref, mask=jnp.broadcast_to(mask, shape), other=0)


def load_tile(ref, row0, col0, rows: int, cols: int, row_bound=None, col_bound=None):
    """Masked (rows, cols) tile at (row0, col0) of a 2-D ref; out-of-bounds reads are 0.

    Bounds default to the ref's shape; a bound of ``False`` means "known in bounds, no
    mask" (a loop over whole blocks only), a traced bound masks dynamically.
    """
    row_bound = ref.shape[0] if row_bound is None else row_bound
    col_bound = ref.shape[1] if col_bound is None else col_bound
    row_slice, row_mask = _span(row0, rows, rows if row_bound is False else row_bound)
    col_slice, col_mask = _span(col0, cols, cols if col_bound is False else col_bound)
    return _load(ref.at[row_slice, col_slice], _both(row_mask, col_mask), (rows, cols))


def store_tile(ref, row0, col0, value):
    """Masked store of a 2-D ``value`` at (row0, col0) of a 2-D ref."""
    rows, cols = value.shape
    row_slice, row_mask = _span(row0, rows, ref.shape[0])
    col_slice, col_mask = _span(col0, cols, ref.shape[1])
    mask = _both(row_mask, col_mask)
    value = value.astype(ref.dtype)
    if mask is None:
        pl_triton.store(ref.at[row_slice, col_slice], value)
    else:
        pl_triton.store(ref.at[row_slice, col_slice], value,
                        mask=jnp.broadcast_to(mask, (rows, cols)))


def load_vector(ref, start, size: int):
    """Masked 1-D slice of a 1-D ref; out-of-bounds reads are 0."""
    index, mask = _span(start, size, ref.shape[0])
    return _load(ref.at[index], mask, (size,))


def load_operand_tile(ref, outer0, k0, outer: int, block_k: int, transposed: bool,
                      k_bound=None):
    """Tile of an operand as stored: (outer, block_k), or (block_k, outer) when transposed.

    ``outer`` is the operand's free axis (m for lhs, n for rhs); the stored orientation
    is kept so the dot contracts the right axis in place (no materialised transpose).
    ``k_bound``: None masks k against the ref's extent, False leaves k unmasked (whole
    blocks), a value or traced scalar masks against it.
    """
    if transposed:
        return load_tile(ref, k0, outer0, block_k, outer, row_bound=k_bound)
    return load_tile(ref, outer0, k0, outer, block_k, col_bound=k_bound)


def tile_dot(a, b, a_transposed: bool, b_rhs_major: bool, precision):
    """f32 product of an lhs tile and an rhs tile in their stored orientation.

    ``a`` is (bm, bk), or (bk, bm) when ``a_transposed``; ``b`` is (bk, bn), or (bn, bk)
    when ``b_rhs_major`` (a transposed rhs).
    """
    contract = ((0 if a_transposed else 1,), (1 if b_rhs_major else 0,))
    return lax.dot_general(a, b, (contract, ((), ())), precision=precision,
                           preferred_element_type=jnp.float32)


def _batch_spec(shape):
    """BlockSpec giving each program one whole batch entry of a (batch, ...) array."""
    return pl.BlockSpec((_SQUEEZED, *shape[1:]), lambda *idx: (idx[1],) + (0,) * (len(shape) - 1))


def _check_operands(lhs, rhs, problem: MatmulProblem):
    if tuple(lhs.shape) != problem.lhs_shape or tuple(rhs.shape) != problem.rhs_shape:
        raise ValueError(f"operands {tuple(lhs.shape)} x {tuple(rhs.shape)} do not match "
                         f"problem shapes {problem.lhs_shape} x {problem.rhs_shape}")


# ---------------------------------------------------------------- tiled / split-K GEMM

def split_k_extent(k: int, config: GemmConfig) -> int:
    """The k range of one split: a multiple of block_k covering k in ``split_k`` parts."""
    return pl.cdiv(pl.cdiv(k, config.split_k), config.block_k) * config.block_k


def _gemm_kernel(lhs_ref, rhs_ref, *refs, k: int, a_transposed: bool, b_rhs_major: bool,
                 precision, config: GemmConfig, epilogue=None, product_dtype=None):
    """One (bm, bn) output tile (of one split): whole k blocks unmasked, then a masked tail.

    The tile grid follows ``out_ref`` (m, n); operands may be larger (zero-padded copies),
    the masks follow their own extents and the store follows the output's. With an
    ``epilogue`` (elementwise; its operands' refs come before ``out_ref``) the tile is
    rounded to the product's dtype, as XLA's dot rounds it, and goes through the epilogue
    in f32 before the store.
    """
    *operand_refs, out_ref = refs
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    m, n = out_ref.shape
    tiles_m, tiles_n = pl.cdiv(m, bm), pl.cdiv(n, bn)
    row, col = grouped_tile(pl.program_id(0), tiles_m, tiles_n, config.group_m)
    m0 = pl.multiple_of(row * bm, bm)
    n0 = pl.multiple_of(col * bn, bn)
    whole = (k // bk) * bk  # k covered by whole blocks; the rest is the tail
    # the tail's start as a traced value: a static slice past the ref's end is refused
    # by jax's indexer even though the load is masked
    tail0 = pl.multiple_of(pl.program_id(0) * 0 + whole, bk)

    def block(k0, acc, k_bound):
        a = load_operand_tile(lhs_ref, m0, k0, bm, bk, a_transposed, k_bound)
        b = load_operand_tile(rhs_ref, n0, k0, bn, bk, not b_rhs_major, k_bound)
        return acc + tile_dot(a, b, a_transposed, b_rhs_major, precision)

    acc = jnp.zeros((bm, bn), jnp.float32)
    if config.split_k > 1:
        # a static trip count keeps the loop an scf.for that Triton pipelines; k is
        # masked only when the splits' whole blocks overrun it
        extent = split_k_extent(k, config)
        k_begin = pl.program_id(2) * extent
        k_bound = False if config.split_k * extent == k else k
        acc = lax.fori_loop(0, extent // bk, lambda i, acc: block(
            pl.multiple_of(k_begin + i * bk, bk), acc, k_bound), acc)
    else:
        acc = lax.fori_loop(0, whole // bk, lambda i, acc: block(
            pl.multiple_of(i * bk, bk), acc, False), acc)
        if whole < k:
            acc = block(tail0, acc, k)
    if epilogue is not None:
        acc = _epilogue_tile(acc, epilogue, operand_refs, m0, n0, bm, bn, product_dtype)
    store_tile(out_ref, m0, n0, acc)


def _epilogue_tile(acc, epilogue, operand_refs, m0, n0, bm: int, bn: int, product_dtype):
    """The epilogue on one output tile, its operands' tiles loaded beside it."""
    tiles = []
    for ref, operand in zip(operand_refs, epilogue.operands):
        if operand.role == "row":
            tile = load_vector(ref, n0, bn)
        elif operand.role == "col":
            tile = load_vector(ref, m0, bm)
        else:  # full; scalars come as rows (``gemm_call``)
            tile = load_tile(ref, m0, n0, bm, bn)
        tiles.append(tile.astype(jnp.float32) if is_floating(tile.dtype) else tile)
    y = acc.astype(product_dtype).astype(jnp.float32)
    return epilogue.apply(y, tiles, compute_dtype="float32")


def gemm_call(lhs, rhs, config: GemmConfig, *, out_shape, out_dtype, a_transposed: bool,
              b_rhs_major: bool, precision, interpret: bool = False, name: str = "gemm",
              epilogue=None, operands=()):
    """The tiled GEMM on 3-D operands in any stored orientation; (batch, m, n) out_dtype.

    ``lhs`` is (batch, m', K) or (batch, K, m') when ``a_transposed``; ``rhs`` is
    (batch, K, n') or (batch, n', K) when ``b_rhs_major``; m' >= m and n' >= n (padded
    operands are fine: the output's own m and n set the grid and the store mask). An
    elementwise ``epilogue`` with its ``operands`` (role shapes) is applied to each tile
    before its store; the result is then in the epilogue's result dtype.
    """
    batch, m, n = out_shape
    k = lhs.shape[1] if a_transposed else lhs.shape[2]
    if (rhs.shape[2] if b_rhs_major else rhs.shape[1]) != k:
        raise ValueError(f"gemm_call: contraction lengths differ: {lhs.shape} x {rhs.shape}")
    tiles = pl.cdiv(m, config.block_m) * pl.cdiv(n, config.block_n)
    split = config.split_k
    fused = epilogue is not None and not epilogue.is_bare
    if fused and (split > 1 or not epilogue.elementwise):
        raise ValueError(f"gemm_call: an epilogue is applied in the kernel only when it is "
                         f"elementwise and k is not split, got {epilogue} with split_k {split}")
    if fused and any(o.role == "scalar" for o in epilogue.operands):  # loaded as rows
        operands = tuple(jnp.broadcast_to(x, (n,)) if o.role == "scalar" else x
                         for o, x in zip(epilogue.operands, operands))
        epilogue = epilogue.scalars_as_rows()
    kernel = functools.partial(_gemm_kernel, k=k, a_transposed=a_transposed,
                               b_rhs_major=b_rhs_major, precision=precision, config=config,
                               epilogue=epilogue if fused else None, product_dtype=jnp.dtype(out_dtype))
    operand_specs = [_operand_spec(o.role, x.shape) for o, x in zip(epilogue.operands, operands)] if fused else []
    if fused:
        out_dtype = epilogue.result(batch, m, n, jnp.dtype(out_dtype).name)[1]
    if split > 1:
        grid = (tiles, batch, split)
        call_shape = jax.ShapeDtypeStruct((split, batch, m, n), jnp.float32)
        out_spec = pl.BlockSpec((_SQUEEZED, _SQUEEZED, m, n), lambda t, b, s: (s, b, 0, 0))
    else:
        grid = (tiles, batch)
        call_shape = jax.ShapeDtypeStruct((batch, m, n), jnp.dtype(out_dtype))
        out_spec = _batch_spec((batch, m, n))
    out = pl.pallas_call(
        kernel,
        out_shape=call_shape,
        grid=grid,
        in_specs=[_batch_spec(lhs.shape), _batch_spec(rhs.shape), *operand_specs],
        out_specs=out_spec,
        compiler_params=compiler_params(config.num_warps, config.num_stages),
        interpret=interpret,
        name=f"{name}_{config.name}" + ("_epilogue" if fused else ""),
    )(lhs, rhs, *(operands if fused else ()))
    if split > 1:
        out = out.sum(axis=0)
    return out.astype(out_dtype)


def _operand_spec(role: str, shape):
    """An epilogue operand's block: all of a row, a batch entry's column or tile rows."""
    if role == "row":
        return pl.BlockSpec(tuple(shape), lambda *idx: (0,))
    if role in ("col", "full"):
        return _batch_spec(shape)
    raise ValueError(f"gemm_call: a {role} operand is not applied in the kernel")


def gemm(lhs, rhs, problem: MatmulProblem, config: GemmConfig, *operands, interpret: bool = False):
    """Tiled GEMM (split-K when ``config.split_k > 1``); returns (batch, m, n) out_dtype,
    or, with the epilogue's ``operands``, ``problem.epilogue`` applied in the kernel.

    >>> gemm(lhs, rhs, problem, GemmConfig(64, 64, 32), interpret=True)
    >>> gemm(lhs, rhs, problem_with_bias_gelu, config, bias, interpret=True)
    """
    _check_operands(lhs, rhs, problem)
    return gemm_call(lhs, rhs, config, out_shape=problem.out_shape,
                     out_dtype=jnp.dtype(problem.out_dtype), a_transposed=problem.transpose_a,
                     b_rhs_major=problem.transpose_b, precision=dot_precision(problem),
                     interpret=interpret, epilogue=problem.epilogue if operands or
                     not problem.epilogue.is_bare else None, operands=operands)


# ---------------------------------------------------------------- vector x matrix

def _vector_kernel(vec_ref, mat_ref, out_ref, *, k: int, mat_n_major: bool,
                   config: VectorConfig):
    bn, bk = config.block_n, config.block_k
    n0 = pl.multiple_of(pl.program_id(0) * bn, bn)

    def step(i, acc):
        k0 = pl.multiple_of(i * bk, bk)
        x = load_vector(vec_ref, k0, bk).astype(jnp.float32)
        tile = load_operand_tile(mat_ref, n0, k0, bn, bk, not mat_n_major, k).astype(jnp.float32)
        if mat_n_major:  # tile is (bn, bk)
            return acc + jnp.sum(tile * x[None, :], axis=1)
        return acc + jnp.sum(tile * x[:, None], axis=0)  # tile is (bk, bn)

    acc = lax.fori_loop(0, pl.cdiv(k, bk), step, jnp.zeros((bn,), jnp.float32))
    index, mask = _span(n0, bn, out_ref.shape[0])
    if mask is None:
        pl_triton.store(out_ref.at[index], acc.astype(out_ref.dtype))
    else:
        pl_triton.store(out_ref.at[index], acc.astype(out_ref.dtype), mask=mask)


def vector_matmul(lhs, rhs, problem: MatmulProblem, config: VectorConfig, *,
                  interpret: bool = False):
    """Matrix-vector product for m == 1 (VecMat) or n == 1 (MatVec); (batch, m, n) out.

    Both are one kernel, out[j] = sum_k vec[k] * mat[k, j]: for n == 1 the matrix is the
    lhs seen from the other side (its stored (m, k) rows are the outputs).

    >>> vector_matmul(x, w, problem, VectorConfig(block_n=128, block_k=128))
    """
    _check_operands(lhs, rhs, problem)
    if problem.m == 1:
        vec, mat, length = lhs, rhs, problem.n
        mat_n_major = problem.transpose_b  # rhs stored (batch, n, k)
    elif problem.n == 1:
        vec, mat, length = rhs, lhs, problem.m
        mat_n_major = not problem.transpose_a  # lhs stored (batch, m, k)
    else:
        raise ValueError(f"vector_matmul needs m == 1 or n == 1, got m={problem.m} "
                         f"n={problem.n}")
    vec = vec.reshape(problem.batch, problem.k)  # a (1, k) or (k, 1) matrix: free reshape
    out = pl.pallas_call(
        functools.partial(_vector_kernel, k=problem.k, mat_n_major=mat_n_major, config=config),
        out_shape=jax.ShapeDtypeStruct((problem.batch, length), jnp.dtype(problem.out_dtype)),
        grid=(pl.cdiv(length, config.block_n), problem.batch),
        in_specs=[_batch_spec(vec.shape), _batch_spec(mat.shape)],
        out_specs=_batch_spec((problem.batch, length)),
        compiler_params=compiler_params(config.num_warps, config.num_stages),
        interpret=interpret,
        name=f"vector_matmul_{config.name}",
    )(vec, mat)
    return out.reshape(problem.out_shape)


def tile_count(problem: MatmulProblem, config: GemmConfig) -> int:
    """Programs a GEMM launch runs: output tiles x batch x splits."""
    return (cdiv(problem.m, config.block_m) * cdiv(problem.n, config.block_n)
            * problem.batch * config.split_k)


def shared_memory_bytes(config: GemmConfig, itemsize: int) -> int:
    """Pipelined operand buffers Triton allocates: stages x (A tile + B tile)."""
    stages = max(config.num_stages, 1)
    return stages * (config.block_m + config.block_n) * config.block_k * itemsize


__all__ = [
    "GemmConfig", "VectorConfig", "gemm", "gemm_call", "vector_matmul", "grouped_tile", "load_tile",
    "store_tile", "load_vector", "load_operand_tile", "tile_dot", "dot_precision",
    "compiler_params", "split_k_extent", "tile_count", "shared_memory_bytes",
]
