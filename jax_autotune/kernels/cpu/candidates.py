"""The CPU candidate set: XLA's dot plus the native kernels of ``jax_autotune.kernels.cpu.native``.

    >>> from jax_autotune.tuning.device import DeviceInfo
    >>> from jax_autotune import native
    >>> device = DeviceInfo("cpu", "cpu", features=native.cpu_features())
    >>> cpu_candidate_set(device).names()[:2]
    ('xla_dot', 'native_small_portable_t1')

Candidates (``N`` = ``native.max_threads()`` when the set is built; the ``tN`` variants
exist only when N > 1; ``nr`` is counted in float32 lanes, float64 tiles are half as wide):

* ``native_small_{isa}_t1|tN``        batched small matmul, m, n, k <= 32
* ``native_gemv_{isa}_t1|tN``         matrix-vector / vector-matrix, m == 1 or n == 1
* ``native_gemm_{isa}_{mr}x{nr}_t1|tN`` packed GEMM, two register tiles per ISA

for isa in portable, avx2, avx512, and, only when the optional ``scipy-openblas32``
package is importable, ``blas_openblas_t1|tN`` (cblas gemm) in the ``gemm`` group at the
SIMD tier. All need lhs, rhs and out dtypes equal and float32 or float64; avx2 needs the
``avx2`` and ``fma`` features, avx512 ``avx512f``, ``avx512dq`` and ``avx512vl``
(``DeviceInfo.features``, from ``native.cpu_features()``).

Plan rules, on the (bucketed) key; "tiny" means m, n and k <= 32, "1-dim" means m == 1
or n == 1 (kinds MatVec, VecMat, InnerProduct, ScalarVec, VecScalar, ScalarProduct).
Groups run from the highest priority down and tuning stops at the first round with a
valid result, so the first group holds every candidate worth comparing; later groups run
only when every candidate before them failed. XLA's dot joins every round.

=====================================  =====================================================
key                                    groups in order (group priority)
=====================================  =====================================================
tiny, 1-dim                            small (3), gemv (2), gemm (1)
tiny, General / OuterProduct           small (3), gemm (1)
not tiny, 1-dim                        gemv (3), gemm (1)
not tiny, General / OuterProduct       gemm (2)
=====================================  =====================================================

In-group tiers, the same in every group: the SIMD ISAs (avx2, avx512) are tier 2 and
``portable`` tier 1 (it runs only if every SIMD candidate failed); a candidate the device
cannot run is demoted by the plan. ``tN`` is skipped (-1) when the work is too small to
pay for waking threads (batch * m * n * k < 2**18); ``t1`` of the GEMM is skipped on
Large keys (one core cannot win there) when N > 1.
"""

from __future__ import annotations

from typing import Callable

from jax_autotune.kernels.cpu import native
from jax_autotune.tuning.candidates import Candidate, CandidateSet, CandidateSetBuilder, Group
from jax_autotune.tuning.device import DeviceInfo
from jax_autotune.key import Kind, MatmulKey, Scale
from jax_autotune.problem import MatmulProblem
from jax_autotune.kernels.xla import XLA_DOT

ISAS = native.built_isas()  # ("portable", "avx2", "avx512") on x86-64
SIMD_ISAS = frozenset({"avx2", "avx512"})
ISA_FEATURES = {
    "portable": frozenset(),
    "avx2": frozenset({"avx2", "fma"}),
    "avx512": frozenset({"avx512f", "avx512dq", "avx512vl"}),
}
SUPPORTED_DTYPES = native.SUPPORTED_DTYPES
SMALL_MAX_DIM = native.SMALL_MAX_DIM
ONE_DIM_KINDS = frozenset({Kind.MAT_VEC, Kind.VEC_MAT, Kind.INNER_PRODUCT, Kind.SCALAR_VEC,
                           Kind.VEC_SCALAR, Kind.SCALAR_PRODUCT})
MIN_THREADED_WORK = 2 ** 18  # batch * m * n * k below which one thread is always enough

# Rough per-thread float32 peaks (flop/s) and bandwidths (B/s) for the cost model; float64
# halves the peak. They only order a round, the benchmark decides.
PEAK_FLOPS_PER_THREAD = {"portable": 16e9, "avx2": 64e9, "avx512": 128e9}
BANDWIDTH_PER_THREAD = 10e9
CALL_OVERHEAD_S = 5e-6
THREAD_WAKE_S = 10e-6
EFFICIENCY = {"small": 0.4, "gemv": 0.5, "gemm": 0.8}


# ---------------------------------------------------------------- the key rules

def is_tiny(key: MatmulKey) -> bool:
    return max(key.m, key.n, key.k) <= SMALL_MAX_DIM


def is_one_dim(key: MatmulKey) -> bool:
    return key.kind in ONE_DIM_KINDS


def small_group_priority(key: MatmulKey) -> int:
    return 3 if is_tiny(key) else -1


def gemv_group_priority(key: MatmulKey) -> int:
    if not is_one_dim(key):
        return -1
    return 2 if is_tiny(key) else 3


def gemm_group_priority(key: MatmulKey) -> int:
    if is_tiny(key) or is_one_dim(key):
        return 1
    return 2


def tier_fn(isa: str, threads: int, family: str) -> Callable[[MatmulKey], int]:
    """The in-group priority of one candidate: ISA tier, minus skips by thread count."""
    base = 2 if isa in SIMD_ISAS else 1

    def tier(key: MatmulKey) -> int:
        work = key.batch * key.m * key.n * key.k
        if threads > 1 and work < MIN_THREADED_WORK:
            return -1
        if (family == "gemm" and threads == 1 and native.max_threads() > 1
                and key.scale == Scale.LARGE):
            return -1
        return base

    return tier


