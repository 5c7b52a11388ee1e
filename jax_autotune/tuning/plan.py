"""The tune plan: which candidates are benchmarked for a key, in which rounds.

Rules (the reference's, plus two of ours, marked *):

1. Groups whose priority for the key is negative are skipped; the rest run from high to
   low priority. *Two groups with the same priority are never merged: they stay
   separate rounds, in the order they were declared.*
2. Inside a group, candidates whose in-group priority is negative are skipped; the
   highest priority tier is the group's round; lower tiers are later rounds, tried
   only if no candidate of the round before produced a valid result.
3. Candidates the device cannot run (``supports`` is False or raises) are demoted to the minimum
   priority: they form one last round, so the plan is never empty. *That round is kept
   for the record only: its candidates are never compiled (the tuner records them as
   ``skipped``), since XLA's dot can always run the key.*
4. *XLA's dot (candidate 0) is the baseline of every round: it is measured once and
   competes with each round's candidates, so the tuned matmul is never slower than
   plain XLA.* A round counts as successful when one of its own candidates is valid.
5. A candidate in several groups runs in the first round that reaches it only.
6. *A key whose precision is an algorithm preset (``lax.DotAlgorithmPreset``) has no
   rounds: a preset is a numerical contract that XLA's dot honours and the other
   families do not promise, so XLA's dot runs it without a benchmark.*

    >>> rounds = make_plan(candidate_set, key, device).rounds
    >>> [(r.group, r.tier, [c.name for c in r.candidates]) for r in rounds]
"""

from __future__ import annotations

import dataclasses

from jax_autotune.tuning.candidates import Candidate, CandidateSet
from jax_autotune.tuning.device import DeviceInfo
from jax_autotune.key import MatmulKey

DEMOTED = "demoted"


@dataclasses.dataclass(frozen=True)
class Round:
    group: str
    tier: int  # the in-group priority of this tier (DEMOTED rounds: -1)
    candidates: tuple[Candidate, ...]
    primes_xla: bool = False  # the group's ``primes_xla``

    @property
    def label(self) -> str:
        return f"{self.group}/{self.tier}"


@dataclasses.dataclass(frozen=True)
class Plan:
    baseline: Candidate
    rounds: tuple[Round, ...]
    reason: str = ""  # why there are no rounds, when it is not just an empty candidate set

    @property
    def runnable(self) -> tuple[Round, ...]:
        """The rounds to benchmark: every round but the demoted one."""
        return tuple(r for r in self.rounds if r.group != DEMOTED)

    def without(self, names) -> "Plan":
        """The plan with the named candidates left out (a round left empty goes too)."""
        rounds = (dataclasses.replace(r, candidates=tuple(c for c in r.candidates if c.name not in names))
                  for r in self.rounds)
        return dataclasses.replace(self, rounds=tuple(r for r in rounds if r.candidates))

    @property
    def unsupported(self) -> tuple[Candidate, ...]:
        """The demoted candidates: the device cannot run them for this key."""
        return tuple(c for r in self.rounds if r.group == DEMOTED for c in r.candidates)


def make_plan(candidate_set: CandidateSet, key: MatmulKey, device: DeviceInfo) -> Plan:
    """The rounds for ``key`` on ``device`` (see the module docstring for the rules)."""
    baseline = candidate_set.baseline
    if key.precision.algorithm is not None:
        return Plan(baseline, (), reason=f"only XLA's dot honours the algorithm preset "
                                         f"{key.precision.algorithm}")
    by_name = {c.name: c for c in candidate_set.candidates}
    groups = sorted(
        ((g.priority(key), g.index, g) for g in candidate_set.groups),
        key=lambda item: (-item[0], item[1]),
    )
    rounds: list[Round] = []
    placed: set[str] = {baseline.name}
    demoted: list[Candidate] = []
    for group_priority, _, group in groups:
        if group_priority < 0:
            continue
        tiers: dict[int, list[Candidate]] = {}
        for member in candidate_set.memberships:
            if member.group != group.name or member.candidate in placed:
                continue
            priority = member.priority(key)
            if priority < 0:
                continue
            candidate = by_name[member.candidate]
            placed.add(candidate.name)
            if candidate.runs(device, key):
                tiers.setdefault(priority, []).append(candidate)
            else:
                demoted.append(candidate)
        for tier in sorted(tiers, reverse=True):
            rounds.append(Round(group.name, tier, tuple(tiers[tier]), group.primes_xla))
    if demoted:
        rounds.append(Round(DEMOTED, -1, tuple(demoted)))
    return Plan(baseline, tuple(rounds))
