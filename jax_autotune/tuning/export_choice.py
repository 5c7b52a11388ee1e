"""Internal: the candidate a lowering emits for a key's decision.

Under jit it is the decision's winner. Under ``jax.export`` it is the fastest candidate
that jax.export takes (``tuning.export_safety``; targets the caller allows with
``export_safety.allowing`` count as taken), ranked by the decision's own results: the
winner, then every other valid, unpruned candidate by its score. Only a decision that
holds no measured result is measured now (in mode ``tune``; XLA's dot otherwise). The
choice is recorded on the decision (``export_kernel``, ``export_reason``: in memory, the
store and so in tune tables) and logged as a ``jax_autotune.export`` event.

    >>> decision = tuner.select(problem, key)
    >>> emitted_candidate(tuner, problem, decision, for_export=True, platform="cpu").name
    'xla_dot'
"""

from __future__ import annotations

import dataclasses

import jax_autotune.config as config
from jax_autotune.problem import MatmulProblem
from jax_autotune.tuning.candidates import Candidate
from jax_autotune.tuning.decision import Decision, log_decision
from jax_autotune.tuning.export_safety import ExportSafety, allowed_targets


def ranked(decision: Decision) -> list[str]:
    """The winner, then every other eligible candidate of the decision, fastest first."""
    others = sorted((r for r in decision.results if r.eligible and r.name != decision.winner),
                    key=lambda r: r.score)
    return [decision.winner, *(r.name for r in others)]


def emitted_candidate(tuner, problem: MatmulProblem, decision: Decision, for_export: bool,
                      platform: str) -> Candidate:
    """The candidate to emit for ``problem`` (lowered for ``platform``) from ``tuner``'s
    ``decision``: its winner, or under export the fastest candidate jax.export takes."""
    if not for_export:
        return tuner.candidate(decision.winner)
    try:
        name, reason = export_choice(tuner, problem, decision, platform)
    except Exception as err:  # noqa: BLE001 - the user's export never fails because of the tuner
        name = tuner.candidate_set.baseline.name
        reason = f"export choice failed ({type(err).__name__}: {err}): XLA's dot"[:500]
    _record(tuner, decision, dataclasses.replace(decision, export_kernel=name, export_reason=reason))
    return tuner.candidate(name)


def export_choice(tuner, problem: MatmulProblem, decision: Decision, platform: str) -> tuple[str, str]:
    """(candidate name, reason) for an export of the decision's key; the reason is '' when
    the winner itself is emitted because jax.export takes it."""
    extra = allowed_targets()

    def safety(name: str) -> ExportSafety | None:
        try:
            return tuner.candidate(name).export_safety(problem, platform)
        except KeyError:  # a name this build does not know
            return None

    def taken(name: str) -> bool:
        verdict = safety(name)
        return verdict is not None and verdict.allowed(extra)

    winner = safety(decision.winner)
    if winner is not None and winner.allowed(extra):
        if winner.safe:
            return decision.winner, ""
        return decision.winner, (f"{decision.winner} kept: the caller allows "
                                 f"{', '.join(sorted(winner.unsafe))}")
    why = _refusal(decision.winner, winner)
    for name in ranked(decision)[1:]:
        if taken(name):
            return name, f"{why}; {name} is the fastest measured candidate jax.export takes"
    baseline = tuner.candidate_set.baseline.name
    if not any(r.eligible for r in decision.results):
        recorded = decision.export_kernel
        if recorded and recorded != baseline and taken(recorded):
            return recorded, decision.export_reason  # measured for an earlier export
        if config.get("mode") == "tune":
            measurement = tuner.measure(problem, decision.key)
            for name in ranked(measurement):
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


def _record(tuner, decision: Decision, recorded: Decision) -> None:
    """Keep the export choice on the decision (memory and store) and log it; a fallback
    decision (never stored) is only logged."""
    changed = (recorded.export_kernel, recorded.export_reason) != (decision.export_kernel,
                                                                    decision.export_reason)
    if changed and decision.source != "fallback":
        tuner.install(recorded)
    log_decision(recorded, config.get("log_decisions"), event="jax_autotune.export")
