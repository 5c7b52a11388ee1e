"""Our Mosaic GPU (Hopper, sm_90) GEMM: persistent, warp-specialised, TMA + wgmma, ragged edges in-kernel.

One CTA per SM loops over output tiles in a planar-snake raster (L2 reuse); in each
CTA a producer warpgroup streams A and B tiles through ``stages`` shared-memory slots
with TMA while two consumer warpgroups issue wgmma into f32 accumulators (the CTA tile
is two warpgroup tiles along ``wg_dimension``), as in JAX's
``jax.experimental.pallas.ops.gpu.hopper_matmul_mgpu``. Unlike that example:

* partial tiles in-kernel: edge loads past m, n or k are zero-filled by TMA (a ragged
  last k block adds zeros) and edge stores are clipped, so nothing is padded or sliced;
* transposed operands are read as stored (lhs (k, m), rhs (n, k)) and transposed by the
  shared-memory view wgmma reads (16-bit dtypes; f32 runs TF32 wgmma and needs K-major
  operands: lhs (m, k), rhs stored (n, k));
* a leading batch axis and split-K (f32 partials (splits * batch, m, n), summed by XLA)
  are folded into the persistent loop;
* an elementwise epilogue (``jax_autotune.epilogue.Epilogue`` or a callable on f32
  tiles) runs in registers before the store; its operands come in by TMA;
* the SM count is an argument (``num_sms``), so it cross-lowers on a CPU machine.

    >>> cfg = MosaicGemmConfig(tile_m=128, tile_n=128, tile_k=64, stages=4)
    >>> supports(2048, 50304, 768, "bfloat16", transpose_rhs=True)
    True
    >>> out = mosaic_gemm(x, w, config=cfg, transpose_rhs=True, num_sms=132)   # (m, n)
    >>> out = mosaic_gemm(x, w, config=cfg, epilogue=Epilogue.parse(
    ...     "row:bfloat16|add(y,$0);relu(%0)"), epilogue_operands=(bias,))

What it cannot serve without a copy (``supports`` names the reason): Mosaic GPU (jax
0.10.2 and 0.11.2) folds the shared-memory tiling, 8 rows x one swizzle width of columns,
into the TMA descriptor, so the *global* arrays must divide into it: every stored
operand's row count (m, or k for a transposed lhs; k, or n for a transposed rhs) must be
a multiple of 8, every stored operand's minor extent a multiple of 32 bytes (16 bf16/f16
elements, wgmma's narrowest swizzle) and the output's n a multiple of 16 bytes. The
vocabulary head 2048x50257x768 (50257 odd), 4095^3 and k=7 or k=1000 (bf16) therefore
need XLA to pad the odd extent (a copy); partial CTA tiles (m=1000, n=1032 with tiles of
128/256) need none. This module never pads.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_autotune.epilogue import ROLES, Epilogue, Operand
from jax_autotune.kernels.gpu.sizes import ROW_ALIGN_BYTES, cdiv, two_warpgroup_tile
from jax_autotune.tuning.device import shared_memory_for_capability

try:
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    _NEEDED = ("kernel", "emit_pipeline_warp_specialized", "nd_loop", "planar_snake", "find_swizzle",
               "TilingTransform", "SwizzleTransform", "ACC", "wgmma", "wgmma_wait", "Barrier",
               "copy_smem_to_gmem", "copy_gmem_to_smem", "barrier_wait", "commit_smem",
               "wait_smem_to_gmem", "CompilerParams", "LoweringSemantics")
    _missing = [name for name in _NEEDED if not hasattr(plgpu, name)]
    if _missing:
        raise ImportError(f"jax.experimental.pallas.mosaic_gpu lacks {', '.join(_missing)}")
    AVAILABLE = True
    IMPORT_ERROR: str | None = None
except Exception as err:  # noqa: BLE001 - any import failure just disables the family
    pl = plgpu = None
    AVAILABLE = False
    IMPORT_ERROR = f"{type(err).__name__}: {err}"

SHARED_MEMORY_LIMIT = shared_memory_for_capability((9, 0))  # per block on Hopper (sm_90)
H100_SMS = 132  # H100 SXM and H200 both have 132 SMs
HALF_DTYPES = ("bfloat16", "float16")
DTYPES = HALF_DTYPES + ("float32",)
_BARRIER_BYTES = 1024  # mbarriers and alignment slack
_TMA_ROWS = 8  # the row tile of the shared-memory tiling


@dataclasses.dataclass(frozen=True)
class MosaicGemmConfig:
    """One warpgroup's tile, the k step, pipeline depth, grid raster and split-K.

    The CTA tile is two warpgroup tiles along ``wg_dimension`` ("M" or "N"). The
    persistent grid walks tiles in planar-snake bands ``grid_tile_width`` tiles wide
    along ``grid_minor`` ("M" or "N"). ``split_k`` > 1 gives each of that many k ranges
    its own tiles and an f32 partial output. ``epi_tile_m`` x ``epi_tile_n`` is the
    sub-tile the epilogue stores at a time.
    """

    tile_m: int = 128
    tile_n: int = 128
    tile_k: int = 64
    stages: int = 4
    wg_dimension: str = "N"
    grid_minor: str = "N"
    grid_tile_width: int = 8
    split_k: int = 1
    epi_tile_m: int = 64
    epi_tile_n: int = 64

    def __post_init__(self):
        for name in ("wg_dimension", "grid_minor"):
            if getattr(self, name) not in ("M", "N"):
                raise ValueError(f"MosaicGemmConfig.{name} must be 'M' or 'N', got {getattr(self, name)!r}")
        if self.tile_m % 64 or self.tile_n % 8 or not 8 <= self.tile_n <= 256 or self.tile_k % 16:
            raise ValueError(f"MosaicGemmConfig: tile_m must be a multiple of 64 (a wgmma), tile_n of 8 "
                             f"in [8, 256] and tile_k of 16, got {self}")
        if self.tile_m % self.epi_tile_m or self.tile_n % self.epi_tile_n or self.epi_tile_m % 8:
            raise ValueError(f"MosaicGemmConfig: the epilogue tile must divide the warpgroup tile, got {self}")
        if self.stages < 2 or self.grid_tile_width < 1 or self.split_k < 1:
            raise ValueError(f"MosaicGemmConfig: stages >= 2, grid_tile_width >= 1, split_k >= 1, got {self}")

    @property
    def cta_tile(self) -> tuple[int, int]:
        """(rows, cols) of the output one CTA computes per step: two warpgroups' tiles."""
        return two_warpgroup_tile(self.tile_m, self.tile_n, self.wg_dimension)

    @property
    def name(self) -> str:
        base = (f"tm{self.tile_m}_tn{self.tile_n}_tk{self.tile_k}_st{self.stages}_wg{self.wg_dimension}"
                f"_g{self.grid_minor}{self.grid_tile_width}")
        return base if self.split_k == 1 else f"{base}_sk{self.split_k}"


