"""One line per decision: how a tuned winner compares with XLA's dot.

``jax-autotune show`` prints these rows; ``TuneTable.summary_rows`` builds them.

    >>> row = summarize("cpu-x", decision)
    >>> row.winner, row.speedup, key_id(decision.key)       # doctest: +SKIP
    ('native_gemm_avx2_6x16_t2', 1.8, '3f9c2a71d0')
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter

from jax_autotune.kernels.ragged import XLA_RAGGED_NAME
from jax_autotune.kernels.xla import XLA_DOT_NAME
from jax_autotune.key import MatmulKey
from jax_autotune.tuning.decision import Decision, Outcome


def key_id(key: MatmulKey) -> str:
    """A short stable handle of a key (``jax-autotune show`` prints it, ``explain`` takes it).

        >>> key_id(MatmulKey.parse(text))   # doctest: +SKIP
        '3f9c2a71d0'
    """
    return hashlib.sha256(key.canonical().encode()).hexdigest()[:10]


def matches(key: MatmulKey, text: str) -> bool:
    """Whether ``text`` is the key's id or part of its canonical or compact form."""
    return text in key.canonical() or text in key.describe() or text == key_id(key)


@dataclasses.dataclass(frozen=True)
class SummaryRow:
    """One line of ``jax-autotune show``: a decision and how it compares with XLA's dot.

    ``speedup`` is XLA's time (its dot; for a grouped key its ragged_dot) over the
    winner's; ``roofline_fraction`` is the roofline
    limit (or, without one, the roofline floor) over the winner's time: 1.0 or more means
    the winner is inside the limit. ``samples`` counts the winner's kept timings; times
    are seconds; None where not measured.
    """

    device: str
    key: str  # canonical key string
    key_id: str
    shape: str  # compact: [B x] M x N x K, dtypes, layouts, precision
    winner: str
    winner_seconds: float | None
    xla_seconds: float | None
    speedup: float | None
    roofline_fraction: float | None
    samples: int
    outcomes: dict[str, int]
    source: str
    reason: str


def _roofline_fraction(decision: Decision, winner_seconds: float | None) -> float | None:
    if not winner_seconds or winner_seconds <= 0:
        return None
    if decision.limit:
        return decision.limit / winner_seconds
    floors = [decision.bounds.get(name) for name in ("compute_seconds", "memory_seconds")]
    floors = [f for f in floors if isinstance(f, (int, float)) and not isinstance(f, bool)]
    return max(floors) / winner_seconds if floors else None


def summarize(device: str, decision: Decision) -> SummaryRow:
    """The ``SummaryRow`` of one decision."""
    winner = decision.result(decision.winner)
    winner_seconds = winner.score if winner else None
    xla = decision.result(XLA_RAGGED_NAME if decision.key.groups else XLA_DOT_NAME)  # XLA's own op
    xla_seconds = xla.score if xla is not None and xla.outcome == Outcome.OK else None
    speedup = (xla_seconds / winner_seconds
               if xla_seconds and winner_seconds and winner_seconds > 0 else None)
    return SummaryRow(
        device=device, key=decision.key.canonical(), key_id=key_id(decision.key),
        shape=decision.key.describe(), winner=decision.winner,
        winner_seconds=winner_seconds, xla_seconds=xla_seconds, speedup=speedup,
        roofline_fraction=_roofline_fraction(decision, winner_seconds),
        samples=len(winner.samples) if winner else 0,
        outcomes=dict(sorted(Counter(r.outcome for r in decision.results).items())),
        source=decision.source, reason=decision.reason)
