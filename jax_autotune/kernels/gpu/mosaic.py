"""Mosaic GPU (Hopper, sm_90) wgmma GEMM: TMA-fed, warp-specialised, multi-stage.

The kernel is JAX's shipped Hopper example (``jax.experimental.pallas.ops.gpu.
hopper_matmul_mgpu``): a persistent grid, a producer warpgroup streaming A and B tiles
through ``stages`` shared-memory buffers with TMA, and two consumer warpgroups issuing
wgmma, each owning a ``tile_m x tile_n`` f32 accumulator (the CTA tile is doubled along
``wg_dimension``). This module picks its configs, checks what they need, and adapts the
canonical operands to it.

    >>> cfg = MosaicConfig(tile_m=128, tile_n=128, tile_k=64, stages=4)
    >>> fits_shared_memory(cfg, "bfloat16")
    True
    >>> out = mosaic_matmul(lhs, rhs, problem, cfg)   # (1, m, n); bf16/f16, n and k aligned

Limits: half-precision inputs with out_dtype equal to them, no transposed operands,
n a multiple of the CTA tile's n and k of ``tile_k``; m of any size (rows are padded up
to the CTA tile, a copy, so keys whose m is not aligned should prefer Triton). On
CPU-only jax (0.10.2) the example imports but cannot run; ``AVAILABLE`` says whether
the import worked at all.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from jax_autotune.kernels.gpu.sizes import pad_to, round_up, two_warpgroup_tile
from jax_autotune.problem import MatmulProblem
from jax_autotune.tuning.device import shared_memory_for_capability

try:  # the shipped example; absent or broken on some jax builds
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as _hopper
    AVAILABLE = True
    IMPORT_ERROR: str | None = None
except Exception as err:  # noqa: BLE001 - any import failure just disables the family
    _hopper = None
    AVAILABLE = False
    IMPORT_ERROR = f"{type(err).__name__}: {err}"

SHARED_MEMORY_LIMIT = shared_memory_for_capability((9, 0))  # per block on Hopper (sm_90)
HALF_DTYPES = ("bfloat16", "float16")
_EPILOGUE_TILE = 64
_BARRIER_BYTES = 1024  # mbarriers and alignment slack


@dataclasses.dataclass(frozen=True)
class MosaicConfig:
    """One warpgroup's tile, the k step, pipeline depth and L2 raster of the grid.

    ``wg_dimension`` ("M" or "N") is the axis the two consumer warpgroups split;
    ``grid_tile_width`` > 1 rasters the persistent grid in bands for L2 reuse.
    """

    tile_m: int
    tile_n: int
    tile_k: int
    stages: int
    wg_dimension: str = "N"
    grid_tile_width: int = 1

    def __post_init__(self):
        if self.wg_dimension not in ("M", "N"):
            raise ValueError(f"MosaicConfig.wg_dimension must be 'M' or 'N', "
                             f"got {self.wg_dimension!r}")
        if self.tile_m % 64 or self.tile_n % _EPILOGUE_TILE or self.tile_k % 16:
            raise ValueError(f"MosaicConfig: tile_m and tile_n must be multiples of 64 and "
                             f"tile_k of 16, got {self}")

    @property
    def cta_tile(self) -> tuple[int, int]:
        """(rows, cols) of the output one CTA computes: two warpgroups' tiles."""
        return two_warpgroup_tile(self.tile_m, self.tile_n, self.wg_dimension)

    @property
    def name(self) -> str:
        return (f"tm{self.tile_m}_tn{self.tile_n}_tk{self.tile_k}_st{self.stages}"
                f"_wg{self.wg_dimension}_gw{self.grid_tile_width}")