def shared_memory_bytes(config: MosaicGemmConfig, dtype: str, out_dtype: str | None = None,
                        operands: Sequence[tuple[str, str]] = ()) -> int:
    """Shared memory the kernel allocates: operand stages, two warpgroups' store slots and
    each epilogue operand's tile (``operands``: (role, dtype) pairs)."""
    itemsize = np.dtype(dtype).itemsize
    out_itemsize = 4 if config.split_k > 1 else np.dtype(out_dtype or dtype).itemsize
    cta_m, cta_n = config.cta_tile
    stages = config.stages * (cta_m + cta_n) * config.tile_k * itemsize
    epi_m, epi_n = config.epi_tile_m, config.epi_tile_n
    stores = 2 * _store_slots(config) * epi_m * epi_n * out_itemsize
    sizes = {"scalar": epi_n, "row": epi_n, "col": epi_m, "full": epi_m * epi_n}
    tiles = sum(2 * sizes[role] * np.dtype(dt).itemsize for role, dt in operands) if config.split_k == 1 else 0
    return stages + stores + tiles + _BARRIER_BYTES


def fits_shared_memory(config: MosaicGemmConfig, dtype: str, out_dtype: str | None = None,
                       limit: int = SHARED_MEMORY_LIMIT, operands: Sequence[tuple[str, str]] = ()) -> bool:
    return shared_memory_bytes(config, dtype, out_dtype, operands) <= limit


