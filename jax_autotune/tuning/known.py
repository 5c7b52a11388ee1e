"""What is known per key on one device: the memory table, the store, rejected entries.

``KnownDecisions`` holds a device's decisions: in memory (tuned, installed or read this
process), in the store under (canonical key, candidate-set checksum), and the keys whose
stored or installed entry was rejected (its winner cannot run the key here). It also
makes sure one thread decides a key while the others wait (``deciding``). It decides
nothing: ``Tuner`` says what a miss means (``tuning.tuner``), ``bench`` measures.

    >>> known = KnownDecisions(device, candidate_set, store)
    >>> known.lookup(key)                               # memory, then the store; None on a miss
    >>> with known.deciding(key, "tune") as slot:       # this thread's turn, or the memory's answer
    ...     if slot.decision is None:
    ...         slot.decision, slot.keep = decide(slot.stored, slot.rejected)
    >>> known.install_many(table_entries).installed
    120
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import threading
import warnings
from typing import Iterable, Iterator

from jax_autotune.errors import StoreWarning, TuneTableError
from jax_autotune.key import MatmulKey
from jax_autotune.tuning import counters
from jax_autotune.tuning.candidates import CandidateSet
from jax_autotune.tuning.decision import Decision
from jax_autotune.tuning.device import DeviceInfo
from jax_autotune.tuning.namespaces import decision_namespace
from jax_autotune.tuning.store import Store
from jax_autotune.tuning.validation import parse_entry


def stored_decision(store: Store, namespace: str, key: str, checksum: str,
                    value: dict) -> Decision | None:
    """A store row's value as a Decision when it meets the rules of a tune-table entry
    (``validation.parse_entry``); None, with the store's one bad-row warning, otherwise.

        >>> stored_decision(store, entry.namespace, entry.key, entry.checksum, entry.value)
    """
    try:
        return parse_entry(value, "", "value")
    except TuneTableError as err:
        store.skip_row(namespace, key, checksum, str(err))
        return None


@dataclasses.dataclass(frozen=True)
class Installed:
    """What ``install_many`` did: decisions installed, why others were rejected, and
    whether the store took them (False: they live in memory only)."""

    installed: int
    rejected: tuple[str, ...]
    persisted: bool


class Keep(enum.Enum):
    """What becomes of a decision made in a ``deciding`` slot: nothing (XLA's dot standing in
    under ``cached`` or ``require``: a table loaded later serves the key), the memory table,
    or the memory table and the store (a job's decision: stored unless the store holds a
    usable one)."""

    NOTHING = "nothing"
    MEMORY = "memory"
    MEMORY_AND_STORE = "memory and store"


@dataclasses.dataclass
class Slot:
    """One key's turn to be decided by this thread: ``decision`` the memory table's (a
    hit), else None with what the store holds (``stored``, or why its entry was
    ``rejected``) until the decider sets ``decision`` and ``keep``."""

    key: MatmulKey
    decision: Decision | None = None
    stored: Decision | None = None
    rejected: str = ""
    keep: Keep = Keep.MEMORY


def instead(mode: str | None) -> str:
    """What a rejected decision is replaced with under ``mode`` (None: a lookup, no mode)."""
    if mode is None:
        return "the key is tuned again in mode 'tune'; XLA's dot runs it otherwise"
    return "the key is tuned again" if mode == "tune" else "XLA's dot runs it"


class KnownDecisions:
    """One device's decisions: memory table, store, rejected keys, keys being decided."""

    def __init__(self, device: DeviceInfo, candidate_set: CandidateSet, store: Store):
        self.device, self.candidate_set, self.store = device, candidate_set, store
        self.namespace = decision_namespace(device.fingerprint)
        self.checksum = candidate_set.checksum()
        self._memory: dict[MatmulKey, Decision] = {}
        self._pending: dict[MatmulKey, threading.Event] = {}
        self._rejected: dict[MatmulKey, str] = {}  # keys whose table or store entry was rejected: why
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- reading
    def lookup(self, key: MatmulKey) -> Decision | None:
        """Memory, then store; None on a miss or a rejected entry (no tuning, no counters; a
        rejected entry warns once, as in ``stored``)."""
        with self._lock:
            found = self._memory.get(key)
        return found if found is not None else self.stored(key)[0]

    def unusable(self, decision: Decision, key: MatmulKey | None = None) -> str:
        """Why ``decision``'s winner cannot run ``key`` (default: the decision's) here, or
        '' when it can: the winner is not in this candidate set, or its ``supports`` says
        no for this device and key (a hand-edited row, another machine's table).

            >>> known.unusable(dataclasses.replace(decision, winner="native_small_avx2_t1"))
            "winner 'native_small_avx2_t1' cannot run key [m=512 ...] on cpu-...-avx2"
        """
        key = key or decision.key
        try:
            candidate = self.candidate_set.by_name(decision.winner)
        except KeyError:
            return f"winner {decision.winner!r} is not a candidate of this build (key [{key.canonical()}])"
        if candidate.runs(self.device, key):
            return ""
        return f"winner {decision.winner!r} cannot run key [{key.canonical()}] on {self.device.fingerprint}"

    def stored(self, key: MatmulKey, mode: str | None = None) -> tuple[Decision | None, str]:
        """(the stored decision, '') or (None, why an entry of this key was rejected: ''
        for a plain miss; a key whose installed or stored entry was rejected earlier keeps
        that reason, so ``cached`` and ``require`` run XLA's dot rather than call it
        untuned). A rejected entry warns once per key, saying what ``mode`` does instead."""
        data = self.store.get(self.namespace, key.canonical(), self.checksum)
        decision = None if data is None else self._parsed(key.canonical(), data)
        if decision is None:  # missing, or a damaged value: a miss, re-tuned
            return None, self._rejected.get(key, "")
        reason = self.unusable(decision, key)
        if reason:
            if key not in self._rejected:
                self._rejected[key] = reason
                warnings.warn(f"jax_autotune: ignoring the stored decision of {self.store.path}: "
                              f"{reason}; {instead(mode)}", StoreWarning,
                              stacklevel=5)
            return None, reason
        return decision.with_source("store"), ""

    def usable(self, data: dict, key: MatmulKey) -> bool:
        """Whether a stored value is a decision this build can run for ``key`` (a stored
        value that is not is tuned again and replaced)."""
        decision = self._parsed(key.canonical(), data)
        return decision is not None and not self.unusable(decision, key)

    def _parsed(self, key_string: str, data: dict) -> Decision | None:
        return stored_decision(self.store, self.namespace, key_string, self.checksum, data)

    def memory_decisions(self) -> list[Decision]:
        """The decisions held in memory (tuned, installed or read this process)."""
        with self._lock:
            return list(self._memory.values())

    def decisions(self) -> list[Decision]:
        """Every decision known: memory, then the store's for this device."""
        known = {d.key: d for d in self.memory_decisions()}
        for entry in self.store.entries(self.namespace):
            if entry.checksum != self.checksum:
                continue
            decision = self._parsed(entry.key, entry.value)
            if decision is not None:
                known.setdefault(decision.key, decision.with_source("store"))
        return list(known.values())

    # ---------------------------------------------------------------- deciding once
    @contextlib.contextmanager
    def deciding(self, key: MatmulKey, mode: str) -> Iterator[Slot]:
        """The key's slot: the memory table's decision, or this thread's turn to decide it
        (others asking for the key wait meanwhile), with the store's entry read; the
        decision set in the slot is kept as its ``keep`` says when the block ends.

            >>> with known.deciding(key, "tune") as slot:
            ...     if slot.decision is None:
            ...         slot.decision = tuned
        """
        while True:
            with self._lock:
                if key in self._memory:
                    counters.bump("memory_hits")
                    decision = self._memory[key].with_source("memory")
                    break
                pending = self._pending.get(key)
                if pending is None:
                    event = self._pending[key] = threading.Event()
                    decision = None
                    break
            pending.wait()  # another thread is deciding this key
        if decision is not None:
            yield Slot(key, decision)
            return
        try:
            slot = Slot(key, None, *self.stored(key, mode))
            yield slot
            self._keep(slot)
        finally:
            with self._lock:
                self._pending.pop(key, None)
            event.set()

    def _keep(self, slot: Slot) -> None:
        if slot.decision is None or slot.keep == Keep.NOTHING:
            return
        with self._lock:
            self._memory[slot.key] = slot.decision
        if slot.keep == Keep.MEMORY_AND_STORE:
            self.store.put_if_absent(self.namespace, slot.key.canonical(), self.checksum,
                                     dataclasses.replace(slot.decision, device=self.device.fingerprint).to_json(),
                                     keep=lambda data: self.usable(data, slot.key))

    # ---------------------------------------------------------------- writing
    def install(self, decision: Decision, persist: bool = True) -> bool:
        """``install_many([decision])``; False if the decision was rejected.

            >>> known.install(decision)
            True
        """
        return not self.install_many([decision], persist=persist).rejected

    def install_many(self, decisions: Iterable[Decision], persist: bool = True) -> Installed:
        """Put decisions (e.g. a tune table's) into memory and (``persist``) the store, all
        in one transaction. A decision whose winner cannot run its key here is rejected:
        ``Installed.rejected`` says why, naming the key and the candidate.

            >>> known.install_many(table_entries)
            Installed(installed=120, rejected=(), persisted=True)
        """
        accepted, rejected = [], {}
        for decision in decisions:
            reason = self.unusable(decision)
            if reason:
                rejected[decision.key] = reason
                continue
            accepted.append(dataclasses.replace(decision, checksum=self.checksum,
                                                device=self.device.fingerprint))
        with self._lock:
            self._rejected.update(rejected)
            for decision in accepted:
                self._memory[decision.key] = decision
                self._rejected.pop(decision.key, None)
        persisted = not persist or not accepted or self.store.put_many(
            (self.namespace, d.key.canonical(), self.checksum, d.to_json()) for d in accepted)
        return Installed(len(accepted), tuple(rejected.values()), persisted)

    def use_store(self, store: Store) -> None:
        """Switch to another store (the old one is closed)."""
        old, self.store = self.store, store
        old.close()

    def forget(self) -> None:
        """Drop the memory table and the rejected keys (the store is untouched)."""
        with self._lock:
            self._memory.clear()
            self._rejected.clear()


__all__ = ["KnownDecisions", "Installed", "Keep", "Slot", "stored_decision", "instead"]