def shared_memory_bytes(config: MosaicConfig, dtype: str, out_dtype: str | None = None) -> int:
    """Shared memory the kernel allocates: operand stages plus the epilogue buffers."""
    itemsize = np.dtype(dtype).itemsize
    out_itemsize = np.dtype(out_dtype or dtype).itemsize
    cta_m, cta_n = config.cta_tile
    operands = config.stages * (cta_m + cta_n) * config.tile_k * itemsize
    epilogue_slots = min(2, (config.tile_m * config.tile_n) // _EPILOGUE_TILE ** 2)
    epilogue = 2 * epilogue_slots * _EPILOGUE_TILE * _EPILOGUE_TILE * out_itemsize
    return operands + epilogue + _BARRIER_BYTES


def fits_shared_memory(config: MosaicConfig, dtype: str, limit: int = SHARED_MEMORY_LIMIT) -> bool:
    return shared_memory_bytes(config, dtype) <= limit


def shape_supported(config: MosaicConfig, problem: MatmulProblem) -> str | None:
    """Why ``problem`` cannot run with ``config``, or None when it can."""
    if problem.lhs_dtype not in HALF_DTYPES or problem.rhs_dtype != problem.lhs_dtype:
        return f"inputs must both be one of {HALF_DTYPES}, got {problem.lhs_dtype}, {problem.rhs_dtype}"
    if problem.out_dtype != problem.lhs_dtype:
        return f"out_dtype must equal the input dtype, got {problem.out_dtype}"
    if problem.transpose_a or problem.transpose_b:
        return "transposed operands are not supported"
    if problem.n % config.cta_tile[1] or problem.k % config.tile_k:
        return (f"n={problem.n} must be a multiple of {config.cta_tile[1]} and "
                f"k={problem.k} of {config.tile_k}")
    if not fits_shared_memory(config, problem.lhs_dtype):
        return (f"needs {shared_memory_bytes(config, problem.lhs_dtype)} bytes of shared "
                f"memory, more than {SHARED_MEMORY_LIMIT}")
    return None


def _tuning_config(config: MosaicConfig):
    """The example's ``TuningConfig``, passing only the fields this jax version has."""
    dims = _hopper.MatmulDimension
    wanted = dict(
        tile_m=config.tile_m, tile_n=config.tile_n, tile_k=config.tile_k,
        max_concurrent_steps=config.stages,
        epi_tile_m=_EPILOGUE_TILE, epi_tile_n=_EPILOGUE_TILE,
        grid_minor_dim=dims.N, grid_tile_width=config.grid_tile_width,
        wg_dimension=getattr(dims, config.wg_dimension), cluster_dimension=None,
    )
    known = {f.name for f in dataclasses.fields(_hopper.TuningConfig)}
    return _hopper.TuningConfig(**{k: v for k, v in wanted.items() if k in known})


def mosaic_matmul(lhs, rhs, problem: MatmulProblem, config: MosaicConfig):
    """wgmma GEMM of canonical operands; (batch, m, n). Raises ValueError where unsupported.

    A batch runs one launch per entry (the tuner only offers batch 1); a ragged m is
    padded to the CTA tile and sliced off again.
    """
    if _hopper is None:
        raise RuntimeError(f"Mosaic GPU Hopper matmul is unavailable: {IMPORT_ERROR}")
    reason = shape_supported(config, problem)
    if reason:
        raise ValueError(f"mosaic_matmul {config.name}: {reason}")
    cta_m = config.cta_tile[0]
    padded_m = round_up(problem.m, cta_m)
    tuning = _tuning_config(config)
    outs = []
    for b in range(problem.batch):
        a = pad_to(lhs[b], (padded_m, problem.k))
        out = _hopper.matmul(a, rhs[b], None, tuning)
        outs.append(out[:problem.m])
    return jnp.stack(outs).astype(problem.out_dtype)


__all__ = ["AVAILABLE", "IMPORT_ERROR", "SHARED_MEMORY_LIMIT", "MosaicConfig", "mosaic_matmul",
           "shared_memory_bytes", "fits_shared_memory", "shape_supported"]
