"""Our Mosaic GPU (Hopper, sm_90) grouped GEMM with a ragged contraction: the weight
gradient of a grouped matmul.

``out[g] = lhs[rows_g].T @ rhs[rows_g]`` for lhs (k, m), rhs (k, n) and the k rows of
group g (consecutive ranges of ``group_sizes``, clipped to k as lax clips them); an empty
group's product is zero, rows past the groups belong to none. This is the
``lax.ragged_dot_general`` that JAX's transpose rule of ``ragged_dot`` builds for the
rhs's cotangent (``x.T @ dy`` per expert).

The structure is JAX's ``jax.experimental.pallas.ops.gpu.transposed_ragged_dot_mgpu``: a
persistent grid of one CTA per SM looping over (group, m-tile, n-tile) with an L2-friendly
snake over the tiles; each tile runs a TMA pipeline over its group's k blocks only (a
trip count read from the group table), the blocks at the group's ends masked in shared
memory before the wgmma. Unlike that example:

* both operands' rows outside the group are zeroed at the ends, so a neighbouring
  group's inf or NaN never reaches this group's product (lax computes only the group);
* the output dtype is the problem's (f32 where the gradient asks for it) and its store
  tile has its own swizzle; group ends are clipped to k; the SM count is an argument, so
  it cross-lowers on a CPU;
* a tile's store to HBM is waited for only when the next tile writes the store buffer, so
  it overlaps that tile's loads; a config may put two CTAs on each SM (``ctas_per_sm``),
  for groups of a few k blocks, where every tile is mostly its pipeline's fill.

    >>> cfg = GROUPED_K_CONFIGS[0]
    >>> supports_grouped_k(4096, 14336, 8192, "bfloat16", config=cfg)
    True
    >>> out = mosaic_grouped_k_gemm(x, dy, group_sizes, config=cfg, num_sms=132)  # (groups, m, n)

What it does not serve (``supports_grouped_k`` names the reason): m or n that are not
multiples of the tile (the output tile is stored whole), k not a multiple of 8, f32 inputs, an lhs stored (m, k)
or an rhs stored (n, k) (the transpose rule writes x and dy as stored, (k, m) and (k, n)).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_autotune.kernels.gpu import mosaic_gemm as mg
from jax_autotune.kernels.gpu.mosaic_gemm import (AVAILABLE, H100_SMS, HALF_DTYPES, IMPORT_ERROR, SHARED_MEMORY_LIMIT,
                                                  Unsupported, pl, plgpu)
from jax_autotune.kernels.groups import group_bounds

# the group table's rows, one column per group
_SIZE, _START, _END, _BLOCKS, _FIRST_BLOCK = range(5)


@dataclasses.dataclass(frozen=True)
class GroupedKConfig:
    """A tile of the output (block_m x block_n), the k block, the pipeline's depth, the
    snake's width in n-tiles, and the CTAs the persistent grid puts on each SM (two: one
    CTA's pipeline fills while the other computes, where groups are a few k blocks each)."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    stages: int = 4
    grid_block_n: int = 8
    ctas_per_sm: int = 1

    @property
    def name(self) -> str:
        ctas = f"_c{self.ctas_per_sm}" if self.ctas_per_sm != 1 else ""
        return f"bm{self.block_m}_bn{self.block_n}_bk{self.block_k}_st{self.stages}_gn{self.grid_block_n}{ctas}"

    def shared_memory_bytes(self, dtype: str, out_dtype: str) -> int:
        item, out_item = np.dtype(dtype).itemsize, np.dtype(out_dtype).itemsize
        return (self.stages * self.block_k * (self.block_m + self.block_n) * item
                + self.block_m * self.block_n * out_item)


# the candidate set's fixed list (ragged.py): names must not depend on the key
GROUPED_K_CONFIGS = (
    GroupedKConfig(128, 128, 64, 4, 8),
    GroupedKConfig(64, 128, 64, 5, 8),
    GroupedKConfig(128, 64, 64, 5, 8),
    GroupedKConfig(128, 128, 64, 2, 8, ctas_per_sm=2),
)
SHORT_GROUP_BLOCKS = 4  # two CTAs per SM are tried where the mean group is this many k blocks or fewer
SM_SHARED_MEMORY = 228 * 1024  # per SM on Hopper; each resident CTA also reserves 1 KiB of it
CTA_RESERVED_SHARED_MEMORY = 1024


