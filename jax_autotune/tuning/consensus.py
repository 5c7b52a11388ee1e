"""One decision per key: across the processes of a jax.distributed job, and across the
processes of one host that share a tune store.

Different processes running different kernels for one key can mean different programs
and a hang in the next collective; tuning a key in every process wastes their time. So
a key missing from the store is decided by exactly one process and adopted by the rest.
An agreement deals in JSON values (a decision's ``to_json``) and knows nothing of how
they are made: ``turn(key)`` says whether this process decides the key or another has,
and ``publish(turn, value)`` offers this process's value, returning the one agreed.

* **in a job** (``JobAgreement``: ``jax.distributed`` with more than one process), through
  the job's key-value store (the client JAX's own multi-host compilation uses): the first
  process whose atomic ``key_value_increment`` of the key's claim returns 1 decides it and
  inserts its value (``allow_overwrite=False``); the others ``blocking_key_value_get`` it, for
  at most the wait, then publish XLA's dot themselves with a warning (never a hang). An
  insert that finds a value adopts that one, so a claimer that finishes late adopts the
  waiters' XLA's dot: every process ends with the same;
* **on one host** (``HostAgreement``: a shared store, no job): the process claims the key in
  the store (owner and a lease, renewed while its turn lasts, taken over once it lapses or
  its process is gone), the others poll for the value and adopt it, and a stored value is
  never replaced by a concurrent one (``Store.put_if_absent``). The SQLite store claims in
  a table, the directory store in a claim file, so this works across the hosts of a shared
  filesystem too (a claim's process is known dead only on its own host; elsewhere its lease
  lapses). Only a lasting value is stored: a fallback is the next process's to decide again.

    >>> agreement = HostAgreement(store, namespace, checksum, lease_seconds=15)
    >>> with agreement.turn(key.canonical(), wait_seconds=60) as turn:
    ...     if turn.settled in (Settled.STORED, Settled.ADOPTED):   # another's value
    ...         value, settled = turn.value, turn.settled
    ...     else:           # ours to decide, or XLA's dot after the wait (FALLBACK): publish it
    ...         mine = tuned if turn.settled is None else fallback
    ...         value, settled = agreement.publish(turn, mine.to_json(), lasting=turn.settled is None)
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import json
import os
import random
import secrets
import socket
import threading
import time
import warnings
from typing import Callable, Iterator

from jax_autotune.errors import ConsensusWarning, JaxAutotuneConsensusWarning  # noqa: F401 - its earlier home
from jax_autotune._version import __version__
from jax_autotune.tuning.store_protocol import Claim, Store

_MAX_TIMEOUT_MS = 2**31 - 1


class Settled(enum.StrEnum):
    """How a key's decision was reached across processes: found in the store, tuned by
    this process, adopted from another, proposed by this one in a job (the others adopt
    it), or XLA's dot because no decision came in time."""

    STORED = "stored"
    TUNED = "tuned"
    ADOPTED = "adopted"
    PROPOSED = "proposed"
    FALLBACK = "fallback"


@dataclasses.dataclass
class Turn:
    """Where one key stands before this process decides anything: ``settled`` None when
    this process decides it (and publishes its value); ``STORED`` or ``ADOPTED`` with the
    agreed ``value``; ``FALLBACK`` when no decision came within the wait (``why`` says),
    when this process publishes XLA's dot."""

    key: str
    settled: Settled | None = None
    value: dict | None = None
    why: str = ""
    owner: str = ""  # this process's claim (one host)
    published: bool = False


def _status(err: BaseException) -> str:
    """The status code a key-value call failed with ('NOT_FOUND', 'ALREADY_EXISTS', ...)."""
    head = str(err).split(":", 1)[0].strip()
    return head if head.isupper() and head.replace("_", "").isalpha() else ""


# ---------------------------------------------------------------- the job

@dataclasses.dataclass(frozen=True)
class Job:
    """This process's place in a jax.distributed job, and the job's key-value client."""

    client: object
    process_index: int
    process_count: int


def current_job() -> Job | None:
    """The job when jax.distributed runs more than one process, else None (no backend is
    initialized by asking)."""
    try:
        from jax._src.distributed import global_state  # private: what JAX's own multi-host compilation uses
    except ImportError:  # pragma: no cover - depends on the jax version
        return None
    client, count = getattr(global_state, "client", None), getattr(global_state, "num_processes", 1)
    if client is None or not count or count < 2:
        return None
    return Job(client, int(global_state.process_id), int(count))


def job_key(platform: str, checksum: str, key_string: str) -> str:
    """The key-value path of a decision: the same in every process of a job (no host facts
    such as the CPU model, which differ between otherwise identical hosts)."""
    digest = hashlib.sha256(key_string.encode()).hexdigest()[:32]
    return f"jax_autotune/{__version__}/{platform}/{checksum}/{digest}"


