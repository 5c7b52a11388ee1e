"""Whole-program checks: which keys a program runs with lax's own dot, kept by its identity.

``warmup`` compares a ``jat.autotune`` program with the same program plain
(``jax_autotune.program_check``); where tuned was slower, the keys it found to cost it are
*left plain* in that program: its dots of those keys stay lax's, as the user wrote them
(and its attentions of those attention keys as written: ``jax_autotune.attention``).
The result is kept here, in memory and in the tune store (namespace
``programs/<version>/<jax version>/<device>``, keyed by the program's identity, under the
candidate set's checksum), so the next process traces the program the same way.

A program's identity (``identity``) is a hash of its traced jaxpr (before any rewrite) and
the function's name: the same function on other shapes, dtypes or settings is another program.

    >>> check = ProgramRecord(plain_seconds=0.041, tuned_seconds=0.044, final_seconds=0.040,
    ...                       left_plain=(key.canonical(),))
    >>> remember(tuner, program, check)
    >>> left_plain(tuner, program)
    frozenset({MatmulKey(...)})
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from typing import Any

from jax_autotune.attention_key import AttentionKey, is_attention_key
from jax_autotune.key import MatmulKey
from jax_autotune.tuning.namespaces import program_namespace

_MAX_KEYS = 4096  # a stored record names at most this many keys (a bad row is ignored)


@dataclasses.dataclass(frozen=True)
class ProgramRecord:
    """What a check found: the plain and tuned times, the time with ``left_plain`` (the
    keys' canonical strings) left to lax."""

    plain_seconds: float
    tuned_seconds: float
    final_seconds: float
    left_plain: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "left_plain": list(self.left_plain)}

    @classmethod
    def from_json(cls, data: Any) -> "ProgramRecord | None":
        """The record of a stored row; None for a row that is not one (never an error)."""
        try:
            keys = data["left_plain"]
            if not isinstance(keys, list) or len(keys) > _MAX_KEYS or not all(isinstance(k, str) for k in keys):
                return None
            seconds = [float(data[f]) for f in ("plain_seconds", "tuned_seconds", "final_seconds")]
            return cls(*seconds, tuple(keys))
        except (KeyError, TypeError, ValueError):
            return None

    def keys(self) -> frozenset[MatmulKey | AttentionKey]:
        """The keys left plain: matmul keys, and attention keys left as written."""
        found = set()
        for text in self.left_plain:
            try:
                found.add(AttentionKey.parse(text) if is_attention_key(text) else MatmulKey.parse(text))
            except (TypeError, ValueError):  # a key this build cannot read: not left plain
                continue
        return frozenset(found)


_memory: dict[tuple[str, str, str], ProgramRecord | None] = {}
_lock = threading.Lock()
_generation = 0  # counts the changes of what is kept: a trace re-reads its record after one


def generation() -> int:
    """How many times a check was kept or the memory dropped in this process (a trace that
    read its record at this generation need not read it again)."""
    return _generation


def identity(name: str, jaxpr_text: str) -> str:
    """A program's identity: its function's name and traced jaxpr, hashed."""
    return hashlib.sha256(f"{name}\n{jaxpr_text}".encode()).hexdigest()[:32]


def record(tuner, program: str) -> ProgramRecord | None:
    """The check kept for ``program`` on ``tuner``'s device: memory, then the store."""
    where = (program_namespace(tuner.device.fingerprint), program, tuner.checksum)
    with _lock:
        if where in _memory:
            return _memory[where]
    found = ProgramRecord.from_json(tuner.store.get(*where))
    with _lock:
        _memory.setdefault(where, found)
        return _memory[where]


def left_plain(tuner, program: str) -> frozenset:
    """The keys ``program`` runs with lax's dot or as written (none when it was never checked)."""
    found = record(tuner, program)
    return found.keys() if found is not None else frozenset()


def remember(tuner, program: str, check: ProgramRecord, persist: bool = True) -> None:
    """Keep ``check`` for ``program``: in memory, and (``persist``) in the store."""
    global _generation
    where = (program_namespace(tuner.device.fingerprint), program, tuner.checksum)
    with _lock:
        _memory[where] = check
        _generation += 1
    if persist:
        tuner.store.put(*where, check.to_json())


def forget() -> None:
    """Drop the checks held in memory (the store keeps its rows)."""
    global _generation
    with _lock:
        _memory.clear()
        _generation += 1


__all__ = ["ProgramRecord", "identity", "record", "left_plain", "remember", "forget", "generation"]
