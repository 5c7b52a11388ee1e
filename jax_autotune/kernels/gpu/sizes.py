"""Integer sizes and zero padding shared by the GPU kernels.

    >>> cdiv(1025, 64), round_up(1025, 64)
    (17, 1088)
    >>> pad_to(x, (1, 1088, 64)).shape          # zeros after the data on every axis
    (1, 1088, 64)
"""

from __future__ import annotations

import jax.numpy as jnp

ROW_ALIGN_BYTES = 16  # what vectorised GPU loads and stores need of a row stride


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ints."""
    return -(-a // b)


def round_up(x: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` at or above ``x``."""
    return cdiv(x, multiple) * multiple


def misaligned(size: int, itemsize: int) -> bool:
    """Whether a row of ``size`` elements of ``itemsize`` bytes breaks ``ROW_ALIGN_BYTES``."""
    return size * itemsize % ROW_ALIGN_BYTES != 0


def two_warpgroup_tile(tile_m: int, tile_n: int, wg_dimension: str) -> tuple[int, int]:
    """(rows, cols) of the output a Hopper CTA of two consumer warpgroups computes per step,
    each warpgroup ``tile_m x tile_n``, side by side along ``wg_dimension`` ("M" or "N")."""
    return (2 * tile_m, tile_n) if wg_dimension == "M" else (tile_m, 2 * tile_n)


def pad_to(x, shape):
    """``x`` zero-padded at the end of each axis to ``shape`` (``x`` itself when equal)."""
    if tuple(x.shape) == tuple(shape):
        return x
    return jnp.pad(x, [(0, want - have) for have, want in zip(x.shape, shape)])
