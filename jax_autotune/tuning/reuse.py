"""What the tuning of a key's bare product says: candidates that lost there by a wide margin
are not timed again in a context.

A key with an epilogue runs the same GEMM as the bare key of its product (the same shapes,
dtypes, layouts and precision; ``product_key``), with the epilogue after it or, in a fused
candidate, inside it. A kernel that was wrong on the bare product is wrong here; one whose
time there was over ``ratio`` x the best (``TuningRules.reuse_ratio``) is not expected to win
once the epilogue is added, so the tuner skips it (``skipped``, the reason names the bare
key). A fused candidate (``Candidate.product``: ``triton_gemm_X_epilogue`` computes
``triton_gemm_X``'s product) is judged by its product's kernel. XLA's dot is always timed.
Only the bare tuning counts: in another context XLA may have fused a heavy epilogue that
made every custom call look slow.

    >>> lost = losers(plan_candidates, bare_decision, ratio=1.5)
    >>> lost["triton_gemm_64x64_epilogue"]
    'lost by 2.31x to cublaslt_algo0 on the same product (key m=1024 ...)'
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from jax_autotune.epilogue import BARE
from jax_autotune.key import MatmulKey
from jax_autotune.tuning.candidates import Candidate
from jax_autotune.tuning.decision import Decision, Outcome

_FAILED = (Outcome.WRONG_RESULT, Outcome.COMPILE_ERROR, Outcome.RESOURCE_EXHAUSTED, Outcome.RUNTIME_ERROR)


def product_key(key: MatmulKey) -> MatmulKey:
    """The bare key of ``key``'s product."""
    return dataclasses.replace(key, epilogue=BARE)


def losers(candidates: Sequence[Candidate], bare: Decision, ratio: float) -> dict[str, str]:
    """{candidate name: why it is not timed} for the candidates whose kernel failed, or
    lost by over ``ratio`` x the best, in ``bare`` (the tuning of the bare product)."""
    best = min((r.score for r in bare.results if r.eligible), default=None)
    where = f"on the same product (key {bare.key.canonical()[:120]})"
    found = {}
    for candidate in candidates:
        result = bare.result(candidate.product or candidate.name)
        if result is None:
            continue
        if result.outcome in _FAILED:
            found[candidate.name] = f"{result.outcome} {where}"
        elif result.score is not None and best and result.score > ratio * best:
            found[candidate.name] = f"lost by {result.score / best:.2f}x to {bare.winner} {where}"
    return found


__all__ = ["losers", "product_key"]