class JobAgreement:
    """One value per key among a job's processes, through its key-value store. Errors of
    the key-value store propagate (the caller falls back in this process).

        >>> agreement = JobAgreement(current_job(), "gpu", checksum)
    """

    def __init__(self, job: Job, platform: str, checksum: str):
        self.client, self.platform, self.checksum = job.client, platform, checksum

    @contextlib.contextmanager
    def turn(self, key: str, wait_seconds: float) -> Iterator[Turn]:
        """``ADOPTED`` with a peer's value (published already, or within ``wait_seconds``),
        None when this process claimed the key, ``FALLBACK`` when no peer published in time."""
        path = self._path(key)
        found = self._lookup(path)
        if found is not None:
            yield Turn(key, Settled.ADOPTED, found)
            return
        if self.client.key_value_increment(path + "/claim", 1) == 1:
            yield Turn(key)
            return
        try:
            text = self.client.blocking_key_value_get(path, max(0, min(_MAX_TIMEOUT_MS, int(wait_seconds * 1000))))
            yield Turn(key, Settled.ADOPTED, json.loads(text))
            return
        except Exception as err:  # noqa: BLE001 - the client raises JaxRuntimeError
            if _status(err) != "DEADLINE_EXCEEDED":
                raise
        warnings.warn(f"jax_autotune: no decision from the process tuning {path} within "
                      f"{wait_seconds:.0f} s; every process uses XLA's dot for it",
                      ConsensusWarning, stacklevel=5)
        yield Turn(key, Settled.FALLBACK, why=f"no peer decided within {wait_seconds:.0f} s")

    def publish(self, turn: Turn, value: dict, lasting: bool = True) -> tuple[dict, Settled]:
        """Insert ``value`` for the key (a fallback too: a claimer finishing late adopts it);
        (the value every process ends with, how): this one's (``PROPOSED``, or ``FALLBACK``
        after a timeout) or a peer's inserted first (``ADOPTED``)."""
        path = self._path(turn.key)
        try:
            self.client.key_value_set(path, json.dumps(value, sort_keys=True), allow_overwrite=False)
            turn.published = True
            return value, Settled.FALLBACK if turn.settled == Settled.FALLBACK else Settled.PROPOSED
        except Exception as err:  # noqa: BLE001
            if _status(err) != "ALREADY_EXISTS":
                raise
        theirs = self._lookup(path)
        return (value, Settled.PROPOSED) if theirs is None else (theirs, Settled.ADOPTED)

    def _path(self, key: str) -> str:
        return job_key(self.platform, self.checksum, key)

    def _lookup(self, path: str) -> dict | None:
        try:
            return json.loads(self.client.key_value_try_get(path))
        except Exception as err:  # noqa: BLE001 - the client raises JaxRuntimeError
            if _status(err) == "NOT_FOUND":
                return None
            raise


# ---------------------------------------------------------------- one host

def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def _owner_gone(owner: str, expires: float) -> bool:
    """A claim whose process is dead on this host (killed while tuning) can be taken over
    at once, without waiting for its lease."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class HostAgreement:
    """One value per key among the processes sharing ``store``: claims with leases. A stored
    value that ``usable`` refuses (an unknown winner, a damaged row) is decided again and
    replaced.

        >>> agreement = HostAgreement(store, namespace, checksum, lease_seconds=15)
    """

    def __init__(self, store: Store, namespace: str, checksum: str, lease_seconds: float,
                 usable: Callable[[dict], bool] = lambda value: True,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self.store, self.namespace, self.checksum = store, namespace, checksum
        self.lease_seconds, self.usable, self.clock, self.sleep = lease_seconds, usable, clock, sleep

    @contextlib.contextmanager
    def turn(self, key: str, wait_seconds: float) -> Iterator[Turn]:
        """``STORED`` with the stored value, ``ADOPTED`` when another process stored it while
        this one waited, ``FALLBACK`` when one kept its claim past ``wait_seconds``, or None:
        this process holds the claim (its lease renewed until the turn ends, then released
        unless a value was published)."""
        turn = self._claimed(key, wait_seconds)
        if turn.settled is not None:
            yield turn
            return
        stop = threading.Event()

        def renew():
            while not stop.wait(self.lease_seconds / 3):
                self.store.renew(self.namespace, key, self.checksum, turn.owner, self.lease_seconds)

        renewer = threading.Thread(target=renew, name="jax_autotune-lease", daemon=True)
        renewer.start()
        try:
            yield turn
        finally:
            stop.set()
            renewer.join()
            if not turn.published:  # a failed or unfinished decision: the next process tries again
                self.store.release(self.namespace, key, self.checksum, turn.owner)

    def publish(self, turn: Turn, value: dict, lasting: bool = True) -> tuple[dict, Settled]:
        """Store ``value`` unless a usable one was stored meanwhile: (the stored value, how),
        ``TUNED`` for this one, ``ADOPTED`` for another's. A value not ``lasting`` (XLA's dot
        standing in) is not stored: ``FALLBACK`` after a timeout, else ``TUNED``."""
        if turn.settled == Settled.FALLBACK:
            return value, Settled.FALLBACK
        if not lasting:
            return value, Settled.TUNED
        stored, inserted = self.store.put_if_absent(self.namespace, turn.key, self.checksum, value,
                                                    keep=self.usable)
        turn.published = True
        return (value, Settled.TUNED) if inserted else (stored, Settled.ADOPTED)

    def _claimed(self, key: str, wait_seconds: float) -> Turn:
        owner = _owner()
        deadline, pause, waited = self.clock() + wait_seconds, 0.02, False
        while True:
            state, value = self.store.claim(self.namespace, key, self.checksum, owner, self.lease_seconds,
                                            _owner_gone, keep=self.usable)
            if state == Claim.DECIDED:
                return Turn(key, Settled.ADOPTED if waited else Settled.STORED, value)
            if state == Claim.CLAIMED:
                return Turn(key, owner=owner)
            if self.clock() > deadline:
                warnings.warn(f"jax_autotune: process {value} holds the tuning of a key for over "
                              f"{wait_seconds:.0f} s; using XLA's dot for it in this process",
                              ConsensusWarning, stacklevel=6)
                return Turn(key, Settled.FALLBACK, why=f"another process kept tuning this key over {wait_seconds:.0f} s")
            waited = True
            self.sleep(pause * (0.5 + random.random()))
            pause = min(pause * 2, 1.0)
