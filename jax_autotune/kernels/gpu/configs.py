"""The configs each GPU candidate family tries, pruned by the H200 kernel probes.

Data only: ``kernels.gpu.candidates`` turns each into a candidate (its name is the
config's ``name``) and gives it its groups and tiers.

    >>> [config.name for config in SPLIT_K_CONFIGS][:1]
    ['bm128_bn128_bk64_g8_w8_s4_sk2']
    >>> skinny_config("m", 16, *SKINNY_SHAPES[0]).block_m
    16
"""

from __future__ import annotations

from jax_autotune.kernels.gpu.triton import GemmConfig, VectorConfig


def _g(bm, bn, bk, w, s, sk=1, g=8) -> GemmConfig:
    return GemmConfig(block_m=bm, block_n=bn, block_k=bk, group_m=g, num_warps=w,
                      num_stages=s, split_k=sk)


# triton_gemm: profile -> configs; profile = (dtype class, size class), pruned by the H200
# kernel probes (benchmarks/results/gpu_kernels_2026-11-29.md). Half precision runs the
# tiled GEMM on the operands as stored.
GEMM_PROFILES: dict[tuple[str, str], tuple[GemmConfig, ...]] = {
    ("half", "medium"): (_g(64, 128, 64, 4, 4), _g(64, 64, 64, 4, 4), _g(128, 64, 64, 4, 4),
                         _g(128, 128, 64, 8, 3)),
    ("half", "small_k"): (_g(128, 128, 64, 8, 3), _g(128, 256, 64, 8, 3), _g(256, 128, 64, 8, 3),
                          _g(128, 128, 128, 8, 2)),
    ("half", "large"): (_g(128, 256, 64, 8, 3), _g(128, 128, 64, 8, 3), _g(256, 128, 64, 8, 3)),
}

# f32 at DEFAULT (TF32) runs the GEMM on operands packed K-major (``gpu.packed``): wgmma
# reads 32-bit operands only K-major, and Triton does not pipeline a row-major rhs. It
# still trails XLA's cuBLAS, so one or two configs per profile; f32 HIGH/HIGHEST
# (Triton's ieee dot, on the CUDA cores) lost to XLA everywhere and gets no Triton round
# (benchmarks/results/gpu_kernels_2026-11-29-perf-pass.md).
F32_PACKED_PROFILES: dict[str, tuple[GemmConfig, ...]] = {
    "medium": (_g(64, 64, 64, 4, 3), _g(64, 64, 32, 4, 4)),
    "small_k": (_g(128, 128, 32, 4, 3),),
    "large": (_g(128, 128, 32, 4, 3),),
}

# split_k: half precision only (an f32 rhs as stored is not pipelined, see above); next
# to them XLA's dot of the transposed problem, C^T = B^T A^T, for every dtype: cuBLAS
# then picks another kernel, which won at f32 128x8192x8192.
SPLIT_K_CONFIGS = (_g(128, 128, 64, 8, 4, sk=2), _g(128, 64, 64, 4, 3, sk=2),
                   _g(64, 64, 64, 4, 3, sk=4))

# skinny: narrow block on the narrow side; (wide block, block_k, stages, split_k)
SKINNY_SHAPES = ((64, 128, 4, 1), (64, 128, 4, 4), (128, 64, 4, 2), (64, 256, 3, 1))
SKINNY_NARROW = (16, 32, 64)


def skinny_config(side: str, narrow: int, wide: int, bk: int, stages: int, sk: int) -> GemmConfig:
    bm, bn = (narrow, wide) if side == "m" else (wide, narrow)
    return _g(bm, bn, bk, 4, stages, sk)


# vector kernels: narrow output blocks with long k steps (wide blocks starve the SMs of
# work at m == 1); XLA's dot is at the memory floor there anyway
VECTOR_CONFIGS = (VectorConfig(32, 512, 4, 3), VectorConfig(16, 1024, 4, 3))

# our Mosaic GPU GEMM: the first configs ``mosaic_gemm.configs_for`` ranks for a problem
# (by tile and wave quantization), one candidate per rank; the first ranks are a round's top
# tier, the rest a lower one. ``MOSAIC_GEMM_RULE`` names the ranking: a changed ranking is a
# changed candidate set (its checksum hashes the rule), so stored decisions re-tune.
MOSAIC_GEMM_RANKS = 3
MOSAIC_GEMM_TOP_RANKS = 2
MOSAIC_GEMM_RULE = "configs_for/1"

# cuBLASLt: this many of its heuristic's algorithms per problem (rank 0 is its own pick)
CUBLASLT_ALGORITHMS = 3

# padded: XLA's dot on operands zero-padded to multiples of 8, and (half precision only)
# the packed Triton GEMM: k padded to block_k, n to 16 bytes, the output stored straight
# into the unpadded result (no slice copy). Padding all of m, n, k to 64 was never
# better than to 8. The barrier variants pad only the misaligned row strides and keep
# XLA from fusing the pads into its GEMM, so cuBLAS runs on aligned operands (Inductor's
# lever on such shapes); an aligned n then needs no slice of the output. The plain pad
# to 8 lost to a barrier variant on every misaligned shape of the 2026-12-01 GPU suite,
# so it is only a lower tier now, as are the pads to 8 of the others (the pad to 64 was
# within 2% of it or ahead, and each XLA variant costs a compile with XLA's autotuner);
# cuBLASLt on the padded rows needs no barrier, and on the pad to 64 it runs the same
# first algorithms of its heuristic as unpadded (XLA's autotuner, trying them all, found
# a faster cuBLASLt call than its first for the 50257 vocabulary head).
PADDED_XLA_ALIGN = 8
PADDED_CUBLASLT_ALIGNS = (8, 64)
PADDED_BARRIER_ALIGNS = (8, 64)
PADDED_TOP_ALIGN = 64
PADDED_PACKED_CONFIGS = (_g(128, 128, 64, 8, 3), _g(128, 64, 64, 4, 4))


__all__ = ["GEMM_PROFILES", "F32_PACKED_PROFILES", "SPLIT_K_CONFIGS", "SKINNY_SHAPES", "SKINNY_NARROW",
           "skinny_config", "VECTOR_CONFIGS", "MOSAIC_GEMM_RANKS", "MOSAIC_GEMM_TOP_RANKS", "MOSAIC_GEMM_RULE", "CUBLASLT_ALGORITHMS", "PADDED_XLA_ALIGN",
           "PADDED_CUBLASLT_ALIGNS", "PADDED_BARRIER_ALIGNS", "PADDED_TOP_ALIGN", "PADDED_PACKED_CONFIGS"]
