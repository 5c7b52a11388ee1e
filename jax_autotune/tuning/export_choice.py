"""Internal: which candidate an export emits for a key's decision, ranked from the decision alone.

Under jit a lowering emits the decision's winner. Under ``jax.export`` it emits the fastest
candidate that jax.export takes (``tuning.export_safety``; targets the caller allows with
``export_safety.allowing`` count as taken), ranked by the decision's own results: the
winner, then every other valid, unpruned candidate by its score. Only a decision that
holds no measured result is measured now (the caller passes ``measure`` in mode ``tune``;
XLA's dot otherwise). This module only ranks: ``Tuner.emitted`` asks it, records the
choice on the decision (``export_kernel``, ``export_reason``) and logs it.

    >>> choose(decision, verdict=lambda name: check(tuner.candidate_set.by_name(name), problem, "cpu"),
    ...        allowed=frozenset(), baseline="xla_dot", measure=None)
    ('xla_dot', 'native_gemm_avx2_6x16_t2 emits jax_autotune_gemm, which jax.export does not take; ...')
"""

from __future__ import annotations

from typing import Callable

from jax_autotune.tuning.decision import Decision
from jax_autotune.tuning.export_safety import ExportSafety

Verdict = Callable[[str], "ExportSafety | None"]  # None: a name this build does not know


def ranked(decision: Decision) -> list[str]:
    """The winner, then every other eligible candidate of the decision, fastest first."""
    others = sorted((r for r in decision.results if r.eligible and r.name != decision.winner),
                    key=lambda r: r.score)
    return [decision.winner, *(r.name for r in others)]


def choose(decision: Decision, verdict: Verdict, allowed: frozenset[str], baseline: str,
           measure: Callable[[], Decision] | None) -> tuple[str, str]:
    """(candidate name, reason) for an export of the decision's key; the reason is '' when
    the winner itself is emitted because jax.export takes it."""
    def taken(name: str) -> bool:
        found = verdict(name)
        return found is not None and found.allowed(allowed)

    winner = verdict(decision.winner)
    if winner is not None and winner.allowed(allowed):
        if winner.safe:
            return decision.winner, ""
        return decision.winner, (f"{decision.winner} kept: the caller allows "
                                 f"{', '.join(sorted(winner.unsafe))}")
    why = _refusal(decision.winner, winner)
    for name in ranked(decision)[1:]:
        if taken(name):
            return name, f"{why}; {name} is the fastest measured candidate jax.export takes"
    if not any(r.eligible for r in decision.results):
        recorded = decision.export_kernel
        if recorded and recorded != baseline and taken(recorded):
            return recorded, decision.export_reason  # measured for an earlier export
        if measure is not None:
            for name in ranked(measure()):
                if taken(name):
                    return name, (f"{why}; {name} is the fastest candidate jax.export takes, "
                                  f"measured at export")
    return baseline, f"{why}; no other measured candidate jax.export takes: XLA's dot"


def _refusal(name: str, verdict: ExportSafety | None) -> str:
    if verdict is None:
        return f"{name} is not a candidate of this build"
    if verdict.error:
        return f"{name} does not lower alone ({verdict.error})"
    return f"{name} emits {', '.join(sorted(verdict.unsafe))}, which jax.export does not take"


__all__ = ["ranked", "choose"]
