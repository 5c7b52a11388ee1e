"""Our Mosaic GPU GEMM (``kernels.gpu.mosaic_gemm``) on a ``MatmulProblem``: the config by rank.

A candidate of the ``mosaic_gemm`` family is a rank, not a config: ``ranked_config``
gives the problem the ``rank``-th config that ``mosaic_gemm.configs_for`` ranks for its
own sizes (tile and wave quantization, split-K where the output tiles are few and k is
long, stages to fit shared memory with the epilogue's operand tiles), so a few configs
per key are tried and none is a sweep. ``mosaic_matmul`` runs it on the canonical
operands, transposes as stored, and with the problem's elementwise epilogue in the kernel
when the candidate is the fused one.

    >>> ranked_config(problem, 0, sms=132).name
    'tm128_tn128_tk64_st4_wgN_gN8'
    >>> out = mosaic_matmul(lhs, rhs, problem, rank=0)            # (batch, m, n)
    >>> out = mosaic_matmul(lhs, rhs, problem_with_bias, bias, rank=1)

``problem_supported`` says why a problem cannot run without a copy (``mosaic_gemm``'s
alignment rules); the tuner's key rule (``predicates.mosaic_gemm_supports``) sees only
what a key records, so a problem of the same key with, say, an m that is not a multiple
of 8 is refused here, at lowering, and the product warns and runs XLA's dot.
"""

from __future__ import annotations

import functools

import jax

from jax_autotune.kernels.gpu import mosaic_gemm
from jax_autotune.kernels.gpu.configs import MOSAIC_GEMM_RANKS
from jax_autotune.kernels.gpu.mosaic_gemm import AVAILABLE, IMPORT_ERROR, H100_SMS, MosaicGemmConfig
from jax_autotune.key import Precision
from jax_autotune.problem import MatmulProblem


def _epilogue(problem: MatmulProblem):
    return None if problem.epilogue.is_bare else problem.epilogue


def _operand_roles(problem: MatmulProblem) -> tuple[tuple[str, str], ...]:
    return tuple((o.role, o.dtype) for o in problem.epilogue.operands)


def device_sms() -> int:
    """The first device's SM count, or an H200's where it has none (lowering on a CPU)."""
    return getattr(jax.devices()[0], "core_count", None) or H100_SMS


def ranked_config(problem: MatmulProblem, rank: int, sms: int) -> MosaicGemmConfig | None:
    """The ``rank``-th of the ``MOSAIC_GEMM_RANKS`` configs ``configs_for`` gives ``problem``
    on ``sms`` SMs, or None (the ranking is taken whole: its limit changes which configs it holds)."""
    configs = _ranking(problem, sms)
    return configs[rank] if rank < len(configs) else None


@functools.lru_cache(maxsize=1024)
def _ranking(problem: MatmulProblem, sms: int) -> tuple[MosaicGemmConfig, ...]:
    """One ranking per problem: each rank's cost, supports check and lowering read it."""
    return tuple(mosaic_gemm.configs_for(problem.m, problem.n, problem.k, problem.lhs_dtype, batch=problem.batch,
                                         num_sms=sms, out_dtype=problem.out_dtype, limit=MOSAIC_GEMM_RANKS,
                                         operands=_operand_roles(problem)))


def problem_supported(problem: MatmulProblem, config: MosaicGemmConfig | None = None):
    """True, or a falsy ``mosaic_gemm.Unsupported`` reason."""
    if problem.groups or problem.lhs_dtype != problem.rhs_dtype:
        return mosaic_gemm.Unsupported("a dense matmul of one input dtype only")
    if Precision(problem.precision).algorithm is not None:
        return mosaic_gemm.Unsupported(f"precision {problem.precision} names an algorithm")
    if problem.lhs_dtype == "float32" and problem.precision != Precision.DEFAULT:
        return mosaic_gemm.Unsupported("float32 runs TF32 wgmma: Precision.DEFAULT only")
    return mosaic_gemm.supports(problem.m, problem.n, problem.k, problem.lhs_dtype,
                                transpose_lhs=problem.transpose_a, transpose_rhs=problem.transpose_b,
                                out_dtype=problem.out_dtype, batch=problem.batch, config=config,
                                epilogue=_epilogue(problem))


def mosaic_matmul(lhs, rhs, problem: MatmulProblem, *operands, rank: int):
    """``mosaic_gemm`` of the canonical operands with the ``rank``-th config; (batch, m, n).

    With a non-bare ``problem.epilogue`` (the fused candidate) the epilogue is applied
    in the kernel to ``operands`` and the result is in its dtype. Raises ValueError where
    the problem is not served.
    """
    sms = device_sms()
    config = ranked_config(problem, rank, sms)
    if config is None:
        raise ValueError(f"mosaic_matmul: configs_for gives {problem.describe()} no config of rank {rank}")
    reason = problem_supported(problem, config)
    if not reason:
        raise ValueError(f"mosaic_matmul {config.name}: {reason}")
    return mosaic_gemm.mosaic_gemm(lhs, rhs, config=config, transpose_lhs=problem.transpose_a,
                                   transpose_rhs=problem.transpose_b, out_dtype=problem.out_dtype,
                                   epilogue=_epilogue(problem), epilogue_operands=operands, num_sms=sms)


__all__ = ["AVAILABLE", "IMPORT_ERROR", "MosaicGemmConfig", "device_sms", "ranked_config",
           "problem_supported", "mosaic_matmul"]
