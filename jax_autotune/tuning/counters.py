"""Process-wide counters of what the tuner did.

    >>> import jax_autotune as jat
    >>> jat.reset_stats(); ...; jat.stats()["tuned"]
    0

Keys: ``tuned`` (keys benchmarked), ``memory_hits``, ``store_hits``,
``candidate_compiles``, ``candidate_runs`` (matmuls executed while tuning, repetitions
included), ``probe_launches``, ``tuning_seconds`` (wall time spent tuning), ``fallbacks``
(decisions that fell back to XLA's dot because nothing else was valid or allowed),
``xla_primed`` (XLA-based candidates whose dots XLA's GEMM autotuner tuned ahead, several
in one compile: ``tuning.xla_priming``).
"""

from __future__ import annotations

import threading

COUNTERS = ("tuned", "memory_hits", "store_hits", "candidate_compiles", "candidate_runs",
            "probe_launches", "tuning_seconds", "fallbacks", "xla_primed")

_lock = threading.Lock()
_counts: dict[str, float] = dict.fromkeys(COUNTERS, 0)


def bump(name: str, amount: float = 1) -> None:
    if name not in _counts:
        raise KeyError(f"unknown counter {name!r}; known: {', '.join(COUNTERS)}")
    with _lock:
        _counts[name] += amount


def stats() -> dict[str, float]:
    """A copy of every counter (integers except ``tuning_seconds``)."""
    with _lock:
        return {name: (value if name == "tuning_seconds" else int(value))
                for name, value in _counts.items()}


def reset_stats() -> None:
    with _lock:
        for name in _counts:
            _counts[name] = 0
