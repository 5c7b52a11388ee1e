"""The GPU candidate set: XLA's dot, cuBLASLt, our Mosaic GPU GEMM and Pallas Triton kernels.

    >>> from jax_autotune.tuning.device import DeviceInfo
    >>> h200 = DeviceInfo("gpu", "NVIDIA H200", 143_771 * 2**20, (9, 0))
    >>> candidate_set = gpu_candidate_set(h200)
    >>> candidate_set.baseline.name
    'xla_dot'

The set is XLA's dot, the groups below (``declare_groups``), then one builder per family,
in the order of ``FAMILIES``: ``family(builder, groups, device)`` adds that family's
candidates (most of them one per config of ``kernels.gpu.configs``) with their groups and
in-group priorities. A new family is one such function and one line at the end of
``FAMILIES`` (the set's checksum hashes every name and its parameters in order: a changed
set re-tunes the decisions stored for the old one):

    def my_family(builder, groups, device):
        for config in MY_CONFIGS:
            builder.add(Candidate(f"my_gemm_{config.name}", _kernel(my_gemm, config),
                                  params=_params(config, "my_gemm"), supports=my_supports,
                                  cost=functools.partial(my_cost, config)),
                        groups.triton, _top)

A key is tuned with ONE round in practice: XLA's dot joins every round and is always
valid, so the first group whose priority is >= 0 decides, and only the candidates of
its top in-group tier run (1-5 of them, next to XLA's dot). The predicates
(``kernels.gpu.predicates``) are on the key's bucketed sizes; "narrow" is min(m, n);
"half" is bf16/f16, "tf32" is f32 at Precision.DEFAULT.

| group        | group priority                                              | top tier (in-group 2; lower tiers are 1)       |
|--------------|-------------------------------------------------------------|------------------------------------------------|
| padded       | 7 if General and a row stride is not a multiple of 16 bytes | XLA's dot behind a barrier and cuBLASLt (three |
|              | (stride factor < 4: k = 1025 and the like)                  | algorithms), the misaligned rows padded to 64; |
|              |                                                             | half: + 2                                      |
|              |                                                             | packed Triton GEMMs (k to block_k, n to 16 B,  |
|              |                                                             | output stored unpadded). Lower tier: the pads  |
|              |                                                             | to 8, and XLA's dot on m, n, k all padded to 8 |
| skinny_gemv  | 6 if m == 1 or n == 1 (MatVec, VecMat, ...) or narrow <= 64 | vector kernels when m or n is 1; else skinny   |
|              |                                                             | GEMMs whose narrow block (16, 32, 64) matches  |
|              |                                                             | the narrow side (4: plain, split-K, bk 256)    |
| split_k      | 5 if General, m*n <= 2**21 and k >= 2048                    | XLA's dot of the transposed problem (every     |
|              |                                                             | dtype); half: + 3 split-K Triton GEMMs; our    |
|              |                                                             | Mosaic GEMM's first-ranked config              |
| accelerated  | 4 if the device is sm_90+ with Mosaic GPU, scale Large,     | our Mosaic GEMM, its first two configs by rank |
|              | m, n >= 1024 and our Mosaic GEMM serves the key (bf16, f16  | (the third in the lower tier); no Triton       |
|              | or TF32 K-major, any stored orientation, batch, row strides |                                                |
|              | multiples of 32 bytes)                                      |                                                |
| triton_gemm  | 3 for every other key with m, n, k > 1                      | half: the profile's GEMMs, medium (m*n <=      |
|              |                                                             | 2**22) / small_k (k <= 256) / large; tf32: 1-2 |
|              |                                                             | K-major packed GEMMs per profile; f32 HIGH and |
|              |                                                             | HIGHEST: none (XLA's dot, untimed); our Mosaic |
|              |                                                             | GEMM's first-ranked config where it serves     |

Our Mosaic GPU GEMM (``mosaic_gemm_r0..2``, ``kernels.gpu.mosaic``) is a rank, not a
config: each problem gets the configs ``mosaic_gemm.configs_for`` ranks for its own sizes
(``configs.MOSAIC_GEMM_RANKS``), so a key tries a few, never a sweep.

The Triton families (``TRITON_FAMILIES``) join the set only where this jax ships Pallas's
Triton backend (``kernels.gpu.triton_backend.SHIPPED``, the one place that decides), and
only where no Mosaic kernel serves the round in their stead: the accelerated group, whose
keys our Mosaic GEMM serves, has none (on the 2026-12-01 H200 suite no Triton GEMM won an
aligned large key). Their lowering never shows JAX's deprecation of the backend.

cuBLASLt (``cublaslt_algo0..2``: the first three algorithms of its heuristic, called
through an FFI custom call) joins every group's top tier, like XLA's dot joins every
round: it compiles in milliseconds, is measured right after XLA's dot, and sets the bar
that the cost model (``kernels.gpu.cost``) skips hopeless Pallas candidates against
(``rules.cost_skip_ratio``).

A key with an epilogue (``MatmulKey.epilogue``) runs every candidate with the epilogue
after it as XLA ops (XLA fuses it into its own GEMM, a custom call's runs as one more
kernel), and adds the fused ones (``kernels.gpu.epilogues``): ``cublaslt_epilogue_algo0..2``
(cuBLASLt's bias, relu, gelu and residual epilogues, beside ``cublaslt_algo*``), and each
unsplit Triton GEMM and each Mosaic rank as ``..._epilogue``, which applies an elementwise
epilogue to its tiles before the store and stands in for the plain one there.

Candidates a device cannot run (``supports``: platform, capability, dtypes, shared
memory, alignment) are demoted by the planner; Mosaic needs sm_90 and on other GPUs its
group is skipped outright.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

from jax_autotune.tuning.candidates import Candidate, CandidateSet, CandidateSetBuilder, Group
from jax_autotune.tuning.device import DeviceInfo
from jax_autotune.kernels.gpu import cublaslt, epilogues
from jax_autotune.kernels.gpu.configs import (
    CUBLASLT_ALGORITHMS, F32_PACKED_PROFILES, GEMM_PROFILES, MOSAIC_GEMM_RANKS, MOSAIC_GEMM_RULE,
    MOSAIC_GEMM_TOP_RANKS, PADDED_BARRIER_ALIGNS,
    PADDED_CUBLASLT_ALIGNS, PADDED_PACKED_CONFIGS, PADDED_TOP_ALIGN, PADDED_XLA_ALIGN, SKINNY_NARROW,
    SKINNY_SHAPES, SPLIT_K_CONFIGS, VECTOR_CONFIGS, skinny_config,
)
from jax_autotune.kernels.gpu.cost import (
    gemm_cost, mosaic_gemm_cost, packed_cost, padded_xla_cost, vector_cost, xla_cost,
)
from jax_autotune.kernels.gpu import mosaic_gemm, triton_backend
from jax_autotune.kernels.gpu.mosaic import mosaic_matmul
from jax_autotune.kernels.gpu.packed import packed_gemm
from jax_autotune.kernels.gpu.padded import padded
from jax_autotune.kernels.gpu.predicates import (
    applying_epilogue, cublaslt_epilogue_supports, cublaslt_supports, dtype_class, float_supports,
    gemm_supports, is_misaligned, is_split_k_shape, is_vector, mosaic_gemm_supports, mosaic_shape,
    narrow_block, narrow_side, size_class, tf32_key, unless_applied, vector_supports,
)
from jax_autotune.kernels.gpu.triton import GemmConfig, gemm, vector_matmul
from jax_autotune.key import Kind, MatmulKey
from jax_autotune.problem import MatmulProblem
from jax_autotune.kernels.gpu.xla_variants import xla_transposed
from jax_autotune.kernels.xla import XLA_DOT, xla_dot

TOP, LOWER, SKIP = 2, 1, -1  # in-group tiers: the round, the tier tried if it all fails, none


# ---------------------------------------------------------------- kernels and tiers

def _kernel(fn, config, fn_name: str | None = None):
    """``fn(lhs, rhs, problem, *operands)`` for the candidate contract, with the config bound
    (operands: a fused variant's epilogue operands)."""
    def kernel(lhs, rhs, problem: MatmulProblem, *operands):
        return fn(lhs, rhs, problem, config, *operands)
    kernel.__name__ = f"{fn_name or fn.__name__}_{config.name}"
    return kernel


def _cublaslt_kernel(lhs, rhs, problem: MatmulProblem, *, algorithm: int):
    return cublaslt.matmul(lhs, rhs, problem, algorithm=algorithm)


def _cublaslt_epilogue_kernel(lhs, rhs, problem: MatmulProblem, *operands, algorithm: int):
    """The whole context in one cuBLASLt call: its epilogue takes the key's."""
    form = epilogues.cublaslt_form(problem.epilogue, problem.out_dtype)
    if form is None:
        raise ValueError(f"cuBLASLt's epilogue cannot compute {problem.epilogue}")
    pick = lambda index: None if index is None else operands[index]  # noqa: E731
    return cublaslt.matmul(lhs, rhs, problem.bare(), algorithm=algorithm, bias=pick(form.bias),
                           residual=pick(form.residual), activation=form.activation)


def _params(config, family: str) -> dict:
    return {"family": family, **dataclasses.asdict(config)}


def _top(key: MatmulKey) -> int:
    return TOP


def _lower(key: MatmulKey) -> int:
    return LOWER


def _half_only(key: MatmulKey) -> int:
    return TOP if dtype_class(key) == "half" else SKIP


def _align_tier(align: int):
    """The in-group tier of a padded variant: the top one for the pad to PADDED_TOP_ALIGN."""
    return _top if align == PADDED_TOP_ALIGN else _lower


def _best_of(priorities):
    if len(priorities) == 1:
        return priorities[0]
    return lambda key: max(p(key) for p in priorities)


# ---------------------------------------------------------------- the groups

class Groups(NamedTuple):
    """The set's groups in declaration order, which breaks ties of equal priority."""

    padded: Group
    skinny: Group
    split_k: Group
    accelerated: Group
    triton: Group


def declare_groups(builder: CandidateSetBuilder, device: DeviceInfo) -> Groups:
    """The five groups of the table above, declared on ``builder`` in this order."""
    mosaic = (device.compute_capability or (0, 0)) >= (9, 0) and mosaic_gemm.AVAILABLE
    return Groups(
        # a misaligned key's round seldom ends early (XLA's own dot there is far from the
        # roofline), so its XLA-based candidates are autotuned together with XLA's dot
        padded=builder.group("padded", lambda key: 7 if is_misaligned(key) else SKIP,
                             primes_xla=True),
        skinny=builder.group(
            "skinny_gemv", lambda key: 6 if is_vector(key) or narrow_side(key) else SKIP),
        split_k=builder.group(
            "split_k", lambda key: 5 if key.kind == Kind.GENERAL and is_split_k_shape(key) else SKIP),
        accelerated=builder.group(
            "accelerated", lambda key: 4 if mosaic and mosaic_shape(key) else SKIP),
        triton=builder.group(
            "triton_gemm", lambda key: 3 if key.m > 1 and key.n > 1 and key.k > 1 else SKIP),
    )


# ---------------------------------------------------------------- the families
# Each ``family(builder, groups, device)`` adds one family's candidates, with their groups
# and in-group priorities; the set is XLA's dot, then FAMILIES in order.

def _add_cublaslt(builder: CandidateSetBuilder, groups: Groups, family: str, kernel, supports,
                  applies_epilogue: bool = False) -> None:
    """``{family}_algo0..2``: cuBLASLt's first heuristic algorithms, in every top tier."""
    for algorithm in range(CUBLASLT_ALGORITHMS):
        builder.add(Candidate(f"{family}_algo{algorithm}", functools.partial(kernel, algorithm=algorithm),
                              params={"family": family, "algorithm": algorithm,
                                      "workspace": cublaslt.WORKSPACE_BYTES},
                              supports=supports, cost=xla_cost, quick_compile=True,
                              applies_epilogue=applies_epilogue,
                              product=f"cublaslt_algo{algorithm}" if applies_epilogue else ""),
                    *[(group, _top) for group in groups])


def _add_with_fused(builder: CandidateSetBuilder, name: str, kernel, params: dict, supports, cost,
                    pairs: list, fuses: bool = True, takes=epilogues.triton_takes) -> None:
    """A GEMM ``name`` and, if it ``fuses``, ``{name}_epilogue``, which applies an
    elementwise epilogue to its tiles and stands in for it wherever it ``takes`` one."""
    builder.add(Candidate(name, kernel, params=params,
                          supports=unless_applied(supports, takes) if fuses else supports, cost=cost),
                *pairs)
    if fuses:
        builder.add(Candidate(f"{name}_epilogue", kernel, params={**params, "epilogue": True},
                              supports=applying_epilogue(supports, takes), cost=cost, applies_epilogue=True,
                              product=name),
                    *pairs)


def cublaslt_family(builder: CandidateSetBuilder, groups: Groups, device: DeviceInfo) -> None:
    """``cublaslt_algo0..2``, joining every group's top tier."""
    _add_cublaslt(builder, groups, "cublaslt", _cublaslt_kernel, cublaslt_supports)


def cublaslt_epilogue_family(builder: CandidateSetBuilder, groups: Groups, device: DeviceInfo) -> None:
    """``cublaslt_epilogue_algo0..2``: the key's epilogue by cuBLASLt's own."""
    _add_cublaslt(builder, groups, "cublaslt_epilogue", _cublaslt_epilogue_kernel,
                  cublaslt_epilogue_supports, applies_epilogue=True)


def _ranked_kernel(rank: int):
    def kernel(lhs, rhs, problem: MatmulProblem, *operands):
        return mosaic_matmul(lhs, rhs, problem, *operands, rank=rank)
    kernel.__name__ = f"mosaic_gemm_r{rank}"
    return kernel


def mosaic_gemm_family(builder: CandidateSetBuilder, groups: Groups, device: DeviceInfo) -> None:
    """``mosaic_gemm_r0..2`` and their ``_epilogue`` variants (sm_90): each problem's
    rank-th config; the accelerated group's top tier (ranks 0-1, rank 2 below), and rank 0
    in triton_gemm's and split_k's top tiers."""
    for rank in range(MOSAIC_GEMM_RANKS):
        pairs = [(groups.accelerated, _top if rank < MOSAIC_GEMM_TOP_RANKS else _lower)]
        if rank == 0:
            pairs += [(groups.triton, _top), (groups.split_k, _top)]
        _add_with_fused(builder, f"mosaic_gemm_r{rank}", _ranked_kernel(rank),
                        {"family": "mosaic_gemm", "rank": rank, "rule": MOSAIC_GEMM_RULE},
                        mosaic_gemm_supports, functools.partial(mosaic_gemm_cost, rank, sms=device.multiprocessors),
                        pairs, takes=epilogues.mosaic_takes)


def _profile_tier(profile: tuple[str, str]):
    return lambda key: (TOP if (dtype_class(key), size_class(key)) == profile
                        else LOWER if dtype_class(key) == "half" or tf32_key(key) else SKIP)


def _tf32_tier(profile: str):
    return lambda key: SKIP if not tf32_key(key) else TOP if size_class(key) == profile else LOWER


def _skinny_tier(side: str, narrow: int):
    return lambda key: TOP if (narrow_side(key), narrow_block(key)) == (side, narrow) else LOWER


def _gemm_slots(groups: Groups):
    """(config, group, in-group priority) for every place a Triton GEMM serves."""
    for profile, configs in GEMM_PROFILES.items():
        for config in configs:
            yield config, groups.triton, _profile_tier(profile)
    for config in SPLIT_K_CONFIGS:
        yield config, groups.split_k, _half_only
    for side in ("m", "n"):
        for narrow in SKINNY_NARROW:
            for wide, bk, stages, sk in SKINNY_SHAPES:
                yield skinny_config(side, narrow, wide, bk, stages, sk), groups.skinny, _skinny_tier(side, narrow)


def triton_gemm_family(builder: CandidateSetBuilder, groups: Groups, device: DeviceInfo) -> None:
    """``triton_gemm_*``: the profiles', split-K and skinny GEMMs; a config serving several
    slots is added once, with its best tier per group."""
    members: dict[GemmConfig, dict[str, list]] = {}
    for config, group, priority in _gemm_slots(groups):
        members.setdefault(config, {}).setdefault(group.name, [group]).append(priority)
    for config, by_group in members.items():
        pairs = [(group, _best_of(priorities)) for group, *priorities in by_group.values()]
        fuses = config.split_k == 1  # split-K partials are summed before any epilogue
        _add_with_fused(builder, f"triton_gemm_{config.name}", _kernel(gemm, config),
                        _params(config, "triton_gemm"), gemm_supports(config),
                        functools.partial(gemm_cost, config, sms=device.multiprocessors), pairs, fuses)


def triton_packed_family(builder: CandidateSetBuilder, groups: Groups, device: DeviceInfo) -> None:
    """``triton_packed_*``: K-major f32 (TF32) GEMMs in triton_gemm, as-stored half ones in padded."""
    members: dict[tuple[GemmConfig, bool], list] = {}
    for profile, configs in F32_PACKED_PROFILES.items():
        for config in configs:
            members.setdefault((config, True), []).append((groups.triton, _tf32_tier(profile)))
    for config in PADDED_PACKED_CONFIGS:
        members.setdefault((config, False), []).append((groups.padded, _half_only))
    for (config, k_major), pairs in members.items():
        layout = "kmajor" if k_major else "asis"
        kernel = _kernel(functools.partial(packed_gemm, k_major=k_major), config, f"packed_gemm_{layout}")
        _add_with_fused(builder, f"triton_packed_{layout}_{config.name}", kernel,
                        {**_params(config, "triton_packed"), "k_major": k_major}, gemm_supports(config),
                        functools.partial(packed_cost, config, k_major, sms=device.multiprocessors), pairs)


def padded_xla_family(builder: CandidateSetBuilder, groups: Groups, device: DeviceInfo) -> None:
    """``padded_xla_dot_a8``: m, n and k padded to 8, a lower tier of padded."""
    builder.add(Candidate(f"padded_xla_dot_a{PADDED_XLA_ALIGN}", padded(xla_dot, PADDED_XLA_ALIGN),
                          params={"family": "padded", "align": PADDED_XLA_ALIGN},
                          supports=float_supports,
                          cost=functools.partial(padded_xla_cost, PADDED_XLA_ALIGN), xla_autotuned=True),
                groups.padded, _lower)


def padded_cublaslt_family(builder: CandidateSetBuilder, groups: Groups, device: DeviceInfo) -> None:
    """``padded_cublaslt_a{8,64}_rows[_algoN]``: the misaligned rows padded (a custom call
    cannot fuse the pads: no barrier); three algorithms on the pad to 64, one on the pad to 8."""
    for align in PADDED_CUBLASLT_ALIGNS:
        algorithms = range(CUBLASLT_ALGORITHMS) if align == PADDED_TOP_ALIGN else range(1)
        for algorithm in algorithms:
            suffix = f"_algo{algorithm}" if algorithm else ""
            builder.add(Candidate(f"padded_cublaslt_a{align}_rows{suffix}",
                                  padded(functools.partial(_cublaslt_kernel, algorithm=algorithm), align,
                                         misaligned_only=True),
                                  params={"family": "padded", "inner": "cublaslt", "align": align,
                                          "misaligned_only": True, "algorithm": algorithm},
                                  supports=cublaslt_supports,
                                  cost=functools.partial(padded_xla_cost, align, misaligned_only=True),
                                  quick_compile=True),
                        groups.padded, _align_tier(align))


def padded_barrier_family(builder: CandidateSetBuilder, groups: Groups, device: DeviceInfo) -> None:
    """``padded_xla_dot_a{8,64}_barrier_rows``: XLA's dot on the misaligned rows padded,
    the pads behind a barrier."""
    for align in PADDED_BARRIER_ALIGNS:
        builder.add(Candidate(f"padded_xla_dot_a{align}_barrier_rows",
                              padded(xla_dot, align, barrier=True, misaligned_only=True),
                              params={"family": "padded", "align": align, "barrier": True,
                                      "misaligned_only": True},
                              supports=float_supports,
                              cost=functools.partial(padded_xla_cost, align, misaligned_only=True),
                              xla_autotuned=True),
                    groups.padded, _align_tier(align))


def xla_transposed_family(builder: CandidateSetBuilder, groups: Groups, device: DeviceInfo) -> None:
    """``xla_transposed``: XLA's dot of C^T = B^T A^T, in split_k's top tier."""
    builder.add(Candidate("xla_transposed", xla_transposed, params={"family": "xla_transposed"},
                          supports=float_supports,
                          cost=functools.partial(xla_cost, launches=2), xla_autotuned=True),
                groups.split_k, _top)


def triton_vector_family(builder: CandidateSetBuilder, groups: Groups, device: DeviceInfo) -> None:
    """``triton_vector_*``: skinny_gemv's top tier when m or n is 1."""
    for config in VECTOR_CONFIGS:
        builder.add(Candidate(f"triton_vector_{config.name}", _kernel(vector_matmul, config),
                              params=_params(config, "triton_vector"), supports=vector_supports,
                              cost=functools.partial(vector_cost, config)),
                    groups.skinny, lambda key: TOP if is_vector(key) else SKIP)


# The order is the set's (its checksum hashes it): a new family goes at the end.
FAMILIES = (cublaslt_family, cublaslt_epilogue_family, mosaic_gemm_family, triton_gemm_family,
            triton_packed_family, padded_xla_family, padded_cublaslt_family, padded_barrier_family,
            xla_transposed_family, triton_vector_family)
# on Pallas's Triton backend: in the set only where this jax ships it
TRITON_FAMILIES = (triton_gemm_family, triton_packed_family, triton_vector_family)


def gpu_candidate_set(device: DeviceInfo, triton: bool | None = None) -> CandidateSet:
    """XLA's dot (candidate 0), the groups, then every family of ``FAMILIES`` in order, the
    Triton ones only if ``triton`` (default: ``triton_backend.SHIPPED``)."""
    triton = triton_backend.SHIPPED if triton is None else triton
    builder = CandidateSetBuilder("gpu", device.device_kind)
    builder.add(XLA_DOT)
    groups = declare_groups(builder, device)
    for family in FAMILIES:
        if triton or family not in TRITON_FAMILIES:
            family(builder, groups, device)
    return builder.build()


__all__ = ["gpu_candidate_set", "FAMILIES", "TRITON_FAMILIES", "Groups", "declare_groups", "CUBLASLT_ALGORITHMS",
           "GEMM_PROFILES", "F32_PACKED_PROFILES", "SPLIT_K_CONFIGS",
           "PADDED_PACKED_CONFIGS", "VECTOR_CONFIGS", "packed_cost", "xla_cost", "tf32_key",
           "MOSAIC_GEMM_RANKS", "SKINNY_NARROW", "dtype_class", "size_class", "narrow_side",
           "is_split_k_shape", "mosaic_shape", "gemm_cost", "mosaic_gemm_cost", "vector_cost"]
