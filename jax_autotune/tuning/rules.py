"""Every constant of the tuning rules, in one frozen object.

    >>> from jax_autotune.tuning.rules import TuningRules
    >>> rules = TuningRules(prune_ratio=2.0)   # tests and experiments override fields

The benchmark (``bench``) reads nothing else; the per-key budget comes from the
``budget_seconds`` setting unless a rules object is given explicitly.
"""

from __future__ import annotations

import dataclasses

from jax_autotune.key import Level


@dataclasses.dataclass(frozen=True)
class TuningRules:
    min_samples: int = 3  # kept samples before pruning / stability may stop a candidate
    max_samples: int = 10  # kept samples at most
    discard_first: int = 1  # samples taken and thrown away after the warm-up run
    prune_ratio: float = 1.5  # drop a candidate whose best is over this x the best so far
    keep_at_least: int = 2  # pruning never leaves fewer measured survivors than this
    short_circuit_hits: int = 2  # in-bound samples that end the whole tuning
    stable_spread: float = 0.03  # stop sampling once median/min - 1 is within this
    baseline_margin: float = 0.02  # a candidate must beat XLA's dot by this to replace it
    # host clocks: the fastest other candidate is timed again in turns with XLA's dot, this
    # many pairs at most, and that decides between them (``KeyBenchmark.compare_in_turns``); 0: never
    paired_samples: int = 8
    budget_seconds: float | None = None  # per key; None: the ``budget_seconds`` setting
    compile_ahead: int = 4  # device timers: candidates compiling while one is measured
    # a candidate estimated slower than this x the best measured time is not compiled
    # (``skipped``); None: every candidate of a round is compiled
    cost_skip_ratio: float | None = 1.3
    # a context key skips the kernels that lost by over this x the best in every earlier
    # tuning of its product (``tuning.reuse``); None: every candidate is timed
    reuse_ratio: float | None = 1.5
    claim_lease_seconds: float = 15.0  # a key's claim in a shared store lapses after this (renewed while tuning)
    peer_wait_seconds: float | None = None  # waiting for another process's decision; None: 3 x budget + 60 s

    # roofline thresholds: the fraction of peak that counts as "good enough"
    thresholds: tuple[tuple[str, float | None], ...] = (
        (Level.MINIMAL.value, 0.6),
        (Level.BALANCED.value, 0.8),
        (Level.EXTENSIVE.value, 0.95),
        (Level.FULL.value, None),
    )

    def __post_init__(self):
        if not 1 <= self.min_samples <= self.max_samples:
            raise ValueError("TuningRules: need 1 <= min_samples <= max_samples")
        if self.paired_samples < 0:
            raise ValueError("TuningRules: paired_samples must be >= 0")
        if self.prune_ratio <= 1.0:
            raise ValueError("TuningRules: prune_ratio must be > 1")
        if self.reuse_ratio is not None and self.reuse_ratio <= 1.0:
            raise ValueError("TuningRules: reuse_ratio must be > 1 or None")
        if self.cost_skip_ratio is not None and self.cost_skip_ratio < 1.0:
            raise ValueError("TuningRules: cost_skip_ratio must be >= 1 or None")

    def peer_wait(self, budget_seconds: float) -> float:
        """How long to wait for another process tuning a key (its budget, compiles, probes)."""
        return self.peer_wait_seconds if self.peer_wait_seconds is not None else 3 * budget_seconds + 60

    def threshold(self, level: Level | str) -> float | None:
        return dict(self.thresholds)[Level(level).value]


DEFAULT_RULES = TuningRules()