def _store_slots(config: MosaicGemmConfig) -> int:
    # one slot is enough when a warpgroup stores a single epilogue tile
    return min(2, (config.tile_m * config.tile_n) // (config.epi_tile_m * config.epi_tile_n))


# ---------------------------------------------------------------- what it serves

class Unsupported(str):
    """A falsy reason: ``supports`` returns one where the kernel cannot serve a problem."""

    def __bool__(self) -> bool:
        return False


def _aligned(extent: int, dtype: str) -> bool:
    return extent * np.dtype(dtype).itemsize % ROW_ALIGN_BYTES == 0


def supports(m: int, n: int, k: int, dtype: str, *, transpose_lhs: bool = False, transpose_rhs: bool = False,
             out_dtype: str | None = None, batch: int = 1, config: MosaicGemmConfig | None = None,
             epilogue: Epilogue | None = None,
             epilogue_operands: Sequence[tuple[str, str]] | None = None) -> bool | Unsupported:
    """True where ``mosaic_gemm`` runs the problem with no copy, else a falsy ``Unsupported`` reason.

    Served: bf16/f16 inputs in any storage order, f32 inputs (TF32) with lhs (m, k) and rhs
    stored (n, k); out_dtype the input dtype or f32; stored row counts multiples of 8,
    stored minor extents multiples of 32 bytes, the output's n (and a full epilogue
    operand's) of 16 bytes (the module docstring says why); partial tiles otherwise; an
    elementwise epilogue with scalar, row, col or full operands (with split-K XLA applies
    it after the sum).
    """
    dtype = np.dtype(dtype).name
    out = np.dtype(out_dtype or dtype).name
    if not AVAILABLE:
        return Unsupported(f"Mosaic GPU is unavailable: {IMPORT_ERROR}")
    if dtype not in DTYPES:
        return Unsupported(f"dtype must be one of {DTYPES}, got {dtype}")
    if out not in (dtype, "float32"):
        return Unsupported(f"out_dtype must be {dtype} or float32, got {out}")
    if min(m, n, k, batch) < 1:
        return Unsupported(f"m, n, k and batch must be >= 1, got {m}, {n}, {k}, {batch}")
    if dtype == "float32" and (transpose_lhs or not transpose_rhs):
        return Unsupported("float32 (TF32) wgmma reads K-major operands only: lhs stored (m, k) "
                           "and rhs stored (n, k) (transpose_lhs=False, transpose_rhs=True)")
    rows = {"lhs": k if transpose_lhs else m, "rhs": n if transpose_rhs else k, "output": m}
    for what, extent in rows.items():
        if extent % _TMA_ROWS:
            return Unsupported(f"the {what}'s row count {extent} is not a multiple of {_TMA_ROWS}: Mosaic GPU's "
                               f"tiled TMA folds 8-row tiles into the global array")
    for what, extent, dt in (("lhs", m if transpose_lhs else k, dtype), ("rhs", k if transpose_rhs else n, dtype),
                             ("output", n, out)):
        if not _aligned(extent, dt):
            return Unsupported(f"the {what}'s stored rows ({extent} x {dt}) are not a multiple of "
                               f"{ROW_ALIGN_BYTES} bytes, which TMA needs of a row stride")
    operand_swizzle, out_swizzle = _swizzles(m, n, k, dtype, "float32" if config and config.split_k > 1 else out,
                                             transpose_lhs, transpose_rhs, config or MosaicGemmConfig())
    if operand_swizzle is None:
        return Unsupported(f"the operands' minor extents (m={m} or k={k}, n={n} or k) must be multiples of "
                           f"{32 // np.dtype(dtype).itemsize} elements (wgmma's narrowest swizzle, 32 bytes)")
    if epilogue is not None and not epilogue.is_bare:
        if not epilogue.elementwise:
            return Unsupported(f"epilogue {epilogue} is not elementwise")
        for operand in epilogue.operands:
            if operand.role == "full" and not _aligned(n, operand.dtype):
                return Unsupported(f"a full epilogue operand's rows ({n} x {operand.dtype}) are not a "
                                   f"multiple of {ROW_ALIGN_BYTES} bytes")
    if config is not None:
        if epilogue is not None:
            epilogue_operands = tuple((o.role, o.dtype) for o in epilogue.operands)
        used = shared_memory_bytes(config, dtype, out, epilogue_operands or ())
        if used > SHARED_MEMORY_LIMIT:
            return Unsupported(f"config {config.name} needs {used} bytes of shared memory, more than "
                               f"{SHARED_MEMORY_LIMIT}")
    return True


# ---------------------------------------------------------------- configs by cost

def _wave_efficiency(tiles: int, sms: int) -> float:
    """Busy fraction of the SMs over the persistent loop: tiles / (whole waves x SMs)."""
    return tiles / (cdiv(tiles, sms) * sms)


def configs_for(m: int, n: int, k: int, dtype: str, *, batch: int = 1, num_sms: int = H100_SMS,
                out_dtype: str | None = None, limit: int = 4,
                operands: Sequence[tuple[str, str]] = ()) -> tuple[MosaicGemmConfig, ...]:
    """A few configs for a problem, ranked by tile and wave quantization (not a sweep).

    Candidate CTA tiles are 128x256 (both orientations), 128x128 and, for a narrow
    side, 64-row warpgroup tiles; each is scored by useful work over padded work
    (the ragged edge tiles) times the SMs' busy fraction, with a small penalty for small
    tiles (less reuse per byte). Split-K is offered when the output tiles fill less
    than half a wave and k is long. Stages shrink until the config fits shared memory
    with the epilogue ``operands`` ((role, dtype) pairs) beside it.
    """
    itemsize = np.dtype(dtype).itemsize
    tile_k = 64 if itemsize == 2 else 32  # 128 bytes of k: the widest swizzle
    shapes = [(128, 128, "N"), (128, 128, "M"), (128, 64, "N"), (64, 128, "N"), (64, 64, "N")]
    scored = []
    for tm, tn, wg in shapes:
        base = MosaicGemmConfig(tile_m=tm, tile_n=tn, tile_k=tile_k, stages=4, wg_dimension=wg,
                                epi_tile_m=64, epi_tile_n=min(64, tn))
        cta_m, cta_n = base.cta_tile
        tiles = batch * cdiv(m, cta_m) * cdiv(n, cta_n)
        padding = (m * n) / (cdiv(m, cta_m) * cta_m * cdiv(n, cta_n) * cta_n)
        reuse = (cta_m * cta_n / (cta_m + cta_n)) / (256 * 256 / 512)  # 1 for the 128x256 tile
        split = 1
        if tiles < num_sms // 2 and k >= 4 * 1024:
            split = max(1, min(cdiv(num_sms, tiles), cdiv(k, 1024), 8))
        eff = _wave_efficiency(tiles * split, num_sms)
        score = padding * eff * (0.8 + 0.2 * reuse)
        stages = 4
        config = dataclasses.replace(base, stages=stages, split_k=split)
        while stages > 2 and not fits_shared_memory(config, dtype, out_dtype, operands=operands):
            stages -= 1
            config = dataclasses.replace(config, stages=stages)
        if fits_shared_memory(config, dtype, out_dtype, operands=operands):
            scored.append((score, config))
    if not scored:
        return ()
    scored.sort(key=lambda item: -item[0])
    best = [config for _, config in scored[:max(1, limit - 1)]]
    # a second raster of the best tile: bands along the other axis
    alt = dataclasses.replace(best[0], grid_minor="M" if best[0].grid_minor == "N" else "N")
    return tuple(dict.fromkeys([*best[:limit - 1], alt]))[:limit]


# ---------------------------------------------------------------- the kernel

@dataclasses.dataclass(frozen=True)
class _Plan:
    """Everything static about one launch."""

    batch: int
    m: int
    n: int
    k: int
    transpose_lhs: bool
    transpose_rhs: bool
    config: MosaicGemmConfig
    roles: tuple[str, ...]  # epilogue operand roles (scalars already as rows)
    apply: Callable | None  # f32 tile, *f32 operand tiles (tile shape) -> tile

    @property
    def k_steps(self) -> int:
        """k blocks per split; the last split's may run past k (TMA reads zeros there)."""
        return cdiv(cdiv(self.k, self.config.tile_k), self.config.split_k)


def _swizzle(extents: Sequence[int], dtype, choices=(128, 64, 32)) -> int | None:
    """The widest swizzle (bytes) whose row of elements divides every extent, or None.

    Mosaic GPU folds the shared-memory tiling (8 rows x one swizzle of columns) into the
    TMA descriptor, so the global array's extents must be multiples of it too.
    """
    itemsize = np.dtype(dtype).itemsize
    for swizzle in choices:
        if all(extent % (swizzle // itemsize) == 0 for extent in extents):
            return swizzle
    return None


def _swizzles(m: int, n: int, k: int, dtype, out_dtype, transpose_lhs: bool, transpose_rhs: bool,
              config: MosaicGemmConfig) -> tuple[int | None, int | None]:
    """(operand swizzle, output swizzle) in bytes, None for none; wgmma needs one swizzle for
    both operands, the output tile may go unswizzled (its TMA then has no tiling to divide)."""
    cta_m, cta_n = config.cta_tile
    a_minor = (m, cta_m) if transpose_lhs else (k, config.tile_k)
    b_minor = (k, config.tile_k) if transpose_rhs else (n, cta_n)
    return (_swizzle((*a_minor, *b_minor), dtype),
            _swizzle((n, config.epi_tile_n), out_dtype))


def _smem_transforms(swizzle: int | None, dtype, rows: int = _TMA_ROWS) -> tuple:
    """Tiling and swizzle of a shared-memory tile; no swizzle: 16-byte column tiles."""
    if swizzle is None:
        return (plgpu.TilingTransform((rows, ROW_ALIGN_BYTES // np.dtype(dtype).itemsize)),)
    return (plgpu.TilingTransform((rows, swizzle // np.dtype(dtype).itemsize)), plgpu.SwizzleTransform(swizzle))


def _body(a_gmem, b_gmem, *refs, plan: _Plan):
    *operand_gmems, out_gmem = refs
    cfg = plan.config
    tile_m, tile_n, tile_k = cfg.tile_m, cfg.tile_n, cfg.tile_k
    cta_m, cta_n = cfg.cta_tile
    epi_m, epi_n = cfg.epi_tile_m, cfg.epi_tile_n
    dtype, out_dtype = a_gmem.dtype, out_gmem.dtype
    m_iters, n_iters = cdiv(plan.m, cta_m), cdiv(plan.n, cta_n)
    splits, k_steps = cfg.split_k, plan.k_steps
    slots = _store_slots(cfg)
    wg_on_m = cfg.wg_dimension == "M"

    swizzle, out_swizzle = _swizzles(plan.m, plan.n, plan.k, dtype, out_dtype, plan.transpose_lhs,
                                     plan.transpose_rhs, cfg)
    operand_transforms = _smem_transforms(swizzle, dtype)
    # lhs stored (k, m) gives (tile_k, cta_m) tiles, rhs stored (n, k) (cta_n, tile_k)
    a_block, a_index = (((tile_k, cta_m), lambda k: (k, 0)) if plan.transpose_lhs
                        else ((cta_m, tile_k), lambda k: (0, k)))
    b_block, b_index = (((cta_n, tile_k), lambda k: (0, k)) if plan.transpose_rhs
                        else ((tile_k, cta_n), lambda k: (k, 0)))

    def pipeline(body, compute_context, k0=0):
        shift = lambda index: (lambda k: index(k + k0))
        return plgpu.emit_pipeline_warp_specialized(
            body,
            grid=(k_steps,),
            memory_registers=40,
            in_specs=[
                plgpu.BlockSpec(a_block, shift(a_index), transforms=operand_transforms, memory_space=plgpu.SMEM),
                plgpu.BlockSpec(b_block, shift(b_index), transforms=operand_transforms, memory_space=plgpu.SMEM),
            ],
            wg_axis="wg",
            num_compute_wgs=2,
            max_concurrent_steps=cfg.stages,
            compute_context=compute_context,
        )

    ignore = lambda *_, **__: None
    scratch = dict(
        pipeline_allocs=pipeline(ignore, ignore).get_allocations(a_gmem.at[0], b_gmem.at[0]),
        out_smem=plgpu.SMEM((2, slots, epi_m, epi_n), out_dtype,
                            transforms=_smem_transforms(out_swizzle, out_dtype)),
    )
    if plan.roles:
        # a full operand's tile gets the output's kind of tiling (else one is inferred that n may not divide)
        scratch["operand_smem"] = [
            plgpu.SMEM((2, epi_n), ref.dtype) if role == "row" else plgpu.SMEM((2, epi_m), ref.dtype) if role == "col"
            else plgpu.SMEM((2, epi_m, epi_n), ref.dtype,
                            transforms=_smem_transforms(_swizzle((plan.n, epi_n), ref.dtype), ref.dtype))
            for role, ref in zip(plan.roles, operand_gmems)]
        scratch["operand_barrier"] = plgpu.Barrier(num_arrivals=len(plan.roles), num_barriers=2)

    @functools.partial(pl.run_scoped, **scratch, collective_axes="wg")
    def _scope(pipeline_allocs, out_smem, operand_smem=(), operand_barrier=None):
        wg = lax.axis_index("wg")

        @plgpu.nd_loop((plan.batch * splits * m_iters * n_iters,), collective_axes="sm")
        def _tiles(loop_info):
            (lin,) = loop_info.index
            tile, outer = lax.rem(lin, m_iters * n_iters), lax.div(lin, m_iters * n_iters)
            split, b = lax.rem(outer, splits), lax.div(outer, splits)
            m_idx, n_idx = plgpu.planar_snake(tile, (m_iters, n_iters), int(cfg.grid_minor == "N"),
                                              cfg.grid_tile_width)
            m0 = m_idx * cta_m + (wg * tile_m if wg_on_m else 0)  # this warpgroup's first row
            n0 = n_idx * cta_n + (0 if wg_on_m else wg * tile_n)
            wg_m = pl.ds(wg * tile_m, tile_m) if wg_on_m else slice(None)
            wg_n = slice(None) if wg_on_m else pl.ds(wg * tile_n, tile_n)
            out_tile = out_gmem.at[split * plan.batch + b] if splits > 1 else out_gmem.at[b]

            def compute_context(eval_pipeline):
                @functools.partial(pl.run_scoped, acc_ref=plgpu.ACC((tile_m, tile_n), jnp.float32))
                def _acc(acc_ref):
                    eval_pipeline(acc_ref)
                    acc = acc_ref[...]
                    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                    for i in range(tile_m // epi_m):
                        for j in range(tile_n // epi_n):
                            slot = (i * (tile_n // epi_n) + j) % slots
                            rows, cols = pl.ds(m0 + i * epi_m, epi_m), pl.ds(n0 + j * epi_n, epi_n)
                            y = acc[i * epi_m:(i + 1) * epi_m, j * epi_n:(j + 1) * epi_n]
                            if plan.apply is not None:
                                y = plan.apply(y.astype(out_dtype).astype(jnp.float32),
                                               *_operand_tiles(plan, operand_gmems, operand_smem, operand_barrier,
                                                               wg, b, rows, cols))
                            plgpu.wait_smem_to_gmem(1, wait_read_only=True)
                            out_smem[wg, slot] = y.astype(out_dtype)
                            plgpu.commit_smem()
                            plgpu.copy_smem_to_gmem(out_smem.at[wg, slot], out_tile.at[rows, cols])

            def mma(_, a_smem, b_smem, acc_ref):
                a = a_smem.at[:, wg_m].T if plan.transpose_lhs else a_smem.at[wg_m]
                b_ = b_smem.at[wg_n].T if plan.transpose_rhs else b_smem.at[:, wg_n]
                plgpu.wgmma(acc_ref, a, b_)
                plgpu.wgmma_wait(0)
                return acc_ref

            a_view = a_gmem.at[b, :, pl.ds(m_idx * cta_m, cta_m)] if plan.transpose_lhs else \
                a_gmem.at[b, pl.ds(m_idx * cta_m, cta_m), :]
            b_view = b_gmem.at[b, pl.ds(n_idx * cta_n, cta_n), :] if plan.transpose_rhs else \
                b_gmem.at[b, :, pl.ds(n_idx * cta_n, cta_n)]
            pipeline(mma, compute_context, k0=split * k_steps)(a_view, b_view, allocations=pipeline_allocs)

    plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def _operand_tiles(plan, gmems, smems, barrier, wg, b, rows, cols):
    """Each epilogue operand's part of the store tile, by TMA, broadcast to the tile in f32."""
    cfg = plan.config
    shape = (cfg.epi_tile_m, cfg.epi_tile_n)
    for role, gmem, smem in zip(plan.roles, gmems, smems):
        if role == "row":
            src = gmem.at[cols]
        elif role == "col":  # (batch * m,)
            src = gmem.at[pl.ds(b * plan.m + rows.start, rows.size)]
        else:
            src = gmem.at[b, rows, cols]
        plgpu.copy_gmem_to_smem(src, smem.at[wg], barrier.at[wg])
    plgpu.barrier_wait(barrier.at[wg])
    tiles = []
    for role, smem in zip(plan.roles, smems):
        x = smem[wg].astype(jnp.float32)
        if role == "row":
            x = lax.broadcast_in_dim(x, shape, (1,))
        elif role == "col":
            x = lax.broadcast_in_dim(x, shape, (0,))
        tiles.append(x)
    return tiles


def _as_tile_epilogue(epilogue, roles):
    """``epilogue`` as a function of f32 tiles that all have the tile's shape, with custom
    derivative rules (``jax.nn.relu``'s) inlined: Mosaic GPU does not lower them."""
    if isinstance(epilogue, Epilogue):
        full = Epilogue(tuple(Operand("full", o.dtype) for o in epilogue.operands), epilogue.ops)
        fn = lambda y, *tiles: full.apply(y, tiles, compute_dtype="float32")
    else:
        fn = epilogue

    def inlined(*tiles):
        closed = jax.make_jaxpr(fn)(*tiles)
        (out,) = _eval_inlined(closed.jaxpr, closed.consts, tiles)
        return out
    return inlined


_CALLS = {"custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "pjit": "jaxpr", "jit": "jaxpr",
          "closed_call": "call_jaxpr"}


def _eval_inlined(jaxpr, consts, args):
    """Evaluate ``jaxpr``, running the bodies of calls and custom-derivative calls in place."""
    env = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    read = lambda v: v.val if type(v).__name__ == "Literal" else env[v]
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        inner = eqn.params.get(_CALLS.get(eqn.primitive.name, ""), None)
        if inner is not None:
            inner_jaxpr, inner_consts = (inner.jaxpr, inner.consts) if hasattr(inner, "consts") else (inner, ())
            outs = _eval_inlined(inner_jaxpr, inner_consts, ins)
        else:
            outs = eqn.primitive.bind(*ins, **eqn.params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]


def mosaic_gemm(lhs, rhs, *, config: MosaicGemmConfig, transpose_lhs: bool = False, transpose_rhs: bool = False,
                out_dtype=None, epilogue: Epilogue | Callable | None = None, epilogue_operands: Sequence = (),
                epilogue_roles: Sequence[str] | None = None, num_sms: int | None = None):
    """``lhs @ rhs`` with f32 accumulation, operands as stored; ValueError where unsupported.

    ``lhs`` is (m, k), or (k, m) with ``transpose_lhs``; ``rhs`` (k, n), or (n, k) with
    ``transpose_rhs``; a leading batch axis on both gives (batch, m, n). ``epilogue``
    is an elementwise ``Epilogue`` (operand roles from it) or a callable
    ``fn(y_f32, *operand_tiles_f32) -> tile`` with ``epilogue_roles`` (each tile
    broadcast to the output tile's shape); ``epilogue_operands`` in their role shapes
    (scalar (), row (n,), col (batch, m) or (m,), full (batch, m, n) or (m, n)). With
    ``config.split_k`` > 1 the kernel writes f32 partials and XLA sums them and applies
    the epilogue. ``num_sms`` sizes the persistent grid (default: the device's count).
    """
    if not AVAILABLE:
        raise RuntimeError(f"mosaic_gemm: Mosaic GPU is unavailable: {IMPORT_ERROR}")
    if lhs.ndim != rhs.ndim or lhs.ndim not in (2, 3):
        raise ValueError(f"mosaic_gemm: lhs and rhs must both be 2-D or 3-D, got {lhs.shape} and {rhs.shape}")
    if lhs.dtype != rhs.dtype:
        raise ValueError(f"mosaic_gemm: lhs and rhs dtypes differ: {lhs.dtype} and {rhs.dtype}")
    batched = lhs.ndim == 3
    a, b = (lhs, rhs) if batched else (lhs[None], rhs[None])
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"mosaic_gemm: batch sizes differ: {lhs.shape} and {rhs.shape}")
    batch = a.shape[0]
    k, m = a.shape[1:] if transpose_lhs else a.shape[2:0:-1]
    n, k2 = b.shape[1:] if transpose_rhs else b.shape[2:0:-1]
    if k != k2:
        raise ValueError(f"mosaic_gemm: contraction lengths differ: lhs {lhs.shape} (transpose_lhs="
                         f"{transpose_lhs}) and rhs {rhs.shape} (transpose_rhs={transpose_rhs})")
    out_dtype = np.dtype(out_dtype or lhs.dtype).name
    tagged = epilogue if isinstance(epilogue, Epilogue) else None
    if tagged is not None and tagged.is_bare:
        epilogue = tagged = None
    if epilogue is None:
        roles = ()
    elif tagged is not None:
        roles = tuple(o.role for o in tagged.operands)
    else:
        if epilogue_roles is None or not callable(epilogue):
            raise ValueError("mosaic_gemm: epilogue must be an Epilogue, or a callable with epilogue_roles")
        roles = tuple(epilogue_roles)
    if len(roles) != len(epilogue_operands) or any(r not in ROLES for r in roles):
        raise ValueError(f"mosaic_gemm: epilogue_operands ({len(epilogue_operands)}) must match the epilogue's "
                         f"roles {roles}, each one of {ROLES}")
    reason = supports(m, n, k, lhs.dtype.name, transpose_lhs=transpose_lhs, transpose_rhs=transpose_rhs,
                      out_dtype=out_dtype, batch=batch, config=config, epilogue=tagged,
                      epilogue_operands=tuple((r, jnp.asarray(x).dtype.name)
                                              for r, x in zip(roles, epilogue_operands)))
    if not reason:
        raise ValueError(f"mosaic_gemm {config.name}: {reason}")
    if tagged is not None and not tagged.elementwise:
        raise ValueError(f"mosaic_gemm: epilogue {tagged} is not elementwise")
    operands = _operand_arrays(roles, epilogue_operands, batch, m, n)
    if tagged is not None:
        result_dtype = tagged.result(batch, m, n, out_dtype)[1]
    else:
        result_dtype = out_dtype
    if num_sms is None:
        num_sms = jax.devices()[0].core_count

    fused = epilogue is not None and config.split_k == 1
    plan = _Plan(batch, m, n, k, transpose_lhs, transpose_rhs, config,
                 roles=tuple("full" if r == "full" else ("row" if r in ("row", "scalar") else "col")
                             for r in roles) if fused else (),
                 apply=_as_tile_epilogue(epilogue, roles) if fused else None)
    partials = config.split_k > 1
    out_shape = (config.split_k * batch, m, n) if partials else (batch, m, n)
    store_dtype = jnp.float32 if partials else (result_dtype if fused else out_dtype)
    call = plgpu.kernel(
        functools.partial(_body, plan=plan),
        out_type=jax.ShapeDtypeStruct(out_shape, store_dtype),
        grid=(num_sms,),
        grid_names=("sm",),
        num_threads=3,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
    )
    out = call(a, b, *(operands if fused else ()))
    if partials:
        out = out.reshape(config.split_k, batch, m, n).sum(axis=0).astype(out_dtype)
    if epilogue is not None and not fused:
        out = _apply_outside(epilogue, tagged, roles, out, epilogue_operands, result_dtype)
    return out if batched else out[0]


def _operand_arrays(roles, operands, batch: int, m: int, n: int) -> list:
    """The epilogue operands as the kernel reads them: rows (n,), cols (batch * m,), full (batch, m, n)."""
    arrays = []
    for role, x in zip(roles, operands):
        x = jnp.asarray(x)
        if role in ("scalar", "row"):
            x = jnp.broadcast_to(x, (n,))
        elif role == "col":
            x = jnp.broadcast_to(x, (batch, m)).reshape(batch * m)
        else:
            x = jnp.broadcast_to(x, (batch, m, n))
        arrays.append(x)
    return arrays


def _apply_outside(epilogue, tagged, roles, out, operands, result_dtype):
    """The epilogue in XLA after the split-K sum (it fuses into the reduction)."""
    batch, m, n = out.shape
    shaped = []
    for role, x in zip(roles, operands):
        x = jnp.asarray(x)
        shaped.append(x if role in ("scalar", "row") else jnp.broadcast_to(x, (batch, m)) if role == "col"
                      else jnp.broadcast_to(x, (batch, m, n)))
    if tagged is not None:
        return tagged.apply(out, shaped).astype(result_dtype)
    y = out.astype(jnp.float32)
    full = [jnp.broadcast_to(x[..., None] if role == "col" else x, y.shape).astype(jnp.float32)
            for role, x in zip(roles, shaped)]
    return epilogue(y, *full).astype(result_dtype)


__all__ = ["AVAILABLE", "IMPORT_ERROR", "SHARED_MEMORY_LIMIT", "H100_SMS", "MosaicGemmConfig", "Unsupported",
           "shared_memory_bytes", "fits_shared_memory", "supports", "configs_for", "mosaic_gemm"]