# ---------------------------------------------------------------- candidates

def _supports_fn(isa: str, family: str) -> Callable[[DeviceInfo, MatmulKey], bool]:
    needed = ISA_FEATURES[isa]

    def supports(device: DeviceInfo, key: MatmulKey) -> bool:
        if device.platform != "cpu" or not needed <= device.features:
            return False
        dtypes = {key.lhs_dtype, key.rhs_dtype, key.out_dtype}
        if len(dtypes) != 1 or not dtypes <= SUPPORTED_DTYPES:
            return False
        if family == "small":
            return is_tiny(key)
        if family == "gemv":
            return key.m == 1 or key.n == 1
        return True

    return supports


def _cost_fn(isa: str, threads: int, family: str) -> Callable[[MatmulProblem], float]:
    def cost(problem: MatmulProblem) -> float:
        itemsize = 8 if problem.out_dtype == "float64" else 4
        flops = 2.0 * problem.batch * problem.m * problem.n * problem.k
        moved = itemsize * problem.batch * (problem.m * problem.k + problem.k * problem.n
                                            + problem.m * problem.n)
        peak = PEAK_FLOPS_PER_THREAD[isa] * (4 / itemsize) * EFFICIENCY[family] * threads
        seconds = max(flops / peak, moved / (BANDWIDTH_PER_THREAD * threads))
        return seconds + CALL_OVERHEAD_S + (THREAD_WAKE_S if threads > 1 else 0.0)

    return cost


def _small_fn(isa: str, threads: int):
    def fn(lhs, rhs, problem: MatmulProblem):
        return native.small_matmul(lhs, rhs, problem, isa=isa, threads=threads)
    return fn


def _gemv_fn(isa: str, threads: int):
    def fn(lhs, rhs, problem: MatmulProblem):
        return native.gemv(lhs, rhs, problem, isa=isa, threads=threads)
    return fn


def _gemm_fn(isa: str, threads: int, tile: int):
    def fn(lhs, rhs, problem: MatmulProblem):
        return native.gemm(lhs, rhs, problem, tile=tile, isa=isa, threads=threads)
    return fn


def thread_variants() -> tuple[int, ...]:
    """1 and, when the machine has more, all of ``native.max_threads()``."""
    most = native.max_threads()
    return (1, most) if most > 1 else (1,)


def native_candidates(family: str) -> list[Candidate]:
    """Every candidate of one family ("small", "gemv" or "gemm"), ISA by ISA.

    >>> [c.name for c in native_candidates("gemv")][:2]
    ['native_gemv_portable_t1', 'native_gemv_portable_t2']
    """
    out = []
    for isa in ISAS:
        if family == "gemm":
            shapes = [(tile, mr, nr) for tile, (mr, nr, _) in enumerate(native.gemm_tiles(isa))]
        elif family in ("small", "gemv"):
            shapes = [None]
        else:
            raise ValueError(f"family: expected 'small', 'gemv' or 'gemm', got {family!r}")
        for shape in shapes:
            for threads in thread_variants():
                params = {"family": family, "isa": isa, "threads": threads}
                if shape is None:
                    name = f"native_{family}_{isa}_t{threads}"
                    fn = (_small_fn if family == "small" else _gemv_fn)(isa, threads)
                else:
                    tile, mr, nr = shape
                    params.update(tile=tile, mr=mr, nr=nr)
                    name = f"native_gemm_{isa}_{mr}x{nr}_t{threads}"
                    fn = _gemm_fn(isa, threads, tile)
                out.append(Candidate(name, fn, params=params,
                                     supports=_supports_fn(isa, family),
                                     cost=_cost_fn(isa, threads, family),
                                     quick_compile=True))
    return out


def _blas_fn(threads: int):
    def fn(lhs, rhs, problem: MatmulProblem):
        return native.blas_gemm(lhs, rhs, problem, threads=threads)
    return fn


def _supports_blas(device: DeviceInfo, key: MatmulKey) -> bool:
    dtypes = {key.lhs_dtype, key.rhs_dtype, key.out_dtype}
    return (device.platform == "cpu" and len(dtypes) == 1 and dtypes <= SUPPORTED_DTYPES
            and native.blas_available())


def blas_candidates() -> list[Candidate]:
    """``blas_openblas_t1|tN`` when scipy-openblas32 is importable, else none.

    Costed like the best native GEMM of this CPU.
    """
    if not native.blas_available():
        return []
    return [Candidate(f"blas_openblas_t{threads}", _blas_fn(threads),
                      params={"family": "blas", "library": "scipy-openblas32",
                              "threads": threads},
                      supports=_supports_blas, cost=_cost_fn(native.isa(), threads, "gemm"),
                      quick_compile=True)
            for threads in thread_variants()]


def cpu_candidate_set(device: DeviceInfo) -> CandidateSet:
    """XLA's dot (candidate 0) and the native kernels, grouped by the rules above.

    The set depends only on the build and ``native.max_threads()`` (the ``tN`` names);
    ``device.features`` decides ``supports``.
    """
    builder = CandidateSetBuilder("cpu", device.device_kind)
    builder.add(XLA_DOT)
    groups: dict[str, Group] = {
        "small": builder.group("small", small_group_priority),
        "gemv": builder.group("gemv", gemv_group_priority),
        "gemm": builder.group("gemm", gemm_group_priority),
    }
    for family, group in groups.items():
        for candidate in native_candidates(family):
            params = candidate.params
            builder.add(candidate, group, tier_fn(params["isa"], params["threads"], family))
    for candidate in blas_candidates():
        # a SIMD-tier GEMM: it competes with the native GEMM tiles in the same round
        builder.add(candidate, groups["gemm"], tier_fn("avx2", candidate.params["threads"], "gemm"))
    return builder.build()
