"""Attention decisions: whether an attention key runs as written or fused, kept by key.

``jat.autotune`` finds softmax attention in a program (``jax_autotune.attention``) and
times it as written against the fused implementations this device has
(``jax_autotune.attention_tuning``). The result is an ``AttentionDecision``, kept here in
memory and in the tune store (namespace ``attention/<version>/<jax version>/<device>``,
keyed by the key's canonical string, under the checksum of the implementations tried),
so the next process decides nothing again.

    >>> decision = AttentionDecision(key, "cudnn", {"as_written": 2.1e-3, "cudnn": 0.4e-3})
    >>> remember(tuner, decision, checksum)
    >>> known(tuner, key, checksum).winner
    'cudnn'
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import threading
from typing import Any, Sequence

from jax_autotune.attention_key import AttentionKey
from jax_autotune.tuning.namespaces import attention_namespace

AS_WRITTEN = "as_written"  # the attention's equations as the program traced them


@dataclasses.dataclass(frozen=True)
class AttentionDecision:
    """What runs for ``key``: ``winner`` (``AS_WRITTEN`` or a fused implementation), the
    forward + backward seconds of each implementation that ran and was right, and why
    each other one did not count (``rejected``); ``source``: tuned, memory or store."""

    key: AttentionKey
    winner: str
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    rejected: dict[str, str] = dataclasses.field(default_factory=dict)
    source: str = "tuned"

    @property
    def fused(self) -> bool:
        return self.winner != AS_WRITTEN

    @property
    def gain_seconds(self) -> float:
        """Seconds a use saves against the attention as written (0 where it is not fused)."""
        if not self.fused or AS_WRITTEN not in self.seconds:
            return 0.0
        return max(self.seconds[AS_WRITTEN] - self.seconds[self.winner], 0.0)

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key.canonical(), "winner": self.winner, "seconds": dict(self.seconds),
                "rejected": dict(self.rejected)}

    @classmethod
    def from_json(cls, data: Any, source: str = "store") -> "AttentionDecision | None":
        """The decision of a stored row; None for a row that is not one (never an error)."""
        try:
            seconds = {str(k): float(v) for k, v in data["seconds"].items()}
            rejected = {str(k): str(v) for k, v in data.get("rejected", {}).items()}
            winner = data["winner"]
            if not isinstance(winner, str) or not all(math.isfinite(s) and s >= 0 for s in seconds.values()):
                return None
            if winner != AS_WRITTEN and winner not in seconds:
                return None
            return cls(AttentionKey.parse(data["key"]), winner, seconds, rejected, source)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


def checksum(implementations: Sequence[str]) -> str:
    """The checksum a decision is kept under: of the implementations tried (a device that
    gains one decides again)."""
    return hashlib.sha256(",".join(sorted(implementations)).encode()).hexdigest()[:16]


_memory: dict[tuple[str, str, str], AttentionDecision] = {}
_lock = threading.Lock()


def known(tuner, key: AttentionKey, check: str) -> AttentionDecision | None:
    """The decision kept for ``key`` on ``tuner``'s device: memory, then the store."""
    where = (attention_namespace(tuner.device.fingerprint), key.canonical(), check)
    with _lock:
        if where in _memory:
            return dataclasses.replace(_memory[where], source="memory")
    found = AttentionDecision.from_json(tuner.store.get(*where))
    if found is None or found.key != key:
        return None
    with _lock:
        _memory.setdefault(where, found)
    return found


def remember(tuner, decision: AttentionDecision, check: str, persist: bool = True) -> None:
    """Keep ``decision``: in memory, and (``persist``) in the store."""
    where = (attention_namespace(tuner.device.fingerprint), decision.key.canonical(), check)
    with _lock:
        _memory[where] = decision
    if persist:
        tuner.store.put(*where, decision.to_json())


def forget() -> None:
    """Drop the decisions held in memory (the store keeps its rows)."""
    with _lock:
        _memory.clear()


__all__ = ["AS_WRITTEN", "AttentionDecision", "checksum", "known", "remember", "forget"]