def supports_grouped_k(m: int, n: int, k: int, dtype: str, *, out_dtype: str | None = None,
                       config: GroupedKConfig = GROUPED_K_CONFIGS[0]) -> bool | Unsupported:
    """True where ``mosaic_grouped_k_gemm`` runs lhs (k, m), rhs (k, n), else a falsy reason.

        >>> supports_grouped_k(4096, 1000, 8192, "bfloat16")   # falsy, a str
        'n = 1000 is not a multiple of the tile's 128 columns'
    """
    dtype = np.dtype(dtype).name
    out = np.dtype(out_dtype or dtype).name
    if dtype not in HALF_DTYPES:
        return Unsupported(f"dtype must be one of {HALF_DTYPES}, got {dtype}")
    if out not in (dtype, "float32"):
        return Unsupported(f"out_dtype must be the input dtype or float32, got {out}")
    if m % config.block_m:
        return Unsupported(f"m = {m} is not a multiple of the tile's {config.block_m} rows")
    if n % config.block_n:
        return Unsupported(f"n = {n} is not a multiple of the tile's {config.block_n} columns")
    if k < 1 or k % 8:
        return Unsupported(f"k = {k} rows must be a positive multiple of 8 (the shared-memory tiling's rows, "
                           f"which Mosaic GPU folds into the TMA descriptor)")
    needed = config.shared_memory_bytes(dtype, out)
    if needed > SHARED_MEMORY_LIMIT:
        return Unsupported(f"config {config.name} needs {needed} bytes of shared memory, above {SHARED_MEMORY_LIMIT}")
    if config.ctas_per_sm > 1 and config.ctas_per_sm * (needed + CTA_RESERVED_SHARED_MEMORY) > SM_SHARED_MEMORY:
        return Unsupported(f"config {config.name}: {config.ctas_per_sm} CTAs of {needed} bytes of shared memory "
                           f"do not fit an SM's {SM_SHARED_MEMORY}")
    return True


def suits_groups(config: GroupedKConfig, k: int, groups: int) -> bool:
    """Whether ``config`` is worth timing for ``groups`` groups over k rows: two CTAs per SM
    (a shallow pipeline each) only where a mean group spans ``SHORT_GROUP_BLOCKS`` k blocks
    or fewer, so that pipeline fills, not its depth, bound the tile.

        >>> suits_groups(GroupedKConfig(ctas_per_sm=2), 16384, 128), suits_groups(GroupedKConfig(ctas_per_sm=2), 8192, 8)
        (True, False)
    """
    return config.ctas_per_sm == 1 or k <= groups * SHORT_GROUP_BLOCKS * config.block_k


