"""Our Mosaic GPU (Hopper, sm_90) grouped GEMM, ``lax.ragged_dot`` with ragged m.

``out[r] = lhs[r] @ rhs[g(r)]`` for the rows r of group g (groups are consecutive row
ranges of ``group_sizes``), rows past ``sum(group_sizes)`` zero, as lax gives them.
The structure is ``mosaic_gemm``'s (persistent grid of one CTA per SM, a producer
warpgroup streaming TMA loads through ``stages`` slots, two consumer warpgroups issuing
wgmma side by side along n), over the tiles of JAX's
``jax.experimental.pallas.ops.gpu.ragged_dot_mgpu``: an m-tile is a (group, row block)
pair, lhs rows are loaded by block (rows of a neighbouring group are computed, never
stored) and each tile stores only its group's rows through a ladder of TMA stores of
2**i rows. Unlike that example:

* the (group, block) pairs come from a small int32 table XLA builds from the group sizes
  (one tiny fusion before the kernel), so the kernel reads 4 scalars a tile whatever the
  number of groups; empty groups and unused tiles skip the pipeline;
* rows past ``sum(group_sizes)`` (clipped to m, as lax does) are a pseudo-group whose
  tiles skip the pipeline and store zeros: no ``where`` after the kernel;
* partial tiles in m, n and k (TMA zero-fills loads past the edge, stores are clipped),
  warp specialisation (lowers on jax 0.10.2 and 0.11.2), and the SM count as an
  argument, so it cross-lowers on a CPU.

On an H200 (jax 0.11.2, bf16, ``benchmarks/mosaic_grouped_probe.py``) it matched
``lax.ragged_dot`` bit for bit and ran Mixtral's up projection (8192x4096 -> 14336, 8
groups) in 1.29 ms against XLA's 10.0 ms and 1.17 ms for the dense matmul of the same
FLOPs; Qwen-MoE's (16384x2048 -> 768, 128 groups) in 131 us (XLA 9.3 ms, dense 66 us:
its 128 experts' weights, 400 MB, are read once).

    >>> cfg = configs_for_grouped(8192, 14336, 4096, 8, "bfloat16")[0]
    >>> supports_grouped(8192, 14336, 4096, 8, "bfloat16", config=cfg)
    True
    >>> out = mosaic_grouped_gemm(x, w, group_sizes, config=cfg, num_sms=132)   # (m, n)

What it does not serve (``supports_grouped`` names the reason): the global-array
alignment of ``mosaic_gemm`` (m and the rhs's row count multiples of 8, minor extents of
32 bytes; Mosaic GPU folds the shared-memory tiling into the TMA descriptor); output rows
that are not a multiple of 128 bytes (n % 64 in bf16, n % 32 in f32; every MoE width
is), since Mosaic infers the store tile's tiling (as for JAX's example, a 128-byte
swizzle) so the ladder may slice it at any row; f32 inputs; split-K; and configs whose
warpgroups split m (``wg_dimension="M"``) or whose store tile is not the warpgroup's
full rows (``epi_tile_m != tile_m``): the ladder stores a group's rows of the whole tile.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_autotune.kernels.gpu import mosaic_gemm as mg
from jax_autotune.kernels.gpu.mosaic_gemm import (AVAILABLE, H100_SMS, HALF_DTYPES, IMPORT_ERROR,
                                                  SHARED_MEMORY_LIMIT, MosaicGemmConfig, Unsupported,
                                                  pl, plgpu)
from jax_autotune.kernels.gpu.sizes import cdiv
from jax_autotune.kernels.groups import group_bounds

# the table's rows, one column per m-tile
_GROUP, _BLOCK, _FIRST, _ROWS = range(4)


# ---------------------------------------------------------------- what it serves

def supports_grouped(m: int, n: int, k: int, groups: int, dtype: str, *, transpose_rhs: bool = False,
                     out_dtype: str | None = None, config: MosaicGemmConfig | None = None) -> bool | Unsupported:
    """True where ``mosaic_grouped_gemm`` runs the problem with no copy, else a falsy reason.

    Served: bf16/f16 lhs (m, k) and rhs (groups, k, n) or (groups, n, k), out_dtype the
    input dtype or f32, ``mosaic_gemm.supports``'s alignment rules, a config with
    ``wg_dimension="N"``, ``split_k=1`` and ``epi_tile_m == tile_m`` that fits shared memory
    (no config: the shapes alone, for ``GROUPED_CONFIGS``' tiles).

        >>> supports_grouped(1000, 1040, 1008, 8, "bfloat16")   # falsy, a str
        "the output's rows (1040 x bfloat16) are not a multiple of 128 bytes, ..."
    """
    dtype = np.dtype(dtype).name
    if dtype not in HALF_DTYPES:
        return Unsupported(f"dtype must be one of {HALF_DTYPES}, got {dtype}")
    if groups < 1:
        return Unsupported(f"groups must be >= 1, got {groups}")
    given, config = config, config or GROUPED_CONFIGS[0]
    if config.wg_dimension != "N" or config.split_k != 1 or config.epi_tile_m != config.tile_m:
        return Unsupported(f"config {config.name}: the grouped kernel needs wg_dimension='N', split_k=1 and "
                           f"epi_tile_m == tile_m (a group's rows are stored from the whole tile), got "
                           f"wg_dimension={config.wg_dimension!r}, split_k={config.split_k}, "
                           f"epi_tile_m={config.epi_tile_m}, tile_m={config.tile_m}")
    out = np.dtype(out_dtype or dtype)
    if n * out.itemsize % _out_swizzle(config, out):
        return Unsupported(f"the output's rows ({n} x {out.name}) are not a multiple of {_out_swizzle(config, out)} "
                           f"bytes, the swizzle Mosaic GPU infers for the store tile and folds into its TMA")
    return mg.supports(m, n, k, dtype, transpose_rhs=transpose_rhs, out_dtype=out_dtype, config=given)


def _out_swizzle(config: MosaicGemmConfig, out_dtype) -> int:
    """Bytes of the swizzle Mosaic GPU infers for the (untransformed) store tile."""
    return min(128, config.epi_tile_n * np.dtype(out_dtype).itemsize)


# ---------------------------------------------------------------- configs

# the candidate set's fixed list (ragged.py): names must not depend on the key
GROUPED_CONFIGS = (
    MosaicGemmConfig(tile_m=128, tile_n=128, tile_k=64, stages=3, epi_tile_m=128),  # 128x256 CTA tile
    MosaicGemmConfig(tile_m=64, tile_n=128, tile_k=64, stages=4, epi_tile_m=64),    # small groups
    MosaicGemmConfig(tile_m=128, tile_n=64, tile_k=64, stages=4, epi_tile_m=128),   # narrow n
)


def fitted(config: MosaicGemmConfig, dtype: str, out_dtype: str | None = None) -> MosaicGemmConfig | None:
    """``config`` with fewer stages (then a narrower store tile) until it fits shared
    memory, or None."""
    while not mg.fits_shared_memory(config, dtype, out_dtype):
        if config.stages > 2:
            config = dataclasses.replace(config, stages=config.stages - 1)
        elif config.epi_tile_n > 32:
            config = dataclasses.replace(config, epi_tile_n=config.epi_tile_n // 2)
        else:
            return None
    return config


def configs_for_grouped(m: int, n: int, k: int, groups: int, dtype: str, *, num_sms: int = H100_SMS,
                        out_dtype: str | None = None, limit: int = 3) -> tuple[MosaicGemmConfig, ...]:
    """A few of ``GROUPED_CONFIGS`` for a problem, best first (not a sweep).

    Each is scored by useful rows over computed rows (a group boundary inside a row block
    computes that block twice; the estimate takes equal groups), times useful columns over
    computed ones, times the SMs' busy fraction, times the square root of the tile's
    reuse per byte loaded relative to the 128x256 tile's (on an H200, Mixtral's up
    projection ran 1.29 ms at 128x256, 1.52 ms at 128x128, 1.88 ms at 64x256); configs
    are fitted to shared memory.

        >>> [c.name for c in configs_for_grouped(8192, 14336, 4096, 8, "bfloat16")]
        ['tm128_tn128_tk64_st3_wgN_gN8', 'tm128_tn64_tk64_st4_wgN_gN8', 'tm64_tn128_tk64_st4_wgN_gN8']
    """
    scored = []
    for base in GROUPED_CONFIGS:
        config = fitted(base, dtype, out_dtype)
        if config is None:
            continue
        cta_m, cta_n = config.cta_tile
        per_group = max(1, m // groups)
        row_blocks = groups * cdiv(per_group, cta_m) + (groups - 1 if per_group % cta_m else 0)
        rows_eff = m / (min(row_blocks, cdiv(m, cta_m) + groups) * cta_m)
        cols_eff = n / (cdiv(n, cta_n) * cta_n)
        tiles = min(row_blocks, cdiv(m, cta_m) + groups) * cdiv(n, cta_n)
        reuse = (cta_m * cta_n / (cta_m + cta_n)) / (128 * 256 / 384)
        scored.append((rows_eff * cols_eff * mg._wave_efficiency(tiles, num_sms) * reuse ** 0.5, config))
    scored.sort(key=lambda item: -item[0])
    return tuple(config for _, config in scored[:limit])


# ---------------------------------------------------------------- the tile table

def tile_table(group_sizes, m: int, tile_m: int):
    """(4, cdiv(m, tile_m) + groups) int32: per m-tile its group (``groups``: the rows past
    the groups, stored as zeros), its row block, the group's first row inside the block,
    and the group's row count there (0: the tile is skipped).

    Groups end where lax ends them: the cumulative sizes clipped to m.

        >>> tile_table(jnp.array([100, 0, 300]), 512, 128)[:, :5]   # group, block, first, rows
        [[  0   2   2   2   2]
         [  0   0   1   2   3]
         [  0 100   0   0   0]
         [100  28 128 128  16]]
    """
    groups = group_sizes.shape[0]
    starts, ends = group_bounds(group_sizes, m)
    starts = jnp.concatenate([starts, ends[-1:]])  # the pseudo-group [sum, m): zeros
    ends = jnp.concatenate([ends, jnp.full((1,), m, jnp.int32)])
    first_block = starts // tile_m
    count = jnp.where(ends > starts, (ends - 1) // tile_m - first_block + 1, 0)  # row blocks a group touches
    last_tile = jnp.cumsum(count)  # one past each group's last tile
    tile = jnp.arange(cdiv(m, tile_m) + groups, dtype=jnp.int32)
    group = jnp.sum(tile[:, None] >= last_tile[None, :], axis=1).astype(jnp.int32)  # groups + 1: unused
    g = jnp.minimum(group, groups)
    block = first_block[g] + tile - (last_tile[g] - count[g])
    row0 = block * tile_m
    lo, hi = jnp.maximum(starts[g], row0), jnp.minimum(ends[g], row0 + tile_m)
    rows = jnp.where(group <= groups, hi - lo, 0)
    return jnp.stack([g, block, lo - row0, rows]).astype(jnp.int32)


# ---------------------------------------------------------------- the kernel

@dataclasses.dataclass(frozen=True)
class _Plan:
    m: int
    n: int
    k: int
    groups: int
    transpose_rhs: bool
    config: MosaicGemmConfig


def _body(table_gmem, a_gmem, b_gmem, out_gmem, *, plan: _Plan):
    cfg = plan.config
    tile_m, tile_n, tile_k = cfg.tile_m, cfg.tile_n, cfg.tile_k
    cta_n = 2 * tile_n
    epi_n = cfg.epi_tile_n
    dtype, out_dtype = a_gmem.dtype, out_gmem.dtype
    m_tiles, n_tiles = table_gmem.shape[1], cdiv(plan.n, cta_n)
    k_steps = cdiv(plan.k, tile_k)
    slots = mg._store_slots(cfg)

    swizzle, _ = mg._swizzles(plan.m, plan.n, plan.k, dtype, out_dtype, False, plan.transpose_rhs, cfg)
    transforms = mg._smem_transforms(swizzle, dtype)
    b_block, b_index = (((cta_n, tile_k), lambda k: (0, k)) if plan.transpose_rhs
                        else ((tile_k, cta_n), lambda k: (k, 0)))

    def pipeline(body, compute_context):
        return plgpu.emit_pipeline_warp_specialized(
            body,
            grid=(k_steps,),
            memory_registers=40,
            in_specs=[plgpu.BlockSpec((tile_m, tile_k), lambda k: (0, k), transforms=transforms,
                                      memory_space=plgpu.SMEM),
                      plgpu.BlockSpec(b_block, b_index, transforms=transforms, memory_space=plgpu.SMEM)],
            wg_axis="wg",
            num_compute_wgs=2,
            max_concurrent_steps=min(cfg.stages, k_steps),
            compute_context=compute_context,
        )

    ignore = lambda *_, **__: None
    scratch = dict(
        pipeline_allocs=pipeline(ignore, ignore).get_allocations(a_gmem, b_gmem.at[0]),
        # no transforms, as JAX's ragged_dot_mgpu: Mosaic infers the swizzled tiling and
        # the ladder's stores of fewer than 8 rows go through it (``_out_swizzle``)
        out_smem=plgpu.SMEM((2, slots, tile_m, epi_n), out_dtype),
    )

    @functools.partial(pl.run_scoped, **scratch, collective_axes="wg")
    def _scope(pipeline_allocs, out_smem):
        wg = lax.axis_index("wg")

        @plgpu.nd_loop((m_tiles * n_tiles,), collective_axes="sm")
        def _tiles(loop_info):
            (lin,) = loop_info.index
            t, n_idx = plgpu.planar_snake(lin, (m_tiles, n_tiles), int(cfg.grid_minor == "N"),
                                          cfg.grid_tile_width)
            # a block index, not a row: the row's divisibility by tile_m must show for the tiled TMA
            group, row0 = table_gmem[_GROUP, t], table_gmem[_BLOCK, t] * tile_m
            first, rows = table_gmem[_FIRST, t], table_gmem[_ROWS, t]
            n0 = n_idx * cta_n + wg * tile_n  # this warpgroup's first column

            def store(acc):
                """The group's rows of the (tile_m, tile_n) f32 tile, by column chunks."""
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                for j in range(tile_n // epi_n):
                    slot = j % slots
                    plgpu.wait_smem_to_gmem(1, wait_read_only=True)
                    out_smem[wg, slot] = acc[:, j * epi_n:(j + 1) * epi_n].astype(out_dtype)
                    plgpu.commit_smem()
                    _store_rows(out_smem.at[wg, slot], out_gmem, row0, first, rows, n0 + j * epi_n,
                                min(tile_m, plan.m))
                    plgpu.commit_smem_to_gmem_group()

            def compute_context(eval_pipeline):
                @functools.partial(pl.run_scoped, acc_ref=plgpu.ACC((tile_m, tile_n), jnp.float32))
                def _acc(acc_ref):
                    eval_pipeline(acc_ref)
                    store(acc_ref[...])

            def mma(_, a_smem, b_smem, acc_ref):
                wg_n = pl.ds(wg * tile_n, tile_n)
                plgpu.wgmma(acc_ref, a_smem, b_smem.at[wg_n].T if plan.transpose_rhs else b_smem.at[:, wg_n])
                plgpu.wgmma_wait(0)
                return acc_ref

            @pl.when((rows > 0) & (group < plan.groups))
            def _product():
                cols = pl.ds(n_idx * cta_n, cta_n)
                b_view = b_gmem.at[group, cols, :] if plan.transpose_rhs else b_gmem.at[group, :, cols]
                pipeline(mma, compute_context)(a_gmem.at[pl.ds(row0, tile_m), :], b_view,
                                               allocations=pipeline_allocs)

            @pl.when((rows > 0) & (group == plan.groups) & (wg < 2))
            def _zeros():  # rows past the groups: a fresh accumulator is zero
                compute_context(lambda acc_ref: None)

    plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def _store_rows(smem, out_gmem, row0, first, rows, col0, most: int):
    """TMA-store rows [first, first + rows) of ``smem`` (tile_m, cols) to rows row0 + first...
    of ``out_gmem`` at column ``col0``: one store of 2**i rows for each bit i of ``rows``
    (at most ``most``), as JAX's ragged_dot_mgpu; columns past n are clipped."""
    cols = smem.shape[1]
    start = first
    size = 1 << (most.bit_length() - 1)
    while size:
        @pl.when(rows & size != 0)
        def _(size=size, start=start):
            plgpu.copy_smem_to_gmem(smem.at[pl.ds(start, size)],
                                    out_gmem.at[pl.ds(row0 + start, size), pl.ds(col0, cols)], commit_group=False)
        start = start + (rows & size)
        size //= 2


def mosaic_grouped_gemm(lhs, rhs, group_sizes, *, config: MosaicGemmConfig, transpose_rhs: bool = False,
                        out_dtype=None, num_sms: int | None = None):
    """``lax.ragged_dot(lhs, rhs, group_sizes)`` (f32 accumulation) in ``out_dtype``.

    ``lhs`` (m, k), ``rhs`` (groups, k, n) or, ``transpose_rhs``, (groups, n, k),
    ``group_sizes`` (groups,) integers; any sizes: empty groups, a sum below m (the rest
    of the rows zero) or above it (clipped). ValueError where ``supports_grouped`` refuses.
    ``num_sms`` sizes the persistent grid (default: the device's count).

        >>> mosaic_grouped_gemm(x, w, sizes, config=GROUPED_CONFIGS[0]).shape
        (8192, 14336)
    """
    if not AVAILABLE:
        raise RuntimeError(f"mosaic_grouped_gemm: Mosaic GPU is unavailable: {IMPORT_ERROR}")
    if lhs.ndim != 2 or rhs.ndim != 3:
        raise ValueError(f"mosaic_grouped_gemm: lhs must be (m, k) and rhs (groups, k, n) or (groups, n, k), "
                         f"got {lhs.shape} and {rhs.shape}")
    if lhs.dtype != rhs.dtype:
        raise ValueError(f"mosaic_grouped_gemm: lhs and rhs dtypes differ: {lhs.dtype} and {rhs.dtype}")
    m, k = lhs.shape
    groups, n, k2 = rhs.shape if transpose_rhs else (rhs.shape[0], rhs.shape[2], rhs.shape[1])
    if k != k2:
        raise ValueError(f"mosaic_grouped_gemm: contraction lengths differ: lhs {lhs.shape} and rhs {rhs.shape} "
                         f"(transpose_rhs={transpose_rhs})")
    if group_sizes.shape != (groups,) or not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise ValueError(f"mosaic_grouped_gemm: group_sizes must be ({groups},) integers (one per rhs group), "
                         f"got {group_sizes.shape} {group_sizes.dtype}")
    out_dtype = np.dtype(out_dtype or lhs.dtype).name
    reason = supports_grouped(m, n, k, groups, lhs.dtype.name, transpose_rhs=transpose_rhs, out_dtype=out_dtype,
                              config=config)
    if not reason:
        raise ValueError(f"mosaic_grouped_gemm {config.name}: {reason}")
    if num_sms is None:  # a device without a count (a CPU, cross-lowering): an H100's
        num_sms = getattr(jax.devices()[0], "core_count", None) or H100_SMS
    table = tile_table(group_sizes.astype(jnp.int32), m, config.tile_m)
    call = plgpu.kernel(
        functools.partial(_body, plan=_Plan(m, n, k, groups, transpose_rhs, config)),
        out_type=jax.ShapeDtypeStruct((m, n), out_dtype),
        grid=(num_sms,),
        grid_names=("sm",),
        num_threads=3,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
    )
    return call(table, lhs, rhs)


__all__ = ["AVAILABLE", "IMPORT_ERROR", "SHARED_MEMORY_LIMIT", "GROUPED_CONFIGS", "supports_grouped",
           "configs_for_grouped", "fitted", "tile_table", "mosaic_grouped_gemm"]
