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

    >>> lost = losers(plan_candidates, [bare_decision], ratio=1.5)
    >>> lost["triton_gemm_64x64_epilogue"]
    'lost by 2.31x to cublaslt_algo0 on the same product (key m=1024 ...)'
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

from jax_autotune.epilogue import BARE
from jax_autotune.key import MatmulKey
from jax_autotune.tuning.candidates import Candidate
from jax_autotune.tuning.decision import Decision

_FAILED = ("wrong_result", "compile_error", "resource_exhausted", "runtime_error")


def product_key(key: MatmulKey) -> MatmulKey:
    """The bare key of ``key``'s product."""
    return dataclasses.replace(key, epilogue=BARE)


def losers(candidates: Sequence[Candidate], priors: Iterable[Decision], ratio: float) -> dict[str, str]:
    """{candidate name: why it is not timed} for the candidates that failed or lost by
    over ``ratio`` x the best in every one of ``priors`` (tunings of the same bare product)
    that measured their kernel."""
    verdicts: dict[str, list[str]] = {}
    for prior in priors:
        best = min((r.score for r in prior.results if r.eligible), default=None)
        winner = prior.winner
        for candidate in candidates:
            result = prior.result(candidate.product or candidate.name)
            if result is None:
                continue
            if result.outcome in _FAILED:
                verdict = f"{result.outcome} on the same product"
            elif result.score is not None and best and result.score > ratio * best:
                verdict = f"lost by {result.score / best:.2f}x to {winner} on the same product"
            elif result.score is not None:
                verdict = ""  # measured and close: timed again
            else:
                continue  # skipped there: nothing known
            verdicts.setdefault(candidate.name, []).append(
                f"{verdict} (key {prior.key.canonical()[:120]})" if verdict else "")
    return {name: found[0] for name, found in verdicts.items() if all(found)}


__all__ = ["losers", "product_key"]
