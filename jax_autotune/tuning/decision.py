"""Decisions: the winner of a key and every candidate's result, as auditable JSON records.

A ``Decision`` is what the tuner stores (SQLite value), logs (one JSON line per decision
when ``JAX_AUTOTUNE_LOG_DECISIONS`` is set) and ships in tune tables.

    >>> decision.winner, decision.result(decision.winner).score
    ('native_gemm_avx2_6x16_t2', 0.0021)
    >>> Decision.from_json(decision.to_json()) == decision
    True

``export_kernel`` names the candidate the last ``jax.export`` of the key emitted (the
winner, or the fastest one jax.export takes) and ``export_reason`` says why; both are
empty until the key is exported, and optional in stored records and tables.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
import threading
import time
import warnings
from typing import Any

from jax_autotune.errors import DecisionLogWarning
from jax_autotune.key import MatmulKey
from jax_autotune.problem import MatmulProblem

class Outcome(enum.StrEnum):
    """A candidate's fate for one key (stored as its value)."""

    OK = "ok"
    COMPILE_ERROR = "compile_error"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    RUNTIME_ERROR = "runtime_error"
    WRONG_RESULT = "wrong_result"
    NO_TIMING = "no_timing"
    SKIPPED = "skipped"


class Source(enum.StrEnum):
    """Where a decision came from (stored as its value): tuned here, this process's memory
    table, the store, a tune table, XLA's dot because tuning failed, or another process's."""

    TUNED = "tuned"
    MEMORY = "memory"
    STORE = "store"
    TABLE = "table"
    FALLBACK = "fallback"
    ADOPTED = "adopted"


OUTCOMES = tuple(o.value for o in Outcome)
SOURCES = tuple(s.value for s in Source)


@dataclasses.dataclass(frozen=True)
class CandidateResult:
    """One candidate's fate while tuning one key.

    ``samples`` are the kept timings in seconds (the first sample is discarded before
    them); ``score`` is their median; ``pruned`` candidates (over the prune ratio after
    the minimum samples) and those with any outcome but ``ok`` can never win.
    """

    name: str
    outcome: str
    round: str = ""
    samples: tuple[float, ...] = ()
    score: float | None = None
    pruned: bool = False
    rel_error: float | None = None
    error: str = ""
    compile_seconds: float | None = None  # wall time to compile (and calibrate) it
    compile_wait_seconds: float | None = None  # of that, waiting for the device to be free
    paired_ratio: float | None = None  # host clocks: XLA's dot's time over this one's, timed in turns

    def __post_init__(self):
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {self.outcome!r}")
        object.__setattr__(self, "outcome", Outcome(self.outcome))
        object.__setattr__(self, "samples", tuple(float(s) for s in self.samples))

    @property
    def eligible(self) -> bool:
        return self.outcome == Outcome.OK and not self.pruned and self.score is not None

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["outcome"] = self.outcome.value
        data["samples"] = list(self.samples)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CandidateResult":
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})


@dataclasses.dataclass(frozen=True)
class Decision:
    key: MatmulKey
    problem: MatmulProblem  # the concrete problem the benchmark ran on
    winner: str
    results: tuple[CandidateResult, ...] = ()
    bounds: dict[str, Any] = dataclasses.field(default_factory=dict)
    limit: float | None = None  # roofline time limit in seconds (None: no bound)
    tuning_seconds: float = 0.0
    timestamp: float = dataclasses.field(default_factory=time.time)
    device: str = ""  # device fingerprint
    checksum: str = ""  # of the candidate set it was chosen from
    source: Source = Source.TUNED
    reason: str = ""  # why the winner is XLA's dot by default, when it is
    export_kernel: str = ""  # what the last jax.export of the key emitted
    export_reason: str = ""  # why that kernel, when it is not the winner

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {self.source!r}")
        object.__setattr__(self, "source", Source(self.source))

    def result(self, name: str) -> CandidateResult | None:
        for result in self.results:
            if result.name == name:
                return result
        return None

    @property
    def winner_seconds(self) -> float | None:
        result = self.result(self.winner)
        return result.score if result else None

    def with_source(self, source: Source) -> "Decision":
        return dataclasses.replace(self, source=source)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key.to_json(),
            "key_string": self.key.canonical(),
            "problem": self.problem.to_json(),
            "winner": self.winner,
            "results": [r.to_json() for r in self.results],
            "bounds": self.bounds,
            "limit": self.limit,
            "tuning_seconds": self.tuning_seconds,
            "timestamp": self.timestamp,
            "device": self.device,
            "checksum": self.checksum,
            "source": self.source.value,
            "reason": self.reason,
            "export_kernel": self.export_kernel,
            "export_reason": self.export_reason,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Decision":
        """Inverse of ``to_json``; wrong types raise ValueError naming the field."""
        if not isinstance(data, dict):
            raise ValueError(f"decision: expected a JSON object, got {type(data).__name__}")
        try:
            key = MatmulKey.from_json(data["key"])
            problem = MatmulProblem.from_json(data["problem"])
            winner = data["winner"]
            if not isinstance(winner, str):
                raise ValueError(f"decision.winner: expected a string, got {winner!r}")
            results = tuple(CandidateResult.from_json(r) for r in data.get("results", []))
        except KeyError as err:
            raise ValueError(f"decision: missing field {err.args[0]!r}") from err
        except TypeError as err:
            raise ValueError(f"decision: bad field types: {err}") from err
        source = data.get("source", Source.STORE)
        return cls(key=key, problem=problem, winner=winner, results=results,
                   bounds=dict(data.get("bounds") or {}), limit=data.get("limit"),
                   tuning_seconds=float(data.get("tuning_seconds", 0.0)),
                   timestamp=float(data.get("timestamp", 0.0)), device=str(data.get("device", "")),
                   checksum=str(data.get("checksum", "")),
                   source=source if source in SOURCES else Source.STORE,
                   reason=str(data.get("reason", "")),
                   export_kernel=str(data.get("export_kernel") or ""),
                   export_reason=str(data.get("export_reason") or ""))


_log_lock = threading.Lock()
_log_warned: set[str] = set()  # destinations already warned about


def log_decision(decision: Decision, destination: str | None,
                 event: str = "jax_autotune.decision") -> None:
    """Write the decision as one JSON line (``event`` names it) to ``stdout``, ``stderr``
    or a file path.

    Best effort: a destination that cannot be written (a missing folder, no permission, a
    closed stream) gives one ``DecisionLogWarning`` per destination, never an exception.

        >>> log_decision(decision, "/tmp/decisions.jsonl")
        >>> log_decision(decision, "stderr", event="jax_autotune.export")
    """
    if destination is None:
        return
    with _log_lock:
        try:
            line = json.dumps({"event": event, **decision.to_json()}, sort_keys=True)
            if destination in ("stdout", "stderr"):
                print(line, file=getattr(sys, destination), flush=True)
            else:
                with open(destination, "a", encoding="utf-8") as f:
                    f.write(line + "\n")
        except Exception as err:  # noqa: BLE001 - logging must never break the user's matmul
            if destination not in _log_warned:
                _log_warned.add(destination)
                warnings.warn(f"jax_autotune: cannot write the decision log {destination} "
                              f"(JAX_AUTOTUNE_LOG_DECISIONS): {type(err).__name__}: {err}. "
                              f"Decisions are not logged there.", DecisionLogWarning, stacklevel=2)