def group_table(group_sizes, k: int, block_k: int):
    """(5, groups) int32: per group its size, first and end row (clipped to k), its count of
    k blocks and its first block.

        >>> group_table(jnp.array([100, 0, 300]), 256, 64)   # size, start, end, blocks, first
        [[100   0 156]
         [  0 100 100]
         [100 100 256]
         [  2   0   3]
         [  0   1   1]]
    """
    starts, ends = group_bounds(group_sizes, k)
    first = starts // block_k
    blocks = jnp.where(ends > starts, -(-ends // block_k) - first, 0)
    return jnp.stack([ends - starts, starts, ends, blocks, first]).astype(jnp.int32)


def _transforms(block_minor: int, dtype) -> tuple:
    """``mosaic_gemm``'s shared-memory tiling, with the swizzle of a ``block_minor``-wide row."""
    return mg._smem_transforms(plgpu.find_swizzle(block_minor * jnp.dtype(dtype).itemsize * 8), dtype)


def _masked(smem, keep):
    """Zero the rows of a (block_k, cols) shared-memory tile where ``keep(row)`` is false."""
    rows = plgpu.layout_cast(lax.broadcasted_iota(jnp.int32, smem.shape, 0), plgpu.Layout.WGMMA)
    smem[...] = jnp.where(keep(rows), smem[...], jnp.zeros((), smem.dtype))


def _body(table_gmem, lhs_gmem, rhs_gmem, out_gmem, *, k: int, config: GroupedKConfig):
    block_m, block_n, block_k = config.block_m, config.block_n, config.block_k
    groups, m, n = out_gmem.shape
    grid_m, grid_n = m // block_m, n // block_n
    in_transforms = _transforms(block_k, lhs_gmem.dtype)
    release = 1 if config.stages > 1 else 0

    # one output tile in shared memory per CTA, its store to HBM overlapping the next tile's
    # pipeline (waited for only before the tile after writes it)
    @functools.partial(pl.run_scoped, out_smem=plgpu.SMEM((block_m, block_n), out_gmem.dtype,
                                                          transforms=_transforms(block_n, out_gmem.dtype)))
    def _scope(out_smem):
        @plgpu.nd_loop((groups, grid_m * grid_n), collective_axes="sm")
        def _tiles(loop_info):
            g = loop_info.index[0]
            m_i, n_i = plgpu.planar_snake(loop_info.index[1], (grid_m, grid_n), 1, config.grid_block_n)
            start, end, blocks = table_gmem[_START, g], table_gmem[_END, g], table_gmem[_BLOCKS, g]
            first_row = pl.multiple_of(table_gmem[_FIRST_BLOCK, g] * block_k, block_k)

            def block_matmul(index, lhs_smem, rhs_smem, acc_ref):
                (step,) = index
                ends = [(step == 0, lambda rows: rows >= lax.rem(start, block_k)),
                        (step == blocks - 1, lambda rows: rows <= lax.rem(end - 1, block_k))]
                for at_end, keep in ends:
                    @pl.when(at_end)
                    def _(keep=keep):
                        _masked(lhs_smem, keep)
                        _masked(rhs_smem, keep)
                        plgpu.commit_smem()
                plgpu.wgmma(acc_ref, lhs_smem.T, rhs_smem)
                if not release:  # no delayed release: the slot is reused at once
                    plgpu.wgmma_wait(0)

            def acc_scope(acc_ref):
                @pl.when(blocks > 0)  # an empty group's product is the zero accumulator
                def _():
                    rows = pl.ds(first_row, k)  # past k on the last blocks; the pipeline reads only its grid's
                    plgpu.emit_pipeline(
                        lambda index, a, b: block_matmul(index, a, b, acc_ref),
                        grid=(blocks,),
                        in_specs=[plgpu.BlockSpec((block_k, block_m), lambda s: (s, m_i), delay_release=release,
                                                  transforms=in_transforms),
                                  plgpu.BlockSpec((block_k, block_n), lambda s: (s, n_i), delay_release=release,
                                                  transforms=in_transforms)],
                        max_concurrent_steps=config.stages,
                    )(lhs_gmem.at[rows, :], rhs_gmem.at[rows, :])
                plgpu.wgmma_wait(0)
                return acc_ref[...]

            acc = pl.run_scoped(acc_scope, plgpu.ACC((block_m, block_n), jnp.float32))

            plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the last tile's store has read out_smem
            out_smem[...] = acc.astype(out_smem.dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(out_smem, out_gmem.at[g, pl.ds(m_i * block_m, block_m), pl.ds(n_i * block_n, block_n)])

        plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the last store, before the CTA exits


def mosaic_grouped_k_gemm(lhs, rhs, group_sizes, *, config: GroupedKConfig, out_dtype=None,
                          num_sms: int | None = None):
    """Per group g, ``lhs[rows_g].T @ rhs[rows_g]`` (f32 accumulation) in ``out_dtype``:
    ``lax.ragged_dot_general`` with k ragged, lhs (k, m), rhs (k, n), out (groups, m, n).

    ``group_sizes`` (groups,) integers, any sizes (empty groups, sums below or above k).
    ValueError where ``supports_grouped_k`` refuses. ``num_sms`` (default: the device's count)
    sizes the persistent grid, ``config.ctas_per_sm`` CTAs per SM.

        >>> mosaic_grouped_k_gemm(x, dy, sizes, config=GROUPED_K_CONFIGS[0]).shape
        (8, 4096, 14336)
    """
    if not AVAILABLE:
        raise RuntimeError(f"mosaic_grouped_k_gemm: Mosaic GPU is unavailable: {IMPORT_ERROR}")
    if lhs.ndim != 2 or rhs.ndim != 2 or lhs.shape[0] != rhs.shape[0]:
        raise ValueError(f"mosaic_grouped_k_gemm: lhs must be (k, m) and rhs (k, n) with the same k, "
                         f"got {lhs.shape} and {rhs.shape}")
    if lhs.dtype != rhs.dtype:
        raise ValueError(f"mosaic_grouped_k_gemm: lhs and rhs dtypes differ: {lhs.dtype} and {rhs.dtype}")
    if group_sizes.ndim != 1 or group_sizes.shape[0] < 1 or not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise ValueError(f"mosaic_grouped_k_gemm: group_sizes must be (groups,) integers, groups >= 1, "
                         f"got {group_sizes.shape} {group_sizes.dtype}")
    (k, m), n = lhs.shape, rhs.shape[1]
    out_dtype = np.dtype(out_dtype or lhs.dtype).name
    reason = supports_grouped_k(m, n, k, lhs.dtype.name, out_dtype=out_dtype, config=config)
    if not reason:
        raise ValueError(f"mosaic_grouped_k_gemm {config.name}: {reason}")
    if num_sms is None:  # a device without a count (a CPU, cross-lowering): an H100's
        num_sms = getattr(jax.devices()[0], "core_count", None) or H100_SMS
    groups = group_sizes.shape[0]
    call = plgpu.kernel(
        functools.partial(_body, k=k, config=config),
        out_type=jax.ShapeDtypeStruct((groups, m, n), out_dtype),
        grid=(num_sms * config.ctas_per_sm,),
        grid_names=("sm",),
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
    )
    return call(group_table(group_sizes, k, config.block_k), lhs, rhs)


__all__ = ["AVAILABLE", "GROUPED_K_CONFIGS", "GroupedKConfig", "supports_grouped_k", "suits_groups", "group_table",
           "mosaic_grouped_k_gemm"]
